"""Compatibility import: ``from horizon_tc_ui import HB_ONNXRuntime, HBRuntime, __version__``."""

from hbtools import __version__
from hbtools.runtime.session import HB_ONNXRuntime, HBRuntime

__all__ = ["HBRuntime", "HB_ONNXRuntime", "__version__"]
