"""AveragePool / GlobalAveragePool / ReduceMean / ReduceSum -> HzSQuantizedPool (integer window sums,
1/window in the multiplier; a ReduceSum is the ReduceMean kind without it)."""

from __future__ import annotations

import numpy as np

from hbtools.ops.quantized import HzSQuantizedPool
from hbtools.quant.emitters import emits
from hbtools.quant.emitters.state import EmitState, per_tensor
from hbtools.quant.units import Unit


@emits("pool")
def emit(state: EmitState, unit: Unit) -> None:
    node = unit.main
    xq = per_tensor(state.need_q(unit.inputs[0]), node.name)
    out = unit.outputs[0]
    qt, oa = state.out_attrs(out)
    oa["x_zero_point"] = xq.zero_point or None
    shape = state.view.shapes.get(node.input[0])
    a = state.view.attrs(node)
    if node.op_type == "GlobalAveragePool":
        window = int(np.prod(shape[2:]))
        extra = {"kind": "GlobalAveragePool"}
    elif node.op_type in ("ReduceMean", "ReduceSum"):
        axes = state.view.reduced_axes(node)
        window = int(np.prod([shape[k] for k in axes])) if node.op_type == "ReduceMean" else 1
        extra = {"kind": "ReduceMean", "axes": axes, "keepdims": int(a.get("keepdims", 1))}
    else:
        window = int(np.prod(a["kernel_shape"]))
        extra = {"kind": "AveragePool", "channels": int(shape[1]), "x_bits": xq.bits,
                 **{k: a[k] for k in ("kernel_shape", "strides", "pads", "dilations") if k in a}}
    mult = [float(xq.scale[0] / (qt.scale[0] * window))]
    state.nodes.append(HzSQuantizedPool.make_node([xq.name], [qt.name], node.name, multiplier=mult, **extra, **oa))
    state.record(out, qt)
