"""Shape inference declares large constants by type and shape only, and still infers every shape.

onnx's inference copies the model to C++ and back; hbtools gives it the large initializers
(weights, tables) as typed graph inputs instead. Shapes that hang on a constant's values (a
Reshape's target, a Resize's scales, a float Range) use small constants, which it keeps.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from hbtools.graph.graph import LARGE_CONSTANT, GraphView, infer_shapes


def _model():
    rng = np.random.default_rng(0)
    w = rng.normal(0, 0.1, (64, 16, 3, 3)).astype(np.float32)  # large: declared only
    table = np.arange(4096, dtype=np.int16)  # large integer constant, read by a Gather
    assert w.size >= LARGE_CONSTANT and table.size >= LARGE_CONSTANT
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(table, "table"),
             numpy_helper.from_array(np.array([1, 64, -1], np.int64), "flat"),
             numpy_helper.from_array(np.array([1.0, 1.0, 2.0, 2.0], np.float32), "scales"),
             numpy_helper.from_array(np.array(0.0, np.float32), "start"),
             numpy_helper.from_array(np.array(6.0, np.float32), "limit"),
             numpy_helper.from_array(np.array(1.5, np.float32), "delta"),
             numpy_helper.from_array(np.array([[3, 5]], np.int64), "idx")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Resize", ["c", "", "scales"], ["up"], mode="nearest"),
             helper.make_node("Reshape", ["up", "flat"], ["r"]),
             helper.make_node("Range", ["start", "limit", "delta"], ["steps"]),
             helper.make_node("Gather", ["table", "idx"], ["picked"])]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 8, 8])
    graph = helper.make_graph(nodes, "constants", [x], [helper.make_tensor_value_info(n, TensorProto.UNDEFINED, None)
                                                        for n in ("r", "steps", "picked")], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def test_shapes_from_small_constants_survive_and_large_ones_stay_in_the_model() -> None:
    model = _model()
    view = GraphView(model)
    assert view.shapes["c"] == [1, 64, 8, 8]
    assert view.shapes["up"] == [1, 64, 16, 16]
    assert view.shapes["r"] == [1, 64, 256]
    assert view.shapes["steps"] == [4]  # 0, 1.5, 3, 4.5
    assert view.shapes["picked"] == [1, 2]
    assert view.elem_types["picked"] == TensorProto.INT16
    inferred = infer_shapes(_model())
    # The model handed in keeps its weights as initializers and gains no inputs.
    assert [i.name for i in inferred.graph.input] == ["x"]
    assert {t.name for t in inferred.graph.initializer} >= {"w", "table"}
    assert numpy_helper.to_array(next(t for t in inferred.graph.initializer if t.name == "w")).shape == (64, 16, 3, 3)
    shapes = {o.name: [d.dim_value for d in o.type.tensor_type.shape.dim] for o in inferred.graph.output}
    assert shapes == {"r": [1, 64, 256], "steps": [4], "picked": [1, 2]}
