"""HzCalibration: fake quantization of one tensor (SPEC §7).

``q = clip(round(x / s) + z, qmin, qmax)``, ``y = (q - z) * s``, round half to even.
Symmetric grids (the default) have ``z = 0`` and ``qmin = -qmax`` with
``s = threshold / qmax``. An asymmetric grid (``optimization: asymmetric``) carries
``zero_points`` and uses the whole integer range (int8: -128..127), so a
non-negative tensor gets twice the resolution.

Attributes: ``kind`` (activation | weight), ``thresholds`` (floats: the largest
magnitude the grid covers, per channel), ``scales`` (floats), ``bits`` (8 | 16),
``axis`` (int, -1 for per tensor), ``method`` (str); optional ``zero_points``
(ints, one per scale; present only on asymmetric grids).

Weights are calibrated per output channel along ``axis``. A weight read by a conv
whose input is calibrated per channel also has ``input_scales`` (that input's
per-channel scales), ``input_axis`` (the weight's input-channel axis) and
``group``: the integer conv folds the input scales into the weight, so the weight
is quantized as ``q = clip(round(w * u / s))``, ``y = q * s / u`` with ``u`` the
input scale of each weight element's input channel.

A weight node may have a second input, ``rounding`` (int8, the weight's shape): the
offset of each integer from nearest rounding chosen by GPTQ
(``hbtools.quant.weight_rounding``), ``q = clip(round(w / s) + rounding)``.
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


def grid_bounds(bits: int, asymmetric: bool) -> tuple[int, int]:
    """Integer range of a grid: symmetric ±qmax, asymmetric the whole signed range."""
    qmax = qmax_for(bits)
    return (-qmax - 1 if asymmetric else -qmax), qmax


def _broadcast_shape(count: int, axis: int, rank: int | None) -> list[int]:
    if count > 1 and axis >= 0 and rank is None:
        raise ValueError(f"per-channel calibration along axis {axis} needs the tensor's rank")
    if count == 1 or axis < 0:
        return [count] if count > 1 else []
    shape = [1] * rank
    shape[axis] = count
    return shape


def input_scale_array(shape: tuple[int, ...] | list[int], input_scales, input_axis: int,
                      group: int = 1) -> np.ndarray:
    """Per-element input-channel scales of a weight of ``shape`` (float32, broadcastable to it).

    A grouped Conv weight ``[O, C/group, k...]`` reads input channel
    ``(o // (O/group)) * C/group + j`` at ``[o, j]``; other weights have the input
    channels along ``input_axis``.
    """
    u = np.asarray(input_scales, dtype=np.float32)
    rank = len(shape)
    if group > 1 and input_axis == 1:
        out, per_group = shape[0], shape[1]
        table = u.reshape(group, per_group)[np.arange(out) // (out // group)]  # [O, C/group]
        return table.reshape(out, per_group, *[1] * (rank - 2))
    bshape = [1] * rank
    bshape[input_axis] = -1
    return u.reshape(bshape)


def quantize_weight(w: np.ndarray, a: dict, rounding: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """Integer levels of a weight calibration node (float32 arithmetic, as the lowering), and ``u``."""
    w = np.asarray(w, dtype=np.float32)
    scales = np.asarray(a["scales"], dtype=np.float32)
    s = scales.reshape(_broadcast_shape(scales.size, a.get("axis", -1), w.ndim))
    qmax = qmax_for(a["bits"])
    u = None
    if "input_scales" in a:
        u = input_scale_array(w.shape, a["input_scales"], a["input_axis"], a.get("group", 1))
        w = w * u
    levels = np.round(w / s)
    if rounding is not None:
        levels = levels + rounding.astype(np.float32)
    return np.clip(levels, -qmax, qmax), u


@register
class HzCalibration(HzOp):
    op_type = "HzCalibration"

    @classmethod
    def build(cls, tensor: str, output: str, *, kind: str, thresholds: np.ndarray, bits: int,
              axis: int = -1, method: str = "max", scales: np.ndarray | None = None,
              zero_points: np.ndarray | None = None, input_scales: np.ndarray | None = None,
              input_axis: int = 1, group: int = 1, rounding: str | None = None) -> NodeProto:
        thresholds = np.atleast_1d(np.asarray(thresholds, dtype=np.float64))
        scales = scales_for(thresholds, bits) if scales is None else np.atleast_1d(scales).astype(np.float32)
        extra: dict = {}
        if zero_points is not None:
            extra["zero_points"] = [int(z) for z in np.atleast_1d(zero_points)]
        if input_scales is not None:
            extra.update(input_scales=[float(u) for u in np.asarray(input_scales, dtype=np.float32)],
                         input_axis=int(input_axis), group=int(group))
        return cls.make_node(
            [tensor, rounding] if rounding else [tensor], [output], f"{tensor}_HzCalibration", kind=kind,
            thresholds=[float(t) for t in thresholds], scales=[float(s) for s in scales],
            bits=int(bits), axis=int(axis), method=method, **extra,
        )

    @classmethod
    def lower(cls, node: NodeProto, ctx: LoweringContext) -> list[NodeProto]:
        a = attrs_of(node)
        scales = np.asarray(a["scales"], dtype=np.float32)
        rank = ctx.rank(node.input[0])
        shape = _broadcast_shape(scales.size, a.get("axis", -1), rank)
        x, y = node.input[0], node.output[0]
        base = node.name
        zero_points = a.get("zero_points")
        lo, hi = grid_bounds(a["bits"], zero_points is not None)
        if ctx.feed_calibration and a.get("kind") == "activation":
            # Scale, grid and an enable flag are fed at run time: y = enable ? fq(x) : x.
            scale = ctx.graph_input(f"{base}_scale", TensorProto.FLOAT, shape)
            qmax_in = ctx.graph_input(f"{base}_qmax", TensorProto.FLOAT, [])
            enable = ctx.graph_input(f"{base}_enable", TensorProto.BOOL, [])
            zp = qmin_in = None
            if zero_points is not None:
                zp = ctx.graph_input(f"{base}_zero_point", TensorProto.FLOAT, shape)
                qmin_in = ctx.graph_input(f"{base}_qmin", TensorProto.FLOAT, [])
            fq = ctx.unique(f"{base}_fq")
            nodes = _fake_quant(x, fq, scale, (qmin_in, qmax_in), ctx, base, zp)
            nodes.append(helper.make_node("Where", [enable, fq, x], [y], name=ctx.unique(f"{base}_where")))
            return nodes
        nodes: list[NodeProto] = []
        offset = None
        if len(node.input) > 1 and node.input[1]:
            offset = ctx.unique(f"{base}_rounding")
            nodes.append(helper.make_node("Cast", [node.input[1]], [offset], name=offset, to=TensorProto.FLOAT))
        if "input_scales" in a:
            wshape = ctx.shapes.get(x)
            if wshape is None:
                raise ValueError(f"{node.name}: input_scales need the weight's shape")
            u = ctx.constant(f"{base}_input_scales",
                             input_scale_array(wshape, a["input_scales"], a["input_axis"], a.get("group", 1)))
            folded, quantized = ctx.unique(f"{base}_folded"), ctx.unique(f"{base}_fq")
            nodes.append(helper.make_node("Mul", [x, u], [folded], name=folded))
            nodes += _fake_quant(folded, quantized, ctx.constant(f"{base}_scales", scales.reshape(shape)),
                                 (float(lo), float(hi)), ctx, base, offset=offset)
            nodes.append(helper.make_node("Div", [quantized, u], [y], name=ctx.unique(f"{base}_unfold")))
            return nodes
        scale = ctx.constant(f"{base}_scales", scales.reshape(shape))
        zp = None
        if zero_points is not None:
            zp = ctx.constant(f"{base}_zero_points", np.asarray(zero_points, dtype=np.float32).reshape(shape))
        return nodes + _fake_quant(x, y, scale, (float(lo), float(hi)), ctx, base, zp, offset=offset)

    @classmethod
    def reference(cls, node: NodeProto, inputs: list[np.ndarray]) -> list[np.ndarray]:
        a = attrs_of(node)
        x = inputs[0]
        scales = np.asarray(a["scales"], dtype=np.float32)
        s = scales.reshape(_broadcast_shape(scales.size, a.get("axis", -1), x.ndim))
        rounding = inputs[1] if len(inputs) > 1 else None
        if "input_scales" in a:
            q, u = quantize_weight(x, a, rounding)
            return [((q * s) / u).astype(np.float32)]
        if rounding is not None:
            q, _ = quantize_weight(x, a, rounding)
            return [(q * s).astype(np.float32)]
        lo, hi = grid_bounds(a["bits"], "zero_points" in a)
        if "zero_points" not in a:
            return [(np.clip(np.round(x / s), lo, hi) * s).astype(np.float32)]
        z = np.asarray(a["zero_points"], dtype=np.float32).reshape(s.shape)
        return [((np.clip(np.round(x / s) + z, lo, hi) - z) * s).astype(np.float32)]


def _fake_quant(x: str, y: str, scale: str, bounds: tuple, ctx: LoweringContext, base: str,
                zero_point: str | None = None, offset: str | None = None) -> list[NodeProto]:
    """Div, Round, (+z), Clip, (-z), Mul; ``bounds`` are numbers or fed tensor names (qmin may be None)."""
    div, rnd, clp = (ctx.unique(f"{base}_{k}") for k in ("div", "round", "clip"))
    qmin, qmax = bounds
    extra = []
    if isinstance(qmax, str):  # a fed grid
        hi = qmax
        if qmin is None:
            lo = ctx.unique(f"{base}_qmin")
            extra.append(helper.make_node("Neg", [hi], [lo], name=lo))
        else:
            lo = qmin
    else:
        lo = ctx.constant(f"{base}_qmin", np.array(qmin, dtype=np.float32))
        hi = ctx.constant(f"{base}_qmax", np.array(qmax, dtype=np.float32))
    nodes = [*extra, helper.make_node("Div", [x, scale], [div], name=div),
             helper.make_node("Round", [div], [rnd], name=rnd)]
    if offset is not None:  # a weight's GPTQ rounding
        moved = ctx.unique(f"{base}_rounded")
        nodes.append(helper.make_node("Add", [rnd, offset], [moved], name=moved))
        rnd = moved
    if zero_point is not None:
        shifted = ctx.unique(f"{base}_shift")
        nodes.append(helper.make_node("Add", [rnd, zero_point], [shifted], name=shifted))
        rnd = shifted
    nodes.append(helper.make_node("Clip", [rnd, lo, hi], [clp], name=clp))
    if zero_point is not None:
        back = ctx.unique(f"{base}_unshift")
        nodes.append(helper.make_node("Sub", [clp, zero_point], [back], name=back))
        clp = back
    nodes.append(helper.make_node("Mul", [clp, scale], [y], name=ctx.unique(f"{base}_mul")))
    return nodes
