"""The dynamic programme placing the debugger's stage cuts finds the cuts of the plain recurrence."""

from __future__ import annotations

import numpy as np
import pytest

from hbtools.debug import cuts


def _plain(cumulative, extra, crossing, firsts, lasts, max_stages: int, tails: bool) -> list[int]:
    """best[t, j] = min over i < j of best[t - 1, i] + cost(i, j), the first i of the lowest, one j at a time."""
    costs = {}
    n = len(cumulative) - 1
    points = np.unique(np.concatenate([[0], firsts[firsts > 0], [n]]))
    starting = np.searchsorted(firsts, points, side="left")
    ended = np.searchsorted(lasts, points, side="left")
    crossed = cuts.BOUNDARY_COPIES * crossing[points]
    total = cumulative[-1]
    overhead = cuts.STAGE_OVERHEAD * total
    m = len(points) - 1
    for j in range(1, m + 1):
        for i in range(j):
            begin, active = starting[j] - starting[i], starting[j] - ended[i]
            more = extra[points[j]] - extra[points[i]]
            if not tails:
                costs[i, j] = begin * (total - cumulative[points[i]] + more) + (crossed[j] + overhead) * starting[j]
            else:
                costs[i, j] = begin * (total - cumulative[points[i]]) + active * (more + crossed[i] + crossed[j]
                                                                                   + overhead)
    best = {(0, 0): 0.0}
    came = {}
    for t in range(1, max_stages + 1):
        for j in range(1, m + 1):
            options = [(best.get((t - 1, i), np.inf) + costs[i, j], i) for i in range(j)]
            value, i = min(options, key=lambda o: o[0])  # min keeps the first of equal values
            best[t, j], came[t, j] = value, i
    t = min(range(max_stages + 1), key=lambda s: best.get((s, m), np.inf))
    j, starts = m, []
    while t > 0:
        j = came[t, j]
        starts.append(int(points[j]))
        t -= 1
    return sorted(starts)


@pytest.mark.parametrize("seed", range(12))
def test_the_cuts_are_those_of_the_plain_recurrence(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 30))
    cumulative = np.concatenate([[0.0], np.cumsum(np.round(rng.random(n) * rng.choice([1, 100, 1e6])))])
    extra = np.concatenate([[0.0], np.cumsum(np.round(rng.random(n) * rng.choice([0, 1, 100])))])
    crossing = np.round(rng.random(n + 1) * rng.choice([0, 1, 1e3]))  # whole numbers: ties happen
    spans = np.sort(rng.integers(0, n, (int(rng.integers(1, 20)), 2)), axis=1)
    firsts, lasts = np.sort(spans[:, 0]), np.sort(spans[:, 1])
    for max_stages in (1, 3, 8):
        for tails in (True, False):
            assert cuts._best_starts(cumulative, extra, crossing, firsts, lasts, max_stages, tails) == _plain(
                cumulative, extra, crossing, firsts, lasts, max_stages, tails)
