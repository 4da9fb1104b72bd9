"""Compatibility import of the newer toolkits: ``from horizon_tc_ui.hb_runtime import HBRuntime``."""

from hbtools.runtime.session import HBRuntime

__all__ = ["HBRuntime"]
