"""The helpers that keep a model's weights from being copied: each gives what the plain way gives.

A shape probe and an opset conversion pass the structure without the large initializers; a session's
bytes are the lowered structure and its initializers put together by protobuf's merge; a view reads
an initializer when asked; integer levels are rounded in place.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import ModelProto, TensorProto, helper, numpy_helper, version_converter

from hbtools.graph.graph import (
    LARGE_CONSTANT,
    GraphView,
    compact,
    convert_opset,
    copy_model,
    large_constants,
    shape_probe,
)
from hbtools.quant import grids
from hbtools.runtime.session import ort_session, serialized


def _model(ir_inputs: bool = False) -> ModelProto:
    """Opset 9: a conv with a large weight, a small bias and an old-style Upsample (converted to Resize)."""
    rng = np.random.default_rng(0)
    w = rng.normal(0, 0.1, (16, 8, 3, 3)).astype(np.float32)
    assert w.size >= LARGE_CONSTANT
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.arange(16, dtype=np.float32), "b"),
             numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Upsample", ["c", "scales"], ["y"], mode="nearest")]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 6, 6])]
    if ir_inputs:  # IR 3 lists every initializer as a graph input too
        inputs += [helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in inits]
    graph = helper.make_graph(nodes, "m", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 9)])
    model.ir_version = 3 if ir_inputs else 7
    return model


def test_convert_opset_gives_the_converters_model() -> None:
    for ir_inputs in (False, True):
        model = _model(ir_inputs)
        before = model.SerializeToString()
        converted = convert_opset(model, 11)
        assert converted.SerializeToString() == version_converter.convert_version(model, 11).SerializeToString()
        assert model.SerializeToString() == before  # the source is only read


def test_shape_probe_holds_no_large_initializer_and_infers_the_same_shapes() -> None:
    for ir_inputs in (False, True):
        model = _model(ir_inputs)
        probe = shape_probe(model)
        assert large_constants(model) == {"w"}
        assert [t.name for t in probe.graph.initializer] == ["b", "scales"]
        assert sum(i.name == "w" for i in probe.graph.input) == 1
        full = onnx.shape_inference.infer_shapes(model)
        probed = onnx.shape_inference.infer_shapes(probe)
        assert {v.name: v.type for v in full.graph.value_info} == {v.name: v.type for v in probed.graph.value_info}


def test_serialized_is_the_model_with_the_initializers_appended() -> None:
    model = _model()
    structure = copy_model(model, lambda t: t.name == "b")
    constants = [t for t in model.graph.initializer if t.name != "b"]
    together = copy_model(structure, lambda _: True)
    together.graph.initializer.extend(constants)
    assert ModelProto.FromString(serialized(structure, constants)) == together
    assert serialized(model) == model.SerializeToString()


def test_a_session_from_a_structure_and_its_constants_computes_as_the_whole_model() -> None:
    model = onnx.version_converter.convert_version(_model(), 13)
    x = np.random.default_rng(1).normal(size=(1, 8, 6, 6)).astype(np.float32)
    whole = ort_session(model).run(None, {"x": x})[0]
    constants = list(model.graph.initializer)
    parts = ort_session(copy_model(model, lambda _: False), constants=constants).run(None, {"x": x})[0]
    assert np.array_equal(whole, parts)
    assert constants == []  # a list is taken: emptied once serialized


def test_view_reads_initializers_as_numpy_when_asked() -> None:
    model = _model()
    view = GraphView(model)
    assert view.is_const("w") and not view.is_const("x")
    assert np.array_equal(view.const("w"), numpy_helper.to_array(model.graph.initializer[0]))
    assert view.const("missing") is None
    assert view.shapes["w"] == [16, 8, 3, 3]
    assert compact(model) == model


def test_levels_rounded_in_place_equal_the_plain_computation() -> None:
    rng = np.random.default_rng(2)
    w = rng.normal(0, 1, (8, 5)).astype(np.float32)
    scale = np.full((8, 1), 0.01, np.float32)
    levels = np.round(w / scale)
    assert np.array_equal(grids.quantize(w, scale, 8), np.clip(levels, -127, 127))
    assert np.array_equal(grids.quantize(w, scale, 8, offsets=np.ones_like(w)), np.clip(levels + 1, -127, 127))
    assert grids.quantize(np.float32(0.5), 0.25, 8) == 2.0
