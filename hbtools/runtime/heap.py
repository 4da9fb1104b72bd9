"""Giving memory the process has freed back to the system.

glibc's allocator keeps freed memory inside its heaps (the main one and one per thread that
allocated: onnxruntime's intra-op threads have theirs) unless it lies at the top of a heap, and
large blocks stop being mapped on their own once a few of them were freed (the mmap threshold
grows to 32 MB). The searches build and drop sessions and lowered models of tens of MB each,
and run many intermediates through several sessions: PP-OCRv6 small rec's makertbin held 330 MB
of such freed memory (906 -> 573 MB resident after one ``malloc_trim``) when the int16 search
began, and its peak was that much higher. ``release_freed_memory`` is called after a stage
drops what it built; elsewhere (another libc, another system) it does nothing.
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Callable


def _malloc_trim() -> Callable[[int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        trim = ctypes.CDLL(None).malloc_trim  # the process's own C library (glibc has it, musl not)
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


_TRIM = _malloc_trim()


def release_freed_memory() -> bool:
    """Hand the free pages of every heap back to the system (glibc's ``malloc_trim(0)``); False
    where the C library has no such call. Live memory is untouched: only what was freed already."""
    if _TRIM is None:
        return False
    _TRIM(0)
    return True
