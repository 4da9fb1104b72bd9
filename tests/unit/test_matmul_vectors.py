"""A MatMul with a 1-D operand runs on the BPU.

A batchless model's mean over its frames (ReduceMean keepdims=0 of [T, C] gives [C]) times a [C, N] weight,
or a matrix times a [K] vector: 'MatMul on a 1-D tensor [16]: the BPU ... takes 2-D to 5-D tensors only'
put the MatMul, and everything after it, on the CPU. ONNX defines the 1-D product through the 2-D one, which
the optimize stage now writes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from builders import _Graph
from conformance import convert_and_check
from onnx import TensorProto, helper, numpy_helper

from hbtools.march.profiles import get_profile
from hbtools.pipeline import optimize
from hbtools.runtime.binfile import read_bin


def _matmul_model(a: list[int], b: list[int], const: str, opset: int) -> onnx.ModelProto:
    """Relu(a) @ b with ``const`` naming the operand given as an initializer ("", "a" or "b")."""
    rng = np.random.default_rng(len(a) * 10 + len(b) + opset)
    inputs, inits = [], []
    for name, shape in (("a", a), ("b", b)):
        if name == const:
            inits.append(numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name))
        else:
            inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, shape))
    nodes = [helper.make_node("Relu", ["a"], ["ra"], name="relu") if const != "a" else
             helper.make_node("Identity", ["a"], ["ra"], name="relu"),
             helper.make_node("MatMul", ["ra", "b"], ["y"], name="mm")]
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 7
    return model


@pytest.mark.parametrize("a, b, const, opset", [
    ([16], [16, 8], "b", 13), ([16], [16, 8], "b", 11), ([16], [16, 8], "", 13), ([16], [3, 16, 8], "", 11),
    ([2, 3, 16], [16], "b", 13), ([5, 16], [16], "", 11), ([16], [16], "", 13), ([16], [16, 8], "a", 13),
])
def test_matmuls_of_vectors_keep_their_values(a: list[int], b: list[int], const: str, opset: int) -> None:
    """No MatMul of the optimized model reads a 1-D tensor; the output keeps its name, shape and values."""
    model = _matmul_model(a, b, const, opset)
    optimized = optimize.run(model, get_profile("bayes-e"))
    inferred = onnx.shape_inference.infer_shapes(optimized)
    ranks = {v.name: len(v.type.tensor_type.shape.dim) for v in [*inferred.graph.value_info, *inferred.graph.input]}
    ranks.update({t.name: len(t.dims) for t in inferred.graph.initializer})
    matmuls = [n for n in inferred.graph.node if n.op_type == "MatMul"]
    assert matmuls and all(ranks[i] >= 2 for n in matmuls for i in n.input), [ranks[i] for i in matmuls[0].input]
    rng = np.random.default_rng(3)
    feed = {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
            for i in model.graph.input}
    run = [ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(["y"], feed)[0]
           for m in (model, optimized)]
    assert run[0].shape == run[1].shape
    np.testing.assert_allclose(run[1], run[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("calibration_type", ["max", "default"])
def test_a_mean_over_the_frames_times_weights_runs_on_the_bpu(tmp_path: Path, calibration_type: str) -> None:
    """[T, C] frames, their mean over T without keepdims ([C]), MatMul, Relu, MatMul: one BPU subgraph, no
    CPU node, close to float, and hb_verifier passes (convert_and_check)."""
    g = _Graph(5)
    h = g.op("Relu", [g.op("MatMul", ["feat", g.const(g.rng.standard_normal((8, 16)).astype(np.float32))])])
    m = g.op("ReduceMean", [h], axes=[0], keepdims=0)
    h = g.op("Relu", [g.op("MatMul", [m, g.const(g.rng.standard_normal((16, 16)).astype(np.float32) * 0.3)])])
    out = g.op("MatMul", [h, g.const(g.rng.standard_normal((16, 4)).astype(np.float32))])
    fm = g.model({"feat": [50, 8]}, [out], opset=13, featuremap={"feat"})
    outcome = convert_and_check(fm, tmp_path, calibration_type=calibration_type)
    assert not outcome.cpu, outcome.placement()
    assert len(read_bin(outcome.project.artefact("bin")).models[0].partition["subgraphs"]) == 1
    assert min(outcome.cosine) >= 0.99, outcome.cosine
