"""Architecture blocks built with ``onnx.helper``: the structures real exported models have.

Each block is small (a few kB, inputs of a few hundred pixels) and reproduces a structure
(not the weights) of a model family people convert: MobileNetV3, YOLOX, YOLOv8, ViT,
ResNet, RepVGG, EfficientNet, UNet, FPN/PAN.
"""

from __future__ import annotations

import numpy as np
from builders import FloatModel, _Graph


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


def yolov8_head(h: int = 32, classes: int = 4, opset: int = 13) -> FloatModel:
    """Per scale: box branch (4 x 16 DFL bins) and cls branch; Concat of three scales, Split, DFL
    (Reshape, Transpose, Softmax, 1x1 Conv with weights 0..15), Sigmoid class scores."""
    g = _Graph(29)
    c, bins = 8, 16
    x = _silu(g, _conv_bn(g, _silu(g, _conv_bn(g, "data", 3, c, stride=2)), c, c, stride=2))
    levels = []
    for _ in range(3):
        x = _silu(g, _conv_bn(g, x, c, c, stride=2))
        box = g.conv(_silu(g, _conv_bn(g, x, c, c)), c, 4 * bins, k=1)
        cls = g.conv(_silu(g, _conv_bn(g, x, c, c)), c, classes, k=1)
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
    out = g.op("Concat", [ltrb, g.op("Sigmoid", [cls])], axis=1)
    return g.model({"data": [1, 3, h, h]}, [out], opset)


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
}
