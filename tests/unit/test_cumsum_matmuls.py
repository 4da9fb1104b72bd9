"""CumSum as a MatMul by a triangle of ones: no BPU takes CumSum, and Mamba's selective scan in its parallel form
(two CumSums over the tokens per block) split a 4-block model into 13 BPU subgraphs (hunt 16 N3)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from conformance import convert_featuremaps
from onnx import TensorProto, helper, numpy_helper

from hbtools.march.profiles import get_profile
from hbtools.pipeline import optimize
from hbtools.runtime import HB_ONNXRuntime


def _cumsum_model(shape: list[int], axis: int, exclusive: int = 0, reverse: int = 0):
    """Conv 1x1 -> CumSum(axis) -> Conv 1x1 on a 4-D map, or CumSum alone on another rank."""
    rng = np.random.default_rng(abs(axis) + 2 * exclusive + 4 * reverse)
    inits = [numpy_helper.from_array(np.array([axis], np.int64), "axis")]
    nodes = [helper.make_node("CumSum", ["x", "axis"], ["y"], name="scan", exclusive=exclusive, reverse=reverse)]
    if len(shape) == 4:
        c = shape[1]
        inits += [numpy_helper.from_array((rng.standard_normal((c, c, 1, 1)) * 0.5).astype(np.float32), "w1"),
                  numpy_helper.from_array((rng.standard_normal((c, c, 1, 1)) * 0.5).astype(np.float32), "w2")]
        nodes = [helper.make_node("Conv", ["data", "w1"], ["x"], name="pre"), *nodes,
                 helper.make_node("Conv", ["y", "w2"], ["out"], name="post")]
    first, last = ("data", "out") if len(shape) == 4 else ("x", "y")
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(first, TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info(last, TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    return model


def _run(model, feeds: dict) -> np.ndarray:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]


@pytest.mark.parametrize("shape, axis", [([2, 3, 5, 7], 3), ([2, 3, 5, 7], -1), ([2, 3, 5, 7], 2), ([2, 3, 5, 7], 1),
                                         ([2, 3, 5, 7], 0), ([4, 9], 1), ([4, 9], 0), ([11], 0)])
@pytest.mark.parametrize("exclusive, reverse", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_a_cumsum_is_a_product_by_its_triangle(shape: list[int], axis: int, exclusive: int, reverse: int) -> None:
    model = _cumsum_model(shape, axis, exclusive, reverse)
    optimized = optimize.run(model, get_profile("bayes-e"))
    assert not any(n.op_type == "CumSum" for n in optimized.graph.node)
    x = {model.graph.input[0].name: np.random.default_rng(7).standard_normal(shape).astype(np.float32)}
    np.testing.assert_allclose(_run(optimized, x), _run(model, x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("axis", [3, 1])
def test_a_scan_over_the_tokens_runs_on_the_bpu(tmp_path: Path, axis: int) -> None:
    """Over the last axis, and over the channels of a map (a Mamba block's tokens, with the state after them)."""
    model = _cumsum_model([1, 8, 4, 16], axis)
    rng = np.random.default_rng(3)
    samples = [rng.standard_normal((1, 8, 4, 16)).astype(np.float32) for _ in range(4)]
    out = convert_featuremaps(tmp_path, model, {"data": samples}, "1x8x4x16", "float32", "m",
                              calibration_type="max")
    assert "1 CumSums written as MatMuls by a triangle of ones" in out, out[-3000:]
    assert "The model has 1 BPU subgraph(s) and 0 CPU node(s)" in out, out[-3000:]
    x = rng.standard_normal((1, 8, 4, 16)).astype(np.float32)
    want = _run(model, {"data": x})
    got = HB_ONNXRuntime(model_file=str(tmp_path / "out" / "m_quantized_model.onnx")).run(None, {"data": x})[0]
    assert np.abs(got - want).max() <= 0.05 * np.abs(want).max()  # a few int8 steps of the sums' range
