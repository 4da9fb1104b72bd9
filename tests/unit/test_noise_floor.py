"""benchmarks/noise_floor.py: which weights get noise, and how much."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import noise_floor  # noqa: E402


def _model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    conv_w = rng.normal(0, 1, (4, 3, 3, 3)).astype(np.float32)
    conv_w[1] *= 100  # channels far apart: each gets its own step
    gemm_w = rng.normal(0, 1, (5, 4)).astype(np.float32)  # transB: output channels on axis 0
    matmul_w = rng.normal(0, 1, (5, 6)).astype(np.float32)  # a Constant node; output channels last
    bias = rng.normal(0, 1, (4,)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "conv_w", "bias"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("GlobalAveragePool", ["c"], ["g"]),
             helper.make_node("Flatten", ["g"], ["f"]),
             helper.make_node("Gemm", ["f", "gemm_w"], ["y"], transB=1),
             helper.make_node("Constant", [], ["matmul_w"], value=numpy_helper.from_array(matmul_w, "matmul_w")),
             helper.make_node("MatMul", ["y", "matmul_w"], ["z"])]
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 6])],
                              [numpy_helper.from_array(conv_w, "conv_w"), numpy_helper.from_array(gemm_w, "gemm_w"),
                               numpy_helper.from_array(bias, "bias")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def _weights(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    out = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    out.update({n.output[0]: numpy_helper.to_array(n.attribute[0].t) for n in model.graph.node
                if n.op_type == "Constant"})
    return out


def test_every_weight_moves_within_half_a_step_of_its_channels_int8_grid() -> None:
    model = _model()
    before, after = _weights(model), _weights(noise_floor.perturbed(model, seed=0))
    np.testing.assert_array_equal(after["bias"], before["bias"])  # not a weight int8 would quantize
    for name, axis in (("conv_w", 0), ("gemm_w", 0), ("matmul_w", 1)):
        w, noisy = before[name], after[name]
        others = tuple(a for a in range(w.ndim) if a != axis)
        step = np.abs(w).max(axis=others, keepdims=True) / 127
        moved = np.abs(noisy - w)
        assert (moved <= step / 2 * (1 + 1e-5)).all(), name
        assert (moved > 0).mean() > 0.99, name  # every weight gets noise
        assert (moved.max(axis=others, keepdims=True) > step / 4).all(), name  # of its own channel's size
    assert not np.array_equal(_weights(noise_floor.perturbed(model, seed=1))["conv_w"], after["conv_w"])
