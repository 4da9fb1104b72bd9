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

Weights are calibrated per output channel along ``axis``. A grouped ConvTranspose's
weight ``[C, O/groups, k...]`` lists only ``O/groups`` output channels on axis 1: its node
has ``groups`` and one scale per output channel, laid out as
``grids.output_scale_array`` says. A weight read by a conv
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

from hbtools.ops import twins
from hbtools.ops.base import REQUIRED, HzOp, LoweringContext, attrs_of
from hbtools.ops.names import calibration_node, fed_input
from hbtools.ops.registry import register
from hbtools.quant import grids
from hbtools.quant.grids import grid_bounds, input_scale_array, scales_for


def quantize_weight(w: np.ndarray, a: dict, rounding: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """Integer levels of a weight calibration node (float32 arithmetic, as the lowering), and ``u``."""
    w = np.asarray(w, dtype=np.float32)
    u = None
    if "input_scales" in a:
        u = input_scale_array(w.shape, a["input_scales"], a["input_axis"], a.get("group", 1))
    levels = grids.quantize(w if u is None else w * u, _scales(a, w.ndim, w.shape), a["bits"], offsets=rounding)
    return levels, u


def _known_levels(node: NodeProto, a: dict, ctx: LoweringContext) -> np.ndarray | None:
    """float32 levels of a weight calibration node on a constant (and constant rounding offsets), else None."""
    w = ctx.known(node.input[0])
    rounding = node.input[1] if len(node.input) > 1 and node.input[1] else None
    offsets = ctx.known(rounding) if rounding else None
    if a.get("kind") != "weight" or w is None or w.dtype != np.float32 or (rounding and offsets is None):
        return None
    return quantize_weight(w, a, offsets)[0].astype(np.float32)


def _scales(a: dict, rank: int | None, shape: list | tuple | None = None) -> np.ndarray:
    """A calibration node's float32 scales, shaped to broadcast along its axis (spread over a
    grouped ConvTranspose weight of ``shape``, which it then needs)."""
    scales = np.asarray(a["scales"], dtype=np.float32)
    axis = a.get("axis", -1)
    groups = int(a.get("groups") or 1)
    if groups > 1 and scales.size > 1:
        if shape is None or any(not isinstance(d, int) for d in shape):
            raise ValueError(f"per-channel calibration of a weight in {groups} groups needs the weight's shape")
        return grids.output_scale_array(shape, scales, axis, groups)
    if scales.size > 1 and axis >= 0 and rank is None:
        raise ValueError(f"per-channel calibration along axis {axis} needs the tensor's rank")
    return grids.along_axis(scales, axis if axis >= 0 else None, rank)


@register
class HzCalibration(HzOp):
    op_type = "HzCalibration"
    attributes = {"kind": REQUIRED, "thresholds": REQUIRED, "scales": REQUIRED, "bits": REQUIRED, "axis": -1,
                  "method": "max", "zero_points": None, "input_scales": None, "input_axis": None, "group": None,
                  "groups": None}
    shape_preserving = True
    float_output = True

    @classmethod
    def build(cls, tensor: str, output: str, *, kind: str, thresholds: np.ndarray, bits: int,
              axis: int = -1, method: str = "max", scales: np.ndarray | None = None,
              zero_points: np.ndarray | None = None, input_scales: np.ndarray | None = None,
              input_axis: int = 1, group: int = 1, rounding: str | None = None, groups: int = 1) -> NodeProto:
        thresholds = np.atleast_1d(np.asarray(thresholds, dtype=np.float64))
        scales = scales_for(thresholds, bits) if scales is None else np.atleast_1d(scales).astype(np.float32)
        extra: dict = {}
        if zero_points is not None:
            extra["zero_points"] = [int(z) for z in np.atleast_1d(zero_points)]
        if input_scales is not None:
            extra.update(input_scales=[float(u) for u in np.asarray(input_scales, dtype=np.float32)],
                         input_axis=int(input_axis), group=int(group))
        if groups > 1:
            extra["groups"] = int(groups)
        return cls.make_node(
            [tensor, rounding] if rounding else [tensor], [output], calibration_node(tensor), kind=kind,
            thresholds=[float(t) for t in thresholds], scales=[float(s) for s in scales],
            bits=int(bits), axis=int(axis), method=method, **extra,
        )

    @classmethod
    def lower(cls, node: NodeProto, ctx: LoweringContext) -> list[NodeProto]:
        a = attrs_of(node)
        channel_step = None
        if int(a.get("groups") or 1) > 1:
            scales = _scales(a, ctx.rank(node.input[0]), ctx.shapes.get(node.input[0]))
            # Spread over two axes, the steps no longer list the output channels: their
            # convolution's accumulator reads them from this one (Twin.channel_step).
            if ctx.exact:
                channel_step = ctx.constant(f"{node.name}_channel_scales", np.asarray(a["scales"], np.float32))
        else:
            scales = _scales(a, ctx.rank(node.input[0]))
        shape = list(scales.shape)
        scalar_step = scales.size == 1
        x, y = node.input[0], node.output[0]
        base = node.name
        zero_points = a.get("zero_points")
        bits = int(a["bits"])
        lo, hi = grid_bounds(bits, zero_points is not None)
        if ctx.feed_calibration and a.get("kind") == "activation":
            # Scale and grid are fed at run time: one session scores any threshold and bit width.
            scale = ctx.graph_input(fed_input(base, "scale"), TensorProto.FLOAT, shape)
            qmax_in = ctx.graph_input(fed_input(base, "qmax"), TensorProto.FLOAT, [])
            zp = qmin_in = None
            if zero_points is not None:
                zp = ctx.graph_input(fed_input(base, "zero_point"), TensorProto.FLOAT, shape)
                qmin_in = ctx.graph_input(fed_input(base, "qmin"), TensorProto.FLOAT, [])
            nodes: list[NodeProto] = []
            if qmin_in is None:
                qmin_in = ctx.unique(f"{base}_qmin")
                nodes.append(helper.make_node("Neg", [qmax_in], [qmin_in], name=qmin_in))
            if ctx.exact and x in ctx.twins:
                twins.fake_quant_twin(ctx, x, y, scale, (qmin_in, qmax_in), bits, zp, base, nodes,
                                      scalar_step=scalar_step)
                return nodes
            fq_nodes, levels = _fake_quant(x, y, scale, (qmin_in, qmax_in), ctx, base, zp)
            nodes += fq_nodes
            twins.levels_twin(ctx, y, levels, scale, bits, base, nodes, scalar_step=scalar_step)
            return nodes
        nodes = []
        offset = None
        if len(node.input) > 1 and node.input[1]:
            offset = ctx.unique(f"{base}_rounding")
            nodes.append(helper.make_node("Cast", [node.input[1]], [offset], name=offset, to=TensorProto.FLOAT))
        scale = ctx.constant(f"{base}_scales", scales)
        if "input_scales" in a:
            wshape = ctx.shapes.get(x)
            if wshape is None:
                raise ValueError(f"{node.name}: input_scales need the weight's shape")
            u = ctx.constant(f"{base}_input_scales",
                             input_scale_array(wshape, a["input_scales"], a["input_axis"], a.get("group", 1)))
            folded, quantized = ctx.unique(f"{base}_folded"), ctx.unique(f"{base}_fq")
            nodes.append(helper.make_node("Mul", [x, u], [folded], name=folded))
            fq_nodes, levels = _fake_quant(folded, quantized, scale, (float(lo), float(hi)), ctx, base, offset=offset)
            nodes += fq_nodes
            nodes.append(helper.make_node("Div", [quantized, u], [y], name=ctx.unique(f"{base}_unfold")))
            twins.levels_twin(ctx, y, levels, scale, bits, base, nodes, folded=True, scalar_step=scalar_step,
                              channel_step=channel_step)
            return nodes
        zp = None
        if zero_points is not None:
            zp = ctx.constant(f"{base}_zero_points", np.asarray(zero_points, dtype=np.float32).reshape(shape))
        if ctx.exact and x in ctx.twins:
            bounds = (ctx.constant(f"{base}_qmin", np.array(lo, dtype=np.float32)),
                      ctx.constant(f"{base}_qmax", np.array(hi, dtype=np.float32)))
            twins.fake_quant_twin(ctx, x, y, scale, bounds, bits, zp, base, nodes, scalar_step=scalar_step)
            return nodes
        if ctx.exact and twins.int8_fake_quant(ctx, x, y, scales, (lo, hi), bits, a.get("kind"), zp, nodes):
            return nodes
        fq_nodes, levels = _fake_quant(x, y, scale, (float(lo), float(hi)), ctx, base, zp, offset=offset)
        nodes += fq_nodes
        known = _known_levels(node, a, ctx) if zp is None and ctx.exact else None
        if known is not None:  # a constant weight: its levels as a constant too (the quantized model's integers)
            levels = ctx.constant(f"{base}_levels", known)
        twins.levels_twin(ctx, y, levels, scale, bits, base, nodes, scalar_step=scalar_step,
                          int8_levels=bits == 8 and zp is None and a.get("kind") == "activation",
                          channel_step=channel_step)
        return nodes

    @classmethod
    def reference(cls, node: NodeProto, inputs: list[np.ndarray]) -> list[np.ndarray]:
        a = attrs_of(node)
        x = inputs[0]
        s = _scales(a, x.ndim, x.shape)
        rounding = inputs[1] if len(inputs) > 1 else None
        if "input_scales" in a:
            q, u = quantize_weight(x, a, rounding)
            return [((q * s) / u).astype(np.float32)]
        z = 0 if "zero_points" not in a else np.asarray(a["zero_points"], dtype=np.float32).reshape(s.shape)
        return [grids.fake_quantize(x, s, a["bits"], zero_point=z, asymmetric="zero_points" in a,
                                    offsets=rounding)]


def _fake_quant(x: str, y: str, scale: str, bounds: tuple, ctx: LoweringContext, base: str,
                zero_point: str | None = None, offset: str | None = None) -> tuple[list[NodeProto], str]:
    """Div, Round, (+z), Clip, (-z), Mul; and the name of the levels (before the Mul).

    ``bounds`` are numbers or fed tensor names.
    """
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
    return nodes, clp


@register
class HzBiasCalibration(HzOp):
    """A conv bias moved onto its accumulator grid, as the integer kernel adds it (int32).

    ``y = round(x / step) * step`` with ``step = input_scale * weight_scales * gain`` per
    output channel: the input's activation step (1 when the input's per-channel scales are
    folded into the weight), the weight's step and, for a Gemm, ``|alpha| / beta``.

    Attributes: ``weight_scales`` (floats), ``input_scale`` (float), ``gain`` (float, default
    1), ``input_calibration`` (str: the activation calibration node whose step the input
    carries; with ``feed_calibration`` its fed scale is used, so a threshold search scores
    the bias its candidate implies), ``axis`` (int, the bias's channel axis, default -1),
    ``float_bias`` (floats: the bias before bias correction changed it, for the debugger's
    float model; not read here).
    """

    op_type = "HzBiasCalibration"
    attributes = {"weight_scales": REQUIRED, "input_scale": REQUIRED, "gain": 1.0, "input_calibration": "",
                  "float_bias": None}
    shape_preserving = True
    float_output = True

    @classmethod
    def build(cls, bias: str, output: str, name: str, *, weight_scales: np.ndarray, input_scale: float,
              input_calibration: str = "", gain: float = 1.0) -> NodeProto:
        return cls.make_node([bias], [output], name, weight_scales=[float(s) for s in np.atleast_1d(weight_scales)],
                             input_scale=float(input_scale), gain=float(gain), input_calibration=input_calibration)

    @staticmethod
    def steps(a: dict) -> np.ndarray:
        """The accumulator step per output channel (float64)."""
        return (np.float64(np.float32(a["input_scale"])) * np.asarray(a["weight_scales"], dtype=np.float64)
                * np.float64(a.get("gain", 1.0)))

    @classmethod
    def lower(cls, node: NodeProto, ctx: LoweringContext) -> list[NodeProto]:
        a = attrs_of(node)
        base = node.name
        per_weight = np.asarray(a["weight_scales"], dtype=np.float64) * np.float64(a.get("gain", 1.0))
        nodes: list[NodeProto] = []
        fed = fed_input(a["input_calibration"], "scale") if a.get("input_calibration") else None
        # The step in float64, as the quantize stage divides the bias by it.
        if ctx.feed_calibration and fed is not None:
            input_step = twins.to_double(ctx, fed, f"{base}_input_step", nodes)
            step = ctx.unique(f"{base}_step")
            weight_steps = ctx.constant(f"{base}_weight_steps", per_weight)
            nodes.append(helper.make_node("Mul", [input_step, weight_steps], [step], name=step))
        else:
            step = ctx.constant(f"{base}_step", cls.steps(a))
        known = ctx.known(node.input[0])
        value = ctx.unique(f"{base}_value")
        if ctx.known(step) is not None and known is not None and known.dtype == np.float32:
            # A constant bias on a constant grid: its levels are constants too, which lets a conv requantize
            # its int32 sum with the bias as DequantizeLinear's zero point (``twins``).
            levels = ctx.constant(f"{base}_levels", grids.bias_levels(known.astype(np.float64), ctx.known(step)))
        else:
            levels = cls._levels(ctx, twins.to_double(ctx, node.input[0], base, nodes), step, fed is not None,
                                 base, nodes)
        nodes.append(helper.make_node("Mul", [levels, step], [value], name=value))
        twins.to_float(ctx, value, node.output[0], nodes)
        ctx.twins[node.output[0]] = twins.Twin(value, levels, step, twins.ACCUMULATOR_BITS)
        return nodes

    @staticmethod
    def _levels(ctx: LoweringContext, bias: str, step: str, fed: bool, base: str, nodes: list[NodeProto]) -> str:
        """float64 ``bias / step`` rounded (and clipped to int32 unless the step is fed)."""
        div, levels = ctx.unique(f"{base}_div"), ctx.unique(f"{base}_levels")
        rounded, low = ctx.unique(f"{base}_round"), ctx.unique(f"{base}_low")
        nodes += [helper.make_node("Div", [bias, step], [div], name=div),
                  helper.make_node("Round", [div], [rounded], name=rounded)]
        if ctx.feed_calibration and fed:
            # A candidate grid the search feeds: the model it becomes widens weight grids so the bias
            # fits int32 (quant.plan), so it is scored without the clip.
            nodes.append(helper.make_node("Identity", [rounded], [levels], name=levels))
        else:
            nodes += [helper.make_node("Max", [rounded, ctx.constant(f"{base}_int32_min",
                                                                     np.array(float(grids.INT32_MIN)))],
                                       [low], name=low),
                      helper.make_node("Min", [low, ctx.constant(f"{base}_int32_max",
                                                                 np.array(float(grids.INT32_MAX)))],
                                       [levels], name=levels)]
        return levels

    @classmethod
    def reference(cls, node: NodeProto, inputs: list[np.ndarray]) -> list[np.ndarray]:
        step = cls.steps(attrs_of(node))
        x = np.asarray(inputs[0], dtype=np.float32).astype(np.float64)
        return [(grids.bias_levels(x, step) * step).astype(np.float32)]
