"""Runtime: HB_ONNXRuntime, Hz-op lowering, the .bin container."""

from hbtools.runtime.session import HB_ONNXRuntime

__all__ = ["HB_ONNXRuntime"]
