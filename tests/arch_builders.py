"""Architecture blocks built with ``onnx.helper``: the structures real exported models have.

Each block is small (a few kB, inputs of a few hundred pixels) and reproduces a structure
(not the weights) of a model family people convert: MobileNetV3, YOLOX, YOLOv8, ViT,
ResNet, RepVGG, EfficientNet, UNet, FPN/PAN.
"""

from __future__ import annotations

import numpy as np
from builders import FloatModel, _Graph
from onnx import numpy_helper


def _f(v: float) -> np.ndarray:
    return np.float32(v)


def _conv_bn(g: _Graph, x: str, cin: int, cout: int, k: int = 3, stride: int = 1, group: int = 1) -> str:
    """Conv without bias then an unfolded BatchNormalization, as a training export leaves them."""
    w = (g.rng.standard_normal((cout, cin // group, k, k)) / np.sqrt(cin // group * k * k)).astype(np.float32)
    c = g.op("Conv", [x, g.const(w, "w")], kernel_shape=[k, k], pads=[k // 2] * 4, strides=[stride, stride],
             group=group)
    return g.bn(c, cout)


def mobilenetv3_block(h: int = 16, opset: int = 15) -> FloatModel:
    """Expand (HardSwish) -> depthwise (HardSwish) -> SE (HardSigmoid gate, Mul broadcast) -> project + residual.

    The SE gate is [N, C, 1, 1] and multiplies the [N, C, H, W] features.
    """
    g = _Graph(21)
    stem = g.op("HardSwish", [_conv_bn(g, "data", 3, 8, stride=2)])
    e = g.op("HardSwish", [_conv_bn(g, stem, 8, 16, k=1)])
    d = g.op("HardSwish", [_conv_bn(g, e, 16, 16, group=16)])
    s = g.op("GlobalAveragePool", [d])
    s = g.op("Relu", [g.conv(s, 16, 4, k=1)])
    gate = g.op("HardSigmoid", [g.conv(s, 4, 16, k=1)], alpha=1.0 / 6, beta=0.5)
    se = g.op("Mul", [d, gate])
    p = _conv_bn(g, se, 16, 8, k=1)
    y = g.op("Add", [p, stem])
    pooled = g.op("Flatten", [g.op("GlobalAveragePool", [g.op("HardSwish", [y])])], axis=1)
    out = g.gemm(pooled, 8, 10)
    return g.model({"data": [1, 3, h, h]}, [out], opset)


def _yolox_level(g: _Graph, x: str, c: int, stride: int, classes: int) -> str:
    """One scale of a decoupled head: stem, cls branch and reg/obj branch, decoded boxes."""
    silu = lambda t: g.op("Mul", [t, g.op("Sigmoid", [t])])  # noqa: E731
    stem = silu(_conv_bn(g, x, c, c, k=1))
    cls_f = silu(_conv_bn(g, stem, c, c))
    reg_f = silu(_conv_bn(g, stem, c, c))
    cls = g.op("Sigmoid", [g.conv(cls_f, c, classes, k=1)])
    reg = g.conv(reg_f, c, 4, k=1)
    obj = g.op("Sigmoid", [g.conv(reg_f, c, 1, k=1)])
    return g.op("Concat", [reg, obj, cls], axis=1)


def yolox_head(h: int = 32, classes: int = 3, opset: int = 11) -> FloatModel:
    """Backbone with three scales (MaxPool twice on one tensor, SPP style), decoupled heads, decode.

    Decode: boxes' xy = (reg_xy + grid) * stride, wh = exp(reg_wh) * stride (the Exp decode).
    """
    g = _Graph(22)
    silu = lambda t: g.op("Mul", [t, g.op("Sigmoid", [t])])  # noqa: E731
    c = 8
    x = silu(_conv_bn(g, silu(_conv_bn(g, "data", 3, c, stride=2)), c, c, stride=2))
    # SPP: one tensor read by several MaxPools (the passive units that share an input)
    spp = [g.op("MaxPool", [x], kernel_shape=[k, k], pads=[k // 2] * 4, strides=[1, 1]) for k in (3, 5)]
    x = silu(_conv_bn(g, g.op("Concat", [x, *spp], axis=1), 3 * c, c, k=1))
    levels, feats = [], x
    for stride in (8, 16, 32):
        feats = silu(_conv_bn(g, feats, c, c, stride=2))
        out = _yolox_level(g, feats, c, stride, classes)
        n = (h // stride) ** 2
        levels.append((g.op("Reshape", [out, g.const(np.array([1, 5 + classes, n], dtype=np.int64), "r")]), h // stride,
                       stride))
    cat = g.op("Transpose", [g.op("Concat", [t for t, _, _ in levels], axis=2)], perm=[0, 2, 1])
    grids, strides = [], []
    for _, side, stride in levels:
        yy, xx = np.meshgrid(np.arange(side), np.arange(side), indexing="ij")
        grids.append(np.stack([xx, yy], -1).reshape(-1, 2))
        strides.append(np.full((side * side, 1), stride))
    grid = g.const(np.concatenate(grids)[None].astype(np.float32), "grid")
    stride_c = g.const(np.concatenate(strides)[None].astype(np.float32), "stride")
    sizes = [2, 2, 1 + classes]
    if opset < 13:
        g.op("Split", [cat], n_out=3, axis=2, split=sizes)
    else:
        g.op("Split", [cat, g.const(np.array(sizes, dtype=np.int64), "split")], n_out=3, axis=2)
    xy, wh, rest = g.nodes[-1].output
    xy = g.op("Mul", [g.op("Add", [xy, grid]), stride_c])
    wh = g.op("Mul", [g.op("Exp", [wh]), stride_c])
    out = g.op("Concat", [xy, wh, rest], axis=2)
    return g.model({"data": [1, 3, h, h]}, [out], opset)


def _silu(g: _Graph, t: str) -> str:
    return g.op("Mul", [t, g.op("Sigmoid", [t])])


def resnet_bottleneck(h: int = 16, opset: int = 13) -> FloatModel:
    """1x1 reduce -> 3x3 -> 1x1 expand, BN unfolded, projection shortcut with stride, Add, Relu."""
    g = _Graph(23)
    x = g.op("Relu", [_conv_bn(g, "data", 3, 16)])
    y = g.op("Relu", [_conv_bn(g, x, 16, 4, k=1)])
    y = g.op("Relu", [_conv_bn(g, y, 4, 4, stride=2)])
    y = _conv_bn(g, y, 4, 16, k=1)
    short = _conv_bn(g, x, 16, 16, k=1, stride=2)
    out = g.op("Relu", [g.op("Add", [y, short])])
    return g.model({"data": [1, 3, h, h]}, [out], opset)


def repvgg_block(h: int = 16, opset: int = 13) -> FloatModel:
    """Training-time RepVGG: 3x3 conv+BN, 1x1 conv+BN and identity BN summed, then Relu (twice)."""
    g = _Graph(24)
    x = g.op("Relu", [_conv_bn(g, "data", 3, 8)])
    for _ in range(2):
        x = g.op("Relu", [g.op("Add", [g.op("Add", [_conv_bn(g, x, 8, 8), _conv_bn(g, x, 8, 8, k=1)]), g.bn(x, 8)])])
    return g.model({"data": [1, 3, h, h]}, [x], opset)


def mbconv(h: int = 16, opset: int = 13) -> FloatModel:
    """EfficientNet MBConv: expand (SiLU) -> depthwise (SiLU) -> SE (SiLU, Sigmoid gate) -> project + skip."""
    g = _Graph(25)
    x = _silu(g, _conv_bn(g, "data", 3, 8))
    e = _silu(g, _conv_bn(g, x, 8, 32, k=1))
    d = _silu(g, _conv_bn(g, e, 32, 32, group=32))
    s = _silu(g, g.conv(g.op("GlobalAveragePool", [d]), 32, 8, k=1))
    gate = g.op("Sigmoid", [g.conv(s, 8, 32, k=1)])
    y = g.op("Add", [_conv_bn(g, g.op("Mul", [d, gate]), 32, 8, k=1), x])
    return g.model({"data": [1, 3, h, h]}, [y], opset)


def vit_block(h: int = 16, opset: int = 17) -> FloatModel:
    """Patch embedding, then pre-norm attention (LayerNormalization, QKV MatMuls, Softmax) and a GELU MLP."""
    g = _Graph(26)
    dim, heads, p = 16, 2, 4
    n = (h // p) ** 2
    w = (g.rng.standard_normal((dim, 3, p, p)) / np.sqrt(3 * p * p)).astype(np.float32)
    tokens = g.op("Conv", [("data"), g.const(w, "patch")], kernel_shape=[p, p], strides=[p, p])
    x = g.op("Transpose", [g.op("Reshape", [tokens, g.const(np.array([1, dim, n], dtype=np.int64), "r")])],
             perm=[0, 2, 1])

    def ln(t: str) -> str:
        return g.op("LayerNormalization", [t, g.const(np.ones(dim, np.float32), "ln_g"),
                                           g.const(np.zeros(dim, np.float32), "ln_b")], axis=-1, epsilon=1e-6)

    def linear(t: str, k: int, m: int) -> str:
        wl = (g.rng.standard_normal((k, m)) / np.sqrt(k)).astype(np.float32)
        return g.op("Add", [g.op("MatMul", [t, g.const(wl, "lw")]),
                            g.const((0.02 * g.rng.standard_normal(m)).astype(np.float32), "lb")])

    y = ln(x)
    split = [1, n, heads, dim // heads]
    q, k, v = (g.op("Transpose", [g.op("Reshape", [linear(y, dim, dim), g.const(np.array(split, dtype=np.int64),
                                                                                   "hs")])], perm=[0, 2, 1, 3])
               for _ in range(3))
    scores = g.op("Mul", [g.op("MatMul", [q, g.op("Transpose", [k], perm=[0, 1, 3, 2])]),
                          g.const(np.float32(1 / np.sqrt(dim // heads)))])
    att = g.op("MatMul", [g.op("Softmax", [scores], axis=-1), v])
    att = g.op("Reshape", [g.op("Transpose", [att], perm=[0, 2, 1, 3]), g.const(np.array([1, n, dim], np.int64), "m")])
    x = g.op("Add", [x, linear(att, dim, dim)])
    hid = linear(ln(x), dim, 2 * dim)
    erf = g.op("Erf", [g.op("Div", [hid, g.const(np.float32(1.4142135))])])
    gelu = g.op("Mul", [g.op("Mul", [hid, g.op("Add", [erf, g.const(np.float32(1.0))])]), g.const(np.float32(0.5))])
    x = g.op("Add", [x, linear(gelu, 2 * dim, dim)])
    return g.model({"data": [1, 3, h, h]}, [x], opset)


def unet_up(h: int = 16, opset: int = 13) -> FloatModel:
    """Encoder (two strided convs), decoder: ConvTranspose up, Concat skip, conv; Resize up, Concat skip, conv."""
    g = _Graph(27)
    e1 = g.op("Relu", [_conv_bn(g, "data", 3, 8)])
    e2 = g.op("Relu", [_conv_bn(g, e1, 8, 16, stride=2)])
    e3 = g.op("Relu", [_conv_bn(g, e2, 16, 16, stride=2)])
    wt = (g.rng.standard_normal((16, 16, 2, 2)) / 8).astype(np.float32)
    up = g.op("ConvTranspose", [e3, g.const(wt, "wt")], kernel_shape=[2, 2], strides=[2, 2])
    d2 = g.op("Relu", [_conv_bn(g, g.op("Concat", [up, e2], axis=1), 32, 8)])
    roi, scales = g.const(np.array([], np.float32), "roi"), g.const(np.array([1, 1, 2, 2], np.float32), "s")
    up = g.op("Resize", [d2, roi, scales], mode="nearest")
    d1 = g.op("Relu", [_conv_bn(g, g.op("Concat", [up, e1], axis=1), 16, 8)])
    out = g.op("Sigmoid", [g.conv(d1, 8, 1, k=1)])
    return g.model({"data": [1, 3, h, h]}, [out], opset)


def fpn_pan(h: int = 32, opset: int = 13) -> FloatModel:
    """Three backbone scales, top-down (Resize nearest + Add / Concat) and bottom-up (strided conv + Concat)."""
    g = _Graph(28)
    c = 8
    c3 = _silu(g, _conv_bn(g, _silu(g, _conv_bn(g, "data", 3, c, stride=2)), c, c, stride=2))
    c4 = _silu(g, _conv_bn(g, c3, c, c, stride=2))
    c5 = _silu(g, _conv_bn(g, c4, c, c, stride=2))
    roi, scale = g.const(np.array([], np.float32), "roi"), g.const(np.array([1, 1, 2, 2], np.float32), "s")
    p5 = _conv_bn(g, c5, c, c, k=1)
    p4 = _silu(g, _conv_bn(g, g.op("Concat", [g.op("Resize", [p5, roi, scale], mode="nearest"), c4], axis=1), 2 * c, c))
    p3 = g.op("Add", [g.op("Resize", [p4, roi, scale], mode="nearest"), _conv_bn(g, c3, c, c, k=1)])
    n4 = _silu(g, _conv_bn(g, g.op("Concat", [_conv_bn(g, p3, c, c, stride=2), p4], axis=1), 2 * c, c))
    n5 = _silu(g, _conv_bn(g, g.op("Concat", [_conv_bn(g, n4, c, c, stride=2), p5], axis=1), 2 * c, c))
    return g.model({"data": [1, 3, h, h]}, [p3, n4, n5], opset)


def yolov8_head(h: int = 32, classes: int = 4, opset: int = 13, box_scale: float = 1.0,
                score_bias: float = 0.0) -> FloatModel:
    """Per scale: box branch (4 x 16 DFL bins) and cls branch; Concat of three scales, Split, DFL
    (Reshape, Transpose, Softmax, 1x1 Conv with weights 0..15), Sigmoid class scores.

    ``box_scale`` multiplies the distances before they join the scores, as an export that decodes
    boxes to pixels does (x stride): the output then holds values in the hundreds beside 0..1.
    ``score_bias`` is added to the class logits' bias (a trained detector's scores are mostly small:
    YOLOv8 starts its class biases near log(5 / classes / anchors))."""
    g = _Graph(29)
    c, bins = 8, 16
    x = _silu(g, _conv_bn(g, _silu(g, _conv_bn(g, "data", 3, c, stride=2)), c, c, stride=2))
    levels = []
    for _ in range(3):
        x = _silu(g, _conv_bn(g, x, c, c, stride=2))
        box = g.conv(_silu(g, _conv_bn(g, x, c, c)), c, 4 * bins, k=1)
        cls = g.conv(_silu(g, _conv_bn(g, x, c, c)), c, classes, k=1)
        if score_bias:
            bias = g.inits[-1]
            bias.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(bias) + np.float32(score_bias), bias.name))
        cat = g.op("Concat", [box, cls], axis=1)
        levels.append(g.op("Reshape", [cat, g.const(np.array([1, 4 * bins + classes, -1], np.int64), "r")]))
    allp = g.op("Concat", levels, axis=2)
    g.op("Split", [allp, g.const(np.array([4 * bins, classes], np.int64), "split")], n_out=2, axis=1)
    box, cls = g.nodes[-1].output
    n = sum((h // s) ** 2 for s in (8, 16, 32))
    bins_shape = g.const(np.array([1, 4, bins, n], np.int64), "d")
    dist = g.op("Softmax", [g.op("Transpose", [g.op("Reshape", [box, bins_shape])], perm=[0, 2, 1, 3])], axis=1)
    proj = g.const(np.arange(bins, dtype=np.float32).reshape(1, bins, 1, 1), "dfl")
    out_shape = g.const(np.array([1, 4, n], np.int64), "o")
    ltrb = g.op("Reshape", [g.op("Conv", [dist, proj], kernel_shape=[1, 1]), out_shape])
    if box_scale != 1.0:
        ltrb = g.op("Mul", [ltrb, g.const(np.float32(box_scale), "stride")])
    out = g.op("Concat", [ltrb, g.op("Sigmoid", [cls])], axis=1)
    return g.model({"data": [1, 3, h, h]}, [out], opset)


# ---------------------------------------------------------------- whole networks (benchmarks/perf_calibration.py)
# Ultralytics "n" scale (width 0.25, depth 0.33), conv+BN folded into a biased conv, SiLU activations.
# Random weights: the structure, shapes and op counts are the real ones, which is all a cost model reads.


def _cbs(g: _Graph, x: str, cin: int, cout: int, k: int = 3, stride: int = 1) -> str:
    return _silu(g, g.op("Conv", [x, g.const((g.rng.standard_normal((cout, cin, k, k)) / np.sqrt(cin * k * k))
                                             .astype(np.float32), "w"),
                                  g.const((0.1 * g.rng.standard_normal(cout)).astype(np.float32), "b")],
                         kernel_shape=[k, k], pads=[(k - 1) // 2] * 4, strides=[stride, stride]))


def _bottleneck(g: _Graph, x: str, c: int, shortcut: bool, k1: int = 3) -> str:
    y = _cbs(g, _cbs(g, x, c, c, k=k1), c, c)
    return g.op("Add", [x, y]) if shortcut else y


def _c2f(g: _Graph, x: str, cin: int, cout: int, n: int, shortcut: bool = True) -> str:
    c = cout // 2
    y = _cbs(g, x, cin, 2 * c, k=1)
    g.op("Split", [y, g.const(np.array([c, c], np.int64), "split")], n_out=2, axis=1)
    parts = list(g.nodes[-1].output)
    for _ in range(n):
        parts.append(_bottleneck(g, parts[-1], c, shortcut))
    return _cbs(g, g.op("Concat", parts, axis=1), (2 + n) * c, cout, k=1)


def _c3(g: _Graph, x: str, cin: int, cout: int, n: int, shortcut: bool = True) -> str:
    c = cout // 2
    y = _cbs(g, x, cin, c, k=1)
    for _ in range(n):
        y = _bottleneck(g, y, c, shortcut, k1=1)
    return _cbs(g, g.op("Concat", [y, _cbs(g, x, cin, c, k=1)], axis=1), 2 * c, cout, k=1)


def _sppf(g: _Graph, x: str, c: int) -> str:
    parts = [_cbs(g, x, c, c // 2, k=1)]
    for _ in range(3):
        parts.append(g.op("MaxPool", [parts[-1]], kernel_shape=[5, 5], pads=[2] * 4, strides=[1, 1]))
    return _cbs(g, g.op("Concat", parts, axis=1), 2 * c, c, k=1)


def _up(g: _Graph, x: str) -> str:
    return g.op("Resize", [x, "", g.const(np.array([1, 1, 2, 2], np.float32), "up")], mode="nearest")


def _detect_heads(g: _Graph, levels: list[tuple[str, int]], classes: int = 80) -> list[str]:
    """The RDK model zoo's export: per level a box branch (4 x 16 DFL bins) and a class branch, DFL on the CPU."""
    outs = []
    first = levels[0][1]  # both branches' widths follow the first level's channels
    for x, c in levels:
        for width in (classes, 64):
            hidden = max(first, min(classes, 100)) if width == classes else max(16, first // 4, 64)
            y = _cbs(g, _cbs(g, x, c, hidden), hidden, hidden)
            outs.append(g.conv(y, hidden, width, k=1))
    return outs


def yolov8n(h: int = 640, opset: int = 13) -> FloatModel:
    """YOLOv8n detect (63 convolutions): C2f backbone, SPPF, PAN neck, decoupled head without DFL."""
    g = _Graph(40)
    x = _c2f(g, _cbs(g, _cbs(g, "data", 3, 16, stride=2), 16, 32, stride=2), 32, 32, 1)
    p3 = _c2f(g, _cbs(g, x, 32, 64, stride=2), 64, 64, 2)
    p4 = _c2f(g, _cbs(g, p3, 64, 128, stride=2), 128, 128, 2)
    p5 = _sppf(g, _c2f(g, _cbs(g, p4, 128, 256, stride=2), 256, 256, 1), 256)
    n4 = _c2f(g, g.op("Concat", [_up(g, p5), p4], axis=1), 384, 128, 1, False)
    n3 = _c2f(g, g.op("Concat", [_up(g, n4), p3], axis=1), 192, 64, 1, False)
    m4 = _c2f(g, g.op("Concat", [_cbs(g, n3, 64, 64, stride=2), n4], axis=1), 192, 128, 1, False)
    m5 = _c2f(g, g.op("Concat", [_cbs(g, m4, 128, 128, stride=2), p5], axis=1), 384, 256, 1, False)
    return g.model({"data": [1, 3, h, h]}, _detect_heads(g, [(n3, 64), (m4, 128), (m5, 256)]), opset)


def _yolov5_pan(g: _Graph) -> list[tuple[str, int]]:
    """YOLOv5 v6+ backbone (6x6 stem, C3, SPPF) and PAN neck at the n scale: the three levels and their widths."""
    x = _c3(g, _cbs(g, _cbs(g, "data", 3, 16, k=6, stride=2), 16, 32, stride=2), 32, 32, 1)
    p3 = _c3(g, _cbs(g, x, 32, 64, stride=2), 64, 64, 2)
    p4 = _c3(g, _cbs(g, p3, 64, 128, stride=2), 128, 128, 3)
    p5 = _sppf(g, _c3(g, _cbs(g, p4, 128, 256, stride=2), 256, 256, 1), 256)
    r5 = _cbs(g, p5, 256, 128, k=1)
    r4 = _cbs(g, _c3(g, g.op("Concat", [_up(g, r5), p4], axis=1), 256, 128, 1, False), 128, 64, k=1)
    n3 = _c3(g, g.op("Concat", [_up(g, r4), p3], axis=1), 128, 64, 1, False)
    m4 = _c3(g, g.op("Concat", [_cbs(g, n3, 64, 64, stride=2), r4], axis=1), 128, 128, 1, False)
    m5 = _c3(g, g.op("Concat", [_cbs(g, m4, 128, 128, stride=2), r5], axis=1), 256, 256, 1, False)
    return [(n3, 64), (m4, 128), (m5, 256)]


def yolov5nu(h: int = 640, opset: int = 13) -> FloatModel:
    """YOLOv5nu detect: the YOLOv5 backbone and neck with the YOLOv8 head without DFL."""
    g = _Graph(41)
    return g.model({"data": [1, 3, h, h]}, _detect_heads(g, _yolov5_pan(g)), opset)


def yolov5n(h: int = 640, opset: int = 13) -> FloatModel:
    """YOLOv5n tag v7.0 detect: the YOLOv5 backbone and neck, one 1x1 conv to 3 anchors x 85 per level, NHWC."""
    g = _Graph(43)
    outs = [g.op("Transpose", [g.conv(x, c, 255, k=1)], perm=[0, 2, 3, 1]) for x, c in _yolov5_pan(g)]
    return g.model({"data": [1, 3, h, h]}, outs, opset)


def yolov8n_cls(h: int = 224, opset: int = 13) -> FloatModel:
    """YOLOv8n-cls: the C2f backbone, then 1x1 conv to 1280, global average pool, Gemm to 1000, Softmax."""
    g = _Graph(42)
    x = _c2f(g, _cbs(g, _cbs(g, "data", 3, 16, stride=2), 16, 32, stride=2), 32, 32, 1)
    x = _c2f(g, _cbs(g, x, 32, 64, stride=2), 64, 64, 2)
    x = _c2f(g, _cbs(g, x, 64, 128, stride=2), 128, 128, 2)
    x = _c2f(g, _cbs(g, x, 128, 256, stride=2), 256, 256, 1)
    x = g.op("Flatten", [g.op("GlobalAveragePool", [_cbs(g, x, 256, 1280, k=1)])])
    return g.model({"data": [1, 3, h, h]}, [g.op("Softmax", [g.gemm(x, 1280, 1000)], axis=1)], opset)


def ort_quantized_crnn(h: int = 16, w: int = 32, opset: int = 13) -> FloatModel:
    """A CRNN as onnxruntime's ``quantize_dynamic`` leaves it: float convs, then DynamicQuantizeLSTM and
    MatMulInteger (com.microsoft ops that onnx shape inference does not know) up to the output.

    Its output keeps no inferable shape: the optimized model once failed the ONNX checker
    (ddddocr's common_old.onnx). The convs stay float, so something goes to the BPU.
    """
    import tempfile
    from pathlib import Path

    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    g = _Graph(7)
    x = g.op("Relu", [_conv_bn(g, "data", 3, 8, stride=2)])
    x = g.op("Relu", [_conv_bn(g, x, 8, 8)])  # [1, 8, h/2, w/2]
    steps, features, hidden = w // 2, 8 * h // 2, 16
    seq = g.op("Transpose", [g.op("Reshape", [x, g.const(np.array([1, features, steps], np.int64), "shape")])],
               perm=[2, 0, 1])  # [T, N, C]
    scale = 1.0 / np.sqrt(features)
    weights = [g.const((g.rng.standard_normal(s) * scale).astype(np.float32), "lstm")
               for s in ((1, 4 * hidden, features), (1, 4 * hidden, hidden), (1, 8 * hidden))]
    y = g.op("LSTM", [seq, *weights], hidden_size=hidden)  # [T, 1, N, hidden]
    y = g.op("Squeeze", [y, g.const(np.array([1], np.int64), "axes")])
    logits = g.op("MatMul", [y, g.const((g.rng.standard_normal((hidden, 12)) / 4).astype(np.float32), "fc")])
    float_model = g.model({"data": [1, 3, h, w]}, [logits], opset)
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "float.onnx", Path(tmp) / "dynamic.onnx"
        onnx.save(float_model.model, src)
        quantize_dynamic(str(src), str(dst), op_types_to_quantize=["LSTM", "MatMul"], weight_type=QuantType.QInt8)
        model = onnx.load(dst)
    return FloatModel(model, float_model.inputs)


def log_softmax_head(axis: int = -1, h: int = 32, w: int = 64, opset: int = 13) -> FloatModel:
    """A CRNN / CTC recognition head ending in LogSoftmax over 40 classes: convs down to a row of T
    columns, then per column a linear layer, as [1, T, classes] (``axis`` -1) or as a 1x1 conv giving
    [1, classes, T] (``axis`` 1). The logits are a second output."""
    g = _Graph(31)
    x = g.op("Relu", [_conv_bn(g, "data", 3, 16, stride=2)])
    x = g.op("Relu", [_conv_bn(g, x, 16, 32, stride=2)])
    x = g.op("MaxPool", [x], kernel_shape=[h // 4, 1], strides=[h // 4, 1])  # [1, 32, 1, w / 4]
    classes = 40
    wc = (g.rng.standard_normal((classes, 32, 1, 1)) * 0.6).astype(np.float32)
    if axis == 1:
        logits = g.op("Squeeze", [g.op("Conv", [x, g.const(wc, "head")], kernel_shape=[1, 1]),
                                  g.const(np.array([2], np.int64), "axes")])  # [1, classes, T]
    else:
        seq = g.op("Transpose", [g.op("Squeeze", [x, g.const(np.array([2], np.int64), "axes")])], perm=[0, 2, 1])
        logits = g.op("MatMul", [seq, g.const(wc[:, :, 0, 0].T.copy(), "head")])  # [1, T, classes]
    return g.model({"data": [1, 3, h, w]}, [g.op("LogSoftmax", [logits], axis=axis), logits], opset)


def if_branch_head(h: int = 16, w: int = 16, opset: int = 13) -> FloatModel:
    """An ``If`` whose branches read a tensor of the main graph that no main-graph node reads.

    Silero VAD's exports choose their decoder by an ``If`` on the sample rate, and the branch
    reads the encoder's output from the outer scope. The parse stage once dropped that
    encoder as dead (it looked only at node inputs), and the model failed its dry run.
    """
    from onnx import TensorProto, helper

    g = _Graph(8)
    x = g.op("Relu", [_conv_bn(g, "data", 3, 8)])
    features = g.op("Relu", [_conv_bn(g, x, 8, 8)])  # read only inside the branches
    width = g.op("Gather", [g.op("Shape", ["data"]), g.const(np.array(3, np.int64), "axis")], axis=0)
    cond = g.op("Equal", [width, g.const(np.array(w, np.int64), "width")])

    def branch(op: str) -> object:
        out = f"{op.lower()}_branch_out"
        return helper.make_graph([helper.make_node(op, [features], [out], name=f"{op}_in_branch")], f"{op}_branch",
                                 [], [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)])

    y = g.op("If", [cond], then_branch=branch("Sigmoid"), else_branch=branch("Tanh"))
    y = g.op("Relu", [_conv_bn(g, y, 8, 4)])
    return g.model({"data": [1, 3, h, w]}, [y], opset)


def stacked_state(opset: int = 13) -> FloatModel:
    """A recurrent model's state input whose first dimension is not a batch: [2, 1, 16] (two layers).

    Silero VAD takes its LSTM state as 2x1x128. hb_verifier once fed the quantized model
    rows 0:1 of every input as "batch item 0" and stopped on the shape.
    """
    g = _Graph(9)
    w = (g.rng.standard_normal((16, 16)) / 4).astype(np.float32)
    h = g.op("Tanh", [g.op("MatMul", ["state", g.const(w, "w")])])  # [2, 1, 16]
    out = g.op("Sigmoid", [g.op("ReduceMean", [h], axes=[0], keepdims=1)])
    return g.model({"state": [2, 1, 16]}, [out], opset, featuremap={"state"})


NETWORKS = {"yolov8n": yolov8n, "yolov5nu": yolov5nu, "yolov5n": yolov5n, "yolov8n_cls": yolov8n_cls}


def spatial_reductions(h: int = 32, opset: int = 18) -> FloatModel:
    """PyTorch's ``x.mean((2, 3), keepdim=True)`` squeeze-and-excitation and CBAM's max-and-mean
    channel gate, then a ``x.mean((2, 3))`` head: ReduceMean / ReduceMax over the spatial axes
    (axes an input from opset 18) instead of global pools."""
    g = _Graph(29)
    axes = g.const(np.array([2, 3], dtype=np.int64), "axes") if opset >= 18 else None

    def reduce(op: str, x: str, keepdims: int) -> str:
        if axes is not None:
            return g.op(op, [x, axes], keepdims=keepdims)
        return g.op(op, [x], axes=[-2, -1], keepdims=keepdims)

    x = g.op("Relu", [_conv_bn(g, "data", 3, 16, stride=2)])
    s = g.op("Relu", [g.conv(reduce("ReduceMean", x, 1), 16, 4, k=1)])
    x = g.op("Mul", [x, g.op("Sigmoid", [g.conv(s, 4, 16, k=1)])])
    both = g.op("Add", [reduce("ReduceMean", x, 1), reduce("ReduceMax", x, 1)])
    x = g.op("Mul", [x, g.op("Sigmoid", [g.conv(both, 16, 16, k=1)])])
    return g.model({"data": [1, 3, h, h]}, [g.gemm(reduce("ReduceMean", x, 0), 16, 10)], opset)


def channel_and_token_means(h: int = 32, opset: int = 13) -> FloatModel:
    """CBAM's spatial gate (a mean over the channels, Sigmoid, times the features) and a transformer
    head's mean over the tokens of [N, tokens, C]: ReduceMean over other axes than H and W."""
    g = _Graph(31)
    x = g.op("Relu", [_conv_bn(g, "data", 3, 16, stride=2)])
    if opset >= 18:
        channel_mean = g.op("ReduceMean", [x, g.const(np.array([1], dtype=np.int64), "axes")], keepdims=1)
    else:
        channel_mean = g.op("ReduceMean", [x], axes=[1], keepdims=1)
    x = g.op("Mul", [x, g.op("Sigmoid", [channel_mean])])
    side = h // 2
    tokens = g.op("Transpose", [g.op("Reshape", [x, g.const(np.array([1, 16, side * side], np.int64), "shape")])],
                  perm=[0, 2, 1])
    if opset >= 18:
        pooled = g.op("ReduceMean", [tokens, g.const(np.array([1], dtype=np.int64), "axes")], keepdims=0)
    else:
        pooled = g.op("ReduceMean", [tokens], axes=[1], keepdims=0)
    return g.model({"data": [1, 3, h, h]}, [g.gemm(pooled, 16, 10)], opset)


def attention_sums(h: int = 16, opset: int = 13) -> FloatModel:
    """Sums written as ReduceSum: attention pooling (a Softmax over the pixels, times the features,
    summed over H and W, as RivaGAN's watermark encoder and decoder do) and a sum over the channels
    gating the features (a flax / jax2tf LayerNorm sums the same way)."""
    g = _Graph(37)

    def reduce_sum(x: str, axes: list[int], keepdims: int) -> str:
        if opset >= 13:
            return g.op("ReduceSum", [x, g.const(np.array(axes, dtype=np.int64), "axes")], keepdims=keepdims)
        return g.op("ReduceSum", [x], axes=axes, keepdims=keepdims)

    x = g.op("Relu", [_conv_bn(g, "data", 3, 16, stride=2)])
    side = h // 2
    flat = g.op("Reshape", [g.conv(x, 16, 1, k=1), g.const(np.array([1, 1, side * side], np.int64), "flat")])
    weights = g.op("Reshape", [g.op("Softmax", [flat], axis=2), g.const(np.array([1, 1, side, side], np.int64),
                                                                         "square")])
    gate = g.op("Sigmoid", [g.op("Mul", [reduce_sum(x, [1], 1), g.const(_f(1.0 / 16))])])
    pooled = reduce_sum(g.op("Mul", [g.op("Mul", [x, weights]), gate]), [2, 3], 0)
    return g.model({"data": [1, 3, h, h]}, [g.gemm(pooled, 16, 10)], opset)


def frame_convs(h: int = 16, opset: int = 13) -> FloatModel:
    """Conv3d over one video frame [N, C, 1, H, W] with a BatchNorm3d after each Tanh (RivaGAN's
    watermark networks, PyTorch's pre-activation 3-D blocks): a BatchNormalization of a 5-D tensor
    no conv precedes."""
    g = _Graph(41)

    def conv3d(x: str, cin: int, cout: int) -> str:
        w = g.const((g.rng.standard_normal((cout, cin, 1, 3, 3)) / np.sqrt(cin * 9)).astype(np.float32), "w3d")
        return g.op("Conv", [x, w, g.const((g.rng.standard_normal(cout) * 0.1).astype(np.float32), "b3d")],
                    kernel_shape=[1, 3, 3], pads=[0, 1, 1, 0, 1, 1])

    def bn(x: str, c: int) -> str:
        params = [g.const((g.rng.uniform(0.5, 2.0, c)).astype(np.float32), "gamma"),
                  g.const((g.rng.standard_normal(c) * 0.2).astype(np.float32), "beta"),
                  g.const((g.rng.standard_normal(c) * 0.1).astype(np.float32), "mean"),
                  g.const((g.rng.uniform(0.2, 1.0, c)).astype(np.float32), "var")]
        return g.op("BatchNormalization", [x, *params], epsilon=1e-5)

    x = g.op("Unsqueeze", [g.op("Relu", ["data"]), g.const(np.array([2], np.int64), "depth")]) if opset >= 13 \
        else g.op("Unsqueeze", [g.op("Relu", ["data"])], axes=[2])
    x = bn(g.op("Tanh", [conv3d(x, 3, 8)]), 8)
    x = bn(g.op("Tanh", [conv3d(x, 8, 8)]), 8)
    return g.model({"data": [1, 3, h, h]}, [conv3d(x, 8, 4)], opset)


def conv1d_pooling_head(h: int = 16, opset: int = 13) -> FloatModel:
    """Conv1d layers pooled by AdaptiveMaxPool1d(1) and AdaptiveAvgPool1d(1) (text and audio CNNs,
    magika's byte classifier): GlobalMaxPool and GlobalAveragePool of a 3-D [N, C, L] tensor."""
    g = _Graph(43)
    x = g.op("Relu", [_conv_bn(g, "data", 3, 16, stride=2)])
    seq = g.op("Reshape", [x, g.const(np.array([1, 16, (h // 2) ** 2], np.int64), "seq")])
    w = g.const((g.rng.standard_normal((16, 16, 3)) / np.sqrt(48)).astype(np.float32), "w1d")
    seq = g.op("Relu", [g.op("Conv", [seq, w, g.const(np.zeros(16, np.float32), "b1d")], kernel_shape=[3],
                             pads=[1, 1])])
    pooled = g.op("Add", [g.op("GlobalMaxPool", [seq]), g.op("GlobalAveragePool", [seq])])
    return g.model({"data": [1, 3, h, h]}, [g.gemm(g.op("Flatten", [pooled], axis=1), 16, 10)], opset)


def expanded_gates(h: int = 16, opset: int = 13) -> FloatModel:
    """Gates broadcast with ``expand`` / ``expand_as`` before they multiply the features (RivaGAN's
    watermark bits spread over the frame): an Expand of a pooled [N, C, 1, 1] gate, and of a [C, 1, 1]
    one that the Expand also gives the batch axis."""
    g = _Graph(47)
    x = g.op("Relu", [_conv_bn(g, "data", 3, 16, stride=2)])
    side = h // 2
    full = g.const(np.array([1, 16, side, side], np.int64), "full")
    gate = g.op("Sigmoid", [g.op("GlobalAveragePool", [x])])
    x = g.op("Mul", [x, g.op("Expand", [gate, full])])
    code = g.op("Reshape", [g.gemm(g.op("Flatten", [g.op("GlobalMaxPool", [x])], axis=1), 16, 16),
                            g.const(np.array([16, 1, 1], np.int64), "code")])
    x = g.op("Add", [x, g.op("Expand", [g.op("Tanh", [code]), full])])
    return g.model({"data": [1, 3, h, h]}, [g.conv(x, 16, 4, k=1)], opset)


def padded_convs(h: int = 32, opset: int = 13) -> FloatModel:
    """Pads written out as ops: TensorFlow's SAME padding of a stride-2 conv (zeros at the end only,
    then a VALID conv) and PyTorch's ReflectionPad2d before a conv (style transfer, super-resolution)."""
    g = _Graph(33)

    def pad(x: str, pads: list[int], mode: str) -> str:
        if opset >= 11:
            return g.op("Pad", [x, g.const(np.array(pads, np.int64), "pads")], mode=mode)
        return g.op("Pad", [x], pads=pads, mode=mode)

    w = (g.rng.standard_normal((8, 3, 3, 3)) / np.sqrt(27)).astype(np.float32)
    x = g.op("Relu", [g.op("Conv", [pad("data", [0, 0, 0, 0, 0, 0, 1, 1], "constant"), g.const(w, "w")],
                           kernel_shape=[3, 3], strides=[2, 2])])
    w2 = (g.rng.standard_normal((8, 8, 3, 3)) / np.sqrt(72)).astype(np.float32)
    x = g.op("Relu", [g.op("Conv", [pad(x, [0, 0, 1, 1, 0, 0, 1, 1], "reflect"), g.const(w2, "w")],
                           kernel_shape=[3, 3])])
    return g.model({"data": [1, 3, h, h]}, [g.conv(x, 8, 4)], opset)


def bilinear_decoder(h: int = 32, opset: int = 13) -> FloatModel:
    """A segmentation decoder: features upsampled 2x and 4x by bilinear Resize (half-pixel, as
    PyTorch's ``interpolate``), and an image-pooling branch (ASPP) resized from one pixel back to
    the feature map, joined by Concat."""
    g = _Graph(35)
    f = g.op("Relu", [_conv_bn(g, "data", 3, 8, stride=4)])  # h/4
    side = h // 4
    up2 = g.op("Resize", [f, "", g.const(np.array([1, 1, 2, 2], np.float32), "scales")], mode="linear",
               coordinate_transformation_mode="pytorch_half_pixel")
    up4 = g.op("Resize", [f, "", "", g.const(np.array([1, 8, 4 * side, 4 * side], np.int64), "sizes")],
               mode="linear", coordinate_transformation_mode="half_pixel")
    pooled = g.op("Relu", [g.conv(g.op("GlobalAveragePool", [f]), 8, 8, k=1)])
    back = g.op("Resize", [pooled, "", "", g.const(np.array([1, 8, side, side], np.int64), "sizes")], mode="linear")
    joined = g.op("Concat", [f, back], axis=1)
    return g.model({"data": [1, 3, h, h]}, [g.conv(up2, 8, 4), g.conv(up4, 8, 4), g.conv(joined, 16, 4)], opset)


def layer_norms(h: int = 16, opset: int = 13) -> FloatModel:
    """Tokens through the ways exporters write a layer normalization: LayerNormalization (opset 17 on),
    the spelled-out ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div with scale and bias, the same with
    d * d and a Reciprocal and no affine, Paddle's, which transposes x - mean before the variance,
    ConvNeXt's over the channels of an NCHW map (scale first in its Mul), and InstanceNormalization. A
    residual stream with one large channel feeds them, as in transformers."""
    g = _Graph(27)
    dim, p = 16, 4
    n = (h // p) ** 2
    w = (g.rng.standard_normal((dim, 3, p, p)) / np.sqrt(3 * p * p)).astype(np.float32)
    w[3] *= 8.0  # an outlier channel: the normalization's input spans much more than most values
    stem = g.op("Conv", ["data", g.const(w, "patch")], kernel_shape=[p, p], strides=[p, p])
    # ConvNeXt's LayerNorm2d: over the channels of the NCHW map, a per-channel scale and bias [C, 1, 1]
    if opset >= 18:
        u = g.op("ReduceMean", [stem, g.const(np.array([1], dtype=np.int64), "axes_c")], keepdims=1)
    else:
        u = g.op("ReduceMean", [stem], axes=[1], keepdims=1)
    dc = g.op("Sub", [stem, u])
    if opset >= 18:
        vc = g.op("ReduceMean", [g.op("Pow", [dc, g.const(np.float32(2.0), "two")]),
                                 g.const(np.array([1], dtype=np.int64), "axes_c")], keepdims=1)
    else:
        vc = g.op("ReduceMean", [g.op("Pow", [dc, g.const(np.float32(2.0), "two")])], axes=[1], keepdims=1)
    stem = g.op("Div", [dc, g.op("Sqrt", [g.op("Add", [vc, g.const(np.float32(1e-6), "eps")])])])
    stem = g.op("Add", [g.op("Mul", [g.const((1 + 0.1 * g.rng.standard_normal((dim, 1, 1))).astype(np.float32)),
                                     stem]), g.const((0.1 * g.rng.standard_normal((dim, 1, 1))).astype(np.float32))])
    stem = g.op("InstanceNormalization", [stem, g.const((1 + 0.1 * g.rng.standard_normal(dim)).astype(np.float32)),
                                          g.const((0.1 * g.rng.standard_normal(dim)).astype(np.float32))])
    tokens = g.op("Reshape", [stem, g.const(np.array([1, dim, n], dtype=np.int64), "r")])

    def mean(t: str) -> str:
        if opset >= 18:
            return g.op("ReduceMean", [t, g.const(np.array([-1], dtype=np.int64), "axes")], keepdims=1)
        return g.op("ReduceMean", [t], axes=[-1], keepdims=1)

    def spelled(t: str, reciprocal: bool = False, affine: bool = True) -> str:
        d = g.op("Sub", [t, mean(t)])
        sq = g.op("Mul", [d, d]) if reciprocal else g.op("Pow", [d, g.const(np.float32(2.0), "two")])
        root = g.op("Sqrt", [g.op("Add", [mean(sq), g.const(np.float32(1e-5), "eps")])])
        y = g.op("Mul", [d, g.op("Reciprocal", [root])]) if reciprocal else g.op("Div", [d, root])
        if not affine:
            return y
        gamma = (1 + 0.1 * g.rng.standard_normal(dim)).astype(np.float32)
        return g.op("Add", [g.op("Mul", [y, g.const(gamma, "gamma")]),
                            g.const((0.1 * g.rng.standard_normal(dim)).astype(np.float32), "beta")])

    def linear(t: str) -> str:
        wl = (g.rng.standard_normal((dim, dim)) / np.sqrt(dim)).astype(np.float32)
        return g.op("MatMul", [t, g.const(wl, "lw")])

    # Paddle: the mean over the channel axis of [1, C, N], then the transpose to [1, N, C]
    if opset >= 18:
        m = g.op("ReduceMean", [tokens, g.const(np.array([1], dtype=np.int64), "axes1")], keepdims=1)
    else:
        m = g.op("ReduceMean", [tokens], axes=[1], keepdims=1)
    d = g.op("Transpose", [g.op("Sub", [tokens, m])], perm=[0, 2, 1])
    var = mean(g.op("Pow", [d, g.const(np.float32(2.0), "two")]))
    x = g.op("Div", [d, g.op("Sqrt", [g.op("Add", [var, g.const(np.float32(1e-6), "eps")])])])
    x = g.op("Add", [x, linear(spelled(x))])
    x = g.op("Add", [x, linear(spelled(x, reciprocal=True, affine=False))])
    if opset >= 17:
        x = g.op("LayerNormalization", [x, g.const(np.full(dim, 0.5, np.float32), "ln_g"),
                                        g.const(np.zeros(dim, np.float32), "ln_b")], axis=-1, epsilon=1e-6)
    return g.model({"data": [1, 3, h, h]}, [linear(x)], opset)


def wide_norms(h: int = 40, opset: int = 17) -> FloatModel:
    """Normalizations over more values than the plain integer form of the layer norm kernel holds (1290):
    PyTorch's GroupNorm (32 groups over 256 channels at 20 x 20, 3200 values each), exported as Reshape +
    InstanceNormalization + Reshape + per-channel Mul and Add; a LayerNormalization over 1536 channels and a
    spelled-out one over 4096, as wide transformers (Swin's last stage, big ViTs) have."""
    g = _Graph(29)
    x = g.op("Relu", [g.conv("data", 3, 256, stride=2)])
    side = h // 2
    grouped = g.op("Reshape", [x, g.const(np.array([1, 32, -1], dtype=np.int64), "gn_r")])
    grouped = g.op("InstanceNormalization", [grouped, g.const(np.ones(32, np.float32), "gn_one"),
                                             g.const(np.zeros(32, np.float32), "gn_zero")], epsilon=1e-5)
    x = g.op("Reshape", [grouped, g.const(np.array([1, 256, side, side], dtype=np.int64), "gn_back")])
    x = g.op("Add", [g.op("Mul", [x, g.const((1 + 0.1 * g.rng.standard_normal((256, 1, 1))).astype(np.float32))]),
                     g.const((0.1 * g.rng.standard_normal((256, 1, 1))).astype(np.float32))])
    wide = g.op("Reshape", [g.conv(x, 256, 384, k=1), g.const(np.array([1, -1, 1536], dtype=np.int64), "r1536")])
    wide = g.op("LayerNormalization", [wide, g.const((1 + 0.1 * g.rng.standard_normal(1536)).astype(np.float32)),
                                       g.const((0.1 * g.rng.standard_normal(1536)).astype(np.float32))],
                axis=-1, epsilon=1e-5)
    t = g.op("Reshape", [x, g.const(np.array([1, -1, 4096], dtype=np.int64), "r4096")])
    d = g.op("Sub", [t, g.op("ReduceMean", [t], axes=[-1], keepdims=1)])
    var = g.op("ReduceMean", [g.op("Pow", [d, g.const(np.float32(2.0), "two")])], axes=[-1], keepdims=1)
    t = g.op("Div", [d, g.op("Sqrt", [g.op("Add", [var, g.const(np.float32(1e-5), "eps")])])])
    return g.model({"data": [1, 3, h, h]}, [wide, t], opset)


def wide_heads(h: int = 8, opset: int = 13) -> FloatModel:
    """Heads with more output channels than the BPU takes at once (8192 on bayes-e): a CTC head over a
    large vocabulary (MatMul + bias), a classifier Gemm (transB) and a 1x1 Conv."""
    g = _Graph(28)
    dim, vocab = 16, 9000
    x = g.op("Relu", [g.conv("data", 3, dim, stride=2)])
    t = h // 2
    tokens = g.op("Transpose", [g.op("Reshape", [x, g.const(np.array([1, dim, t * t], dtype=np.int64), "r")])],
                  perm=[0, 2, 1])
    wl = (g.rng.standard_normal((dim, vocab)) / np.sqrt(dim)).astype(np.float32)
    logits = g.op("Add", [g.op("MatMul", [tokens, g.const(wl, "vocab_w")]),
                          g.const((0.1 * g.rng.standard_normal(vocab)).astype(np.float32), "vocab_b")])
    pooled = g.op("Flatten", [g.op("GlobalAveragePool", [x])], axis=1)
    wg = (g.rng.standard_normal((8300, dim)) / np.sqrt(dim)).astype(np.float32)
    classes = g.op("Gemm", [pooled, g.const(wg, "cls_w"), g.const(np.zeros(8300, np.float32), "cls_b")], transB=1)
    wc = (g.rng.standard_normal((8250, dim, 1, 1)) / np.sqrt(dim)).astype(np.float32)
    dense = g.op("Conv", [x, g.const(wc, "dense_w")], kernel_shape=[1, 1])
    return g.model({"data": [1, 3, h, h]}, [logits, classes, dense], opset)


def vit_embedding(h: int = 64, opset: int = 13) -> FloatModel:
    """ViT's input end: a 16x16/16 patch embedding (a kernel above the BPU's 15), the class token joined to
    the patch tokens (a Concat with a constant), position embeddings, a LayerNorm and a linear layer."""
    g = _Graph(29)
    dim, p = 24, 16
    n = (h // p) ** 2
    w = (g.rng.standard_normal((dim, 3, p, p)) / np.sqrt(3 * p * p)).astype(np.float32)
    patches = g.op("Conv", ["data", g.const(w, "patch_w"), g.const((0.1 * g.rng.standard_normal(dim)).astype(
        np.float32), "patch_b")], kernel_shape=[p, p], strides=[p, p])
    tokens = g.op("Transpose", [g.op("Reshape", [patches, g.const(np.array([1, dim, n], dtype=np.int64), "r")])],
                  perm=[0, 2, 1])
    cls = (0.5 * g.rng.standard_normal((1, 1, dim))).astype(np.float32)
    x = g.op("Concat", [g.const(cls, "cls_token"), tokens], axis=1)
    x = g.op("Add", [x, g.const((0.2 * g.rng.standard_normal((1, n + 1, dim))).astype(np.float32), "pos")])
    if opset >= 17:
        x = g.op("LayerNormalization", [x, g.const(np.ones(dim, np.float32), "ln_g"),
                                        g.const(np.zeros(dim, np.float32), "ln_b")], axis=-1, epsilon=1e-6)
    wl = (g.rng.standard_normal((dim, 10)) / np.sqrt(dim)).astype(np.float32)
    return g.model({"data": [1, 3, h, h]}, [g.op("MatMul", [x, g.const(wl, "head")])], opset)


def unfolded_patches(h: int = 16, opset: int = 13) -> FloatModel:
    """MobileViT's unfolding: a map cut into 2x2 patches through a 6-D Reshape and Transpose ([1, C, h/2, 2,
    w/2, 2]), a linear layer over the pixels of each patch position, and the fold back into a map."""
    g = _Graph(30)
    c, p = 8, 2
    n = h // p
    x = g.op("Relu", [g.conv("data", 3, c)])
    six = g.op("Reshape", [x, g.const(np.array([1, c, n, p, n, p], dtype=np.int64), "unfold")])
    moved = g.op("Transpose", [six], perm=[0, 3, 5, 2, 4, 1])
    tokens = g.op("Reshape", [moved, g.const(np.array([p * p, n * n, c], dtype=np.int64), "tokens")])
    wl = (g.rng.standard_normal((c, c)) / np.sqrt(c)).astype(np.float32)
    y = g.op("MatMul", [tokens, g.const(wl, "lw")])
    back = g.op("Reshape", [y, g.const(np.array([1, p, p, n, n, c], dtype=np.int64), "refold")])
    folded = g.op("Reshape", [g.op("Transpose", [back], perm=[0, 5, 3, 1, 4, 2]),
                              g.const(np.array([1, c, h, h], dtype=np.int64), "fold")])
    return g.model({"data": [1, 3, h, h]}, [g.conv(folded, c, 4)], opset)


def uneven_average_pools(h: int = 15, opset: int = 13) -> FloatModel:
    """Average pools whose divisor depends on the position: TensorFlow's SAME pooling (count_include_pad=0
    with padding, the ONNX default) and a ResNet-D style 2x2/2 ceil_mode shortcut on an odd map."""
    g = _Graph(31)
    x = g.op("Relu", [g.conv("data", 3, 8)])
    same = g.op("AveragePool", [x], kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1])
    down = g.op("AveragePool", [same], kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1, count_include_pad=0)
    return g.model({"data": [1, 3, h, h]}, [g.conv(down, 8, 4, k=1)], opset)


def interpolating_decoder(h: int = 8, opset: int = 13) -> FloatModel:
    """Segmentation upsampling the ConvTranspose form does not cover: bilinear by 2 with align_corners (older
    PyTorch decoders), then back to the input size by 8 with half-pixel coordinates (DeepLab's last step)."""
    g = _Graph(32)
    x = g.op("Relu", [g.conv("data", 3, 8, stride=2)])
    x = g.op("Relu", [g.conv(x, 8, 8, stride=4)])
    empty = g.const(np.zeros(0, np.float32), "empty")
    up = g.op("Resize", [x, empty, g.const(np.array([1, 1, 2, 2], np.float32), "s2")], mode="linear",
              coordinate_transformation_mode="align_corners")
    up = g.op("Relu", [g.conv(up, 8, 4)])
    out = g.op("Resize", [up, empty, g.const(np.array([1, 1, 8, 8], np.float32), "s8")], mode="linear",
               coordinate_transformation_mode="half_pixel")
    return g.model({"data": [1, 3, h * 8, h * 8]}, [out], opset)


def prelu_upsampler(h: int = 16, opset: int = 13) -> FloatModel:
    """A super-resolution tail: convolutions with PRelu slopes per channel ([C, 1, 1], as PyTorch's
    nn.PReLU(C) exports them; also face-recognition backbones), then a pixel shuffle (DepthToSpace)."""
    g = _Graph(33)
    x = g.conv("data", 3, 16)
    slope = (0.25 + 0.1 * g.rng.standard_normal((16, 1, 1))).astype(np.float32)
    x = g.op("PRelu", [x, g.const(slope, "slope")])
    x = g.op("PRelu", [g.conv(x, 16, 12), g.const(np.full((12, 1, 1), 0.1, np.float32), "slope2")])
    return g.model({"data": [1, 3, h, h]}, [g.op("DepthToSpace", [x], blocksize=2)], opset)


def grouped_upsampler(h: int = 8, opset: int = 13) -> FloatModel:
    """Learned upsampling by ConvTransposes with groups: a grouped one (8 -> 6 channels in 2 groups, weight
    [8, 3, 4, 4]) and a depthwise one, as light segmentation decoders have them; output channels of unlike
    ranges, each needing its own weight step."""
    g = _Graph(37)
    f = g.op("Relu", [_conv_bn(g, "data", 3, 8)])
    gain = np.linspace(0.1, 1.0, 6).reshape(2, 3, 1, 1).repeat(4, axis=0)  # per output channel, in its place
    w = (g.rng.standard_normal((8, 3, 4, 4)) * gain / 4).astype(np.float32)
    up = g.op("Relu", [g.op("ConvTranspose", [f, g.const(w, "wt"), g.const(np.full(6, 0.1, np.float32), "bt")],
                            kernel_shape=[4, 4], strides=[2, 2], pads=[1, 1, 1, 1], group=2)])
    dw = (g.rng.standard_normal((6, 1, 4, 4)) * np.linspace(0.1, 1.0, 6).reshape(6, 1, 1, 1) / 2).astype(np.float32)
    up = g.op("ConvTranspose", [up, g.const(dw, "dw")], kernel_shape=[4, 4], strides=[2, 2], pads=[1, 1, 1, 1],
              group=6)
    return g.model({"data": [1, 3, h, h]}, [g.conv(up, 6, 4)], opset)


def recurrent_head(w: int = 32, opset: int = 13) -> FloatModel:
    """A CRNN head: conv features as a sequence of width positions, a bidirectional LSTM, then a GRU
    (PyTorch's ``linear_before_reset``) and a linear layer per position, as CTC recognisers are built."""
    g = _Graph(34)
    x = g.op("Relu", [g.conv("data", 3, 8, stride=2)])
    x = g.op("Relu", [g.conv(x, 8, 8, stride=2)])  # [1, 8, 2, w/4]
    steps, features, hidden = w // 4, 16, 8
    seq = g.op("Transpose", [g.op("Reshape", [x, g.const(np.array([1, features, steps], np.int64), "shape")])],
               perm=[2, 0, 1])  # [T, 1, C]

    def weights(gates: int, inputs: int, directions: int) -> list[str]:
        scale = 1.0 / np.sqrt(inputs)
        return [g.const((g.rng.standard_normal(s) * scale).astype(np.float32), "rnn")
                for s in ((directions, gates * hidden, inputs), (directions, gates * hidden, hidden),
                          (directions, 2 * gates * hidden))]

    y = g.op("LSTM", [seq, *weights(4, features, 2)], hidden_size=hidden, direction="bidirectional")
    y = g.op("Reshape", [g.op("Transpose", [y], perm=[0, 2, 1, 3]),
                         g.const(np.array([steps, 1, 2 * hidden], np.int64), "joined")])  # [T, 1, 2H]
    y = g.op("GRU", [y, *weights(3, 2 * hidden, 1)], hidden_size=hidden, linear_before_reset=1)
    y = g.op("Reshape", [y, g.const(np.array([steps, 1, hidden], np.int64), "squeezed")])
    logits = g.op("MatMul", [y, g.const((g.rng.standard_normal((hidden, 12)) / 3).astype(np.float32), "fc")])
    return g.model({"data": [1, 3, 8, w]}, [logits], opset)


def linear_attention(h: int = 8, opset: int = 13) -> FloatModel:
    """EfficientViT's ReLU linear attention (LiteMLA): q, k, v from one 1x1 conv; v gets a row of ones
    (a Pad with value 1), so ``(v' kᵀ) q`` gives the numerator and, in its last row, the
    normalizer; the output is their quotient (a Div of two tensors), then a projection and a residual."""
    g = _Graph(36)
    x = g.op("Relu", [g.conv("data", 3, 16)])
    heads, dim, tokens = 2, 8, h * h
    qkv = g.op("Reshape", [g.conv(x, 16, 3 * heads * dim, k=1),
                           g.const(np.array([1, heads, 3 * dim, tokens], np.int64), "shape")])

    def rows(start: int, stop: int, t: str = qkv) -> str:
        return g.op("Slice", [t, g.const(np.array([start], np.int64), "s"), g.const(np.array([stop], np.int64), "e"),
                              g.const(np.array([2], np.int64), "axes")])

    q, k, v = g.op("Relu", [rows(0, dim)]), g.op("Relu", [rows(dim, 2 * dim)]), rows(2 * dim, 3 * dim)
    pads = [0, 0, 0, 0, 0, 0, 1, 0]
    if opset >= 11:
        v = g.op("Pad", [v, g.const(np.array(pads, np.int64), "pads"), g.const(_f(1.0), "one")], mode="constant")
    else:
        v = g.op("Pad", [v], pads=pads, mode="constant", value=1.0)
    kv = g.op("MatMul", [v, g.op("Transpose", [k], perm=[0, 1, 3, 2])])  # [1, heads, dim + 1, dim]
    out = g.op("MatMul", [kv, q])  # [1, heads, dim + 1, tokens]
    num, den = rows(0, dim, out), rows(dim, dim + 1, out)
    y = g.op("Div", [num, g.op("Add", [den, g.const(_f(1e-15), "eps")])])
    y = g.op("Reshape", [y, g.const(np.array([1, heads * dim, h, h], np.int64), "image")])
    return g.model({"data": [1, 3, h, h]}, [g.op("Add", [g.conv(y, 16, 16, k=1), x])], opset)


def aspp_head(h: int = 40, opset: int = 13) -> FloatModel:
    """DeepLabV3's atrous spatial pyramid pooling: parallel 3x3 convolutions dilated 6, 12 and 18 (24 and
    36 at output stride 8) beside a 1x1 conv and an image-pooling branch, joined by Concat."""
    g = _Graph(37)
    x = g.op("Relu", [g.conv("data", 3, 8)])

    def atrous(d: int) -> str:
        w = (g.rng.standard_normal((8, 8, 3, 3)) / np.sqrt(72)).astype(np.float32)
        return g.op("Relu", [g.op("Conv", [x, g.const(w, "w")], kernel_shape=[3, 3], dilations=[d, d],
                                  pads=[d, d, d, d])])

    pooled = g.op("Relu", [g.conv(g.op("GlobalAveragePool", [x]), 8, 8, k=1)])
    image = g.op("Resize", [pooled, "", "", g.const(np.array([1, 8, h, h], np.int64), "sizes")], mode="linear")
    joined = g.op("Concat", [g.op("Relu", [g.conv(x, 8, 8, k=1)]), atrous(6), atrous(12), atrous(18), image], axis=1)
    return g.model({"data": [1, 3, h, h]}, [g.conv(joined, 40, 4, k=1)], opset)


BLOCKS = {
    "mobilenetv3_block": mobilenetv3_block,
    "yolox_head": yolox_head,
    "resnet_bottleneck": resnet_bottleneck,
    "repvgg_block": repvgg_block,
    "mbconv": mbconv,
    "vit_block": vit_block,
    "unet_up": unet_up,
    "fpn_pan": fpn_pan,
    "yolov8_head": yolov8_head,
    "ort_quantized_crnn": ort_quantized_crnn,
    "if_branch_head": if_branch_head,
    "stacked_state": stacked_state,
    "spatial_reductions": spatial_reductions,
    "channel_and_token_means": channel_and_token_means,
    "attention_sums": attention_sums,
    "frame_convs": frame_convs,
    "conv1d_pooling_head": conv1d_pooling_head,
    "expanded_gates": expanded_gates,
    "padded_convs": padded_convs,
    "bilinear_decoder": bilinear_decoder,
    "layer_norms": layer_norms,
    "wide_heads": wide_heads,
    "vit_embedding": vit_embedding,
    "unfolded_patches": unfolded_patches,
    "uneven_average_pools": uneven_average_pools,
    "interpolating_decoder": interpolating_decoder,
    "prelu_upsampler": prelu_upsampler,
    "recurrent_head": recurrent_head,
    "linear_attention": linear_attention,
    "aspp_head": aspp_head,
}
