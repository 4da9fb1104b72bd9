"""Streaming activation statistics: the one implementation calibration uses.

Each tensor keeps a running max |x| and a fixed-size histogram of |x| whose range
doubles (merging bin pairs) when a larger value arrives, so memory depends on the
number of tensors, never on the number of samples.
"""

from __future__ import annotations

import numpy as np

BINS = 2048


class TensorStats:
    __slots__ = ("max_abs", "hist", "range", "count", "min", "max")

    def __init__(self) -> None:
        self.max_abs = 0.0
        self.min = np.inf
        self.max = -np.inf
        self.hist = np.zeros(BINS, dtype=np.int64)
        self.range = 0.0
        self.count = 0

    def update(self, x: np.ndarray) -> None:
        x = np.asarray(x, dtype=np.float32)
        if x.size == 0:
            return
        lo, hi = float(x.min()), float(x.max())
        self.min, self.max = min(self.min, lo), max(self.max, hi)
        peak = max(abs(lo), abs(hi))
        self.max_abs = max(self.max_abs, peak)
        if self.range == 0.0:
            self.range = peak if peak > 0 else 1e-8
        while peak > self.range:
            # Halve the resolution: merge neighbouring bins and double the covered range.
            self.hist = np.concatenate([self.hist.reshape(-1, 2).sum(axis=1), np.zeros(BINS // 2, np.int64)])
            self.range *= 2.0
        counts, _ = np.histogram(np.abs(x), bins=BINS, range=(0.0, self.range))
        self.hist += counts
        self.count += x.size

    @property
    def bin_width(self) -> float:
        return self.range / BINS


class StatsCollector:
    """Per-tensor statistics over a stream of ``{tensor: array}`` batches."""

    def __init__(self, tensors: list[str]) -> None:
        self.stats = {t: TensorStats() for t in tensors}
        self.samples = 0

    def update(self, values: dict[str, np.ndarray]) -> None:
        for name, value in values.items():
            if name in self.stats:
                self.stats[name].update(value)
        self.samples += 1
