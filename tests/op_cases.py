"""Op conformance models: each op of the issue 13 list in small ``onnx.helper`` graphs.

One model per op group and opset. Every op sits on a branch of its own after a shared
stem (Conv 3->8 on a 1x3x8x8 image) and each branch ends in a graph output, so each op
is placed (BPU or CPU) and checked on its own output. Builders take the opset and use
the op forms that opset defines (attribute vs input forms of Split, Squeeze, Reduce*,
...); ``OPSETS`` says where an op group exists at all.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from builders import FloatModel, _Graph

OPSET_LIST = (11, 13, 17, 21)
C, H = 8, 8  # stem channels and spatial size


def _i64(*v: int) -> np.ndarray:
    return np.array(v, dtype=np.int64)


def _f32(v: object) -> np.ndarray:
    return np.asarray(v, dtype=np.float32)


def _stem(seed: int) -> tuple[_Graph, str]:
    g = _Graph(seed)
    return g, g.conv("data", 3, C)


def _axes(g: _Graph, op: str, x: str, axes: list[int], opset: int, since: int, **attrs: object) -> str:
    """An op whose ``axes`` became an input at opset ``since``."""
    if opset >= since:
        return g.op(op, [x, g.const(_i64(*axes), "axes")], **attrs)
    return g.op(op, [x], axes=axes, **attrs)


def _done(g: _Graph, outs: list[str], opset: int) -> FloatModel:
    return g.model({"data": [1, 3, H, H]}, outs, opset)


def conv_family(opset: int) -> FloatModel:
    """Conv (groups, dilations, asymmetric pads), ConvTranspose (groups, depthwise), Gemm, MatMul (weight; two
    activations), BN (of 4-D, 3-D and 2-D tensors, after a Gemm)."""
    g, x = _stem(31)
    r = g.rng
    outs = []
    for group in (2, C):
        w = _f32(r.standard_normal((C, C // group, 3, 3)) / 3)
        outs.append(g.op("Conv", [x, g.const(w, "w")], kernel_shape=[3, 3], pads=[1, 1, 1, 1], group=group))
    w = _f32(r.standard_normal((C, C, 3, 3)) / 8)
    outs.append(g.op("Conv", [x, g.const(w, "w")], kernel_shape=[3, 3], dilations=[2, 2], pads=[2, 2, 2, 2]))
    outs.append(g.op("Conv", [x, g.const(w, "w")], kernel_shape=[3, 3], pads=[0, 1, 1, 0], strides=[2, 2]))
    wt = _f32(r.standard_normal((C, 4, 2, 2)) / 4)
    outs.append(g.op("ConvTranspose", [x, g.const(wt, "wt"), g.const(_f32(r.standard_normal(4) / 10), "bt")],
                     kernel_shape=[2, 2], strides=[2, 2]))
    # Grouped: weight [C, C_out/group, k, k], each group's output channels on axis 1. Channels of unlike
    # ranges (scaled per output channel) show whether each gets its own step.
    for group, cout, k in ((2, 6, 4), (2, 4, 2), (C, C, 4)):  # two / four channels per group; depthwise
        wg = r.standard_normal((C, cout // group, k, k)) * np.linspace(0.05, 0.5, cout).reshape(group, -1, 1, 1)\
            .repeat(C // group, axis=0) / 2
        outs.append(g.op("ConvTranspose", [x, g.const(_f32(wg), "wg"), g.const(_f32(r.standard_normal(cout) / 10),
                                                                               "bg")],
                         kernel_shape=[k, k], strides=[2, 2], pads=[(k - 2) // 2] * 4, group=group))
    flat = g.op("Flatten", [g.op("Relu", [x])], axis=1)
    outs.append(g.gemm(flat, C * H * H, 10))
    seq = g.op("Reshape", [x, g.const(_i64(1, C, H * H), "shape")])
    outs.append(g.op("MatMul", [seq, g.const(_f32(r.standard_normal((H * H, 16)) / 8), "mw")]))
    outs.append(g.op("MatMul", [seq, g.op("Transpose", [seq], perm=[0, 2, 1])]))
    outs.append(g.bn(g.op("Relu", [x]), C))
    outs.append(g.bn(g.op("MaxPool", [x], kernel_shape=[2, 2], strides=[2, 2]), C))
    outs.append(g.bn(seq, C))  # on a 3-D [N, C, L] tensor
    outs.append(g.bn(g.gemm(flat, C * H * H, 16), 16))  # nn.Linear + nn.BatchNorm1d (ArcFace, MLP heads)
    outs.append(g.bn(g.op("Flatten", [g.op("GlobalAveragePool", [x])], axis=1), C))  # [N, C], no layer before
    return _done(g, outs, opset)


def activations(opset: int) -> FloatModel:
    """Unary activations and the Swish / Mish / GELU patterns, each on its own branch."""
    g, x = _stem(32)
    outs = [g.op("Relu", [x]), g.op("LeakyRelu", [x], alpha=0.1),
            g.op("PRelu", [x, g.const(_f32(np.linspace(0.05, 0.3, C).reshape(C, 1, 1)), "slope")]),
            g.op("Sigmoid", [x]), g.op("HardSigmoid", [x], alpha=0.2, beta=0.5), g.op("Tanh", [x]),
            g.op("Elu", [x], alpha=1.0), g.op("Softplus", [x]),
            g.op("Mul", [x, g.op("Sigmoid", [x])]),  # SiLU / Swish
            g.op("Mul", [x, g.op("Tanh", [g.op("Softplus", [x])])]),  # Mish
            g.op("Mul", [g.op("Mul", [x, g.op("Add", [g.op("Erf", [g.op("Div", [x, g.const(_f32(1.4142135))])]),
                                                      g.const(_f32(1.0))])]), g.const(_f32(0.5))]),  # GELU (Erf)
            g.op("Exp", [g.op("Mul", [x, g.const(_f32(0.5))])]), g.op("Abs", [x]), g.op("Neg", [x]),
            g.op("Sqrt", [g.op("Add", [g.op("Abs", [x]), g.const(_f32(0.1))])]),
            g.op("Log", [g.op("Add", [g.op("Abs", [x]), g.const(_f32(1.0))])])]
    outs.append(g.op("Softsign", [x]))
    if opset >= 12:
        outs.append(g.op("Celu", [x], alpha=0.5))
    if opset >= 14:
        outs.append(g.op("HardSwish", [x]))
    if opset >= 18:
        outs.append(g.op("Mish", [x]))
    if opset >= 20:
        outs.append(g.op("Gelu", [x]))
    return _done(g, outs, opset)


def normalization(opset: int) -> FloatModel:
    """Softmax on every axis, LayerNormalization (op and pattern), InstanceNormalization, Reduce*."""
    g, x = _stem(33)
    outs = [g.op("Softmax", [x], axis=a) for a in (1, 2, -1)]
    gamma, beta = g.const(_f32(np.linspace(0.5, 1.5, H)), "ln_g"), g.const(_f32(np.linspace(-0.1, 0.1, H)), "ln_b")
    if opset >= 17:
        outs.append(g.op("LayerNormalization", [x, gamma, beta], axis=-1, epsilon=1e-5))
    mean = _axes(g, "ReduceMean", x, [-1], opset, 18, keepdims=1)
    d = g.op("Sub", [x, mean])
    var = _axes(g, "ReduceMean", g.op("Pow", [d, g.const(_f32(2.0))]), [-1], opset, 18, keepdims=1)
    norm = g.op("Div", [d, g.op("Sqrt", [g.op("Add", [var, g.const(_f32(1e-5))])])])
    outs.append(g.op("Add", [g.op("Mul", [norm, gamma]), beta]))
    outs.append(g.op("InstanceNormalization", [x, g.const(_f32(np.linspace(0.5, 1.5, C)), "in_s"),
                                                g.const(_f32(np.linspace(-0.1, 0.1, C)), "in_b")]))
    outs.append(_axes(g, "ReduceMean", x, [2, 3], opset, 18, keepdims=1))
    outs.append(_axes(g, "ReduceMax", x, [1], opset, 18, keepdims=1))
    outs.append(_axes(g, "ReduceMin", x, [1], opset, 18, keepdims=1))
    outs.append(_axes(g, "ReduceSum", x, [-1], opset, 13, keepdims=0))
    return _done(g, outs, opset)


def pooling(opset: int) -> FloatModel:
    """Global pools, MaxPool / AveragePool with ceil mode, pads, auto_pad (TensorFlow's SAME) and (opset 19)
    dilations, MaxPool with Indices (read by a MaxUnpool; read by nobody), Resize (nearest, linear; scales,
    sizes)."""
    g, x = _stem(34)
    outs = [g.op("GlobalAveragePool", [x]), g.op("GlobalMaxPool", [x]),
            g.op("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
            g.op("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1),
            g.op("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_UPPER"),
            g.op("AveragePool", [x], kernel_shape=[2, 2], strides=[2, 2]),
            g.op("AveragePool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], count_include_pad=1),
            g.op("AveragePool", [x], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1),
            g.op("AveragePool", [x], kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_UPPER"),
            g.op("AveragePool", [x], kernel_shape=[2, 2], auto_pad="SAME_LOWER", count_include_pad=1)]
    if opset >= 19:
        outs += [g.op("AveragePool", [x], kernel_shape=[3, 3], dilations=[2, 2], pads=[2, 2, 2, 2]),
                 g.op("AveragePool", [x], kernel_shape=[3, 3], strides=[2, 2], dilations=[2, 2], pads=[1, 1, 1, 1],
                      ceil_mode=1, count_include_pad=1)]
    g.op("MaxPool", [x], n_out=2, kernel_shape=[2, 2], strides=[2, 2])  # SegNet: its Indices feed a MaxUnpool
    values, indices = g.nodes[-1].output
    outs.append(g.op("MaxUnpool", [g.conv(values, C, C), indices], kernel_shape=[2, 2], strides=[2, 2]))
    g.op("MaxPool", [x], n_out=2, kernel_shape=[3, 3], pads=[1, 1, 1, 1])  # Indices named but read by nobody
    outs.append(g.nodes[-1].output[0])
    roi = g.const(_f32([]), "roi")
    outs.append(g.op("Resize", [x, roi, g.const(_f32([1, 1, 2, 2]), "scales")], mode="nearest"))
    outs.append(g.op("Resize", [x, roi, g.const(_f32([1, 1, 2, 2]), "scales")], mode="linear"))
    outs.append(g.op("Resize", [x, roi, g.const(_f32([]), "no_scales"), g.const(_i64(1, C, 12, 12), "sizes")],
                     mode="linear"))
    return _done(g, outs, opset)


def data_movement(opset: int) -> FloatModel:
    """Concat, Split, Slice, Gather, Reshape, Transpose, Flatten, Squeeze/Unsqueeze, Pad, Clip, Expand, Tile,
    D2S/S2D."""
    g, x = _stem(35)
    outs = [g.op("Concat", [x, g.op("Relu", [x])], axis=1)]
    if opset >= 13:
        g.op("Split", [x, g.const(_i64(3, 5), "split")], n_out=2, axis=1)
    else:
        g.op("Split", [x], n_out=2, axis=1, split=[3, 5])
    outs += list(g.nodes[-1].output)
    outs.append(g.op("Slice", [x, g.const(_i64(1, -1), "st"), g.const(_i64(H, -H - 1), "en"),
                               g.const(_i64(2, 3), "ax"), g.const(_i64(2, -2), "sp")]))
    outs.append(g.op("Gather", [x, g.const(_i64(0, 3, 5), "idx")], axis=1))
    outs.append(g.op("Reshape", [x, g.const(_i64(1, C * 2, H * H // 2), "shape")]))
    outs.append(g.op("Transpose", [x], perm=[0, 2, 3, 1]))
    outs.append(g.op("Flatten", [x], axis=2))
    pooled = g.op("GlobalAveragePool", [x])
    outs.append(_axes(g, "Squeeze", pooled, [2, 3], opset, 13))
    outs.append(_axes(g, "Unsqueeze", x, [1], opset, 13))
    outs.append(g.op("Pad", [x, g.const(_i64(0, 0, 1, 2, 0, 0, 2, 1), "pads")], mode="constant"))
    outs.append(g.op("Clip", [x, g.const(_f32(-1.0)), g.const(_f32(1.0))]))
    outs.append(g.op("Clip", [x, g.const(_f32(0.0))]))
    outs.append(g.op("Expand", [pooled, g.const(_i64(1, C, 4, 4), "eshape")]))
    outs.append(g.op("Tile", [x, g.const(_i64(1, 1, 2, 1), "reps")]))
    outs.append(g.op("DepthToSpace", [x], blocksize=2, mode="DCR"))
    outs.append(g.op("SpaceToDepth", [x], blocksize=2))
    return _done(g, outs, opset)


def broadcasting(opset: int) -> FloatModel:
    """Add/Sub/Mul/Div/Pow with scalar, per-channel, row and full constants and two activations; Min/Max."""
    g, x = _stem(36)
    y = g.op("Relu", [g.conv("data", 3, C)])
    pos = g.op("Add", [g.op("Abs", [x]), g.const(_f32(0.5))])  # a positive base for Div / Pow
    consts = {"scalar": _f32(1.5), "channel": _f32(np.linspace(0.5, 2, C).reshape(1, C, 1, 1)),
              "row": _f32(np.linspace(0.5, 2, H)), "full": _f32(g.rng.uniform(0.5, 2, (1, C, H, H)))}
    outs = []
    for op in ("Add", "Sub", "Mul", "Div"):
        base = pos if op == "Div" else x
        outs += [g.op(op, [base, g.const(v, f"{op}_{k}")]) for k, v in consts.items()]
        outs.append(g.op(op, [x, g.op("Add", [y, g.const(_f32(0.5))]) if op == "Div" else y]))
    outs.append(g.op("Pow", [pos, g.const(_f32(2.0))]))
    outs.append(g.op("Pow", [pos, g.const(_f32(0.5))]))
    outs += [g.op("Min", [x, y]), g.op("Max", [x, y]), g.op("Max", [x, g.const(_f32(0.0))])]
    return _done(g, outs, opset)


def selection(opset: int) -> FloatModel:
    """Where/Equal, Cast, ArgMax, TopK, Einsum."""
    g, x = _stem(37)
    y = g.op("Relu", [x])
    outs = [g.op("Where", [g.op("Greater", [x, g.const(_f32(0.0))]), x, g.op("Mul", [x, g.const(_f32(0.1))])]),
            g.op("Where", [g.op("Equal", [y, g.const(_f32(0.0))]), g.const(_f32(-1.0)), y]),
            g.op("Cast", [g.op("Cast", [x], to=10)], to=1),  # float16 round trip
            g.op("Cast", [g.op("ArgMax", [x], axis=1, keepdims=1)], to=1)]
    g.op("TopK", [g.op("Reshape", [x, g.const(_i64(1, C * H * H), "flat")]), g.const(_i64(5), "k")], n_out=2, axis=-1)
    outs.append(g.nodes[-1].output[0])
    if opset >= 12:
        seq = g.op("Reshape", [x, g.const(_i64(1, C, H * H), "seq")])
        outs.append(g.op("Einsum", [seq, g.const(_f32(g.rng.standard_normal((H * H, 4)) / 8), "ew")],
                         equation="bcs,sk->bck"))
    return _done(g, outs, opset)


GROUPS: dict[str, Callable[[int], FloatModel]] = {
    "conv_family": conv_family,
    "activations": activations,
    "normalization": normalization,
    "pooling": pooling,
    "data_movement": data_movement,
    "broadcasting": broadcasting,
    "selection": selection,
}
