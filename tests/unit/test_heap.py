"""Freed memory goes back to the system when a stage asks (glibc keeps it inside its heaps)."""

from __future__ import annotations

import ctypes
import sys

import numpy as np
import pytest

from hbtools.runtime.heap import release_freed_memory


def _resident_mb() -> float:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS")) / 1024


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_freed_heap_memory_is_returned() -> None:
    try:
        ctypes.CDLL(None).malloc_trim  # noqa: B018 - only whether the C library has it
    except AttributeError:
        pytest.skip("the C library has no malloc_trim")
    # 64 KB blocks come from the heap (below the mmap threshold); the last one, kept, pins its top,
    # so freeing the others leaves ~190 MB of free pages inside the heap that free() keeps.
    blocks = [np.ones(8192) for _ in range(3000)]
    pin = blocks.pop()
    before = _resident_mb()
    del blocks
    kept = _resident_mb()
    assert kept > before - 100  # free() alone did not give it back
    assert release_freed_memory()
    assert _resident_mb() < kept - 100
    assert pin.sum() == 8192
