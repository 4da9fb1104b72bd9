"""A reduction of a whole tensor (``f / torch.mean(f ** 2)``: LPRNet's global context) is placed alike in each
form exporters write it.

TorchScript writes ``torch.mean(f)`` as a ReduceMean with ``keepdims=0`` (a 0-D scalar), which the optimize stage
kept as [1, 1, 1, 1] over all but the batch axis of one; ``f.mean(dim=(0, 1, 2, 3), keepdim=True)`` (``keepdims=1``
over all axes) and the dynamo exporter's ``ReduceMean(keepdims=1)`` then a Squeeze to 0-D were left as they were,
and 'ReduceMean over the batch axis (or over no axis) has no BPU form' put them (and the Squeeze and the Div)
on the CPU: LPRNet exported with dynamo=True had 2 BPU subgraphs and 20 CPU nodes, against 1 and 0.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from conformance import bayes_e_placement
from onnx import ModelProto, TensorProto, helper, numpy_helper

from hbtools.march.profiles import get_profile
from hbtools.pipeline import optimize
from hbtools.quant.units import build_partition

F = TensorProto.FLOAT
SHAPE = [1, 3, 8, 8]


def _axes(op: str, opset: int, axes: list[int] | None, name: str, inits: list) -> tuple[list[str], dict]:
    """A Reduce* node's extra inputs and attributes for ``axes`` (None: not given, all axes)."""
    if axes is None:
        return [], {}
    if opset >= (13 if op == "ReduceSum" else 18):
        inits.append(numpy_helper.from_array(np.array(axes, np.int64), name))
        return [name], {}
    return [], {"axes": axes}


def _model(op: str, form: str, opset: int) -> ModelProto:
    """Conv, Relu f, ``f / reduce(f * f)`` in ``form``, Concat of f and the quotient, Conv: a global context.
    ``scalar``: keepdims=0; ``kept``: keepdims=1 with the axes (0, 1, 2, 3); ``squeezed``: keepdims=1 without
    axes, then a Squeeze to 0-D (dynamo)."""
    rng = np.random.default_rng(7)
    inits = [numpy_helper.from_array((rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32), "w1"),
             numpy_helper.from_array((rng.standard_normal((4, 16, 1, 1)) * 0.3).astype(np.float32), "w2")]
    extra, attrs = _axes(op, opset, [0, 1, 2, 3] if form == "kept" else None, "reduce_axes", inits)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["f"], name="relu"),
             helper.make_node("Mul", ["f", "f"], ["squares"], name="square"),
             helper.make_node(op, ["squares", *extra], ["level"], name="reduce", keepdims=int(form != "scalar"),
                              **attrs)]
    level = "level"
    if form == "squeezed":
        nodes.append(helper.make_node("Squeeze", ["level"], ["scalar"], name="squeeze"))
        level = "scalar"
    nodes += [helper.make_node("Div", ["f", level], ["g"], name="div"),
              helper.make_node("Concat", ["f", "g"], ["joined"], name="cat", axis=1),
              helper.make_node("Conv", ["joined", "w2"], ["y"], name="head")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, SHAPE)],
                              [helper.make_tensor_value_info("y", F, [1, 4, 8, 8])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _same_values(model: ModelProto, optimized: ModelProto) -> None:
    for seed in range(3):
        x = np.random.default_rng(seed).standard_normal(SHAPE).astype(np.float32)
        want, got = (ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
                     .run(None, {"x": x})[0] for m in (model, optimized))
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * np.abs(want).max())


@pytest.mark.parametrize("op", ["ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceL2"])
@pytest.mark.parametrize("form, opset", [("kept", 13), ("kept", 18), ("squeezed", 13), ("squeezed", 18)])
def test_a_whole_tensor_reduction_is_placed_as_its_scalar_form(op: str, form: str, opset: int) -> None:
    """Each form gets the keepdims=0 form's placement (all on the BPU, one subgraph; the L2 norm as a sum of
    squares once it no longer reads the batch axis), the Squeeze is left out, no reduction still reads the batch
    axis of one, and the optimized float model computes the same values."""
    profile = get_profile("bayes-e")
    expected = bayes_e_placement(optimize.run(_model(op, "scalar", opset), profile))
    model = _model(op, form, opset)
    optimized = optimize.run(model, profile)
    assert bayes_e_placement(optimized) == expected == (1, [])
    assert "Squeeze" not in [n.op_type for n in optimized.graph.node]
    reduction = next(n for n in optimized.graph.node if n.op_type.startswith("Reduce"))  # ReduceL2's ReduceSum
    axes = [a.ints for a in reduction.attribute if a.name == "axes"] or \
        [numpy_helper.to_array(next(t for t in optimized.graph.initializer if t.name == reduction.input[1]))]
    assert sorted(int(a) for a in axes[0]) == [1, 2, 3]
    _same_values(model, optimized)


def _squeezed_read_by(reader: str, other: str | None) -> ModelProto:
    """x [1, 4, 4, 4] -> ReduceMean (keepdims) -> Squeeze to 0-D -> ``reader`` with ``other`` (None: the scalar
    itself) -> y."""
    inits = [numpy_helper.from_array(np.float32(2.0), "two")]
    nodes = [helper.make_node("ReduceMean", ["x"], ["m"], name="mean", keepdims=1),
             helper.make_node("Squeeze", ["m"], ["s"], name="squeeze"),
             helper.make_node(reader, ["x" if other == "x" else "two" if other else "s", "s"], ["y"], name="op")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [1, 4, 4, 4])],
                              [helper.make_tensor_value_info("y", F, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("reader, other, dropped", [("Div", "x", 1), ("Sub", "x", 1), ("Add", "two", 0),
                                                    ("Mul", None, 0), ("Pow", "x", 0)])
def test_a_unit_squeeze_is_left_out_only_where_its_readers_broadcast_it_to_the_same_shape(
        reader: str, other: str | None, dropped: int) -> None:
    """Against a 4-D tensor the [1, 1, 1, 1] value broadcasts as the 0-D one does; against a 0-D constant or
    itself the output would become 4-D, and Pow is not among the element-wise ops taken."""
    from hbtools.graph.bpu_forms.reductions import unit_squeezes_into_broadcasts

    model = _squeezed_read_by(reader, other)
    assert unit_squeezes_into_broadcasts(model) == dropped
    assert [n.op_type for n in model.graph.node].count("Squeeze") == 1 - dropped


@pytest.mark.parametrize("op", ["ReduceMean", "ReduceSum"])
def test_a_reduction_without_axes_over_a_batch_of_two_is_said_to_be_over_all_axes(op: str) -> None:
    """With no axes (and noop_with_empty_axes=0) a reduction is over all axes; the reason said 'over the batch
    axis (or over no axis)'."""
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["r"], name="relu"),
                               helper.make_node(op, ["r"], ["m"], name="reduce", keepdims=1),
                               helper.make_node("Mul", ["r", "m"], ["y"], name="scale")], "g",
                              [helper.make_tensor_value_info("x", F, [2, 4, 4, 4])],
                              [helper.make_tensor_value_info("y", F, [2, 4, 4, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    reason = build_partition(model, get_profile("bayes-e"), {}).unit_of_node["reduce"].reason
    assert f"{op} over all axes, the batch axis among them, has no BPU form" in reason, reason
    assert "no axis" not in reason


def _normalised_by_global_level(form: str, end: str = "Div") -> ModelProto:
    """Conv, Relu f, ``f / sqrt(mean(|f|) + eps)``: the mean in ``form`` (``scalar``: keepdims=0, TorchScript;
    ``squeezed``: keepdims=1 then a Squeeze to 0-D, dynamo), then a chain of element-wise ops with scalar
    constants before ``end`` reads it with f. Every tensor's shape declared, as the dynamo exporter does (0-D
    along the chain)."""
    rng = np.random.default_rng(8)
    inits = [numpy_helper.from_array((rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32), "w1"),
             numpy_helper.from_array((rng.standard_normal((4, 8, 1, 1)) * 0.3).astype(np.float32), "w2"),
             numpy_helper.from_array(np.array(1e-6, np.float32), "eps"),
             numpy_helper.from_array(np.array([2.0], np.float32), "two")]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["f"], name="relu"),
             helper.make_node("Abs", ["f"], ["magnitudes"], name="abs"),
             helper.make_node("ReduceMean", ["magnitudes"], ["level"], name="mean", keepdims=int(form != "scalar"))]
    level = "level"
    if form == "squeezed":
        nodes.append(helper.make_node("Squeeze", ["level"], ["scalar"], name="squeeze"))
        level = "scalar"
    nodes += [helper.make_node("Add", [level, "eps"], ["guarded"], name="add_eps"),
              helper.make_node("Sqrt", ["guarded"], ["root"], name="sqrt"),
              helper.make_node("Mul", ["two", "root"], ["denominator"], name="twice"),
              helper.make_node(end, ["f", "denominator"], ["g"], name="end"),
              helper.make_node("Conv", ["g", "w2"], ["y"], name="head")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, SHAPE)],
                              [helper.make_tensor_value_info("y", F, [1, 4, 8, 8])], inits)
    graph.value_info.extend(helper.make_tensor_value_info(t, F, []) for t in
                            ["guarded", "root", *(["scalar"] if form == "squeezed" else ["level"])])
    graph.value_info.append(helper.make_tensor_value_info("denominator", F, [1]))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("form", ["scalar", "squeezed"])
def test_a_whole_tensor_mean_reaches_its_division_through_scalar_ops(form: str) -> None:
    """``x / (x.abs().mean() + 1e-6)`` (dynamo: mean, Squeeze to 0-D, Add, Div): the Squeeze was left out only
    where the broadcasting op read it directly, so the 0-D sum sent the chain and the division to the CPU (2 BPU
    subgraphs). Element-wise ops with scalars between them (+ eps, a square root, a constant factor) carry the
    [1, 1, 1, 1] value along; the optimized float model computes the same values."""
    profile = get_profile("bayes-e")
    model = _normalised_by_global_level(form)
    optimized = optimize.run(model, profile)
    assert bayes_e_placement(optimized) == (1, [])
    assert "Squeeze" not in [n.op_type for n in optimized.graph.node]
    _same_values(model, optimized)


@pytest.mark.parametrize("case", ["Pow", "output"])
def test_a_scalar_chain_ending_elsewhere_keeps_its_squeeze(case: str) -> None:
    """A chain whose value ends elsewhere keeps the Squeeze: in Pow (not among the ops taken at an end), or in a
    graph output, whose shape would change."""
    from hbtools.graph.bpu_forms.reductions import unit_squeezes_into_broadcasts

    model = _normalised_by_global_level("squeezed", "Pow" if case == "Pow" else "Div")
    if case == "output":
        model.graph.output.append(helper.make_tensor_value_info("root", F, []))
    assert unit_squeezes_into_broadcasts(model) == 0


def test_the_scalar_chain_forgets_its_declared_0d_shapes() -> None:
    """The tensors of the chain become [1, 1, 1, 1]: their declared 0-D shapes would have stayed."""
    from hbtools.graph.bpu_forms.reductions import unit_squeezes_into_broadcasts
    from hbtools.graph.graph import GraphView

    model = _normalised_by_global_level("squeezed")
    assert unit_squeezes_into_broadcasts(model) == 1
    shapes = GraphView(model).shapes
    assert [shapes[t] for t in ("guarded", "root", "denominator", "g")] == [[1, 1, 1, 1]] * 3 + [[1, 8, 8, 8]]
