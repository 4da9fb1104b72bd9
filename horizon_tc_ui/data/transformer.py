"""Compatibility import: ``from horizon_tc_ui.data.transformer import ResizeTransformer``."""

from hbtools.data.transforms import *  # noqa: F403 - the re-export is the point of this module
from hbtools.data.transforms import __all__  # noqa: F401
