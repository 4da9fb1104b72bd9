"""HzSQuantizedConstantEltwise: Add / Sub / Mul / Div / PRelu of an integer activation and a constant tensor.

The constant is a per-channel or full-size tensor (a scalar one folds into a lookup
table instead). The kernel dequantizes the input and applies the constant in float64,
then requantizes onto the output grid:

    v = ((x - x_zero_point) * x_scale) OP c        (c OP v when ``constant_first``)
    y = clip(round(v / out_scale) + zero_point, out_min, out_max)

(PRelu: ``max(v, 0) + c * min(v, 0)``, c the slope per channel) with ``c`` the float32
constant read in float64, ``x_scale`` / ``out_scale`` the
tensors' float32 steps read in float64, round half to even. Every step is an IEEE
operation on exact operands, so the numpy reference and the ONNX lowering agree bit
for bit, and the calibrated model follows it exactly: its float64 twins run the same
node on the same values (``hbtools.ops.twins``: a constant-tensor operand runs on the
twins) and its output fake quant divides the float64 value by the step.

Attributes: ``mode`` (add | sub | mul | div | prelu), ``constant_first`` (0 | 1), ``x_scale``,
``x_zero_point``, ``out_scale`` (float64) and the output attributes.
Inputs: the integer activation, the float32 constant.
"""

from __future__ import annotations

import numpy as np
from onnx import NodeProto, TensorProto, helper

from hbtools.march.constraints import constant_operand_shape
from hbtools.ops.base import REQUIRED, HzOp, LoweringContext
from hbtools.ops.quantized import NUMPY_INT, OUTPUT_ATTRS, output_levels
from hbtools.ops.registry import register
from hbtools.quant import grids

_ONNX_OP = {"add": "Add", "sub": "Sub", "mul": "Mul", "div": "Div"}
_NUMPY_OP = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide}


@register
class HzSQuantizedConstantEltwise(HzOp):
    op_type = "HzSQuantizedConstantEltwise"
    attributes = {"mode": REQUIRED, "constant_first": 0, "x_scale": REQUIRED, "x_zero_point": 0,
                  "out_scale": REQUIRED, **OUTPUT_ATTRS}
    double_attributes = ("x_scale", "out_scale")
    unit_kind = "constant_eltwise"
    onnx_ops = ("Add", "Sub", "Mul", "Div", "PRelu")
    constant_operands = True

    @classmethod
    def emit(cls, state, unit) -> None:  # noqa: ANN001 - EmitState and Unit live above ops/
        from hbtools.ops.names import quantized_tensor
        from hbtools.quant.emitters.state import per_tensor

        node = unit.main
        x = unit.inputs[0]
        xq = per_tensor(state.need_q(x), node.name)
        const = next(i for i in node.input if i and i != x)
        value = np.asarray(state.view.const(const), dtype=np.float32)
        # a form the march does not broadcast (bernoulli2: equal shapes or one value per channel) is copied
        # out at the activation's shape, as placement decided (``constant_operand_shape``)
        shape = constant_operand_shape(state.view.shapes.get(x), list(value.shape), state.profile.rule(node.op_type))
        if shape is not None and list(shape) != list(value.shape):
            value = np.ascontiguousarray(np.broadcast_to(value, shape))
        c = state.init(quantized_tensor(f"{node.name}_constant"), value)
        qt, out = state.out_attrs(unit.outputs[0])
        state.nodes.append(cls.make_node(
            [xq.name, c], [qt.name], node.name, mode=node.op_type.lower(),
            constant_first=1 if node.input[0] == const else None, x_scale=[float(xq.scale[0])],
            x_zero_point=xq.zero_point or None, out_scale=[float(qt.scale[0])], **out))
        state.record(unit.outputs[0], qt)

    @classmethod
    def lower(cls, node: NodeProto, ctx: LoweringContext) -> list[NodeProto]:
        a = cls.read(node)
        nodes: list[NodeProto] = []
        name = node.name

        def step(op: str, inputs: list[str], **attrs) -> str:
            out = ctx.unique(f"{name}_{op.lower()}")
            nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
            return out

        def const(hint: str, value: float) -> str:
            return ctx.constant(f"{name}_{hint}", np.array(value, dtype=np.float64))

        x = step("Cast", [node.input[0]], to=TensorProto.DOUBLE)
        if a["x_zero_point"]:
            x = step("Sub", [x, const("x_zp", float(a["x_zero_point"]))])
        v = step("Mul", [x, const("x_scale", a["x_scale"][0])])
        c = step("Cast", [node.input[1]], to=TensorProto.DOUBLE)
        if a["mode"] == "prelu":
            zero = const("zero", 0.0)
            v = step("Add", [step("Max", [v, zero]), step("Mul", [c, step("Min", [v, zero])])])
        else:
            v = step(_ONNX_OP[a["mode"]], [c, v] if a["constant_first"] else [v, c])
        q = step("Round", [step("Div", [v, const("out_scale", a["out_scale"][0])])])
        output_levels(ctx, q, a, node.output[0], name, nodes)
        return nodes

    @classmethod
    def reference(cls, node: NodeProto, inputs: list[np.ndarray]) -> list[np.ndarray]:
        a = cls.read(node)
        x = grids.dequantize(inputs[0], np.float64(a["x_scale"][0]), a["x_zero_point"])
        c = np.asarray(inputs[1], dtype=np.float32).astype(np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            if a["mode"] == "prelu":
                v = np.maximum(x, 0.0) + c * np.minimum(x, 0.0)
            else:
                v = _NUMPY_OP[a["mode"]](*((c, x) if a["constant_first"] else (x, c)))
            ratio = v / np.float64(a["out_scale"][0])
        q = grids.requantize(ratio, 1.0, a["out_min"], a["out_max"], int(a["zero_point"]))
        return [q.astype(NUMPY_INT[a["out_type"]])]
