"""Converters of Caffe's computing layers (weights, activations, pooling, arithmetic)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import numpy as np
from onnx import TensorProto

from hbtools.frontends.caffe.builder import Layer

log = logging.getLogger("hbtools")


def _hw(layer: Layer, what: str, repeated: Sequence[int], h: int | None, w: int | None,
        default: int | None) -> tuple[int, int]:
    """A 2-D size from Caffe's ``x: a [x: b]`` or ``x_h``/``x_w`` spellings."""
    if h is not None or w is not None:
        if h is None or w is None:
            raise layer.fail(f"{what}_h and {what}_w must be given together")
        return int(h), int(w)
    values = [int(v) for v in repeated]
    if not values:
        if default is None:
            raise layer.fail(f"{what} is not set")
        return default, default
    if len(values) > 2:
        raise layer.fail(f"{what} has {len(values)} values; only 2-D layers are supported")
    return (values[0], values[-1])


def _field(param: object, name: str) -> int | None:
    return getattr(param, name) if param.HasField(name) else None  # type: ignore[attr-defined]


def _four_d(layer: Layer) -> list[int]:
    shape = layer.in_shape()
    if len(shape) != 4:
        raise layer.fail(f"needs a 4-D (NCHW) input, got shape {shape}")
    return shape


def convolution(layer: Layer, transposed: bool = False, depthwise: bool = False) -> None:
    """``depthwise``: the ConvolutionDepthwise / DepthwiseConvolution layers of MobileNet and ShuffleNet ports,
    grouped Convolutions whose group, where not given, is the input's channels."""
    p = layer.param.convolution_param
    n, c, _, _ = _four_d(layer)
    if p.axis not in (1, -3):
        raise layer.fail(f"axis {p.axis} is not supported (only the channel axis 1)")
    kh, kw = _hw(layer, "kernel", p.kernel_size, _field(p, "kernel_h"), _field(p, "kernel_w"), None)
    sh, sw = _hw(layer, "stride", p.stride, _field(p, "stride_h"), _field(p, "stride_w"), 1)
    ph, pw = _hw(layer, "pad", p.pad, _field(p, "pad_h"), _field(p, "pad_w"), 0)
    dh, dw = _hw(layer, "dilation", p.dilation, None, None, 1)
    group, cout = (c if depthwise and not p.HasField("group") else int(p.group)), int(p.num_output)
    if not cout:
        raise layer.fail("num_output is not set")
    if group < 1 or c % group or cout % group:
        raise layer.fail(f"group {group} does not divide the {c} input and {cout} output channels")
    shape = [c, cout // group, kh, kw] if transposed else [cout, c // group, kh, kw]
    params = [layer.const(layer.weight(0, shape, "weight"), "weight")]
    if p.bias_term:
        params.append(layer.const(layer.weight(1, [cout], "bias"), "bias"))
    pairs = len(layer.param.bottom)
    if len(layer.param.top) != pairs:
        raise layer.fail(f"has {pairs} bottom(s) and {len(layer.param.top)} top(s); Caffe convolves each bottom "
                         "into the top at the same place, so the counts must be equal")
    # Several bottoms share the layer's weights, one convolution each (Caffe checks they have one shape).
    for i in range(pairs):
        if layer.in_shape(i) != layer.in_shape(0):
            raise layer.fail(f"bottom {i} has shape {layer.in_shape(i)}, bottom 0 {layer.in_shape(0)}; "
                             "they must be equal")
        y = layer.node("ConvTranspose" if transposed else "Conv", [layer.bottom(i), *params], kernel_shape=[kh, kw],
                       strides=[sh, sw], pads=[ph, pw, ph, pw], dilations=[dh, dw], group=group)
        layer.set_top(i, y)


def inner_product(layer: Layer) -> None:
    p = layer.param.inner_product_param
    shape = layer.in_shape()
    axis = layer.axis(p.axis, len(shape))
    k, n = int(np.prod(shape[axis:])), int(p.num_output)
    if not n:
        raise layer.fail("num_output is not set")
    w = layer.weight(0, [k, n] if p.transpose else [n, k], "weight")
    bias = layer.weight(1, [n], "bias") if p.bias_term else None
    x = layer.bottom()
    if axis == 1:
        if len(shape) != 2:
            x = layer.node("Flatten", [x], axis=1)
        inputs = [x, layer.const(w, "weight")] + ([layer.const(bias, "bias")] if bias is not None else [])
        layer.set_top(0, layer.node("Gemm", inputs, transB=0 if p.transpose else 1))
        return
    x = layer.node("Reshape", [x, layer.ints([*shape[:axis], k], "shape")])
    y = layer.node("MatMul", [x, layer.const(w if p.transpose else w.T, "weight")])
    if bias is not None:
        y = layer.node("Add", [y, layer.const(bias, "bias")])
    layer.set_top(0, y)


def batch_norm(layer: Layer) -> None:
    p = layer.param.batch_norm_param
    shape = layer.in_shape()
    if len(shape) < 2:
        raise layer.fail(f"needs an input with a channel axis, got shape {shape}")
    c = shape[1]
    factor_blob = layer.weight(2, [1], "scale factor")[0]
    # Caffe keeps running sums: the statistics are the blobs divided by blob 2 (0 means unset).
    factor = 0.0 if factor_blob == 0 else 1.0 / float(factor_blob)
    mean, var = layer.weight(0, [c], "mean") * factor, layer.weight(1, [c], "variance") * factor
    if p.HasField("use_global_stats") and not p.use_global_stats:
        log.warning("caffe layer '%s': use_global_stats is false (batch statistics); the converted model uses the "
                    "stored statistics, as a deploy network should", layer.name)
    inputs = [layer.bottom(), layer.const(np.ones(c), "gamma"), layer.const(np.zeros(c), "beta"),
              layer.const(mean, "mean"), layer.const(var, "var")]
    layer.set_top(0, layer.node("BatchNormalization", inputs, epsilon=float(p.eps)))


def _affine(layer: Layer, op: str, axis: int, num_axes: int, bias_term: bool) -> None:
    """Scale (``Mul``) or Bias (``Add``): a blob or a second bottom broadcast from ``axis``."""
    shape = layer.in_shape()
    axis = layer.axis(axis, len(shape))
    x = layer.bottom()
    if len(layer.param.bottom) > 1:
        covered = layer.in_shape(1)
        if shape[axis:axis + len(covered)] != covered:
            raise layer.fail(f"second bottom shape {covered} does not match input shape {shape} at axis {axis}")
        operand = layer.bottom(1)
        if len(shape) - axis - len(covered):
            trailing = [1] * (len(shape) - axis - len(covered))
            operand = layer.node("Reshape", [operand, layer.ints([*covered, *trailing], "shape")])
        next_blob = 0
    else:
        covered = shape[axis:] if num_axes == -1 else shape[axis:axis + num_axes]
        trailing = [1] * (len(shape) - axis - len(covered))
        operand = layer.const(layer.weight(0, covered, op.lower()).reshape([*covered, *trailing]), op.lower())
        next_blob = 1
    y = layer.node("Mul" if op == "Scale" else "Add", [x, operand])
    if bias_term:
        trailing = [1] * (len(shape) - axis - len(covered))
        bias = layer.weight(next_blob, covered, "bias").reshape([*covered, *trailing])
        y = layer.node("Add", [y, layer.const(bias, "bias")])
    layer.set_top(0, y)


def scale(layer: Layer) -> None:
    p = layer.param.scale_param
    _affine(layer, "Scale", p.axis, p.num_axes, p.bias_term)


def bias(layer: Layer) -> None:
    p = layer.param.bias_param
    _affine(layer, "Bias", p.axis, p.num_axes, False)


def prelu(layer: Layer) -> None:
    p = layer.param.prelu_param
    shape = layer.in_shape()
    if p.channel_shared:
        slope = layer.weight(0, [1], "slope")
    else:
        if len(shape) < 2:
            raise layer.fail(f"needs an input with a channel axis, got shape {shape}")
        slope = layer.weight(0, [shape[1]], "slope").reshape([shape[1]] + [1] * (len(shape) - 2))
    layer.set_top(0, layer.node("PRelu", [layer.bottom(), layer.const(slope, "slope")]))


def relu(layer: Layer) -> None:
    slope = float(layer.param.relu_param.negative_slope)
    if slope:
        layer.set_top(0, layer.node("LeakyRelu", [layer.bottom()], alpha=slope))
    else:
        layer.set_top(0, layer.node("Relu", [layer.bottom()]))


def relu6(layer: Layer) -> None:
    """min(max(x, 0), 6) (MobileNet ports' ReLU6)."""
    bounds = [layer.const(np.float32(0), "min"), layer.const(np.float32(6), "max")]
    layer.set_top(0, layer.node("Clip", [layer.bottom(), *bounds]))


def mvn(layer: Layer) -> None:
    """Caffe's MVN: x - mean over H x W of each channel (C x H x W with across_channels), divided, with
    normalize_variance, by sqrt(E[x^2] - mean^2) + eps (Caffe's variance, eps outside the root)."""
    p = layer.param.mvn_param
    rank = len(layer.in_shape())
    if rank < 2:
        raise layer.fail(f"needs an input with a channel axis, got shape {layer.in_shape()}")
    x = layer.bottom()
    axes = list(range(1 if p.across_channels else 2, rank))  # an attribute at opset 13
    mean = layer.node("ReduceMean", [x], axes=axes, keepdims=1)
    centred = layer.node("Sub", [x, mean])
    if not p.normalize_variance:
        layer.set_top(0, centred)
        return
    variance = layer.node("Sub", [layer.node("ReduceMean", [layer.node("Mul", [x, x])], axes=axes, keepdims=1),
                                  layer.node("Mul", [mean, mean])])
    std = layer.node("Add", [layer.node("Sqrt", [variance]), layer.const(np.float32(p.eps), "eps")])
    layer.set_top(0, layer.node("Div", [centred, std]))


def axpy(layer: Layer) -> None:
    """a * x + y (SENet / MobileNet ports): a is [N, C, 1, 1], x and y [N, C, H, W]."""
    a, x, y = layer.in_shape(0), layer.in_shape(1), layer.in_shape(2)
    if x != y or len(a) != len(x) or a[:2] != x[:2] or any(d != 1 for d in a[2:]):
        raise layer.fail(f"needs a scale [N, C, 1, 1] and two blobs of one shape [N, C, ...], got {a}, {x}, {y}")
    layer.set_top(0, layer.node("Add", [layer.node("Mul", [layer.bottom(0), layer.bottom(1)]), layer.bottom(2)]))


def _unary(op: str, **attrs: object) -> Callable[[Layer], None]:
    def convert(layer: Layer) -> None:
        layer.set_top(0, layer.node(op, [layer.bottom()], **attrs))
    return convert


def elu(layer: Layer) -> None:
    layer.set_top(0, layer.node("Elu", [layer.bottom()], alpha=float(layer.param.elu_param.alpha)))


def _pooled(size: int, kernel: int, stride: int, pad: int, ceil: bool) -> int:
    """Caffe's pooled size: rounded up (or down), then the last window must start inside the input."""
    span = size + 2 * pad - kernel
    out = (-(-span // stride) if ceil else span // stride) + 1
    if pad and (out - 1) * stride >= size + pad:
        out -= 1
    return out


def pooling(layer: Layer) -> None:
    p = layer.param.pooling_param
    _, _, h, w = _four_d(layer)
    if p.pool == p.STOCHASTIC:
        raise layer.fail("STOCHASTIC pooling is not supported")
    op, x = ("MaxPool" if p.pool == p.MAX else "AveragePool"), layer.bottom()
    if p.global_pooling:
        layer.set_top(0, layer.node(f"Global{op}", [x]))
        return
    kh, kw = _hw(layer, "kernel", [p.kernel_size] if p.HasField("kernel_size") else [],
                 _field(p, "kernel_h"), _field(p, "kernel_w"), None)
    ph, pw = _hw(layer, "pad", [p.pad], _field(p, "pad_h"), _field(p, "pad_w"), 0)
    sh, sw = _hw(layer, "stride", [p.stride], _field(p, "stride_h"), _field(p, "stride_w"), 1)
    if ph >= kh or pw >= kw:
        raise layer.fail(f"pad {ph}x{pw} must be smaller than the kernel {kh}x{kw}")
    ceil = p.round_mode == p.CEIL
    # ceil_mode: BVLC/caffe PR #3057's name for the same choice, in forks and PyTorch exporters (numbered 13
    # there too; the schema gives it a free number, as parameters are read from the prototxt by name)
    if p.HasField("ceil_mode"):
        if p.HasField("round_mode") and p.ceil_mode != ceil:
            raise layer.fail("ceil_mode and round_mode disagree; keep one of them")
        ceil = p.ceil_mode
    out = [_pooled(h, kh, sh, ph, ceil), _pooled(w, kw, sw, pw, ceil)]
    if min(out) < 1:
        raise layer.fail(f"kernel {kh}x{kw} with pad {ph}x{pw} does not fit the input {h}x{w}")
    floor = [(h + 2 * ph - kh) // sh + 1, (w + 2 * pw - kw) // sw + 1]
    onnx_ceil = [-(-(h + 2 * ph - kh) // sh) + 1, -(-(w + 2 * pw - kw) // sw) + 1]
    attrs: dict[str, object] = {"kernel_shape": [kh, kw], "strides": [sh, sw]}
    avg = op == "AveragePool"
    if out == floor or out == onnx_ceil:
        attrs["pads"] = [ph, pw, ph, pw]
        if out != floor:
            attrs["ceil_mode"] = 1
        if avg:
            # Caffe divides by the window clipped to the padded input: onnxruntime's count_include_pad.
            attrs["count_include_pad"] = 1 if ph or pw else 0
    else:
        # Rounded up on one axis only: pad the far ends explicitly instead of ceil_mode.
        extra = [(o - 1) * s + k - n - 2 * q for o, s, k, n, q in zip(out, (sh, sw), (kh, kw), (h, w), (ph, pw),
                                                                       strict=True)]
        extra = [max(e, 0) for e in extra]
        if avg and (ph or pw):
            # Zero-pad like Caffe first, so only the far padding is left out of the divisor.
            x = layer.node("Pad", [x, layer.ints([0, 0, ph, pw, 0, 0, ph, pw], "pads")])
            ph = pw = 0
        attrs["pads"] = [ph, pw, ph + extra[0], pw + extra[1]]
        if avg:
            attrs["count_include_pad"] = 0
    layer.set_top(0, layer.node(op, [x], **attrs))


def eltwise(layer: Layer) -> None:
    p = layer.param.eltwise_param
    xs = [layer.bottom(i) for i in range(len(layer.param.bottom))]
    shapes = [layer.shape(x) for x in xs]
    if len(xs) < 2:
        raise layer.fail("needs at least 2 bottoms")
    if any(s != shapes[0] for s in shapes):
        raise layer.fail(f"bottom shapes differ: {shapes}")
    coeff = [float(c) for c in p.coeff]
    if coeff and (p.operation != p.SUM or len(coeff) != len(xs)):
        raise layer.fail(f"coeff needs operation SUM and one value per bottom ({len(xs)}), got {len(coeff)}")
    if p.operation == p.MAX:
        layer.set_top(0, layer.node("Max", xs))
        return
    if p.operation == p.SUM:
        xs = [x if c == 1.0 else layer.node("Mul", [x, layer.const(np.float32(c), "coeff")])
              for x, c in zip(xs, coeff or [1.0] * len(xs), strict=True)]
    y = xs[0]
    for x in xs[1:]:
        y = layer.node("Add" if p.operation == p.SUM else "Mul", [y, x])
    layer.set_top(0, y)


def softmax(layer: Layer) -> None:
    axis = layer.axis(layer.param.softmax_param.axis, len(layer.in_shape()))
    layer.set_top(0, layer.node("Softmax", [layer.bottom()], axis=axis))


def lrn(layer: Layer) -> None:
    p = layer.param.lrn_param
    size, alpha, beta, k = int(p.local_size), float(p.alpha), float(p.beta), float(p.k)
    _four_d(layer)
    if size % 2 == 0:
        raise layer.fail(f"local_size {size} must be odd")
    x = layer.bottom()
    if p.norm_region == p.ACROSS_CHANNELS:
        layer.set_top(0, layer.node("LRN", [x], size=size, alpha=alpha, beta=beta, bias=k))
        return
    # WITHIN_CHANNEL: x * (1 + alpha * mean of x^2 over a size x size window, zero padded) ^ -beta
    pad = (size - 1) // 2
    square = layer.node("Mul", [x, x])
    mean = layer.node("AveragePool", [square], kernel_shape=[size, size], pads=[pad] * 4, count_include_pad=1)
    base = layer.node("Add", [layer.node("Mul", [mean, layer.const(np.float32(alpha), "alpha")]),
                              layer.const(np.float32(1.0), "one")])
    factor = layer.node("Pow", [base, layer.const(np.float32(-beta), "beta")])
    layer.set_top(0, layer.node("Mul", [x, factor]))


def power(layer: Layer) -> None:
    p = layer.param.power_param
    y = layer.bottom()
    if p.scale != 1.0:
        y = layer.node("Mul", [y, layer.const(np.float32(p.scale), "scale")])
    if p.shift != 0.0:
        y = layer.node("Add", [y, layer.const(np.float32(p.shift), "shift")])
    if p.power != 1.0:
        y = layer.node("Pow", [y, layer.const(np.float32(p.power), "power")])
    layer.set_top(0, y)  # all defaults: y is the bottom itself


def _log_base(layer: Layer, base: float) -> float:
    """ln(base); Caffe's base -1 means e."""
    if base == -1.0:
        return 1.0
    if base <= 0 or base == 1.0:
        raise layer.fail(f"base {base:g} must be positive and not 1 (or -1 for e)")
    return float(np.log(base))


def exp(layer: Layer) -> None:
    """base ^ (shift + scale * x), written as exp(ln(base) * (shift + scale * x))."""
    p = layer.param.exp_param
    ln_base = _log_base(layer, p.base)
    a, b = ln_base * p.scale, ln_base * p.shift
    y = layer.bottom()
    if a != 1.0:
        y = layer.node("Mul", [y, layer.const(np.float32(a), "scale")])
    if b != 0.0:
        y = layer.node("Add", [y, layer.const(np.float32(b), "shift")])
    layer.set_top(0, layer.node("Exp", [y]))


def log_(layer: Layer) -> None:
    """log_base(shift + scale * x) = ln(shift + scale * x) / ln(base)."""
    p = layer.param.log_param
    ln_base = _log_base(layer, p.base)
    y = layer.bottom()
    if p.scale != 1.0:
        y = layer.node("Mul", [y, layer.const(np.float32(p.scale), "scale")])
    if p.shift != 0.0:
        y = layer.node("Add", [y, layer.const(np.float32(p.shift), "shift")])
    y = layer.node("Log", [y])
    if ln_base != 1.0:
        y = layer.node("Mul", [y, layer.const(np.float32(1.0 / ln_base), "base")])
    layer.set_top(0, y)


def threshold(layer: Layer) -> None:
    """1 where x > threshold, else 0 (as floats, like every Caffe blob)."""
    t = layer.node("Greater", [layer.bottom(), layer.const(np.float32(layer.param.threshold_param.threshold),
                                                             "threshold")])
    layer.set_top(0, layer.node("Cast", [t], to=TensorProto.FLOAT))


def argmax(layer: Layer) -> None:
    """Indices (as floats) of the top_k largest values along ``axis``; without ``axis``, over
    everything but the batch axis, shaped N x 1 x top_k (N x 2 x top_k with out_max_val:
    indices then values). With ``axis`` and out_max_val, the values replace the indices."""
    p = layer.param.argmax_param
    shape = layer.in_shape()
    k = int(p.top_k)
    x = layer.bottom()
    if p.HasField("axis"):
        axis = layer.axis(p.axis, len(shape))
        size = shape[axis]
    else:
        axis, size = 1, int(np.prod(shape[1:]))
        x = layer.node("Reshape", [x, layer.ints([shape[0], size], "flat")])
    if not 1 <= k <= size:
        raise layer.fail(f"top_k {k} must be between 1 and the {size} values it chooses from")
    if k == 1 and not p.out_max_val:
        index, values = layer.node("ArgMax", [x], axis=axis, keepdims=1), ""
    else:
        values, index = layer.net.unique(f"{layer.name}_values"), layer.net.unique(f"{layer.name}_indices")
        layer.node("TopK", [x, layer.ints([k], "k")], [values, index], axis=axis)
    if p.HasField("axis") and p.out_max_val:
        layer.set_top(0, values)
        return
    index = layer.node("Cast", [index], to=TensorProto.FLOAT)
    if p.HasField("axis"):
        layer.set_top(0, index)
        return
    parts = [index, values] if p.out_max_val else [index]
    parts = [layer.node("Unsqueeze", [t, layer.ints([1], "axes")]) for t in parts]
    layer.set_top(0, parts[0] if len(parts) == 1 else layer.node("Concat", parts, axis=1))


def normalize(layer: Layer) -> None:
    """SSD's L2 normalisation: x / sqrt(sum x^2 + eps) over the channels at each position (or over
    C x H x W with across_spatial), times a learned scale (one value, or one per channel)."""
    p = layer.param.norm_param
    _, c, _, _ = _four_d(layer)
    x = layer.bottom()
    axes = [1, 2, 3] if p.across_spatial else [1]
    total = layer.node("ReduceSum", [layer.node("Mul", [x, x]), layer.ints(axes, "axes")], keepdims=1)
    norm = layer.node("Sqrt", [layer.node("Add", [total, layer.const(np.float32(p.eps), "eps")])])
    y = layer.node("Div", [x, norm])
    gamma = layer.weight(0, [1] if p.channel_shared else [c], "scale")
    gamma = gamma.reshape([1] if p.channel_shared else [1, c, 1, 1])
    layer.set_top(0, layer.node("Mul", [y, layer.const(gamma, "scale")]))


def dropout(layer: Layer) -> None:
    p = layer.param.dropout_param
    if p.scale_train:  # Caffe scales at training time: inference passes values through
        layer.alias(0, layer.bottom())
    else:
        keep = np.float32(1.0 - p.dropout_ratio)
        layer.set_top(0, layer.node("Mul", [layer.bottom(), layer.const(keep, "keep")]))


CONVERTERS: dict[str, Callable[[Layer], None]] = {
    "Convolution": convolution,
    "Deconvolution": lambda layer: convolution(layer, transposed=True),
    **dict.fromkeys(("ConvolutionDepthwise", "DepthwiseConvolution"), lambda layer: convolution(layer, depthwise=True)),
    "InnerProduct": inner_product,
    "BatchNorm": batch_norm,
    "Scale": scale,
    "Bias": bias,
    "ReLU": relu,
    "ReLU6": relu6,
    "MVN": mvn,
    "Axpy": axpy,
    "PReLU": prelu,
    "Sigmoid": _unary("Sigmoid"),
    "TanH": _unary("Tanh"),
    "AbsVal": _unary("Abs"),
    "BNLL": _unary("Softplus"),
    "Exp": exp,
    "Log": log_,
    "Threshold": threshold,
    "ArgMax": argmax,
    "Normalize": normalize,
    "ELU": elu,
    "Pooling": pooling,
    "Eltwise": eltwise,
    "Softmax": softmax,
    "LRN": lrn,
    "Power": power,
    "Dropout": dropout,
}
