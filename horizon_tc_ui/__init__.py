"""Compatibility import: ``from horizon_tc_ui import HB_ONNXRuntime, __version__``."""

from hbtools import __version__
from hbtools.runtime.session import HB_ONNXRuntime

__all__ = ["HB_ONNXRuntime", "__version__"]
