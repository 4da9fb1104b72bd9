"""Quantize stage: calibrated model -> fixed-point model of Hz integer ops.

Reads everything from the calibrated model file itself (thresholds live in its
HzCalibration nodes), re-derives the same BPU/CPU partition, and hands each unit
to the emitter of its kind (``hbtools.quant.emitters``). CPU nodes stay float
behind HzDequantize / HzQuantize.
"""

from __future__ import annotations

from onnx import ModelProto, TensorProto, helper

from hbtools.config.model import Config
from hbtools.graph.graph import add_initializers, references
from hbtools.graph.model_io import with_horizon_domain
from hbtools.graph.origins import recorded_origins
from hbtools.march.profiles import MarchProfile
from hbtools.quant.calibrated import read_calibrated
from hbtools.quant.emitters import EmitState, QTensor, QuantizedResult, emitter_for
from hbtools.quant.units import model_partition

__all__ = ["QTensor", "QuantizedResult", "run"]


def run(calibrated: ModelProto, config: Config, profile: MarchProfile) -> QuantizedResult:
    graph = read_calibrated(calibrated)
    part = model_partition(graph.float_model, profile, config, warn=False)
    state = EmitState(graph, part, config, profile)
    for unit in part.units:
        emitter_for(unit)(state, unit)
    model = _finish(state)
    part.detach()  # the result outlives the float copy ``graph`` holds
    return QuantizedResult(model, part, state.q, {t: g.threshold for t, g in graph.activations.items()},
                           recorded_origins(calibrated))


def _finish(state: EmitState) -> ModelProto:
    """The model's outputs (float, or integers with set_model_output_int8/16) and the graph."""
    src = state.src
    outputs = []
    int_outputs = state.config.calibration.options.int_outputs
    for out in src.graph.output:
        qt = state.q.get(out.name)
        if out.name not in state.floats and int_outputs and qt is not None and qt.dtype != "int32":
            state.nodes.append(helper.make_node("Identity", [qt.name], [out.name], name=f"{out.name}_output"))
            elem = TensorProto.INT8 if qt.dtype == "int8" else TensorProto.INT16
            outputs.append(helper.make_tensor_value_info(out.name, elem, state.view.shapes.get(out.name)))
            continue
        state.need_float(out.name)
        # A CPU result keeps its type: lengths and indices stay int64 (their float model declared it).
        elem = out.type.tensor_type.elem_type if qt is None and out.type.tensor_type.elem_type else TensorProto.FLOAT
        outputs.append(helper.make_tensor_value_info(out.name, elem, state.view.shapes.get(out.name)))
    used = {i for n in state.nodes for i in references(n)}  # If/Loop branches read initializers too
    used |= {o.name for o in src.graph.output}  # an output the optimizer folded to a constant (a length)
    float_inits = [t for t in src.graph.initializer if t.name in used]
    graph = helper.make_graph(state.nodes, src.graph.name or "quantized", state.inputs, outputs,
                              value_info=state.value_info)
    add_initializers(graph, [*float_inits, *state.inits])
    model = helper.make_model(graph, opset_imports=list(src.opset_import))
    model.ir_version = src.ir_version
    model.producer_name = "hbtools"
    with_horizon_domain(model)
    return model
