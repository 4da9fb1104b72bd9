"""One onnxruntime session that runs the calibrated model with any calibration nodes enabled.

``Switchboard`` joins the switchable model (``switches``) and its stages
(``stages``). Per sample, ``float_pass`` runs the float model once and keeps what
the stages hand on; ``run`` then evaluates one configuration, computing only the
stages from the first enabled switch to the last observed tensor, float-only where
no switch is enabled.
"""

from __future__ import annotations

import logging
import os
import weakref
from collections.abc import Collection, Sequence

import numpy as np
import onnxruntime as ort
from onnx import ModelProto, TensorProto, helper

from hbtools.debug import stages as staging
from hbtools.debug.data import Sample
from hbtools.debug.model import CalibratedModel
from hbtools.debug.switches import enable_input, switchable_model

log = logging.getLogger("hbtools")
ON, OFF = np.array(True), np.array(False)
# Runs side by side (see ``evaluate.sweep``), each on one onnxruntime thread.
WORKERS = max(1, min(4, os.cpu_count() or 1))


class Switchboard:
    """Evaluate configurations of enabled calibration nodes on one session.

    ``observe`` are the tensors every run returns (the model outputs by default).
    """

    def __init__(self, cm: CalibratedModel, observe: Sequence[str] | None = None,
                 *, max_stages: int = staging.MAX_STAGES) -> None:
        self.observe = list(dict.fromkeys(observe or cm.outputs))
        switched = switchable_model(cm)
        shapes, types = staging.tensor_info(switched, cm.model)
        self.types = types
        plan = staging.plan(switched, shapes, types, self.observe, max_stages)
        try:
            self.session = _session(self._with_outputs(staging.wrap(switched, plan, shapes) if plan else
                                                       switched.model, plan))
        except Exception:  # staging is only an optimization: fall back to the plain switchable model
            if plan is None:
                raise
            log.debug("running unstaged", exc_info=True)
            plan = None
            self.session = _session(self._with_outputs(switched.model, None))
        exported = [t for ex in plan.exports for t in ex] if plan else []
        self._plan = plan
        self._off = {enable_input(c): OFF for c in cm.calibration}
        self._exports = exported
        if plan is None:
            self._stages_of = {c: {0} for c in cm.calibration}
            self._last = 0
        else:
            self._stages_of = {c: {plan.stage_of[h] for h in holders} for c, holders in switched.holders.items()}
            self._last = max(plan.producer(t) for t in self.observe)
            self._dummy = {t: np.zeros((0,), helper.tensor_dtype_to_np_dtype(types[t])) for t in exported}
            self._has_quant = {k for stages in self._stages_of.values() for k in stages}
        self.runs = 0
        self.workers = WORKERS

    def _with_outputs(self, model: ModelProto, plan: staging.Stages | None) -> ModelProto:
        """The observed and handed-over tensors as graph outputs, so runs can fetch them."""
        exported = [t for ex in plan.exports for t in ex] if plan else []
        present = {o.name for o in model.graph.output}
        for t in dict.fromkeys([*self.observe, *exported]):
            if t not in present:
                model.graph.output.append(helper.make_tensor_value_info(t, self.types.get(t, TensorProto.FLOAT), None))
        return model

    @property
    def stage_count(self) -> int:
        return 1 if self._plan is None else self._plan.count

    def float_pass(self, sample: Sample) -> dict[str, np.ndarray]:
        """Everything the stages hand on, and the observed tensors, of the float model."""
        fetch = list(dict.fromkeys([*self._exports, *self.observe]))
        feeds = {**sample, **self._off, **self._stage_feeds(0, self.stage_count - 1, set(), {})}
        self.runs += 1
        return dict(zip(fetch, self.session.run(fetch, feeds), strict=True))

    def stages_run(self, enabled: Collection[str]) -> list[int]:
        """The stages a run with ``enabled`` computes (the others hand on float values)."""
        if not enabled:
            return []
        first = min(min(self._stages_of[c]) for c in enabled)
        return list(range(first, self._last + 1))

    def run(self, sample: Sample, cache: dict[str, np.ndarray], enabled: Collection[str]) -> list[np.ndarray]:
        """The observed tensors with exactly the ``enabled`` calibration nodes quantizing."""
        if not enabled:
            return [cache[t] for t in self.observe]
        quant = set().union(*(self._stages_of[c] for c in enabled))
        feeds = {**sample, **self._off, **{enable_input(c): ON for c in enabled},
                 **self._stage_feeds(min(quant), self._last, quant, cache)}
        self.runs += 1
        return self.session.run(self.observe, feeds)

    def _stage_feeds(self, first: int, last: int, quant: set[int], cache: dict[str, np.ndarray]) -> dict:
        plan = self._plan
        if plan is None:
            return {}
        feeds: dict[str, np.ndarray] = {}
        for k, exports in enumerate(plan.exports):
            feeds[f"__stage{k}_run"] = ON if first <= k <= last else OFF
            if k in self._has_quant:
                feeds[f"__stage{k}_quant"] = ON if k in quant else OFF
            for t in exports:
                # Only a skipped stage's hand-over to a running stage is copied; the rest is a 0-size stand-in.
                needed = k < first and (plan.last_reader.get(t, -1) >= first or t in self.observe)
                feeds[f"{t}__cache"] = cache[t] if needed else self._dummy[t]
        return feeds


def _session(model: ModelProto) -> ort.InferenceSession:
    """Like ``hbtools.runtime.session.make_session``, but with idle threads that sleep.

    The debugger alternates short runs with numpy work on the outputs (metrics).
    onnxruntime's threads spin after each run by default and starve that numpy work
    (and anything else on the machine); without spinning a run on a busy 2-core
    machine was measured 1.5x faster.
    """
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.enable_cpu_mem_arena = False
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.intra_op_num_threads = max(1, (os.cpu_count() or 1) // WORKERS)
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


_shared: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def shared_board(cm: CalibratedModel, observe: Sequence[str] | None = None) -> Switchboard:
    """The board of ``cm`` observing ``observe``, built once per model object (runall reuses it)."""
    boards = _shared.setdefault(cm, {})
    key = tuple(dict.fromkeys(observe or cm.outputs))
    if key not in boards:
        boards[key] = Switchboard(cm, list(key))
    return boards[key]
