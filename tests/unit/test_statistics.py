"""The activation histogram calibration methods (KL, percentile) read."""

from __future__ import annotations

import numpy as np
import pytest

from hbtools.quant.statistics import CHUNK, TensorStats, abs_histogram


@pytest.mark.parametrize("bins", [2048, 512, 7])
def test_abs_histogram_counts_as_numpy_does(bins: int) -> None:
    rng = np.random.default_rng(bins)
    x = np.concatenate([rng.standard_t(3, CHUNK + 12345), -np.abs(rng.normal(0, 0.01, 5000)), np.zeros(100)])
    x = x.astype(np.float32)
    top = float(np.abs(x).max())
    got = abs_histogram(x, bins, top)
    want, _ = np.histogram(np.abs(x).astype(np.float64), bins=bins, range=(0.0, top))
    assert got.sum() == x.size
    # Only values within a float32 rounding of a bin edge may fall in the neighbouring bin.
    assert np.abs(got - want).sum() <= 2e-5 * x.size
    assert got[-1] >= 1 and got[0] >= 100  # the largest value is in the last (closed) bin, zeros in the first


def test_histogram_of_levels_puts_each_level_in_its_own_bin() -> None:
    """Values k + 1/2 steps (k = 0..127) over 128 bins of one step: level k in bin k, exactly; a
    value at the top lands in the last bin."""
    step = 0.037
    levels = ((np.arange(128) + 0.5) * step).astype(np.float32)
    x = np.concatenate([np.repeat(levels, np.arange(1, 129)), [np.float32(-128 * step)]]).astype(np.float32)
    np.random.default_rng(0).shuffle(x)
    got = abs_histogram(x, 128, 128 * step)
    np.testing.assert_array_equal(got, np.arange(1, 129) + np.eye(128, dtype=np.int64)[-1])


def test_streamed_statistics_merge_bins_when_the_range_grows() -> None:
    rng = np.random.default_rng(1)
    parts = [rng.normal(0, s, 20000).astype(np.float32) for s in (0.5, 1.0, 4.0)]
    stats = TensorStats(bins=256)
    for p in parts:
        stats.update(p)
    assert stats.count == 60000 and stats.hist.sum() == 60000
    assert stats.max_abs == pytest.approx(max(float(np.abs(p).max()) for p in parts))
    # The range doubled until it covered the largest value; every value sits in the bin of its magnitude.
    assert stats.range >= stats.max_abs > stats.range / 2
    edges = np.arange(257) * stats.bin_width
    want, _ = np.histogram(np.abs(np.concatenate(parts)), bins=edges)
    assert np.abs(stats.hist - want).sum() <= 1e-3 * 60000


@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
def test_non_finite_values_leave_the_statistics_of_the_others(bad: float) -> None:
    """An overflowing float model (Exp of a large input) gives inf or NaN: they are left out."""
    rng = np.random.default_rng(5)
    x = rng.normal(0, 2, (3, 50)).astype(np.float32)
    spoiled = x.copy()
    spoiled[1, 7] = spoiled[2, 0] = bad
    clean, got = TensorStats(), TensorStats()
    clean.update(np.delete(x.reshape(-1), [57, 100]))
    got.update(spoiled)
    assert (got.min, got.max, got.max_abs, got.count) == (clean.min, clean.max, clean.max_abs, clean.count)
    assert np.array_equal(got.hist, clean.hist)
    got.update(np.full(4, bad, np.float32))  # nothing finite: nothing changes
    assert got.count == clean.count and np.array_equal(got.hist, clean.hist)


def test_a_map_of_subnormal_values_gets_a_histogram(recwarn) -> None:
    """All values of a map below 1e-38 (a dying channel on random checker input): bins / top is beyond
    float32, which made the bin positions NaN and stopped the checker with an internal error."""
    x = np.array([1e-40, -5e-41, 0.0, 2e-40, 1e-45], dtype=np.float32)
    stats = TensorStats(bins=2048)
    stats.update(x)
    assert stats.count == 5 and stats.hist.sum() == 5
    assert stats.hist[-1] == 1 and stats.hist[0] == 2  # the top value in the last bin; 0 and 1e-45 in the first
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]


def _stream(seed: int) -> list[np.ndarray]:
    """Samples whose peaks grow and shrink (ranges double at different samples for different subsets), with
    values exactly at a peak, zeros, exact powers of two and bin edges."""
    rng = np.random.default_rng(seed)
    parts = []
    for k in range(12):
        x = rng.standard_t(3, 3000) * float(rng.choice([0.25, 1.0, 3.0, 17.0]))
        x[:40] = 0.0
        x[40:60] = np.float32(2.0) ** rng.integers(-6, 4, 20)
        x[60] = -np.abs(x).max() if k % 3 else np.abs(x).max()
        parts.append(x.astype(np.float32))
    return parts


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_statistics_binned_together_equal_statistics_binned_alone(seed: int) -> None:
    """The main collector and the cross-validation folds' ones (each leaving out its own samples) bin every
    sample once together: the histograms equal those each collector gets alone, count for count."""
    from hbtools.quant.statistics import StatsCollector, update_together

    parts = _stream(seed)
    parts[5] = parts[5] * np.float32(300.0)  # left out of fold 1 only: its range stays narrower to the end
    together = [StatsCollector(["t"]) for _ in range(3)]
    alone = [StatsCollector(["t"]) for _ in range(3)]
    for index, x in enumerate(parts):
        # sample 0 is everyone's (the folds' ranges then differ from the main one by powers of two); a later
        # sample is left out of fold 1 or 2 in turn, as calibration's scoring samples are
        chosen = [0, *(f for f in (1, 2) if not (index and index % 4 == f))]
        update_together([together[c] for c in chosen], {"t": x})
        for c in chosen:
            alone[c].update({"t": x})
    ranges = {c.stats["t"].range for c in together}
    assert len(ranges) > 1  # the folds' ranges did differ, so coarsened counts were used
    for a, b in zip(together, alone, strict=True):
        sa, sb = a.stats["t"], b.stats["t"]
        np.testing.assert_array_equal(sa.hist, sb.hist)
        assert (sa.range, sa.count, sa.zeros, sa.min, sa.max, a.samples) == (
            sb.range, sb.count, sb.zeros, sb.min, sb.max, b.samples)


def test_statistics_of_unrelated_ranges_are_binned_each_at_its_own() -> None:
    """Collectors whose first samples differ have ranges no power of two apart: each is binned at its own."""
    from hbtools.quant.statistics import StatsCollector, update_together

    parts = _stream(5)
    a, b, a_alone = StatsCollector(["t"]), StatsCollector(["t"]), StatsCollector(["t"])
    b.update({"t": parts[0] * np.float32(1.37)})
    for x in parts[1:]:
        update_together([a, b], {"t": x})
        a_alone.update({"t": x})
    np.testing.assert_array_equal(a.stats["t"].hist, a_alone.stats["t"].hist)
    assert b.stats["t"].hist.sum() == sum(x.size for x in parts)
