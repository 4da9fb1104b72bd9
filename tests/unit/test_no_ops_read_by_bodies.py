"""A Dropout whose output an If branch reads stayed in the optimized model, and the checker said "Dropout is not
supported on the BPU" (hunt 48 D10): it goes like any other, its readers inside the branch read its input."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from hbtools.march.profiles import get_profile
from hbtools.pipeline import optimize


def test_a_dropout_read_by_a_branch_goes() -> None:
    rng = np.random.default_rng(0)
    then_g = helper.make_graph([helper.make_node("Add", ["id_out", "id_out"], ["t_out"])], "then", [],
                               [helper.make_tensor_value_info("t_out", TensorProto.FLOAT, None)])
    else_g = helper.make_graph([helper.make_node("Mul", ["drop_out", "drop_out"], ["e_out"])], "else", [],
                               [helper.make_tensor_value_info("e_out", TensorProto.FLOAT, None)])
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Identity", ["r"], ["id_out"], name="ident"),
             helper.make_node("Dropout", ["id_out"], ["drop_out"], name="drop"),
             helper.make_node("ReduceMean", ["r"], ["m"], keepdims=0, name="mean"),
             helper.make_node("Greater", ["m", "zero"], ["cond"], name="gt"),
             helper.make_node("If", ["cond"], ["y"], then_branch=then_g, else_branch=else_g, name="if")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array((rng.standard_normal((4, 3, 3, 3)) * 0.3).astype(np.float32),
                                                       "w"),
                               numpy_helper.from_array(np.array(0.3, np.float32), "zero")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    optimized = optimize.run(model, get_profile("bayes-e"))
    assert not {"Dropout", "Identity"} & {n.op_type for n in optimized.graph.node}
    options = ort.SessionOptions()
    options.log_severity_level = 3
    for scale in (0.1, 5.0):  # both branches
        x = (rng.standard_normal((1, 3, 8, 8)) * scale).astype(np.float32)
        want, got = (ort.InferenceSession(m.SerializeToString(), options, providers=["CPUExecutionProvider"]).run(
            None, {"x": x})[0] for m in (model, optimized))
        np.testing.assert_array_equal(got, want)
