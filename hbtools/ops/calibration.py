"""HzCalibration: fake quantization of one tensor (SPEC §7).

``y = clip(round(x / s), qmin, qmax) * s`` with ``s = threshold / qmax``,
round half to even, symmetric (qmin = -qmax). Weights are calibrated per output
channel along ``axis``; activations per tensor.

Attributes: ``kind`` (activation | weight), ``thresholds`` (floats), ``scales``
(floats), ``bits`` (8 | 16), ``axis`` (int, -1 for per tensor), ``method`` (str).
"""

from __future__ import annotations

import numpy as np
from onnx import NodeProto, TensorProto, helper

from hbtools.ops.base import HzOp, LoweringContext, attrs_of
from hbtools.ops.registry import register


def qmax_for(bits: int) -> int:
    return (1 << (bits - 1)) - 1


def scales_for(thresholds: np.ndarray, bits: int) -> np.ndarray:
    # A zero threshold (an all-zero tensor/channel) would divide by zero; any scale works there.
    t = np.where(np.asarray(thresholds, dtype=np.float64) > 0, thresholds, 1.0)
    return (t / qmax_for(bits)).astype(np.float32)


def _broadcast_shape(count: int, axis: int, rank: int | None) -> list[int]:
    if count == 1 or axis < 0 or rank is None:
        return [count] if count > 1 else []
    shape = [1] * rank
    shape[axis] = count
    return shape


@register
class HzCalibration(HzOp):
    op_type = "HzCalibration"

    @classmethod
    def build(cls, tensor: str, output: str, *, kind: str, thresholds: np.ndarray, bits: int,
              axis: int = -1, method: str = "max") -> NodeProto:
        thresholds = np.atleast_1d(np.asarray(thresholds, dtype=np.float64))
        return cls.make_node(
            [tensor], [output], f"{tensor}_HzCalibration", kind=kind,
            thresholds=[float(t) for t in thresholds], scales=[float(s) for s in scales_for(thresholds, bits)],
            bits=int(bits), axis=int(axis), method=method,
        )

    @classmethod
    def lower(cls, node: NodeProto, ctx: LoweringContext) -> list[NodeProto]:
        a = attrs_of(node)
        scales = np.asarray(a["scales"], dtype=np.float32)
        qmax = float(qmax_for(a["bits"]))
        shape = _broadcast_shape(scales.size, a.get("axis", -1), ctx.rank(node.input[0]))
        x, y = node.input[0], node.output[0]
        base = node.name
        if ctx.feed_calibration and a.get("kind") == "activation":
            # Scale, grid size and an enable flag are fed at run time: y = enable ? fq(x) : x.
            scale = ctx.graph_input(f"{base}_scale", TensorProto.FLOAT, shape)
            qmax_in = ctx.graph_input(f"{base}_qmax", TensorProto.FLOAT, [])
            enable = ctx.graph_input(f"{base}_enable", TensorProto.BOOL, [])
            fq = ctx.unique(f"{base}_fq")
            nodes = _fake_quant(x, fq, scale, qmax_in, ctx, base)
            nodes.append(helper.make_node("Where", [enable, fq, x], [y], name=ctx.unique(f"{base}_where")))
            return nodes
        scale = ctx.constant(f"{base}_scales", scales.reshape(shape))
        return _fake_quant(x, y, scale, qmax, ctx, base)

    @classmethod
    def reference(cls, node: NodeProto, inputs: list[np.ndarray]) -> list[np.ndarray]:
        a = attrs_of(node)
        x = inputs[0]
        scales = np.asarray(a["scales"], dtype=np.float32)
        s = scales.reshape(_broadcast_shape(scales.size, a.get("axis", -1), x.ndim))
        qmax = qmax_for(a["bits"])
        return [(np.clip(np.round(x / s), -qmax, qmax) * s).astype(np.float32)]


def _fake_quant(x: str, y: str, scale: str, qmax: float | str, ctx: LoweringContext, base: str) -> list[NodeProto]:
    div, rnd, clp = (ctx.unique(f"{base}_{k}") for k in ("div", "round", "clip"))
    extra = []
    if isinstance(qmax, str):  # a fed grid size
        hi = qmax
        lo = ctx.unique(f"{base}_qmin")
        extra.append(helper.make_node("Neg", [hi], [lo], name=lo))
    else:
        lo = ctx.constant(f"{base}_qmin", np.array(-qmax, dtype=np.float32))
        hi = ctx.constant(f"{base}_qmax", np.array(qmax, dtype=np.float32))
    return [
        *extra,
        helper.make_node("Div", [x, scale], [div], name=div),
        helper.make_node("Round", [div], [rnd], name=rnd),
        helper.make_node("Clip", [rnd, lo, hi], [clp], name=clp),
        helper.make_node("Mul", [clp, scale], [y], name=ctx.unique(f"{base}_mul")),
    ]
