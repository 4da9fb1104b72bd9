"""The early stop of threshold scoring: a partial score's bound never falls below the full score."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from hbtools.metrics import cosine_similarity
from hbtools.quant.search import reachable_cosine, scoring_order


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), samples=st.integers(2, 6), known=st.integers(1, 5),
       noise=st.sampled_from([0.0, 0.01, 0.3, 3.0]))
def test_bound_is_never_below_the_cosine_of_any_completion(seed: int, samples: int, known: int, noise: float) -> None:
    rng = np.random.default_rng(seed)
    refs = [rng.normal(size=(3, 4)).astype(np.float32) for _ in range(samples)]
    outs = [(r + noise * rng.normal(size=r.shape)).astype(np.float32) for r in refs]
    if seed % 3 == 0:
        outs[0] = -outs[0]  # a sample pointing the other way
    known = min(known, samples)
    full = cosine_similarity(np.concatenate([r.ravel() for r in refs]), np.concatenate([o.ravel() for o in outs]))
    bound = reachable_cosine(refs, outs[:known])
    assert bound >= full - 1e-9
    if known == samples and full >= 0:
        assert abs(bound - full) < 1e-6, "with every sample known the bound is the cosine itself"
    # The best completion (outputs equal to the references) reaches the bound when the known part agrees.
    best = outs[:known] + refs[known:]
    cos_best = cosine_similarity(np.concatenate([r.ravel() for r in refs]), np.concatenate([o.ravel() for o in best]))
    assert bound >= cos_best - 1e-9


def test_scoring_order_puts_the_samples_carrying_most_of_the_output_first() -> None:
    """Per output, each sample's share of the float energy; an output of small scale counts as much."""
    quiet = np.zeros((2, 2), np.float32)
    refs = [[quiet, np.full(3, 1e-3, np.float32)],  # all of the second output's energy
            [np.ones((2, 2), np.float32), np.zeros(3, np.float32)],  # half of the first output's
            [np.ones((2, 2), np.float32) * 0.5, np.zeros(3, np.float32)],
            [np.ones((2, 2), np.float32) * np.sqrt(0.75), np.zeros(3, np.float32)]]
    assert scoring_order(refs) == [0, 1, 3, 2]
    assert scoring_order([]) == []
