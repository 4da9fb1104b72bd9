"""Double-precision twins: how the calibrated model follows the integer ops' rounding.

The quantized model requantizes in float64 from exact integer sums:
``round(acc * m)``. A float32 graph of fake-quantized values computes the same
value with float32 rounding in the sums and in the division by the next step, and
a value that lands near a rounding tie then takes the other integer. One such
flip is harmless, but a network with global pooling or attention spreads it, so
the lowering of a calibrated model keeps, next to a float32 tensor, its *twin*:
the same value in float64 and, where it is ``levels * step``, the levels and the
step. Products of integer levels run as float32 convolutions over the levels (whole
numbers, exact while sums stay below 2**24: int16 levels are split in two bytes), or,
where the levels are known to be whole numbers of an int8 or int16 grid, on the quantized
model's integer kernels; every fake quant fed by a twin divides in float64, as the
integer ops do.

Twins run through the ops the quantized model computes in integers without a
lookup table: conv-like products, Add/Sub/Mul of two activations, Add/Sub/Mul/Div
with a constant tensor (HzSQuantizedConstantEltwise), global and windowed average pooling,
Concat and data movement (Split included). Element-wise functions (lookup tables in the
quantized model) stay float32, like the tables computed from them, and so do the nodes the
quantized model runs on the CPU (the calibrated model's ``hbtools.cpu_nodes`` record): they
read dequantized float32 values, an accumulator's dequantized with its float32-stored scale.

A fake quant reading an Add or Sub of two twins with levels rounds as the integer add does
(HzSQuantizedEltwise ``requantize_f32``): ``float32(levels_a) * float32(step_a / s)`` plus the
same of b, summed in float32.

Where an int8 fake quant with a constant grid reads an Add/Sub/Mul of two int8-level twins,
a Concat of them, or an integer product's accumulator, its levels are computed on uint8 as
the quantized model computes them: a table of the integer op's rule over every input pair
(or per Concat part), or one QuantizeLinear of the float32 requantization. Same bits, a few
int8 nodes instead of a float64 chain.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from onnx import GraphProto, NodeProto, TensorProto, helper

from hbtools.ops import registry, uint8_kernels
from hbtools.ops.base import LoweringContext, attrs_of, exact_sum, reduced_axes
from hbtools.quant import grids

# Data-movement ops: levels in, levels out; the step does not change.
_MOVES = ("Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Slice", "Identity", "MaxPool", "Resize",
          "GlobalMaxPool", "DepthToSpace", "SpaceToDepth", "Tile", "Gather", "ReduceMax", "ReduceMin",
          "Pad")
_DOUBLE_MOVES = ("Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Slice", "Identity")
_ELEMENTWISE = ("Add", "Sub", "Mul")
_CONSTANT_OPERAND = ("Add", "Sub", "Mul", "Div")
ACCUMULATOR_BITS = 32  # a twin holding an integer product's exact sum


@dataclass
class Int32Sum:
    """A product's int32 accumulator and its bias, where their sum fits int32."""
    acc: str  # int32 sum without the bias
    zero: str | None  # int32 zero point = minus the bias levels, per channel (None: ``fed_bias``)
    channels: int
    axis: int  # the channels' axis
    last: bool  # whether that axis is the last
    # Bias levels fed at run time (a threshold search): float64 per channel, the same shaped to add onto
    # the accumulator, and the bound of the sum's magnitude; whether the biased sum fits int32 is known
    # at run time only.
    fed_bias: tuple[str, str, float] | None = None


@dataclass
class Twin:
    value: str | None  # float64 tensor: the exact value (None: levels * step, made when first read)
    levels: str | None = None  # float64 integer levels (zero point removed), when value = levels * step
    step: str | None = None  # float64 step, broadcastable to the levels
    bits: int = 8
    folded: bool = False  # a weight whose levels carry its input's per-channel steps
    scalar_step: bool = True  # one step for the whole tensor
    levels32: str | None = None  # the same levels as float32, where the lowering has them
    # An accumulator's fused Relu / Clip: float64 value bounds ("" for none), applied to the
    # value but not to the levels (the integer op clips after requantizing).
    bounds: tuple[str, str] | None = None
    int8_levels: bool = False  # levels are whole numbers in -128..127 (no zero point, not fed)
    # Add/Sub/Mul of two int8-level twins: (op, a, b, a's twin, b's twin), for a pair lookup
    pair: tuple | None = None
    # Add/Sub of two twins whose value is levels * one step: (sign of b, a's twin, b's twin), requantized
    # by the integer add's float32 rule (``_sum_levels``)
    sum_of: tuple | None = None
    # Mul of two such twins: (a's twin, b's twin), requantized by the integer mul's float32 rule
    # (``_product_levels``)
    product_of: tuple | None = None
    # Concat of int8-level twins: (axis, [(input, its twin), ...]), requantized part by part
    parts: tuple | None = None
    # A product's accumulator as the integer kernels leave it (``Int32Sum``)
    int32_sum: Int32Sum | None = None
    # A grouped ConvTranspose weight: its float32 steps per output channel, which ``step`` (spread
    # over the weight's two channel axes to broadcast) does not list along one axis
    channel_step: str | None = None
    # An accumulator requantized by the float32 rule, float32(acc) * float32(step / s), as onnxruntime's
    # integer kernels compute it; False: by the float64 rule, round(acc * (step / s)), which the quantized
    # conv keeps where its weight carries its input's per-channel steps (no integer kernel takes those)
    requantize_f32: bool = True


def value_of(ctx: LoweringContext, twin: Twin, nodes: list[NodeProto]) -> str:
    """The float64 value of ``twin``, computed from its levels where nobody needed it before."""
    if twin.value is None:
        twin.value = _node(ctx, "Mul", [twin.levels, twin.step], f"{twin.levels}_value", nodes)
        if twin.bounds is not None:
            twin.value = _clip(ctx, twin.value, twin.bounds, f"{twin.levels}_bounded", nodes)
    return twin.value


def _clip(ctx: LoweringContext, x: str, bounds: tuple[str, str], hint: str, nodes: list[NodeProto]) -> str:
    """float64 ``x`` between ``bounds`` (either may be ""; Max/Min: bounds may be per channel)."""
    lo, hi = bounds
    if lo:
        x = _node(ctx, "Max", [x, lo], f"{hint}_lo", nodes)
    return _node(ctx, "Min", [x, hi], f"{hint}_hi", nodes) if hi else x


def levels32_of(ctx: LoweringContext, twin: Twin, hint: str, nodes: list[NodeProto]) -> str:
    """The float32 levels of ``twin`` (whole numbers, exact in float32)."""
    if twin.levels32 is None:
        twin.levels32 = _node(ctx, "Cast", [twin.levels], f"{hint}_levels_f32", nodes, to=TensorProto.FLOAT)
    return twin.levels32


def _node(ctx: LoweringContext, op: str, inputs: list[str], hint: str, nodes: list[NodeProto], **attrs) -> str:
    out = ctx.unique(hint)
    nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
    return out


def to_double(ctx: LoweringContext, x: str, hint: str, nodes: list[NodeProto]) -> str:
    value = ctx.known(x)
    if value is not None and value.dtype == np.float32:  # a constant: its float64 copy (exact), made when read
        return ctx.cast_constant(f"{hint}_f64", x, np.float64)
    return _node(ctx, "Cast", [x], f"{hint}_f64", nodes, to=TensorProto.DOUBLE)


def _scalar(ctx: LoweringContext, name: str) -> float | None:
    """The float64 number a constant one-element tensor holds, else None."""
    value = ctx.known(name) if name else None
    return None if value is None or value.size != 1 else float(np.asarray(value, dtype=np.float64).reshape(-1)[0])


def _pairable(twin: Twin | None, ctx: LoweringContext) -> bool:
    """Whether a pair lookup can take ``twin``'s levels: int8, one constant step, value = levels * step."""
    return twin is not None and twin.int8_levels and twin.levels is not None and twin.scalar_step \
        and twin.bounds is None and _scalar(ctx, twin.step) is not None


def _summable(twin: Twin) -> bool:
    """Whether ``twin`` is an int8/int16 grid's levels times one step (an integer add's operand)."""
    return twin.levels is not None and twin.bits in (8, 16) and twin.scalar_step and twin.bounds is None \
        and not twin.folded


def _sum_levels(ctx: LoweringContext, sum_of: tuple, s: str, base: str, nodes: list[NodeProto],
                unrounded: bool = False) -> str:
    """The rounded levels (float64 whole numbers) of an Add/Sub of two twins on step ``s``, as the integer
    add computes them (HzSQuantizedEltwise ``requantize_f32``, ``grids.add_f32``):
    ``round(float32(float32(la * ma) + float32(lb * mb)))`` with ``ma = float32(step_a / s)``, the
    quantize stage's multiplier, and ``mb`` with the sign of a Sub."""
    sign, a, b = sum_of
    terms = []
    for k, twin in (("a", a), ("b", b)):
        m = _node(ctx, "Cast", [_node(ctx, "Div", [twin.step, s], f"{base}_{k}_multiplier", nodes)],
                  f"{base}_{k}_multiplier_f32", nodes, to=TensorProto.FLOAT)
        if k == "b" and sign < 0:
            m = _node(ctx, "Neg", [m], f"{base}_b_negated", nodes)
        terms.append(_node(ctx, "Mul", [levels32_of(ctx, twin, f"{base}_{k}", nodes), m], f"{base}_{k}_scaled",
                           nodes))
    total = _node(ctx, "Add", terms, f"{base}_sum_f32", nodes)
    if unrounded:  # the float32 sum itself (``unrounded``)
        return total
    rounded = _node(ctx, "Round", [total], f"{base}_round_f32", nodes)
    return to_double(ctx, rounded, f"{base}_sum_levels", nodes)


def _product_levels(ctx: LoweringContext, product_of: tuple, s: str, base: str, nodes: list[NodeProto],
                    unrounded: bool = False) -> str:
    """The rounded levels (float64 whole numbers) of a Mul of two twins on step ``s``, as the integer mul
    computes them (HzSQuantizedEltwise ``requantize_f32``): ``round(float32(float32(la * lb) * m))`` with
    ``m = float32(step_a * step_b / s)``, the quantize stage's multiplier."""
    a, b = product_of
    m = _node(ctx, "Cast", [_node(ctx, "Div", [_node(ctx, "Mul", [a.step, b.step], f"{base}_steps", nodes), s],
                                  f"{base}_multiplier", nodes)], f"{base}_multiplier_f32", nodes, to=TensorProto.FLOAT)
    product = _node(ctx, "Mul", [levels32_of(ctx, a, f"{base}_a", nodes), levels32_of(ctx, b, f"{base}_b", nodes)],
                    f"{base}_product_f32", nodes)
    scaled = _node(ctx, "Mul", [product, m], f"{base}_scaled_f32", nodes)
    if unrounded:
        return scaled
    rounded = _node(ctx, "Round", [scaled], f"{base}_round_f32", nodes)
    return to_double(ctx, rounded, f"{base}_product_levels", nodes)


def u8_levels(ctx: LoweringContext, x: str, twin: Twin, nodes: list[NodeProto]) -> str:
    """The uint8 copy ``levels + 128`` of int8-level twin ``x`` (made once)."""
    if x not in ctx.uint8:
        ctx.uint8[x] = _node(ctx, "QuantizeLinear", [levels32_of(ctx, twin, x, nodes), uint8_kernels.one(ctx),
                                                      uint8_kernels.uint8_zero(ctx)], f"{x}_u8", nodes)
    return ctx.uint8[x]


def _float32_bounds(ctx: LoweringContext, bounds: tuple[str, str]) -> bool:
    """Whether a fake quant's ``bounds`` (float32 scalars) go to one float32 Clip: constants that are whole
    numbers of an 8- or 16-bit grid, or fed ones (a search's ``qmin`` / ``qmax``, likewise), from opset 11
    (Clip's bounds as inputs). Levels between them are exact in float32, and so is their product with a
    float32 step in float64: its float32 cast is the float32 product."""
    if ctx.opset < 11:
        return False
    numbers = [_scalar(ctx, b) for b in bounds]
    if any(v is None for v in numbers):  # fed: scalar graph inputs (and the Neg of one)
        return True
    lo, hi = numbers
    return -2.0**15 <= lo <= hi < 2.0**15 and lo == int(lo) and hi == int(hi)


def _int8_output(ctx: LoweringContext, y: str, y_u8: str, step: float, nodes: list[NodeProto]) -> None:
    """``y`` = uint8 levels ``y_u8`` (levels + 128) times the float32 ``step``, and its twin.

    The twins make ``y`` as the float32 cast of ``levels * step`` in float64, an exact product (8-bit
    levels, a float32 step): one rounding, the same as DequantizeLinear's float32 product."""
    step32 = ctx.constant(f"{y}_step_f32", np.array(np.float32(step)))
    nodes.append(helper.make_node("DequantizeLinear", [y_u8, step32, uint8_kernels.uint8_zero(ctx)], [y],
                                  name=ctx.unique(f"{y}_value")))
    ctx.uint8[y] = y_u8
    levels32 = _node(ctx, "DequantizeLinear", [y_u8, uint8_kernels.one(ctx), uint8_kernels.uint8_zero(ctx)],
                     f"{y}_levels_f32", nodes)
    ctx.twins[y] = Twin(None, to_double(ctx, levels32, f"{y}_levels", nodes),
                        ctx.constant(f"{y}_step_f64", np.array(np.float64(step))), 8, levels32=levels32,
                        int8_levels=True)


def int8_fake_quant(ctx: LoweringContext, x: str, y: str, scales: np.ndarray, bounds: tuple[int, int], bits: int,
                    kind: str | None, zero_point: str | None, nodes: list[NodeProto]) -> bool:
    """A float32 activation's int8 fake quant on a constant grid as QuantizeLinear (uint8, zero point
    128: x / s rounded half to even, saturated) then DequantizeLinear: the Div, Round, Clip, Mul of the
    fake quant in two passes, and the uint8 levels the integer ops downstream read. False where it does
    not apply (weights, int16, zero points, per-channel steps, opset < 12)."""
    if kind != "activation" or bits != 8 or zero_point is not None or scales.size != 1 or ctx.opset < 12:
        return False
    step = np.float32(scales.reshape(-1)[0])
    y_u8 = _node(ctx, "QuantizeLinear", [x, ctx.constant(f"{y}_scale", np.array(step)),
                                         uint8_kernels.uint8_zero(ctx)], f"{y}_u8", nodes)
    _int8_output(ctx, y, _u8_clip(ctx, y_u8, bounds[0], bounds[1], f"{y}_bounds", nodes), float(step), nodes)
    return True


def _u8_clip(ctx: LoweringContext, x_u8: str, lo: float, hi: float, hint: str, nodes: list[NodeProto]) -> str:
    """uint8 levels clipped to the int8 levels ``lo..hi`` (nothing to do for the whole range)."""
    if lo <= -128 and hi >= 127:
        return x_u8
    bounds = [ctx.constant(f"{hint}_{k}", np.array(int(v) + 128, np.uint8)) for k, v in (("lo", max(lo, -128)),
                                                                                        ("hi", min(hi, 127)))]
    return _node(ctx, "Clip", [x_u8, *bounds], f"{hint}_u8_clip", nodes)


def _accumulator_fake_quant(ctx: LoweringContext, src: Twin, y: str, s: str, bounds: tuple[str, str], base: str,
                            nodes: list[NodeProto]) -> bool:
    """An integer product's requantization to int8: float32(acc) * float32(step / s), rounded half to even
    and clipped, as QuantizeLinear (step 1, zero point 128) does in one node, on uint8 levels."""
    if ctx.opset < 12:  # no uint8 Clip
        return False
    numbers = [_scalar(ctx, n) for n in (s, *bounds)]
    if any(v is None for v in numbers):
        return False
    step, lo, hi = numbers
    if src.bounds is not None:  # a fused Relu / Clip: its bounds' grid points
        for k, b in enumerate(src.bounds):
            value = _scalar(ctx, b) if b else None
            if b and value is None:
                return False
            if value is not None:
                level = float(np.round(np.float64(value) / np.float64(step)))
                lo, hi = (max(lo, level), hi) if k == 0 else (lo, min(hi, level))
        if lo > hi:
            return False
    y_u8 = _node(ctx, "QuantizeLinear", [_requantized(ctx, src, s, base, nodes), uint8_kernels.one(ctx),
                                          uint8_kernels.uint8_zero(ctx)], f"{y}_u8", nodes)
    _int8_output(ctx, y, _u8_clip(ctx, y_u8, lo, hi, f"{y}_bounds", nodes), step, nodes)
    return True


def _requantized(ctx: LoweringContext, src: Twin, s: str, base: str, nodes: list[NodeProto],
                 scalar: bool = True) -> str:
    """An accumulator twin requantized to step ``s`` before rounding: float32(acc) * float32(step / s),
    as onnxruntime's integer conv kernels compute it (HzSQuantizedConv ``requantize_f32``).

    A conv's int32 sum (``Twin.int32_sum``) with ``s`` one step (``scalar``) takes one DequantizeLinear,
    ``float32(sum - zero_point) * m`` in int32 then float32, as the quantized model requantizes: the
    same bits as casting the float64 sum plus bias, without three passes over the map in float64."""
    multiplier = _node(ctx, "Div", [src.step, s], f"{base}_multiplier", nodes)
    if not src.requantize_f32:  # rounded in float64: the whole numbers it gives are exact in float32
        rounded = _node(ctx, "Round", [_node(ctx, "Mul", [src.levels, multiplier], f"{base}_requant_f64", nodes)],
                        f"{base}_round_f64", nodes)
        return _node(ctx, "Cast", [rounded], f"{base}_requant_f32", nodes, to=TensorProto.FLOAT)
    m32 = _node(ctx, "Cast", [multiplier], f"{base}_multiplier_f32", nodes, to=TensorProto.FLOAT)
    total = src.int32_sum
    if total is not None and scalar:
        flat = _node(ctx, "Reshape", [m32, ctx.constant(f"{base}_flat", np.array([-1], np.int64))],
                     f"{base}_multiplier_flat", nodes)
        channels = ctx.constant(f"{base}_channels", np.array([total.channels], np.int64))
        per_channel = _node(ctx, "Expand", [flat, channels], f"{base}_multiplier_channels", nodes)
        out = ctx.unique(f"{base}_requant_f32")
        if total.fed_bias is None:
            uint8_kernels.dequantize_int32(ctx, total.acc, per_channel, total.zero, total.axis, total.last, out,
                                           nodes)
            return out
        _fed_bias_requantized(ctx, total, (per_channel, m32), channels, out, nodes)
        return out
    return _node(ctx, "Mul", [levels32_of(ctx, src, base, nodes), m32], f"{base}_requant_f32", nodes)


def _fed_bias_requantized(ctx: LoweringContext, total: Int32Sum, multipliers: tuple[str, str], channels: str,
                          out: str, nodes: list[NodeProto]) -> None:
    """``_requantized`` of an int32 accumulator whose bias levels are fed (a threshold search): one
    DequantizeLinear with minus the bias as its int32 zero point where the biased sum fits int32 (known at
    run time: a fed int16 grid's bias levels can be large), else the float64 sum, cast to float32 and
    multiplied. Both give float32(acc + bias) * m: the one rounding of the same whole number, then the same
    product; the first in one pass over the map instead of a cast to float64, an add and a cast back."""
    bias, bias_add, bound = total.fed_bias
    per_channel, m32 = multipliers
    largest = _node(ctx, "ReduceMax", [_node(ctx, "Abs", [bias], f"{out}_bias_abs", nodes)], f"{out}_bias_max",
                    nodes, keepdims=0)
    fits = _node(ctx, "Less", [largest, ctx.constant(f"{out}_int32_room", np.array(2.0**31 - bound))],
                 f"{out}_fits_int32", nodes)
    fast, wide = ctx.unique(f"{out}_int32"), ctx.unique(f"{out}_f64")
    then_nodes: list[NodeProto] = []
    flat = _node(ctx, "Reshape", [bias, ctx.constant(f"{out}_flat", np.array([-1], np.int64))], f"{out}_bias_flat",
                 then_nodes)
    spread = _node(ctx, "Expand", [_node(ctx, "Neg", [flat], f"{out}_bias_neg", then_nodes), channels],
                   f"{out}_bias_channels", then_nodes)
    zero = _node(ctx, "Cast", [spread], f"{out}_zero", then_nodes, to=TensorProto.INT32)
    uint8_kernels.dequantize_int32(ctx, total.acc, per_channel, zero, total.axis, total.last, fast, then_nodes)
    acc64, sum64, sum32 = (ctx.unique(f"{out}_{k}") for k in ("acc_f64", "sum_f64", "sum_f32"))
    else_nodes = [helper.make_node("Cast", [total.acc], [acc64], name=acc64, to=TensorProto.DOUBLE),
                  helper.make_node("Add", [acc64, bias_add], [sum64], name=sum64),
                  helper.make_node("Cast", [sum64], [sum32], name=sum32, to=TensorProto.FLOAT),
                  helper.make_node("Mul", [sum32, m32], [wide], name=wide)]
    nodes.append(helper.make_node("If", [fits], [out], name=ctx.unique(f"{out}_if"),
                                  then_branch=_branch(then_nodes, fast), else_branch=_branch(else_nodes, wide)))


def _concat_fake_quant(ctx: LoweringContext, src: Twin, y: str, s: str, bounds: tuple[str, str], base: str,
                       nodes: list[NodeProto]) -> bool:
    """Fake quant (int8, constant grid) of a Concat of int8-level twins: each part's levels through a
    256-entry table of the twins' float64 rule (none where a part already has the output's step)."""
    numbers = [_scalar(ctx, n) for n in (s, *bounds)]
    if any(v is None for v in numbers):
        return False
    step, lo, hi = numbers
    axis, inputs = src.parts
    levels = np.arange(-128, 128, dtype=np.float64)
    parts = []
    for k, (name, twin) in enumerate(inputs):
        q = np.clip(np.round(levels * _scalar(ctx, twin.step) / step), lo, hi)
        u8 = u8_levels(ctx, name, twin, nodes)
        if not np.array_equal(q, levels):
            index = _node(ctx, "Cast", [u8], f"{base}_part{k}_i32", nodes, to=TensorProto.INT32)
            u8 = ctx.unique(f"{base}_part{k}_u8")
            uint8_kernels.lookup(ctx, ctx.constant(f"{base}_part{k}_table", (q + 128).astype(np.uint8)), index, u8,
                                 nodes)
        parts.append(u8)
    _int8_output(ctx, y, _node(ctx, "Concat", parts, f"{y}_u8", nodes, axis=axis), step, nodes)
    return True


def _pair_fake_quant(ctx: LoweringContext, src: Twin, y: str, s: str, bounds: tuple[str, str], base: str,
                     nodes: list[NodeProto]) -> bool:
    """Fake quant (int8, constant grid) of an Add/Sub/Mul of two int8-level twins, by one lookup.

    The table holds, for each pair of input levels, what the integer op computes: for Add/Sub the
    float32 sum of ``_sum_levels``, for Mul the float32 rule of ``_product_levels``; then round half to
    even and clip. From opset 12 the value is computed from the uint8 copies instead, as the quantized
    model does (``uint8_kernels.float32_sum`` / ``float32_product``); the table is then only the check
    that the levels stay int8.
    The output is its levels times the float32 step, which is what the cast of the float64 product
    gives (one rounding of an exact product).
    """
    op, a_name, b_name, a, b = src.pair
    numbers = [_scalar(ctx, n) for n in (a.step, b.step, s, *bounds)]
    if any(v is None for v in numbers):
        return False
    sa, sb, step, lo, hi = numbers
    levels = np.arange(-128, 128, dtype=np.float64)
    if op == "Mul":  # the integer mul's float32 rule (``_product_levels``)
        q = grids.requantize(np.multiply(levels.reshape(-1, 1), levels.reshape(1, -1)), sa * sb / step, lo, hi,
                             single=True)
    else:  # the integer add's float32 rule (``_sum_levels``)
        mb = (-1.0 if op == "Sub" else 1.0) * float(np.float32(sb / step))
        q = np.clip(np.round(grids.add_f32(levels.reshape(-1, 1), levels.reshape(1, -1), sa / step, mb)), lo, hi)
    if q.min() < -128 or q.max() > 127:
        return False
    if ctx.opset >= 12:  # as the quantized model's int8 add or mul computes it
        copies = (u8_levels(ctx, a_name, a, nodes), u8_levels(ctx, b_name, b, nodes))
        if op == "Mul":
            value = uint8_kernels.float32_product(ctx, *copies, (0, 0), np.float32(sa * sb / step), base, nodes)
        else:
            value = uint8_kernels.float32_sum(ctx, *copies, (0, 0), (np.float32(sa / step), np.float32(mb)), base,
                                              nodes)
        _int8_output(ctx, y, uint8_kernels.rounded_u8(ctx, value, 0, (int(lo), int(hi)), y, nodes), step, nodes)
        return True
    table = (q.reshape(-1) + 128).astype(np.uint8)
    rows = _node(ctx, "Cast", [u8_levels(ctx, a_name, a, nodes)], f"{base}_a_i32", nodes, to=TensorProto.INT32)
    rows = _node(ctx, "Mul", [rows, ctx.constant(f"{base}_256", np.array(256, np.int32))], f"{base}_rows", nodes)
    cols = _node(ctx, "Cast", [u8_levels(ctx, b_name, b, nodes)], f"{base}_b_i32", nodes, to=TensorProto.INT32)
    index = _node(ctx, "Add", [rows, cols], f"{base}_index", nodes)
    y_u8 = ctx.unique(f"{y}_u8")
    uint8_kernels.lookup(ctx, ctx.constant(f"{base}_pair_table", table), index, y_u8, nodes)
    _int8_output(ctx, y, y_u8, step, nodes)
    return True


def to_float(ctx: LoweringContext, x_d: str, out: str, nodes: list[NodeProto]) -> None:
    nodes.append(helper.make_node("Cast", [x_d], [out], name=ctx.unique(f"{out}_f32"), to=TensorProto.FLOAT))


def fake_quant_twin(ctx: LoweringContext, x: str, y: str, scale: str, bounds: tuple[str, str], bits: int,
                    zero_point: str | None, base: str, nodes: list[NodeProto], scalar_step: bool = True) -> None:
    """Fake quant of twin-carrying ``x`` in float64: ``y`` (float32) and its twin.

    ``scale``, ``bounds`` and ``zero_point`` are float32 tensors (constants or fed inputs).
    """
    src = ctx.twins[x]
    s = to_double(ctx, scale, f"{base}_scale", nodes)
    lo, hi = (to_double(ctx, b, f"{base}_bound", nodes) for b in bounds)
    int8 = bits == 8 and zero_point is None
    # Levels of a fed grid are whole numbers of whatever grid is fed (the int16 search feeds 16-bit
    # ones to an 8-bit node): int8 only where the bounds are constants within int8.
    int8_levels = int8 and all(v is not None and -128 <= v <= 127 for v in (_scalar(ctx, b) for b in bounds))
    if int8 and src.pair is not None and _pair_fake_quant(ctx, src, y, s, (lo, hi), base, nodes):
        return
    if int8 and src.parts is not None and _concat_fake_quant(ctx, src, y, s, (lo, hi), base, nodes):
        return
    if int8 and src.bits == ACCUMULATOR_BITS and src.levels is not None and \
            _accumulator_fake_quant(ctx, src, y, s, (lo, hi), base, nodes):
        return
    if src.bits == ACCUMULATOR_BITS and src.levels is not None:
        kept = Twin(None, None, s, bits, scalar_step=scalar_step, int8_levels=int8_levels)  # what y's twin records
        _accumulator_fake_quant32(ctx, src, y, (scale, s), bounds, zero_point, base, nodes, kept)
        return
    if zero_point is None and (src.sum_of or src.product_of) and _float32_bounds(ctx, bounds):
        # The integer add's or mul's float32 value rounded, clipped and scaled in float32: the levels are whole
        # numbers within the int16 range, and ``y`` is the one rounding of their exact product with the float32
        # step, as the float32 cast of the float64 product gives it (one Mul, not a float64 chain and a cast).
        unrounded = _sum_levels(ctx, src.sum_of, s, base, nodes, unrounded=True) if src.sum_of is not None else \
            _product_levels(ctx, src.product_of, s, base, nodes, unrounded=True)
        levels32 = _node(ctx, "Clip", [_node(ctx, "Round", [unrounded], f"{base}_round_f32", nodes), *bounds],
                         f"{base}_clip_f32", nodes)
        nodes.append(helper.make_node("Mul", [levels32, scale], [y], name=ctx.unique(f"{base}_fq")))
        # The float64 levels and value as before (dropped where nothing reads them).
        levels = to_double(ctx, levels32, f"{base}_levels", nodes)
        ctx.twins[y] = Twin(_node(ctx, "Mul", [levels, s], f"{base}_fq_f64", nodes), levels, s, bits,
                            scalar_step=scalar_step, int8_levels=int8_levels, levels32=levels32)
        return
    if src.sum_of is not None:  # an integer add: its float32 rule
        q = _sum_levels(ctx, src.sum_of, s, base, nodes)
    elif src.product_of is not None:  # an integer mul: its float32 rule
        q = _product_levels(ctx, src.product_of, s, base, nodes)
    else:
        if src.value is None:
            # levels * (step / s): the integer ops' requantization, multiplier and all.
            multiplier = _node(ctx, "Div", [src.step, s], f"{base}_multiplier", nodes)
            ratio = _node(ctx, "Mul", [src.levels, multiplier], f"{base}_div_f64", nodes)
        else:
            ratio = _node(ctx, "Div", [src.value, s], f"{base}_div_f64", nodes)
        q = _node(ctx, "Round", [ratio], f"{base}_round_f64", nodes)
    z = to_double(ctx, zero_point, f"{base}_zp", nodes) if zero_point else None
    if z:
        q = _node(ctx, "Add", [q, z], f"{base}_shift_f64", nodes)
    if ctx.opset >= 12:
        q = _node(ctx, "Clip", [q, lo, hi], f"{base}_clip_f64", nodes)
    else:  # no float64 Clip before opset 12
        q = _node(ctx, "Min", [_node(ctx, "Max", [q, lo], f"{base}_lo_f64", nodes), hi], f"{base}_hi_f64", nodes)
    if z:
        q = _node(ctx, "Sub", [q, z], f"{base}_unshift_f64", nodes)
    value = _node(ctx, "Mul", [q, s], f"{base}_fq_f64", nodes)
    to_float(ctx, value, y, nodes)
    ctx.twins[y] = Twin(value, q, s, bits, scalar_step=scalar_step, int8_levels=int8_levels)


def _accumulator_fake_quant32(ctx: LoweringContext, src: Twin, y: str, scale: tuple[str, str],
                              bounds: tuple[str, str], zero_point: str | None, base: str, nodes: list[NodeProto],
                              twin: Twin) -> None:
    """An integer product's requantization, float32(acc) * float32(step / s) as onnxruntime's integer
    conv kernels compute it (HzSQuantizedConv ``requantize_f32``), and the rest of the fake quant, in
    float32: the rounding, clips and zero point work on whole numbers below 2**24, and the output is the
    one rounding of levels * step, so float32 gives the float64 chain's bits at half the traffic.

    ``twin`` (step, bits, flags) becomes ``y``'s twin once its levels and value are filled in."""
    scale32, s = scale
    q = _node(ctx, "Round", [_requantized(ctx, src, s, base, nodes, twin.scalar_step)], f"{base}_round", nodes)
    single = zero_point is None and _float32_bounds(ctx, bounds)  # the grid's two bounds in one Clip
    if src.bounds is not None:  # a fused activation clips the rounded result at its bounds' grid points
        levels = tuple(_node(ctx, "Cast", [_node(ctx, "Round", [_node(ctx, "Div", [b, s], f"{base}_act_bound", nodes)],
                                                  f"{base}_act_level", nodes)], f"{base}_act_level_f32", nodes,
                             to=TensorProto.FLOAT) if b else "" for b in src.bounds)
        if single and levels[0] and not levels[1] and twin.scalar_step:
            # A Relu's: a lower bound too, taken into the grid's Clip (Max after Max is the Max of both bounds).
            bounds = (_node(ctx, "Max", [levels[0], bounds[0]], f"{base}_act_low_grid", nodes), bounds[1])
        else:
            q = _clip(ctx, q, levels, f"{base}_act_clip", nodes)
    if zero_point:
        q = _node(ctx, "Add", [q, zero_point], f"{base}_shift", nodes)
    q = _node(ctx, "Clip", [q, *bounds], f"{base}_clip", nodes) if single else _clip(ctx, q, bounds, f"{base}_clip",
                                                                                       nodes)
    if zero_point:
        q = _node(ctx, "Sub", [q, zero_point], f"{base}_unshift", nodes)
    levels = to_double(ctx, q, f"{base}_levels", nodes)
    nodes.append(helper.make_node("Mul", [q, scale32], [y], name=ctx.unique(f"{base}_fq")))
    twin.levels, twin.levels32 = levels, q
    ctx.twins[y] = twin


def levels_twin(ctx: LoweringContext, y: str, levels: str, scale: str, bits: int, base: str,
                nodes: list[NodeProto], *, folded: bool = False, scalar_step: bool = True,
                int8_levels: bool = False, channel_step: str | None = None) -> None:
    """Record the twin of a float32 fake-quant output ``y`` = ``levels * scale`` (float32 tensors).

    ``int8_levels``: the levels are whole numbers in -128..127 (an int8 grid without zero point);
    ``channel_step``: a grouped ConvTranspose weight's steps per output channel (``Twin.channel_step``)."""
    if not ctx.exact:
        return
    lev = to_double(ctx, levels, f"{base}_levels", nodes)
    s = to_double(ctx, scale, f"{base}_step", nodes)
    value = to_double(ctx, y, f"{base}_value", nodes) if folded else None
    per_channel = to_double(ctx, channel_step, f"{base}_channel_step", nodes) if channel_step else None
    ctx.twins[y] = Twin(value, lev, s, bits, folded, scalar_step, levels32=levels, int8_levels=int8_levels,
                        channel_step=per_channel)


def lower_standard(node: NodeProto, ctx: LoweringContext) -> list[NodeProto]:
    """Twin nodes for standard ``node`` when its integer form rounds in float64; else none."""
    if not ctx.exact or not ctx.twins or node.domain not in ("", "ai.onnx") or not node.output \
            or node.name in ctx.cpu_nodes:
        return []
    op = node.op_type
    data = [i for i in node.input if i and i not in ctx.constants]
    if not data or any(i not in ctx.twins for i in data):
        return []
    nodes: list[NodeProto] = []
    if op in ("Conv", "ConvTranspose"):
        done = _conv(node, ctx, nodes)
    elif op in ("Gemm", "MatMul"):
        done = _product(node, ctx, nodes)
    elif op in _ELEMENTWISE and len(data) == 2 and data[0] == data[1]:
        done = False  # x * x, x + x: a function of one tensor, a lookup table computed in float32
    elif op in _ELEMENTWISE and len(data) == 2:
        done = _same_op(node, ctx, nodes)
        a, b = (ctx.twins[i] for i in node.input[:2])
        if _pairable(a, ctx) and _pairable(b, ctx):
            ctx.twins[node.output[0]].pair = (op, node.input[0], node.input[1], a, b)
        if _summable(a) and _summable(b):
            if op == "Mul":
                ctx.twins[node.output[0]].product_of = (a, b)
            else:
                ctx.twins[node.output[0]].sum_of = (-1.0 if op == "Sub" else 1.0, a, b)
    elif op in _CONSTANT_OPERAND and len(data) == 1 and _tensor_constant(node, ctx):
        # HzSQuantizedConstantEltwise applies the constant in float64 (a scalar one is a table).
        done = _same_op(node, ctx, nodes)
    elif op == "PRelu" and data == node.input[:1] and _tensor_constant(node, ctx):
        done = _prelu(node, ctx, nodes)
    elif op == "Relu" or (op == "Clip" and ctx.opset >= 12):
        # Fused into a conv's requantization when it reads the accumulator; anywhere else it is a
        # lookup table, computed (like the table) in float32.
        done = ctx.twins[data[0]].bits == ACCUMULATOR_BITS and _fused_activation(node, ctx, nodes)
    elif op == "Concat" or registry.float64_exact(op):
        done = _same_op(node, ctx, nodes)
        inputs = [(i, ctx.twins.get(i)) for i in node.input]
        if op == "Concat" and inputs and all(_pairable(t, ctx) for _, t in inputs):
            axis = next(a.i for a in node.attribute if a.name == "axis")
            ctx.twins[node.output[0]].parts = (axis, inputs)
    elif op in ("GlobalAveragePool", "ReduceMean", "ReduceSum"):
        done = _global_average(node, ctx, nodes)
    elif op == "AveragePool":
        done = _average_pool(node, ctx, nodes)
    elif op in _MOVES and len(data) == 1 and len(node.output) == 1:
        done = _move(node, ctx, nodes)
    elif op == "Split" and len(data) == 1:
        done = _split(node, ctx, nodes)
    else:
        done = False
    return nodes if done else []


def _twin_input(i: str, ctx: LoweringContext, nodes: list[NodeProto]) -> str:
    """The float64 form of a node input: its twin, or a cast of a float constant."""
    if i in ctx.twins:
        return value_of(ctx, ctx.twins[i], nodes)
    if i in ctx.float_constants:
        return to_double(ctx, i, i, nodes)
    return i  # shapes, axes, indices: as they are


def _same_op(node: NodeProto, ctx: LoweringContext, nodes: list[NodeProto]) -> bool:
    """The node itself, run on float64 twins."""
    value = ctx.unique(f"{node.output[0]}_f64")
    twin = helper.make_node(node.op_type, [_twin_input(i, ctx, nodes) if i else "" for i in node.input], [value],
                            name=value)
    twin.attribute.extend(node.attribute)
    nodes.append(twin)
    _replace_output(node, ctx, value, nodes)
    return True


def _replace_output(node: NodeProto, ctx: LoweringContext, value: str, nodes: list[NodeProto],
                    twin: Twin | None = None) -> None:
    """The node's float32 output becomes the cast of its twin."""
    to_float(ctx, value, node.output[0], nodes)
    ctx.twins[node.output[0]] = twin or Twin(value)


def _replace_output_by_accumulator(node: NodeProto, ctx: LoweringContext, twin: Twin,
                                   nodes: list[NodeProto]) -> None:
    """The node's float32 output as HzDequantize makes it from the int32 accumulator.

    Only CPU nodes and model outputs read an accumulator as float; the quantized model hands
    them ``levels * scale`` in float64 with the scale stored as float32 (a node attribute), so
    the step is rounded to float32 here too. The twin keeps the exact step for its requantization.
    """
    stored = _node(ctx, "Cast", [_node(ctx, "Cast", [twin.step], f"{node.output[0]}_step_f32", nodes,
                                       to=TensorProto.FLOAT)], f"{node.output[0]}_step_stored", nodes,
                   to=TensorProto.DOUBLE)
    dequantized = Twin(None, twin.levels, stored, bounds=twin.bounds)
    _replace_output(node, ctx, value_of(ctx, dequantized, nodes), nodes, twin)


def _fused_activation(node: NodeProto, ctx: LoweringContext, nodes: list[NodeProto]) -> bool:
    """Relu / Clip on a conv accumulator: the levels stay, the bounds go with them (the integer
    op requantizes, then clips)."""
    src = ctx.twins[node.input[0]]
    if src.levels is None or src.bounds is not None:
        return _same_op(node, ctx, nodes)
    zero = ctx.constant(f"{node.name}_zero", np.array(0.0))
    if node.op_type == "Relu":
        bounds = (zero, "")
    else:
        bounds = tuple(to_double(ctx, i, f"{node.name}_bound", nodes) if i else ""
                       for i in [*node.input[1:3], "", ""][:2])
    twin = Twin(None, src.levels, src.step, ACCUMULATOR_BITS, scalar_step=src.scalar_step, levels32=src.levels32,
                bounds=bounds, int32_sum=src.int32_sum, requantize_f32=src.requantize_f32)
    _replace_output_by_accumulator(node, ctx, twin, nodes)
    return True


def _prelu(node: NodeProto, ctx: LoweringContext, nodes: list[NodeProto]) -> bool:
    """PRelu with a slope per channel as its integer kernel computes it, ``max(v, 0) + slope * min(v, 0)``
    in float64 (onnxruntime has no float64 PRelu)."""
    v = _twin_input(node.input[0], ctx, nodes)
    zero = ctx.constant(f"{node.name}_zero", np.array(0.0))
    negative = _node(ctx, "Mul", [_twin_input(node.input[1], ctx, nodes), _node(ctx, "Min", [v, zero],
                                                                               f"{node.name}_neg", nodes)],
                     f"{node.name}_sloped", nodes)
    value = _node(ctx, "Add", [_node(ctx, "Max", [v, zero], f"{node.name}_pos", nodes), negative],
                  f"{node.output[0]}_f64", nodes)
    _replace_output(node, ctx, value, nodes)
    return True


def _tensor_constant(node: NodeProto, ctx: LoweringContext) -> bool:
    """Whether ``node`` has a float constant operand of more than one value."""
    shapes = [ctx.shapes.get(i) for i in node.input if i in ctx.float_constants]
    return any(s is None or int(np.prod(s)) > 1 for s in shapes) and bool(shapes)


def _split(node: NodeProto, ctx: LoweringContext, nodes: list[NodeProto]) -> bool:
    """Split of a twin: its levels (or, with per-channel steps, its value) split the same way."""
    src = ctx.twins[node.input[0]]
    by_levels = src.levels is not None and src.scalar_step
    parts = [ctx.unique(f"{o}_f64") for o in node.output]
    split = helper.make_node("Split", [src.levels if by_levels else value_of(ctx, src, nodes), *node.input[1:]],
                             parts, name=ctx.unique(f"{node.name}_f64"))
    split.attribute.extend(node.attribute)
    nodes.append(split)
    for out, part in zip(node.output, parts, strict=True):
        twin = Twin(None, part, src.step, src.bits, int8_levels=src.int8_levels, bounds=src.bounds,
                    requantize_f32=src.requantize_f32) if by_levels else \
            Twin(part, scalar_step=src.scalar_step)
        to_float(ctx, value_of(ctx, twin, nodes), out, nodes)
        ctx.twins[out] = twin
    return True


def _move(node: NodeProto, ctx: LoweringContext, nodes: list[NodeProto]) -> bool:
    src = ctx.twins[node.input[0]]
    # Reshape and the like may move the channel axis a per-channel step lies along: move the value.
    if src.levels is None or (not src.scalar_step and node.op_type in _DOUBLE_MOVES):
        return _same_op(node, ctx, nodes) if node.op_type in _DOUBLE_MOVES else False
    if src.bounds is not None and node.op_type == "Pad":  # a pad value outside a fused Relu's bounds
        return False
    # Move the levels (as float32, exact, for ops without a float64 kernel); the step stays.
    double = node.op_type in _DOUBLE_MOVES
    levels = src.levels if double else levels32_of(ctx, src, node.name, nodes)
    moved = ctx.unique(f"{node.output[0]}_levels")
    copy = helper.make_node(node.op_type, [levels, *node.input[1:]], [moved], name=moved)
    copy.attribute.extend(node.attribute)
    nodes.append(copy)
    # A fused Relu / Clip goes with the levels: element-wise bounds commute with picking and moving elements.
    twin = Twin(None, moved if double else to_double(ctx, moved, moved, nodes), src.step, src.bits,
                scalar_step=src.scalar_step, levels32=None if double else moved, int8_levels=src.int8_levels,
                bounds=src.bounds, requantize_f32=src.requantize_f32)
    _replace_output(node, ctx, value_of(ctx, twin, nodes), nodes, twin)
    return True


def _global_average(node: NodeProto, ctx: LoweringContext, nodes: list[NodeProto]) -> bool:
    """GlobalAveragePool, ReduceMean or ReduceSum as the integer op computes it: the sum of the levels,
    times step / window (1 for ReduceSum) in float64."""
    src = ctx.twins[node.input[0]]
    shape = ctx.shapes.get(node.input[0])
    if src.levels is None or not shape or any(not isinstance(d, int) or d <= 0 for d in shape):
        return False
    keepdims = 1
    axes = list(range(2, len(shape)))
    if node.op_type in ("ReduceMean", "ReduceSum"):
        attrs = attrs_of(node)
        keepdims = int(attrs.get("keepdims", 1))
        given = len(node.input) > 1 and bool(node.input[1])
        if (given and ctx.known(node.input[1]) is None) or not src.scalar_step:  # steps along a summed axis
            return False
        axes = reduced_axes(attrs, ctx.known(node.input[1]) if given else None, len(shape))
    window = float(np.prod([shape[k] for k in axes])) if node.op_type != "ReduceSum" else 1.0
    total = exact_sum(ctx, src.levels, axes, keepdims, ctx.elements(node.input[0]), f"{node.name}_sum_f64", nodes)
    per = _node(ctx, "Div", [src.step, ctx.constant(f"{node.name}_window", np.array(window))],
                f"{node.name}_step_f64", nodes)
    value = _node(ctx, "Mul", [total, per], f"{node.output[0]}_f64", nodes)
    _replace_output(node, ctx, value, nodes)
    return True


def _average_pool(node: NodeProto, ctx: LoweringContext, nodes: list[NodeProto]) -> bool:
    """AveragePool as the integer op computes it: window sums of the levels (a depthwise float32
    convolution with a ones kernel, exact below 2**24), then times step / window in float64."""
    src = ctx.twins[node.input[0]]
    shape = ctx.shapes.get(node.input[0])
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    kernel = list(attrs.get("kernel_shape", []))
    pads = list(attrs.get("pads") or [0] * 2 * len(kernel))
    window = int(np.prod(kernel)) if kernel else 0
    if src.levels is None or not src.scalar_step or not shape or not isinstance(shape[1], int) or not window \
            or attrs.get("ceil_mode", 0) or attrs.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET") \
            or (any(pads) and not attrs.get("count_include_pad", 0)) or window << (src.bits - 1) >= 2**24:
        return False
    ones = ctx.constant(f"{node.name}_ones", np.ones([shape[1], 1, *kernel], dtype=np.float32))
    conv = {k: v for k, v in (("strides", attrs.get("strides")), ("pads", pads), ("dilations", attrs.get("dilations")))
            if v}
    total = _node(ctx, "Conv", [levels32_of(ctx, src, node.name, nodes), ones], f"{node.name}_sum", nodes,
                  kernel_shape=kernel, group=shape[1], **conv)
    per = _node(ctx, "Div", [src.step, ctx.constant(f"{node.name}_window", np.array(float(window)))],
                f"{node.name}_step_f64", nodes)
    value = _node(ctx, "Mul", [to_double(ctx, total, total, nodes), per], f"{node.output[0]}_f64", nodes)
    _replace_output(node, ctx, value, nodes)
    return True


def _product(node: NodeProto, ctx: LoweringContext, nodes: list[NodeProto]) -> bool:
    """Gemm / MatMul in float64: products of two float32-step values are exact to 2**-53.

    A MatMul of levels (a scalar step on the left; on the right one step, or one per column of
    a weight) keeps the integer accumulator, whose requantization follows the integer op's.
    """
    if any(ctx.twins.get(i) is not None and ctx.twins[i].folded for i in node.input):
        return False
    a, b = (ctx.twins.get(i) for i in node.input[:2])
    if a is None or b is None or a.levels is None or b.levels is None or not a.scalar_step \
            or a.bits == ACCUMULATOR_BITS or b.bits == ACCUMULATOR_BITS:
        return _same_op(node, ctx, nodes)
    out = node.output[0]
    int32_sum = None
    if node.op_type == "MatMul":
        integer = _integer_product(node, ctx, a, b, 1.0, nodes)
        acc = integer[0] if integer else _node(ctx, "MatMul", [a.levels, b.levels], f"{out}_acc_f64", nodes)
        rank = ctx.rank(out)
        int32_sum = _int32_sum(ctx, integer, None, node.name, None if rank is None else rank - 1, last=True)
        step = _node(ctx, "Mul", [a.step, b.step], f"{out}_acc_step", nodes)
    else:
        gemm = _gemm_accumulator(node, ctx, a, b, nodes)
        if gemm is None:
            return _same_op(node, ctx, nodes)
        acc, step, int32_sum = gemm
    twin = Twin(None, acc, step, ACCUMULATOR_BITS, scalar_step=b.scalar_step, int32_sum=int32_sum)
    _replace_output_by_accumulator(node, ctx, twin, nodes)
    return True


def _integer_product(node: NodeProto, ctx: LoweringContext, a: Twin, b: Twin, sign: float,
                     nodes: list[NodeProto]) -> tuple[str, str | None, float, int] | None:
    """``_integer_conv`` for a MatMul / Gemm (``sign`` of its alpha) of activation levels by a constant
    int8 weight: MatMulInteger on uint8 activations (int16 ones in two bytes), as the quantized model
    runs it; ``(A @ B)`` for a MatMul, ``sign * A @ op(B)`` for a Gemm. None where it does not apply."""
    w = ctx.known(b.levels32) if b.levels32 else None
    if w is None or w.ndim != 2 or b.bits != 8 or ctx.opset < 10 \
            or not (a.bits == 16 or (a.bits == 8 and a.int8_levels)):
        return None
    if node.op_type == "Gemm" and helper.get_attribute_value(
            next((x for x in node.attribute if x.name == "transB"), helper.make_attribute("transB", 0))):
        w = w.T
    w = w * np.float32(sign)
    bound = float(np.abs(w).sum(axis=0, dtype=np.float64).max(initial=0.0)) * \
        (2.0 ** (a.bits - 1) + (256 if a.bits == 16 else 0))
    in_int32 = bound < 2.0**31
    if a.bits == 16:
        parts = uint8_kernels.int16_parts(ctx, levels32_of(ctx, a, f"{node.name}_a", nodes), node.name, nodes,
                                          signed=False)
    else:
        parts = [(u8_levels(ctx, node.input[0], a, nodes), uint8_kernels.uint8_zero(ctx), 1.0)]
    weights, zero = uint8_kernels.gemm_weights(ctx, w, node.name)
    acc = uint8_kernels.accumulate(ctx, parts, weights, {}, in_int32, node.name, nodes, op="MatMulInteger",
                                   w_zero=zero)
    return _accumulator(ctx, acc, in_int32, bound, w.shape[1], nodes)


def _gemm_accumulator(node: NodeProto, ctx: LoweringContext, a: Twin, b: Twin,
                      nodes: list[NodeProto]) -> tuple[str, str, tuple | None] | None:
    """Levels and step of ``alpha * A @ op(B) + beta * C`` on the integer accumulator (and its
    ``Twin.int32_sum``).

    The quantize stage folds ``sign(alpha)`` into the weight levels, ``|alpha|`` into its
    steps and ``beta`` into the bias levels (HzBiasCalibration's gain), so the accumulator is
    ``sign(alpha) * (A @ op(B)) + C`` in levels with step ``s_a * (s_b * |alpha|)``.
    """
    attrs = {x.name: helper.get_attribute_value(x) for x in node.attribute}
    alpha = float(attrs.get("alpha", 1.0))
    bias = node.input[2] if len(node.input) > 2 and node.input[2] else None
    c = ctx.twins.get(bias) if bias else None
    if attrs.get("transA", 0) or alpha == 0.0 or (bias and (c is None or c.levels is None)):
        return None
    out = node.output[0]
    integer = _integer_product(node, ctx, a, b, float(np.sign(alpha)), nodes)
    acc = integer[0] if integer else _node(ctx, "Gemm", [a.levels, b.levels], f"{out}_acc_f64", nodes,
                                           alpha=float(np.sign(alpha)), transB=int(attrs.get("transB", 0)))
    int32_sum = _int32_sum(ctx, integer, c.levels if c is not None else None, node.name, 1, last=True,
                           bias_add=c.levels if c is not None else None)
    if c is not None:
        acc = _node(ctx, "Add", [acc, c.levels], f"{out}_acc_bias", nodes)
    column_steps = _node(ctx, "Reshape", [b.step, ctx.constant(f"{out}_columns", np.array([-1], dtype=np.int64))],
                         f"{out}_b_step", nodes)
    if abs(alpha) != 1.0:
        column_steps = _node(ctx, "Mul", [column_steps, ctx.constant(f"{out}_alpha", np.array(abs(alpha)))],
                             f"{out}_b_step_alpha", nodes)
    return acc, _node(ctx, "Mul", [a.step, column_steps], f"{out}_acc_step", nodes), int32_sum


def _conv(node: NodeProto, ctx: LoweringContext, nodes: list[NodeProto]) -> bool:
    """A convolution over integer levels: float32 sums of whole numbers, then one float64 product."""
    x, w = ctx.twins.get(node.input[0]), ctx.twins.get(node.input[1])
    rank = ctx.rank(node.output[0])
    if x is None or w is None or x.levels is None or w.levels is None or rank is None:
        return False
    bias = node.input[2] if len(node.input) > 2 and node.input[2] else None
    if bias and (bias not in ctx.twins or ctx.twins[bias].levels is None):
        return False
    if not w.folded and not x.scalar_step:
        return False
    integer = _integer_conv(node, ctx, x, w, nodes)
    acc, acc32 = (integer[0], None) if integer else _float_conv(node, ctx, x, w, nodes)
    channel_shape = ctx.constant(f"{node.name}_channels", np.array([-1] + [1] * (rank - 2), dtype=np.int64))
    b = _node(ctx, "Reshape", [ctx.twins[bias].levels, channel_shape], f"{node.name}_bias_levels", nodes) \
        if bias else None
    int32_sum = _int32_sum(ctx, integer, ctx.twins[bias].levels if bias else None, node.name, 1,
                           last=False, bias_add=b)  # a map: its channels on axis 1
    if bias:
        acc = _node(ctx, "Add", [acc, b], f"{node.name}_acc_bias", nodes)
        if acc32 is not None:
            # onnxruntime may fuse a constant bias into the Conv, whose kernel adds it with the partial sums:
            # the same float32 result only where every partial sum is a whole number within 2**24.
            bound = np.inf if w.folded or node.op_type != "Conv" else _weight_sum(ctx, w, 0, np.inf) * 2.0**x.bits
            acc32 = _plus_bias32(ctx, acc32, ctx.twins[bias].levels, b, channel_shape, bound, node.name, nodes)
    step = _node(ctx, "Reshape", [w.channel_step or w.step, channel_shape], f"{node.name}_w_step", nodes)
    if not w.folded:
        step = _node(ctx, "Mul", [step, x.step], f"{node.name}_acc_step", nodes)
    # A weight carrying its input's per-channel steps: the quantized conv requantizes by the float64 rule
    # (``quant.emitters.conv``).
    twin = Twin(None, acc, step, ACCUMULATOR_BITS, scalar_step=False, levels32=acc32, int32_sum=int32_sum,
                requantize_f32=not w.folded)
    _replace_output_by_accumulator(node, ctx, twin, nodes)
    return True


def _float_conv(node: NodeProto, ctx: LoweringContext, x: Twin, w: Twin,
                nodes: list[NodeProto]) -> tuple[str, str | None]:
    """The float64 accumulator of a Conv / ConvTranspose from float32 convolutions over the levels, and
    the float32 one where a single convolution gives it (int8 levels; None for int16's two bytes)."""
    w32 = levels32_of(ctx, w, f"{node.name}_w", nodes)
    x32 = levels32_of(ctx, x, f"{node.name}_x", nodes)
    parts = [(x32, 1.0)]
    if x.bits > 8:  # int16 levels: two bytes, so every sum stays an exact float32 integer
        c256 = ctx.constant(f"{node.name}_256", np.array(256.0, dtype=np.float32))
        hi = _node(ctx, "Floor", [_node(ctx, "Div", [x32, c256], f"{node.name}_x_div", nodes)],
                   f"{node.name}_x_hi", nodes)
        lo = _node(ctx, "Sub", [x32, _node(ctx, "Mul", [hi, c256], f"{node.name}_x_hi256", nodes)],
                   f"{node.name}_x_lo", nodes)
        parts = [(hi, 256.0), (lo, 1.0)]
    acc = None
    for part, weight in parts:
        out = ctx.unique(f"{node.name}_acc")
        conv = helper.make_node(node.op_type, [part, w32], [out], name=out)
        conv.attribute.extend(node.attribute)
        nodes.append(conv)
        term = to_double(ctx, out, out, nodes)
        if weight != 1.0:
            term = _node(ctx, "Mul", [term, ctx.constant(f"{node.name}_k", np.array(weight))], f"{out}_k", nodes)
        acc = term if acc is None else _node(ctx, "Add", [acc, term], f"{node.name}_acc_sum", nodes)
    return acc, (out if len(parts) == 1 else None)


# Whole numbers up to this magnitude are exact in float32.
FLOAT32_WHOLE = 2.0**24


def _branch(nodes: list[NodeProto], out: str) -> GraphProto:
    """An If branch computing float32 ``out`` from outer-scope values."""
    return helper.make_graph(nodes, out, [], [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)])


def _plus_bias32(ctx: LoweringContext, acc32: str, levels: str, bias: str, channel_shape: str, bound: float,
                 hint: str, nodes: list[NodeProto]) -> str | None:
    """float32 ``acc32 + bias`` where it equals the float32 cast of the float64 sum: IEEE addition rounds
    the exact sum of its operands once, so it does wherever the bias levels are exact in float32 (whole
    numbers within 2**24). One float32 pass over the map instead of a cast to float64, an add and a cast back.

    ``levels``: the bias levels (float64, per channel), ``bias`` the same reshaped to the accumulator's
    channel axis. Constant levels are checked here (None: the float64 sum stays) with ``bound``, the largest
    magnitude of the convolution's partial sums (inf where they need not be whole numbers); fed ones (a
    threshold search) pick the float32 or the float64 sum at run time."""
    known = ctx.known(levels)
    if known is not None:
        if bound + float(np.max(np.abs(known), initial=0.0)) >= FLOAT32_WHOLE:
            return None
        b32 = _node(ctx, "Reshape", [ctx.constant(f"{hint}_bias_f32", known.astype(np.float32)), channel_shape],
                    f"{hint}_bias_levels_f32", nodes)
        return _node(ctx, "Add", [acc32, b32], f"{hint}_acc_bias_f32", nodes)
    largest = _node(ctx, "ReduceMax", [_node(ctx, "Abs", [bias], f"{hint}_bias_abs", nodes)], f"{hint}_bias_max",
                    nodes, keepdims=0)
    exact = _node(ctx, "Less", [largest, ctx.constant(f"{hint}_whole_f64", np.array(FLOAT32_WHOLE + 0.5))],
                  f"{hint}_bias_exact", nodes)
    out = ctx.unique(f"{hint}_acc_bias_f32")
    fast, b32, wide, acc64, sum64 = (ctx.unique(f"{out}_{k}") for k in ("f32", "bias", "f64", "acc_f64", "sum_f64"))
    then_branch = _branch([helper.make_node("Cast", [bias], [b32], name=b32, to=TensorProto.FLOAT),
                           helper.make_node("Add", [acc32, b32], [fast], name=fast)], fast)
    else_branch = _branch([helper.make_node("Cast", [acc32], [acc64], name=acc64, to=TensorProto.DOUBLE),
                           helper.make_node("Add", [acc64, bias], [sum64], name=sum64),
                           helper.make_node("Cast", [sum64], [wide], name=wide, to=TensorProto.FLOAT)], wide)
    nodes.append(helper.make_node("If", [exact], [out], name=out, then_branch=then_branch, else_branch=else_branch))
    return out


def _int32_sum(ctx: LoweringContext, integer: tuple[str, str | None, float, int] | None, bias_levels: str | None,
               hint: str, axis: int | None, *, last: bool, bias_add: str | None = None) -> Int32Sum | None:
    """``Twin.int32_sum`` of a product whose integer accumulator is int32 (``_integer_conv``,
    ``_integer_product``; channels along ``axis``, ``last`` if that is the last axis) and whose bias
    levels are constants that keep every biased sum within int32, or are fed (``bias_add``: the same
    shaped to add onto the accumulator); else None."""
    if integer is None or integer[1] is None or axis is None:
        return None
    _, acc, bound, channels = integer
    bias = np.zeros(channels) if bias_levels is None else ctx.known(bias_levels)
    if bias is None and bias_add is not None:
        return Int32Sum(acc, None, channels, axis, last, fed_bias=(bias_levels, bias_add, bound))
    if bias is None or bias.size not in (1, channels) or bound + float(np.max(np.abs(bias))) >= 2.0**31:
        return None
    zero = np.broadcast_to(-np.asarray(bias, np.float64).reshape(-1), (channels,)).astype(np.int32)
    return Int32Sum(acc, ctx.constant(f"{hint}_acc_zero", zero), channels, axis, last)


def _integer_conv(node: NodeProto, ctx: LoweringContext, x: Twin, w: Twin,
                  nodes: list[NodeProto]) -> tuple[str, str | None, float, int] | None:
    """The float64 accumulator of a Conv from onnxruntime's integer kernels (``uint8_kernels``), as the
    quantized model computes it: int8 levels, or int16 levels in two bytes, against int8 weight levels.
    With it the int32 accumulator (None where sums may not fit int32), the bound of its magnitude, and
    the number of output channels.

    Only where the levels are whole numbers of the layout: int16 grids, and int8 grids without a zero
    point. None elsewhere.
    """
    shape = ctx.shapes.get(node.input[1])
    if node.op_type != "Conv" or ctx.opset < 10 or w.folded \
            or w.bits != 8 or not (x.bits == 16 or (x.bits == 8 and x.int8_levels)) \
            or not shape or any(not isinstance(d, int) or d <= 0 for d in shape):
        return None
    x32 = levels32_of(ctx, x, f"{node.name}_x", nodes)
    weight_sum = _weight_sum(ctx, w, 0, 127.0 * int(np.prod(shape[1:])))
    bound = weight_sum * (2.0 ** (x.bits - 1) + (256 if x.bits == 16 else 0))
    in_int32 = bound < 2.0**31
    conv_attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if int(conv_attrs.get("group", 1)) > 1:  # as the quantized model's grouped convs (float32, exact)
        acc = uint8_kernels.grouped_accumulator(ctx, x32, 2.0 ** (x.bits - 1), x.bits == 16,
                                                levels32_of(ctx, w, f"{node.name}_w", nodes), weight_sum,
                                                conv_attrs, in_int32, node.name, nodes,
                                                kernel_elements=int(np.prod(shape[1:])))
        if acc is not None:
            return _accumulator(ctx, acc, in_int32, bound, shape[0], nodes)
    if x.bits == 16:
        parts = uint8_kernels.int16_parts(ctx, x32, node.name, nodes)
    elif uint8_kernels.signed_weights_exact():
        x8 = _node(ctx, "QuantizeLinear", [x32, uint8_kernels.one(ctx), uint8_kernels.int8_zero(ctx)],
                   f"{node.name}_x_i8", nodes)
        parts = [(x8, uint8_kernels.int8_zero(ctx), 1.0)]
    else:
        parts = [(u8_levels(ctx, node.input[0], x, nodes), uint8_kernels.uint8_zero(ctx), 1.0)]
    w_u8 = _node(ctx, "QuantizeLinear", [levels32_of(ctx, w, f"{node.name}_w", nodes), uint8_kernels.one(ctx),
                                         uint8_kernels.uint8_zero(ctx)], f"{node.name}_w_u8", nodes)
    acc = uint8_kernels.accumulate(ctx, parts, w_u8, conv_attrs, in_int32, node.name, nodes)
    return _accumulator(ctx, acc, in_int32, bound, shape[0], nodes)


def _weight_sum(ctx: LoweringContext, w: Twin, axis: int, worst: float) -> float:
    """The largest sum of |levels| of a weight over one output (channel ``axis``; ``worst`` where the levels
    are not constants): with the largest input level, the bound of every partial sum of a product."""
    levels = ctx.known(w.levels32) if w.levels32 else None
    if levels is None or levels.ndim < 2:
        return worst
    # |levels| are whole numbers, exact in float32; summed in float64 without a float64 copy of the weight
    # (VGG-16's fc6: 0.8 GB per temporary)
    return float(np.abs(np.moveaxis(levels, axis, 0)).reshape(levels.shape[axis], -1)
                 .sum(axis=1, dtype=np.float64).max(initial=0.0))


def _accumulator(ctx: LoweringContext, acc: str, in_int32: bool, bound: float, channels: int,
                 nodes: list[NodeProto]) -> tuple[str, str | None, float, int]:
    if in_int32:
        return to_double(ctx, acc, acc, nodes), acc, bound, channels
    return acc, None, bound, channels
