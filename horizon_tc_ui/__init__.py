"""Compatibility import: ``from horizon_tc_ui import HB_ONNXRuntime``."""

from hbtools.runtime.session import HB_ONNXRuntime

__all__ = ["HB_ONNXRuntime"]
