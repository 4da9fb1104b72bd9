"""Converters of Caffe's data-movement layers (concat, slice, reshape, resize, ...)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from hbtools.frontends.caffe.builder import Layer


def concat(layer: Layer) -> None:
    p = layer.param.concat_param
    xs = [layer.bottom(i) for i in range(len(layer.param.bottom))]
    rank = len(layer.shape(xs[0]))
    axis = int(p.concat_dim) if p.HasField("concat_dim") and not p.HasField("axis") else int(p.axis)
    axis = layer.axis(axis, rank)
    if len(xs) == 1:
        layer.alias(0, xs[0])
        return
    layer.set_top(0, layer.node("Concat", xs, axis=axis))


def slice_(layer: Layer) -> None:
    p = layer.param.slice_param
    shape = layer.in_shape()
    axis = int(p.slice_dim) if p.HasField("slice_dim") and not p.HasField("axis") else int(p.axis)
    axis = layer.axis(axis, len(shape))
    count, size = len(layer.param.top), shape[axis]
    points = [int(v) for v in p.slice_point]
    if points:
        if len(points) != count - 1 or points != sorted(points) or points[0] <= 0 or points[-1] >= size:
            raise layer.fail(f"slice_point {points} does not cut axis {axis} (size {size}) into {count} parts")
        sizes = np.diff([0, *points, size]).tolist()
    else:
        if size % count:
            raise layer.fail(f"axis {axis} (size {size}) does not split evenly into {count} tops")
        sizes = [size // count] * count
    if count == 1:
        layer.alias(0, layer.bottom())
        return
    layer.node("Split", [layer.bottom(), layer.ints(sizes, "split")], [layer.top(i) for i in range(count)],
               axis=axis)


def split(layer: Layer) -> None:
    for i in range(len(layer.param.top)):
        layer.alias(i, layer.bottom())


def silence(layer: Layer) -> None:
    for i in range(len(layer.param.bottom)):  # consumes its bottoms, produces nothing
        layer.bottom(i)


def flatten(layer: Layer) -> None:
    p = layer.param.flatten_param
    shape = layer.in_shape()
    start = layer.axis(p.axis, len(shape))
    end = layer.axis(p.end_axis, len(shape), "end_axis")
    if end < start:
        raise layer.fail(f"end_axis {p.end_axis} comes before axis {p.axis}")
    if start == 1 and end == len(shape) - 1:
        layer.set_top(0, layer.node("Flatten", [layer.bottom()], axis=1))
        return
    out = [*shape[:start], int(np.prod(shape[start:end + 1])), *shape[end + 1:]]
    layer.set_top(0, layer.node("Reshape", [layer.bottom(), layer.ints(out, "shape")]))


def reshape(layer: Layer) -> None:
    """Caffe's dims: 0 copies the input dim at that place, -1 takes what is left; only the
    axes [axis, axis + num_axes) of the input are replaced. Resolved here to a static shape."""
    p = layer.param.reshape_param
    shape = layer.in_shape()
    start = layer.axis(p.axis, len(shape), inclusive_end=True)
    end = len(shape) if p.num_axes == -1 else start + int(p.num_axes)
    if p.num_axes < -1 or end > len(shape):
        raise layer.fail(f"num_axes {p.num_axes} does not fit an input of rank {len(shape)} from axis {start}")
    dims = [int(d) for d in p.shape.dim]
    if dims.count(-1) > 1 or any(d < -1 for d in dims):
        raise layer.fail(f"shape {dims} may hold at most one -1 and no other negative dim")
    middle = []
    for i, d in enumerate(dims):
        if d == 0:
            if start + i >= len(shape):
                raise layer.fail(f"shape dim {i} is 0 but the input has no axis {start + i} to copy")
            d = shape[start + i]
        middle.append(d)
    replaced = int(np.prod(shape[start:end]))
    if -1 in middle:
        known = int(np.prod([d for d in middle if d != -1]))
        if known == 0 or replaced % known:
            raise layer.fail(f"shape {dims} cannot hold the {replaced} values of input shape {shape}")
        middle[middle.index(-1)] = replaced // known
    if int(np.prod(middle)) != replaced:
        raise layer.fail(f"shape {dims} holds {int(np.prod(middle))} values, the input part {replaced}")
    out = [*shape[:start], *middle, *shape[end:]]
    layer.set_top(0, layer.node("Reshape", [layer.bottom(), layer.ints(out, "shape")]))


def permute(layer: Layer) -> None:
    rank = len(layer.in_shape())
    order = [int(v) for v in layer.param.permute_param.order]
    if len(set(order)) != len(order) or any(v >= rank for v in order):
        raise layer.fail(f"order {order} is not a permutation of the {rank} axes")
    order += [v for v in range(rank) if v not in order]  # Caffe keeps unnamed axes in their order
    layer.set_top(0, layer.node("Transpose", [layer.bottom()], perm=order))


def tile(layer: Layer) -> None:
    p = layer.param.tile_param
    shape = layer.in_shape()
    axis = layer.axis(p.axis, len(shape))
    if p.tiles < 1:
        raise layer.fail(f"tiles must be at least 1, got {p.tiles}")
    repeats = [int(p.tiles) if k == axis else 1 for k in range(len(shape))]
    layer.set_top(0, layer.node("Tile", [layer.bottom(), layer.ints(repeats, "repeats")]))


def shuffle_channel(layer: Layer) -> None:
    """ShuffleNet's channel shuffle: channel i * (C / group) + j becomes channel j * group + i."""
    n, c, h, w = _four_d(layer)
    group = int(layer.param.shuffle_channel_param.group)
    if group < 1 or c % group:
        raise layer.fail(f"group {group} does not divide the {c} channels")
    grouped = layer.node("Reshape", [layer.bottom(), layer.ints([n, group, c // group, h, w], "groups")])
    moved = layer.node("Transpose", [grouped], perm=[0, 2, 1, 3, 4])
    layer.set_top(0, layer.node("Reshape", [moved, layer.ints([n, c, h, w], "shape")]))


def reorg(layer: Layer) -> None:
    """YOLOv2's passthrough (Darknet's reorg, which the Caffe ports copy): with stride s the input's memory is
    read as [N, C / s^2, H * s, W * s] and each s x s block's offset (dy, dx) becomes the slowest part of
    the output channel, giving [N, C * s^2, H / s, W / s]; ``reverse`` undoes it."""
    p = layer.param.reorg_param
    n, c, h, w = _four_d(layer)
    s = int(p.stride)
    x = layer.bottom()
    if p.reverse:
        if s < 1 or c % (s * s):
            raise layer.fail(f"stride {s} does not fit {c} channels (reverse needs a multiple of {s * s})")
        blocks = layer.node("Reshape", [x, layer.ints([n, s, s, c // (s * s), h, w], "blocks")])
        moved = layer.node("Transpose", [blocks], perm=[0, 3, 4, 1, 5, 2])
        layer.set_top(0, layer.node("Reshape", [moved, layer.ints([n, c // (s * s), h * s, w * s], "shape")]))
        return
    if s < 1 or c % (s * s) or h % s or w % s:
        raise layer.fail(f"stride {s} does not divide the input {[n, c, h, w]} (channels by {s * s}, "
                         f"height and width by {s})")
    # [N, C/s^2, H*s, W*s] as [N, C/s^2, H, s, W, s]: (c2, j, dy, i, dx) -> (dy, dx, c2, j, i)
    blocks = layer.node("Reshape", [x, layer.ints([n, c // (s * s), h, s, w, s], "blocks")])
    moved = layer.node("Transpose", [blocks], perm=[0, 3, 5, 1, 2, 4])
    layer.set_top(0, layer.node("Reshape", [moved, layer.ints([n, c * s * s, h // s, w // s], "shape")]))


def crop(layer: Layer) -> None:
    p = layer.param.crop_param
    shape, ref = layer.in_shape(0), layer.in_shape(1)
    axis = layer.axis(p.axis, len(shape))
    offsets = [int(v) for v in p.offset]
    axes = list(range(axis, len(shape)))
    if len(offsets) not in (0, 1, len(axes)):
        raise layer.fail(f"offset needs 0, 1 or {len(axes)} values, got {len(offsets)}")
    offsets = offsets * len(axes) if len(offsets) == 1 else offsets or [0] * len(axes)
    ends = [o + ref[a] for o, a in zip(offsets, axes, strict=True)]
    if any(e > shape[a] for e, a in zip(ends, axes, strict=True)):
        raise layer.fail(f"cropping {shape} to {ref} with offsets {offsets} leaves the input")
    inputs = [layer.bottom(), layer.ints(offsets, "starts"), layer.ints(ends, "ends"), layer.ints(axes, "axes")]
    layer.set_top(0, layer.node("Slice", inputs))


def _four_d(layer: Layer) -> list[int]:
    shape = layer.in_shape()
    if len(shape) != 4:
        raise layer.fail(f"needs a 4-D (NCHW) input, got shape {shape}")
    return shape


def upsample(layer: Layer) -> None:
    """Nearest-neighbour upsampling (the one-bottom Upsample of YOLO-style branches)."""
    p = layer.param.upsample_param
    n, c, h, w = _four_d(layer)
    if len(layer.param.bottom) > 1:
        raise layer.fail("the two-bottom form (max-unpooling with pooling indices) is not supported")
    if p.HasField("upsample_h") or p.HasField("upsample_w"):
        sizes = [n, c, int(p.upsample_h or h * p.scale), int(p.upsample_w or w * p.scale)]
        extra = {"sizes": layer.ints(sizes, "sizes")}
    else:
        sh = int(p.scale_h) if p.HasField("scale_h") else int(p.scale)
        sw = int(p.scale_w) if p.HasField("scale_w") else int(p.scale)
        if sh < 1 or sw < 1:
            raise layer.fail(f"scale {sh}x{sw} must be at least 1")
        extra = {"scales": layer.const(np.array([1, 1, sh, sw], np.float32), "scales")}
    inputs = [layer.bottom(), "", extra.get("scales", "")] + ([extra["sizes"]] if "sizes" in extra else [])
    y = layer.node("Resize", inputs, mode="nearest", coordinate_transformation_mode="asymmetric",
                   nearest_mode="floor")
    layer.set_top(0, y)


def interp(layer: Layer) -> None:
    """Bilinear resize with aligned corners (the Interp layer of PSPNet / DeepLab branches)."""
    p = layer.param.interp_param
    n, c, h, w = _four_d(layer)
    if p.pad_beg or p.pad_end:
        raise layer.fail("pad_beg / pad_end are not supported")
    if len(layer.param.bottom) > 1:
        layer.in_shape(1)  # the size reference; the explicit parameters below win over it
    zoom, shrink = p.HasField("zoom_factor"), p.HasField("shrink_factor")
    if shrink and not zoom:
        out = [(h - 1) // p.shrink_factor + 1, (w - 1) // p.shrink_factor + 1]
    elif zoom and not shrink:
        out = [h + (h - 1) * (p.zoom_factor - 1), w + (w - 1) * (p.zoom_factor - 1)]
    elif p.HasField("height") and p.HasField("width"):
        out = [int(p.height), int(p.width)]
    elif zoom and shrink:
        out = [(h - 1) // p.shrink_factor + 1, (w - 1) // p.shrink_factor + 1]
        out = [d + (d - 1) * (p.zoom_factor - 1) for d in out]
    elif len(layer.param.bottom) > 1:
        out = layer.in_shape(1)[2:]
    else:
        raise layer.fail("give zoom_factor, shrink_factor, height and width, or a second bottom")
    if min(out) < 1:
        raise layer.fail(f"output size {out} is empty")
    sizes = layer.ints([n, c, *out], "sizes")
    y = layer.node("Resize", [layer.bottom(), "", "", sizes], mode="linear",
                   coordinate_transformation_mode="align_corners")
    layer.set_top(0, y)


CONVERTERS: dict[str, Callable[[Layer], None]] = {
    "Concat": concat,
    "Slice": slice_,
    "Split": split,
    "Silence": silence,
    "Flatten": flatten,
    "Reshape": reshape,
    "Permute": permute,
    "Tile": tile,
    "ShuffleChannel": shuffle_channel,
    "Reorg": reorg,
    "Crop": crop,
    "Upsample": upsample,
    "Interp": interp,
}
