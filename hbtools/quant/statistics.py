"""Streaming activation statistics: the one implementation calibration uses.

Each tensor keeps a running max |x|, min and max, the count of exact zeros, and a
fixed-size histogram of |x| whose range doubles (merging bin pairs) when a larger
value arrives, so memory depends on the number of tensors (and, per channel, of
channels), never on the number of samples.
"""

from __future__ import annotations

import numpy as np

from hbtools.graph.masks import MASKED_BELOW

BINS = 2048
CHUNK = 1 << 20  # elements histogrammed at a time (temporaries of 12 bytes per element)
CHANNEL_BINS = 512  # per channel: KL/percentile still resolve a 128-level grid, memory stays C * 4 kB


def _finite(x: np.ndarray) -> tuple[np.ndarray, float, float]:
    """The finite values of ``x`` and their min and max: an overflowing float model (Exp of a large
    input gives inf) has no grid for inf or NaN; they saturate at run time and must not spoil the
    statistics. A finite min and max (NaN propagates into both) mean every value is finite."""
    lo, hi = float(x.min()), float(x.max())
    if np.isfinite(lo) and np.isfinite(hi):
        return x, lo, hi
    x = x[np.isfinite(x)]
    return (x, float(x.min()), float(x.max())) if x.size else (x, 0.0, 0.0)


def abs_histogram(flat: np.ndarray, bins: int, top: float) -> np.ndarray:
    """Counts of |x| (float32, 1-D, all |x| <= ``top``) in ``bins`` equal bins over [0, top], the last
    one closed. Bin k holds k <= |x| * bins / top < k + 1, the product taken in float32: a value
    within a rounding of an edge may land in the neighbouring bin. Three passes over the data and a
    bincount (np.histogram's general algorithm makes about a dozen, in float64)."""
    return _closed(_abs_counts(flat, bins, top))


def abs_histograms(flat: np.ndarray, bins: int, tops: list[float]) -> list[np.ndarray]:
    """``abs_histogram`` of ``flat`` for each of ``tops`` (each at least max |x|), binning the data once for
    tops that are a power of two apart: bin k at ``top`` is bin k >> d at ``top * 2**d`` exactly (the
    float32 product scales by the power of two, and the floor of a half is the half of the floor), so the
    coarser counts are sums of the finer ones, identical to binning again."""
    counts: dict[float, np.ndarray] = {}
    for top in sorted(set(tops)):
        finer = next(((f, c) for f, c in counts.items() if _octaves(f, top) is not None), None)
        if finer is None or _wide(bins, finer[0]):
            counts[top] = _abs_counts(flat, bins, top)
        else:
            counts[top] = _coarser(finer[1], _octaves(finer[0], top))
    return [_closed(counts[top]) for top in tops]


def _wide(bins: int, top: float) -> bool:
    """A range of subnormal size (an all-but-zero map) has bins / top beyond float32: the product in float64."""
    return bins / top > float(np.finfo(np.float32).max)


def _octaves(fine: float, coarse: float) -> int | None:
    """d where ``coarse`` is exactly ``fine * 2**d`` (d >= 0), else None."""
    mantissa, exponent = np.frexp(coarse / fine)
    return int(exponent) - 1 if mantissa == 0.5 and coarse / fine * fine == coarse else None


def _coarser(counts: np.ndarray, octaves: int) -> np.ndarray:
    """``_abs_counts`` at a range 2**octaves times wider, from the counts at the narrower one."""
    if octaves == 0:
        return counts.copy()
    starts = np.arange(0, counts.size, 1 << min(octaves, 62))
    out = np.zeros_like(counts)
    out[:starts.size] = np.add.reduceat(counts, starts)
    return out


def _closed(counts: np.ndarray) -> np.ndarray:
    """The ``bins`` counts with the last bin closed: top itself belongs to it."""
    bins = counts.size - 1
    hist = counts[:bins].copy()
    hist[bins - 1] += counts[bins]
    return hist


def _abs_counts(flat: np.ndarray, bins: int, top: float) -> np.ndarray:
    """bins + 1 counts of floor(|x| * bins / top): the last one holds |x| == top (up to a rounding)."""
    scale = bins / top
    wide = _wide(bins, top)
    scale = np.float64(scale) if wide else np.float32(scale)
    counts = np.zeros(bins + 1, dtype=np.int64)
    for start in range(0, flat.size, CHUNK):
        position = np.abs(flat[start:start + CHUNK].astype(np.float64) if wide else flat[start:start + CHUNK])
        np.multiply(position, scale, out=position)
        # |x| <= top puts |x| * bins / top at most a rounding above ``bins``: its floor is ``bins``.
        counts += np.bincount(position.astype(np.intp), minlength=bins + 1)
    return counts


class TensorStats:
    __slots__ = ("max_abs", "hist", "range", "count", "min", "max", "zeros", "masked")

    def __init__(self, bins: int = BINS) -> None:
        self.max_abs = 0.0
        self.min = np.inf
        self.max = -np.inf
        self.hist = np.zeros(bins, dtype=np.int64)
        self.range = 0.0
        self.count = 0
        self.zeros = 0  # exact zeros (a ReLU's negative half, padding), all in bin 0 of ``hist``
        self.masked = 0  # values left out as masked positions of a Softmax input (``StatsCollector.masked``)

    def update(self, x: np.ndarray) -> None:
        TensorStats.update_all([self], x)

    @staticmethod
    def update_all(stats: list[TensorStats], x: np.ndarray) -> None:
        """``update`` of each of ``stats`` (of one bin count) with the same values, binned once where their
        ranges allow (``abs_histograms``)."""
        x = np.asarray(x, dtype=np.float32).reshape(-1)
        if x.size == 0:
            return
        x, lo, hi = _finite(x)
        if x.size == 0:
            return
        peak = max(abs(lo), abs(hi))
        for one in stats:
            one._widen(lo, hi, peak)
        zeros = x.size - int(np.count_nonzero(x))
        for one, hist in zip(stats, abs_histograms(x, stats[0].hist.size, [one.range for one in stats]),
                             strict=True):
            one.hist += hist
            one.count += x.size
            one.zeros += zeros

    def _widen(self, lo: float, hi: float, peak: float) -> None:
        self.min, self.max = min(self.min, lo), max(self.max, hi)
        self.max_abs = max(self.max_abs, peak)
        if self.range == 0.0:
            self.range = peak if peak > 0 else 1e-8
        bins = self.hist.size
        while peak > self.range:
            # Halve the resolution: merge neighbouring bins and double the covered range.
            self.hist = np.concatenate([self.hist.reshape(-1, 2).sum(axis=1), np.zeros(bins // 2, np.int64)])
            self.range *= 2.0

    @property
    def bin_width(self) -> float:
        return self.range / self.hist.size


class ChannelStats:
    """The statistics of TensorStats for every channel along ``axis`` (per-channel calibration).

    One ``bincount`` per update fills all channels' histograms; a channel's range
    doubles on its own when a larger value arrives.
    """

    def __init__(self, axis: int, bins: int = CHANNEL_BINS) -> None:
        self.axis = axis
        self.bins = bins
        self.max_abs = self.min = self.max = self.range = None
        self.hist: np.ndarray | None = None
        self.count = 0
        self.zeros: np.ndarray | None = None  # per channel, as TensorStats.zeros

    def update(self, x: np.ndarray) -> None:
        x = np.asarray(x, dtype=np.float32)
        if x.size == 0:
            return
        if not np.isfinite(x).all():  # keep the channel layout: non-finite values count as 0
            x = np.where(np.isfinite(x), x, np.float32(0.0))
        rows = np.moveaxis(x, self.axis, 0).reshape(x.shape[self.axis], -1)
        lo, hi = rows.min(axis=1).astype(np.float64), rows.max(axis=1).astype(np.float64)
        peak = np.maximum(np.abs(lo), np.abs(hi))
        if self.hist is None:
            channels = rows.shape[0]
            self.hist = np.zeros((channels, self.bins), dtype=np.int64)
            self.zeros = np.zeros(channels, dtype=np.int64)
            self.min, self.max, self.max_abs = lo, hi, peak
            self.range = np.where(peak > 0, peak, 1e-8)
        else:
            self.min, self.max = np.minimum(self.min, lo), np.maximum(self.max, hi)
            self.max_abs = np.maximum(self.max_abs, peak)
        for c in np.nonzero(peak > self.range)[0]:
            while peak[c] > self.range[c]:
                merged = self.hist[c].reshape(-1, 2).sum(axis=1)
                self.hist[c] = np.concatenate([merged, np.zeros(self.bins // 2, np.int64)])
                self.range[c] *= 2.0
        width = self.range / self.bins
        index = np.minimum((np.abs(rows) / width[:, None]).astype(np.int64), self.bins - 1)
        index += (np.arange(rows.shape[0]) * self.bins)[:, None]
        self.hist += np.bincount(index.reshape(-1), minlength=self.hist.size).reshape(self.hist.shape)
        self.count += rows.shape[1]
        self.zeros += rows.shape[1] - np.count_nonzero(rows, axis=1)

    @property
    def channels(self) -> int:
        return 0 if self.hist is None else self.hist.shape[0]

    def channel(self, c: int) -> TensorStats:
        """Channel ``c`` as a TensorStats (the threshold methods take those)."""
        stats = TensorStats(self.bins)
        stats.max_abs, stats.min, stats.max = float(self.max_abs[c]), float(self.min[c]), float(self.max[c])
        stats.hist, stats.range, stats.count = self.hist[c], float(self.range[c]), self.count
        stats.zeros = int(self.zeros[c])
        return stats


class StatsCollector:
    """Per-tensor (or, for tensors in ``axes``, per-channel) statistics over a stream of batches."""

    def __init__(self, tensors: list[str], axes: dict[str, int] | None = None,
                 counted_where: dict[str, str] | None = None, masked: set[str] = frozenset()) -> None:
        """``masked``: tensors on the way to a Softmax input (``masks.logit_carriers``), whose values at or
        below ``masks.MASKED_BELOW`` are masked positions: counted apart, not as magnitudes."""
        axes = axes or {}
        self.masked = {t for t in masked if t not in axes}
        self.stats: dict[str, TensorStats | ChannelStats] = {
            t: ChannelStats(axes[t]) if t in axes else TensorStats() for t in tensors}
        # tensor -> another tensor: count only the elements where that one is not zero (``nonzero_where``)
        self.counted_where = {t: m for t, m in (counted_where or {}).items() if isinstance(self.stats.get(t),
                                                                                            TensorStats)}
        self.samples = 0

    @property
    def extra_tensors(self) -> list[str]:
        """Tensors ``update`` needs besides the ones it collects statistics of."""
        return list(dict.fromkeys(self.counted_where.values()))

    def update(self, values: dict[str, np.ndarray], *, masks: dict[str, np.ndarray] | None = None,
               new_sample: bool = True) -> None:
        """Add ``values`` (of one sample, or of part of one: ``new_sample`` False for the other parts).
        ``masks``: the ``extra_tensors`` known so far, where ``values`` may lack them; a tensor whose
        mask is in neither counts all its elements."""
        update_together([self], values, masks=masks, new_sample=new_sample)

    def _counted(self, name: str, value: np.ndarray, masks: dict[str, np.ndarray]) -> tuple[np.ndarray, int]:
        """The values of ``name`` its statistics count, and how many masked positions were left out."""
        mask = self.counted_where.get(name)
        if mask is not None and mask in masks:
            where = nonzero_where(masks[mask], np.shape(value))
            value = np.asarray(value)[where] if where is not None else value
        if name not in self.masked:
            return value, 0
        value = np.asarray(value, dtype=np.float32).reshape(-1)
        scores = ~(value <= MASKED_BELOW)
        masked = value.size - int(np.count_nonzero(scores))
        # the scores alone (most tensors on the way to a Softmax hold no mask)
        return (value[scores] if masked else value), masked


def update_together(collectors: list[StatsCollector], values: dict[str, np.ndarray], *,
                    masks: dict[str, np.ndarray] | None = None, new_sample: bool = True) -> None:
    """``StatsCollector.update`` of each of ``collectors`` (made alike, by one ``plan.collector``) with the same
    values. Each tensor's values are binned once where the collectors' ranges are a power of two apart, as
    they are when all saw the same first sample (the cross-validation folds' collectors and the main one
    bin every sample alike; binning each separately made calibration bin most samples three times)."""
    first = collectors[0]
    masks = values if masks is None else {**masks, **values}
    for name, value in values.items():
        if name not in first.stats:
            continue
        value, masked = first._counted(name, value, masks)
        stats = [c.stats[name] for c in collectors]
        for one in stats if masked else ():  # non-zero only for per-tensor statistics (``masked`` has no others)
            one.masked += masked
        if isinstance(stats[0], TensorStats):
            TensorStats.update_all(stats, value)
        else:
            for one in stats:
                one.update(value)
    for c in collectors:
        c.samples += int(new_sample)


def nonzero_where(other: np.ndarray, shape: tuple[int, ...]) -> np.ndarray | None:
    """A boolean mask of ``shape``: where some element of ``other`` that broadcasts onto that position is not
    zero (``other`` reduced over the axes ``shape`` broadcasts); None where the two shapes do not broadcast so."""
    other = np.asarray(other)
    if other.ndim > len(shape):
        return None
    other = other.reshape((1,) * (len(shape) - other.ndim) + other.shape)
    axes = tuple(k for k, (o, s) in enumerate(zip(other.shape, shape, strict=True)) if s == 1 and o != 1)
    if any(o not in (1, s) for k, (o, s) in enumerate(zip(other.shape, shape, strict=True)) if k not in axes):
        return None
    nonzero = other != 0
    if axes:
        nonzero = nonzero.any(axis=axes, keepdims=True)
    return np.broadcast_to(nonzero, shape)
