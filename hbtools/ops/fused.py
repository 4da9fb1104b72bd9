"""The calibrated model's convolutions on onnxruntime's integer kernels.

In a calibrated model, ``HzCalibration -> Conv [-> Relu | Clip] -> HzCalibration`` with
int8 per-tensor grids computes exactly what the quantized model's HzSQuantizedConv
computes: integer levels in, the float32 requantization rule, levels out, each times its
step. Lowered as one QLinearConv between a QuantizeLinear and a DequantizeLinear, the
pattern gives the same float32 values as its float64 twins (``hbtools.ops.twins``) at
the quantized model's speed. Used where the calibration grids are constants (not for
the searches' fed grids, nor for the debugger's switched lowering).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from onnx import ModelProto, NodeProto, helper, numpy_helper

from hbtools.ops import twins, uint8_kernels
from hbtools.ops.base import DOMAIN, LoweringContext, attrs_of
from hbtools.ops.calibration import HzBiasCalibration, quantize_weight
from hbtools.ops.uint8_kernels import node_output as _node
from hbtools.quant import grids


@dataclass
class _Pattern:
    conv: NodeProto
    activation: NodeProto | None  # a Relu / Clip between the conv and the output calibration
    output: NodeProto  # the activation HzCalibration after it
    x_scale: float
    y_scale: float
    weight: np.ndarray  # int8 levels
    weight_steps: np.ndarray  # float32, one per output channel
    bias: np.ndarray | None  # int32 levels
    clip: tuple[float | None, float | None] = (None, None)  # a Clip's bounds (float32 values)


def fuse_calibrated_convs(model: ModelProto, ctx: LoweringContext,
                          keep: set[str]) -> tuple[set[str], set[str]]:
    """Names of the Conv nodes to lower as a fused pattern (their patterns go to ``ctx.fused``) and
    of the nodes they absorb.

    A pattern whose float tensors a caller fetches (``keep``) stays unfused.
    """
    if ctx.feed_calibration or not ctx.exact or ctx.opset < 10:
        return set(), set()
    producers = {o: n for n in model.graph.node for o in n.output}
    consumers: dict[str, list[NodeProto]] = {}
    for n in model.graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    outputs = {o.name for o in model.graph.output} | keep
    inits = {t.name: t for t in model.graph.initializer}
    absorbed: set[str] = set()
    for node in model.graph.node:
        if node.op_type != "Conv" or node.domain not in ("", "ai.onnx") or not node.name:
            continue
        pattern = _match(node, producers, consumers, outputs, inits)
        if pattern is not None:
            ctx.fused[node.name] = pattern
            absorbed.update(n.name for n in (pattern.activation, pattern.output) if n is not None)
    return set(ctx.fused), absorbed


def lower(node: NodeProto, ctx: LoweringContext) -> list[NodeProto]:
    """The fused lowering of a Conv that ``fuse_calibrated_convs`` matched."""
    p: _Pattern = ctx.fused[node.name]
    nodes: list[NodeProto] = []
    x = node.input[0]
    x_u8 = ctx.uint8.get(x)
    if x_u8 is None:  # x = levels * s_x in float32: dividing by s_x gives the levels back exactly
        x_u8 = _node(ctx, "QuantizeLinear", [x, _float(ctx, f"{node.name}_x_scale", p.x_scale),
                                             uint8_kernels.uint8_zero(ctx)], f"{x}_u8", nodes)
        ctx.uint8[x] = x_u8
    channels = p.weight.shape[0]
    # The twins' multiplier: float32(step_w * s_x / s_y), each step a float32 number taken to float64.
    m = (p.weight_steps.astype(np.float64) * np.float64(p.x_scale) / np.float64(p.y_scale)).astype(np.float32)
    inputs = [x_u8, uint8_kernels.one(ctx), uint8_kernels.uint8_zero(ctx)]
    if uint8_kernels.signed_weights_exact():
        inputs += [ctx.constant(f"{node.name}_w_levels", p.weight), ctx.constant(f"{node.name}_m", m),
                   ctx.constant(f"{node.name}_w_zero", np.zeros(channels, dtype=np.int8))]
    else:
        inputs += [ctx.constant(f"{node.name}_w_levels", (p.weight.astype(np.int16) + 128).astype(np.uint8)),
                   ctx.constant(f"{node.name}_m", m),
                   ctx.constant(f"{node.name}_w_zero", np.full(channels, 128, dtype=np.uint8))]
    inputs += [uint8_kernels.one(ctx), uint8_kernels.uint8_zero(ctx)]
    if p.bias is not None:
        inputs.append(ctx.constant(f"{node.name}_b_levels", p.bias))
    conv_attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    out = p.output.output[0]
    y = _node(ctx, "QLinearConv", inputs, f"{out}_u8", nodes, **conv_attrs)
    lo, hi = _bounds(p)
    if (lo > -128 or hi < 127) and ctx.opset >= 12:  # a uint8 Clip
        y = _node(ctx, "Clip", [y, ctx.constant(f"{out}_lo", np.array(lo + 128, dtype=np.uint8)),
                                ctx.constant(f"{out}_hi", np.array(hi + 128, dtype=np.uint8))], f"{out}_u8_clip", nodes)
    elif lo > -128 or hi < 127:  # Clip is float-only before opset 12
        value = _node(ctx, "DequantizeLinear", [y, uint8_kernels.one(ctx), uint8_kernels.uint8_zero(ctx)],
                      f"{out}_levels", nodes)
        value = _node(ctx, "Clip", [value, _float(ctx, f"{out}_lo", lo), _float(ctx, f"{out}_hi", hi)],
                      f"{out}_levels_clipped", nodes)
        y = _node(ctx, "QuantizeLinear", [value, uint8_kernels.one(ctx), uint8_kernels.uint8_zero(ctx)],
                  f"{out}_u8_clipped", nodes)
    nodes.append(helper.make_node("DequantizeLinear", [y, _float(ctx, f"{out}_scale", p.y_scale),
                                                       uint8_kernels.uint8_zero(ctx)], [out], name=ctx.unique(out)))
    ctx.uint8[out] = y
    # Its twin for ops that follow the integer rounding downstream: levels and step in float64.
    levels = _node(ctx, "DequantizeLinear", [y, uint8_kernels.one(ctx), uint8_kernels.uint8_zero(ctx)],
                   f"{out}_levels_f32", nodes)
    ctx.twins[out] = twins.Twin(None, twins.to_double(ctx, levels, f"{out}_levels", nodes),
                                ctx.constant(f"{out}_step", np.array(np.float64(p.y_scale))), 8, levels32=levels,
                                int8_levels=True)
    return nodes


def _bounds(p: _Pattern) -> tuple[int, int]:
    """The output levels' range: the grid's, narrowed by a fused Relu / Clip as the twins clip."""
    a = attrs_of(p.output)
    lo, hi = grids.grid_bounds(int(a["bits"]))
    act = p.activation
    if act is None:
        return lo, hi
    if act.op_type == "Relu":
        return max(lo, 0), hi
    s = np.float64(p.y_scale)
    if p.clip[0] is not None:
        lo = max(lo, int(np.round(np.float64(np.float32(p.clip[0])) / s)))
    if p.clip[1] is not None:
        hi = min(hi, int(np.round(np.float64(np.float32(p.clip[1])) / s)))
    return lo, hi


def _match(node: NodeProto, producers: dict, consumers: dict, outputs: set[str], inits: dict) -> _Pattern | None:
    x, w = node.input[0], node.input[1]
    xc, wc = producers.get(x), producers.get(w)
    if not _is_calibration(xc, "activation") or not _is_calibration(wc, "weight") or wc.input[0] not in inits:
        return None
    xa, wa = attrs_of(xc), attrs_of(wc)
    if int(xa["bits"]) != 8 or len(xa["scales"]) != 1 or xa.get("zero_points") is not None:
        return None
    if int(wa["bits"]) != 8 or wa.get("input_scales") is not None:
        return None
    bias = None
    if len(node.input) > 2 and node.input[2]:
        bc = producers.get(node.input[2])
        if bc is None or bc.op_type != "HzBiasCalibration" or bc.domain != DOMAIN or bc.input[0] not in inits:
            return None
        ba = attrs_of(bc)
        bias = grids.bias_levels(numpy_helper.to_array(inits[bc.input[0]]).astype(np.float64),
                                 HzBiasCalibration.steps(ba)).astype(np.int32)
    act, y, clip = None, node.output[0], (None, None)
    readers = consumers.get(y, [])
    if y in outputs or len(readers) != 1:
        return None
    if readers[0].op_type in ("Relu", "Clip") and readers[0].domain in ("", "ai.onnx"):
        act = readers[0]
        if act.op_type == "Clip":
            clip = _constant_clip(act, inits)
            if clip is None:
                return None
        y = act.output[0]
        readers = consumers.get(y, [])
        if y in outputs or len(readers) != 1:
            return None
    yc = readers[0]
    if not _is_calibration(yc, "activation"):
        return None
    ya = attrs_of(yc)
    if int(ya["bits"]) != 8 or len(ya["scales"]) != 1 or ya.get("zero_points") is not None:
        return None
    weight = numpy_helper.to_array(inits[wc.input[0]])
    rounding = numpy_helper.to_array(inits[wc.input[1]]) if len(wc.input) > 1 and wc.input[1] in inits else None
    if len(wc.input) > 1 and wc.input[1] and rounding is None:
        return None
    levels, _ = quantize_weight(weight, wa, rounding)
    steps = np.asarray(wa["scales"], dtype=np.float32)
    if steps.size != levels.shape[0] and steps.size != 1:
        return None
    return _Pattern(node, act, yc, float(np.float32(xa["scales"][0])), float(np.float32(ya["scales"][0])),
                    levels.astype(np.int8), np.broadcast_to(steps, (levels.shape[0],)).copy(), bias, clip)


def _constant_clip(node: NodeProto, inits: dict) -> tuple[float | None, float | None] | None:
    """A Clip's constant bounds (None: bounds given as attributes or computed)."""
    if node.attribute or any(i and i not in inits for i in node.input[1:3]):
        return None
    values = [float(numpy_helper.to_array(inits[i])) if i else None for i in node.input[1:3]]
    return (values + [None, None])[0], (values + [None, None])[1]


def _is_calibration(node: NodeProto | None, kind: str) -> bool:
    return node is not None and node.op_type == "HzCalibration" and node.domain == DOMAIN and \
        attrs_of(node).get("kind") == kind


def _float(ctx: LoweringContext, hint: str, value: float) -> str:
    return ctx.constant(hint, np.array(value, dtype=np.float32))



