"""TorchScript writes ``for i in range(3): f = f + relu(conv(f))`` as a Loop of a constant trip count; as a Loop it
ran in float on the CPU, convolutions and all, and the checker named only the Loop (hunt 48 D9). Such a Loop (the
condition true throughout, no scan outputs) is written out step by step; one whose condition the data decides
stays."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from builders import checked, optimized_agreeing
from onnx import TensorProto, helper, numpy_helper


def _refined(condition: str) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    body_nodes = [helper.make_node("Conv", ["f_in", "w2"], ["c"], pads=[1, 1, 1, 1]),
                  helper.make_node("Relu", ["c"], ["r"]),
                  helper.make_node("Mul", ["r", "half"], ["step"]),
                  helper.make_node("Add", ["f_in", "step"], ["f_out"])]
    if condition == "data":  # go on while the mean is below a bound
        body_nodes += [helper.make_node("ReduceMean", ["f_out"], ["m"], keepdims=0),
                       helper.make_node("Less", ["m", "bound"], ["cond_out"])]
    else:
        body_nodes.append(helper.make_node("Identity", ["cond_in"], ["cond_out"]))
    body = helper.make_graph(
        body_nodes, "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []), helper.make_tensor_value_info("cond_in",
                                                                                                  TensorProto.BOOL, []),
         helper.make_tensor_value_info("f_in", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("f_out", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array(0.5, np.float32), "half")])
    nodes = [helper.make_node("Conv", ["x", "w1"], ["f0"], pads=[1, 1, 1, 1], name="stem"),
             helper.make_node("Constant", [], ["trip"], value=numpy_helper.from_array(np.array(3, np.int64))),
             helper.make_node("Constant", [], ["go"], value=numpy_helper.from_array(np.array(True))),
             helper.make_node("Loop", ["trip", "go", "f0"], ["f3"], body=body, name="refine"),
             helper.make_node("Conv", ["f3", "w3"], ["y"], name="head")]
    inits = [numpy_helper.from_array((rng.standard_normal(s) * 0.2).astype(np.float32), n)
             for n, s in (("w1", (8, 3, 3, 3)), ("w2", (8, 8, 3, 3)), ("w3", (4, 8, 1, 1)))]
    inits.append(numpy_helper.from_array(np.array(10.0, np.float32), "bound"))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("condition", ["true", "data"])
def test_a_loop_of_a_constant_trip_count_is_written_out(tmp_path: Path, condition: str) -> None:
    model = _refined(condition)
    x = np.random.default_rng(1).normal(0, 1, (1, 3, 8, 8)).astype(np.float32)
    optimized = optimized_agreeing(model, "bayes-e", {"x": x})
    assert ("Loop" in {n.op_type for n in optimized.graph.node}) == (condition == "data")
    output = checked(model, "bayes-e", tmp_path)
    assert ("1 BPU subgraph(s) and 0 CPU node(s)" in output) == (condition == "true"), output
    if condition == "data":  # the reason says what runs in float with it
        assert "Loop is not supported on the BPU of bayes-e (RDK X5): its 6 inner nodes (1 Conv / Gemm / MatMul) run " \
            "in float on the CPU with it; a Loop of a constant trip count" in output, output
