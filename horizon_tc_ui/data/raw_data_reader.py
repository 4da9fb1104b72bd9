"""``raw_data_read(path, shape, dtype)``: a raw binary sample (``numpy.tofile``) as an array, as the
toolkit's featuremap inference samples read their inputs."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from hbtools.errors import HbError


def raw_data_read(path: str | Path, shape: Sequence[int], dtype: np.dtype | type | str = np.float32) -> np.ndarray:
    """The file's values as ``dtype``, in ``shape``; an error says so when the size does not fit."""
    values = np.fromfile(path, dtype=dtype)
    expected = int(np.prod(shape))
    if values.size != expected:
        raise HbError(f"raw file {path} holds {values.size} values of {np.dtype(dtype).name}, but shape "
                      f"{'x'.join(map(str, shape))} needs {expected}",
                      hint="check the shape and the dtype the file was written with")
    return values.reshape(shape)
