"""Calibrate stage: stream calibration data, pick thresholds, insert HzCalibration nodes.

One onnxruntime session over the optimized model yields every planned tensor per
sample; statistics are streamed (memory independent of the sample count). Method
search evaluates candidate thresholds on one session whose calibration scales are
graph inputs, so trying a threshold never rebuilds a session.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np
from onnx import ModelProto

from hbtools.errors import HbError
from hbtools.graph.constant_terms import Tails
from hbtools.graph.graph import GraphView
from hbtools.quant import weight_rounding
from hbtools.quant.bias_correction import CORRECTABLE, correct_biases, record_float_biases
from hbtools.quant.fragile import float_advice
from hbtools.quant.plan import (
    ActivationPoint,
    CalibrationPlan,
    build_calibrated_model,
    folded_weights,
    weight_thresholds,
)
from hbtools.quant.search import (
    ALL_INT16_FLOOR,
    PROMOTE_TARGET,
    Evaluator,
    constant_terms,
    output_pieces,
    scored_outputs,
    scored_tensors,
)
from hbtools.quant.statistics import StatsCollector, update_together
from hbtools.quant.thresholds import relative_noise, threshold_for
from hbtools.runs.progress import progress
from hbtools.runs.timing import StepTimes
from hbtools.runtime.heap import release_freed_memory
from hbtools.runtime.segments import Segments
from hbtools.runtime.session import RUN_ERRORS

log = logging.getLogger("hbtools")

EVAL_SAMPLES = 16  # samples kept in memory to score candidate thresholds
BIAS_CORRECTION_SAMPLES = 16  # samples (after the evaluation ones) measuring the mean shift
ROUNDING_SAMPLES = 8  # of those, the samples whose conv inputs drive the GPTQ weight rounding
DEFAULT_CANDIDATES = (("max", None), ("percentile", 0.99995), ("percentile", 0.9999), ("kl", None))
FOLDS = 2  # the scoring samples' folds for the methods' cross-validated scores (``_cross_validated``)
ZERO_POINT_GAIN = 1e-6  # below the scores' printed digits: no gain to change every grid for
CROSS_MARGIN = 0.05  # share of the best cross-validated loss within which methods count as equal

Samples = Callable[[], Iterable[dict[str, np.ndarray]]]


@dataclass
class CalibrationResult:
    model: ModelProto
    plan: CalibrationPlan
    thresholds: dict[str, float]
    method: str
    scores: dict[str, float] = field(default_factory=dict)
    summary: str = ""  # method, GPTQ kept or not, int16 tensor count


def run(optimized: ModelProto, plan: CalibrationPlan, samples: Samples, count: int, *,
        calibration_type: str, max_percentile: float | None = None,
        loaded_thresholds: dict[str, float] | None = None, loaded_int16: set[str] | None = None,
        allow_int16: bool = False, march_int16: bool | None = None,
        bias_correction: str = "auto", weights_only: float | None = None,
        times: StepTimes | None = None, generated: bool = False) -> CalibrationResult:
    """Calibrate.

    ``allow_int16`` lets default/mix give int16 to the most sensitive tensors; ``march_int16``: the march
    has int16 (default: ``allow_int16``; True without it: ``set_all_nodes_int8`` turned the search off);
    ``bias_correction`` is "on", "off" or "auto" (kept only if the output improves);
    ``weights_only``: the output cosine int8 weights alone give (float activations), if measured;
    ``times`` gets the seconds of each step; ``generated``: the samples are random data, not the user's.
    """
    times = times or StepTimes()
    march_int16 = allow_int16 if march_int16 is None else march_int16
    uncorrected = optimized  # bias correction replaces ``optimized``; the debugger reads the biases before
    # Samples are kept only for what scores candidates; skip/max/load with bias correction off
    # keep none, so memory stays at one sample's activations.
    methods_tried = _methods(calibration_type, max_percentile)
    keep = len(methods_tried) > 1 or calibration_type == "mix" or bias_correction != "off"
    with times.step("statistics"):
        collector, eval_feeds, eval_refs, bc_feeds, without = _collect(
            optimized, plan, samples, count, keep=keep, folds=FOLDS if len(methods_tried) > 1 else 0,
            generated=generated)
        plan = plan.observed(collector)  # asymmetric grids are fitted to the observed ranges
        weight_th = weight_thresholds(optimized, plan)
        candidates = {_label(m, p): _thresholds(plan, collector, m, p) for m, p in methods_tried}
        fold_candidates = [{_label(m, p): _thresholds(plan, other, m, p) for m, p in methods_tried}
                           for other in without]
    if calibration_type == "load":
        base = candidates["max"]
        missing = [t for t in base if t not in (loaded_thresholds or {})]
        if missing:
            log.warning("calibration_type load: %d of %d tensors have no QuantizeLinear in the model; they use the "
                        "max over the calibration samples%s (e.g. %s)", len(missing), len(base),
                        " (random ones: give cal_data_dir for real ones)" if generated else "",
                        ", ".join(missing[:3]))
        candidates = {"load": {t: (loaded_thresholds or {}).get(t, v) for t, v in base.items()}}
        sixteen = {t: 16 for t in (loaded_int16 or set()) if t in base}
        if sixteen and march_int16:  # configured by the QAT model, as node_info would
            plan = plan.with_bits(sixteen)
        elif sixteen:
            log.warning("calibration_type load: %d QuantizeLinear -> DequantizeLinear pair(s) quantize to int16, "
                        "which this BPU does not have: int8 with the same range", len(sixteen))
    scores: dict[str, float] = {}
    if len(candidates) > 1 or calibration_type == "mix":
        with times.step("method search"):
            widest = {t: max(c[t] for c in candidates.values()) for t in next(iter(candidates.values()))}
            evaluator = Evaluator(optimized, plan, weight_th, eval_feeds, eval_refs, widest)
            for out in evaluator.known.offsets:
                log.info("output '%s' is scored without its mean on each sample: the mean is most of its values, and "
                         "the cosine of the whole would hide the errors in what varies", out)
            scores = _method_scores(evaluator, candidates, None, "")
            # With int16, the search gives 16 bits where a symmetric int8 grid costs the output; where int8 already
            # meets its goal it gives none, and the model is an int8 one, as on a march without int16.
            if not allow_int16 or max(scores.values()) >= PROMOTE_TARGET:
                plan, evaluator, scores = _zero_points(optimized, plan, weight_th, candidates, evaluator, scores,
                                                       fold_candidates, without)
        with times.step("GPTQ"):
            plan, evaluator, scores = _weight_rounding(optimized, plan, weight_th, bc_feeds or eval_feeds,
                                                       candidates, evaluator, scores, allow_int16)
            release_freed_memory()  # the Hessians and the evaluator not kept
        if bias_correction != "off":
            # Before the threshold and int16 searches, so that they score the model the user will run.
            with times.step("bias correction"):
                optimized, evaluator, scores = _bias_correction(optimized, plan, weight_th, candidates, evaluator,
                                                                scores, bc_feeds or eval_feeds, allow_int16,
                                                                forced=bias_correction == "on")
                release_freed_memory()  # the correction's runs and the evaluator not kept
        method = max(scores, key=scores.get)
        if fold_candidates:
            with times.step("method search"):
                fold_plans = [plan.observed(other) for other in without] if any(
                    p.asymmetric for p in plan.activations) else None  # asymmetric grids end where the folds do
                method = _cross_validated(evaluator, scores, fold_candidates, fold_plans)
        del without
        thresholds = dict(candidates[method])
        methods = {t: method for t in thresholds}
        best = scores[method]
        if calibration_type == "mix":
            with times.step("method search"):
                thresholds, methods = evaluator.refine(thresholds, candidates, best)
                best = evaluator.score(thresholds)
        def advice(weights: bool) -> str:  # only when a WARNING names them
            return float_advice(optimized, {p.tensor for p in plan.activations}, weights)

        if not allow_int16 and best < ALL_INT16_FLOOR:  # (with int16, the int16 search says what it finds)
            log.warning("with every activation on an int8 grid (%s) the output cosine on the "
                        "calibration samples is only %.4f; hmct-debugger's node sensitivity names the nodes that "
                        "lose most, and run_on_cpu keeps them in float.%s",
                        "optimization set_all_nodes_int8: without it, default gives int16 to the tensors that need "
                        "it" if march_int16 else "this BPU has no int16", best, advice(False))
        if allow_int16:
            noise = {p.tensor: relative_noise(collector.stats[p.tensor], thresholds[p.tensor], p.bits)
                     for p in plan.activations}
            with times.step("int16 search"):
                int16, thresholds = evaluator.promote_to_int16(thresholds, candidates["max"], best, noise,
                                                               weights_only=weights_only, advice=advice)
            plan = plan.with_bits(int16)
            methods.update({t: "max" for t in int16})
    else:
        method = next(iter(candidates))
        thresholds = candidates[method]
        methods = {t: method for t in thresholds}
    if method != "load":  # int16 tensors take the max with every method (``threshold_for``)
        methods.update({p.tensor: "max" for p in plan.activations if p.bits == 16})
    log.info("Select %s method", method)  # the seed's line, as it is
    if bias_correction == "on" and not scores:  # no search: corrected unconditionally, as asked
        with times.step("bias correction"):
            corrected = _corrected_biases(optimized, plan, thresholds, weight_th, methods, bc_feeds or eval_feeds)
        if corrected is not None:
            log.info("bias correction applied")
            optimized = corrected
    summary = _summary(method, plan, "" if optimized is uncorrected else "on" if not scores else "kept")
    log.info("calibration summary: %s", summary)
    model = build_calibrated_model(optimized, plan, thresholds, weight_th, methods)
    if optimized is not uncorrected:
        record_float_biases(model, uncorrected)
    return CalibrationResult(model, plan, thresholds, method, scores, summary)


def _summary(method: str, plan: CalibrationPlan, corrected: str) -> str:
    """The method and what else the search chose: GPTQ rounding kept or not, int16 tensors, zero points, corrected
    biases (hb_model_info too)."""
    int16 = sum(p.bits == 16 for p in plan.activations)
    gptq = f"GPTQ weight rounding kept on {len(plan.rounding)} weights" if plan.rounding else \
        "weights rounded to nearest (no GPTQ)"
    zero_points = sum(p.asymmetric and p.bits == 8 for p in plan.activations)
    asymmetric = f"; zero points on {zero_points} int8 tensors" if zero_points else ""
    # "kept": the search compared the corrected biases and kept them; "on": corrected as the config asks
    biases = {"kept": "; biases corrected (bias correction kept)", "on": "; biases corrected"}.get(corrected, "")
    return (f"method {method}; {gptq}; {int16} of {len(plan.activations)} activation tensors int16{asymmetric}"
            f"{biases}")


def _weight_rounding(optimized: ModelProto, plan: CalibrationPlan, weight_th: dict[str, np.ndarray],
                     feeds: list[dict], candidates: dict[str, dict[str, float]], nearest: Evaluator,
                     nearest_scores: dict[str, float],
                     int16_follows: bool) -> tuple[CalibrationPlan, Evaluator, dict[str, float]]:
    """GPTQ rounding of the conv, MatMul and Gemm weights, kept when the output gets closer to float
    (``_if_closer``).

    Returns the plan with the rounding (or ``plan`` itself), its evaluator and method scores.
    """
    view = GraphView(optimized)
    nodes = {n.name: n for n in optimized.graph.node}
    readers = {p.tensor: nodes[p.rewire[0][0]] for p in plan.weights
               if len(p.rewire) == 1 and weight_rounding.roundable(nodes[p.rewire[0][0]], view)}
    if not readers:
        return plan, nearest, nearest_scores
    weight_of = {n.name: w for w, n in readers.items()}
    _set_aside(nearest, int16_follows)
    offsets = {}
    for layer, hessian in weight_rounding.input_hessians(optimized, list(readers.values()), feeds[:ROUNDING_SAMPLES]):
        w = weight_of[layer]
        offsets[w] = weight_rounding.weight_offsets(readers[w], view, weight_th[w], hessian)
    release_freed_memory()  # the Hessians' sessions, patches and factors, before another evaluator is built
    if not offsets:
        nearest.reopen()
        return plan, nearest, nearest_scores
    if len(offsets) < len(readers):
        log.info("weight rounding (GPTQ): %d of %d weights keep nearest rounding (too few positions for their "
                 "Hessian)", len(readers) - len(offsets), len(readers))
    rounded_plan = plan.with_rounding(offsets)
    kept = _if_closer(f"weight rounding (GPTQ) of {len(offsets)} weights", nearest,
                      lambda: Evaluator(optimized, rounded_plan, weight_th, nearest.feeds, nearest.refs,
                                        nearest.built),
                      candidates, "rounded weights", nearest_scores, int16_follows)
    if kept is None:
        return plan, nearest, nearest_scores
    return rounded_plan, *kept


def _zero_points(optimized: ModelProto, plan: CalibrationPlan, weight_th: dict[str, np.ndarray],
                 candidates: dict[str, dict[str, float]], evaluator: Evaluator, scores: dict[str, float],
                 fold_candidates: list[dict[str, dict[str, float]]],
                 folds: list[StatsCollector]) -> tuple[CalibrationPlan, Evaluator, dict[str, float]]:
    """The plan with asymmetric int8 grids (zero points) where every integer reader takes one, kept if the
    output gets closer to float on samples the grids were not fitted to; for a model that keeps every
    activation int8 (a march without int16, or int8 already at the int16 search's goal).

    A symmetric grid spends half its levels on values a non-negative tensor (after a Relu, HardSwish or
    Sigmoid) never takes: PP-OCRv5's text-direction classifier on RDK X3 scored 0.9711 held out with
    symmetric grids and 0.9938 with zero points (onnxruntime's asymmetric int8: 0.9927). An asymmetric
    grid ends at the lowest value observed, though, where a symmetric one leaves room below: judged on
    the calibration samples alone, PP-OCRv6 small rec kept zero points for a gain of 0.0005 and lost
    0.0065 held out. With int16 to follow, the int16 search gives such tensors 16 bits instead, and zero
    points scored no better there, so they are tried only here.
    """
    variant = plan.with_zero_points()
    if variant is None:
        return plan, evaluator, scores
    count = sum(p.asymmetric and p.bits == 8 for p in variant.activations)
    best = max(scores, key=scores.get)

    def crossed(ev: Evaluator, method: str, plans: list[CalibrationPlan] | None) -> float:
        if not fold_candidates:
            return ev.score(candidates[method])
        return ev.cross_score([c[method] for c in fold_candidates], plans)

    before = crossed(evaluator, best, None)
    evaluator.close()  # one session at a time (``_if_closer``)
    release_freed_memory()
    trial = Evaluator(optimized, variant, weight_th, evaluator.feeds, evaluator.refs, evaluator.built)
    trial_scores = _method_scores(trial, candidates, best, " with zero points")
    trial_best = max(trial_scores, key=trial_scores.get)
    after = crossed(trial, trial_best, [variant.observed(other) for other in folds])
    keep = after > before + zero_point_margin(scores[best])
    log.info("zero points on %d of %d tensors: output cosine %.6f -> %.6f with the best method%s (%s)", count,
             len(plan.activations), before, after,
             " on samples its grids were not fitted to" if fold_candidates else "", "kept" if keep else "not kept")
    if keep:
        return variant, trial, trial_scores
    del trial
    release_freed_memory()
    evaluator.reopen()
    return plan, evaluator, scores


def zero_point_margin(in_sample: float) -> float:
    """What zero points must gain, on samples their grids were not fitted to, to be kept: ``CROSS_MARGIN`` of
    the loss the symmetric grids leave on all samples (``in_sample``, their best method's score). An asymmetric
    grid ends at the lowest value the calibration samples reached, and a picture below it is clipped: a
    normalised map on RDK X3 kept zero points for 0.000005 there and lost 0.9996 -> 0.9616 on such a picture
    (hunt 31 D3). Of the loss on unseen samples it would be too much: with two folds each fold's grids clip
    the other half, and a small U-Net's 0.97899 -> 0.97968 (its in-sample loss halved) was dropped, losing
    0.0015 held out (hunt 34 D1)."""
    return max(ZERO_POINT_GAIN, CROSS_MARGIN * (1 - in_sample))


def _set_aside(evaluator: Evaluator, int16_follows: bool) -> None:
    """Let go of ``evaluator``'s session while a step runs sessions of its own (the Hessians', the bias
    correction's) and builds a candidate: with both, a VGG-16-style classifier held its fully connected
    weights four more times. What ``_if_closer`` compares the candidate with is scored first."""
    if int16_follows:
        evaluator.weights_alone()
    evaluator.close()
    release_freed_memory()


def _if_closer(step: str, current: Evaluator, make_candidate: Callable[[], Evaluator],
               candidates: dict[str, dict[str, float]], change: str, scores: dict[str, float],
               int16_follows: bool, forced: bool = False) -> tuple[Evaluator, dict[str, float]] | None:
    """The candidate's evaluator (``make_candidate``) and the methods' scores on it if it brings the
    output closer to float than ``current`` (whose method ``scores`` are given), or ``forced``; else None.

    ``int16_follows`` (the int16 search comes next): judged by the weights alone, every activation on
    an int16 grid (``Evaluator.weights_alone``); with int8 activations their error can hide the weights'
    gain, which shows once mixed precision gives the sensitive tensors int16. Otherwise the activations
    stay int8 in the model the user runs, and that is what judges: the best method's score.
    """
    best = max(scores, key=scores.get)
    before = current.weights_alone() if int16_follows else None
    # Only the scores are compared: the current session goes while the candidate's is built (VGG-19: two at
    # once held 9 GB), and comes back if the candidate is not kept.
    current.close()
    release_freed_memory()
    candidate = make_candidate()
    if int16_follows:
        after = candidate.weights_alone()
        keep = forced or after > before
        log.info("%s: weights-only (int16 activations) output cosine %.6f -> %.6f (%s)", step, before, after,
                 "kept" if keep else "not kept")
        if keep:
            return candidate, _method_scores(candidate, candidates, best, f" with {change}")
    else:
        new_scores = _method_scores(candidate, candidates, best, f" with {change}")
        keep = forced or max(new_scores.values()) > scores[best]
        log.info("%s: output cosine %.6f -> %.6f with the best method (%s)", step, scores[best],
                 max(new_scores.values()), "kept" if keep else "not kept")
        if keep:
            return candidate, new_scores
    del candidate
    release_freed_memory()
    current.reopen()
    return None


def _method_scores(evaluator: Evaluator, candidates: dict[str, dict[str, float]], first: str | None,
                   change: str) -> dict[str, float]:
    """``Evaluator.method_scores``, logged; a method that stopped early shows the bound it could not beat."""
    scores, bounds = evaluator.method_scores(candidates, first)
    best = max(scores.values())
    for label, score in scores.items():
        if label in bounds:
            log.info("calibration method %s%s: output cosine below %.6f (at most %.6f)", label, change, best, score)
        else:
            log.info("calibration method %s%s: output cosine %.6f", label, change, score)
    return scores


def _corrected_biases(optimized: ModelProto, plan: CalibrationPlan, thresholds: dict[str, float],
                      weight_th: dict[str, np.ndarray], methods: dict[str, str],
                      feeds: list[dict]) -> ModelProto | None:
    """``optimized`` with conv biases absorbing their weights' rounding shift (None: no conv to correct)."""
    names = {name for p in plan.weights for name, _ in p.rewire}
    convs = [n for n in optimized.graph.node if n.name in names and n.op_type in CORRECTABLE]
    if not convs:
        return None
    axes = {p.tensor: p.axis for p in plan.weights}
    calibrated = build_calibrated_model(optimized, plan, thresholds, weight_th, methods)
    return correct_biases(optimized, convs, weight_th, axes, feeds, quantized=folded_weights(calibrated))


def _bias_correction(optimized: ModelProto, plan: CalibrationPlan, weight_th: dict[str, np.ndarray],
                     candidates: dict[str, dict[str, float]], evaluator: Evaluator, scores: dict[str, float],
                     feeds: list[dict], int16_follows: bool, *,
                     forced: bool) -> tuple[ModelProto, Evaluator, dict[str, float]]:
    """Bias correction, kept (unless ``forced``) when the output gets closer to float (``_if_closer``).

    The correction depends on the weights and the float model only, so it is made once, before the
    searches. Returns the model the searches go on from, its evaluator and the method scores.
    """
    best = max(scores, key=scores.get)
    th = candidates[best]
    _set_aside(evaluator, int16_follows)
    corrected = _corrected_biases(optimized, plan, th, weight_th, {t: best for t in th}, feeds)
    if corrected is None:
        evaluator.reopen()
        return optimized, evaluator, scores
    release_freed_memory()  # the correction's sessions and runs, before the candidate's evaluator is built
    kept = _if_closer("bias correction", evaluator,
                      lambda: Evaluator(corrected, plan, weight_th, evaluator.feeds, evaluator.refs, evaluator.built),
                      candidates, "corrected biases", scores, int16_follows, forced)
    if kept is None:
        return optimized, evaluator, scores
    return corrected, *kept


def _cross_validated(evaluator: Evaluator, scores: dict[str, float],
                     fold_candidates: list[dict[str, dict[str, float]]],
                     fold_plans: list[CalibrationPlan] | None = None) -> str:
    """The method whose thresholds score best on samples they were not fitted to.

    Each scoring sample is run with each method's thresholds from the statistics of every sample but
    its fold's. Scored on the samples they were fitted to, the clipping methods look better than they
    are: a clip at the 99.995th percentile of 16 pictures cut what other pictures reach further (a
    YOLOv8n at 640x640: its class scores came out 0.02 low around 0.25 on 120 held-out pictures, and
    the detections at 0.25 agreed at IoU 0.861, against 0.911 at the max). The methods within
    ``CROSS_MARGIN`` of the best so scored are close enough: of them the best on all samples wins, unless
    one that clips less (wider thresholds) scores at least as well on samples its thresholds were not fitted
    to, since a clip no sample can tell from the others' is one that pictures beyond the calibration set run
    into: a YOLO-tiny on RDK X3 kept the 99.995th percentile by 0.0002 on its calibration pictures (the max
    was best cross-validated) and lost 0.02-0.03 on saturated held-out pictures where the max lost nothing
    (hunt 30 D4). Wider alone is not enough: an SE classifier on RDK X3 kept the max over a percentile that
    scored better both ways, and lost a little held out (hunt 34 D2).
    """
    crossed = {label: evaluator.cross_score([fold[label] for fold in fold_candidates], fold_plans) for label in scores}
    finite = [v for v in crossed.values() if np.isfinite(v)]
    best = max(finite, default=-np.inf)
    close = [label for label in scores if crossed[label] >= best - CROSS_MARGIN * (1 - best)]  # NaN never is
    # of the close ones the in-sample best, unless one clipping less generalises at least as well (no finite
    # score at all: the in-sample best)
    method = max(close or list(scores), key=scores.get)
    wider = [label for label in close if crossed[label] >= crossed[method]
             and _width(fold_candidates, label) > _width(fold_candidates, method)]
    method = max(wider, key=lambda label: (_width(fold_candidates, label), scores[label])) if wider else method
    for label in scores:
        log.info("calibration method %s: output cosine %.6f on samples its thresholds were not fitted to", label,
                 crossed[label])
    if method != max(scores, key=scores.get):
        log.info("calibration method %s kept: it scores %.6f on all samples against %.6f for %s, but generalises "
                 "%s", method, scores[method], max(scores.values()), max(scores, key=scores.get),
                 "as well or better with wider thresholds overall" if wider else "better")
    return method


def _width(fold_candidates: list[dict[str, dict[str, float]]], label: str) -> float:
    """How wide a method's thresholds are: the mean log threshold over the folds' tensors (rounded, so that
    methods giving the same thresholds tie and the in-sample score decides)."""
    logs = [np.log(max(t, 1e-30)) for fold in fold_candidates for t in fold[label].values()]
    return round(float(np.mean(logs)), 9) if logs else 0.0


def _methods(calibration_type: str, max_percentile: float | None) -> list[tuple[str, float | None]]:
    if calibration_type in ("default", "mix"):
        return list(DEFAULT_CANDIDATES)
    if calibration_type == "kl":
        return [("kl", None)]
    if calibration_type == "max" and max_percentile is not None and max_percentile < 1.0:
        return [("percentile", max_percentile)]
    return [("max", None)]  # max, skip (random data) and load (fallback for unlabelled tensors)


def _label(method: str, percentile: float | None) -> str:
    return f"max-percentile {percentile}" if method == "percentile" else method


def _thresholds(plan: CalibrationPlan, collector: StatsCollector, method: str,
                percentile: float | None) -> dict[str, float]:
    def of(p: ActivationPoint) -> float:
        stats = collector.stats[p.tensor]
        threshold = plan.logit_threshold(p.tensor, threshold_for(method, stats, p.bits, percentile), stats)
        threshold = plan.probability_threshold(p.tensor, threshold, stats)
        return plan.int16_threshold(p.tensor, threshold) if p.bits == 16 else threshold

    return {p.tensor: of(p) for p in plan.activations}


def _float_runs(optimized: ModelProto, tensors: list[str]) -> tuple[Segments, list[str]]:
    """Runs of the float model giving ``tensors`` and what the searches score (``search.scored_tensors``),
    in parts of at most ``segments.SEGMENT_BYTES`` of them."""
    scored = scored_tensors(optimized)
    stand_ins = scored_outputs(optimized)
    outputs = [o.name for o in optimized.graph.output]
    if stand_ins != outputs:
        log.info("outputs picked at places the data decides (TopK, NonMaxSuppression, ArgMax, gathers at their "
                 "indices) are scored on the tensors they pick from: %s",
                 ", ".join(t for t in stand_ins if t not in outputs))
    tails = Tails(optimized)
    for out, joined, constant in zip(stand_ins, output_pieces(optimized), constant_terms(optimized), strict=True):
        if joined is not None:
            log.info("output '%s' is scored as the %d pieces it joins (%s)", out, len(joined.names),
                     ", ".join(joined.names))
        if constant is not None:
            log.info("output '%s' is scored without what it holds whatever the input (%d of its %d values are "
                     "constants added at its end, e.g. an anchor grid)", out, np.count_nonzero(constant), constant.size)
        if tails.reads_input(out):
            log.info("output '%s' is scored without what the model input adds to it (a skip from the input, as in "
                     "out = input + f(input)): the scores compare what the model computes", out)
    return Segments(optimized, list(dict.fromkeys([*tensors, *scored]))), scored


def _non_finite_outputs(found: list[tuple[int, str]], count: int, none_left: bool, generated: bool) -> None:
    """Say that the float model gives NaN or inf on some calibration samples: a WARNING while others remain to
    score the candidates with (the broken ones are left out of the scores), an ERROR when none does. On
    ``generated`` samples (the checker's, skip's) only a note: random pixels, without the mean and scale the
    checker does not know, overflow a healthy model's Exp."""
    index, output = found[0]
    if generated:
        log.info("the float model gives NaN or inf in output '%s' on %d of the %d generated samples (random values, "
                 "not calibration data); real inputs may stay finite: makertbin checks its calibration data",
                 output, len(found), count)
        return
    what = (f"the float model gives NaN or inf in output '{output}' on {len(found)} of the {count} calibration "
            f"samples (the first: sample {index + 1})")
    why = ("typically a division by zero or the log of 0 inside the model, e.g. an epsilon an exporter dropped; "
           "run the float model on those samples in onnxruntime to see where it starts")
    if none_left:
        raise HbError(f"{what}, every one the calibration would be scored on", hint=why)
    log.warning("%s; those samples are left out of the scores that choose the calibration. %s", what, why)


def _note_unvaried(first: dict[str, np.ndarray], feed: dict[str, np.ndarray], index: int) -> None:
    """Keep in ``first`` the inputs whose every sample so far equals the first one."""
    for name, value in feed.items():
        kind = np.asarray(value).dtype
        if index == 0 and (kind.kind == "f" or kind.itemsize == 1):  # data, not an int64 size or rate to compute with
            first[name] = np.array(value, copy=True)
        elif name in first and not np.array_equal(first[name], value):
            del first[name]


def _warn_unvaried(first: dict[str, np.ndarray], count: int) -> None:
    """One WARNING per input that has the same values in every calibration sample: its grid (and those of
    what it feeds alone) fits those values only, and other values are clipped on the board. PaddleDetection
    exports take a scale_factor input that calibration sets often fill with [1, 1]: boxes of pictures scaled
    otherwise came out 27 px off; a prompt input left at zeros gave a zero range, and the input was wiped."""
    for name, value in first.items():
        shown = ", ".join(f"{float(v):g}" for v in value.ravel()[:4])
        more = "" if value.size <= 4 else f", ... ({value.size} values)"
        log.warning("input '%s' has the same values in all %d calibration samples (%s%s): its grid fits those "
                    "values only, and any other value it takes in use is clipped on the board; if it varies in "
                    "use, give calibration files with the values the model will see (for a scale factor, those "
                    "of real pictures)", name, count, shown, more)


def spread(count: int, n: int, exclude: set[int] = frozenset()) -> set[int]:
    """``n`` sample indices spread evenly over ``count`` (outside ``exclude``).

    Sample folders are often sorted by kind or source; the first ``n`` would score every
    candidate on one kind and the search would fit it at the others' expense.
    """
    free = [i for i in range(count) if i not in exclude]
    if len(free) <= n:
        return set(free)
    return {free[(2 * k + 1) * len(free) // (2 * n)] for k in range(n)}


def _collect(optimized: ModelProto, plan: CalibrationPlan, samples: Samples, count: int, *, keep: bool = True,
             folds: int = 0, generated: bool = False):
    """Statistics over every sample, the samples kept for scoring, and with ``folds`` one more collector per
    fold of the scoring samples, over every sample but that fold's (``_cross_validated``)."""
    collector = plan.collector()
    without = [plan.collector() for _ in range(folds if keep else 0)]
    tensors = list(dict.fromkeys([*(p.tensor for p in plan.activations), *collector.extra_tensors]))
    runs, outputs = _float_runs(optimized, tensors)
    extra = set(collector.extra_tensors)
    eval_feeds, eval_refs, bc_feeds = [], [], []
    non_finite: list[tuple[int, str]] = []  # (sample, output) where the float model gives NaN or inf
    bar = progress(samples(), "calibration", "sample", total=count)
    first: dict[str, np.ndarray] = {}  # each input's first sample, while no later one differs from it
    scored = spread(count, EVAL_SAMPLES) if keep else set()
    measured = spread(count, BIAS_CORRECTION_SAMPLES, exclude=scored) if keep else set()
    for index, feed in enumerate(bar):
        _note_unvaried(first, feed, index)
        refs: dict[str, np.ndarray] = {}
        masks: dict[str, np.ndarray] = {}
        try:
            for k, values in enumerate(runs.run(feed)):  # one part at a time (runtime.segments)
                masks.update({t: v for t, v in values.items() if t in extra})
                # a scoring sample's fold (its place among them, appended below) leaves it out
                update_together([collector, *(other for f, other in enumerate(without)
                                              if not (index in scored and len(eval_feeds) % len(without) == f))],
                                values, masks=masks, new_sample=k == 0)
                refs.update({o: values[o] for o in outputs if o in values})
                del values
        except RUN_ERRORS as exc:
            reason = str(exc).splitlines()[0][:300]
            if generated:  # the checker (or calibration_type skip) made the values up
                raise HbError(f"the float model cannot run on the random values given to its inputs ({reason})",
                              hint="an input holding shapes, sizes or indices takes values random data does not "
                                   "match, so neither hb_mapper checker nor calibration_type skip can run this "
                                   "model; makertbin with calibration data (cal_data_dir) converts it") from None
            raise HbError(f"the float model cannot run calibration sample {index + 1} ({reason})",
                          hint="give every input calibration data the model accepts: its values, not only its "
                               "shape, matter for shape, size and index inputs") from None
        broken = [o for o in outputs if o in refs and refs[o].dtype.kind in "fc" and not np.all(np.isfinite(refs[o]))]
        if broken:
            non_finite.append((index, broken[0]))
        elif index in scored:
            eval_feeds.append(feed)
            eval_refs.append([refs[o] for o in outputs])
        elif index in measured:
            bc_feeds.append(feed)
        del refs, masks, feed  # else this sample's values live on while the next one runs
    if collector.samples == 0:
        raise HbError("no calibration samples were read; check cal_data_dir")
    if non_finite:
        _non_finite_outputs(non_finite, collector.samples, keep and not eval_feeds, generated)
    log.info("calibration statistics from %d samples over %d tensors", collector.samples, len(collector.stats))
    if collector.samples > 1 and not generated:
        # an input only float CPU nodes read (an NMS threshold, hunt 48 D7) has no grid to clip it: warned of are
        # those calibrated, or read by a node whose result is
        calibrated = {p.tensor for p in plan.activations}
        gridded = {i for n in optimized.graph.node if calibrated & set(n.output) for i in n.input}
        _warn_unvaried({k: v for k, v in first.items() if k in calibrated or k in gridded}, collector.samples)
    if any(other.samples == 0 for other in without):
        # one calibration sample: a fold fitted to no sample at all would decide (every method scored alike, and
        # zero points that helped the sample were dropped); the searches judge on the samples themselves
        without = []
    return collector, eval_feeds, eval_refs, bc_feeds, without
