"""Integer products and lookups on the layouts onnxruntime's MLAS kernels accelerate.

int8 -> int8 convolutions run as QLinearConv, MatMuls as QLinearMatMul, a Gemm with a
bias as a 1x1 QLinearConv; other integer convolutions (int16 inputs split into bytes,
int16/int32 outputs) take their exact accumulator from ConvInteger against uint8
weights ``w + 128``; lookup tables are GatherElements over the flattened index.

MLAS, onnxruntime's kernel library, accelerates integer convolutions whose
activations are uint8; int8 activations take a slow generic path (ConvInteger on
int8 runs slower than the float model). An int8 level ``q`` is carried as the uint8
``q + 128`` with zero point 128, which QLinearConv removes exactly. QLinearConv
requantizes as ``round(float32(acc + bias) * float32(x_scale * w_scale / y_scale))``;
with ``x_scale = y_scale = 1`` and ``w_scale = m`` that is the float32 rule of
``HzSQuantizedConv`` (attribute ``requantize_f32``), so the lowering and the numpy
reference agree bit for bit.

Weights stay int8 (U8S8) where that kernel is exact: x86 with VNNI, and other
architectures. x86 without VNNI multiplies u8 x s8 pairs with a saturating 16-bit
instruction (``vpmaddubsw``), so there the weights are carried as uint8 ``w + 128``
too (U8U8, exact everywhere, slower).

Each int8 tensor gets at most one uint8 copy (``LoweringContext.uint8``); a conv
writes its uint8 result there and converts back to int8 only for readers that need
it (unread conversions are dropped with the other unread nodes).
"""

from __future__ import annotations

import functools
import platform

import numpy as np
from onnx import NodeProto, TensorProto, helper, numpy_helper

from hbtools.ops.base import CONTRIB_DOMAIN, LoweringContext

OFFSET = 128  # uint8 = int8 + OFFSET


@functools.cache
def signed_weights_exact() -> bool:
    """Whether MLAS's u8 x s8 kernels are exact on this machine (no 16-bit saturation)."""
    machine = platform.machine().lower()
    if machine not in ("x86_64", "amd64", "i386", "i686", "x86"):
        return True
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return False  # unknown x86: the exact kernel
    return "avx512_vnni" in flags or "avx_vnni" in flags


def dequantize_int32(ctx: LoweringContext, acc: str, scale: str, zero: str, axis: int, last_axis: bool, out: str,
                     nodes: list[NodeProto]) -> None:
    """``out = float32(acc - zero) * scale`` of an int32 ``acc``, ``scale`` and ``zero`` per channel along
    ``axis`` (1-D) or scalars: one DequantizeLinear, which computes exactly that.

    Where the channels are the last axis (a Gemm's or MatMul's output) each channel's block is one
    element, and onnxruntime's per-axis DequantizeLinear walks them one by one: the same IEEE operations
    as Sub (int32), Cast and Mul, which broadcast the [channels] vectors along the last axis, run three to
    four times faster (the 40 x 6625 CTC head of PP-OCR rec: 1.0 ms against 0.3 ms).
    """
    if last_axis:
        shifted = ctx.unique(f"{out}_shifted")
        widened = ctx.unique(f"{out}_float")
        nodes += [helper.make_node("Sub", [acc, zero], [shifted], name=shifted),
                  helper.make_node("Cast", [shifted], [widened], name=widened, to=TensorProto.FLOAT),
                  helper.make_node("Mul", [widened, scale], [out], name=ctx.unique(f"{out}_scaled"))]
        return
    nodes.append(helper.make_node("DequantizeLinear", [acc, scale, zero], [out], name=ctx.unique(out), axis=axis,
                                  domain=CONTRIB_DOMAIN))


def as_uint8(ctx: LoweringContext, x: str, nodes: list[NodeProto]) -> str:
    """The uint8 copy ``x + 128`` of int8 tensor ``x`` (made once)."""
    if x in ctx.uint8:
        return ctx.uint8[x]
    value = _node(ctx, "DequantizeLinear", [x, one(ctx), int8_zero(ctx)], f"{x}_as_float", nodes)
    u8 = _node(ctx, "QuantizeLinear", [value, one(ctx), uint8_zero(ctx)], f"{x}_u8", nodes)
    ctx.uint8[x] = u8
    return u8


def uint8_copy(ctx: LoweringContext, x: str, nodes: list[NodeProto]) -> str | None:
    """``x``'s uint8 copy when ``x`` is known to be int8 (made if needed), else None."""
    if x in ctx.uint8:
        return ctx.uint8[x]
    return as_uint8(ctx, x, nodes) if known_int8(ctx, x) else None


def known_int8(ctx: LoweringContext, x: str) -> bool:
    """Whether ``x`` is an int8 tensor whose uint8 copy exists or can be made."""
    return x in ctx.uint8 or x in ctx.int8_tensors


def _holds_levels(ctx: LoweringContext, x: str) -> bool:
    """Whether ``x`` holds a quantized model's int8 levels (an integer op's output, or a move or exact
    cast of one), as opposed to a calibrated model's float values that merely have a uint8 copy."""
    return x in ctx.int8_tensors or x in ctx.level_tensors


def to_int8(ctx: LoweringContext, u8: str, out: str, nodes: list[NodeProto]) -> None:
    """int8 ``out`` = uint8 ``u8`` - 128, recorded as ``out``'s uint8 copy."""
    value = _node(ctx, "DequantizeLinear", [u8, one(ctx), uint8_zero(ctx)], f"{out}_as_float", nodes)
    nodes.append(_make("QuantizeLinear", [value, one(ctx), int8_zero(ctx)], out, ctx))
    ctx.uint8[out] = u8


def conv(ctx: LoweringContext, node: NodeProto, a: dict, conv_attrs: dict, nodes: list[NodeProto]) -> bool:
    """``node`` (an int8 -> int8 HzSQuantizedConv) as QLinearConv; False where it does not apply."""
    w_name = node.input[1]
    weight = ctx.constant_values.get(w_name)
    out_min, out_max = int(a["out_min"]), int(a["out_max"])
    z_x, z_y = int(a.get("x_zero_point", 0)), int(a.get("zero_point", 0))
    if (a["kind"] != "Conv" or a.get("x_bits", 8) != 8 or a["out_type"] != "int8" or weight is None
            or len(weight.dims) not in (3, 4) or not a.get("requantize_f32") or not -128 <= out_min <= out_max <= 127
            or not -128 <= z_x <= 127 or not -128 <= z_y <= 127 or ctx.opset < 10):
        return False
    w = numpy_helper.to_array(weight)
    channels = w.shape[0]
    m = np.broadcast_to(np.asarray(a["multiplier"], dtype=np.float64), (channels,)).astype(np.float32)
    if signed_weights_exact():
        w_in, w_zero = w_name, ctx.constant(f"{node.name}_w_zero", np.zeros(channels, dtype=np.int8))
    else:
        w_in = ctx.constant(f"{node.name}_w_u8", (w.astype(np.int16) + OFFSET).astype(np.uint8))
        w_zero = ctx.constant(f"{node.name}_w_zero", np.full(channels, OFFSET, dtype=np.uint8))
    inputs = [as_uint8(ctx, node.input[0], nodes), one(ctx),
              ctx.constant(f"{node.name}_x_zero", np.array(OFFSET + z_x, dtype=np.uint8)),
              w_in, ctx.constant(f"{node.name}_m", m), w_zero, one(ctx),
              ctx.constant(f"{node.name}_y_zero", np.array(OFFSET + z_y, dtype=np.uint8))]
    if len(node.input) > 2 and node.input[2]:
        inputs.append(node.input[2])
    y = _node(ctx, "QLinearConv", inputs, f"{node.output[0]}_u8", nodes, **conv_attrs)
    _finish(ctx, node, y, out_min, out_max, nodes)
    return True


def _finish(ctx: LoweringContext, node: NodeProto, y: str, out_min: int, out_max: int,
            nodes: list[NodeProto]) -> None:
    """The node's int8 output (and its uint8 copy) from the kernel's uint8 ``y``, clipped to its range."""
    if out_min == -128 and out_max == 127:
        to_int8(ctx, y, node.output[0], nodes)
    elif ctx.opset >= 12:  # a uint8 Clip
        lo = ctx.constant(f"{node.name}_lo", np.array(out_min + OFFSET, dtype=np.uint8))
        hi = ctx.constant(f"{node.name}_hi", np.array(out_max + OFFSET, dtype=np.uint8))
        to_int8(ctx, _node(ctx, "Clip", [y, lo, hi], f"{node.output[0]}_u8_clip", nodes), node.output[0], nodes)
    else:  # Clip is float-only before opset 12: clip the float value both forms are made from
        value = _node(ctx, "DequantizeLinear", [y, one(ctx), uint8_zero(ctx)], f"{node.output[0]}_as_float", nodes)
        lo = ctx.constant(f"{node.name}_lo", np.array(out_min, dtype=np.float32))
        hi = ctx.constant(f"{node.name}_hi", np.array(out_max, dtype=np.float32))
        value = _node(ctx, "Clip", [value, lo, hi], f"{node.output[0]}_clipped", nodes)
        nodes.append(_make("QuantizeLinear", [value, one(ctx), int8_zero(ctx)], node.output[0], ctx))
        ctx.uint8[node.output[0]] = _node(ctx, "QuantizeLinear", [value, one(ctx), uint8_zero(ctx)],
                                          f"{node.output[0]}_u8", nodes)


def conv_accumulator(ctx: LoweringContext, node: NodeProto, a: dict, conv_attrs: dict, nodes: list[NodeProto],
                     bias_max: float = 0.0) -> tuple[str, bool] | None:
    """The exact accumulator of an HzSQuantizedConv (kind Conv, constant weight, any input bits)
    from ConvInteger with uint8 weights ``w + 128``: the layouts MLAS accelerates (int8 or uint8
    activations against uint8 weights, about 15x faster than int8 weights). None where it does
    not apply; else the accumulator and whether it is int32 (it is where every sum, plus a bias
    up to ``bias_max``, fits int32; otherwise float64)."""
    w = ctx.known(node.input[1])
    bits, z = int(a.get("x_bits", 8)), int(a.get("x_zero_point", 0))
    if a["kind"] != "Conv" or w is None or bits not in (8, 16) or (bits == 16 and z) or not -128 <= z <= 127 \
            or ctx.opset < 10:
        return None
    x = node.input[0]
    # Every sum is at most |x - z| <= 2**(bits-1) + |z| times an output channel's sum of |w| (the
    # int16 parts add 256 times it: 256 * hi and lo are summed one after the other).
    weight_sum = float(np.abs(w.astype(np.int64)).reshape(w.shape[0], -1).sum(axis=1).max(initial=0))
    bound = weight_sum * (2.0 ** (bits - 1) + abs(z) + (256.0 if bits == 16 else 0.0)) + bias_max
    in_int32 = bound < 2.0**31
    if int(conv_attrs.get("group", 1)) > 1:
        levels = float_levels(ctx, x, bits, z, node.name, nodes)
        w_f32 = ctx.constant(f"{node.name}_w_f32", w.astype(np.float32))
        acc = grouped_accumulator(ctx, levels, 2 ** (bits - 1) + abs(z), bits == 16, w_f32, weight_sum, conv_attrs,
                                  in_int32, node.name, nodes, weights=w)
        if acc is not None:
            return acc, in_int32
    w_u8 = ctx.constant(f"{node.name}_w_u8", (w.astype(np.int16) + OFFSET).astype(np.uint8))
    if bits == 8:
        parts = int8_parts(ctx, x, z, node.name, nodes)
    else:
        parts = int16_parts(ctx, float_levels(ctx, x, 16, 0, node.name, nodes), node.name, nodes, source=x)
    return accumulate(ctx, parts, w_u8, conv_attrs, in_int32, node.name, nodes), in_int32


def float_levels(ctx: LoweringContext, x: str, bits: int, z: int, hint: str, nodes: list[NodeProto]) -> str:
    """The levels ``x - z`` of an int8 or int16 tensor as float32 whole numbers."""
    copy = ctx.float_copies.get(x)
    xf = copy[0] if copy and copy[1] == TensorProto.FLOAT else \
        _node(ctx, "Cast", [x], f"{hint}_x_f32", nodes, to=TensorProto.FLOAT)
    if z:
        xf = _node(ctx, "Sub", [xf, _shared(ctx, f"{z}_f32", np.array(z, np.float32))], f"{hint}_x_levels", nodes)
    return xf


def grouped_accumulator(ctx: LoweringContext, levels: str, level_max: float, split: bool, w_f32: str,
                        weight_sum: float, conv_attrs: dict, in_int32: bool, hint: str,
                        nodes: list[NodeProto], *, weights: np.ndarray | None = None,
                        kernel_elements: int | None = None) -> str | None:
    """The exact accumulator of a grouped (e.g. depthwise) conv from float32 convolutions; None where
    float32 would not be exact.

    onnxruntime's ConvInteger has no grouped kernel: it runs group by group, a depthwise 5x5 ten
    times slower than the float conv. A float32 conv of whole numbers is exact while every partial
    sum stays below 2**24: with levels up to ``level_max`` and at most ``weight_sum`` for an output's
    sum of |w|, in one conv; else over the weight's nibbles ``w = 16 * hi + lo`` (hi in -8..7, lo in
    0..15: the int16 depthwise 3x3 and 5x5 convs), ``weights`` known or ``kernel_elements`` per output
    bounding them; else (``split``: int16 levels) over the bytes ``x = 256 * hi + lo``. The nibbles
    cost nothing per pixel (the byte planes four passes over the input). The result is int32 when
    ``in_int32`` (as ``accumulate``), else float64.
    """
    exact = 2.0**24
    if level_max * weight_sum < exact:
        terms = [(levels, w_f32, 1)]
    elif (nibbles := _weight_nibbles(ctx, w_f32, weights, kernel_elements, level_max, hint, nodes)) is not None:
        terms = [(levels, nibbles[0], 16), (levels, nibbles[1], 1)]
    elif split and 256 * weight_sum < exact:
        hi = _node(ctx, "Floor", [_node(ctx, "Mul", [levels, _shared(ctx, "1/256_f32", np.array(1 / 256, np.float32))],
                                        f"{hint}_x_by256", nodes)], f"{hint}_x_hi", nodes)
        c256 = _shared(ctx, "256_f32", np.array(256.0, np.float32))
        lo = _node(ctx, "Sub", [levels, _node(ctx, "Mul", [hi, c256], f"{hint}_x_hi256", nodes)], f"{hint}_x_lo", nodes)
        terms = [(hi, w_f32, 256), (lo, w_f32, 1)]
    else:
        return None
    to = TensorProto.INT32 if in_int32 else TensorProto.DOUBLE
    return _weighted_sum(ctx, [(_node(ctx, "Cast", [_node(ctx, "Conv", [plane, w], f"{hint}_acc_f32", nodes,
                                                             **conv_attrs)], f"{hint}_acc", nodes, to=to), weight)
                               for plane, w, weight in terms], in_int32, hint, nodes)


def _weight_nibbles(ctx: LoweringContext, w_f32: str, weights: np.ndarray | None, kernel_elements: int | None,
                    level_max: float, hint: str, nodes: list[NodeProto]) -> tuple[str, str] | None:
    """The float32 nibble weights (hi, lo) of int8 weights, ``w = 16 * hi + lo``, where a conv of levels up
    to ``level_max`` over each stays exact (partial sums below 2**24); None elsewhere or unbounded.

    Known ``weights`` give constants and their own sums; a weight computed at run time (a calibrated
    model's twin) is split by four nodes on the weight alone, bounded by 8 and 15 per element.
    """
    exact = 2.0**24
    if weights is not None:
        w = np.asarray(weights, dtype=np.int64)
        hi = np.floor_divide(w, 16)
        lo = w - 16 * hi
        widest = max(np.abs(p).reshape(w.shape[0], -1).sum(axis=1).max(initial=0) for p in (hi, lo))
        if level_max * float(widest) >= exact:
            return None
        return (ctx.constant(f"{hint}_w_hi_f32", hi.astype(np.float32)),
                ctx.constant(f"{hint}_w_lo_f32", lo.astype(np.float32)))
    if kernel_elements is None or level_max * 15.0 * kernel_elements >= exact:
        return None
    hi = _node(ctx, "Floor", [_node(ctx, "Mul", [w_f32, _shared(ctx, "1/16_f32", np.array(1 / 16, np.float32))],
                                    f"{hint}_w_by16", nodes)], f"{hint}_w_hi", nodes)
    sixteen = _shared(ctx, "16_f32", np.array(16.0, np.float32))
    lo = _node(ctx, "Sub", [w_f32, _node(ctx, "Mul", [hi, sixteen], f"{hint}_w_hi16", nodes)], f"{hint}_w_lo", nodes)
    return hi, lo


def int8_parts(ctx: LoweringContext, x: str, z: int, hint: str, nodes: list[NodeProto],
               signed: bool | None = None) -> list[tuple[str, str, float]]:
    """int8 ``x`` (levels plus zero point ``z``) as the one part ``accumulate`` takes: itself where
    ``signed`` (default: with VNNI), else its uint8 copy."""
    if signed_weights_exact() if signed is None else signed:  # int8 activations x uint8 weights
        return [(x, ctx.constant(f"{hint}_x_zero", np.array(z, dtype=np.int8)), 1.0)]
    return [(as_uint8(ctx, x, nodes), ctx.constant(f"{hint}_x_zero", np.array(OFFSET + z, dtype=np.uint8)), 1.0)]


def int16_parts(ctx: LoweringContext, xf: str, hint: str, nodes: list[NodeProto],
                signed: bool | None = None, source: str | None = None) -> list[tuple[str, str, float]]:
    """int16 levels ``xf`` (float32 whole numbers in -32768..32767) as the 8-bit parts ``accumulate``
    takes: ``x = 256 * hi + lo``, hi in -128..127 and lo in 0..255, each with its zero point; int8
    parts where ``signed`` (default: with VNNI), else uint8. ``source``: the int16 tensor of the
    same levels, where there is one."""
    signed = signed_weights_exact() if signed is None else signed
    # Every conv reading x shares its parts; keyed by the int16 tensor where there is one, as each
    # reader may have cast its own float copy.
    key = (source or xf, signed)
    if key not in ctx.byte_parts:
        ctx.byte_parts[key] = _byte_parts(ctx, xf, hint, nodes, signed, source)
    return ctx.byte_parts[key]


def _byte_parts(ctx: LoweringContext, xf: str, hint: str, nodes: list[NodeProto], signed: bool,
                source: str | None) -> list[tuple[str, str, float]]:
    kind, zeros = (np.int8, (0, -128)) if signed else (np.uint8, (OFFSET, 0))
    # hi = floor(x / 256) = round((x - 127.5) / 256): never a tie, so QuantizeLinear's rounding
    # gives it, with the layout's zero point added and no clipping needed.
    below = _node(ctx, "Sub", [xf, _shared(ctx, "127.5", np.array(127.5, np.float32))], f"{hint}_x_low", nodes)
    hi_zero = _shared(ctx, f"zero_{zeros[0]}_{kind.__name__}", np.array(zeros[0], kind))
    lo_zero = _shared(ctx, f"zero_{zeros[1]}_{kind.__name__}", np.array(zeros[1], kind))
    c256 = _shared(ctx, "256_f32", np.array(256.0, np.float32))
    hi = _node(ctx, "QuantizeLinear", [below, c256, hi_zero], f"{hint}_hi8", nodes)
    if not signed:
        # lo = x mod 256, the low byte of x's two's complement: what an integer Cast to uint8 keeps
        # (onnxruntime's Cast wraps, as C++'s conversion to an unsigned type). Two passes over 2
        # bytes per element (one where x is an int16 tensor already) instead of three over 4.
        if source is None:
            source = _node(ctx, "Cast", [xf], f"{hint}_x_i16", nodes, to=TensorProto.INT16)
        return [(hi, hi_zero, 256.0), (_node(ctx, "Cast", [source], f"{hint}_lo8", nodes, to=TensorProto.UINT8),
                                       lo_zero, 1.0)]
    lo = _node(ctx, "Sub", [xf, _node(ctx, "DequantizeLinear", [hi, c256, hi_zero], f"{hint}_hi256", nodes)],
               f"{hint}_lo", nodes)
    lo = _node(ctx, "QuantizeLinear", [lo, one(ctx), lo_zero], f"{hint}_lo8", nodes)
    return [(hi, hi_zero, 256.0), (lo, lo_zero, 1.0)]


def rounded_u8(ctx: LoweringContext, x: str, zero_point: int, bounds: tuple[int, int], hint: str,
               nodes: list[NodeProto]) -> str:
    """float32 ``x`` -> the uint8 copy of ``clip(round(x) + zero_point, *bounds)`` (int8 bounds).

    QuantizeLinear with step 1 rounds half to even and saturates to uint8, i.e. to the levels
    -128..127 plus 128: one node for Round, the zero point, the int8 clip and the cast; a narrower
    range adds one uint8 Clip.
    """
    zero = ctx.constant(f"{hint}_u8_zero", np.array(OFFSET + zero_point, np.uint8))
    u8 = _node(ctx, "QuantizeLinear", [x, one(ctx), zero], f"{hint}_u8", nodes)
    lo, hi = bounds[0] + OFFSET, bounds[1] + OFFSET
    if lo > 0 or hi < 255:
        clip = [ctx.constant(f"{hint}_u8_{k}", np.array(v, np.uint8)) for k, v in (("lo", lo), ("hi", hi))]
        u8 = _node(ctx, "Clip", [u8, *clip], f"{hint}_u8_clip", nodes)
    return u8


def float32_sum(ctx: LoweringContext, a_u8: str, b_u8: str, zero_points: tuple[int, int],
                multipliers: tuple[float, float], hint: str, nodes: list[NodeProto]) -> str:
    """``float32(float32(a * ma) + float32(b * mb))`` of int8 levels (zero points removed) from their uint8
    copies: the integer add's float32 rule, in two DequantizeLinear and a Sub.

    ``DequantizeLinear(a + 128, ma, 128 + za)`` is the product ``float32((a - za) * ma)``, rounded once.
    It is a Sub of b's negated product because onnxruntime fuses DequantizeLinear -> Add -> QuantizeLinear
    into its QLinearAdd kernel, which rounds its own way; ``x - (-y)`` is ``x + y`` in IEEE arithmetic.
    """
    scaled = []
    for x, zero_point, m, key in zip((a_u8, b_u8), zero_points, (multipliers[0], -np.float32(multipliers[1])),
                                     "ab", strict=True):
        zero = ctx.constant(f"{hint}_{key}_u8_zero", np.array(OFFSET + zero_point, np.uint8))
        scaled.append(_node(ctx, "DequantizeLinear", [x, ctx.constant(f"{hint}_m{key}", np.array(m, np.float32)), zero],
                            f"{hint}_s{key}", nodes))
    return _node(ctx, "Sub", scaled, f"{hint}_sum", nodes)


def float32_product(ctx: LoweringContext, a_u8: str, b_u8: str, zero_points: tuple[int, int], multiplier: float,
                    hint: str, nodes: list[NodeProto]) -> str:
    """``float32(float32((a - za) * (b - zb)) * m)`` of int8 levels from their uint8 copies: the integer
    mul's float32 rule. Each DequantizeLinear gives the levels, their product is exact in float32 (below
    2**16), and the product is scaled even by a multiplier of 1, which keeps onnxruntime from fusing
    DequantizeLinear -> Mul -> QuantizeLinear into its QLinearMul kernel, which rounds its own way."""
    levels = [_node(ctx, "DequantizeLinear", [x, one(ctx), ctx.constant(f"{hint}_{key}_u8_zero",
                                                                         np.array(OFFSET + z, np.uint8))],
                    f"{hint}_{key}_levels", nodes)
              for x, z, key in zip((a_u8, b_u8), zero_points, "ab", strict=True)]
    product = _node(ctx, "Mul", levels, f"{hint}_product", nodes)
    return _node(ctx, "Mul", [product, ctx.constant(f"{hint}_m", np.array(multiplier, np.float32))],
                 f"{hint}_scaled", nodes)


def matmul_accumulator(ctx: LoweringContext, node: NodeProto, a: dict, nodes: list[NodeProto],
                       bias_max: float = 0.0) -> tuple[str, bool] | None:
    """``conv_accumulator`` for an HzSQuantizedConv of kind MatMul (constant [K, N] weight): the exact
    accumulator from MatMulInteger against uint8 weights ``w + 128``, int32 where every sum (plus a
    bias up to ``bias_max``) fits, so that the requantization can skip float64."""
    w = ctx.known(node.input[1])
    bits, z = int(a.get("x_bits", 8)), int(a.get("x_zero_point", 0))
    if a["kind"] != "MatMul" or w is None or w.ndim != 2 or bits not in (8, 16) or (bits == 16 and z) \
            or not -128 <= z <= 127 or ctx.opset < 10:
        return None
    x = node.input[0]
    weight_sum = float(np.abs(w.astype(np.int64)).sum(axis=0).max(initial=0))  # per output column
    bound = weight_sum * (2.0 ** (bits - 1) + abs(z) + (256.0 if bits == 16 else 0.0)) + bias_max
    in_int32 = bound < 2.0**31
    weights, w_zero = gemm_weights(ctx, w, node.name)
    if bits == 8:
        parts = int8_parts(ctx, x, z, node.name, nodes, signed=False)
    else:
        parts = int16_parts(ctx, float_levels(ctx, x, 16, 0, node.name, nodes), node.name, nodes, signed=False,
                            source=x)
    return accumulate(ctx, parts, weights, {}, in_int32, node.name, nodes, op="MatMulInteger", w_zero=w_zero), \
        in_int32


def gemm_weights(ctx: LoweringContext, w: np.ndarray, hint: str) -> tuple[str, str]:
    """int8 weight levels ``w`` [K, N] as ``MatMulInteger`` takes them fast, and their zero point.

    MLAS's integer GEMM is fast for uint8 activations against int8 weights (with VNNI; else both
    uint8): the reverse of its convolutions, and int8 activations take a generic path 25x slower."""
    if signed_weights_exact():
        return ctx.constant(f"{hint}_w_s8", w.astype(np.int8)), int8_zero(ctx)
    return ctx.constant(f"{hint}_w_u8", (w.astype(np.int16) + OFFSET).astype(np.uint8)), uint8_zero(ctx)


def activations_product(ctx: LoweringContext, node: NodeProto, a: dict, nodes: list[NodeProto]) -> str | None:
    """The float64 accumulator of an HzSQuantizedMatMul of two int8/int16 activations from MatMulInteger
    on 8-bit parts: the first operand's as uint8, the second's as int8 with VNNI (else uint8), the
    layouts MLAS's integer GEMM runs fast. None where it does not apply."""
    bits = int(a.get("a_bits", 8)), int(a.get("b_bits", 8))
    zps = int(a.get("a_zero_point", 0)), int(a.get("b_zero_point", 0))
    if any(b not in (8, 16) for b in bits) or any(z and b != 8 for z, b in zip(zps, bits, strict=True)) \
            or any(not -128 <= z <= 127 for z in zps) or ctx.opset < 10:
        return None

    def parts(x: str, b: int, z: int, signed: bool, hint: str) -> list[tuple[str, str, float]]:
        if b == 16:
            return int16_parts(ctx, float_levels(ctx, x, 16, 0, hint, nodes), hint, nodes, signed=signed, source=x)
        return int8_parts(ctx, x, z, hint, nodes, signed=signed)

    first = parts(node.input[0], bits[0], zps[0], False, f"{node.name}_a")
    second = parts(node.input[1], bits[1], zps[1], signed_weights_exact(), f"{node.name}_b")
    terms = [(_node(ctx, "Cast", [_node(ctx, "MatMulInteger", [pa, pb, za, zb], f"{node.name}_acc", nodes)],
                    f"{node.name}_acc_f64", nodes, to=TensorProto.DOUBLE), wa * wb)
             for pa, za, wa in first for pb, zb, wb in second]
    return _weighted_sum(ctx, terms, False, node.name, nodes)


def accumulate(ctx: LoweringContext, parts: list[tuple[str, str, float]], w_u8: str, conv_attrs: dict,
               in_int32: bool, hint: str, nodes: list[NodeProto], op: str = "ConvInteger",
               w_zero: str | None = None) -> str:
    """The sum over ``parts`` (tensor, zero point, weight) of weight * ``op``(part, ``w_u8``) (ConvInteger
    or MatMulInteger): the uint8 weights ``w + 128`` (or others with their ``w_zero``). int32 where
    the caller bounded every sum, else float64."""
    terms = []
    for part, zero, weight in parts:
        acc = _node(ctx, op, [part, w_u8, zero, w_zero or uint8_zero(ctx)], f"{hint}_acc", nodes, **conv_attrs)
        terms.append((acc if in_int32 else _node(ctx, "Cast", [acc], f"{hint}_acc_f64", nodes, to=TensorProto.DOUBLE),
                      weight))
    return _weighted_sum(ctx, terms, in_int32, hint, nodes)


def _weighted_sum(ctx: LoweringContext, terms: list[tuple[str, float]], in_int32: bool, hint: str,
                  nodes: list[NodeProto]) -> str:
    """The sum of weight * tensor over ``terms``: the partial accumulators of 8-bit parts (a high
    byte weighs 256), all int32 (``in_int32``) or all float64."""
    total = None
    for term, weight in terms:
        if weight != 1:
            factor = _shared(ctx, f"{int(weight)}_i32", np.array(int(weight), np.int32)) if in_int32 else \
                _shared(ctx, f"{weight:g}_f64", np.array(float(weight)))
            term = _node(ctx, "Mul", [term, factor], f"{hint}_acc_hi", nodes)
        total = term if total is None else _node(ctx, "Add", [total, term], f"{hint}_acc_sum", nodes)
    return total


def matmul(ctx: LoweringContext, node: NodeProto, a: dict, nodes: list[NodeProto]) -> bool:
    """An int8 -> int8 MatMul (HzSQuantizedConv of kind MatMul without bias, or HzSQuantizedMatMul
    of two activations) as QLinearMatMul; False where it does not apply."""
    two_activations = node.op_type == "HzSQuantizedMatMul"
    if two_activations:
        zero_points = int(a.get("a_zero_point", 0)), int(a.get("b_zero_point", 0))
        fits = a.get("a_bits", 8) == 8 and a.get("b_bits", 8) == 8
    else:
        zero_points = int(a.get("x_zero_point", 0)), 0
        fits = a["kind"] == "MatMul" and a.get("x_bits", 8) == 8
    out_min, out_max = int(a["out_min"]), int(a["out_max"])
    if (not fits or a["out_type"] != "int8" or not a.get("requantize_f32") or not -128 <= out_min <= out_max <= 127
            or any(not -128 <= z <= 127 for z in zero_points) or not -128 <= int(a.get("zero_point", 0)) <= 127
            or ctx.opset < 10):
        return False
    b_name = node.input[1]
    m = np.asarray(a["multiplier"], dtype=np.float64).astype(np.float32)
    if two_activations:
        b_in, b_zero = as_uint8(ctx, b_name, nodes), ctx.constant(f"{node.name}_b_zero",
                                                                  np.array(OFFSET + zero_points[1], dtype=np.uint8))
        m = m.reshape(()) if m.size == 1 else m
    else:
        weight = ctx.constant_values.get(b_name)
        if weight is None or len(weight.dims) != 2:
            return False
        w = numpy_helper.to_array(weight)
        columns = w.shape[1]
        m = np.broadcast_to(m, (columns,)).copy()
        if signed_weights_exact():
            b_in, b_zero = b_name, ctx.constant(f"{node.name}_b_zero", np.zeros(columns, dtype=np.int8))
        else:
            w = (w.astype(np.int16) + OFFSET).astype(np.uint8)
            b_in = ctx.constant(f"{node.name}_b_u8", w)
            b_zero = ctx.constant(f"{node.name}_b_zero", np.full(columns, OFFSET, dtype=np.uint8))
    inputs = [as_uint8(ctx, node.input[0], nodes), one(ctx),
              ctx.constant(f"{node.name}_a_zero", np.array(OFFSET + zero_points[0], dtype=np.uint8)),
              b_in, ctx.constant(f"{node.name}_m", m), b_zero, one(ctx),
              ctx.constant(f"{node.name}_y_zero", np.array(OFFSET + int(a.get("zero_point", 0)), dtype=np.uint8))]
    bias = node.input[2] if len(node.input) > 2 and node.input[2] else None
    if bias:
        y = _gemm_as_conv(ctx, node, inputs, w, bias, nodes)
    else:
        y = _node(ctx, "QLinearMatMul", inputs, f"{node.output[0]}_u8", nodes)
    _finish(ctx, node, y, out_min, out_max, nodes)
    return True


def _gemm_as_conv(ctx: LoweringContext, node: NodeProto, inputs: list[str], weight: np.ndarray, bias: str,
                  nodes: list[NodeProto]) -> str:
    """A Gemm's ``[M, K] @ [K, N] + bias`` as a 1x1 QLinearConv over ``M`` positions (QLinearMatMul has
    no bias, and the bias must be added before requantizing): ``[1, K, M, 1]`` in, ``[1, N, M, 1]`` out."""
    out = node.output[0]
    k, n = weight.shape
    x = _node(ctx, "Transpose", [inputs[0]], f"{out}_xt_u8", nodes, perm=[1, 0])
    x = _node(ctx, "Reshape", [x, ctx.constant(f"{out}_as_image", np.array([1, k, -1, 1], dtype=np.int64))],
              f"{out}_x_image_u8", nodes)
    w_1x1 = ctx.constant(f"{out}_w_1x1", np.ascontiguousarray(weight.T).reshape(n, k, 1, 1))
    y = _node(ctx, "QLinearConv", [x, *inputs[1:3], w_1x1, *inputs[4:], bias], f"{out}_image_u8", nodes)
    y = _node(ctx, "Reshape", [y, ctx.constant(f"{out}_as_rows", np.array([n, -1], dtype=np.int64))],
              f"{out}_nm_u8", nodes)
    return _node(ctx, "Transpose", [y], f"{out}_u8", nodes, perm=[1, 0])


def lookup(ctx: LoweringContext, table: str, index: str, out: str, nodes: list[NodeProto]) -> None:
    """``out = table[index]`` for a 1-D ``table``, elementwise over an index tensor of any shape.

    GatherElements over the flattened index runs about three times faster in onnxruntime
    than Gather, which copies each element as a block.
    """
    flat = _node(ctx, "Reshape", [index, _shared(ctx, "flat", np.array([-1], dtype=np.int64))], f"{out}_index_flat",
                 nodes)
    values = _node(ctx, "GatherElements", [table, flat], f"{out}_flat", nodes, axis=0)
    nodes.append(_make("Reshape", [values, _node(ctx, "Shape", [index], f"{out}_shape", nodes)], out, ctx))


# Ops that move int8 levels without arithmetic: run on the uint8 copies they give the same result + 128.
_MOVES = ("Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Slice", "Identity", "Split", "Concat",
          "DepthToSpace", "SpaceToDepth", "Expand", "Tile")


def mirror(node: NodeProto, ctx: LoweringContext) -> list[NodeProto]:
    """``node`` again on the uint8 copies of its int8 inputs, where they all have one (else nothing).

    The original node stays for readers of the int8 result; whichever is unread is dropped.
    """
    if node.op_type == "Cast" and node.domain in ("", "ai.onnx"):
        return _cast_of_levels(node, ctx)
    data = [i for i in node.input if i and i not in ctx.constant_values]
    if node.op_type == "Concat":
        data = list(node.input)  # every input is data, constants included
    if not data or any(i not in ctx.uint8 for i in data) or node.domain not in ("", "ai.onnx"):
        return []
    op = node.op_type
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    moves = op in _MOVES or (op == "MaxPool" and ctx.opset >= 12 and len(node.output) == 1) or (
        op == "Resize" and attrs.get("mode", b"nearest") == b"nearest")
    if not moves:
        return []
    outputs = [ctx.unique(f"{o}_u8") for o in node.output]
    copy = helper.make_node(op, [ctx.uint8.get(i, i) if i else "" for i in node.input], outputs,
                            name=ctx.unique(f"{node.name}_u8"))
    copy.attribute.extend(node.attribute)
    levels = all(_holds_levels(ctx, i) for i in data)
    for o, u8 in zip(node.output, outputs, strict=True):
        ctx.uint8[o] = u8
        if levels:
            ctx.level_tensors.add(o)
    return on_float_kernel(copy, TensorProto.UINT8, ctx) or [copy]


def on_float_kernel(node: NodeProto, elem_type: int | None, ctx: LoweringContext) -> list[NodeProto]:
    """A MaxPool of 8-bit integers on a kernel that vectorizes (else nothing).

    onnxruntime's int8 and uint8 MaxPool is a generic loop: 6.2 ms on a 256x20x20 map with a
    5x5 window (YOLO's SPPF), 12.8 ms on a ResNet stem's 64x112x112. A 2-D pool runs as the
    contrib NhwcMaxPool between two Transposes (0.10 and 0.17 ms; next to integer convolutions,
    which onnxruntime lays out NHWC too, the Transposes cancel); others as Cast, float32
    MaxPool, Cast (0.13 and 0.64 ms). Both take the maximum of the same integers.
    """
    if node.op_type != "MaxPool" or node.domain not in ("", "ai.onnx") or len(node.output) != 1 \
            or elem_type not in (TensorProto.INT8, TensorProto.UINT8):
        return []
    attrs = [a for a in node.attribute if a.name != "storage_order"]  # it only orders the indices output
    kernel = next((list(a.ints) for a in attrs if a.name == "kernel_shape"), [])
    nodes: list[NodeProto] = []
    if len(kernel) == 2:
        x = node_output(ctx, "Transpose", [node.input[0]], f"{node.input[0]}_nhwc", nodes, perm=[0, 2, 3, 1])
        pooled = ctx.unique(f"{node.output[0]}_nhwc")
        pool = helper.make_node("NhwcMaxPool", [x], [pooled], name=ctx.unique(f"{node.name}_nhwc"),
                                domain=CONTRIB_DOMAIN)
        pool.attribute.extend(attrs)
        nodes.append(pool)
        nodes.append(_make("Transpose", [pooled], node.output[0], ctx, perm=[0, 3, 1, 2]))
        return nodes
    x = node_output(ctx, "Cast", [node.input[0]], f"{node.input[0]}_as_float", nodes, to=TensorProto.FLOAT)
    pooled = ctx.unique(f"{node.output[0]}_float")
    pool = helper.make_node("MaxPool", [x], [pooled], name=ctx.unique(f"{node.name}_float"))
    pool.attribute.extend(attrs)
    nodes.append(pool)
    nodes.append(_make("Cast", [pooled], node.output[0], ctx, to=elem_type))
    return nodes


# Casts that keep int8 levels exact: the result has the same uint8 copy as the source.
_LEVEL_CASTS = (TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.INT8, TensorProto.INT16, TensorProto.INT32,
                TensorProto.INT64)


def _cast_of_levels(node: NodeProto, ctx: LoweringContext) -> list[NodeProto]:
    """A Cast of int8 levels (as a quantized model wraps a float-only op: Cast, Resize, Cast back)
    shares the source's uint8 copy, so the moves after it can run on uint8 too."""
    to = next((a.i for a in node.attribute if a.name == "to"), None)
    source = node.input[0]
    if to not in _LEVEL_CASTS or not _holds_levels(ctx, source):
        return []
    nodes: list[NodeProto] = []
    ctx.uint8[node.output[0]] = as_uint8(ctx, source, nodes)
    ctx.level_tensors.add(node.output[0])
    return nodes


def _shared(ctx: LoweringContext, key: str, value: np.ndarray) -> str:
    if key not in ctx.uint8_constants:
        ctx.uint8_constants[key] = ctx.constant(f"uint8_kernels_{key}", value)
    return ctx.uint8_constants[key]


def one(ctx: LoweringContext) -> str:
    return _shared(ctx, "one", np.array(1.0, dtype=np.float32))


def uint8_zero(ctx: LoweringContext) -> str:
    return _shared(ctx, "u8_zero", np.array(OFFSET, dtype=np.uint8))


def int8_zero(ctx: LoweringContext) -> str:
    return _shared(ctx, "s8_zero", np.array(0, dtype=np.int8))


def _make(op: str, inputs: list[str], out: str, ctx: LoweringContext, **attrs) -> NodeProto:
    return helper.make_node(op, inputs, [out], name=ctx.unique(f"{out}_{op}"), **attrs)


def node_output(ctx: LoweringContext, op: str, inputs: list[str], hint: str, nodes: list[NodeProto],
                **attrs) -> str:
    """Append an ``op`` node with a fresh output name to ``nodes``; return that name."""
    out = ctx.unique(hint)
    nodes.append(_make(op, inputs, out, ctx, **attrs))
    return out


_node = node_output
