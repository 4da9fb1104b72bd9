"""Add / Sub / Mul of two integer tensors -> HzSQuantizedEltwise."""

from __future__ import annotations

from hbtools.ops.quantized import HzSQuantizedEltwise
from hbtools.quant.emitters import emits
from hbtools.quant.emitters.state import EmitState, per_tensor
from hbtools.quant.units import Unit


@emits("eltwise")
def emit(state: EmitState, unit: Unit) -> None:
    node = unit.main
    qa, qb = (per_tensor(state.need_q(t), node.name) for t in node.input[:2])
    out = unit.outputs[0]
    qt, oa = state.out_attrs(out)
    sy = qt.scale[0]
    oa.update(a_zero_point=qa.zero_point or None, b_zero_point=qb.zero_point or None)
    if node.op_type == "Mul":
        attrs = {"mode": "mul", "multiplier": [float(qa.scale[0] * qb.scale[0] / sy)], "requantize_f32": 1}
    else:
        sign = -1.0 if node.op_type == "Sub" else 1.0
        attrs = {"mode": "add", "a_multiplier": float(qa.scale[0] / sy),
                 "b_multiplier": float(sign * qb.scale[0] / sy), "multiplier": [1.0], "requantize_f32": 1}
    state.nodes.append(HzSQuantizedEltwise.make_node([qa.name, qb.name], [qt.name], node.name, **attrs, **oa))
    state.record(out, qt)
