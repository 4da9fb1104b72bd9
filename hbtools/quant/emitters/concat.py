"""Concat of integer tensors brought to the output's step -> HzSQuantizedConcat."""

from __future__ import annotations

from hbtools.ops.quantized import HzSQuantizedConcat
from hbtools.quant.emitters import emits
from hbtools.quant.emitters.state import EmitState, per_tensor
from hbtools.quant.units import Unit


@emits("concat")
def emit(state: EmitState, unit: Unit) -> None:
    node = unit.main
    qs = [per_tensor(state.need_q(t), node.name) for t in node.input]
    out = unit.outputs[0]
    qt, oa = state.out_attrs(out)
    mult = [float(q.scale[0] / qt.scale[0]) for q in qs]
    if any(q.zero_point for q in qs):
        oa["zero_points"] = [q.zero_point for q in qs]
    state.nodes.append(HzSQuantizedConcat.make_node([q.name for q in qs], [qt.name], node.name, multipliers=mult,
                                                    in_types=[q.dtype for q in qs],
                                                    concat_axis=state.view.attrs(node).get("axis", 1), **oa))
    state.record(out, qt)
