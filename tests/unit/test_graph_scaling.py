"""Graph utilities on large graphs: linear where onnx or onnxruntime would be quadratic, same results."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from hbtools.graph.graph import infer_shapes, topological_sort
from hbtools.runtime.session import ort_session


def _chain(n: int) -> list:
    return [helper.make_node("Relu", [f"t{k}"], [f"t{k + 1}"], name=f"n{k}") for k in range(n)]


def _model(nodes: list, inputs: list, outputs: list):
    graph = helper.make_graph(nodes, "g", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def test_topological_sort_orders_a_shuffled_graph_and_keeps_a_sorted_one() -> None:
    nodes = _chain(200)
    x = [helper.make_tensor_value_info("t0", TensorProto.FLOAT, [2])]
    y = [helper.make_tensor_value_info("t200", TensorProto.FLOAT, [2])]
    model = _model(nodes, x, y)
    topological_sort(model)
    assert [n.name for n in model.graph.node] == [f"n{k}" for k in range(200)]
    shuffled = _model([nodes[k] for k in np.random.default_rng(0).permutation(200)], x, y)
    topological_sort(shuffled)
    assert [n.name for n in shuffled.graph.node] == [f"n{k}" for k in range(200)]
    loop = [helper.make_node("Relu", ["b"], ["a"], name="p"), helper.make_node("Relu", ["a"], ["b"], name="q")]
    cyclic = _model(loop, x, y)
    with pytest.raises(ValueError, match="cycle or a dangling input"):
        topological_sort(cyclic)


def test_switches_infer_the_shapes_onnx_infers() -> None:
    """An If on a graph-input flag whose branches hand on outer tensors (a debugger / search switch)
    gets its pick's shape, as onnx's own inference of the If gives."""
    nodes, inputs = [], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4])]
    x = "x"
    for k in range(3):
        inputs.append(helper.make_tensor_value_info(f"on{k}", TensorProto.BOOL, []))
        nodes.append(helper.make_node("Mul", [x, x], [f"sq{k}"], name=f"mul{k}"))
        branches = {f"{b}_branch": helper.make_graph(
            [helper.make_node("Identity", [src], [f"pick{k}{b}"])], f"g{k}{b}", [],
            [helper.make_tensor_value_info(f"pick{k}{b}", TensorProto.FLOAT, None)])
            for b, src in (("then", f"sq{k}"), ("else", x))}
        nodes.append(helper.make_node("If", [f"on{k}"], [f"s{k}"], name=f"if{k}", **branches))
        x = f"s{k}"
    model = _model(nodes, inputs, [helper.make_tensor_value_info(x, TensorProto.FLOAT, None)])
    inferred = infer_shapes(model)
    shapes = {vi.name: [d.dim_value for d in vi.type.tensor_type.shape.dim]
              for vi in [*inferred.graph.value_info, *inferred.graph.output]}
    assert shapes["s2"] == shapes["s0"] == shapes["sq1"] == [1, 3, 4]
    assert len(inferred.graph.node) == 6 and inferred.graph.node[1].op_type == "If"  # the model keeps its Ifs


def test_a_session_fed_thousands_of_inputs_still_checks_them() -> None:
    """The fed names are checked as onnxruntime checks them (a missing input raises), only in linear time."""
    n = 3000
    nodes = [helper.make_node("Sum", [f"x{k}" for k in range(n)], ["y"], name="sum")]
    inputs = [helper.make_tensor_value_info(f"x{k}", TensorProto.FLOAT, [1]) for k in range(n)]
    session = ort_session(_model(nodes, inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])]))
    feed = {f"x{k}": np.ones(1, np.float32) for k in range(n)}
    assert session.run(None, feed)[0][0] == n
    del feed["x7"]
    with pytest.raises(ValueError, match="x7"):
        session.run(None, feed)
    assert isinstance(session, ort.InferenceSession)


def test_a_view_of_an_edited_model_infers_its_new_shapes() -> None:
    """Views of an unchanged model share one shape inference; an edit anywhere inference reads (a node, a small
    constant such as a Reshape's target, a large constant's dims) gives the new shapes, not the remembered ones."""
    from onnx import numpy_helper

    from hbtools.graph.graph import GraphView

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
             helper.make_node("Reshape", ["m", "shape"], ["y"], name="r")]
    model = _model(nodes, [x], [y])
    model.graph.initializer.extend([numpy_helper.from_array(np.ones((4, 2048), np.float32), "w"),
                                    numpy_helper.from_array(np.array([6, -1], np.int64), "shape")])
    assert GraphView(model).shapes["y"] == [6, 2048]
    assert GraphView(model).shapes["y"] == [6, 2048]  # the same model again
    model.graph.initializer[1].CopyFrom(numpy_helper.from_array(np.array([3, -1], np.int64), "shape"))
    assert GraphView(model).shapes["y"] == [3, 4096]
    model.graph.initializer[0].CopyFrom(numpy_helper.from_array(np.ones((4, 1024), np.float32), "w"))
    assert GraphView(model).shapes["y"] == [3, 2048]
    model.graph.node[1].CopyFrom(helper.make_node("Relu", ["m"], ["y"], name="r"))
    assert GraphView(model).shapes["y"] == [2, 3, 1024]
