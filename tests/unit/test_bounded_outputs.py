"""An int16 grid after a bounded function (a Sigmoid's class scores) spans the function's range, so a
score above what the calibration pictures reached is not clipped to their maximum."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conformance import convert_featuremaps
from onnx import TensorProto, helper, numpy_helper

from hbtools.runtime import HB_ONNXRuntime


def _scores_model(op: str) -> object:
    """1x1 conv (weight 1: the logits are the input) -> ``op``: a detector's class scores."""
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["logits"], name="cls"),
             helper.make_node(op, ["logits"], ["scores"], name="score")]
    inits = [numpy_helper.from_array(np.ones((2, 2, 1, 1), np.float32) * np.eye(2, dtype=np.float32)[:, :, None, None],
                                     "w"),
             numpy_helper.from_array(np.zeros(2, np.float32), "b")]
    graph = helper.make_graph(nodes, "scores", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4])],
                              [helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, 2, 4, 4])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("op", ["Sigmoid", "Tanh"])
def test_a_score_beyond_the_calibration_pictures_is_not_clipped(tmp_path: Path, op: str) -> None:
    rng = np.random.default_rng(3)
    # logits mostly far below zero, as a detector's are; the highest score the calibration sees is about 0.6
    samples = [np.clip(rng.uniform(-8, 0.4, (1, 2, 4, 4)), -8, 0.4).astype(np.float32) for _ in range(8)]
    for s in samples:
        s[0, 0, 0, 0] = 0.4
    convert_featuremaps(tmp_path, _scores_model(op), {"x": samples}, "1x2x4x4", "float32", "m",
                        calibration_type="max")
    x = np.full((1, 2, 4, 4), -3.0, np.float32)
    x[0, 1, 2, 2] = 2.0  # a confident detection on a new picture: score 0.88 (Tanh 0.96)
    want = {"Sigmoid": 1 / (1 + np.exp(-x)), "Tanh": np.tanh(x)}[op]
    for kind in ("calibrated", "quantized"):
        got = HB_ONNXRuntime(model_file=str(tmp_path / "out" / f"m_{kind}_model.onnx")).run(None, {"x": x})[0]
        assert abs(float(got[0, 1, 2, 2]) - float(want[0, 1, 2, 2])) < 0.01, (kind, got[0, 1, 2, 2], want[0, 1, 2, 2])
        np.testing.assert_allclose(got, want, atol=0.01)


def _box_size_model() -> object:
    """YOLOv5's box size decode: ``(2 * sigmoid(t)) ** 2 * anchor``, at most 4 anchors whatever ``t`` is."""
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["t"], name="box"),
             helper.make_node("Sigmoid", ["t"], ["s"], name="sigmoid"),
             helper.make_node("Mul", ["s", "two"], ["s2"], name="twice"),
             helper.make_node("Pow", ["s2", "two"], ["sq"], name="squared"),
             helper.make_node("Mul", ["sq", "anchor"], ["wh"], name="anchored")]
    inits = [numpy_helper.from_array(np.eye(2, dtype=np.float32)[:, :, None, None], "w"),
             numpy_helper.from_array(np.zeros(2, np.float32), "b"),
             numpy_helper.from_array(np.array(2.0, np.float32), "two"),
             numpy_helper.from_array(np.array([30.0, 60.0], np.float32).reshape(1, 2, 1, 1), "anchor")]
    graph = helper.make_graph(nodes, "boxes", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4])],
                              [helper.make_tensor_value_info("wh", TensorProto.FLOAT, [1, 2, 4, 4])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def test_a_box_larger_than_the_calibration_pictures_gave_is_not_clipped(tmp_path: Path) -> None:
    """The bound carries through the decode's products and powers (4 anchors: 240 px): a box of 220 px on a new
    picture came out at the largest the calibration pictures gave (about 120 px), where the int16 grid ended."""
    rng = np.random.default_rng(4)
    samples = [rng.uniform(-4, 0.5, (1, 2, 4, 4)).astype(np.float32) for _ in range(8)]
    convert_featuremaps(tmp_path, _box_size_model(), {"x": samples}, "1x2x4x4", "float32", "m",
                        calibration_type="max", calibration={"optimization": "set_all_nodes_int16"})
    x = np.full((1, 2, 4, 4), -1.0, np.float32)
    x[0, 1, 1, 1] = 3.0  # a large object: 4 * sigmoid(3)^2 * 60 = 217 px
    want = (2 / (1 + np.exp(-x))) ** 2 * np.array([30.0, 60.0]).reshape(1, 2, 1, 1)
    got = HB_ONNXRuntime(model_file=str(tmp_path / "out" / "m_quantized_model.onnx")).run(None, {"x": x})[0]
    assert abs(float(got[0, 1, 1, 1]) - float(want[0, 1, 1, 1])) < 2.0, (got[0, 1, 1, 1], want[0, 1, 1, 1])
