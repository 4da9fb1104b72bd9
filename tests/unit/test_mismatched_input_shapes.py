"""Input shapes given to a model of open sizes that do not fit its layers together (two images of different
widths into a Sub): the model is a plain traced one, so the ERROR names the shapes and the node they meet at and
asks for shapes the model can take, not a re-export with fixed sizes, which is the advice for a model whose control
flow changes with its sizes (test_scalar_int_input keeps that case) (hunt 51 D4)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from conformance import _cli
from onnx import TensorProto, helper, numpy_helper


def _pair(tmp_path: Path) -> Path:
    """Inputs a and b of open sizes [N, 3, H, W] through one Conv each, joined by a Sub."""
    w = numpy_helper.from_array((np.random.default_rng(0).standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32),
                                "w")
    nodes = [helper.make_node("Conv", ["a", "w"], ["fa"], name="conv_a", pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["b", "w"], ["fb"], name="conv_b", pads=[1, 1, 1, 1]),
             helper.make_node("Sub", ["fa", "fb"], ["y"], name="diff")]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["N", 3, "H", "W"]) for n in ("a", "b")]
    graph = helper.make_graph(nodes, "pair", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "pair.onnx")
    return tmp_path / "pair.onnx"


def _checker(model: Path, shapes: dict[str, str], cwd: Path) -> tuple[int, str, list[str]]:
    args = ["checker", "--model-type", "onnx", "--march", "bayes-e", "--model", str(model)]
    for name, shape in shapes.items():
        args += ["--input-shape", name, shape]
    code, out = _cli(args, cwd)
    return code, out, [line for line in out.splitlines() if " ERROR " in line and "exception in command" not in line]


def test_input_shapes_that_do_not_fit_together_are_named_with_the_node_they_meet_at(tmp_path: Path) -> None:
    model = _pair(tmp_path)
    code, out, errors = _checker(model, {"a": "1x3x16x16", "b": "1x3x16x12"}, tmp_path)
    assert code != 0, out
    assert len(errors) == 1, errors  # one line, as before
    assert "the input shapes given do not fit together (a 1x3x16x16, b 1x3x16x12) at node 'diff' (Sub)" in errors[0]
    assert "give input shapes the model can take" in errors[0], errors
    assert "export it with fixed input sizes" not in errors[0] and "own structure" not in errors[0], errors

    code, out, errors = _checker(model, {"a": "1x3x16x16", "b": "1x3x16x16"}, tmp_path)  # shapes that fit
    assert code == 0 and not errors, out
    assert "1 BPU subgraph(s) and 0 CPU node(s)" in out, out


def test_one_input_shape_a_layer_refuses_names_that_layer(tmp_path: Path) -> None:
    """One input of open sizes added to a constant 8x8 map: a 8x6 input_shape does not fit that Add."""
    bias = numpy_helper.from_array(np.ones((1, 3, 8, 8), np.float32), "bias")
    graph = helper.make_graph([helper.make_node("Add", ["x", "bias"], ["y"], name="add_bias")], "one",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, "H", "W"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [bias])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "one.onnx")
    code, out, errors = _checker(tmp_path / "one.onnx", {"x": "1x3x8x6"}, tmp_path)
    assert code != 0, out
    assert len(errors) == 1, errors
    assert "the input shape given (x 1x3x8x6) does not fit node 'add_bias' (Add)" in errors[0], errors
    assert "check input_shape" in errors[0] and "export it with fixed input sizes" not in errors[0], errors
