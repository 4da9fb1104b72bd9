"""Reading ``.npy`` files the tools are given (arrays only, never pickles), and exact integer conversions."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def load_npy(path: str | Path) -> np.ndarray:
    """``np.load`` without pickles; raises ``ValueError``/``OSError``/``EOFError`` as numpy does.

    A file that is not an .npy array (a text file named ``0.npy``, an object array) makes numpy suggest
    loading it with pickle, i.e. running whatever code the file holds; our message refuses instead.
    """
    try:
        return np.load(path, allow_pickle=False)
    except ValueError as exc:
        if "pickle" in str(exc):
            raise ValueError("not a valid .npy file (pickled object data is refused)") from None
        raise


def integers_fit(data: np.ndarray, dtype: np.dtype | type) -> bool:
    """Whether integer ``data`` converts to the integer ``dtype`` exactly (every value within its range):
    indices and sizes given as int32 (numpy on Windows, torch's ``.int()``) for an int64 input."""
    if not (np.issubdtype(data.dtype, np.integer) and np.issubdtype(dtype, np.integer)):
        return False
    info = np.iinfo(dtype)
    return not data.size or bool(info.min <= data.min() and data.max() <= info.max)


def first_inexact_in_float(data: np.ndarray, dtype: np.dtype | type) -> int | None:
    """For bool or integer ``data``: the first value the float ``dtype`` does not hold exactly (float32 holds every
    whole number up to ±2**24, and larger ones only in steps), None where it holds them all: a 0/1 mask or a count
    given as bool or int64 converts to a float input without changing a value."""
    if data.dtype == np.bool_ or not data.size:
        return None
    flat = data.ravel()
    with np.errstate(over="ignore", invalid="ignore"):
        as_float = flat.astype(dtype)
        finite = np.isfinite(as_float)
        exact = finite.copy()
        exact[finite] = as_float[finite].astype(flat.dtype) == flat[finite]
    return None if exact.all() else int(flat[np.argmin(exact)])


def float32_overflow(data: np.ndarray) -> int:
    """How many finite values of float64 ``data`` lie beyond float32's range (they would become inf)."""
    if data.dtype != np.float64 or not data.size:
        return 0
    finite = np.abs(data[np.isfinite(data)])
    return int(np.count_nonzero(finite > np.finfo(np.float32).max))


def nan_warning(name: str, data: np.ndarray) -> str | None:
    """A warning for NaN values in a float feed of input ``name`` (None: there are none). The calibrated model's fake
    quantization and the quantized model's input quantization (the BPU's too) give NaN different grid levels: the
    two disagree."""
    nans = int(np.count_nonzero(np.isnan(data))) if data.dtype.kind == "f" else 0
    return (f"input '{name}' holds {nans} NaN value(s): a float model carries them through, a calibrated or "
            "quantized model puts them on some level of its grid (not the same in both); check the preprocessing") \
        if nans else None

