"""HzSQuantizedMaxMin: element-wise Max / Min of two or more integer activations.

Each input is requantized onto the output grid, ``clip(round((q - z_in) * m) + z_out)``,
then the largest (``mode`` max) or smallest (``mode`` min) of them is kept. Rounding
and clipping are monotone, so this equals quantizing the float maximum: the
calibrated model (float Max between fake-quantized inputs, then the output's fake
quant) follows it exactly.

Attributes: ``mode`` (max | min), ``multipliers`` (float64, one per input),
``zero_points`` (ints, one per input; absent: 0), and the output attributes
(out_type, out_min, out_max, zero_point).
"""

from __future__ import annotations

import functools

import numpy as np
from onnx import NodeProto, TensorProto, helper

from hbtools.ops.base import REQUIRED, HzOp, LoweringContext
from hbtools.ops.quantized import NUMPY_INT, ONNX_INT, OUTPUT_ATTRS
from hbtools.ops.registry import register
from hbtools.quant import grids


@register
class HzSQuantizedMaxMin(HzOp):
    op_type = "HzSQuantizedMaxMin"
    attributes = {"mode": REQUIRED, "multipliers": REQUIRED, "zero_points": None, **OUTPUT_ATTRS}
    double_attributes = ("multipliers",)
    shape_preserving = False  # the inputs broadcast
    unit_kind = "maxmin"
    onnx_ops = ("Max", "Min")
    float64_twins = True

    @classmethod
    def emit(cls, state, unit) -> None:  # noqa: ANN001 - EmitState and Unit live above ops/
        from hbtools.quant.emitters.state import per_tensor

        node = unit.main
        qs = [per_tensor(state.need_q(t), node.name) for t in node.input]
        qt, out = state.out_attrs(unit.outputs[0])
        state.nodes.append(cls.make_node(
            [q.name for q in qs], [qt.name], node.name, mode=node.op_type.lower(),
            multipliers=[float(q.scale[0] / qt.scale[0]) for q in qs],
            zero_points=[q.zero_point for q in qs] if any(q.zero_point for q in qs) else None, **out))
        state.record(unit.outputs[0], qt)

    @classmethod
    def lower(cls, node: NodeProto, ctx: LoweringContext) -> list[NodeProto]:
        a = cls.read(node)
        nodes: list[NodeProto] = []
        parts = []
        zero_points = a.get("zero_points", [0] * len(node.input))
        lo = ctx.constant(f"{node.name}_lo", np.array(float(a["out_min"])))
        hi = ctx.constant(f"{node.name}_hi", np.array(float(a["out_max"])))
        for k, (x, m, z) in enumerate(zip(node.input, a["multipliers"], zero_points, strict=True)):
            steps = [("Cast", [x], {"to": TensorProto.DOUBLE}),
                     ("Sub", [None, ctx.constant(f"{node.name}_{k}_zp", np.array(float(z)))], {}),
                     ("Mul", [None, ctx.constant(f"{node.name}_{k}_m", np.array(m))], {}),
                     ("Round", [None], {}),
                     ("Add", [None, ctx.constant(f"{node.name}_zp_out", np.array(float(a["zero_point"])))], {}),
                     ("Max", [None, lo], {}), ("Min", [None, hi], {})]
            current = None
            for op, inputs, attrs in steps:
                out = ctx.unique(f"{node.name}_{k}_{op.lower()}")
                nodes.append(helper.make_node(op, [current if i is None else i for i in inputs], [out], name=out,
                                              **attrs))
                current = out
            parts.append(current)
        both = ctx.unique(f"{node.name}_{a['mode']}")
        nodes.append(helper.make_node("Max" if a["mode"] == "max" else "Min", parts, [both], name=both))
        nodes.append(helper.make_node("Cast", [both], [node.output[0]], name=ctx.unique(f"{node.name}_out"),
                                      to=ONNX_INT[a["out_type"]]))
        return nodes

    @classmethod
    def reference(cls, node: NodeProto, inputs: list[np.ndarray]) -> list[np.ndarray]:
        a = cls.read(node)
        zero_points = a.get("zero_points", [0] * len(inputs))
        parts = [grids.requantize(x.astype(np.float64) - z, m, a["out_min"], a["out_max"], a["zero_point"])
                 for x, m, z in zip(inputs, a["multipliers"], zero_points, strict=True)]
        # ``reduce``: np.maximum's third positional argument is ``out``, not a third input.
        both = functools.reduce(np.maximum if a["mode"] == "max" else np.minimum, parts)
        return [both.astype(NUMPY_INT[a["out_type"]])]
