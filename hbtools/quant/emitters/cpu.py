"""CPU units stay float: their inputs are dequantized, their nodes copied as they are.

A float Hz op the optimize stage wrote (HzLayerNorm) is copied as its standard-ONNX float
computation: the quantized model's CPU nodes are onnxruntime's to run, in HB_ONNXRuntime
and in the ``.bin`` simulator alike. It is the form the calibrated model's lowering writes for
the same node (a recorded CPU node: no float64 twins), from the same constants and shapes, so
the calibrated model runs the very float ops the quantized model runs.
"""

from __future__ import annotations

from hbtools.graph.model_io import default_opset
from hbtools.ops import registry
from hbtools.ops.base import DOMAIN, LoweringContext
from hbtools.quant.emitters import emits
from hbtools.quant.emitters.state import EmitState
from hbtools.quant.units import Unit


@emits("cpu")
def emit(state: EmitState, unit: Unit) -> None:
    for t in unit.inputs:
        state.need_float(t)
    for node in unit.nodes:
        op = registry.op_class(node.op_type) if node.domain == DOMAIN else None
        if op is not None and op.device_op:
            constants = {t.name: t for t in [*state.src.graph.initializer, *state.inits]}
            taken = {x for n in [*state.src.graph.node, *state.nodes] for x in (n.name, *n.output)}
            taken |= set(constants) | {i.name for i in state.src.graph.input}
            ctx = LoweringContext(default_opset(state.src), taken, state.view.shapes)
            ctx.exact = False
            # The calibrated model's lowering of this node sees the model's constants (a scale's shape
            # decides between LayerNormalization and the spelled-out chain): so must this one, or the two
            # artefacts compute the CPU node with differently rounding float ops.
            ctx.constant_values = constants
            state.nodes.extend(op.lower(node, ctx))
            state.inits.extend(ctx.initializers)
        else:
            state.nodes.append(node)
        state.floats.update(node.output)
