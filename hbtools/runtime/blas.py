"""Running numpy's matrix products on one BLAS thread.

OpenBLAS, which numpy's wheels bundle, splits even a small product over every core, and its
threads wait for each other by spinning. Where another busy process holds a core, each product
then waits for a thread that is not running: the GPTQ Hessians of a 7.4 MB layout detector (many
9x9 and 25x25 batched products of depthwise patches) took 282 s beside one busy loop against 18 s
alone, and 28 s on one thread; on a quiet 2-core machine one thread took 17.4 s against 20.1 s.
Threads split the output, not the sums, so the products are the same numbers. Where numpy's
BLAS is not a bundled OpenBLAS with the thread call, this does nothing.
"""

from __future__ import annotations

import ctypes
import glob
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

# numpy 2's wheels: scipy-openblas (64-bit integers); numpy 1's: OpenBLAS with plain names.
_SYMBOLS = (("scipy_openblas_get_num_threads64_", "scipy_openblas_set_num_threads64_"),
            ("openblas_get_num_threads64_", "openblas_set_num_threads64_"),
            ("openblas_get_num_threads", "openblas_set_num_threads"))


def _thread_calls() -> tuple[Callable[[], int], Callable[[int], None]] | None:
    """numpy's bundled OpenBLAS get / set thread count calls, or None."""
    package = Path(np.__file__).parent
    for path in sorted(glob.glob(str(package.parent / "numpy.libs" / "*openblas*"))
                       + glob.glob(str(package / ".dylibs" / "*openblas*"))):
        try:
            lib = ctypes.CDLL(path)  # already loaded by numpy: the same library, not a second copy
        except OSError:
            continue
        for get, put in _SYMBOLS:
            if hasattr(lib, get) and hasattr(lib, put):
                getter, setter = getattr(lib, get), getattr(lib, put)
                getter.restype, getter.argtypes = ctypes.c_int, []
                setter.restype, setter.argtypes = None, [ctypes.c_int]
                return getter, setter
    return None


_CALLS = _thread_calls()


_LOCK = threading.Lock()
_held = 0  # blocks inside one_blas_thread, over all threads
_before = 0  # the thread count to restore when the last one leaves


@contextmanager
def one_blas_thread() -> Iterator[None]:
    """numpy's matrix products on one thread inside the block, as many as before after it.

    Blocks may overlap in several threads (hrt_model_exec perf's workers): the count is set by
    the first to enter and restored by the last to leave."""
    global _held, _before
    if _CALLS is None:
        yield
        return
    get, put = _CALLS
    with _LOCK:
        if _held == 0:
            _before = get()
            put(1)
        _held += 1
    try:
        yield
    finally:
        with _LOCK:
            _held -= 1
            if _held == 0:
                put(_before)
