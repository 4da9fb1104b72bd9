"""Run many configurations over the samples and score them against the float model.

Samples are the outer loop: one float pass per sample (kept only while that sample
is evaluated), then every configuration on it. The models here have a fixed batch
of 1 (their shape constants are folded for it), so instead of batching, samples run
on parallel workers sharing the switchboard's sessions, each run single-threaded
(``switchboard.WORKERS``): the small convolutions of a batch-1 model split badly over
threads, and whole runs side by side keep every core busy. The configurations of the
last samples (as many as there are workers) are shared out among the workers, so that
they finish together (``_tasks``). A score is the mean over samples of the metric,
itself the mean over the observed tensors.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from hbtools.debug import batching
from hbtools.debug.data import Sample
from hbtools.debug.switchboard import Switchboard
from hbtools.errors import HbError
from hbtools.metrics import METRICS, CosineTo, average
from hbtools.runs.progress import Progress
from hbtools.runtime.session import RUN_ERRORS, release_shared_arena

log = logging.getLogger("hbtools")

Config = frozenset[str]
COSINE = "cosine-similarity"
# Per worker, the pieces each of the last samples of a sweep is cut in (``_tasks``): the workers end at most
# one piece apart, and a piece of PP-OCR rec's 47 weight configurations is 6 runs.
PIECES = 4
BELOW_STEP = "below-step"  # next to the metrics in the scored cache: per sample, an output rounded to all zeros
UNSCORED = (frozenset(), "unscored")  # in the scored cache: the samples whose float outputs are not all finite
# Called with (sample index, configuration index, float values, quantized values) of the
# observed tensors; calls are serialized, in no particular sample order.
Visitor = Callable[[int, int, list[np.ndarray], list[np.ndarray]], None]


def sweep(switchboard: Switchboard, samples: Sequence[Sample], configs: Sequence[Config], visit: Visitor,
          desc: str) -> None:
    bar = Progress(len(samples) * len(configs), desc, "run")
    lock = threading.Lock()
    size = switchboard.batch_for(samples)
    batches = [range(i, min(i + size, len(samples))) for i in range(0, len(samples), size)]
    tasks = _tasks(len(batches), len(configs), switchboard.workers)
    workers = min(switchboard.workers, len(tasks))
    prepared = _FloatPasses(switchboard, samples, batches, tasks)

    def run(task: tuple[int, range]) -> None:
        b, chunk = task
        indices = batches[b]
        sample, cache, reference = prepared.get(b)
        for k in chunk:
            got = batching.unstack(switchboard.run(sample, cache, configs[k]), len(indices))
            with lock:
                for index, r, g in zip(indices, reference, got, strict=True):
                    visit(index, k, r, g)
                bar.update(len(indices))
        prepared.done(b)

    if workers <= 1:
        for task in tasks:
            run(task)
    else:
        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(run, tasks))  # list(): re-raise a worker's exception
    bar.close()
    release_shared_arena()  # the runs' memory, kept between runs, goes back once the sweep is done


def _tasks(batches: int, configs: int, workers: int) -> list[tuple[int, range]]:
    """(batch, configurations) pieces of a sweep, in the order the workers take them.

    A batch is one piece, so that its float pass is made by the worker that runs it, but for the last
    ``workers`` batches: each is cut in ``PIECES * workers`` pieces, taken piece by piece across them, so
    that the workers finish at most a small piece apart instead of all but one waiting while the last
    batch runs on a worker of its own (up to a whole batch of runs: 47 on PP-OCR rec's weights, 0.5 s).
    """
    if workers <= 1:
        return [(b, range(configs)) for b in range(batches)]
    whole = max(0, batches - workers)
    tasks = [(b, range(configs)) for b in range(whole)]
    step = max(1, -(-configs // (PIECES * workers)))
    cuts = [range(a, min(a + step, configs)) for a in range(0, configs, step)]
    tasks += [(b, chunk) for chunk in cuts for b in range(whole, batches)]
    return tasks


class _FloatPasses:
    """Per batch, its stacked samples, float pass and float outputs per sample: made by the first piece
    of the batch a worker runs, dropped after its last."""

    def __init__(self, switchboard: Switchboard, samples: Sequence[Sample], batches: Sequence[range],
                 tasks: Sequence[tuple[int, range]]) -> None:
        self._switchboard, self._samples, self._batches = switchboard, samples, batches
        self._locks = [threading.Lock() for _ in batches]
        self._made: dict[int, tuple[Sample, dict[str, np.ndarray], list[list[np.ndarray]]]] = {}
        self._left = [0] * len(batches)
        for b, _ in tasks:
            self._left[b] += 1

    def get(self, b: int) -> tuple[Sample, dict[str, np.ndarray], list[list[np.ndarray]]]:
        with self._locks[b]:
            if b not in self._made:
                indices = self._batches[b]
                sample = batching.stack([self._samples[i] for i in indices])
                try:
                    cache = self._switchboard.float_pass(sample)
                except RUN_ERRORS:
                    _name_the_sample_float_fails_on(self._switchboard, self._samples, indices)
                    raise
                reference = batching.unstack([cache[t] for t in self._switchboard.observe], len(indices))
                self._made[b] = (sample, cache, reference)
            return self._made[b]

    def done(self, b: int) -> None:
        with self._locks[b]:
            self._left[b] -= 1
            if not self._left[b]:
                self._made.pop(b, None)


def _name_the_sample_float_fails_on(switchboard: Switchboard, samples: Sequence[Sample], indices: range) -> None:
    """Raise the ERROR naming the first of ``indices`` the float model cannot run (one run each: they were stacked)."""
    for i in indices:
        try:
            switchboard.float_pass(samples[i])
        except RUN_ERRORS as exc:
            raise HbError(f"the float model cannot run sample {i + 1} of calibrated_data "
                          f"({str(exc).splitlines()[0][:300]})",
                          hint="give every input data the model accepts: its values, not only its shape, matter "
                               "for index and size inputs") from None


def scores(switchboard: Switchboard, samples: Sequence[Sample], configs: Sequence[Config], metrics: Sequence[str],
           desc: str) -> list[dict[str, float]]:
    """Per configuration, each metric between its outputs and the float outputs.

    Configurations already scored on these samples are not run again (``Switchboard.scored``):
    runall's node ranking repeats many of the weight and activation configurations.
    """
    unique = list(dict.fromkeys(configs))  # nodes with the same switches share one run
    known = switchboard.scored(samples)
    todo = [c for c in unique if any((c, m) not in known for m in metrics)]
    # Per sample, summed in sample order afterwards: the result does not depend on which worker finished first.
    values = np.zeros((len(todo), len(metrics), len(samples)))
    below = np.zeros((len(todo), len(samples)), bool)

    # Per sample in flight, what its float outputs give every configuration (dropped after the last one).
    references: dict[int, _Reference] = {}
    visited = np.zeros(len(samples), np.int64)

    unscored: set[int] = known.setdefault(UNSCORED, set())

    def visit(index: int, k: int, reference: list[np.ndarray], got: list[np.ndarray]) -> None:
        if index in unscored:
            return
        if index not in references:
            references[index] = _Reference(reference, metrics)
            if not references[index].finite:  # a metric against NaN is NaN: one sample would void every score
                unscored.add(index)
                del references[index]
                log.warning("the float model's outputs on sample %d of calibrated_data are NaN or infinite: that "
                            "sample is left out of the metrics", index + 1)
                return
        ref = references[index]
        for j, m in enumerate(metrics):
            values[k, j, index] = average(m, ref.metric(m, got))
        below[k, index] = ref.rounded_to_zero(got)
        visited[index] += 1
        if visited[index] == len(todo):
            del references[index]

    if todo:
        sweep(switchboard, samples, todo, visit, desc)
    for c, per_metric, flags in zip(todo, values, below, strict=True):
        known.update(((c, m), v) for m, v in zip(metrics, per_metric, strict=True))
        known[(c, BELOW_STEP)] = flags
    kept = [i for i in range(len(samples)) if i not in unscored]
    if not kept:
        raise HbError("the float model's outputs are NaN or infinite on every sample of calibrated_data: there is "
                      "nothing to compare with; check the samples and the model's float outputs on them")
    return [{m: float(average(m, known[(c, m)][kept])) for m in metrics} for c in configs]


class _Reference:
    """One sample's float outputs, scored against each configuration's outputs.

    What depends on the float outputs alone is computed once per sample, not once per run
    (``CosineTo``; whether they are all 0): the same values, several times cheaper on
    outputs as large as a detector's score map.
    """

    def __init__(self, outputs: list[np.ndarray], metrics: Sequence[str]) -> None:
        self.outputs = outputs
        self.cosines = [CosineTo(r) for r in outputs] if COSINE in metrics else []
        self.nonzero = [bool(np.any(r)) for r in outputs]
        self.finite = all(not np.issubdtype(r.dtype, np.floating) or bool(np.all(np.isfinite(r))) for r in outputs)

    def metric(self, metric: str, got: list[np.ndarray]) -> list[float]:
        """``metric`` per output, between the float one and ``got``'s."""
        if metric == COSINE:
            return [c(g) for c, g in zip(self.cosines, got, strict=True)]
        return [METRICS[metric](r, g) for r, g in zip(self.outputs, got, strict=True)]

    def rounded_to_zero(self, got: list[np.ndarray]) -> bool:
        """Whether an output quantized to all 0 where its float values are not: each below half a quantization step."""
        return any(nz and not np.any(g) for nz, g in zip(self.nonzero, got, strict=True))


def below_step(switchboard: Switchboard, samples: Sequence[Sample], configs: Sequence[Config]) -> list[bool]:
    """Per configuration (already scored on ``samples``), whether on some sample an observed tensor
    quantized to all zeros while its float values are not: its cosine there is 0 for that reason."""
    known = switchboard.scored(samples)
    return [bool(np.any(known.get((c, BELOW_STEP), False))) for c in configs]


def tensor_values(switchboard: Switchboard, samples: Sequence[Sample], quantized: Config) -> tuple[
        dict[str, list[np.ndarray]], dict[str, list[np.ndarray]]]:
    """The observed tensors per sample in the float model and with ``quantized`` enabled."""
    floats: dict[str, list[np.ndarray]] = {t: [np.empty(0)] * len(samples) for t in switchboard.observe}
    quants: dict[str, list[np.ndarray]] = {t: [np.empty(0)] * len(samples) for t in switchboard.observe}

    def visit(index: int, _: int, reference: list[np.ndarray], got: list[np.ndarray]) -> None:
        for t, r, g in zip(switchboard.observe, reference, got, strict=True):
            floats[t][index] = r
            quants[t][index] = g

    sweep(switchboard, samples, [quantized], visit, "distributions")
    return floats, quants
