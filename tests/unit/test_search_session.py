"""The search's session scores exactly the calibrated model it stands for, grids fed at run time.

A conv channel whose weights are nearly zero next to its bias gets a widened weight grid so
that the bias fits int32, and how wide depends on the input's step. The session is built
once, so the widening it holds must be the one the scored thresholds imply, at 8 and at 16 bits.
"""

from __future__ import annotations

import gc
import logging

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from hbtools.march.profiles import get_profile
from hbtools.metrics import cosine_similarity
from hbtools.pipeline import optimize
from hbtools.quant import search
from hbtools.quant.plan import CalibrationPlan, build_calibrated_model, make_plan, weight_thresholds
from hbtools.quant.search import PROMOTE_TARGET, Evaluator, final_logits, scored_tensors
from hbtools.quant.units import build_partition
from hbtools.runtime.lowering import lower_model
from hbtools.runtime.session import fetching_session, make_session
from hbtools.runtime.suffixes import Suffixes


def _planned(model: onnx.ModelProto) -> tuple[onnx.ModelProto, CalibrationPlan]:
    """``model`` optimized, and its calibration plan on bayes-e (int16 available)."""
    optimized = optimize.run(model)
    profile = get_profile("bayes-e")
    return optimized, make_plan(optimized, build_partition(optimized, profile, {}), None, profile)


def _model_with_a_dead_channel() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w1 = rng.normal(0, 0.3, (4, 3, 3, 3)).astype(np.float32)
    # Channel 0: small weights next to its bias; its grid is widened only for a fine input step
    # (a 16-bit one at threshold 1, not at the real threshold). Channel 1: dead, always widened.
    w1[0] *= 0.003 / np.abs(w1[0]).max()
    w1[1] *= 1e-10
    b1 = np.array([2.0, 1.0, -0.2, 0.05], np.float32)
    w2 = rng.normal(0, 0.5, (2, 4, 1, 1)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2"], ["y"], name="conv2")]
    graph = helper.make_graph(nodes, "dead_channel",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 8, 8])],
                              [numpy_helper.from_array(v, k) for k, v in (("w1", w1), ("b1", b1), ("w2", w2))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def _dead_channel_plan(bits: int):
    """The optimized dead-channel model and its plan with every activation at ``bits``."""
    optimized, plan = _planned(_model_with_a_dead_channel())
    return optimized, plan.with_bits({p.tensor: bits for p in plan.activations})


def _float_run(optimized: onnx.ModelProto, plan, feeds: list[dict],
               outputs: tuple[str, ...] = ("y",)) -> tuple[dict[str, float], list[list]]:
    """Each activation's largest |value| over ``feeds`` and the float ``outputs`` per feed."""
    tensors = [p.tensor for p in plan.activations]
    names = list(dict.fromkeys([*tensors, *outputs]))
    floats = fetching_session(optimized, names)
    values = [dict(zip(names, floats.run(names, f), strict=True)) for f in feeds]
    return {t: float(max(np.abs(v[t]).max() for v in values)) for t in tensors}, [[v[o] for o in outputs]
                                                                                   for v in values]


def _calibrated_cosine(model: onnx.ModelProto, feeds: list[dict], refs: list[list]) -> float:
    """Output cosine of the calibrated ``model`` run directly, over all feeds at once."""
    session = make_session(lower_model(model))
    got = np.concatenate([session.run(["y"], f)[0].ravel() for f in feeds])
    return cosine_similarity(np.concatenate([r[0].ravel() for r in refs]), got)


@pytest.mark.parametrize("bits", [8, 16])
def test_search_session_scores_the_built_calibrated_model(bits: int) -> None:
    optimized, plan = _dead_channel_plan(bits)
    rng = np.random.default_rng(1)
    # A wide input range: at the real thresholds the input step is coarse, so channel 0 is not widened.
    feeds = [{"x": rng.normal(0, 100, (1, 3, 8, 8)).astype(np.float32)} for _ in range(3)]
    widest, refs = _float_run(optimized, plan, feeds)
    weight_th = weight_thresholds(optimized, plan)
    evaluator = Evaluator(optimized, plan, weight_th, feeds, refs, widest)
    model = build_calibrated_model(optimized, plan, widest, weight_th, {})
    direct = _calibrated_cosine(model, feeds, refs)
    assert evaluator.score(widest) == pytest.approx(direct, abs=1e-9)
    # The dead channel's grid really is widened (else the test would not test the widening).
    w_node = next(n for n in model.graph.node if n.op_type == "HzCalibration" and n.input[0] == "w1")
    th = next(a for a in w_node.attribute if a.name == "thresholds").floats
    w1 = numpy_helper.to_array(next(t for t in optimized.graph.initializer if t.name == "w1"))
    assert th[1] > 10 * np.abs(w1[1]).max()


def test_int16_fed_to_an_int8_session_scores_the_int16_calibrated_model() -> None:
    """The int16 search feeds 16-bit grids to a session built with 8-bit ones: its score is that of
    the calibrated model built with the 16-bit grids (levels beyond int8 must not meet int8 kernels)."""
    optimized, plan8 = _dead_channel_plan(8)
    plan16 = plan8.with_bits({p.tensor: 16 for p in plan8.activations})
    rng = np.random.default_rng(2)
    feeds = [{"x": rng.normal(0, 1, (1, 3, 8, 8)).astype(np.float32)} for _ in range(3)]
    widest, refs = _float_run(optimized, plan8, feeds)
    weight_th = weight_thresholds(optimized, plan8)
    evaluator = Evaluator(optimized, plan8, weight_th, feeds, refs, widest)
    direct = _calibrated_cosine(build_calibrated_model(optimized, plan16, widest, weight_th, {}), feeds, refs)
    assert direct > 0.9999
    assert evaluator.score(widest, {p.tensor: 16 for p in plan8.activations}) == pytest.approx(direct, abs=1e-6)


def _saturated_classifier() -> onnx.ModelProto:
    """Conv -> Relu -> global pool -> Gemm -> Softmax, logits far apart: probabilities at 0 and 1."""
    rng = np.random.default_rng(2)
    w = rng.normal(0, 0.4, (8, 3, 3, 3)).astype(np.float32)
    fc = rng.normal(0, 100.0, (4, 8)).astype(np.float32)
    w[0] *= 50.0  # one large feature sets a coarse grid for the pooled features; it barely counts
    fc[:, 0] *= 0.01
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("GlobalAveragePool", ["r"], ["g"], name="pool"),
             helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
             helper.make_node("Gemm", ["f", "fc"], ["logits"], name="fc", transB=1),
             helper.make_node("Softmax", ["logits"], ["prob"], name="softmax", axis=1)]
    graph = helper.make_graph(nodes, "classifier",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("prob", TensorProto.FLOAT, [1, 4])],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(fc, "fc")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def test_saturated_softmax_does_not_stop_the_int16_search() -> None:
    """Probabilities at 0 and 1 score an int8 classifier as perfect; the logits its Softmax reads
    do not, so mixed precision still runs and its logits score is the built calibrated model's."""
    optimized, plan = _planned(_saturated_classifier())
    assert scored_tensors(optimized) == ["prob", "logits"]
    rng = np.random.default_rng(3)
    feeds = [{"x": rng.normal(0, 1, (1, 3, 8, 8)).astype(np.float32)} for _ in range(4)]
    tensors = [p.tensor for p in plan.activations]
    names = list(dict.fromkeys([*tensors, "prob", "logits"]))
    floats = fetching_session(optimized, names)
    values = [dict(zip(names, floats.run(names, f), strict=True)) for f in feeds]
    assert min(float(v["prob"].max()) for v in values) > 0.9999  # saturated
    th = {t: float(max(np.abs(v[t]).max() for v in values)) for t in tensors}
    weight_th = weight_thresholds(optimized, plan)
    evaluator = Evaluator(optimized, plan, weight_th, feeds, [[v["prob"], v["logits"]] for v in values], th)
    model = build_calibrated_model(optimized, plan, th, weight_th, {})
    (read,) = [t for t in final_logits(model) if t]  # what the calibrated model's Softmax reads
    session = fetching_session(model, [read])
    logits = cosine_similarity(np.concatenate([v["logits"].ravel() for v in values]),
                               np.concatenate([session.run([read], f)[0].ravel() for f in feeds]))
    score = evaluator.score(th)
    assert score >= PROMOTE_TARGET > logits
    assert evaluator.score(th, logits=True) == pytest.approx(logits, abs=1e-9)
    noise = dict.fromkeys(tensors, 0.01)
    int16, _ = evaluator.promote_to_int16(th, th, score, noise)
    assert int16, "the int16 search stopped on the saturated probabilities"


def _conv_chain(depth: int = 5) -> onnx.ModelProto:
    rng = np.random.default_rng(5)
    nodes, inits, x = [], [], "x"
    for k in range(depth):
        w = rng.normal(0, 0.5, (4, 4, 3, 3)).astype(np.float32)
        w[k % 4] *= 4.0  # a different channel stands out in each layer: different sensitivities
        inits.append(numpy_helper.from_array(w, f"w{k}"))
        nodes += [helper.make_node("Conv", [x, f"w{k}"], [f"c{k}"], name=f"conv{k}", pads=[1, 1, 1, 1]),
                  helper.make_node("Relu", [f"c{k}"], [f"r{k}"], name=f"relu{k}")]
        x = f"r{k}"
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, 4, 8, 8])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def _chain_evaluator() -> tuple[Evaluator, dict[str, float], list[str]]:
    """An evaluator of ``_conv_chain`` on three samples, its max thresholds and its activation tensors."""
    optimized, plan = _planned(_conv_chain())
    rng = np.random.default_rng(6)
    feeds = [{"x": rng.normal(0, 1, (1, 4, 8, 8)).astype(np.float32)} for _ in range(3)]
    th, refs = _float_run(optimized, plan, feeds, (optimized.graph.output[0].name,))
    evaluator = Evaluator(optimized, plan, weight_thresholds(optimized, plan), feeds, refs, th)
    return evaluator, th, [p.tensor for p in plan.activations]


def _chain_with_a_side_branch() -> onnx.ModelProto:
    """``_conv_chain`` plus a branch that adds a twentieth of its own output: its int8 grids cost a
    large input little, a small one (coarse steps next to its values) much more."""
    model = _conv_chain(3)
    rng = np.random.default_rng(7)
    main = model.graph.output[0].name
    for k in range(2):
        model.graph.initializer.append(numpy_helper.from_array(rng.normal(0, 0.5, (4, 4, 3, 3)).astype(np.float32),
                                                               f"side_w{k}"))
    model.graph.initializer.append(numpy_helper.from_array(np.array(0.05, np.float32), "side_gain"))
    model.graph.node.extend([
        helper.make_node("Conv", ["x", "side_w0"], ["side_c0"], name="side_conv0", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["side_c0"], ["side_r0"], name="side_relu0"),
        helper.make_node("Conv", ["side_r0", "side_w1"], ["side_c1"], name="side_conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Mul", ["side_c1", "side_gain"], ["side"], name="side_scale"),
        helper.make_node("Add", [main, "side"], ["y"], name="join")])
    model.graph.output[0].name = "y"
    return model


def test_int16_search_keeps_each_samples_share_of_the_gain() -> None:
    """A sample whose output is small (a picture with a little text) keeps ``SAMPLE_KEEP_GAIN`` of what
    int16 gains it: the pooled cosine weighs samples by their output energy and does not see such a
    sample lose its output. Checked on the calibrated models the choice builds."""
    optimized, plan = _planned(_chain_with_a_side_branch())
    rng = np.random.default_rng(6)
    feeds = [{"x": (scale * rng.normal(0, 1, (1, 4, 8, 8))).astype(np.float32)} for scale in (1, 1, 1, 1, 0.03)]
    out = optimized.graph.output[0].name
    th, refs = _float_run(optimized, plan, feeds, (out,))
    weight_th = weight_thresholds(optimized, plan)
    evaluator = Evaluator(optimized, plan, weight_th, feeds, refs, th)
    tensors = [p.tensor for p in plan.activations]
    int16, chosen = evaluator.promote_to_int16(th, th, evaluator.score(th), dict.fromkeys(tensors, 0.01))

    def per_sample(bits: dict[str, int]) -> np.ndarray:
        session = make_session(lower_model(build_calibrated_model(optimized, plan.with_bits(bits), chosen,
                                                                  weight_th, {})))
        return np.array([cosine_similarity(r[0], session.run([out], f)[0]) for f, r in zip(feeds, refs, strict=True)])

    int8, all16, got = per_sample({}), per_sample(dict.fromkeys(tensors, 16)), per_sample(int16)
    pooled8, pooled16 = evaluator.score(th), evaluator.score(th, dict.fromkeys(tensors, 16))
    assert pooled8 < search.PROMOTE_TARGET and int8[-1] < 0.99 < all16[-1], "the small one needs int16"
    # Each sample may lose a share of its own gain, or as much as the pooled score may if that is more.
    slack = np.maximum((1 - search.SAMPLE_KEEP_GAIN) * (all16 - int8), (1 - search.KEEP_GAIN) * (pooled16 - pooled8))
    assert slack[-1] == pytest.approx((1 - search.SAMPLE_KEEP_GAIN) * (all16[-1] - int8[-1])), "its own share rules"
    assert np.all(got >= np.minimum(all16 - slack, search.PROMOTE_TARGET) - 1e-9), (got, all16 - slack, sorted(int16))


def test_sensitivity_from_cuts_ranks_as_whole_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each leave-one-out run restarted from a cut of the model gives the gains whole runs give."""
    evaluator, th, tensors = _chain_evaluator()
    noise = dict.fromkeys(tensors, 0.01)
    monkeypatch.setattr(search, "SUFFIXES_WORTH_SECONDS", np.inf)
    whole = evaluator._rank_by_sensitivity(th, th, noise)
    monkeypatch.setattr(search, "SUFFIXES_WORTH_SECONDS", 0.0)
    cut = evaluator._rank_by_sensitivity(th, th, noise)
    assert len(tensors) >= 5 and cut == whole


def test_sensitivity_with_cuts_keeps_no_idle_whole_model_session(monkeypatch: pytest.MonkeyPatch) -> None:
    """With cuts, the suffixes run the whole model on a session of their own beside the evaluator's
    scoring session, and no third one (a session holds a copy of the model's weights)."""
    gc.collect()
    # Sessions other tests of this process keep alive (the debugger's shared-arena session) are not counted.
    before = sum(isinstance(o, ort.InferenceSession) for o in gc.get_objects())
    evaluator, th, tensors = _chain_evaluator()
    weights_alone = evaluator.score(*evaluator.all_int16())  # as the GPTQ check scores
    alive: list[int] = []
    rerun = Suffixes.rerun

    def counting(self: Suffixes, *args: object) -> list[np.ndarray]:
        gc.collect()
        alive.append(sum(isinstance(o, ort.InferenceSession) for o in gc.get_objects()) - len(self.cuts) - before)
        return rerun(self, *args)

    monkeypatch.setattr(Suffixes, "rerun", counting)
    monkeypatch.setattr(search, "SUFFIXES_WORTH_SECONDS", 0.0)
    ranked = evaluator._rank_by_sensitivity(th, th, dict.fromkeys(tensors, 0.01))
    assert alive and set(alive) == {2}  # the evaluator's scoring session and the suffixes' whole one
    assert evaluator.score(*evaluator.all_int16()) == weights_alone
    assert sorted(ranked) == sorted(tensors)


def test_method_scores_stop_losers_early_and_pick_what_full_scores_pick() -> None:
    optimized, plan = _dead_channel_plan(8)
    rng = np.random.default_rng(3)
    feeds = [{"x": rng.normal(0, 1, (1, 3, 8, 8)).astype(np.float32)} for _ in range(6)]
    widest, refs = _float_run(optimized, plan, feeds)
    evaluator = Evaluator(optimized, plan, weight_thresholds(optimized, plan), feeds, refs, widest)
    # max, a tie of it, one clipping most values (far worse), one slightly tighter than max
    candidates = {"max": widest, "same": dict(widest), "clipped": {t: v / 50 for t, v in widest.items()},
                  "tight": {t: 0.9 * v for t, v in widest.items()}}
    full = {label: evaluator.score(th) for label, th in candidates.items()}
    for first in (None, "tight", "clipped", "same"):
        scores, bounds = evaluator.method_scores(candidates, first)
        assert list(scores) == list(candidates)
        assert max(scores, key=scores.get) == max(full, key=full.get)
        for label, score in scores.items():
            if label in bounds:  # a bound: at least the true score, below the best
                assert full[label] <= score + 1e-12 < max(full.values())
            else:
                assert score == pytest.approx(full[label], abs=1e-12)
    _, bounds = evaluator.method_scores(candidates, "max")
    assert "clipped" in bounds and "same" not in bounds


def test_goal_checked_scores_run_first_the_samples_that_failed_last() -> None:
    """A demotion that fails does so on the samples the previous one found furthest off: run first,
    they stop it after a run or two. What each score decides is what the full score decides."""
    optimized, plan = _planned(_chain_with_a_side_branch())
    rng = np.random.default_rng(5)
    # Sample 6 is faint (a picture with little text): last in the energy order, the worst relative error.
    feeds = [{"x": (s * rng.normal(0, 1, (1, 4, 8, 8))).astype(np.float32)} for s in (1, 1, 1, 1, 1, 1, .03, 1)]
    widest, refs = _float_run(optimized, plan, feeds, (optimized.graph.output[0].name,))
    evaluator = Evaluator(optimized, plan, weight_thresholds(optimized, plan), feeds, refs, widest)
    full = evaluator.score(widest)
    own = evaluator.sample_units.copy()  # each sample's full score
    assert int(np.argmin(own)) == 6 and evaluator._order.index(6) == len(feeds) - 1
    sample_goals = np.where(np.arange(len(feeds)) == 6, (own[6] + 1) / 2, 0.0)
    decided = []
    for _ in range(2):
        evaluator.score(widest, sample_goals=sample_goals)
        kept = evaluator.complete and np.all(evaluator.sample_units >= sample_goals)  # as promote_to_int16 decides
        decided.append((kept, evaluator.samples_run))
    assert decided == [(False, len(feeds)), (False, 1)], "the full score fails sample 6, and so does each one"
    # A score meeting its goals runs every sample whatever the order, and gives the full score to the last
    # bit (near-ties between methods and goals met by a hair decide as they would in the energy order).
    assert evaluator._goal_order()[0] == 6
    assert evaluator.score(widest, sample_goals=np.zeros(len(feeds))) == full
    assert evaluator.complete and evaluator.samples_run == len(feeds)


def _boxes_and_scores_model(transposed: bool) -> onnx.ModelProto:
    """Output = Concat(boxes in pixels, class scores in 0..1) on the channel axis, as a YOLOv8 export
    (``transposed``: then channels last, as YOLOX's export)."""
    rng = np.random.default_rng(4)
    w_box = rng.normal(0, 0.3, (4, 3, 3, 3)).astype(np.float32)
    w_cls = rng.normal(0, 0.3, (6, 3, 3, 3)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w_box"], ["box_conv"], name="box_conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["box_conv"], ["box_relu"], name="box_relu"),
             helper.make_node("Mul", ["box_relu", "stride"], ["boxes"], name="to_pixels"),
             helper.make_node("Conv", ["x", "w_cls"], ["cls_conv"], name="cls_conv", pads=[1, 1, 1, 1]),
             helper.make_node("Sigmoid", ["cls_conv"], ["scores"], name="scores"),
             helper.make_node("Concat", ["boxes", "scores"], ["joined" if transposed else "y"], name="joined", axis=1)]
    if transposed:
        nodes.append(helper.make_node("Transpose", ["joined"], ["y"], name="channels_last", perm=[0, 2, 3, 1]))
    inits = [numpy_helper.from_array(w_box, "w_box"), numpy_helper.from_array(w_cls, "w_cls"),
             numpy_helper.from_array(np.array(200.0, np.float32), "stride")]
    graph = helper.make_graph(nodes, "boxes_scores",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                             [1, 8, 8, 10] if transposed else [1, 10, 8, 8])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("transposed", [False, True])
def test_each_piece_of_a_final_concat_counts_as_an_output(transposed: bool) -> None:
    """Clipping the class scores beside pixel boxes barely moves the joined output's cosine (the boxes
    hold its energy); the score is the mean of the boxes' and the scores' cosines, so it shows."""
    optimized, plan = _planned(_boxes_and_scores_model(transposed))
    plan = plan.with_bits({p.tensor: 16 for p in plan.activations})  # a fine grid: only the clipping shows
    rng = np.random.default_rng(5)
    feeds = [{"x": rng.normal(0, 1, (1, 3, 8, 8)).astype(np.float32)} for _ in range(4)]
    widest, refs = _float_run(optimized, plan, feeds)
    scores = next(p.tensor for p in plan.activations if p.tensor == "scores")
    clipped = {**widest, scores: widest[scores] / 3}
    weight_th = weight_thresholds(optimized, plan)
    evaluator = Evaluator(optimized, plan, weight_th, feeds, refs, widest)

    session = make_session(lower_model(build_calibrated_model(optimized, plan, clipped, weight_th, {})))
    got = [session.run(["y"], f)[0] for f in feeds]

    def cosine(lo: int, hi: int) -> float:
        def part(t: np.ndarray) -> np.ndarray:
            return (t[..., lo:hi] if transposed else t[:, lo:hi]).ravel()
        return cosine_similarity(np.concatenate([part(r[0]) for r in refs]), np.concatenate([part(g) for g in got]))

    assert cosine(0, 10) > 0.999, "the joined output hides the clipped scores (else this tests nothing)"
    assert cosine(4, 10) < 0.95
    assert evaluator.score(clipped) == pytest.approx((cosine(0, 4) + cosine(4, 10)) / 2, abs=1e-6)
    assert evaluator.score(clipped) < evaluator.score(widest) - 0.02


def _keypoints_model() -> onnx.ModelProto:
    """A YOLOv8-pose tail: Concat(keypoints in pixels, their confidences in 0..1) -> Reshape -> Concat
    with the boxes: the confidences land interleaved in the output, behind a Reshape."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[1, 1], name="conv"),
             helper.make_node("Split", ["c"], ["box", "kxy", "kc"], axis=1, split=[4, 2, 1], name="split"),
             helper.make_node("Mul", ["box", "k100"], ["boxp"], name="box_px"),
             helper.make_node("Mul", ["kxy", "k100"], ["kxyp"], name="kxy_px"),
             helper.make_node("Sigmoid", ["kc"], ["kconf"], name="kconf"),
             helper.make_node("Concat", ["kxyp", "kconf"], ["kpt"], axis=1, name="inner_concat"),
             helper.make_node("Reshape", ["kpt", "shape"], ["kptr"], name="reshape"),
             helper.make_node("Reshape", ["boxp", "shape"], ["boxr"], name="reshape_box"),
             helper.make_node("Concat", ["boxr", "kptr"], ["y"], axis=1, name="outer_concat")]
    inits = [numpy_helper.from_array((rng.standard_normal((7, 3, 1, 1)) * 0.3).astype(np.float32), "w"),
             numpy_helper.from_array((rng.standard_normal(7) * 0.3).astype(np.float32), "b"),
             numpy_helper.from_array(np.array(100, np.float32), "k100"),
             numpy_helper.from_array(np.array([1, -1, 256], np.int64), "shape")]
    graph = helper.make_graph(nodes, "keypoints",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 7, 256])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)])
    model.ir_version = 7
    return model


def test_pieces_behind_a_reshape_and_a_nested_concat_are_found() -> None:
    """Where each joined tensor lands: the confidences are row 6 of the output, the keypoints rows 4-5."""
    from hbtools.quant.search import output_pieces

    (joined,) = output_pieces(optimize.run(_keypoints_model()))
    assert sorted(joined.names) == ["boxp", "kconf", "kxyp"]
    rows = joined.labels.reshape(7, 256)[:, 0]
    assert [joined.names[k] for k in rows] == ["boxp"] * 4 + ["kxyp"] * 2 + ["kconf"]


def test_confidences_interleaved_with_pixels_keep_their_values(tmp_path) -> None:
    """Scored as one output (or as the outer Concat's two pieces), the confidences' error did not
    show: ``default`` put them on a grid of the pixels' step and every one read 0.83 (float 0.42-0.53)."""
    from conformance import convert_featuremaps

    from hbtools.runtime import HB_ONNXRuntime

    model = _keypoints_model()
    rng = np.random.default_rng(3)
    samples = [rng.uniform(0, 1, (1, 3, 16, 16)).astype(np.float32) for _ in range(8)]
    convert_featuremaps(tmp_path, model, {"x": samples}, "1x3x16x16", "float32", "m")
    x = rng.uniform(0, 1, (1, 3, 16, 16)).astype(np.float32)
    want = make_session(model).run(None, {"x": x})[0]
    got = HB_ONNXRuntime(model_file=str(tmp_path / "out" / "m_quantized_model.onnx")).run(None, {"x": x})[0]
    assert np.abs(got[0, 6] - want[0, 6]).max() < 0.02, (want[0, 6].min(), got[0, 6].min(), got[0, 6].max())


def _biased_convs() -> onnx.ModelProto:
    rng = np.random.default_rng(5)
    w1, w2 = rng.normal(0, 0.3, (8, 3, 3, 3)).astype(np.float32), rng.normal(0, 0.2, (4, 8, 3, 3)).astype(np.float32)
    b1, b2 = rng.normal(0, 0.5, 8).astype(np.float32), rng.normal(0, 0.5, 4).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["y"], name="conv2", pads=[1, 1, 1, 1])]
    graph = helper.make_graph(nodes, "biased_convs",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])],
                              [numpy_helper.from_array(v, k) for k, v in
                               (("w1", w1), ("b1", b1), ("w2", w2), ("b2", b2))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("build", [_biased_convs, _model_with_a_dead_channel], ids=["biases", "dead_channel"])
def test_fed_conv_biases_are_added_in_float32_with_the_same_bits(build) -> None:
    """The searches' session adds a conv's bias levels to its float32 sum in float32 where the levels are
    exact in float32, else (a bias far above its widened grid's step) in float64, chosen at run time: per
    element the same outputs as the calibrated model built with those grids, and no float64 copy of a
    conv's sum on the way (the float64 sum is only the fallback inside the If)."""
    optimized, plan = _planned(build())
    rng = np.random.default_rng(1)
    feeds = [{"x": rng.normal(0, s, (1, 3, 8, 8)).astype(np.float32)} for s in (100.0, 1.0, 0.01)]
    widest, refs = _float_run(optimized, plan, feeds)
    weight_th = weight_thresholds(optimized, plan)
    evaluator = Evaluator(optimized, plan, weight_th, feeds, refs, widest)
    direct = make_session(lower_model(build_calibrated_model(optimized, plan, widest, weight_th, {})))
    for feed in feeds:
        fed = evaluator.session.run(["y"], {**feed, **evaluator._extra(widest)})[0]
        np.testing.assert_array_equal(fed, direct.run(["y"], feed)[0])
    # The first conv's sum goes on to a fake quant (the second's is the model's float output).
    lowered = lower_model(evaluator.calibrated, feed_calibration=True)
    (hidden,) = [n.output[0] for n in lowered.graph.node if n.op_type == "Conv" and n.name.startswith("conv1")]
    widened = [n.name for n in lowered.graph.node if n.op_type == "Cast" and n.input[0] == hidden]
    assert not widened, f"conv1's sum cast to float64 outside the fallback: {widened}"
    picks = [n for n in lowered.graph.node if n.op_type == "If"
             and any(hidden in m.input for a in n.attribute for m in a.g.node)]
    assert picks, "conv1's biased sum is picked at run time"


def _biased_conv_chain(dead: bool) -> onnx.ModelProto:
    """Three convolutions, the middle one biased and read from int8 / int16 levels, so that its integer
    sum goes on to a fake quant; ``dead``: one of its channels has all-but-zero weights beside a bias (its
    bias levels are huge on fine grids)."""
    rng = np.random.default_rng(9)
    w1, w2, w3 = (rng.normal(0, 0.3, shape).astype(np.float32) for shape in ((8, 3, 3, 3), (8, 8, 3, 3),
                                                                             (2, 8, 1, 1)))
    b2 = rng.normal(0, 0.5, 8).astype(np.float32)
    if dead:
        w2[3] *= 1e-9
        b2[3] = 3.0
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
             helper.make_node("Conv", ["r2", "w3"], ["y"], name="conv3")]
    graph = helper.make_graph(nodes, "biased_chain",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 8, 8])],
                              [numpy_helper.from_array(v, k) for k, v in
                               (("w1", w1), ("w2", w2), ("b2", b2), ("w3", w3))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("dead", [False, True], ids=["biases", "dead_channel"])
def test_fed_integer_sums_take_their_bias_in_int32(dead: bool) -> None:
    """A conv's int32 sum with fed bias levels (a session planned with int16 activations, fed 8- or 16-bit
    grids) is requantized by one DequantizeLinear, minus the bias as its zero point, where the biased sum
    fits int32, else through float64, chosen at run time: the same outputs as the calibrated model built
    with those grids, and no float64 copy of the sum outside the fallback (three passes over the map, most
    of a search session's time on a detector)."""
    optimized, plan = _planned(_biased_conv_chain(dead))
    plan = plan.with_bits({p.tensor: 16 for p in plan.activations})
    rng = np.random.default_rng(2)
    feeds = [{"x": rng.normal(0, s, (1, 3, 8, 8)).astype(np.float32)} for s in (30.0, 1.0, 0.05)]
    widest, refs = _float_run(optimized, plan, feeds)
    weight_th = weight_thresholds(optimized, plan)
    evaluator = Evaluator(optimized, plan, weight_th, feeds, refs, widest)
    # A fine int16 grid on conv2's input makes its bias levels so large that the biased sum may leave int32.
    fine = {**widest, "r1": widest["r1"] * 1e-5}
    for bits, thresholds in ((8, widest), (16, widest), (16, fine)):
        grids = {p.tensor: bits for p in plan.activations}
        built = build_calibrated_model(optimized, plan.with_bits(grids), thresholds, weight_th, {})
        direct = make_session(lower_model(built))
        for feed in feeds:
            fed = evaluator.session.run(["y"], {**feed, **evaluator._extra(thresholds, grids)})[0]
            np.testing.assert_array_equal(fed, direct.run(["y"], feed)[0])
    lowered = lower_model(evaluator.calibrated, feed_calibration=True)
    producer = {o: n for n in lowered.graph.node for o in n.output}

    def from_conv2(name: str) -> bool:
        """Whether ``name`` is conv2's integer sum (or a part of it)."""
        node = producer.get(name)
        return node is not None and ((node.op_type == "ConvInteger" and node.name.startswith("conv2")) or (
            node.op_type in ("Add", "Mul") and any(from_conv2(i) for i in node.input)))

    assert any(n.op_type == "ConvInteger" and n.name.startswith("conv2") for n in lowered.graph.node), \
        "conv2 runs on onnxruntime's integer conv"
    # (conv3's sum is the model's float output: its value is computed in float64)
    widened = [n.name for n in lowered.graph.node if n.op_type == "Cast" and from_conv2(n.input[0])
               and n.attribute[0].i == TensorProto.DOUBLE]
    assert not widened, f"conv2's integer sum cast to float64 outside the fallback: {widened}"
    (pick,) = [n for n in lowered.graph.node if n.op_type == "If"
               and any(m.op_type == "DequantizeLinear" for a in n.attribute for m in a.g.node)]
    lowered.graph.output.append(helper.make_tensor_value_info(pick.input[0], TensorProto.BOOL, []))
    picked = make_session(lowered)
    grids = {p.tensor: 16 for p in plan.activations}
    assert [bool(picked.run([pick.input[0]], {**feeds[0], **evaluator._extra(t, grids)})[0]) for t in (widest, fine)] \
        == [True, False], "the int32 requantization where the biased sum fits, the float64 one where it may not"


def test_int16_activations_score_the_weights_alone() -> None:
    """Every activation on a 16-bit grid over its widest range (how the GPTQ and bias-correction checks
    judge weights alone) leaves only the weights' and biases' grids: far closer to the float model than
    int8 activations, and as close as activations left float within a small share of the int8 loss."""
    optimized, plan = _planned(_biased_convs())
    rng = np.random.default_rng(4)
    feeds = [{"x": rng.normal(0, 1, (1, 3, 8, 8)).astype(np.float32)} for _ in range(2)]
    widest, refs = _float_run(optimized, plan, feeds)
    weight_th = weight_thresholds(optimized, plan)
    evaluator = Evaluator(optimized, plan, weight_th, feeds, refs, widest)
    th16, bits16 = evaluator.all_int16()
    assert set(bits16) == {p.tensor for p in plan.activations} and set(bits16.values()) == {16}
    weights_only = build_calibrated_model(optimized, plan, widest, weight_th, {})
    for node in weights_only.graph.node:  # activation fake quants off: the weights alone
        if node.op_type == "HzCalibration" and helper.get_attribute_value(
                next(a for a in node.attribute if a.name == "kind")) == b"activation":
            node.op_type, node.domain = "Identity", ""
            del node.attribute[:], node.input[1:]
    floats = fetching_session(weights_only, ["y"])
    for feed, (ref,) in zip(feeds, refs, strict=True):
        int8 = evaluator.session.run(["y"], {**feed, **evaluator._extra(widest)})[0]
        int16 = evaluator.session.run(["y"], {**feed, **evaluator._extra(th16, bits16)})[0]
        alone = floats.run(["y"], feed)[0]
        int8_loss, int16_loss = 1 - cosine_similarity(ref, int8), 1 - cosine_similarity(ref, int16)
        assert int16_loss < 0.5 * int8_loss
        assert abs(int16_loss - (1 - cosine_similarity(ref, alone))) < 0.05 * int8_loss


def _anchor_decoding_model() -> onnx.ModelProto:
    """A YOLOv8 export's tail: distances from a conv, decoded around an anchor grid into pixel boxes
    (centre and size), joined with sigmoid class scores."""
    rng = np.random.default_rng(7)
    side, stride = 16, 20.0
    cells = (np.arange(side, dtype=np.float32) + 0.5)
    anchors = np.stack([np.tile(cells, side), np.repeat(cells, side)])[None]  # [1, 2, 256]: x, y per cell
    nodes = [helper.make_node("Conv", ["x", "w_feat"], ["feat_conv"], name="feat", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["feat_conv"], ["feat"], name="feat_relu"),
             helper.make_node("Conv", ["feat", "w_dist", "b_dist"], ["dist_conv"], name="dist"),
             helper.make_node("Softplus", ["dist_conv"], ["dist_pos"], name="dist_pos"),
             helper.make_node("Reshape", ["dist_pos", "flat"], ["dist"], name="dist_flat"),
             helper.make_node("Split", ["dist", "halves"], ["lt", "rb"], axis=1, name="split"),
             helper.make_node("Sub", ["anchors", "lt"], ["x1y1"], name="x1y1"),
             helper.make_node("Add", ["anchors", "rb"], ["x2y2"], name="x2y2"),
             helper.make_node("Add", ["x1y1", "x2y2"], ["sum"], name="sum"),
             helper.make_node("Div", ["sum", "two"], ["centre"], name="centre"),
             helper.make_node("Sub", ["x2y2", "x1y1"], ["size"], name="size"),
             helper.make_node("Concat", ["centre", "size"], ["cells"], axis=1, name="box_cells"),
             helper.make_node("Mul", ["cells", "stride"], ["boxes"], name="to_pixels"),
             helper.make_node("Conv", ["feat", "w_cls"], ["cls_conv"], name="cls"),
             helper.make_node("Reshape", ["cls_conv", "flat"], ["cls_flat"], name="cls_flat"),
             helper.make_node("Sigmoid", ["cls_flat"], ["scores"], name="scores"),
             helper.make_node("Concat", ["boxes", "scores"], ["y"], axis=1, name="joined")]
    inits = [numpy_helper.from_array((rng.standard_normal((8, 3, 3, 3)) * 0.4).astype(np.float32), "w_feat"),
             numpy_helper.from_array((rng.standard_normal((4, 8, 1, 1)) * 0.5).astype(np.float32), "w_dist"),
             numpy_helper.from_array(np.full(4, 1.0, np.float32), "b_dist"),
             numpy_helper.from_array((rng.standard_normal((3, 8, 1, 1)) * 0.5).astype(np.float32), "w_cls"),
             numpy_helper.from_array(np.array([1, -1, side * side], np.int64), "flat"),
             numpy_helper.from_array(np.array([2, 2], np.int64), "halves"),
             numpy_helper.from_array(anchors, "anchors"),
             numpy_helper.from_array(np.array(2.0, np.float32), "two"),
             numpy_helper.from_array(np.array(stride, np.float32), "stride")]
    graph = helper.make_graph(nodes, "anchor_decoding",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, side, side])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 7, side * side])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def test_constant_term_of_an_anchor_decoding_is_the_grid() -> None:
    """At zero distances the decoded boxes are the anchor points in pixels with size 0, and the class
    scores have no constant part: that is what the scores leave out."""
    (term,) = search.constant_terms(optimize.run(_anchor_decoding_model()))
    rows = term.reshape(7, 256)
    cells = np.arange(16, dtype=np.float32) + 0.5
    assert np.allclose(rows[0], np.tile(cells, 16) * 20) and np.allclose(rows[1], np.repeat(cells, 16) * 20)
    assert not rows[2:].any()
    assert search.constant_terms(optimize.run(_boxes_and_scores_model(False))) == [None]


def test_boxes_around_an_anchor_grid_keep_their_precision(tmp_path) -> None:
    """Scored with the anchor grid in it, the int8 decoding looked exact (cosine 0.99996) and nothing
    went to int16: boxes 18-65 pixels wide were off by up to 3.3 pixels (IoU with float down to 0.80)."""
    from conformance import convert_featuremaps

    from hbtools.runtime import HB_ONNXRuntime

    model = _anchor_decoding_model()
    rng = np.random.default_rng(8)
    samples = [rng.uniform(0, 1, (1, 3, 16, 16)).astype(np.float32) for _ in range(8)]
    console = convert_featuremaps(tmp_path, model, {"x": samples}, "1x3x16x16", "float32", "m")
    assert "output 'y' is scored without what it holds whatever the input (512 of its 1792" in console
    # the joined output itself is no longer one of them: its join runs in float (units._join_outputs_in_float)
    assert "6 tensors add a constant that differs over their elements" in console
    x = rng.uniform(0, 1, (1, 3, 16, 16)).astype(np.float32)
    want = make_session(model).run(None, {"x": x})[0][0]
    got = HB_ONNXRuntime(model_file=str(tmp_path / "out" / "m_quantized_model.onnx")).run(None, {"x": x})[0][0]
    iou = _box_iou(want[:4], got[:4])
    assert iou.mean() > 0.98 and iou.min() > 0.95, (iou.mean(), iou.min())  # old code: 0.915, 0.80
    assert np.abs(got[4:] - want[4:]).max() < 0.02


def _box_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of boxes given as rows centre x, centre y, width, height (one box per column)."""
    def corners(box: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return box[:2] - box[2:] / 2, box[:2] + box[2:] / 2
    (a0, a1), (b0, b1) = corners(a), corners(b)
    inter = np.prod(np.clip(np.minimum(a1, b1) - np.maximum(a0, b0), 0, None), axis=0)
    return inter / (np.prod(a[2:], axis=0) + np.prod(b[2:], axis=0) - inter)


def _two_heads() -> onnx.ModelProto:
    """Two outputs from separate branches: ``hard``'s int8 grid is set by one large channel (int8
    loses the others), ``easy``'s is fine at int8 but not exact."""
    rng = np.random.default_rng(11)
    w_hard = rng.normal(0, 0.4, (4, 3, 3, 3)).astype(np.float32)
    w_hard[0] *= 300.0
    out_hard = rng.normal(0, 0.5, (2, 4, 1, 1)).astype(np.float32)
    out_hard[:, 0] *= 0.003
    inits = {"w_hard": w_hard, "out_hard": out_hard, "w_easy": rng.normal(0, 0.4, (4, 3, 3, 3)).astype(np.float32),
             "out_easy": rng.normal(0, 0.5, (2, 4, 1, 1)).astype(np.float32)}
    nodes = []
    for k in ("hard", "easy"):
        nodes += [helper.make_node("Conv", ["x", f"w_{k}"], [f"{k}_conv"], name=f"{k}_conv", pads=[1, 1, 1, 1]),
                  helper.make_node("Relu", [f"{k}_conv"], [f"{k}_relu"], name=f"{k}_relu"),
                  helper.make_node("Conv", [f"{k}_relu", f"out_{k}"], [k], name=f"{k}_out")]
    outputs = [helper.make_tensor_value_info(k, TensorProto.FLOAT, [1, 2, 8, 8]) for k in ("hard", "easy")]
    graph = helper.make_graph(nodes, "two_heads", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              outputs,
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def test_each_output_keeps_its_own_share_of_the_int16_gain() -> None:
    """Scored by the mean of the two outputs, the int16 search's goal came from the hard output's large
    gain, and the easy output's tensors went back to int8 though int16 gained it something too."""
    optimized, plan = _planned(_two_heads())
    rng = np.random.default_rng(12)
    feeds = [{"x": rng.normal(0, 1, (1, 3, 8, 8)).astype(np.float32)} for _ in range(6)]
    tensors = [p.tensor for p in plan.activations]
    th, refs = _float_run(optimized, plan, feeds, ("hard", "easy"))
    weight_th = weight_thresholds(optimized, plan)

    def cosines(bits: dict[str, int]) -> np.ndarray:
        model = build_calibrated_model(optimized, plan.with_bits(bits), th, weight_th, {})
        session = make_session(lower_model(model))
        got = [session.run(["hard", "easy"], f) for f in feeds]
        return np.array([cosine_similarity(np.concatenate([r[k].ravel() for r in refs]),
                                           np.concatenate([g[k].ravel() for g in got])) for k in range(2)])

    int8, all16 = cosines({}), cosines(dict.fromkeys(tensors, 16))
    assert int8[0] < 0.99 and all16[1] - int8[1] > 1e-5  # else this tests nothing
    evaluator = Evaluator(optimized, plan, weight_th, feeds, refs, th)
    int16, _ = evaluator.promote_to_int16(th, th, evaluator.score(th), dict.fromkeys(tensors, 0.01))
    chosen = cosines(int16)
    assert np.all(chosen >= np.minimum(PROMOTE_TARGET, int8 + 0.99 * (all16 - int8)) - 1e-9), (int8, all16, chosen)


def _sequence_head(final: str = "Softmax") -> onnx.ModelProto:
    """Conv, Conv, mean over the height, a 1x1 conv to 200 classes per position, ``final`` (Softmax or
    LogSoftmax) over the classes: a CTC-like head whose probabilities are not saturated."""
    rng = np.random.default_rng(1)
    inits = {"w1": rng.normal(0, 0.4, (8, 3, 3, 3)), "w2": rng.normal(0, 0.3, (8, 8, 3, 3)),
             "head": rng.normal(0, 2.0, (200, 8, 1, 1))}
    # one feature channel 4 times the others, undone by the head (as trained networks have them): its int8
    # grid is coarse for the other channels, and the logits show it
    inits["w2"][0] *= 4.0
    inits["head"][:, 0] /= 4.0
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
             helper.make_node("ReduceMean", ["r2"], ["m"], name="pool", axes=[2], keepdims=1),
             helper.make_node("Conv", ["m", "head"], ["h"], name="head"),
             helper.make_node("Squeeze", ["h", "height"], ["s"], name="squeeze"),
             helper.make_node("Transpose", ["s"], ["logits"], name="transpose", perm=[0, 2, 1]),
             helper.make_node(final, ["logits"], ["prob"], name="softmax", axis=2)]
    graph = helper.make_graph(nodes, "sequence", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 12])],
                              [helper.make_tensor_value_info("prob", TensorProto.FLOAT, [1, 12, 200])],
                              [*(numpy_helper.from_array(v.astype(np.float32), k) for k, v in inits.items()),
                               numpy_helper.from_array(np.array([2], np.int64), "height")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("final", ["Softmax", "LogSoftmax"])
def test_the_int16_search_scores_a_final_softmax_with_its_logits(final: str, caplog: pytest.LogCaptureFixture) -> None:
    """Not only where the probabilities saturate: a CTC head's probabilities hide logit errors that
    move an argmax where the margin is small (PP-OCRv6 tiny rec: 58 of 72 tensors int16 and 77.5 %
    of the held-out strings on its probabilities, 68 and 87.5 % with its logits). Log-probabilities
    (CTC speech and text heads) hide them more: their shared negative offset keeps their cosine near 1."""
    optimized, plan = _planned(_sequence_head(final))
    rng = np.random.default_rng(3)
    feeds = [{"x": rng.normal(0, 1, (1, 3, 4, 12)).astype(np.float32)} for _ in range(4)]
    tensors = [p.tensor for p in plan.activations]
    th, refs = _float_run(optimized, plan, feeds, ("prob", "logits"))
    evaluator = Evaluator(optimized, plan, weight_thresholds(optimized, plan), feeds, refs, th)
    score = evaluator.score(th)
    # Probabilities are not saturated: alone they would run the search; log-probabilities alone would stop it.
    assert (score < PROMOTE_TARGET) == (final == "Softmax")
    logger = logging.getLogger("hbtools")
    logger.addHandler(caplog.handler)  # a tool's setup (another test's) stops propagation
    try:
        with caplog.at_level("INFO", logger="hbtools"):
            int16, chosen = evaluator.promote_to_int16(th, th, score, dict.fromkeys(tensors, 0.01))
    finally:
        logger.removeHandler(caplog.handler)
    assert "counting the logits of the final Softmax" in caplog.text
    assert int16
    calibrated = build_calibrated_model(optimized, plan, th, weight_thresholds(optimized, plan), {})
    assert final_logits(calibrated) == ["logits"]
    int8_logits = evaluator.score(th, logits=True)
    all16_logits = evaluator.score(th, dict.fromkeys(tensors, 16), logits=True)
    goal = min(PROMOTE_TARGET, int8_logits + search.KEEP_GAIN * (all16_logits - int8_logits))
    assert evaluator.score(chosen, int16, logits=True) >= goal - 1e-9


def _rounded_twice() -> onnx.ModelProto:
    """``_chain_with_a_side_branch`` whose main output is scaled by 1.0001 before the join: the scaled
    tensor's int8 grid is all but its input's, so the input's int8 rounding costs nothing more once the
    scaled one is int8 too, and all of its own once the scaled one is int16."""
    model = _chain_with_a_side_branch()
    join = next(n for n in model.graph.node if n.name == "join")
    main = join.input[0]
    model.graph.initializer.append(numpy_helper.from_array(np.array(1.0001, np.float32), "near_one"))
    model.graph.node.insert(list(model.graph.node).index(join),
                            helper.make_node("Mul", [main, "near_one"], ["main_scaled"], name="near_one_scale"))
    join.input[0] = "main_scaled"
    return model


def test_sensitivity_ranks_by_what_going_back_to_int8_alone_costs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The demotions start from every tensor int16, so the ranking measures that: first the tensor whose
    int8 grid alone (every other one int16) costs the output most, last the one costing least, as the
    scores the demotions are judged by say. A tensor rounded again to nearly its own grid by its consumer
    gains nothing from int16 while that consumer is int8, but costs as much as the consumer to demote."""
    optimized, plan = _planned(_rounded_twice())
    rng = np.random.default_rng(6)
    feeds = [{"x": (scale * rng.normal(0, 1, (1, 4, 8, 8))).astype(np.float32)} for scale in (1, 1, 0.3, 0.03)]
    out = optimized.graph.output[0].name
    th, refs = _float_run(optimized, plan, feeds, (out,))
    evaluator = Evaluator(optimized, plan, weight_thresholds(optimized, plan), feeds, refs, th)
    monkeypatch.setattr(search, "SENSITIVITY_SAMPLES", len(feeds))
    ranked = evaluator._rank_by_sensitivity(th, th, {p.tensor: 0.01 for p in plan.activations})
    all16 = dict.fromkeys(ranked, 16)
    best = evaluator.score(th, all16)
    cost = {t: best - evaluator.score(th, {**all16, t: 8}) for t in ranked}
    assert len(ranked) >= 5 and min(cost.values()) < 0.1 * max(cost.values()), cost
    assert ranked[0] == max(cost, key=cost.get) and ranked[-1] == min(cost, key=cost.get), (ranked, cost)


def test_sensitivity_is_measured_where_the_demotions_are_judged() -> None:
    """The ranking's samples: the one with the largest share of the output energy (it stands for the
    pooled score), then the one that can lose least, which the pooled score hardly sees."""
    evaluator, _, _ = _chain_evaluator()
    loud = evaluator._order[0]
    assert evaluator._sensitivity_samples(np.full(3, np.inf)) == evaluator._order[:search.SENSITIVITY_SAMPLES]
    for quiet in (k for k in range(3) if k != loud):
        slack = np.full(3, 0.01)
        slack[quiet] = 1e-6
        assert evaluator._sensitivity_samples(slack) == [loud, quiet]


def _wide_log_model() -> onnx.ModelProto:
    """Exp of 6x (x standard normal: values over 15 decades), summed by a conv with positive weights, then Log and
    a conv: what a log-power spectrum computed in a model does to the BPU's linear grids."""
    rng = np.random.default_rng(7)
    inits = [numpy_helper.from_array(np.array(6.0, np.float32), "spread"),
             numpy_helper.from_array(np.abs(rng.standard_normal((4, 4, 1, 1))).astype(np.float32), "w_sum"),
             numpy_helper.from_array(rng.standard_normal((8, 4, 1, 1)).astype(np.float32), "w_out")]
    nodes = [helper.make_node("Mul", ["x", "spread"], ["scaled"], name="scale"),
             helper.make_node("Exp", ["scaled"], ["power"], name="exp"),
             helper.make_node("Conv", ["power", "w_sum"], ["summed"], name="sum"),
             helper.make_node("Log", ["summed"], ["logged"], name="log"),
             helper.make_node("Conv", ["logged", "w_out"], ["y"], name="out")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("wide", [True, False], ids=["log_of_decades", "plain_convs"])
def test_a_model_no_int16_grid_can_follow_is_told_so(wide: bool, caplog: pytest.LogCaptureFixture) -> None:
    """Where even every activation int16 leaves the output far from float, the search says so and how to find
    and fix it; a model int16 serves well gets no such warning."""
    model = _wide_log_model() if wide else _model_with_a_dead_channel()
    optimized, plan = _planned(model)
    rng = np.random.default_rng(3)
    feeds = [{"x": rng.standard_normal(tuple(d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim))
              .astype(np.float32)} for _ in range(4)]
    session = fetching_session(optimized, [o.name for o in optimized.graph.output])
    refs = [session.run(None, f) for f in feeds]
    tensors = [p.tensor for p in plan.activations]
    observed = fetching_session(optimized, tensors)
    runs = [observed.run(tensors, f) for f in feeds]
    th = {t: float(max(np.abs(run[k]).max() for run in runs)) for k, t in enumerate(tensors)}  # the max method
    evaluator = Evaluator(optimized, plan, weight_thresholds(optimized, plan), feeds, refs, th)
    logger = logging.getLogger("hbtools")
    logger.addHandler(caplog.handler)  # a tool's setup (another test's) stops propagation
    try:
        with caplog.at_level("WARNING", logger="hbtools"):
            score = evaluator.score(th)
            evaluator.promote_to_int16(th, th, score, dict.fromkeys(th, 1.0))
    finally:
        logger.removeHandler(caplog.handler)
    warned = [r.getMessage() for r in caplog.records if "even with every activation int16" in r.getMessage()]
    assert bool(warned) == wide, caplog.text
    if wide:
        assert "run_on_cpu" in warned[0] and "hmct-debugger" in warned[0]
        assert evaluator.weights_alone() < search.ALL_INT16_FLOOR


def test_a_loss_in_the_weights_is_not_blamed_on_the_activations(caplog: pytest.LogCaptureFixture) -> None:
    """The warning names the cause the weight precision step measured: where int8 weights alone (float
    activations) lose as much as every activation int16 does, keeping nodes in float cannot help
    (YOLO11n with random weights: 0.686 weights alone, 0.879 all int16, and the advice was run_on_cpu)."""
    model = _wide_log_model()
    optimized, plan = _planned(model)
    rng = np.random.default_rng(3)
    feeds = [{"x": rng.standard_normal((1, 4, 16, 16)).astype(np.float32)} for _ in range(4)]
    refs = [fetching_session(optimized, [o.name for o in optimized.graph.output]).run(None, f) for f in feeds]
    tensors = [p.tensor for p in plan.activations]
    runs = [fetching_session(optimized, tensors).run(tensors, f) for f in feeds]
    th = {t: float(max(np.abs(run[k]).max() for run in runs)) for k, t in enumerate(tensors)}
    evaluator = Evaluator(optimized, plan, weight_thresholds(optimized, plan), feeds, refs, th)
    all16 = evaluator.weights_alone()
    logger = logging.getLogger("hbtools")
    logger.addHandler(caplog.handler)
    warned = {}
    try:
        for label, weights_only in (("weights", all16 - 0.01), ("activations", 1 - (1 - all16) / 10)):
            caplog.clear()
            with caplog.at_level("WARNING", logger="hbtools"):
                evaluator.promote_to_int16(th, th, evaluator.score(th), dict.fromkeys(th, 1.0),
                                           weights_only=weights_only)
            warned[label] = " ".join(r.getMessage() for r in caplog.records)
    finally:
        logger.removeHandler(caplog.handler)
    assert "weights' int8 grids" in warned["weights"] and "run_on_cpu" not in warned["weights"], warned
    assert "run_on_cpu" in warned["activations"] and "weights' int8 grids" not in warned["activations"], warned


def test_a_cross_score_with_the_same_thresholds_in_every_fold_is_the_score() -> None:
    """``cross_score`` runs each sample at its fold's thresholds and sums as ``score`` does: given one
    set for every fold it is ``score`` to the last bit, and a fold whose thresholds clip its own samples
    lowers it."""
    optimized, plan = _planned(_chain_with_a_side_branch())
    rng = np.random.default_rng(6)
    feeds = [{"x": rng.normal(0, 1, (1, 4, 8, 8)).astype(np.float32)} for _ in range(4)]
    out = optimized.graph.output[0].name
    th, refs = _float_run(optimized, plan, feeds, (out,))
    evaluator = Evaluator(optimized, plan, weight_thresholds(optimized, plan), feeds, refs, th)
    assert evaluator.cross_score([th, th]) == evaluator.score(th)
    clipped = {t: 0.2 * v for t, v in th.items()}
    assert evaluator.cross_score([th, clipped]) < evaluator.score(th)


def test_each_fold_collects_every_sample_but_its_own() -> None:
    """The statistics a fold's thresholds come from leave out that fold's scoring samples and keep all
    the others (``calibrate._collect``)."""
    from hbtools.pipeline import calibrate

    optimized, plan = _planned(_conv_chain(2))
    rng = np.random.default_rng(2)
    feeds = [{"x": (k + 1.0) * rng.normal(0, 1, (1, 4, 8, 8)).astype(np.float32)} for k in range(6)]
    collector, eval_feeds, _, _, folds = calibrate._collect(optimized, plan, lambda: iter(feeds), len(feeds),
                                                            folds=2)
    assert len(eval_feeds) == 6 and len(folds) == 2
    tensor = plan.activations[0].tensor
    values = fetching_session(optimized, [tensor])
    peaks = [float(np.abs(values.run([tensor], f)[0]).max()) for f in feeds]
    assert collector.stats[tensor].max_abs == pytest.approx(max(peaks))
    for f, fold in enumerate(folds):
        assert fold.samples == 3
        assert fold.stats[tensor].max_abs == pytest.approx(max(p for k, p in enumerate(peaks) if k % 2 != f))


@pytest.mark.parametrize("march", ["bernoulli2", "bayes-e"])
def test_a_poor_int8_result_without_int16_is_told(march: str, tmp_path) -> None:
    """On RDK X3 (no int16) a model whose int8 grids lose much (a Log of values spanning decades) only
    said so in INFO lines; the int16 search's WARNINGs exist only where there is int16."""
    from conformance import convert_featuremaps

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 1, 1)).astype(np.float32), "w")
    eps = numpy_helper.from_array(np.array(1e-4, np.float32), "eps")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Add", ["r", "eps"], ["a"]), helper.make_node("Log", ["a"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], [w, eps])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    samples = [(rng.standard_normal((1, 3, 8, 8)) * np.exp(rng.uniform(-4, 4, (1, 1, 8, 8)))).astype(np.float32)
               for _ in range(8)]
    out = convert_featuremaps(tmp_path, model, {"x": samples}, "1x3x8x8", "float32", "m", march=march)
    told = "with every activation on an int8 grid (this BPU has no int16) the output cosine" in out
    assert told == (march == "bernoulli2"), out[-3000:]
