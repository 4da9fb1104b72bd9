"""An output picked at places the data decides (an end-to-end detector's top-k: TopK, then
GatherElements at its indices) is scored on the tensors it picks from.

The top-k list holds the float model's choice in the float model and the quantized model's in the
quantized one; where candidates score alike the order flips under any quantization noise, so the
list's cosine measured the order, not the error: a YOLO26 head's scored 0.34 for every
calibration method (the search chose by noise) and the int16 search, never reaching its target,
made every tensor int16.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from builders import FloatModel, make_project
from onnx import TensorProto, helper, numpy_helper

from hbtools.march.profiles import get_profile
from hbtools.pipeline import optimize
from hbtools.pipeline.runner import makertbin
from hbtools.quant.plan import make_plan, weight_thresholds
from hbtools.quant.search import Evaluator, scored_tensors
from hbtools.quant.units import build_partition
from hbtools.runtime.session import fetching_session


def _top_k_detector() -> onnx.ModelProto:
    """Boxes in pixels and class scores per anchor, joined, laid out anchor-major and split again;
    the 100 best anchors' boxes and scores are the output (Ultralytics' end-to-end head)."""
    rng = np.random.default_rng(0)

    def ints(values: list[int], name: str) -> onnx.TensorProto:
        return numpy_helper.from_array(np.array(values, np.int64), name)

    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[1, 1], name="conv"),
             helper.make_node("Split", ["c", "parts"], ["box", "cls"], axis=1, name="split_head"),
             helper.make_node("Mul", ["box", "stride"], ["boxp"], name="box_px"),
             helper.make_node("Sigmoid", ["cls"], ["score"], name="score"),
             helper.make_node("Concat", ["boxp", "score"], ["head"], axis=1, name="head"),
             helper.make_node("Reshape", ["head", "flat"], ["headr"], name="flatten"),
             helper.make_node("Transpose", ["headr"], ["anchors"], perm=[0, 2, 1], name="anchors"),
             helper.make_node("Split", ["anchors", "parts"], ["boxes", "scores"], axis=2, name="split"),
             helper.make_node("ReduceMax", ["scores"], ["best"], axes=[-1], keepdims=0, name="best"),
             helper.make_node("TopK", ["best", "k"], ["top", "idx"], axis=1, name="topk"),
             helper.make_node("Unsqueeze", ["idx", "last"], ["idx3"], name="idx3"),
             helper.make_node("Tile", ["idx3", "reps"], ["idx4"], name="idx4"),
             helper.make_node("GatherElements", ["boxes", "idx4"], ["kept"], axis=1, name="kept"),
             helper.make_node("Unsqueeze", ["top", "last"], ["top3"], name="top3"),
             helper.make_node("Concat", ["kept", "top3"], ["y"], axis=2, name="out")]
    w = (rng.standard_normal((5, 3, 1, 1)) * 0.5).astype(np.float32)
    w[4] = np.array([3.0, -2.0, 1.5], np.float32).reshape(3, 1, 1)
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array([0, 0, 0, 0, -4], np.float32), "b"),
             numpy_helper.from_array(np.array(16, np.float32), "stride"), ints([4, 1], "parts"),
             ints([1, 5, 256], "flat"), ints([100], "k"), ints([2], "last"), ints([1, 1, 4], "reps")]
    graph = helper.make_graph(nodes, "top_k_detector",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 100, 5])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def test_a_top_k_output_is_scored_on_what_it_picks_from() -> None:
    """With every activation int16 the model is all but lossless: its score says so (the top-k
    list's own cosine stayed at 0.99 whatever the precision, the order of near ties flipping)."""
    optimized = optimize.run(_top_k_detector())
    profile = get_profile("bayes-e")
    plan = make_plan(optimized, build_partition(optimized, profile, {}), None, profile)
    plan = plan.with_bits({p.tensor: 16 for p in plan.activations})
    scored = scored_tensors(optimized)
    rng = np.random.default_rng(3)
    feeds = [{"x": rng.uniform(0, 1, (1, 3, 16, 16)).astype(np.float32)} for _ in range(4)]
    tensors = [p.tensor for p in plan.activations]
    names = list(dict.fromkeys([*tensors, *scored]))
    floats = fetching_session(optimized, names)
    values = [dict(zip(names, floats.run(names, f), strict=True)) for f in feeds]
    th = {t: float(max(np.abs(v[t]).max() for v in values)) for t in tensors}
    evaluator = Evaluator(optimized, plan, weight_thresholds(optimized, plan), feeds,
                          [[v[t] for t in scored] for v in values], th)
    assert evaluator.score(th) > 0.9999
    assert "y" not in scored and {"boxes", "best"} <= set(scored)


def test_an_in_graph_nms_is_scored_on_its_boxes_and_scores() -> None:
    """NonMaxSuppression's selected indices say which boxes the data chose: its boxes and scores
    are what a score compares (the indices' cosine compares choices)."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[1, 1], name="conv"),
             helper.make_node("Reshape", ["c", "flat"], ["cf"], name="flatten"),
             helper.make_node("Split", ["cf", "parts"], ["box", "cls"], axis=1, name="split"),
             helper.make_node("Transpose", ["box"], ["boxes"], perm=[0, 2, 1], name="boxes"),
             helper.make_node("Sigmoid", ["cls"], ["scores"], name="scores"),
             helper.make_node("NonMaxSuppression", ["boxes", "scores", "keep", "iou", "least"], ["y"], name="nms")]
    inits = [numpy_helper.from_array((rng.standard_normal((5, 3, 1, 1)) * 0.5).astype(np.float32), "w"),
             numpy_helper.from_array(np.array([1, 5, 64], np.int64), "flat"),
             numpy_helper.from_array(np.array([4, 1], np.int64), "parts"),
             numpy_helper.from_array(np.array([10], np.int64), "keep"),
             numpy_helper.from_array(np.array([0.5], np.float32), "iou"),
             numpy_helper.from_array(np.array([0.2], np.float32), "least")]
    graph = helper.make_graph(nodes, "nms", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.INT64, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    assert scored_tensors(optimize.run(model)) == ["boxes", "scores"]


def test_a_greedy_decoder_loop_is_scored_on_what_it_reads() -> None:
    """A Loop whose body decides by value (each step's ArgMax fed back: SLANet's table decoder, captioning)
    gives outputs that follow near ties: every calibration method scored 0.64-0.77 and a WARNING blamed
    values the integer grids cannot hold. The tensors the body reads from the encoder are scored."""
    rng = np.random.default_rng(5)
    body = helper.make_graph(
        [helper.make_node("Gather", ["feats", "token_in"], ["row"], axis=1, name="embed"),
         helper.make_node("Add", ["row", "feats0"], ["logits"], name="step_logits"),
         helper.make_node("ArgMax", ["logits"], ["token_out"], axis=-1, keepdims=0, name="greedy"),
         helper.make_node("Identity", ["cond_in"], ["cond_out"], name="go_on"),
         helper.make_node("Identity", ["token_out"], ["emitted"], name="emit")],
        "decoder_step",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("token_in", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("token_out", TensorProto.INT64, [1]),
         helper.make_tensor_value_info("emitted", TensorProto.INT64, [1])])
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[1, 1], name="encoder"),
             helper.make_node("Reshape", ["c", "rows"], ["feats"], name="feats"),
             helper.make_node("ReduceMean", ["feats"], ["feats0"], axes=[1], keepdims=0, name="feats0"),
             helper.make_node("Loop", ["steps", "", "start"], ["last", "tokens"], body=body, name="decoder")]
    inits = [numpy_helper.from_array((rng.standard_normal((8, 3, 1, 1)) * 0.5).astype(np.float32), "w"),
             numpy_helper.from_array(np.array([1, 8, 16], np.int64), "rows"),
             numpy_helper.from_array(np.array(6, np.int64), "steps"),
             numpy_helper.from_array(np.array([0], np.int64), "start")]
    graph = helper.make_graph(nodes, "decoder", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 4])],
                              [helper.make_tensor_value_info("tokens", TensorProto.INT64, [6, 1])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    scored = scored_tensors(model)
    assert "tokens" not in scored and set(scored) == {"feats", "feats0"}, scored


def test_an_argmax_output_is_scored_on_the_logits_it_reads() -> None:
    """A segmentation model ending in ArgMax (the vendor's advice for segmenters) or a SimCC keypoint head decoding
    bins: its class or bin indices were scored by their cosine, which says nothing of the error (an index off by
    one class counts by how far the class numbers lie apart)."""
    rng = np.random.default_rng(1)
    nodes = [helper.make_node("Conv", ["x", "w"], ["logits"], kernel_shape=[1, 1], name="classes"),
             helper.make_node("ArgMax", ["logits"], ["label"], axis=1, keepdims=0, name="label"),
             helper.make_node("Cast", ["label"], ["labelf"], to=TensorProto.FLOAT, name="cast"),
             helper.make_node("Mul", ["labelf", "step"], ["y"], name="decode")]
    inits = [numpy_helper.from_array((rng.standard_normal((6, 3, 1, 1))).astype(np.float32), "w"),
             numpy_helper.from_array(np.array(0.5, np.float32), "step")]
    graph = helper.make_graph(nodes, "segmenter", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("label", TensorProto.INT64, [1, 8, 8]),
                               helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 8])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    assert set(scored_tensors(optimize.run(model))) == {"logits"}  # both outputs: the index map, its decoding


def _query_selection() -> FloatModel:
    """An RT-DETR's query selection: the 10 tokens (a Linear's output) of the best class score (TopK,
    GatherElements at its indices), then a Linear on the picked queries (the box head) beside their scores."""
    rng = np.random.default_rng(2)

    def ints(values: list[int], name: str) -> onnx.TensorProto:
        return numpy_helper.from_array(np.array(values, np.int64), name)

    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[3, 3], pads=[1] * 4, strides=[2, 2],
                              name="backbone"),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Reshape", ["r", "flat"], ["rows"], name="flatten"),
             helper.make_node("Transpose", ["rows"], ["pixels"], perm=[0, 2, 1], name="pixels"),
             helper.make_node("MatMul", ["pixels", "w_embed"], ["embedded"], name="embed"),
             helper.make_node("LayerNormalization", ["embedded", "ln_scale", "ln_bias"], ["tokens"], axis=-1,
                              name="norm"),
             helper.make_node("ReduceMax", ["tokens"], ["best"], axes=[2], keepdims=0, name="best"),
             helper.make_node("TopK", ["best", "k"], ["top", "idx"], axis=1, name="topk"),
             helper.make_node("Unsqueeze", ["idx", "last"], ["idx3"], name="idx3"),
             helper.make_node("Tile", ["idx3", "reps"], ["idx8"], name="idx8"),
             helper.make_node("GatherElements", ["tokens", "idx8"], ["queries"], axis=1, name="queries"),
             helper.make_node("Sigmoid", ["queries"], ["scores"], name="scores"),
             helper.make_node("MatMul", ["queries", "w_box"], ["box_rows"], name="box_head"),
             helper.make_node("Add", ["box_rows", "b_box"], ["boxes"], name="box_bias")]
    inits = [numpy_helper.from_array(rng.normal(0, 0.3, (8, 3, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.normal(0, 0.3, (8, 8)).astype(np.float32), "w_embed"),
             numpy_helper.from_array(rng.normal(0, 0.3, (8, 4)).astype(np.float32), "w_box"),
             numpy_helper.from_array(rng.normal(0, 0.3, 4).astype(np.float32), "b_box"),
             numpy_helper.from_array(rng.uniform(0.5, 1.5, 8).astype(np.float32), "ln_scale"),
             numpy_helper.from_array(rng.normal(0, 0.2, 8).astype(np.float32), "ln_bias"),
             ints([1, 8, 64], "flat"), ints([10], "k"), ints([2], "last"), ints([1, 1, 8], "reps")]
    graph = helper.make_graph(nodes, "query_selection",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, 10, 8]),
                               helper.make_tensor_value_info("boxes", TensorProto.FLOAT, [1, 10, 4])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return FloatModel(onnx.shape_inference.infer_shapes(model), {"x": [1, 3, 16, 16]})


@pytest.mark.parametrize("calibration_type", ["default", "mix"])
def test_a_learned_layer_after_a_top_k_pick_is_calibrated_by_the_search(tmp_path: Path,
                                                                         calibration_type: str) -> None:
    """The box head's weight and bias reach its output through their calibration nodes in the calibrated
    model: they were taken there for tensors the output is picked from, the calibrated model's scored tensors
    outnumbered the float model's, and the search stopped with an internal IndexError (RT-DETR, hunt 16 D1).
    The tensors both outputs pick from are scored once each, in the calibrated model as the pick reads them
    (the tokens on their grid)."""
    project = make_project(tmp_path, _query_selection(), cal_count=4, calibration_type=calibration_type)
    paths = makertbin(project.config_path, "onnx")
    assert paths["bin"].is_file()
    assert scored_tensors(onnx.load(str(paths["optimized"]))) == ["tokens", "best"]
    calibrated = onnx.load(str(paths["calibrated"]))
    made_by = {o: n for n in calibrated.graph.node for o in n.output}
    assert made_by["tokens_calibrated"].op_type == "HzCalibration"
    assert scored_tensors(calibrated) == ["tokens_calibrated", "best"]
