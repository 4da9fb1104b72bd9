"""A run of element-wise functions of one tensor -> one HzLut over every input level."""

from __future__ import annotations

import math

import numpy as np
from onnx import AttributeProto, ModelProto, NodeProto, TensorProto, helper

from hbtools.graph.graph import references
from hbtools.ops.base import attrs_of
from hbtools.ops.quantized import HzLut, packed_table
from hbtools.quant import grids
from hbtools.quant.emitters import emits
from hbtools.quant.emitters.state import EmitState, per_tensor
from hbtools.quant.units import Unit
from hbtools.runtime.session import make_session

KEPT_SESSIONS = 32  # functions whose sessions are kept for the tables that follow


@emits("lut")
def emit(state: EmitState, unit: Unit) -> None:
    xq = per_tensor(state.need_q(unit.inputs[0]), unit.main.name)
    out = unit.outputs[0]
    qt, oa = state.out_attrs(out)
    qmin, qmax = _reachable(state, xq.name, *grids.grid_bounds(xq.bits, asymmetric=True))
    levels = np.arange(qmin, qmax + 1, dtype=np.float64)
    # The float nodes see exactly the float32 values the calibrated model's fake quant gives them.
    x = (grids.dequantize(levels, xq.scale[0], xq.zero_point)).astype(np.float32)
    y = _evaluate_cluster(state, unit, x)
    # ... and their results go on the output grid as that fake quant puts them (float32 division).
    table = grids.quantize(y, np.float32(qt.scale[0]), qt.bits, zero_point=qt.zero_point,
                           asymmetric=state.acts[out].asymmetric)
    # inf saturates in the clip; NaN (a function undefined at some input level: Sqrt or Log of a negative level)
    # takes the lowest level, as the calibrated model's fake quant gives it (its Clip's lower bound), so that the
    # two agree there too
    lowest = grids.grid_bounds(qt.bits, asymmetric=state.acts[out].asymmetric)[0]
    table = np.where(np.isnan(table), np.float32(lowest), table)
    # Only the reachable, varying part is stored (an int16 input has 65536 levels), packed.
    table, in_min = HzLut.compact(table.astype(np.int64), qmin)
    state.nodes.append(HzLut.make_node([xq.name], [qt.name], unit.main.name, table=packed_table(table),
                                       in_min=in_min, out_type=qt.dtype))  # zero points live in the table
    state.record(out, qt)


def _reachable(state: EmitState, tensor: str, lo: int, hi: int) -> tuple[int, int]:
    """The input levels ``tensor`` can take: its grid, within the clip bounds of the op writing it."""
    for node in reversed(state.nodes):
        if tensor in node.output:
            a = attrs_of(node)
            if node.output[0] == tensor and "out_min" in a and "out_max" in a:
                return max(lo, math.ceil(a["out_min"])), min(hi, math.floor(a["out_max"]))
            break
    return lo, hi


def _evaluate_cluster(state: EmitState, unit: Unit, x: np.ndarray) -> np.ndarray:
    """Run the float nodes of a LUT unit on every input level (onnxruntime does the maths).

    Units computing the same function (every gate Sigmoid of an unrolled LSTM, every SiLU of a YOLO) share one
    session: the function is written with names of its own, and its bytes are the key (sequencer2d_s built
    7,058 sessions, 87 s of its checker run)."""
    model, root, out = _function_model(state, unit)
    key = model.SerializeToString(deterministic=True)
    sessions = state.function_sessions
    session = sessions.pop(key, None) or make_session(model)
    sessions[key] = session  # the most recent last; the oldest go beyond a bound (every table its own function)
    while len(sessions) > KEPT_SESSIONS:
        del sessions[next(iter(sessions))]
    return session.run([out], {root: x})[0].reshape(-1)


def _function_model(state: EmitState, unit: Unit) -> tuple[ModelProto, str, str]:
    """The nodes of ``unit`` as a model of ``x`` (its input) to ``y`` (its output), every name its own; the
    model, its input and its output."""
    root, out = unit.inputs[0], unit.outputs[0]
    names = {root: "x", out: "y"}
    constants = state.view.initializer_protos
    inits = []
    nodes = []
    for k, node in enumerate(unit.nodes):
        if any(a.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS) for a in node.attribute):
            return _model_as_is(state, unit)  # its sub-graphs read outer names: no renaming
        for name in node.input:
            if name and name not in names and name in constants:
                names[name] = f"c{len(inits)}"
                inits.append(_renamed(constants[name], names[name]))
        for name in node.output:
            names.setdefault(name, f"t{len(names)}")
        renamed = NodeProto()
        renamed.CopyFrom(node)
        renamed.name = f"n{k}"
        renamed.input[:] = [names.get(i, i) if i else i for i in node.input]
        renamed.output[:] = [names[o] if o else o for o in node.output]
        nodes.append(renamed)
    return _function_of(state, nodes, "x", "y", inits), "x", "y"


def _model_as_is(state: EmitState, unit: Unit) -> tuple[ModelProto, str, str]:
    used = {i for n in unit.nodes for i in references(n)}
    constants = state.view.initializer_protos
    root, out = unit.inputs[0], unit.outputs[0]
    return _function_of(state, list(unit.nodes), root, out,
                        [constants[name] for name in sorted(used) if name in constants]), root, out


def _renamed(tensor: TensorProto, name: str) -> TensorProto:
    copy = TensorProto()
    copy.CopyFrom(tensor)
    copy.name = name
    return copy


def _function_of(state: EmitState, nodes: list[NodeProto], x: str, y: str, inits: list[TensorProto]) -> ModelProto:
    graph = helper.make_graph(nodes, "lut", [helper.make_tensor_value_info(x, TensorProto.FLOAT, [None])],
                              [helper.make_tensor_value_info(y, TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[o for o in state.src.opset_import if o.domain in ("", "ai.onnx")])
    model.ir_version = state.src.ir_version
    return model
