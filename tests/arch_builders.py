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


BLOCKS = {
    "mobilenetv3_block": mobilenetv3_block,
    "yolox_head": yolox_head,
}
