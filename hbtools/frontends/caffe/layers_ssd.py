"""SSD's PriorBox (a constant for a fixed input size) and where a network ends before DetectionOutput."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from onnx import numpy_helper

from hbtools.frontends.caffe.builder import Layer

# Layers the conversion ends before: their bottoms become the network's outputs. What they compute has
# no static shape (a number of detections), and hosts decode and filter boxes faster than a CPU node would.
CUT_LAYERS = {"DetectionOutput": "SSD's box decoding and per-class non-maximum suppression",
              **dict.fromkeys(("Region", "Yolo", "YoloDetectionOutput", "Yolov3DetectionOutput"),
                              "the YOLO ports' box decoding and non-maximum suppression")}


def _aspect_ratios(ratios: list[float], flip: bool) -> list[float]:
    out = [1.0]
    for ar in ratios:
        if any(abs(ar - have) < 1e-6 for have in out):
            continue
        out.append(ar)
        if flip:
            out.append(1.0 / ar)
    return out


def prior_boxes(p: Any, layer_hw: tuple[int, int], image_hw: tuple[int, int]) -> np.ndarray:
    """SSD's PriorBox for a feature map of ``layer_hw`` over an image of ``image_hw``: [1, 2, H * W * priors * 4],
    the corners (x_min, y_min, x_max, y_max, relative to the image) then their variances."""
    img_h = p.img_h or p.img_size or image_hw[0]
    img_w = p.img_w or p.img_size or image_hw[1]
    step_h = p.step_h or p.step or img_h / layer_hw[0]
    step_w = p.step_w or p.step or img_w / layer_hw[1]
    ratios = _aspect_ratios([float(a) for a in p.aspect_ratio], p.flip)
    boxes = []
    for h in range(layer_hw[0]):
        for w in range(layer_hw[1]):
            cx, cy = (w + p.offset) * step_w, (h + p.offset) * step_h
            for k, size in enumerate(p.min_size):
                sizes = [(size, size)]
                if p.max_size:
                    side = math.sqrt(size * p.max_size[k])
                    sizes.append((side, side))
                sizes += [(size * math.sqrt(ar), size / math.sqrt(ar)) for ar in ratios if abs(ar - 1.0) >= 1e-6]
                boxes += [((cx - bw / 2) / img_w, (cy - bh / 2) / img_h, (cx + bw / 2) / img_w, (cy + bh / 2) / img_h)
                          for bw, bh in sizes]
    corners = np.asarray(boxes, np.float32).reshape(-1)
    if p.clip:
        corners = np.clip(corners, 0.0, 1.0)
    variance = [float(v) for v in p.variance] or [0.1]
    variances = np.resize(np.asarray(variance if len(variance) == 4 else variance[:1], np.float32), corners.size)
    return np.stack([corners, variances])[None]


def prior_box(layer: Layer) -> None:
    p = layer.param.prior_box_param
    feature, image = layer.in_shape(0), layer.in_shape(1)
    if len(feature) != 4 or len(image) != 4:
        raise layer.fail(f"needs a 4-D feature map and a 4-D image, got {feature} and {image}")
    if not p.min_size or any(v <= 0 for v in p.min_size):
        raise layer.fail("needs min_size values above 0")
    if p.max_size and len(p.max_size) != len(p.min_size):
        raise layer.fail(f"has {len(p.max_size)} max_size values for {len(p.min_size)} min_size values")
    if any(mx <= mn for mn, mx in zip(p.min_size, p.max_size, strict=False)):
        raise layer.fail("needs each max_size above its min_size")
    if len(p.variance) not in (0, 1, 4):
        raise layer.fail(f"has {len(p.variance)} variance values; give 1 or 4")
    priors = prior_boxes(p, (feature[2], feature[3]), (image[2], image[3]))
    layer.node("Constant", [], [layer.top(0)], value=numpy_helper.from_array(priors, f"{layer.name}_priors"))


CONVERTERS = {"PriorBox": prior_box}
