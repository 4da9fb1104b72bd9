"""HzSQuantizedArgMax / HzSQuantizedArgMin: the index of the largest (smallest) integer along an axis.

A tensor with one positive step has ``value = (q - zero_point) * step``, an increasing function of ``q``:
the largest integer sits where the largest value does, and equal integers are equal values, so the first
of several equal ones is the first index in both. The integer kernel is ArgMax on the int8 / int16
tensor, and the calibrated model's ArgMax of the fake-quantized float tensor computes it exactly (float32
keeps distinct int16 levels of one step distinct). A step per channel along the axis would break this:
the plan gives the inputs of these ops one step (only convolutions read per-channel tensors).

The output is the int64 indices, as the float model has them: no Dequantize follows.

Attributes: ``axis`` (non-negative), ``keepdims`` (0 | 1).
"""

from __future__ import annotations

import numpy as np
from onnx import NodeProto, TensorProto, helper

from hbtools.ops.base import REQUIRED, HzOp, LoweringContext, add_node, attrs_of
from hbtools.ops.registry import get, register


@register
class HzSQuantizedArgMax(HzOp):
    op_type = "HzSQuantizedArgMax"
    attributes = {"axis": REQUIRED, "keepdims": 1}
    index_output = True
    reduction = True
    # On an int8 grid close logits share a level and the first of them wins: int16 where the march has it.
    int16_input = True
    unit_kind = "argmax"
    onnx_ops = ("ArgMax", "ArgMin")

    @classmethod
    def refusal(cls, node: NodeProto, view) -> str:  # noqa: ANN001 - GraphView lives above ops/
        if attrs_of(node).get("select_last_index", 0):
            return (f"{node.op_type} with select_last_index 1 has no BPU form in hbtools (the BPU gives the first "
                    "of equal values); kept in float")
        return ""

    @classmethod
    def emit(cls, state, unit) -> None:  # noqa: ANN001 - EmitState and Unit live above ops/
        from hbtools.quant.emitters.state import per_tensor

        node = unit.main
        xq = per_tensor(state.need_q(unit.inputs[0]), node.name)
        a = attrs_of(node)
        rank = len(state.view.shapes[node.input[0]])  # known: the march rule's extent needs the axis' size
        op = get(f"HzSQuantized{node.op_type}")
        indices = node.output[0]
        state.nodes.append(op.make_node([xq.name], [indices], node.name, axis=int(a.get("axis", 0)) % rank,
                                        keepdims=int(a.get("keepdims", 1))))
        # The float model's own int64 tensor: CPU readers and the model output take it as it is.
        state.floats.add(indices)
        state.value_info.append(helper.make_tensor_value_info(indices, TensorProto.INT64,
                                                              state.view.shapes.get(indices)))

    @classmethod
    def lower(cls, node: NodeProto, ctx: LoweringContext) -> list[NodeProto]:
        a = cls.read(node)
        nodes: list[NodeProto] = []
        # onnxruntime's ArgMax / ArgMin take int8 and int32 but not int16: int32 holds every level.
        x = add_node(ctx, "Cast", [node.input[0]], node.name, nodes, to=TensorProto.INT32)
        standard = cls.op_type.removeprefix("HzSQuantized")
        nodes.append(helper.make_node(standard, [x], [node.output[0]], name=ctx.unique(f"{node.name}_{standard}"),
                                      axis=int(a["axis"]), keepdims=int(a["keepdims"])))
        return nodes

    @classmethod
    def reference(cls, node: NodeProto, inputs: list[np.ndarray]) -> list[np.ndarray]:
        a = cls.read(node)
        pick = np.argmax if cls.op_type == "HzSQuantizedArgMax" else np.argmin  # both take the first of equals
        indices = pick(inputs[0], axis=int(a["axis"])).astype(np.int64)
        return [np.expand_dims(indices, int(a["axis"])) if a["keepdims"] else indices]


@register
class HzSQuantizedArgMin(HzSQuantizedArgMax):
    op_type = "HzSQuantizedArgMin"
