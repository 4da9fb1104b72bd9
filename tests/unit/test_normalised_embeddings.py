"""An L2-normalised output (face recognition, re-identification embeddings) keeps its unit norm on inputs
whose features are smaller or larger than the calibration samples'."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from conformance import convert_featuremaps
from onnx import TensorProto, helper, numpy_helper

from hbtools.runtime import HB_ONNXRuntime

F = TensorProto.FLOAT


def _embedding_model() -> onnx.ModelProto:
    """Conv, ReLU, a conv to a 64-value embedding and ``F.normalize`` as torch exports it: ReduceL2, Clip at
    an epsilon, Expand to the embedding's shape, Div. Without biases the features scale with the input."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal((16, 3, 3, 3)) * 0.3).astype(np.float32), "w1"),
             numpy_helper.from_array((rng.standard_normal((64, 16, 8, 8)) * 0.05).astype(np.float32), "w2"),
             numpy_helper.from_array(np.array(1e-12, np.float32), "eps")]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], strides=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2"], ["c2"]),
             helper.make_node("Flatten", ["c2"], ["f"]),
             helper.make_node("ReduceL2", ["f"], ["n"], axes=[1], keepdims=1),
             helper.make_node("Clip", ["n", "eps", ""], ["nc"]),
             helper.make_node("Shape", ["f"], ["shape"]),
             helper.make_node("Expand", ["nc", "shape"], ["ne"]),
             helper.make_node("Div", ["f", "ne"], ["embedding"])]
    graph = helper.make_graph(nodes, "embedding", [helper.make_tensor_value_info("x", F, [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("embedding", F, [1, 64])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def test_a_normalised_embedding_keeps_its_unit_norm_beyond_the_calibrated_range(tmp_path: Path) -> None:
    """The squares and their sum were int8 (the small squares rounded to 0) and the norm and its reciprocal
    were clipped at the calibration samples' range: features a third as large came out with norm 0.5, larger
    ones 1.1. The cosine the searches score cannot see a per-sample scale. Now squares, sums of squares and
    both sides of a reciprocal table are int16 with room beyond the calibrated max."""
    model = _embedding_model()
    rng = np.random.default_rng(1)
    samples = [rng.standard_normal((1, 3, 16, 16)).astype(np.float32) for _ in range(8)]
    out = convert_featuremaps(tmp_path, model, {"x": samples}, "1x3x16x16", "float32", "m")
    assert "ERROR" not in out
    quantized = HB_ONNXRuntime(model_file=str(tmp_path / "out" / "m_quantized_model.onnx"))
    source = HB_ONNXRuntime(onnx_model=model)
    for gain in (0.3, 1.0, 1.4):  # the features scale with the input (no biases)
        x = {"x": (gain * rng.standard_normal((1, 3, 16, 16))).astype(np.float32)}
        want, got = source.run(None, x)[0], quantized.run(None, x)[0]
        assert abs(float(np.linalg.norm(got)) - 1.0) < 0.01, (gain, float(np.linalg.norm(got)))
        assert float(np.dot(want.ravel(), got.ravel()) / np.linalg.norm(got)) > 0.99  # the direction: int8 error
