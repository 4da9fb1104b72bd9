"""onnxruntime sessions that run the calibrated model with any calibration nodes enabled.

``Switchboard`` joins the switchable model (``switches``), its stages (``stages``)
and float tails (``tails``), each stage and tail a session. Per sample,
``float_pass`` runs the float model once and keeps what the stages hand on; ``run``
then evaluates one configuration: the stages from its first to its last enabled
switch in their switchable form, fed the kept float values, then the rest of the
model in one fused float tail.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import numpy as np
import onnxruntime as ort
from onnx import ModelProto

from hbtools.debug import batching
from hbtools.debug import stages as staging
from hbtools.debug.data import Sample
from hbtools.debug.model import CalibratedModel
from hbtools.debug.switches import switchable_model
from hbtools.graph.batch_reshapes import free_batch
from hbtools.graph.graph import elements, itemsize
from hbtools.ops import custom
from hbtools.ops.names import enable_input
from hbtools.runtime.custom_session import CustomOpSession
from hbtools.runtime.session import make_session, ort_session

log = logging.getLogger("hbtools")
ON, OFF = np.array(True), np.array(False)
# Runs side by side (see ``evaluate.sweep``), each on one onnxruntime thread.
WORKERS = max(1, min(4, os.cpu_count() or 1))
# Samples are stacked only when a batched run costs at most this share of the single runs: the
# gain on small models is 10-40%, and a noisy timing must not stack a model that loses by it.
BATCH_GAIN = 0.8


class Switchboard:
    """Evaluate configurations of enabled calibration nodes.

    ``observe`` are the tensors every run returns (the model outputs by default).
    """

    def __init__(self, cm: CalibratedModel, observe: Sequence[str] | None = None,
                 *, max_stages: int = staging.MAX_STAGES) -> None:
        self.observe = list(dict.fromkeys(observe or cm.outputs))
        switched = switchable_model(cm)
        shapes, types = staging.tensor_info(switched, cm)
        free_batch(switched.model, shapes)
        declared = {t: batching.batch_shape(s) for t, s in shapes.items()}  # the stages take any batch
        self._source = (switched, declared, types)
        self._itemsizes = {t: (elements(shapes.get(t)), itemsize(e)) for t, e in types.items()}
        typical = [*({c} for c in cm.calibration), *(cm.switches_of(n) for n in cm.quantizable)]
        plan = staging.plan(switched, shapes, types, self.observe, max_stages,
                            list({frozenset(c): c for c in typical}.values()))
        try:
            self._build(plan or staging.single(switched, self.observe))
        except Exception:  # cutting is only an optimization: fall back to the whole switchable model
            if plan is None:
                raise
            log.debug("running unstaged", exc_info=True)
            self._build(staging.single(switched, self.observe))
        self._off = {enable_input(c): OFF for c in cm.calibration}
        self._stages_of = {c: {self._plan.stage_of[h] for h in holders} for c, holders in switched.holders.items()}
        self.runs = 0
        self.workers = WORKERS
        self._batchable: bool | None = None  # found out on the first samples (``batch_for``)
        self._routes: dict[frozenset[str], tuple[list[int], list[int], int | None]] = {}
        self._scored: tuple[list[Sample], dict[tuple[frozenset[str], str], np.ndarray]] = ([], {})

    def _build(self, plan: staging.Stages) -> None:
        switched, shapes, types = self._source
        self._plan = plan
        self._float_stages: dict[int, _Part] = {}  # made when first needed (only when some tails are missing)
        self._lock = threading.Lock()
        self._exports = list(dict.fromkeys([*(t for ex in plan.exports[:plan.last + 1] for t in ex), *self.observe]))

        def stage(k: int) -> ModelProto:
            return staging.stage_model(switched, plan, k, shapes, types)

        def tail(j: int) -> ModelProto:
            return staging.tail_model(switched, plan, j, shapes, types)

        def float_model() -> ModelProto:
            # The whole float model, fused as a whole: its hand-overs are what the float model computes, so
            # a quantized node's input rounds as in the float model (a stage-by-stage float pass moved the
            # metrics' distance to the model with the other nodes deleted several-fold).
            return staging.tail_model(switched, plan, 0, shapes, types, self._exports)

        # Largest first, so that no long build is left alone at the end.
        parts = _built_parts([float_model, *(partial(tail, j) for j in plan.tails),
                              *(partial(stage, k) for k in range(plan.last + 1))])
        self._float_model = parts[0]
        self._tails = dict(zip(plan.tails, parts[1:1 + len(plan.tails)], strict=True))
        self._stages = parts[1 + len(plan.tails):]

    def batch_for(self, samples: Sequence[Sample]) -> int:
        """How many of ``samples`` one run carries (``batching``): 1 unless stacking them pays and changes nothing.

        Decided once, on the first samples swept, at the batch size that sweep uses.
        """
        per_sample = sum(n * size for n, size in (self._itemsizes.get(t, (1, 4)) for t in self._exports))
        size = batching.batch_size(len(samples), self.workers, per_sample)
        if size < 2:
            return 1
        if self._batchable is None:
            self._batchable = self._batching_pays(samples[:size])
        return size if self._batchable else 1

    def _batching_pays(self, samples: Sequence[Sample]) -> bool:
        """Whether a run carrying ``samples`` stacked equals, bit for bit, and clearly beats their runs one by one.

        Compared: the float pass, and a run with the model's first switch on (a stage, then
        nearly the whole model as a tail), each timed after a warm-up run of its shape.
        """
        first = list(self._stages_of)[:1]
        try:
            caches = [self.float_pass(s) for s in samples]
            stacked = batching.stack(samples)
            cache = self.float_pass(stacked)
            if not batching.identical(cache, caches, self._exports):
                return False
            singles = [dict(zip(self.observe, self.run(s, c, first), strict=True))
                       for s, c in zip(samples, caches, strict=True)]
            got = dict(zip(self.observe, self.run(stacked, cache, first), strict=True))
            if not batching.identical(got, singles, self.observe):
                return False
            start = time.perf_counter()
            for s, c in zip(samples, caches, strict=True):
                self.run(s, c, first)
            single = time.perf_counter() - start
            start = time.perf_counter()
            self.run(stacked, cache, first)
            return time.perf_counter() - start <= BATCH_GAIN * single
        except Exception:  # e.g. a shape constant that still holds the batch of 1: one sample per run
            log.debug("samples not batched", exc_info=True)
            return False

    def scored(self, samples: Sequence[Sample]) -> dict[tuple[frozenset[str], str], np.ndarray]:
        """Per (configuration, metric), the per-sample values already computed on ``samples`` (kept for the
        latest samples only: runall scores several sets of configurations on the same ones)."""
        kept = self._scored[0]
        if len(kept) != len(samples) or any(a is not b for a, b in zip(kept, samples, strict=True)):
            self._scored = (list(samples), {})  # holding the samples keeps their identity meaningful
        return self._scored[1]

    @property
    def stage_count(self) -> int:
        return self._plan.count

    def float_pass(self, sample: Sample) -> dict[str, np.ndarray]:
        """Everything the stages hand on, and the observed tensors, of the float model."""
        values = dict(sample)
        self._float_model(values)
        self.runs += 1
        return {t: values[t] for t in self._exports}

    def stages_run(self, enabled: Collection[str]) -> list[int]:
        """The stages a run with ``enabled`` computes in switchable form (the others hand on float values)."""
        return self._route(enabled)[0]

    def tail_run(self, enabled: Collection[str]) -> int | None:
        """The float tail a run with ``enabled`` finishes with (None: none)."""
        return self._route(enabled)[2]

    def run(self, sample: Sample, cache: dict[str, np.ndarray], enabled: Collection[str]) -> list[np.ndarray]:
        """The observed tensors with exactly the ``enabled`` calibration nodes quantizing."""
        switchable, floating, tail = self._route(enabled)
        if not switchable:
            return [cache[t] for t in self.observe]
        values = {**sample, **cache, **self._off}
        values.update((enable_input(c), ON) for c in enabled)
        for k in switchable:
            self._stages[k](values)
        for k in floating:
            self._float_stage(k)(values)
        if tail is not None:
            self._tails[tail](values)
        self.runs += 1
        return [values[t] for t in self.observe]

    def _route(self, enabled: Collection[str]) -> tuple[list[int], list[int], int | None]:
        """The stages run in switchable form, then in float form, then the tail (None: none)."""
        key = frozenset(enabled)
        if key not in self._routes:  # a sweep runs each configuration once per batch of samples
            self._routes[key] = self._find_route(key)
        return self._routes[key]

    def _find_route(self, enabled: Collection[str]) -> tuple[list[int], list[int], int | None]:
        if not enabled:
            return [], [], None
        quant = set().union(*(self._stages_of[c] for c in enabled))
        last = len(self._stages) - 1  # the stages after the last observed tensor are never needed
        first, q = min(quant), min(max(quant), last)
        floating = []
        for k in range(q + 1, last + 1):
            if k in self._tails:
                return list(range(first, q + 1)), floating, k
            floating.append(k)
        return list(range(first, q + 1)), floating, None

    def _float_stage(self, k: int) -> _Part:
        with self._lock:
            if k not in self._float_stages:
                switched, shapes, types = self._source
                model = staging.stage_model(switched, self._plan, k, shapes, types, floating=True)
                self._float_stages[k] = _Part(model)
            return self._float_stages[k]


class _Part:
    """One stage or tail and its session; a call adds its outputs to ``values``."""

    def __init__(self, model: ModelProto) -> None:
        self.inputs = [i.name for i in model.graph.input]
        self.outputs = [o.name for o in model.graph.output]
        self.session = _session(model)

    def __call__(self, values: dict[str, np.ndarray]) -> None:
        values.update(zip(self.outputs, self.session.run(self.outputs, {i: values[i] for i in self.inputs}),
                          strict=True))


def _built_parts(makers: Sequence[Callable[[], ModelProto]]) -> list[_Part]:
    """The parts the ``makers`` describe, built on ``WORKERS`` threads.

    The sessions were 0.6 s of the 0.9 s a board of PP-OCR rec takes to set up, all of it
    before the first run, with one core idle; onnxruntime optimizes a model without
    holding the GIL, so side by side they overlap (0.1-0.3 s less, measured on a busy
    2-core machine). Each is the same session as built alone.
    """
    if WORKERS <= 1 or len(makers) <= 1:
        return [_Part(make()) for make in makers]
    with ThreadPoolExecutor(WORKERS, thread_name_prefix="hbtools-board") as pool:
        return list(pool.map(lambda make: _Part(make()), makers))


def _session(model: ModelProto) -> ort.InferenceSession | CustomOpSession:
    """Like ``hbtools.runtime.session.make_session``, but with idle threads that sleep.

    The debugger alternates short runs with numpy work on the outputs (metrics).
    onnxruntime's threads spin after each run by default and starve that numpy work
    (and anything else on the machine); without spinning a run on a busy 2-core
    machine was measured 1.5x faster. The sessions allocate from onnxruntime's shared arena
    (``ort_session``): one run's intermediates are no longer faulted in from the system each
    time. A model with the user's custom CPU ops goes through ``make_session``, which runs
    them around onnxruntime.
    """
    threads = max(1, (os.cpu_count() or 1) // WORKERS)
    if custom.has_custom_nodes(model):
        return make_session(model, threads=threads)
    return ort_session(model, threads=threads, spinning=False, shared_arena=True)


_shared: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def shared_switchboard(cm: CalibratedModel, observe: Sequence[str] | None = None) -> Switchboard:
    """The switchboard of ``cm`` observing ``observe``, built once per model object (runall reuses it)."""
    boards = _shared.setdefault(cm, {})
    key = tuple(dict.fromkeys(observe or cm.outputs))
    if key not in boards:
        boards[key] = Switchboard(cm, list(key))
    return boards[key]
