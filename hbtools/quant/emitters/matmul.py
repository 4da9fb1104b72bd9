"""MatMul of two integer activations -> HzSQuantizedMatMul."""

from __future__ import annotations

import numpy as np

from hbtools.ops.quantized import HzSQuantizedMatMul
from hbtools.quant.emitters import emits
from hbtools.quant.emitters.conv import emit_accumulator
from hbtools.quant.emitters.state import EmitState, per_tensor
from hbtools.quant.units import Unit


@emits("matmul")
def emit(state: EmitState, unit: Unit) -> None:
    qa, qb = (per_tensor(state.need_q(t), unit.main.name) for t in unit.main.input[:2])
    # float64 product of the float32 steps, as the calibrated model's accumulator step.
    acc_scale = np.array([np.float64(qa.scale[0]) * np.float64(qb.scale[0])])
    common = {"a_bits": qa.bits, "b_bits": qb.bits, "axis": -1, "a_zero_point": qa.zero_point or None,
              "b_zero_point": qb.zero_point or None, "requantize_f32": 1}
    depth = (state.view.shapes.get(unit.main.input[0]) or [None])[-1]
    bound = None if not depth else float(qa.levels_span() * qb.levels_span() * depth)
    emit_accumulator(state, unit, HzSQuantizedMatMul, [([qa.name, qb.name], slice(None))], acc_scale, -1, common,
                     bound)
