"""A run of element-wise functions of one tensor -> one HzLut over every input level."""

from __future__ import annotations

import math

import numpy as np
from onnx import TensorProto, helper

from hbtools.graph.graph import references
from hbtools.ops.base import attrs_of
from hbtools.ops.quantized import HzLut, packed_table
from hbtools.quant import grids
from hbtools.quant.emitters import emits
from hbtools.quant.emitters.state import EmitState, per_tensor
from hbtools.quant.units import Unit
from hbtools.runtime.session import make_session


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
    # inf saturates in the clip; NaN (a function undefined at some input level) has no grid value: 0
    table = np.where(np.isnan(table), np.float32(qt.zero_point), table)
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
    """Run the float nodes of a LUT unit on every input level (onnxruntime does the maths)."""
    root, out = unit.inputs[0], unit.outputs[0]
    used = {i for n in unit.nodes for i in references(n)}
    inits = [t for t in state.src.graph.initializer if t.name in used]
    graph = helper.make_graph(unit.nodes, "lut", [helper.make_tensor_value_info(root, TensorProto.FLOAT, [None])],
                              [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[o for o in state.src.opset_import if o.domain in ("", "ai.onnx")])
    model.ir_version = state.src.ir_version
    return make_session(model).run([out], {root: x})[0].reshape(-1)
