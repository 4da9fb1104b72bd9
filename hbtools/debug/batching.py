"""Several samples through one run: the switchable model with a free batch dimension.

A calibrated model has a fixed batch of 1 and its shape constants are folded for it,
so every run of the debugger used to carry one sample. On small models most of a run
is fixed cost (a session run, the ``If`` of each switch, small convolutions that use
a core badly), paid once per run however many samples it carries. ``free_batch``
(``hbtools.graph.batch_reshapes``) rewrites the folded ``Reshape`` targets so that the batch can grow (the same model at
batch 1), the stages declare a symbolic batch, and ``Switchboard`` checks once, on
real samples, that a batched float pass and a batched switchable run give exactly
(bit for bit) what the samples give one by one; only then are samples stacked.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hbtools.debug.data import Sample
from hbtools.graph.batch_reshapes import BATCH_DIM

# Per worker, the float values a batch keeps (what the stages hand on) stay under this. Models
# with larger hand-overs do enough work per run that its fixed costs are a small share, and
# stacking only adds memory traffic: the text detectors (55-130 MB per sample at 480-640 px)
# ran 20-50% slower per sample with 4 stacked. Small models gained 10-35% at 4, nothing more at 8.
MAX_BATCH_BYTES = 32_000_000
MAX_BATCH = 4


def batch_shape(shape: list[int | None] | None) -> list[int | str | None] | None:
    """A stage input's declared shape: the leading dimension is left free, named by its size in one sample.

    It holds the batch, or the batch times some rows where the model folded the batch
    into them (``Reshape`` to rows x features): stacked, equal sizes stay equal and unequal ones
    unequal. onnxruntime takes tensors of one dimension name for tensors of one size and may hand
    one's buffer to the other: a cross-attention's 100 query rows and 1600 memory rows, both named
    "batch", stopped every run ("Shape mismatch attempting to re-use buffer"). A leading size not
    known gets no name.
    """
    if not shape:
        return shape
    lead = shape[0]
    if not isinstance(lead, int):
        return [None, *shape[1:]]
    return [BATCH_DIM if lead == 1 else f"{BATCH_DIM}x{lead}", *shape[1:]]


def stack(samples: Sequence[Sample]) -> Sample:
    if len(samples) == 1:
        return samples[0]
    return {name: np.concatenate([s[name] for s in samples], axis=0) for name in samples[0]}


def unstack(values: Sequence[np.ndarray], count: int) -> list[list[np.ndarray]]:
    """Per sample, its part of each batched value (a copy: laid out in memory as a one-sample value).

    The leading dimension holds the samples one after another, one row each or, where the
    model folds the batch into it (``Reshape`` to rows x features), several.
    """
    if count == 1:
        return [list(values)]
    return [[_part(v, i, count).copy() for v in values] for i in range(count)]


def _part(value: np.ndarray, i: int, count: int) -> np.ndarray:
    rows = value.shape[0] // count
    return value[i * rows:(i + 1) * rows]


def identical(batched: dict[str, np.ndarray], single: Sequence[dict[str, np.ndarray]], names: Sequence[str]) -> bool:
    """Whether each named batched value is, slice by slice, exactly the one-sample value."""
    count = len(single)
    for t in names:
        b = batched[t]
        if b.ndim == 0 or b.shape[0] != count * single[0][t].shape[0]:
            return False
        for i, s in enumerate(single):
            if not np.array_equal(_part(b, i, count), s[t], equal_nan=True):
                return False
    return True


def batch_size(sample_count: int, workers: int, bytes_per_sample: int) -> int:
    """Samples per run: the samples spread evenly over the workers, within the memory budget."""
    per_worker = -(-sample_count // max(1, workers))
    budget = max(1, MAX_BATCH_BYTES // max(1, bytes_per_sample))
    return max(1, min(per_worker, budget, MAX_BATCH))
