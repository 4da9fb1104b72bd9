"""Resizing, cropping and padding of HW / HWC images.

Sizes are ``(height, width)`` (an ``int`` means a square). The classes named as the
vendor's (``Resize``, ``ShortSideResize``, ``PadResize``, ``CenterCrop``,
``PaddedCenterCrop``) compute what the vendor's compute by default: OpenCV's
``cv2.resize`` bilinear resampling (``opencv_resize``, no OpenCV needed) where the
vendor calls it, its scikit-image normalisation in ``ResizeTransformer``'s
``'skimage'`` mode, its crop corners, and float32 results (``data_type='float'``).
A scikit-image interpolation name or order (``'bilinear'``, 3, ...) asks for
``resize`` instead: skimage's spline resampling with edge padding and anti-aliasing
when shrinking (not for ``nearest``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import scipy.ndimage
import skimage.transform

from hbtools.data import colour
from hbtools.data.transforms.base import Transformer, check_image, float_dtype, like, size_hw

# Interpolation name -> spline order of skimage.transform.resize.
INTERPOLATIONS = {
    "nearest": 0,
    "linear": 1,
    "bilinear": 1,
    "biquadratic": 2,
    "cubic": 3,
    "bicubic": 3,
    "biquartic": 4,
    "biquintic": 5,
}


def _order(interpolation: str | int) -> int:
    if isinstance(interpolation, int) and 0 <= interpolation <= 5:
        return interpolation
    if isinstance(interpolation, str) and interpolation.lower() in INTERPOLATIONS:
        return INTERPOLATIONS[interpolation.lower()]
    raise ValueError(
        f"interpolation {interpolation!r} is not one of {sorted(INTERPOLATIONS)} (or 0..5)"
    )


def resize(image: np.ndarray, height: int, width: int, interpolation: str | int = "bilinear",
           anti_aliasing: bool | None = None) -> np.ndarray:
    """``image`` (HW or HWC) resampled to ``height`` x ``width``."""
    check_image(image, "resize")
    src = image.astype(np.float32 if image.dtype == np.uint8 else float_dtype(image))
    out = skimage.transform.resize(
        src, (height, width, *image.shape[2:]), order=_order(interpolation), mode="edge",
        anti_aliasing=anti_aliasing, preserve_range=True,
    )  # fmt: skip
    return like(out, image)


RESIZE_MODES = ("skimage", "opencv")
# OpenCV interpolation names (cv2.INTER_*, or without the prefix) -> the two hbtools computes OpenCV's way.
OPENCV_INTERPOLATIONS = {"": "linear", "inter_linear": "linear", "linear": "linear", "bilinear": "linear",
                         "inter_nearest": "nearest", "nearest": "nearest", "inter_cubic": "cubic"}
# The vendor module's table of OpenCV flags its resizes take besides the default INTER_LINEAR
# (cv2.INTER_CUBIC is 2); scripts import it.
INTERPOLATION_DICT = {"INTER_CUBIC": 2}
CUBIC_A = -0.75  # OpenCV's bicubic kernel parameter
DATA_TYPES = ("float", "uint8")


def _opencv_kind(interpolation: str | int) -> str | None:
    """The ``opencv_resize`` kind for the vendor's interpolation argument (``''``, the default, or an
    OpenCV name ``INTER_*``); None for a scikit-image name or order, which ``resize`` takes."""
    if isinstance(interpolation, str) and (interpolation == "" or interpolation.lower().startswith("inter_")):
        kind = OPENCV_INTERPOLATIONS.get(interpolation.lower())
        if kind is None:
            raise ValueError(f"interpolation {interpolation!r} is not one OpenCV's resampling here takes: "
                             "INTER_LINEAR, INTER_NEAREST, INTER_CUBIC")
        return kind
    _order(interpolation)  # fail at construction, not on the first image
    return None


def _is_interpolation(value: object) -> bool:
    """Whether ``value`` reads as an interpolation: an OpenCV name ``INTER_*``, a scikit-image name or order."""
    if isinstance(value, str) and value.lower().startswith("inter_"):
        return True
    try:
        _order(value)  # type: ignore[arg-type]
    except ValueError:
        return False
    return True


def _resample(image: np.ndarray, height: int, width: int, interpolation: str | int) -> np.ndarray:
    """``image`` resized as ``cv2.resize`` (``''`` / ``INTER_*``) or as skimage (a name or order)."""
    kind = _opencv_kind(interpolation)
    return opencv_resize(image, height, width, kind) if kind else resize(image, height, width, interpolation)


class ResizeTransformer(Transformer):
    """Resize to ``target_size`` = (height, width), ignoring the aspect ratio; float32 out by default.

    ``mode`` (the vendor's parameter) ``'skimage'``, the default, does what the vendor's does: an image
    whose last axis has 1 or 3 entries (or an HW image) is scaled to 0..1 by its own minimum and
    maximum, resized by ``skimage.transform.resize`` with skimage's defaults (reflecting borders,
    anti-aliasing when shrinking) and the spline order ``method`` (0..5, default 1; or, without
    ``method``, ``interpolation`` as a name or order), then scaled back; a constant image gives that
    constant. Other channel counts are resampled by ``scipy.ndimage.zoom`` with order 1. ``anti_aliasing``
    overrides skimage's choice.

    ``'opencv'`` computes what ``cv2.resize`` does, without OpenCV (``opencv_resize``): sample points at
    half-pixel centres, edges clamped, no anti-aliasing when shrinking, ``interpolation`` ``''`` /
    ``'INTER_LINEAR'`` (the default), ``'INTER_NEAREST'`` or ``'INTER_CUBIC'``. A uint8 image is
    resampled linearly in OpenCV's fixed point (its bytes); INTER_CUBIC in float and rounded (OpenCV's
    may differ by 1).

    ``data_type`` ``'float'`` (the default) gives float32, ``'uint8'`` uint8 (truncated, as the
    vendor's ``astype``); ``None`` keeps the image's type (uint8 rounded).
    """

    def __init__(self, target_size: int | Sequence[int], mode: str = "skimage", method: int | None = None,
                 data_type: str | None = "float", interpolation: str | int = "",
                 anti_aliasing: bool | None = None) -> None:
        self.target_size = size_hw(target_size, "target_size")
        if mode not in RESIZE_MODES:
            raise ValueError(f"mode {mode!r} is not one of {RESIZE_MODES}")
        _check_data_type(data_type)
        if mode == "opencv":
            if not isinstance(interpolation, str) or interpolation.lower() not in OPENCV_INTERPOLATIONS:
                raise ValueError(f"interpolation {interpolation!r} is not one mode 'opencv' takes: "
                                 f"{sorted(OPENCV_INTERPOLATIONS)} (any case)")
        self.mode, self.method, self.data_type = mode, method, data_type
        self.interpolation = interpolation
        self.anti_aliasing = anti_aliasing
        if mode == "skimage":
            self._skimage_order()  # fail at construction, not on the first image

    def _skimage_order(self) -> int:
        if self.method is not None:
            return _order(self.method)
        return 1 if self.interpolation == "" else _order(self.interpolation)

    def run_transform(self, image: np.ndarray) -> np.ndarray:
        if self.mode == "opencv":
            kind = OPENCV_INTERPOLATIONS[str(self.interpolation).lower()]
            out = opencv_resize(image, *self.target_size, kind)
        else:
            out = self._skimage_resize(image)
        return _as_data_type(out, self.data_type, image)

    def _skimage_resize(self, image: np.ndarray) -> np.ndarray:
        check_image(image, "resize")
        height, width = self.target_size
        if image.ndim == 3 and image.shape[-1] not in (1, 3):
            zoom = (height / image.shape[0], width / image.shape[1], 1)
            return scipy.ndimage.zoom(image, zoom, order=1)
        low, high = image.min(), image.max()
        if not high > low:
            return np.full((height, width, *image.shape[2:]), low, dtype=np.float32)
        unit = (image - low) / (high - low)
        resized = skimage.transform.resize(unit, (height, width), order=self._skimage_order(),
                                           anti_aliasing=self.anti_aliasing)
        return resized * (high - low) + low


def _check_data_type(data_type: str | None) -> None:
    if data_type is not None and data_type not in DATA_TYPES:
        raise ValueError(f"data_type {data_type!r} is not one of {DATA_TYPES}")


def _as_data_type(image: np.ndarray, data_type: str | None, source: np.ndarray) -> np.ndarray:
    """The vendor transformers' ``data_type``: ``'float'`` gives float32, ``'uint8'`` uint8 (clipped to
    0..255 and truncated), None the type of ``source`` (uint8 rounded)."""
    if data_type == "float":
        return image.astype(np.float32)
    if data_type == "uint8":
        return np.clip(image, 0, 255).astype(np.uint8)
    return like(image, source)


def opencv_resize(image: np.ndarray, height: int, width: int, kind: str = "linear",
                  factors: tuple[float, float] | None = None) -> np.ndarray:
    """``image`` (HW or HWC) resampled as ``cv2.resize`` does with INTER_LINEAR, INTER_NEAREST or INTER_CUBIC
    (``kind`` linear, nearest, cubic): sample points at half-pixel centres, edge pixels repeated.

    ``factors`` = (fy, fx) is for ``cv2.resize(image, None, fx=fx, fy=fy)``: OpenCV then maps
    output pixels back with ``1 / f``, not with the ratio of the rounded sizes.

    A uint8 image with ``linear`` is computed in OpenCV's fixed point (``_opencv_linear_uint8``), so it
    gives OpenCV's bytes; other types and kinds are computed in float (uint8 rounded; uint16 and int16
    computed in float32, rounded and saturated to their type as OpenCV stores them)."""
    check_image(image, "resize")
    if image.dtype == np.uint8 and kind == "linear":
        return _opencv_linear_uint8(image, height, width, factors)
    sixteen = image.dtype in (np.uint16, np.int16)
    src = image.astype(np.float32 if image.dtype == np.uint8 or sixteen else float_dtype(image))
    for axis, size in ((0, height), (1, width)):
        n = src.shape[axis]
        # OpenCV's inverse scale, 1 / (size / n) in double: for some sizes it lies on the other side of a
        # whole number than n / size does, and INTER_NEAREST's floor(d * scale) then picks the next pixel.
        scale = 1.0 / (size / n if factors is None else factors[axis])
        if kind == "nearest":
            src = np.take(src, np.minimum(np.floor(np.arange(size) * scale).astype(np.int64), n - 1), axis=axis)
            continue
        pos = (np.arange(size) + 0.5) * scale - 0.5
        lo = np.floor(pos).astype(np.int64)
        frac = pos - lo
        if kind == "cubic":
            taps = [(np.clip(lo + k, 0, n - 1), w) for k, w in zip(range(-1, 3), _cubic_weights(frac), strict=True)]
        else:  # linear: OpenCV puts a point left of the first centre (or right of the last) on that pixel
            frac[lo < 0], lo[lo < 0] = 0.0, 0
            past = lo >= n - 1
            frac[past], lo[past] = 0.0, n - 1
            taps = [(lo, 1 - frac), (np.minimum(lo + 1, n - 1), frac)]
        shape = [1] * src.ndim
        shape[axis] = size
        src = sum(np.take(src, index, axis=axis) * w.reshape(shape).astype(src.dtype) for index, w in taps)
    if sixteen:  # OpenCV resamples 16-bit pictures in float and stores them rounded and saturated
        info = np.iinfo(image.dtype)
        return np.clip(np.rint(src), info.min, info.max).astype(image.dtype)
    return like(src, image)


# cv2.resize's uint8 bilinear fixed point: weights in 1/2048 (INTER_RESIZE_COEF_BITS = 11).
_RESIZE_COEF_BITS = 11


def _opencv_linear_taps(n: int, size: int, factor: float | None, clamp: bool) -> tuple[np.ndarray, ...]:
    """Source indices and fixed-point weights of the two taps per output pixel along an axis of ``n``
    pixels resized to ``size``, as OpenCV computes them: position ``(d + 0.5) * scale - 0.5`` rounded to
    float32, weights ``1 - f`` and ``f`` rounded to 1/2048. Along x (``clamp``) a position past an edge is
    put on the edge pixel; along y OpenCV keeps the weights and repeats the edge row."""
    scale = 1.0 / (size / n if factor is None else factor)
    pos = ((np.arange(size) + 0.5) * scale - 0.5).astype(np.float32)
    lo = np.floor(pos).astype(np.int64)
    frac = (pos - lo.astype(np.float32)).astype(np.float32)
    if clamp:
        frac[lo < 0], lo[lo < 0] = 0, 0
        past = lo >= n - 1
        frac[past], lo[past] = 0, n - 1
    one = np.float32(1 << _RESIZE_COEF_BITS)
    w0 = np.rint((np.float32(1) - frac) * one).astype(np.int64)
    w1 = np.rint(frac * one).astype(np.int64)
    return np.clip(lo, 0, n - 1), np.clip(lo + 1, 0, n - 1), w0, w1


def _opencv_linear_uint8(image: np.ndarray, height: int, width: int,
                         factors: tuple[float, float] | None) -> np.ndarray:
    """``cv2.resize`` INTER_LINEAR of a uint8 image, bit for bit: a horizontal pass in integers (weights in
    1/2048), then the vertical pass as OpenCV's SIMD code does it, each row's product with its 1/2048
    weight taken >> 4 and >> 16 before the two are added, rounded and >> 2."""
    src = (image if image.ndim == 3 else image[..., None]).astype(np.int64)
    fy, fx = (None, None) if factors is None else factors
    x0, x1, a0, a1 = _opencv_linear_taps(src.shape[1], width, fx, clamp=True)
    rows = src[:, x0] * a0[None, :, None] + src[:, x1] * a1[None, :, None]
    y0, y1, b0, b1 = _opencv_linear_taps(src.shape[0], height, fy, clamp=False)
    b0, b1 = b0[:, None, None], b1[:, None, None]
    out = (((b0 * (rows[y0] >> 4)) >> 16) + ((b1 * (rows[y1] >> 4)) >> 16) + 2) >> 2
    out = np.clip(out, 0, 255).astype(np.uint8)
    return out if image.ndim == 3 else out[..., 0]


def _cubic_weights(x: np.ndarray) -> list[np.ndarray]:
    """OpenCV's four bicubic tap weights at offsets -1, 0, 1, 2 for fractional positions ``x``."""
    a = CUBIC_A
    w0 = ((a * (x + 1) - 5 * a) * (x + 1) + 8 * a) * (x + 1) - 4 * a
    w1 = ((a + 2) * x - (a + 3)) * x * x + 1
    w2 = ((a + 2) * (1 - x) - (a + 3)) * (1 - x) * (1 - x) + 1
    return [w0, w1, w2, 1 - w0 - w1 - w2]


class ShortSideResizeTransformer(Transformer):
    """Scale so the shorter side is ``short_size``, keeping the aspect ratio (the vendor's arithmetic).

    An image wider than high becomes ``short_size`` x ``int(short_size * (W / H))``, any other
    ``int(short_size * (H / W))`` x ``short_size``. ``interpolation`` ``''`` (the default) resamples as
    ``cv2.resize`` does (bilinear, ``opencv_resize``), as do the OpenCV names ``INTER_LINEAR``,
    ``INTER_NEAREST``, ``INTER_CUBIC``; a scikit-image name or order (``'bilinear'``, 3, ...) resamples
    with skimage (``resize``, anti-aliased when shrinking). ``data_type`` as ``ResizeTransformer``'s
    (float32 by default).
    """

    def __init__(self, short_size: int, data_type: str | None = "float", interpolation: str | int = "") -> None:
        self.short_size = size_hw(short_size, "short_size")[0]
        if data_type not in (None, *DATA_TYPES) and _is_interpolation(data_type):
            # hbtools' parameters were (short_size, interpolation, data_type) before they took the vendor's order.
            raise ValueError(f"ShortSideResizeTransformer: {data_type!r} is an interpolation, given where data_type "
                             "goes; the parameters are the vendor's (short_size, data_type='float', interpolation=''): "
                             f"pass interpolation={data_type!r}")
        _opencv_kind(interpolation)
        _check_data_type(data_type)
        self.data_type, self.interpolation = data_type, interpolation

    def output_size(self, height: int, width: int) -> tuple[int, int]:
        """(height, width) an image of ``height`` x ``width`` is resized to."""
        s = self.short_size
        if height < width:
            return s, max(1, int(s * (width / height)))
        return max(1, int(s * (height / width))), s

    def run_transform(self, image: np.ndarray) -> np.ndarray:
        check_image(image, "ShortSideResize")
        out = _resample(image, *self.output_size(*image.shape[:2]), self.interpolation)
        return _as_data_type(out, self.data_type, image)


class CenterCropTransformer(Transformer):
    """Cut the central ``crop_size`` = (height, width) window (an int: a square); the top-left corner is
    at ``(H // 2 - height // 2, W // 2 - width // 2)``, as the vendor's. ``data_type`` as
    ``ResizeTransformer``'s (float32 by default)."""

    def __init__(self, crop_size: int | Sequence[int], data_type: str | None = "float") -> None:
        self.crop_size = size_hw(crop_size, "crop_size")
        _check_data_type(data_type)
        self.data_type = data_type

    def run_transform(self, image: np.ndarray) -> np.ndarray:
        check_image(image, "CenterCrop")
        (h, w), (ch, cw) = image.shape[:2], self.crop_size
        if ch > h or cw > w:
            raise ValueError(f"CenterCrop: crop {ch}x{cw} is larger than the image {h}x{w}")
        top, left = h // 2 - ch // 2, w // 2 - cw // 2
        return _as_data_type(image[top : top + ch, left : left + cw], self.data_type, image)


class Placement(NamedTuple):
    """Where ``PadResize`` puts the scaled image on its canvas."""

    scale: float  # canvas pixels per source pixel
    height: int  # of the scaled image
    width: int
    top: int  # offset of the scaled image on the canvas
    left: int


PAD_POSITIONS = ("boundary", "bottom_right")


class PadResizeTransformer(Transformer):
    """Letterbox: scale to fit inside ``target_size`` keeping the aspect ratio, then pad.

    ``pad_position='boundary'`` centres the image (padding on all sides);
    ``'bottom_right'`` keeps it in the top-left corner, so a point maps back to the
    source by dividing by ``placement(...).scale`` alone. The scaled size is
    ``int(scale * side)``; the result is float32, as the vendor's. ``interpolation``
    as ``ShortSideResizeTransformer``'s: ``''`` (the default) resamples as ``cv2.resize``.
    """

    def __init__(self, target_size: int | Sequence[int], pad_value: float = 127.0,
                 pad_position: str = "boundary", interpolation: str | int = "") -> None:
        self.target_size = size_hw(target_size, "target_size")
        if pad_position not in PAD_POSITIONS:
            raise ValueError(f"pad_position {pad_position!r} is not one of {PAD_POSITIONS}")
        _opencv_kind(interpolation)
        self.pad_value = pad_value
        self.pad_position = pad_position
        self.interpolation = interpolation

    def placement(self, height: int, width: int) -> Placement:
        """Where an image of ``height`` x ``width`` lands on the canvas."""
        th, tw = self.target_size
        scale = min(th / height, tw / width)
        new_h, new_w = max(1, min(th, int(height * scale))), max(1, min(tw, int(width * scale)))
        if self.pad_position == "boundary":
            return Placement(scale, new_h, new_w, (th - new_h) // 2, (tw - new_w) // 2)
        return Placement(scale, new_h, new_w, 0, 0)

    def run_transform(self, image: np.ndarray) -> np.ndarray:
        check_image(image, "PadResize")
        p = self.placement(*image.shape[:2])
        scaled = _resample(image, p.height, p.width, self.interpolation)
        canvas = np.full((*self.target_size, *image.shape[2:]), self.pad_value, dtype=np.float32)
        canvas[p.top : p.top + p.height, p.left : p.left + p.width] = scaled
        return canvas


class TextLineResizeTransformer(Transformer):
    """PaddleOCR's cls/rec ``resize_norm_img`` without the normalisation.

    Scale to the target height keeping the aspect ratio (width rounded up and capped
    at the target width, so long lines get squeezed), then pad on the right with
    ``pad_value``. 128 is the uint8 value nearest to PaddleOCR's padding, which is 0
    after ``(x / 255 - 0.5) / 0.5``.
    """

    def __init__(self, target_size: Sequence[int], pad_value: float = 128,
                 interpolation: str | int = "bilinear") -> None:
        self.target_size = size_hw(target_size, "target_size")
        _order(interpolation)
        self.pad_value = pad_value
        self.interpolation = interpolation

    def run_transform(self, image: np.ndarray) -> np.ndarray:
        check_image(image, "TextLineResize")
        (h, w), (th, tw) = image.shape[:2], self.target_size
        new_w = min(tw, math.ceil(th * w / h))
        canvas = like(np.full((th, tw, *image.shape[2:]), self.pad_value), image)
        canvas[:, :new_w] = resize(image, th, new_w, self.interpolation)
        return canvas


def _crop(image: np.ndarray, top: int, left: int, height: int, width: int) -> np.ndarray:
    return np.ascontiguousarray(image[top : top + height, left : left + width])


class PaddedCenterCropTransformer(Transformer):
    """EfficientNet(-lite)'s evaluation crop: a central square of side
    ``int(image_size / (image_size + crop_pad) * min(H, W))``.

    The crop is then resized to ``image_size`` by the next transformer. The corner is
    ``((H - side + 1) // 2, (W - side + 1) // 2)``, as in the EfficientNet reference code
    this reproduces (an odd margin leaves the extra row at the top). float32 out, as the vendor's.
    """

    def __init__(self, image_size: int = 224, crop_pad: int = 32) -> None:
        self.image_size = size_hw(image_size, "image_size")[0]
        if not isinstance(crop_pad, int | np.integer) or crop_pad < 0:
            raise ValueError(f"crop_pad must be a non-negative int, got {crop_pad!r}")
        self.crop_pad = int(crop_pad)

    def crop_side(self, height: int, width: int) -> int:
        """The side of the square cut from an image of ``height`` x ``width``."""
        return max(1, int(self.image_size / (self.image_size + self.crop_pad) * min(height, width)))

    def run_transform(self, image: np.ndarray) -> np.ndarray:
        check_image(image, "PaddedCenterCrop")
        h, w = image.shape[:2]
        side = self.crop_side(h, w)
        return _crop(image, (h - side + 1) // 2, (w - side + 1) // 2, side, side).astype(np.float32)


class LongSideCropTransformer(Transformer):
    """Trim the longer side (the vendor's MobileNet v1/v2 preprocessing).

    A wide image keeps its central H x H square (left edge at ``(W - H) // 2``). A tall
    image keeps its rows from ``(H - W) // 2`` (where a central square would start) to the
    bottom, ``H - (H - W) // 2`` of them: 70 wide and 100 high gives 85 x 70. float32 out, as the vendor's.
    """

    def run_transform(self, image: np.ndarray) -> np.ndarray:
        check_image(image, "LongSideCrop")
        h, w = image.shape[:2]
        if w > h:
            return _crop(image, 0, (w - h) // 2, h, h).astype(np.float32)
        top = (h - w) // 2
        return _crop(image, top, 0, h - top, w).astype(np.float32)


def resize_by_factor(image: np.ndarray, factor: float) -> np.ndarray:
    """``cv2.resize(image, None, fx=factor, fy=factor)`` (bilinear): each side ``round(side * factor)``,
    sampled with ``1 / factor`` as OpenCV does."""
    h, w = image.shape[:2]
    new_h, new_w = max(1, round(h * factor)), max(1, round(w * factor))
    return opencv_resize(image, new_h, new_w, "linear", factors=(factor, factor))


class ShortLongResizeTransformer(Transformer):
    """Scale keeping the aspect ratio so the shorter side becomes ``short_size``, unless the longer side
    would then round to more than ``long_size``: then the longer side becomes ``long_size``.

    Resampled as ``cv2.resize`` with ``fx = fy = factor`` (bilinear; each side rounded), as the vendor's.
    With ``include_im`` (the default) its ``post_process`` appends ``im_info``, float32 ``[height, width,
    factor]`` of the resized picture, after each result: ``t([image])`` gives ``[resized, im_info]``, and
    ``t(image)`` ``(resized, im_info)``. ``factor(h, w)`` gives the factor, to map detections back;
    ``im_scale`` holds the last one used, as the vendor's attribute.
    """

    def __init__(self, short_size: int, long_size: int, include_im: bool = True) -> None:
        self.short_size = size_hw(short_size, "short_size")[0]
        self.long_size = size_hw(long_size, "long_size")[0]
        self.include_im = include_im
        self.im_scale = 0.0

    def factor(self, height: int, width: int) -> float:
        """Output pixels per input pixel for an image of ``height`` x ``width``."""
        factor = self.short_size / min(height, width)
        # The vendor compares the rounded long side: 1999 wide at 600 / 1199 is 1000.3, which keeps that factor.
        if round(factor * max(height, width)) > self.long_size:
            factor = self.long_size / max(height, width)
        return factor

    def run_transform(self, image: np.ndarray) -> np.ndarray:
        check_image(image, "ShortLongResize")
        self.im_scale = self.factor(*image.shape[:2])
        return resize_by_factor(image, self.im_scale)

    def post_process(self, data_list: list[np.ndarray], data: np.ndarray) -> None:
        if self.include_im:
            data_list.append(np.array([data.shape[0], data.shape[1], self.im_scale], dtype=np.float32))


class PadTransformer(Transformer):
    """Scale so the longer side is ``target_size`` (aspect ratio kept), then pad with zeros on the bottom
    and right up to the next multiples of ``size_divisor``; float32 out, as the vendor's.

    As the vendor's, the picture is resized to the explicit size ``round(W * f)`` x ``round(H * f)``
    (``cv2.resize`` bilinear, sampled with the ratio of the two sizes) and truncated to uint8 (its
    ``astype``) before it goes on the canvas. ``factor(h, w)`` maps boxes back: divide by it.
    """

    def __init__(self, size_divisor: int = 128, target_size: int = 512) -> None:
        self.size_divisor = size_hw(size_divisor, "size_divisor")[0]
        self.target_size = size_hw(target_size, "target_size")[0]

    def factor(self, height: int, width: int) -> float:
        return self.target_size / max(height, width)

    def run_transform(self, image: np.ndarray) -> np.ndarray:
        check_image(image, "Pad")
        h, w = image.shape[:2]
        f = self.factor(h, w)
        # The vendor passes cv2.resize the rounded size, not fx/fy: OpenCV then maps output pixels back with
        # the ratio of the sizes, which differs from 1 / f wherever a side times f is not a whole number.
        h, w = max(1, round(h * f)), max(1, round(w * f))
        scaled = colour.astype_wrapped(opencv_resize(image, h, w, "linear"), np.uint8)
        d = self.size_divisor
        canvas = np.zeros((-(-h // d) * d, -(-w // d) * d, *scaled.shape[2:]), dtype=np.float32)
        canvas[:h, :w] = scaled
        return canvas


class WarpAffineTransformer(Transformer):
    """CenterNet's input warp: the image (HW or HWC), scaled by ``scale`` and centred, with its longer
    side fitted to ``input_shape`` = (height, width) and the rest zero, as the vendor's pipeline gets it
    from ``cv2.warpAffine`` (bilinear, constant border 0; ``opencv_warp_affine``). float32 out."""

    def __init__(self, input_shape: Sequence[int], scale: float) -> None:
        self.input_height, self.input_width = size_hw(input_shape, "input_shape")
        self.scale = float(scale)

    def run_transform(self, image: np.ndarray) -> np.ndarray:
        check_image(image, "warp")
        height, width = image.shape[:2]
        centre = np.array([int(width * self.scale) / 2.0, int(height * self.scale) / 2.0], np.float32)
        forward = get_affine_transform(centre, max(height, width) * 1.0, 0, [self.input_width, self.input_height])
        return opencv_warp_affine(image, forward, self.input_height, self.input_width).astype(np.float32)


def get_dir(src_point: Sequence[float], rot_rad: float) -> list[float]:
    """``src_point`` = (x, y) turned by ``rot_rad`` radians (the vendor's helper of ``get_affine_transform``)."""
    sin, cos = np.sin(rot_rad), np.cos(rot_rad)
    x, y = src_point[0], src_point[1]
    return [x * cos - y * sin, x * sin + y * cos]


def get_3rd_point(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The point that makes ``a``, ``b`` and it a right angle at ``b``: ``b`` plus ``a - b`` turned a quarter
    (float32, as the vendor's)."""
    direction = a - b
    return b + np.array([-direction[1], direction[0]], dtype=np.float32)


def get_affine_transform(center: np.ndarray, scale: float | np.ndarray, rot: float, output_size: Sequence[int],
                         shift: np.ndarray | None = None, inv: int = 0) -> np.ndarray:
    """The vendor's (CenterNet's) affine map, 2x3 float64: the square of side ``scale`` (or ``scale[0]``) around
    ``center``, turned by ``rot`` degrees and moved by ``shift`` times the scale, onto ``output_size`` =
    (width, height), its top edge's centre to the output's width above the output centre; ``inv`` the map
    back. Three float32 point pairs solved as ``cv2.getAffineTransform`` does (no OpenCV needed)."""
    if not isinstance(scale, np.ndarray | list):
        scale = np.array([scale, scale], dtype=np.float32)
    shift = np.array([0, 0], dtype=np.float32) if shift is None else shift
    out_w, out_h = output_size[0], output_size[1]
    src_dir = get_dir([0, scale[0] * -0.5], np.pi * rot / 180)
    dst_dir = np.array([0, out_w * -0.5], np.float32)
    src = np.zeros((3, 2), dtype=np.float32)
    dst = np.zeros((3, 2), dtype=np.float32)
    src[0, :] = center + scale * shift
    src[1, :] = center + src_dir + scale * shift
    dst[0, :] = [out_w * 0.5, out_h * 0.5]
    dst[1, :] = np.array([out_w * 0.5, out_h * 0.5], np.float32) + dst_dir
    src[2:, :] = get_3rd_point(src[0, :], src[1, :])
    dst[2:, :] = get_3rd_point(dst[0, :], dst[1, :])
    return _affine_from_points(dst, src) if inv else _affine_from_points(src, dst)


def _affine_from_points(src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """The 2x3 matrix taking three ``src`` points to ``dst``, bit for bit as ``cv2.getAffineTransform``: its
    six equations (x then y of each point) solved in float64 by OpenCV's own LU elimination (partial
    pivoting, multipliers ``a[j, i] * (-1 / a[i, i])``); LAPACK's solve differs from it in the last bits."""
    a = np.zeros((6, 6))
    b = np.zeros(6)
    for i, ((x, y), (u, v)) in enumerate(zip(src.astype(np.float64), dst.astype(np.float64), strict=True)):
        a[2 * i, :3] = a[2 * i + 1, 3:] = x, y, 1.0
        b[2 * i], b[2 * i + 1] = u, v
    for i in range(6):
        k = i + int(np.argmax(np.abs(a[i:, i])))  # the first largest, as OpenCV's strict '>'
        if k != i:
            a[[i, k], i:], b[[i, k]] = a[[k, i], i:], b[[k, i]]
        d = -1.0 / a[i, i]
        for j in range(i + 1, 6):
            alpha = a[j, i] * d
            a[j, i + 1 :] += alpha * a[i, i + 1 :]
            b[j] += alpha * b[i]
    for i in range(5, -1, -1):
        total = b[i]
        for k in range(i + 1, 6):
            total -= a[i, k] * b[k]
        b[i] = total / a[i, i]
    return b.reshape(2, 3)


# cv2.warpAffine's fixed point: source coordinates in steps of 1 / 2**INTER_BITS, accumulated with
# AB_BITS fraction bits; uint8 results from weights scaled by 2**15.
_INTER_BITS, _AB_BITS, _COEF_BITS = 5, 10, 15


def opencv_warp_affine(image: np.ndarray, forward: np.ndarray, height: int, width: int) -> np.ndarray:
    """``cv2.warpAffine(image, forward, (width, height))`` with INTER_LINEAR and a constant border of 0:
    each output pixel reads the source at the inverse map of its position, rounded to 1/32 pixel as
    OpenCV's fixed point rounds it, and mixes the four neighbours bilinearly (outside ones count as 0)."""
    check_image(image, "warp")
    m = np.asarray(forward, np.float64)
    det = m[0, 0] * m[1, 1] - m[0, 1] * m[1, 0]
    inv_det = 1.0 / det if det else 0.0
    a11, a22 = m[1, 1] * inv_det, m[0, 0] * inv_det
    a12, a21 = -m[0, 1] * inv_det, -m[1, 0] * inv_det
    b1, b2 = -a11 * m[0, 2] - a12 * m[1, 2], -a21 * m[0, 2] - a22 * m[1, 2]
    scale = 1 << _AB_BITS
    rounding = scale >> (_INTER_BITS + 1)
    xs, ys = np.arange(width, dtype=np.float64), np.arange(height, dtype=np.float64)
    # OpenCV rounds each term to the fixed point on its own (cvRound: half to even), then adds them.
    x_fixed = np.rint(a11 * xs * scale).astype(np.int64)[None, :] + \
        (np.rint((a12 * ys + b1) * scale).astype(np.int64) + rounding)[:, None]
    y_fixed = np.rint(a21 * xs * scale).astype(np.int64)[None, :] + \
        (np.rint((a22 * ys + b2) * scale).astype(np.int64) + rounding)[:, None]
    x_fixed >>= _AB_BITS - _INTER_BITS
    y_fixed >>= _AB_BITS - _INTER_BITS
    steps = 1 << _INTER_BITS
    x0, fx = x_fixed >> _INTER_BITS, x_fixed & (steps - 1)
    y0, fy = y_fixed >> _INTER_BITS, y_fixed & (steps - 1)
    src = image if image.ndim == 3 else image[..., None]
    h, w = src.shape[:2]
    integer = image.dtype == np.uint8
    acc = np.zeros((height, width, src.shape[2]), np.int64 if integer else np.float32)
    for dy, wy in ((0, steps - fy), (1, fy)):
        for dx, wx in ((0, steps - fx), (1, fx)):
            yy, xx = y0 + dy, x0 + dx
            inside = (yy >= 0) & (yy < h) & (xx >= 0) & (xx < w)
            values = src[np.clip(yy, 0, h - 1), np.clip(xx, 0, w - 1)] * inside[..., None]
            weight = wy * wx  # in 1/1024ths
            if integer:
                acc += values.astype(np.int64) * (weight << (_COEF_BITS - 2 * _INTER_BITS))[..., None]
            else:
                acc += values.astype(np.float32) * (weight / float(steps * steps)).astype(np.float32)[..., None]
    if integer:
        acc = np.clip((acc + (1 << (_COEF_BITS - 1))) >> _COEF_BITS, 0, 255).astype(np.uint8)
    out = acc if image.ndim == 3 else acc[..., 0]
    return out.astype(image.dtype) if not integer else out
