"""makertbin's searches score samples side by side: the same scores, bounds and decisions as one by one.

``search.side_by_side`` keeps up to ``SCORE_WORKERS`` runs in flight and hands results back in
sample order, so every sum is taken in the order a sequential score takes it.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from test_search_session import _dead_channel_plan, _float_run

from hbtools.quant import search
from hbtools.quant.plan import weight_thresholds
from hbtools.quant.search import Evaluator, side_by_side


def test_results_come_back_in_order_whatever_finishes_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(search, "SCORE_WORKERS", 2)
    delays = [0.03, 0.0, 0.02, 0.0, 0.01, 0.0]

    def run(i: int) -> list[np.ndarray]:
        time.sleep(delays[i])
        return [np.full(2, i)]

    got = list(side_by_side(run, [4, 0, 5, 1, 3, 2], object()))
    assert [i for i, _ in got] == [4, 0, 5, 1, 3, 2]
    assert all(np.array_equal(out[0], np.full(2, i)) for i, out in got)


def test_a_consumer_that_stops_early_starts_few_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(search, "SCORE_WORKERS", 2)
    started = []
    lock = threading.Lock()

    def run(i: int) -> list[np.ndarray]:
        with lock:
            started.append(i)
        time.sleep(0.01)
        return [np.zeros(1)]

    for i, _ in side_by_side(run, list(range(10)), object()):
        if i == 1:
            break
    time.sleep(0.05)  # let the runs already in flight finish
    assert started[:2] == [0, 1] and len(started) <= 4


@pytest.mark.parametrize("bits", [8, 16])
def test_scores_and_bounds_equal_one_by_one(monkeypatch: pytest.MonkeyPatch, bits: int) -> None:
    optimized, plan = _dead_channel_plan(bits)
    rng = np.random.default_rng(3)
    feeds = [{"x": rng.normal(0, 100, (1, 3, 8, 8)).astype(np.float32)} for _ in range(7)]
    widest, refs = _float_run(optimized, plan, feeds)
    weight_th = weight_thresholds(optimized, plan)
    narrow = {t: v / 8 for t, v in widest.items()}  # clips: a lower score, and a bound below a high goal

    def scores(workers: int) -> list[tuple[float, bool]]:
        monkeypatch.setattr(search, "SCORE_WORKERS", workers)
        evaluator = Evaluator(optimized, plan, weight_th, feeds, refs, widest)
        found = []
        for th, at_least in ((widest, None), (narrow, None), (narrow, 0.999999), (widest, 0.5)):
            found.append((evaluator.score(th, at_least=at_least), evaluator.complete))
        found.append((evaluator.score(*evaluator.all_int16()), evaluator.complete))
        return found

    one_by_one, side = scores(1), scores(2)
    assert side == one_by_one
    assert not one_by_one[2][1]  # the high goal really stopped early


def test_a_model_with_large_activations_is_scored_one_run_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    optimized, plan = _dead_channel_plan(8)
    feeds = [{"x": np.ones((1, 3, 8, 8), np.float32)}] * 2
    widest, refs = _float_run(optimized, plan, feeds)
    weight_th = weight_thresholds(optimized, plan)
    monkeypatch.setattr(search, "SCORE_WORKERS", 2)
    assert Evaluator(optimized, plan, weight_th, feeds, refs, widest).workers == 2
    # Its activations are float maps of 1x4x8x8 and 1x2x8x8: a few kB.
    monkeypatch.setattr(search, "SIDE_BY_SIDE_BYTES", 1000)
    assert Evaluator(optimized, plan, weight_th, feeds, refs, widest).workers == 1


def test_a_forked_child_scores_side_by_side_too(monkeypatch: pytest.MonkeyPatch) -> None:
    import multiprocessing

    monkeypatch.setattr(search, "SCORE_WORKERS", 2)

    def run(i: int) -> list[np.ndarray]:
        return [np.full(1, i)]

    assert [i for i, _ in side_by_side(run, [0, 1, 2], object())] == [0, 1, 2]  # the parent's pool exists now
    context = multiprocessing.get_context("fork")
    queue = context.Queue()

    def child() -> None:
        queue.put([i for i, _ in side_by_side(run, [2, 0, 1], object())])

    process = context.Process(target=child)
    process.start()
    process.join(30)
    alive = process.is_alive()
    if alive:
        process.kill()
    assert not alive, "the forked child's runs never came back"
    assert queue.get(timeout=5) == [2, 0, 1]
