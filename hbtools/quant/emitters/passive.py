"""Data-movement ops (Reshape, Transpose, MaxPool, …) run on the integers as they are."""

from __future__ import annotations

from onnx import NodeProto, TensorProto, helper

from hbtools.graph.model_io import default_opset
from hbtools.ops.names import ROUND_TRIP_DOC, quantized_tensor
from hbtools.quant.emitters import emits
from hbtools.quant.emitters.state import EmitState, QTensor
from hbtools.quant.units import INT32_MOVES, Unit, moved_axis

# onnxruntime has no int16 kernels for these (nor int8 ones before opset 12/13).
_FLOAT_KERNEL_ONLY = ("MaxPool", "Resize", "ReduceMax", "ReduceMin")
# ... and no int8 or int16 kernels at any opset for these.
_FLOAT_KERNEL_ALWAYS = ("GlobalMaxPool", "DepthToSpace", "SpaceToDepth", "Pad")


@emits("passive")
def emit(state: EmitState, unit: Unit) -> None:
    node = unit.main
    carries_int32 = unit.inputs[0] in state.int32_tails
    xq = state.q[unit.inputs[0]] if carries_int32 else state.need_q(unit.inputs[0])
    # A MaxPool on the BPU has no reader of its int64 Indices (the partition puts one whose Indices are
    # read on the CPU): the integer copy leaves them out rather than give them the values' type.
    floats = node.output[:1] if node.op_type == "MaxPool" else node.output
    outs = [quantized_tensor(o) for o in floats]
    copy = helper.make_node(node.op_type, [xq.name, *node.input[1:]], outs, name=node.name)
    copy.attribute.extend(node.attribute)
    if node.op_type in _FLOAT_KERNEL_ALWAYS or (node.op_type in _FLOAT_KERNEL_ONLY and
                                           (xq.dtype == "int16" or default_opset(state.src) < 13)):
        # Integers survive a float32 round trip. The casts are named after this node: two readers
        # of one tensor each get their own.
        xf = f"{node.name}_{xq.name}_as_float"
        state.nodes.append(helper.make_node("Cast", [xq.name], [xf], name=f"{xf}_Cast", to=TensorProto.FLOAT,
                                            doc_string=ROUND_TRIP_DOC))
        copy.input[0] = xf
        copy.output[0] = f"{node.name}_{node.output[0]}_float"
        state.nodes.append(copy)
        state.nodes.append(helper.make_node("Cast", [copy.output[0]], [outs[0]], name=f"{outs[0]}_Cast",
                                            to=TensorProto.INT16 if xq.dtype == "int16" else TensorProto.INT8,
                                            doc_string=ROUND_TRIP_DOC))
    else:
        state.nodes.append(copy)
    axis = _scale_axis_after(state, node, xq)
    for o, qo in zip(floats, outs, strict=True):
        state.record(o, QTensor(qo, xq.dtype, xq.scale, axis, xq.zero_point))
        if carries_int32:
            state.int32_read_as_float(o)


def _scale_axis_after(state: EmitState, node: NodeProto, xq: QTensor) -> int:
    """The axis of ``xq``'s scales in ``node``'s output: per-channel scales follow their channels through a
    layout move (a Transpose to NHWC puts them on axis 3)."""
    shape = state.view.shapes.get(node.input[0])
    if xq.scale.size == 1 or node.op_type not in INT32_MOVES or not shape:
        return xq.axis
    moved = moved_axis(node, xq.axis % len(shape), state.view)
    return xq.axis if moved is None else moved
