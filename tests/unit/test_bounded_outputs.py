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
