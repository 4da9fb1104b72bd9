"""Integer Hz ops of the quantized model and their exact ONNX lowering.

Numerics (SPEC §7): int8/int16 symmetric activations, int8 per-channel weights,
int32 bias and accumulation; requantization is ``clip(round(acc * m), lo, hi)``
with ``m`` a float64 multiplier and round half to even. Integer products run in
ConvInteger/MatMulInteger; everything after the accumulator runs in float64,
which represents every int32 exactly, so a numpy implementation can reproduce
the results bit for bit. Convolutions with the float32 rule (``requantize_f32``)
whose biased sums fit int32 requantize in one onnxruntime DequantizeLinear
(the bias as its zero point), and a ConvTranspose whose kernel equals its stride
runs as a 1x1 integer convolution followed by DepthToSpace.

Common attributes: ``out_type`` (int8 | int16 | int32), ``multiplier`` (floats,
one or per channel along ``axis``), ``out_min``/``out_max`` (integer clip bounds).

Asymmetric (``optimization: asymmetric``) int8 tensors carry a zero point ``z``:
the value of ``q`` is ``(q - z) * scale``. Ops reading one subtract it first
(``x_zero_point``, ``a_zero_point``/``b_zero_point``, concat ``zero_points``; an
integer conv pads with ``z``, i.e. with the value 0); an op writing one adds its
``zero_point`` after rounding, before the clip: ``clip(round(acc * m) + z, lo, hi)``.
Absent zero-point attributes mean 0.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable
from typing import TypeVar

import numpy as np
from onnx import AttributeProto, NodeProto, TensorProto, helper, numpy_helper

from hbtools.ops import int_kernels, uint8_kernels
from hbtools.ops.base import REQUIRED, HzOp, LoweringContext, add_node, attrs_of, exact_sum
from hbtools.ops.registry import register
from hbtools.quant import grids

ONNX_INT = {"int8": TensorProto.INT8, "int16": TensorProto.INT16, "int32": TensorProto.INT32}
NUMPY_INT = {"int8": np.int8, "int16": np.int16, "int32": np.int32}
ZERO_POINTS = ("a_zero_point", "b_zero_point", "zero_point")
# Attributes every requantizing op has: output type, clip bounds and the zero point it adds.
OUTPUT_ATTRS = {"out_type": REQUIRED, "out_min": REQUIRED, "out_max": REQUIRED, "zero_point": 0}
# A float32 ConvTranspose on 8-bit integer parts is exact while its sums stay below 2**24
# (1000 products of at most 2**14).
CONV_TRANSPOSE_MAX_TERMS = 1000
CONV_ATTRS = {"kernel_shape": None, "strides": None, "pads": None, "dilations": None, "group": None,
              "output_padding": None, "auto_pad": None}


def _node(ctx: LoweringContext, op: str, inputs: list[str], hint: str, **attrs) -> tuple[NodeProto, str]:
    out = ctx.unique(hint)
    return helper.make_node(op, inputs, [out], name=out, **attrs), out


def _cast(ctx: LoweringContext, x: str, to: int, hint: str, nodes: list[NodeProto]) -> str:
    if to in (TensorProto.FLOAT, TensorProto.DOUBLE) and x in ctx.float_copies:
        # The float its producer cast x from (whole numbers): read that, and x may go unread.
        copy, copy_type = ctx.float_copies[x]
        if copy_type == to:
            return copy
        x = copy
    n, out = _node(ctx, "Cast", [x], f"{hint}_cast", to=to)
    nodes.append(n)
    return out


def _per_axis(values: list[float], axis: int, rank: int | None) -> np.ndarray:
    """float64 values along ``axis`` (flat when the rank is unknown)."""
    return grids.along_axis(values, axis if rank is not None else None, rank, np.float64)


def _requantize(ctx: LoweringContext, acc: str, a: dict, rank: int | None, out: str, hint: str,
                nodes: list[NodeProto], scaled: bool = False) -> None:
    """float64 accumulator -> clip(round(acc * m)) in out_type (or exact int32 cast). ``scaled``:
    ``acc`` is already the float32 product of the ``requantize_f32`` rule."""
    axis = a.get("axis", 1)
    x = acc
    single = bool(a.get("requantize_f32"))
    if single and not scaled:  # float32(acc) * float32(m), as onnxruntime's integer conv kernels
        x = _cast(ctx, x, TensorProto.FLOAT, f"{hint}_acc_f32", nodes)
    if not scaled and any(m != 1.0 for m in a["multiplier"]):  # x * 1.0 is x in float32 and float64
        m = _per_axis(a["multiplier"], axis, rank)
        m = ctx.constant(f"{hint}_m", m.astype(np.float32) if single else m)
        n, x = _node(ctx, "Mul", [x, m], f"{hint}_scaled")
        nodes.append(n)
    if single and a["out_type"] == "int8" and ctx.opset >= 12 and abs(int(a.get("zero_point", 0))) <= 127:
        _round_to_int8(ctx, x, a, out, hint, nodes)
        return
    n, x = _node(ctx, "Round", [x], f"{hint}_round")
    nodes.append(n)
    # The rest is exact in float32 for 8/16-bit outputs (their levels and bounds are small integers).
    precision = np.float32 if single and a["out_type"] != "int32" else np.float64
    if single and precision == np.float64:
        x = _cast(ctx, x, TensorProto.DOUBLE, f"{hint}_rounded", nodes)
    output_levels(ctx, x, a, out, hint, nodes, precision)


def _round_to_int8(ctx: LoweringContext, x: str, a: dict, out: str, hint: str, nodes: list[NodeProto]) -> None:
    """float32 ``x`` -> int8 ``out`` = clip(round(x) + zero_point, out_min, out_max), by its uint8 copy
    (``uint8_kernels.rounded_u8``)."""
    u8 = uint8_kernels.rounded_u8(ctx, x, int(a.get("zero_point", 0)), (int(a["out_min"]), int(a["out_max"])),
                                  out, nodes)
    uint8_kernels.to_int8(ctx, u8, out, nodes)


def output_levels(ctx: LoweringContext, rounded: str, a: dict, out: str, hint: str, nodes: list[NodeProto],
                  precision: type = np.float64) -> None:
    """Rounded levels (a float tensor) -> ``out``: plus the zero point, clipped to out_min/out_max,
    cast to out_type. The tail every requantizing op shares."""
    x = rounded
    if a.get("zero_point", 0):
        z = ctx.constant(f"{hint}_zp", np.array(float(a["zero_point"]), dtype=precision))
        n, x = _node(ctx, "Add", [x, z], f"{hint}_shifted")
        nodes.append(n)
    out_min, out_max = float(a["out_min"]), float(a["out_max"])
    if a["out_type"] == "int32":
        # Float attributes are float32: 2**31 - 1 reads back as 2**31, which Cast wraps to -2**31.
        out_min, out_max = max(out_min, -(2.0**31)), min(out_max, 2.0**31 - 1)
    lo = ctx.constant(f"{hint}_lo", np.array(out_min, dtype=precision))
    hi = ctx.constant(f"{hint}_hi", np.array(out_max, dtype=precision))
    if ctx.opset >= (11 if precision == np.float32 else 12):  # Clip with bound inputs (float64 from 12)
        n, x = _node(ctx, "Clip", [x, lo, hi], f"{hint}_clip")
        nodes.append(n)
    else:
        n, x = _node(ctx, "Max", [x, lo], f"{hint}_lo_clip")
        nodes.append(n)
        n, x = _node(ctx, "Min", [x, hi], f"{hint}_hi_clip")
        nodes.append(n)
    nodes.append(helper.make_node("Cast", [x], [out], name=ctx.unique(f"{hint}_out"), to=ONNX_INT[a["out_type"]]))
    if a["out_type"] != "int32":  # int8/int16 levels, exact in float32 and float64
        ctx.float_copies[out] = (x, TensorProto.FLOAT if precision == np.float32 else TensorProto.DOUBLE)


def _split16(ctx: LoweringContext, x: str, hint: str, nodes: list[NodeProto]) -> list[tuple[str, float]]:
    """int16 x = 256*hi + lo with hi int8 and lo uint8, so 8-bit integer kernels stay exact."""
    xd = _cast(ctx, x, TensorProto.DOUBLE, f"{hint}_x", nodes)
    c256 = ctx.constant(f"{hint}_256", np.array(256.0))
    n, q = _node(ctx, "Div", [xd, c256], f"{hint}_div")
    nodes.append(n)
    n, hi = _node(ctx, "Floor", [q], f"{hint}_hi")
    nodes.append(n)
    n, hi256 = _node(ctx, "Mul", [hi, c256], f"{hint}_hi256")
    nodes.append(n)
    n, lo = _node(ctx, "Sub", [xd, hi256], f"{hint}_lo")
    nodes.append(n)
    hi8 = _cast(ctx, hi, TensorProto.INT8, f"{hint}_hi8", nodes)
    lo8 = _cast(ctx, lo, TensorProto.UINT8, f"{hint}_lo8", nodes)
    return [(hi8, 256.0), (lo8, 1.0)]


def _integer_product(ctx: LoweringContext, op: str, a: str, a_bits: int, b: str, b_bits: int, hint: str,
                     nodes: list[NodeProto], zero_points: tuple[int, int] = (0, 0), **attrs) -> str:
    """Exact a (*) b as float64 through ConvInteger / MatMulInteger (or ConvTranspose) on 8-bit parts.

    ``zero_points`` of int8 ``a``/``b`` go to the integer kernels' zero-point inputs
    (ConvInteger pads with the zero point, so padding stays the value 0).
    """
    parts_a = _split16(ctx, a, f"{hint}_a", nodes) if a_bits == 16 else [(a, 1.0)]
    parts_b = _split16(ctx, b, f"{hint}_b", nodes) if b_bits == 16 else [(b, 1.0)]
    zp_inputs: list[str] = []
    if any(zero_points):
        if op == "ConvTranspose" or (zero_points[0] and a_bits != 8) or (zero_points[1] and b_bits != 8):
            raise ValueError(f"{hint}: zero points are supported on int8 inputs of ConvInteger/MatMulInteger only")
        zp_inputs = [ctx.constant(f"{hint}_{k}_zp", np.array(z, dtype=np.int8)) if z else ""
                     for k, z in zip("ab", zero_points, strict=True)]
        while zp_inputs and not zp_inputs[-1]:
            zp_inputs.pop()
    total = None
    for pa, wa in parts_a:
        for pb, wb in parts_b:
            if op == "ConvTranspose":
                # No integer ConvTranspose kernel: float32 on 8-bit parts is exact while sums stay
                # below 2**24, so each float32 kernel sums at most CONV_TRANSPOSE_MAX_TERMS terms
                # (input-channel chunks) and the chunks add up in float64 (exact).
                pa = _cast(ctx, pa, TensorProto.FLOAT, f"{hint}_af", nodes)
                pb = _cast(ctx, pb, TensorProto.FLOAT, f"{hint}_bf", nodes)
                accs = [_node(ctx, op, [xa, xb], f"{hint}_acc", **attrs)
                        for xa, xb in _input_channel_chunks(ctx, pa, pb, b, attrs, hint, nodes)]
            else:
                accs = [_node(ctx, op, [pa, pb, *zp_inputs], f"{hint}_acc", **attrs)]
            term = None
            for n, acc in accs:
                nodes.append(n)
                part = _cast(ctx, acc, TensorProto.DOUBLE, f"{hint}_accd", nodes)
                if term is None:
                    term = part
                else:
                    n, term = _node(ctx, "Add", [term, part], f"{hint}_chunks")
                    nodes.append(n)
            if wa * wb != 1.0:
                k = ctx.constant(f"{hint}_w", np.array(wa * wb))
                n, term = _node(ctx, "Mul", [term, k], f"{hint}_term")
                nodes.append(n)
            if total is None:
                total = term
            else:
                n, total = _node(ctx, "Add", [total, term], f"{hint}_sum")
                nodes.append(n)
    return total


def _input_channel_chunks(ctx: LoweringContext, x: str, w: str, w_source: str, attrs: dict, hint: str,
                          nodes: list[NodeProto]) -> list[tuple[str, str]]:
    """(input, weight) pairs of a ConvTranspose split along its input channels so that each sums at
    most CONV_TRANSPOSE_MAX_TERMS products per output; the pair itself where it needs no split (or
    is grouped, which the partition keeps under the bound)."""
    weight = ctx.known(w_source)
    if weight is None or int(attrs.get("group") or 1) != 1:
        return [(x, w)]
    taps = int(np.prod(weight.shape[2:]))
    step = max(CONV_TRANSPOSE_MAX_TERMS // taps, 1)
    if weight.shape[0] <= step:
        return [(x, w)]
    pairs = []
    for start in range(0, weight.shape[0], step):
        bounds = [ctx.constant(f"{hint}_chunk", np.array([v], np.int64)) for v in (start, start + step)]
        xs = add_node(ctx, "Slice", [x, *bounds, ctx.constant(f"{hint}_c_axis", np.array([1], np.int64))],
                      f"{hint}_chunk", nodes)
        ws = add_node(ctx, "Slice", [w, *bounds, ctx.constant(f"{hint}_w_axis", np.array([0], np.int64))],
                      f"{hint}_chunk", nodes)
        pairs.append((xs, ws))
    return pairs


def _scaled_accumulator(ctx: LoweringContext, acc: str, bias: np.ndarray | None, multiplier: list[float],
                        axis: int, hint: str, nodes: list[NodeProto], last: bool = False) -> str | None:
    """float32(int32 ``acc`` + ``bias``) * float32(m) along ``axis`` in one node; None where the biases
    do not fit the node.

    onnxruntime's DequantizeLinear computes ``float32(x - zero_point) * scale`` in int32 then float32:
    with the bias as minus the zero point that is the ``requantize_f32`` rule (the caller has
    bounded every biased sum to int32). The contrib-domain op takes per-axis scales at any opset; channels
    along the ``last`` axis take the same operations as three faster nodes (``uint8_kernels.dequantize_int32``).
    """
    channels = len(multiplier)
    if bias is not None:
        b = np.asarray(bias).astype(np.int64).reshape(-1)
        if b.size == 0 or (channels > 1 and b.size not in (1, channels)) or b.min() <= -(2**31) or b.max() >= 2**31:
            return None
        channels = max(channels, b.size)
        zero = np.broadcast_to(-b, (channels,)).astype(np.int32)
    else:
        zero = np.zeros(channels, np.int32)
    m = np.broadcast_to(np.asarray(multiplier, np.float64), (channels,)).astype(np.float32)
    if channels == 1:  # per tensor: scalars
        m, zero = m.reshape(()), zero.reshape(())
    out = ctx.unique(f"{hint}_scaled")
    uint8_kernels.dequantize_int32(ctx, acc, ctx.constant(f"{hint}_m", m), ctx.constant(f"{hint}_acc_zero", zero),
                                   axis, last and channels > 1, out, nodes)
    return out


def _transpose_by_blocks(ctx: LoweringContext, node: NodeProto, a: dict, nodes: list[NodeProto]) -> bool:
    """A ConvTranspose whose kernel equals its stride (the usual 2x2 / stride 2 upsampling) as an integer
    1x1 convolution to ``stride**2`` blocks of channels, requantized, then DepthToSpace.

    Each output pixel is one input pixel times one kernel tap, so the 1x1 conv's accumulator holds
    exactly the transposed convolution's sums; the float32 requantization is per channel and
    DepthToSpace only moves values, so the result is the reference's bit for bit. False where it
    does not apply (the generic path runs instead).
    """
    w = ctx.known(node.input[1])
    has_bias = len(node.input) > 2 and bool(node.input[2])
    bias = ctx.known(node.input[2]) if has_bias else None
    if w is None or w.ndim != 4 or (has_bias and bias is None) or not a.get("requantize_f32"):
        return False
    kernel = list(a.get("kernel_shape") or w.shape[2:])
    stride = list(a.get("strides") or [1, 1])
    plain = (not any(a.get("pads") or []) and not any(a.get("output_padding") or [])
             and all(d == 1 for d in a.get("dilations") or [1]) and int(a.get("group") or 1) == 1
             and (a.get("auto_pad") or b"NOTSET") in (b"NOTSET", b"VALID", "NOTSET", "VALID"))
    if not plain or kernel != list(w.shape[2:]) or kernel != stride or kernel[0] != kernel[1] or kernel[0] < 2:
        return False
    block, (cin, cout) = kernel[0], w.shape[:2]
    blocks = block * block
    # 1x1 weight row (i * block + j) * cout + c holds tap (i, j) of output channel c: DepthToSpace's
    # DCR order.
    w_conv = np.ascontiguousarray(w.transpose(2, 3, 1, 0).reshape(blocks * cout, cin, 1, 1))
    w_name = ctx.constant(f"{node.name}_w_blocks", w_conv)
    as_conv = helper.make_node(node.op_type, [node.input[0], w_name], list(node.output), name=node.name)
    bias_max = float(np.abs(bias.astype(np.float64)).max(initial=0.0)) if bias is not None else 0.0
    local: list[NodeProto] = []
    found = uint8_kernels.conv_accumulator(ctx, as_conv, {**a, "kind": "Conv"}, {}, local, bias_max)
    if found is None or not found[1]:
        return False
    multiplier = np.broadcast_to(np.asarray(a["multiplier"], np.float64), (cout,))
    tiled_bias = np.tile(np.broadcast_to(bias.reshape(-1), (cout,)), blocks) if bias is not None else None
    scaled = _scaled_accumulator(ctx, found[0], tiled_bias, list(np.tile(multiplier, blocks)), 1, node.name, local)
    if scaled is None:
        return False
    n, moved = _node(ctx, "DepthToSpace", [scaled], f"{node.name}_blocks", blocksize=block)
    nodes += [*local, n]
    _requantize(ctx, moved, {**a, "axis": 1}, 4, node.output[0], node.name, nodes, scaled=True)
    return True


def _add_bias(ctx: LoweringContext, acc: str, bias: str, rank: int | None, axis: int, hint: str,
              nodes: list[NodeProto], in_int32: bool = False) -> str:
    """``acc`` (float64, or int32 with ``in_int32``) plus the int32 bias along ``axis``."""
    bd = bias if in_int32 else _cast(ctx, bias, TensorProto.DOUBLE, f"{hint}_bias", nodes)
    if rank is not None and axis != rank - 1:
        shape = ctx.constant(f"{hint}_bshape", np.array([-1] + [1] * (rank - 1 - axis), dtype=np.int64))
        n, bd = _node(ctx, "Reshape", [bd, shape], f"{hint}_breshape")
        nodes.append(n)
    n, out = _node(ctx, "Add", [acc, bd], f"{hint}_biased")
    nodes.append(n)
    return out


# ---------------------------------------------------------------- numpy reference numerics
# Written from the numerics above, not from the lowering: the .bin simulator runs these, and
# hb_verifier compares them with the lowered model.

_CACHE_SIZE = 4096
_cache: dict[int, tuple[NodeProto, object]] = {}
T = TypeVar("T")


def remembered(node: NodeProto, compute: Callable[[NodeProto], T]) -> T:
    """``compute(node)`` remembered per node object, for the numpy references: a simulator runs
    the same nodes every frame, and decoding a 65536-entry table attribute costs more than
    applying it. One ``compute`` per op class (the cache is keyed by the node alone)."""
    hit = _cache.get(id(node))
    if hit is not None and hit[0] is node:  # the node is kept alive, so its id is not reused
        return hit[1]
    value = compute(node)
    if len(_cache) >= _CACHE_SIZE:
        _cache.clear()
    _cache[id(node)] = (node, value)
    return value


def forget(nodes: Iterable[NodeProto]) -> None:
    """Drop what ``remembered`` holds for ``nodes``: a node kept in the cache keeps its whole model alive
    (a protobuf sub-message holds its parent), so whoever is done with a model's nodes lets them go (a
    session per picture over a quantized model grew by its size each time: hunt 41 D2)."""
    for node in nodes:
        hit = _cache.get(id(node))
        if hit is not None and hit[0] is node:
            del _cache[id(node)]


def _decoded_attrs(node: NodeProto) -> dict:
    a = attrs_of(node)
    if "table" in a:
        a["table"] = table_of(node).astype(NUMPY_INT.get(a.get("out_type"), np.int64))
    return a


def _attrs(node: NodeProto) -> dict:
    """``attrs_of`` with the table decoded, remembered per node object."""
    return remembered(node, _decoded_attrs)


def _axis_shaped(values: list[float], axis: int, rank: int) -> np.ndarray:
    """float64 per-tensor scalar, or values laid along ``axis`` of a rank-``rank`` tensor."""
    return grids.along_axis(values, axis % rank, rank, np.float64)


def _np_requantize(acc: np.ndarray, a: dict, axis: int | None = None) -> np.ndarray:
    """``clip(round(acc * m) + z, out_min, out_max)``, round half to even, as ``out_type``.

    The product is float64, or float32 where the op says ``requantize_f32`` (onnxruntime's
    integer conv kernels requantize so; ``hbtools.ops.uint8_kernels``)."""
    m = a["multiplier"]
    lo, hi = float(a["out_min"]), float(a["out_max"])
    if a["out_type"] == "int32":
        lo, hi = max(lo, -(2.0**31)), min(hi, 2.0**31 - 1)
    shaped = _axis_shaped(m, -1 if axis is None else axis, acc.ndim) if acc.ndim else np.float64(m[0])
    out = grids.requantize(acc, shaped, lo, hi, int(a.get("zero_point", 0)), single=bool(a.get("requantize_f32")))
    return out.astype(NUMPY_INT[a["out_type"]])


def _shifted(x: np.ndarray, zero_point: int) -> np.ndarray:
    """Integer levels minus their zero point (int16 holds every int8 difference)."""
    return x.astype(np.int16) - np.int16(zero_point) if zero_point else x


def _spatial_attrs(a: dict, spatial: int) -> tuple[list[int], list[int]]:
    return list(a.get("strides") or [1] * spatial), list(a.get("dilations") or [1] * spatial)


def _np_conv(x: np.ndarray, w: np.ndarray, a: dict) -> np.ndarray:
    spatial = x.ndim - 2
    kernel = list(a.get("kernel_shape") or w.shape[2:])
    strides, dilations = _spatial_attrs(a, spatial)
    begin, end = int_kernels.resolve_pads(a.get("auto_pad", "NOTSET"), list(x.shape[2:]), kernel, strides,
                                          dilations, a.get("pads"))
    bound = int_kernels.product_bound(x, w, tuple(range(1, w.ndim)))
    return int_kernels.conv(x, w, strides=strides, pads_begin=begin, pads_end=end, dilations=dilations,
                            group=int(a.get("group", 1)), bound=bound)


def _np_conv_transpose(x: np.ndarray, w: np.ndarray, a: dict) -> np.ndarray:
    spatial = x.ndim - 2
    kernel = list(a.get("kernel_shape") or w.shape[2:])
    strides, dilations = _spatial_attrs(a, spatial)
    output_padding = list(a.get("output_padding") or [0] * spatial)
    begin, end = int_kernels.conv_transpose_pads(a.get("auto_pad", "NOTSET"), list(x.shape[2:]), kernel,
                                                 strides, dilations, output_padding, a.get("pads"),
                                                 a.get("output_shape"))
    axes = (0, *range(2, w.ndim))  # a ConvTranspose output channel sums over Cin and the kernel
    bound = int_kernels.product_bound(x, w, axes)
    return int_kernels.conv_transpose(x, w, strides=strides, pads_begin=begin, pads_end=end,
                                      dilations=dilations, output_padding=output_padding,
                                      group=int(a.get("group", 1)), bound=bound)


class _Requantizing(HzOp):
    """An integer op whose output is ``clip(round(acc * m) + z)``: multipliers kept in float64."""

    double_attributes = ("multiplier", "a_multiplier", "b_multiplier", "multipliers")


@register
class HzSQuantizedConv(_Requantizing):
    """Conv / ConvTranspose / MatMul-with-weight on integers.

    Inputs: x (int8|int16), w (int8), optional bias (int32). Extra attributes:
    ``kind`` (Conv | ConvTranspose | MatMul), ``x_bits``, the conv attributes
    (kernel_shape, strides, pads, dilations, group, output_padding), ``axis``
    (output channel axis of the result: 1 for convs, -1 for MatMul).
    """

    op_type = "HzSQuantizedConv"
    attributes = {"kind": REQUIRED, "x_bits": 8, "axis": 1, "multiplier": REQUIRED, "x_zero_point": 0,
                  "requantize_f32": 0, **OUTPUT_ATTRS, **CONV_ATTRS}
    mac = True

    @classmethod
    def lower(cls, node: NodeProto, ctx: LoweringContext) -> list[NodeProto]:
        a = attrs_of(node)
        nodes: list[NodeProto] = []
        hint = node.name
        conv_attrs = {k: a[k] for k in CONV_ATTRS if k in a}
        if uint8_kernels.conv(ctx, node, a, conv_attrs, nodes) or uint8_kernels.matmul(ctx, node, a, nodes):
            return nodes
        x, w = node.input[0], node.input[1]
        rank = ctx.rank(node.output[0])
        zps = (int(a.get("x_zero_point", 0)), 0)
        in_int32 = False  # an accumulator that fits int32 stays int32 until the requantization
        if a["kind"] == "ConvTranspose" and _transpose_by_blocks(ctx, node, a, nodes):
            return nodes
        if a["kind"] == "ConvTranspose":
            acc = _integer_product(ctx, "ConvTranspose", x, a["x_bits"], w, 8, hint, nodes, zps, **conv_attrs)
        else:
            bias = ctx.constant_values.get(node.input[2]) if len(node.input) > 2 and node.input[2] else None
            bias_max = float(np.abs(numpy_helper.to_array(bias).astype(np.float64)).max(initial=0.0)) \
                if bias is not None else np.inf if len(node.input) > 2 and node.input[2] else 0.0
            if a["kind"] == "MatMul":
                acc, in_int32 = uint8_kernels.matmul_accumulator(ctx, node, a, nodes, bias_max) or \
                    (_integer_product(ctx, "MatMulInteger", x, a["x_bits"], w, 8, hint, nodes, zps), False)
            else:
                acc, in_int32 = uint8_kernels.conv_accumulator(ctx, node, a, conv_attrs, nodes, bias_max) or \
                    (_integer_product(ctx, "ConvInteger", x, a["x_bits"], w, 8, hint, nodes, zps, **conv_attrs),
                     False)
        axis = a.get("axis", 1)
        if rank is not None and axis < 0:
            axis += rank
        has_bias = len(node.input) > 2 and bool(node.input[2])
        bias = ctx.known(node.input[2]) if has_bias else None
        if in_int32 and a.get("requantize_f32") and rank is not None and (bias is not None or not has_bias):
            scaled = _scaled_accumulator(ctx, acc, bias, a["multiplier"], axis, hint, nodes, last=axis == rank - 1)
            if scaled is not None:
                _requantize(ctx, scaled, {**a, "axis": axis}, rank, node.output[0], hint, nodes, scaled=True)
                return nodes
        if len(node.input) > 2 and node.input[2]:
            acc = _add_bias(ctx, acc, node.input[2], rank, axis, hint, nodes, in_int32)
        if in_int32:  # exact in float64 too; the float32 rule casts it itself
            acc = acc if a.get("requantize_f32") else _cast(ctx, acc, TensorProto.DOUBLE, f"{hint}_acc", nodes)
        _requantize(ctx, acc, {**a, "axis": axis}, rank, node.output[0], hint, nodes)
        return nodes

    @classmethod
    def reference(cls, node: NodeProto, inputs: list[np.ndarray]) -> list[np.ndarray]:
        a = _attrs(node)
        x, w = _shifted(inputs[0], a.get("x_zero_point", 0)), inputs[1]
        if a["kind"] == "MatMul":
            acc = int_kernels.matmul(x, w, int_kernels.product_bound(x, w, (0,)))
        elif a["kind"] == "ConvTranspose":
            acc = _np_conv_transpose(x, w, a)
        else:
            acc = _np_conv(x, w, a)
        axis = a.get("axis", 1) % acc.ndim
        acc = acc.astype(np.float64)
        if len(inputs) > 2 and inputs[2] is not None:
            shape = [1] * acc.ndim
            shape[axis] = -1
            acc = acc + inputs[2].astype(np.float64).reshape(shape)
        return [_np_requantize(acc, a, axis)]


@register
class HzSQuantizedMatMul(_Requantizing):
    """MatMul of two integer activations. Attributes: a_bits, b_bits, axis=-1."""

    op_type = "HzSQuantizedMatMul"
    attributes = {"a_bits": 8, "b_bits": 8, "axis": -1, "multiplier": REQUIRED, "a_zero_point": 0,
                  "b_zero_point": 0, "requantize_f32": 0, **OUTPUT_ATTRS}
    mac = True

    @classmethod
    def lower(cls, node: NodeProto, ctx: LoweringContext) -> list[NodeProto]:
        a = attrs_of(node)
        nodes: list[NodeProto] = []
        if uint8_kernels.matmul(ctx, node, a, nodes):
            return nodes
        zps = (int(a.get("a_zero_point", 0)), int(a.get("b_zero_point", 0)))
        acc = uint8_kernels.activations_product(ctx, node, a, nodes) or \
            _integer_product(ctx, "MatMulInteger", node.input[0], a["a_bits"], node.input[1], a["b_bits"],
                             node.name, nodes, zps)
        _requantize(ctx, acc, a, ctx.rank(node.output[0]), node.output[0], node.name, nodes)
        return nodes

    @classmethod
    def reference(cls, node: NodeProto, inputs: list[np.ndarray]) -> list[np.ndarray]:
        attrs = _attrs(node)
        a, b = _shifted(inputs[0], attrs.get("a_zero_point", 0)), _shifted(inputs[1], attrs.get("b_zero_point", 0))
        bound = int_kernels.max_abs(a) * int_kernels.max_abs(b) * a.shape[-1]
        return [_np_requantize(int_kernels.matmul(a, b, bound), attrs)]


@register
class HzSQuantizedEltwise(_Requantizing):
    """Add/Sub/Mul of two integer tensors: ``mode`` add (a*ma + b*mb) or mul (a*b*m).

    With ``requantize_f32`` an add computes ``float32(float32(a * ma) + float32(b * mb))`` and a mul
    ``float32(float32(a * b) * m)`` (float32 multipliers, each operation rounded once) before rounding
    half to even: the levels of an int16 tensor are exact in float32, so these run in float32 at half
    the memory traffic of float64; the calibrated model's twins follow the same rule
    (``hbtools.ops.twins``). Without the flag (models written before it) they are float64.
    """

    op_type = "HzSQuantizedEltwise"
    attributes = {"mode": REQUIRED, "multiplier": REQUIRED, "a_multiplier": None, "b_multiplier": None,
                  "a_zero_point": 0, "b_zero_point": 0, "requantize_f32": 0, **OUTPUT_ATTRS}

    @classmethod
    def lower(cls, node: NodeProto, ctx: LoweringContext) -> list[NodeProto]:
        a = attrs_of(node)
        nodes: list[NodeProto] = []
        hint = node.name
        both_int8 = all(uint8_kernels.known_int8(ctx, x) for x in node.input[:2])
        if both_int8 and a.get("requantize_f32") and a["out_type"] == "int8" \
                and ctx.opset >= 12 and all(abs(int(a.get(k, 0))) <= 127 for k in ZERO_POINTS):
            return cls._lower_int8_f32(node, ctx, a)
        if a["out_type"] in ("int8", "int16") and both_int8:
            return cls._lower_by_pair_table(node, ctx, a)
        single = bool(a.get("requantize_f32"))
        precision = TensorProto.FLOAT if single else TensorProto.DOUBLE
        xa = _cast(ctx, node.input[0], precision, f"{hint}_a", nodes)
        xb = _cast(ctx, node.input[1], precision, f"{hint}_b", nodes)
        xa = _minus_zero_point(ctx, xa, a.get("a_zero_point", 0), f"{hint}_a", nodes, single)
        xb = _minus_zero_point(ctx, xb, a.get("b_zero_point", 0), f"{hint}_b", nodes, single)
        if a["mode"] == "mul":
            n, acc = _node(ctx, "Mul", [xa, xb], f"{hint}_prod")
            nodes.append(n)
            m = float(a["multiplier"][0])
            if single and m != 1.0:  # float32(float32(a * b) * float32(m)), the reference's rule
                n, acc = _node(ctx, "Mul", [acc, ctx.constant(f"{hint}_m", np.array(m, np.float32))], f"{hint}_scaled")
                nodes.append(n)
        else:
            dtype = np.float32 if single else np.float64
            ma = ctx.constant(f"{hint}_ma", np.array(a["a_multiplier"], dtype=dtype))
            mb = ctx.constant(f"{hint}_mb", np.array(a["b_multiplier"], dtype=dtype))
            n1, sa = _node(ctx, "Mul", [xa, ma], f"{hint}_sa")
            n2, sb = _node(ctx, "Mul", [xb, mb], f"{hint}_sb")
            n3, acc = _node(ctx, "Add", [sa, sb], f"{hint}_sum")
            nodes += [n1, n2, n3]
        _requantize(ctx, acc, a, None, node.output[0], hint, nodes, scaled=single)
        return nodes

    @classmethod
    def _lower_int8_f32(cls, node: NodeProto, ctx: LoweringContext, a: dict) -> list[NodeProto]:
        """An int8 add or mul to int8 on the uint8 copies: the float32 value of its rule
        (``uint8_kernels.float32_sum`` / ``float32_product``: DequantizeLinear of each copy, their sum or
        product), then ``QuantizeLinear`` with step 1, which rounds half to even and saturates: byte-wide
        passes instead of the pair table's int32 index and gather."""
        nodes: list[NodeProto] = []
        copies = [uint8_kernels.uint8_copy(ctx, x, nodes) for x in node.input[:2]]
        zero_points = (int(a.get("a_zero_point", 0)), int(a.get("b_zero_point", 0)))
        if a["mode"] == "add":
            value = uint8_kernels.float32_sum(ctx, *copies, zero_points, (np.float32(a["a_multiplier"]),
                                                                          np.float32(a["b_multiplier"])),
                                              node.name, nodes)
        else:
            value = uint8_kernels.float32_product(ctx, *copies, zero_points, np.float32(a["multiplier"][0]), node.name,
                                                  nodes)
        _round_to_int8(ctx, value, a, node.output[0], node.name, nodes)
        return nodes

    @classmethod
    def _lower_by_pair_table(cls, node: NodeProto, ctx: LoweringContext, a: dict) -> list[NodeProto]:
        """Two int8 inputs: the result of every (a, b) pair, looked up at ``256 * (a + 128) + (b + 128)``.

        The 65,536 entries are this op's reference on every pair, so the lookup agrees with it bit
        for bit; it replaces ten float64 element-wise nodes by two casts, two int32 nodes and a gather.
        """
        nodes: list[NodeProto] = []
        hint = node.name
        levels = np.arange(-128, 128, dtype=np.int8)
        table = cls.reference(node, [levels.reshape(-1, 1), levels.reshape(1, -1)])[0].reshape(-1)
        a_u8, b_u8 = (uint8_kernels.uint8_copy(ctx, x, nodes) for x in node.input[:2])
        rows = _cast(ctx, a_u8, TensorProto.INT32, f"{hint}_a", nodes)
        n, rows = _node(ctx, "Mul", [rows, ctx.constant(f"{hint}_256", np.array(256, np.int32))], f"{hint}_rows")
        nodes.append(n)
        n, index = _node(ctx, "Add", [rows, _cast(ctx, b_u8, TensorProto.INT32, f"{hint}_b", nodes)],
                         f"{hint}_index")
        nodes.append(n)
        _look_up_levels(ctx, table, a["out_type"], index, node.output[0], hint, nodes)
        return nodes

    @classmethod
    def reference(cls, node: NodeProto, inputs: list[np.ndarray]) -> list[np.ndarray]:
        a = _attrs(node)
        xa, xb = (x.astype(np.float64) - np.float64(a.get(f"{k}_zero_point", 0))
                  for x, k in zip(inputs[:2], "ab", strict=True))
        if a["mode"] == "mul":
            acc = xa * xb
        elif a.get("requantize_f32"):  # levels exact in float32; each product and the sum rounded once
            acc = grids.add_f32(xa, xb, a["a_multiplier"], a["b_multiplier"])
        else:
            acc = xa * np.float64(a["a_multiplier"]) + xb * np.float64(a["b_multiplier"])
        return [_np_requantize(acc, a)]


def _look_up_levels(ctx: LoweringContext, table: np.ndarray, out_type: str, index: str, out: str, hint: str,
                    nodes: list[NodeProto]) -> None:
    """``out = table[index]`` as ``out_type``; an int8 result comes straight from a uint8 table (entries
    + 128) as ``out``'s uint8 copy, the one integer kernels downstream read."""
    if out_type != "int8":
        uint8_kernels.lookup(ctx, ctx.constant(f"{hint}_table", table.astype(NUMPY_INT[out_type])), index, out, nodes)
        return
    u8 = ctx.unique(f"{out}_u8")
    table_u8 = (table.astype(np.int16) + uint8_kernels.OFFSET).astype(np.uint8)
    uint8_kernels.lookup(ctx, ctx.constant(f"{hint}_table_u8", table_u8), index, u8, nodes)
    uint8_kernels.to_int8(ctx, u8, out, nodes)


def packed_table(values: np.ndarray | list[int]) -> TensorProto:
    """A lookup table as a ``table`` attribute value: a uint8 tensor holding the zlib stream of its
    first differences (int32 little-endian, the first one from 0). Tables of smooth functions
    repeat a few differences, so this is some fifty times smaller than the int16 entries."""
    diffs = np.diff(np.asarray(values, dtype=np.int64), prepend=0).astype("<i4")
    return numpy_helper.from_array(np.frombuffer(zlib.compress(diffs.tobytes(), 9), dtype=np.uint8))


def table_of(node: NodeProto, name: str = "table") -> np.ndarray:
    """A lookup-table attribute as int64: a list of ints, an integer tensor, or packed (a uint8
    tensor, ``packed_table``; no table has uint8 entries)."""
    attr = next((a for a in node.attribute if a.name == name), None)
    if attr is None:
        raise ValueError(f"{node.op_type} {node.name}: no {name} attribute")
    if attr.type != AttributeProto.TENSOR:
        return np.asarray(helper.get_attribute_value(attr), dtype=np.int64)
    values = numpy_helper.to_array(attr.t)
    if values.dtype != np.uint8:
        return values.astype(np.int64)
    try:
        diffs = np.frombuffer(zlib.decompress(values.tobytes()), dtype="<i4")
    except (zlib.error, ValueError):
        raise ValueError(f"{node.op_type} {node.name}: the packed {name} attribute is damaged") from None
    return np.cumsum(diffs, dtype=np.int64)


def varying_part(table: np.ndarray) -> tuple[int, int]:
    """``[start, stop)`` of ``table`` outside of which every entry repeats the nearer end entry.

    Clamping an index into that range changes no result, so only ``table[start:stop]`` need be stored.
    """
    changes = np.flatnonzero(table[1:] != table[:-1])
    if changes.size == 0:
        return 0, min(1, table.size)
    return int(changes[0]), int(changes[-1]) + 2


@register
class HzLut(HzOp):
    """Element-wise function by table: ``y = table[clip(x - in_min, 0, len(table) - 1)]``.

    Attributes: table (ints, an integer tensor, or ``packed_table``), in_min, out_type. A table
    may cover only the input levels where the function varies (and can be reached): inputs
    beyond either end take that end's entry. (Older files hold tables over every level.)
    """

    op_type = "HzLut"
    attributes = {"table": REQUIRED, "in_min": REQUIRED, "out_type": REQUIRED}
    shape_preserving = True

    @classmethod
    def compact(cls, table: np.ndarray, in_min: int) -> tuple[np.ndarray, int]:
        """``table`` (first entry for input ``in_min``) cut to its varying part, and that part's ``in_min``."""
        start, stop = varying_part(table)
        return table[start:stop], in_min + start

    @classmethod
    def lower(cls, node: NodeProto, ctx: LoweringContext) -> list[NodeProto]:
        a = attrs_of(node)
        nodes: list[NodeProto] = []
        hint = node.name
        values = table_of(node).astype(NUMPY_INT[a["out_type"]])
        in_min, last = int(a["in_min"]), int(a["in_min"]) + values.size - 1
        x_u8 = uint8_kernels.uint8_copy(ctx, node.input[0], nodes)
        if x_u8 is not None and in_min >= -128 and last <= 127:
            # An int8 input: index its uint8 copy into the table spread over all 256 levels (the clamp
            # folded into the entries), so the lookup needs no clamp and no offset.
            spread = values[np.clip(np.arange(256) - 128 - in_min, 0, values.size - 1)]
            index = _cast(ctx, x_u8, TensorProto.INT32, f"{hint}_x", nodes)
            _look_up_levels(ctx, spread, a["out_type"], index, node.output[0], hint, nodes)
            return nodes
        table = ctx.constant(f"{hint}_table", values)
        # Clamp first: a table may cover only part of the input's levels (a whole one is unchanged by it).
        if ctx.opset >= 12:  # integer Clip
            xi = _cast(ctx, node.input[0], TensorProto.INT32, f"{hint}_x", nodes)
            bounds = [ctx.constant(f"{hint}_{k}", np.array(v, dtype=np.int32)) for k, v in (("lo", in_min),
                                                                                            ("hi", last))]
            n, xi = _node(ctx, "Clip", [xi, *bounds], f"{hint}_clamp")
            nodes.append(n)
        else:  # earlier Clip and Max/Min take floats only: clamp in float32, exact for int16 levels
            xf = _cast(ctx, node.input[0], TensorProto.FLOAT, f"{hint}_x", nodes)
            for op, v in (("Max", in_min), ("Min", last)):
                n, xf = _node(ctx, op, [xf, ctx.constant(f"{hint}_{op.lower()}", np.array(v, dtype=np.float32))],
                              f"{hint}_clamp")
                nodes.append(n)
            xi = _cast(ctx, xf, TensorProto.INT32, f"{hint}_xi", nodes)
        off = ctx.constant(f"{hint}_offset", np.array(-in_min, dtype=np.int32))
        n, idx = _node(ctx, "Add", [xi, off], f"{hint}_idx")
        nodes.append(n)
        uint8_kernels.lookup(ctx, table, idx, node.output[0], nodes)
        return nodes

    @classmethod
    def reference(cls, node: NodeProto, inputs: list[np.ndarray]) -> list[np.ndarray]:
        a = _attrs(node)
        table = a["table"]
        index = np.clip(inputs[0].astype(np.int64) - int(a["in_min"]), 0, table.size - 1)
        return [table[index]]


@register
class HzSQuantizedPool(_Requantizing):
    """Average pooling: integer window sums times ``multiplier`` (1/window folded in).

    ``kind`` GlobalAveragePool (ReduceSum over spatial axes), ReduceMean (ReduceSum over
    ``axes``, ``keepdims``) or AveragePool (a depthwise ConvInteger with a ones kernel).
    Attributes also: channels, pool attrs (kernel_shape, strides, pads, dilations).
    """

    op_type = "HzSQuantizedPool"
    attributes = {"kind": REQUIRED, "multiplier": REQUIRED, "x_zero_point": 0, "channels": None, "x_bits": 8,
                  "kernel_shape": None, "strides": None, "pads": None, "dilations": None, "axes": None, "keepdims": 1,
                  **OUTPUT_ATTRS}

    @staticmethod
    def summed_axes(a: dict, rank: int) -> list[int]:
        """The axes a GlobalAveragePool or ReduceMean kind sums over."""
        if a["kind"] == "GlobalAveragePool":
            return list(range(2, rank))
        return sorted(int(v) % rank for v in a["axes"])

    @classmethod
    def lower(cls, node: NodeProto, ctx: LoweringContext) -> list[NodeProto]:
        a = attrs_of(node)
        nodes: list[NodeProto] = []
        hint = node.name
        rank = ctx.rank(node.input[0]) or 4
        zp = int(a.get("x_zero_point", 0))
        if a["kind"] in ("GlobalAveragePool", "ReduceMean"):
            xi = _cast(ctx, node.input[0], TensorProto.INT32, f"{hint}_x", nodes)
            if zp:
                n, xi = _node(ctx, "Sub", [xi, ctx.constant(f"{hint}_zp", np.array(zp, dtype=np.int32))],
                              f"{hint}_shifted")
                nodes.append(n)
            axes = cls.summed_axes(a, rank)
            keepdims = int(a.get("keepdims", 1))
            s = exact_sum(ctx, xi, axes, keepdims, ctx.elements(node.input[0]), f"{hint}_sum", nodes)
            acc = _cast(ctx, s, TensorProto.DOUBLE, f"{hint}_sumd", nodes)
        else:
            kernel = a["kernel_shape"]
            attrs = {k: a[k] for k in ("kernel_shape", "strides", "pads", "dilations") if k in a}
            bits = int(a.get("x_bits", 8))
            # A depthwise sum: float32 convs where exact (``grouped_accumulator``), else ConvInteger.
            window = float(np.prod(kernel))
            acc = None
            if ctx.opset >= 10 and bits in (8, 16):
                ones_f32 = ctx.constant(f"{hint}_ones_f32", np.ones([a["channels"], 1, *kernel], dtype=np.float32))
                levels = uint8_kernels.float_levels(ctx, node.input[0], bits, zp, hint, nodes)
                acc = uint8_kernels.grouped_accumulator(ctx, levels, 2.0 ** (bits - 1) + abs(zp), bits == 16, ones_f32,
                                                        window, {"group": a["channels"], **attrs}, False, hint,
                                                        nodes)
            if acc is None:
                ones = ctx.constant(f"{hint}_ones", np.ones([a["channels"], 1, *kernel], dtype=np.int8))
                acc = _integer_product(ctx, "ConvInteger", node.input[0], bits, ones, 8, hint, nodes,
                                       (zp, 0), group=a["channels"], **attrs)
        _requantize(ctx, acc, a, None, node.output[0], hint, nodes)
        return nodes

    @classmethod
    def reference(cls, node: NodeProto, inputs: list[np.ndarray]) -> list[np.ndarray]:
        a = _attrs(node)
        x = _shifted(inputs[0], a.get("x_zero_point", 0))
        if a["kind"] in ("GlobalAveragePool", "ReduceMean"):
            acc = x.astype(np.int64).sum(axis=tuple(cls.summed_axes(a, x.ndim)), keepdims=bool(a.get("keepdims", 1)))
        else:
            # count_include_pad: a depthwise sum with a ones kernel, padding counts as zeros
            kernel = list(a["kernel_shape"])
            pads = list(a.get("pads") or [0] * 2 * len(kernel))
            dilations = list(a.get("dilations") or [1] * len(kernel))
            extent = [(k - 1) * d + 1 for k, d in zip(kernel, dilations, strict=True)]
            room = [s + pb + pe for s, pb, pe in zip(x.shape[2:], pads[: len(kernel)], pads[len(kernel):], strict=True)]
            if not all(0 < k <= r for k, r in zip(extent, room, strict=True)):
                raise ValueError(f"{node.name}: pooling window {extent} does not fit the padded input {room}")
            ones = np.ones([x.shape[1], 1, *kernel], dtype=np.int64)
            acc = _np_conv(x, ones, {**a, "group": x.shape[1]})
        return [_np_requantize(acc, a)]


@register
class HzSQuantizedConcat(_Requantizing):
    """Concat of integer tensors brought to one scale: ``multipliers`` per input, ``concat_axis``."""

    op_type = "HzSQuantizedConcat"
    attributes = {"multipliers": REQUIRED, "in_types": None, "concat_axis": REQUIRED, "zero_points": None,
                  **OUTPUT_ATTRS}

    @classmethod
    def lower(cls, node: NodeProto, ctx: LoweringContext) -> list[NodeProto]:
        a = attrs_of(node)
        nodes: list[NodeProto] = []
        parts = []
        zps = a.get("zero_points", [0] * len(node.input))
        in_types = a.get("in_types", [a["out_type"]] * len(node.input))
        if a["out_type"] == "int8" and all(t == "int8" for t in in_types) \
                and all(uint8_kernels.known_int8(ctx, x) for x in node.input):
            return cls._lower_by_part_tables(node, ctx)
        for k, (x, m) in enumerate(zip(node.input, a["multipliers"], strict=True)):
            if _copied(a, k, len(node.input)):
                parts.append(x)
                continue
            xd = _cast(ctx, x, TensorProto.DOUBLE, f"{node.name}_{k}", nodes)
            xd = _minus_zero_point(ctx, xd, zps[k], f"{node.name}_{k}", nodes)
            out = ctx.unique(f"{node.name}_{k}_rq")
            _requantize(ctx, xd, {**a, "multiplier": [m]}, None, out, f"{node.name}_{k}", nodes)
            parts.append(out)
        nodes.append(helper.make_node("Concat", parts, [node.output[0]], name=ctx.unique(node.name),
                                      axis=a["concat_axis"]))
        return nodes

    @classmethod
    def _lower_by_part_tables(cls, node: NodeProto, ctx: LoweringContext) -> list[NodeProto]:
        """int8 inputs: each part's levels through a 256-entry table of its requantization, on the uint8
        copies (levels + 128), concatenated as uint8; a part on the output grid already is copied.

        The tables are this op's reference on every level, so the lookup agrees with it bit for bit; a
        part costs a cast and a gather of bytes instead of a float64 chain and the output's uint8 copy
        comes for free. The calibrated model's twins requantize a Concat of int8 parts the same way."""
        nodes: list[NodeProto] = []
        levels = np.arange(-128, 128, dtype=np.int8)
        a = _attrs(node)  # the multipliers as float64, as the reference reads them
        parts = []
        for k, x in enumerate(node.input):
            u8 = uint8_kernels.uint8_copy(ctx, x, nodes)
            if not _copied(a, k, len(node.input)):
                table = cls._part(a, k, levels).astype(np.int16) + uint8_kernels.OFFSET
                index = _cast(ctx, u8, TensorProto.INT32, f"{node.name}_{k}", nodes)
                u8 = ctx.unique(f"{node.name}_{k}_u8")
                uint8_kernels.lookup(ctx, ctx.constant(f"{node.name}_{k}_table", table.astype(np.uint8)), index, u8,
                                     nodes)
            parts.append(u8)
        n, joined = _node(ctx, "Concat", parts, f"{node.output[0]}_u8", axis=a["concat_axis"])
        nodes.append(n)
        uint8_kernels.to_int8(ctx, joined, node.output[0], nodes)
        return nodes

    @classmethod
    def reference(cls, node: NodeProto, inputs: list[np.ndarray]) -> list[np.ndarray]:
        a = _attrs(node)
        # on the output grid already: copied as is, without clipping (as the hardware does)
        parts = [x if _copied(a, k, len(inputs)) else cls._part(a, k, x) for k, x in enumerate(inputs)]
        return [np.concatenate(parts, axis=a["concat_axis"])]

    @staticmethod
    def _part(a: dict, k: int, x: np.ndarray) -> np.ndarray:
        """Input ``k``'s levels ``x`` requantized to the output grid."""
        zero_point = a.get("zero_points", [0] * len(a["multipliers"]))[k]
        return _np_requantize(_shifted(x, zero_point), {**a, "multiplier": [a["multipliers"][k]]})


def _copied(a: dict, k: int, count: int) -> bool:
    """Concat input ``k`` is on the output grid already (same step, type and zero point)."""
    in_type = a.get("in_types", [a["out_type"]] * count)[k]
    zp = a.get("zero_points", [0] * count)[k]
    return a["multipliers"][k] == 1.0 and in_type == a["out_type"] and zp == a.get("zero_point", 0)


def _minus_zero_point(ctx: LoweringContext, x: str, zero_point: int, hint: str, nodes: list[NodeProto],
                      single: bool = False) -> str:
    """float64 (``single``: float32) integer levels minus their zero point (unchanged without one)."""
    if not zero_point:
        return x
    z = np.array(float(zero_point), dtype=np.float32 if single else np.float64)
    n, out = _node(ctx, "Sub", [x, ctx.constant(f"{hint}_zp", z)], f"{hint}_shifted")
    nodes.append(n)
    return out


@register
class HzRequantize(_Requantizing):
    """Integer to integer at another scale (e.g. an int32 accumulator to int8)."""

    op_type = "HzRequantize"
    attributes = {"multiplier": REQUIRED, "axis": 1, "requantize_f32": 0, **OUTPUT_ATTRS}
    shape_preserving = True

    @classmethod
    def lower(cls, node: NodeProto, ctx: LoweringContext) -> list[NodeProto]:
        a = attrs_of(node)
        nodes: list[NodeProto] = []
        xd = _cast(ctx, node.input[0], TensorProto.DOUBLE, node.name, nodes)
        rank = ctx.rank(node.input[0])
        axis = a.get("axis", 1)
        if rank is not None and axis < 0:
            axis += rank
        _requantize(ctx, xd, {**a, "axis": axis}, rank, node.output[0], node.name, nodes)
        return nodes

    @classmethod
    def reference(cls, node: NodeProto, inputs: list[np.ndarray]) -> list[np.ndarray]:
        a = _attrs(node)
        return [_np_requantize(inputs[0], a, a.get("axis", 1))]


@register
class HzQuantize(HzOp):
    """float -> int: ``clip(round(x / scale) + zero_point)`` in float32.

    Attributes: scale (or, per channel, ``scales`` along ``axis``; a negative axis
    counts from the end), out_type, out_min, out_max, optional zero_point.
    """

    op_type = "HzQuantize"
    attributes = {"scale": None, "scales": None, "axis": 1, **OUTPUT_ATTRS}
    shape_preserving = True
    boundary = True

    @staticmethod
    def _scale(a: dict, rank: int | None) -> np.ndarray:
        if "scales" in a:
            axis = a.get("axis", 1)
            if axis < 0:  # counted from the end: the broadcast shape needs no rank
                return np.asarray(a["scales"], dtype=np.float32).reshape([-1] + [1] * (-axis - 1))
            if rank is None:
                raise ValueError("HzQuantize: per-channel scales on a positive axis need the input's rank")
            return _per_axis(a["scales"], axis, rank).astype(np.float32)
        return np.array(a["scale"], dtype=np.float32)

    @classmethod
    def lower(cls, node: NodeProto, ctx: LoweringContext) -> list[NodeProto]:
        a = attrs_of(node)
        nodes: list[NodeProto] = []
        hint = node.name
        s = ctx.constant(f"{hint}_scale", cls._scale(a, ctx.rank(node.input[0])))
        n, q = _node(ctx, "Div", [node.input[0], s], f"{hint}_div")
        nodes.append(n)
        n, r = _node(ctx, "Round", [q], f"{hint}_round")
        nodes.append(n)
        if a.get("zero_point", 0):
            z = ctx.constant(f"{hint}_zp", np.array(a["zero_point"], dtype=np.float32))
            n, r = _node(ctx, "Add", [r, z], f"{hint}_shifted")
            nodes.append(n)
        lo = ctx.constant(f"{hint}_lo", np.array(a["out_min"], dtype=np.float32))
        hi = ctx.constant(f"{hint}_hi", np.array(a["out_max"], dtype=np.float32))
        n, c = _node(ctx, "Clip", [r, lo, hi], f"{hint}_clip")
        nodes.append(n)
        nodes.append(helper.make_node("Cast", [c], [node.output[0]], name=ctx.unique(f"{hint}_cast"),
                                      to=ONNX_INT[a["out_type"]]))
        return nodes

    @classmethod
    def reference(cls, node: NodeProto, inputs: list[np.ndarray]) -> list[np.ndarray]:
        a = _attrs(node)
        # float32 division, as the float input arrives; float64 would round some ties differently
        x = inputs[0].astype(np.float32)
        q = np.round(x / cls._scale(a, x.ndim))
        if a.get("zero_point", 0):
            q = q + np.float32(a["zero_point"])
        q = np.clip(q, np.float32(a["out_min"]), np.float32(a["out_max"]))
        with np.errstate(invalid="ignore"):  # NaN has no level (its input's feed was warned about)
            return [q.astype(NUMPY_INT[a["out_type"]])]


@register
class HzDequantize(HzOp):
    """int -> float32: ``(x - zero_point) * scale`` (per tensor, or per channel along ``axis``), in float64."""

    op_type = "HzDequantize"
    attributes = {"scales": REQUIRED, "axis": 1, "zero_point": 0}
    shape_preserving = True
    float_output = True
    boundary = True

    @classmethod
    def lower(cls, node: NodeProto, ctx: LoweringContext) -> list[NodeProto]:
        a = attrs_of(node)
        nodes: list[NodeProto] = []
        hint = node.name
        rank = ctx.rank(node.input[0])
        axis = a.get("axis", 1)
        if rank is not None and axis < 0:
            axis += rank
        xd = _cast(ctx, node.input[0], TensorProto.DOUBLE, hint, nodes)
        xd = _minus_zero_point(ctx, xd, a.get("zero_point", 0), hint, nodes)
        s = ctx.constant(f"{hint}_scale", _per_axis(a["scales"], axis, rank))
        n, y = _node(ctx, "Mul", [xd, s], f"{hint}_mul")
        nodes.append(n)
        nodes.append(helper.make_node("Cast", [y], [node.output[0]], name=ctx.unique(f"{hint}_cast"),
                                      to=TensorProto.FLOAT))
        return nodes

    @classmethod
    def reference(cls, node: NodeProto, inputs: list[np.ndarray]) -> list[np.ndarray]:
        a = _attrs(node)
        x = inputs[0]
        scales = _axis_shaped(a["scales"], a.get("axis", 1), x.ndim) if x.ndim else np.float64(a["scales"][0])
        return [((x.astype(np.float64) - np.float64(a.get("zero_point", 0))) * scales).astype(np.float32)]
