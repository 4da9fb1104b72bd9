"""Compatibility import: ``import horizon_nn.quantizer.debugger as dbg`` is ``hbtools.debug``."""

from hbtools.debug import *  # noqa: F403 - the re-export is the point of this module
from hbtools.debug import __all__  # noqa: F401
