"""CPU units stay float: their inputs are dequantized, their nodes copied as they are."""

from __future__ import annotations

from hbtools.quant.emitters import emits
from hbtools.quant.emitters.state import EmitState
from hbtools.quant.units import Unit


@emits("cpu")
def emit(state: EmitState, unit: Unit) -> None:
    for t in unit.inputs:
        state.need_float(t)
    for node in unit.nodes:
        state.nodes.append(node)
        state.floats.update(node.output)
