"""Compatibility import: ``from horizon_tc_ui.version import __version__``."""

from hbtools import __version__

__all__ = ["__version__"]
