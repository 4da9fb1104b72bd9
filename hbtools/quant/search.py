"""Scoring calibration choices on what the user will run, and the searches built on it.

``Evaluator`` runs the calibrated model, lowered with fed calibration grids
(``feed_calibration``), on a few kept samples: one session scores any threshold,
bit width or enable assignment. Method choice, ``mix`` refinement, mixed precision
(int16 promotion) and sensitivity ranking return their results; none changes the
plan it was given.
"""

from __future__ import annotations

import copy
import logging
import sys

import numpy as np
import onnxruntime as ort
from onnx import ModelProto
from tqdm import tqdm

from hbtools.metrics import cosine_similarity
from hbtools.ops.names import enable_input
from hbtools.quant.plan import CalibrationPlan, build_calibrated_model
from hbtools.runtime.lowering import lower_model
from hbtools.runtime.session import make_session

log = logging.getLogger("hbtools")

PROMOTE_TARGET = 0.9999  # output cosine at which the int16 search stops
KEEP_GAIN = 0.99  # share of the all-int16 improvement mixed precision must keep
DEMOTE_STEPS = 24  # tensors go back to int8 in about this many groups
SENSITIVITY_SAMPLES = 2  # samples used to measure each tensor's sensitivity
SENSITIVITY_MAX_TENSORS = 200  # beyond this, the noisiest tensors are measured


def reachable_cosine(refs: list[np.ndarray], got: list[np.ndarray]) -> float:
    """Upper bound of the cosine between the concatenated ``refs`` and outputs of which only the
    first ``len(got)`` are known (inf when ``refs`` are all zero).

    With ``a`` the references and ``b`` the outputs, split into the known samples ``s`` and the
    rest ``r``, the cosine ``(a_s.b_s + a_r.b_r) / (|a| |b|)`` is largest for ``b_r`` along
    ``a_r``, where (Cauchy-Schwarz) it is at most ``sqrt(max(a_s.b_s, 0)^2 / |b_s|^2 + |a_r|^2) / |a|``.
    """
    total = sum(float(np.square(r, dtype=np.float64).sum()) for r in refs)
    if total == 0.0:
        return np.inf
    seen = dot = norm = 0.0
    for ref, out in zip(refs, got, strict=False):
        a, b = ref.reshape(-1).astype(np.float64), out.reshape(-1).astype(np.float64)
        seen, dot, norm = seen + float(a @ a), dot + float(a @ b), norm + float(b @ b)
    first = max(dot, 0.0) ** 2 / norm if norm > 0 else 0.0
    return float(np.sqrt(first + max(total - seen, 0.0)) / np.sqrt(total))


class Evaluator:
    """Scores threshold assignments on one session with fed calibration scales."""

    def __init__(self, optimized: ModelProto, plan: CalibrationPlan, weight_th: dict[str, np.ndarray],
                 feeds: list[dict], refs: list[list[np.ndarray]], built: dict[str, float]) -> None:
        """``built``: activation thresholds the session is built with. Fed grids replace them at run
        time, but the weight grids stay as they fix them (a grid widened so that a bias fits int32
        depends on the input's step): give the candidates' largest, which widen the least."""
        self.calibrated = build_calibrated_model(optimized, plan, built, weight_th, {})
        self.built = built
        # Every node on: no switch to evaluate. Scores with tensors left float (sensitivity, weights
        # alone) run on a second session with an enable flag per node, built when first needed.
        self.session = make_session(lower_model(self.calibrated, feed_calibration=True, switches=False))
        self._switchable: ort.InferenceSession | None = None
        self.plan = plan
        self.feeds = feeds
        self.refs = refs
        self.outputs = [o.name for o in optimized.graph.output]

    def _extra(self, thresholds: dict[str, float], bits: dict[str, int] | None = None,
               disabled: set[str] = frozenset()) -> dict[str, np.ndarray]:
        extra: dict[str, np.ndarray] = {}
        for p in self.plan.activations:
            b = (bits or {}).get(p.tensor, p.bits)
            extra.update(p.fed(thresholds[p.tensor], b))
            if disabled:
                extra[enable_input(p.node_name)] = np.array(p.tensor not in disabled)
        return extra

    def _session_for(self, disabled: set[str]):
        if not disabled:
            return self.session
        if self._switchable is None:
            self._switchable = make_session(lower_model(self.calibrated, feed_calibration=True))
        return self._switchable

    def score(self, thresholds: dict[str, float], bits: dict[str, int] | None = None,
              disabled: set[str] = frozenset(), at_least: float | None = None) -> float:
        """Output cosine over all evaluation samples at once, averaged over model outputs.

        One cosine over the concatenated samples, not a mean of per-sample cosines: a
        sample whose float output is ~0 (a detector on a picture without text) has a
        meaningless per-sample cosine that would otherwise swamp the score.

        With ``at_least``, the samples stop as soon as the score cannot reach it even if the
        rest matched the float model exactly; the value returned is then that bound (below
        ``at_least``), so a comparison with ``at_least`` decides as the full score would.
        """
        extra = self._extra(thresholds, bits, disabled)
        session = self._session_for(disabled)
        runs = []
        for feed in self.feeds:
            runs.append(session.run(self.outputs, {**feed, **extra}))
            if at_least is not None and len(runs) < len(self.feeds):
                bound = self._reachable(runs)
                if bound < at_least:
                    return bound
        sims = []
        for k in range(len(self.outputs)):
            ref = np.concatenate([r[k].reshape(-1) for r in self.refs])
            got = np.concatenate([o[k].reshape(-1) for o in runs])
            sims.append(cosine_similarity(ref, got))
        return float(np.mean(sims))

    def _reachable(self, runs: list[list[np.ndarray]]) -> float:
        """The highest score the samples of ``runs`` and any outputs for the others could give."""
        return float(np.mean([reachable_cosine([r[k] for r in self.refs], [r[k] for r in runs])
                              for k in range(len(self.outputs))]))

    def refine(self, thresholds: dict[str, float], candidates: dict[str, dict[str, float]],
               best: float) -> tuple[dict[str, float], dict[str, str]]:
        """mix: per tensor, keep whichever method's threshold scores best (greedy, in graph order)."""
        current = copy.copy(thresholds)
        methods = {t: "default" for t in current}
        for p in tqdm(self.plan.activations, desc="mix search", disable=not sys.stderr.isatty(), leave=False):
            for label, cand in candidates.items():
                if np.isclose(cand[p.tensor], current[p.tensor]):
                    continue
                trial = {**current, p.tensor: cand[p.tensor]}
                s = self.score(trial, at_least=best + 1e-6)
                if s > best + 1e-6:
                    best, current, methods[p.tensor] = s, trial, label
        log.info("mix calibration: output cosine %.6f", best)
        return current, methods

    def promote_to_int16(self, thresholds: dict[str, float], max_thresholds: dict[str, float], score: float,
                         noise: dict[str, float], *,
                         target: float = PROMOTE_TARGET) -> tuple[dict[str, int], dict[str, float]]:
        """Mixed precision: int16 only where the int8 grid costs the output.

        Start from every tensor at int16, then move tensors back to int8, least sensitive
        first, as long as the output cosine keeps ``KEEP_GAIN`` of what int16 gains over
        int8 (or stays above ``target``). Returns the int16 tensors (tensor -> 16) and the
        thresholds with theirs widened to the max (a 16-bit grid needs no clipping).
        """
        if score >= target:
            return {}, dict(thresholds)
        ranked = self._rank_by_sensitivity(thresholds, noise)
        if not ranked:
            return {}, dict(thresholds)
        all16 = {t: 16 for t in ranked}
        wide = {t: max_thresholds[t] for t in ranked}  # a 16-bit grid needs no clipping
        best16 = self.score({**thresholds, **wide}, all16)
        if best16 <= score:
            return {}, dict(thresholds)
        goal = min(target, score + KEEP_GAIN * (best16 - score))
        current = dict(all16)
        step = max(1, len(ranked) // DEMOTE_STEPS)
        least_first = ranked[::-1]
        for start in tqdm(range(0, len(least_first), step), desc="mixed precision",
                          disable=not sys.stderr.isatty(), leave=False):
            trial = {t: b for t, b in current.items() if t not in least_first[start:start + step]}
            th = {**thresholds, **{t: wide[t] for t in trial}}
            if self.score(th, trial, at_least=goal) >= goal:
                current = trial
        chosen = {**thresholds, **{t: wide[t] for t in current}}
        log.info("mixed precision: %d of %d tensors calibrated as int16, output cosine %.6f (int8 %.6f, all int16 "
                 "%.6f)", len(current), len(self.plan.activations), self.score(chosen, current), score, best16)
        return current, chosen

    def _rank_by_sensitivity(self, thresholds: dict[str, float], noise: dict[str, float]) -> list[str]:
        """int8 tensors ordered by the output cosine their quantization costs (measured).

        Each tensor's cost is the score gained by leaving it unquantized, on the first
        ``SENSITIVITY_SAMPLES`` samples; ties and unmeasured tensors fall back to the
        histogram's relative noise.
        """
        candidates = sorted((t for t in noise if self.plan.activation(t).bits == 8), key=noise.get, reverse=True)
        measured = candidates[:SENSITIVITY_MAX_TENSORS]
        feeds, self.feeds = self.feeds, self.feeds[:SENSITIVITY_SAMPLES]
        refs, self.refs = self.refs, self.refs[:SENSITIVITY_SAMPLES]
        try:
            base = self.score(thresholds)
            gain = {t: self.score(thresholds, disabled={t}) - base
                    for t in tqdm(measured, desc="sensitivity", disable=not sys.stderr.isatty(), leave=False)}
        finally:
            self.feeds, self.refs = feeds, refs
        return sorted(candidates, key=lambda t: (gain.get(t, -1.0), noise[t]), reverse=True)
