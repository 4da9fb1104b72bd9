"""Concat of integer tensors brought to the output's step -> HzSQuantizedConcat.

A constant input (a transformer's class token) is put on the output grid here, as the calibrated
model's fake quant of the Concat rounds it, and copied as it is.
"""

from __future__ import annotations

import numpy as np

from hbtools.ops.names import quantized_tensor
from hbtools.ops.quantized import NUMPY_INT, HzSQuantizedConcat
from hbtools.quant.emitters import emits
from hbtools.quant.emitters.state import EmitState, QTensor, per_tensor
from hbtools.quant.units import Unit


@emits("concat")
def emit(state: EmitState, unit: Unit) -> None:
    node = unit.main
    out = unit.outputs[0]
    qt, oa = state.out_attrs(out)
    _, lo, hi = state.grid(out)
    qs = [_on_grid(state, node.name, t, qt, lo, hi) if state.view.is_const(t) else
          per_tensor(state.need_q(t), node.name) for t in node.input]
    mult = [float(q.scale[0] / qt.scale[0]) for q in qs]
    if any(q.zero_point for q in qs):
        oa["zero_points"] = [q.zero_point for q in qs]
    state.nodes.append(HzSQuantizedConcat.make_node([q.name for q in qs], [qt.name], node.name, multipliers=mult,
                                                    in_types=[q.dtype for q in qs],
                                                    concat_axis=state.view.attrs(node).get("axis", 1), **oa))
    state.record(out, qt)


def _on_grid(state: EmitState, name: str, tensor: str, qt: QTensor, lo: int, hi: int) -> QTensor:
    """Constant ``tensor`` as levels of the output grid ``qt`` (rounded and clipped as its fake quant does)."""
    step = np.float64(qt.scale[0])
    levels = np.clip(np.round(state.view.const(tensor).astype(np.float64) / step) + qt.zero_point, lo, hi)
    init = state.init(quantized_tensor(f"{name}_{tensor}"), levels.astype(NUMPY_INT[qt.dtype]))
    return QTensor(init, qt.dtype, qt.scale, qt.axis, qt.zero_point)
