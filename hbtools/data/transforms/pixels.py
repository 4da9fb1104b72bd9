"""Layout, colour and value transformers.

Colour conversions work in the uint8 value domain: scale a skimage float image (0..1)
by 255 first. The YUV, gray and ``*2NV12`` transformers compute what the vendor's
transformers compute (its three-decimal BT.601 coefficients, ``colour.vendor_yuv``; float32
results, NV12 truncated); ``hbtools.data.colour`` stays the toolchain's conversion of
model inputs. ``data_format`` says where the channels are (``'HWC'``, ``'CHW'``,
``'NHWC'``, ``'NCHW'``); ``None`` tells a 3-D image's layout from its shape.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hbtools.data import colour
from hbtools.data.transforms.base import Transformer, channels_last, float_dtype, size_hw

# --------------------------------------------------------------------------- layout


class TransposeTransformer(Transformer):
    """``np.transpose(image, order)``."""

    def __init__(self, order: Sequence[int]) -> None:
        self.order = tuple(order)

    def run_transform(self, image: np.ndarray) -> np.ndarray:
        if len(self.order) != image.ndim:
            raise ValueError(f"transpose order {self.order} does not fit shape {image.shape}")
        return np.ascontiguousarray(np.transpose(image, self.order))


class HWC2CHWTransformer(Transformer):
    """HWC -> CHW (NHWC -> NCHW for a 4-D batch)."""

    def run_transform(self, image: np.ndarray) -> np.ndarray:
        if image.ndim not in (3, 4):
            raise ValueError(f"HWC2CHW needs a 3-D or 4-D image, got shape {image.shape}")
        return np.ascontiguousarray(np.moveaxis(image, -1, -3))


class CHW2HWCTransformer(Transformer):
    """CHW -> HWC (NCHW -> NHWC for a 4-D batch)."""

    def run_transform(self, image: np.ndarray) -> np.ndarray:
        if image.ndim not in (3, 4):
            raise ValueError(f"CHW2HWC needs a 3-D or 4-D image, got shape {image.shape}")
        return np.ascontiguousarray(np.moveaxis(image, -3, -1))


# --------------------------------------------------------------------------- colour


class _ColourTransformer(Transformer):
    """Convert channel-last pixels with ``convert``, in the image's own layout."""

    channels = 3

    def __init__(self, data_format: str | None = None) -> None:
        self.data_format = data_format

    def convert(self, hwc: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def run_transform(self, image: np.ndarray) -> np.ndarray:
        last, axis = channels_last(image, self.data_format)
        if last.shape[-1] != self.channels:
            raise ValueError(f"{type(self).__name__} needs {self.channels} channels, "
                             f"got shape {image.shape} ({self.data_format or 'layout from shape'})")
        return np.ascontiguousarray(np.moveaxis(self.convert(last), -1, axis))


class RGB2BGRTransformer(_ColourTransformer):
    """Swap the first and last channel (RGB -> BGR)."""

    def convert(self, hwc: np.ndarray) -> np.ndarray:
        return colour.rgb_to_bgr(hwc)


class BGR2RGBTransformer(_ColourTransformer):
    """Swap the first and last channel (BGR -> RGB)."""

    def convert(self, hwc: np.ndarray) -> np.ndarray:
        return colour.bgr_to_rgb(hwc)


class _SpaceTransformer(_ColourTransformer):
    """A conversion between colour spaces as the vendor's: ``colour.vendor_yuv`` on the channels in
    ``order`` (R, G, B), ``planes`` planes out, float32, minus ``shift`` (128 for ``*_128``).
    ``space_and_range`` ``'regular'`` (full range) or ``'bt601_video'``."""

    order = (0, 1, 2)
    planes = 3
    shift = 0.0

    def __init__(self, data_format: str | None = None, space_and_range: str = "regular") -> None:
        super().__init__(data_format)
        colour.intermediate_space("yuv444", space_and_range)  # validates the name
        self.space_and_range = space_and_range

    def convert(self, hwc: np.ndarray) -> np.ndarray:
        r, g, b = (hwc[..., i] for i in self.order)
        out = np.stack(colour.vendor_yuv(r, g, b, self.space_and_range, self.planes), axis=-1)
        if self.shift:
            out = out - self.shift
        return out.astype(np.float32)


def rgb2bt601_full_range(r: np.ndarray, g: np.ndarray, b: np.ndarray, single_channel: bool = False):
    """The vendor module's full-range BT.601 of R, G, B planes (``colour.vendor_yuv``): ``(y, u, v)``, or ``y``
    alone with ``single_channel``; unrounded, U and V around 128."""
    planes = colour.vendor_yuv(r, g, b, "regular", 1 if single_channel else 3)
    return planes[0] if single_channel else tuple(planes)


def rgb2bt601_video_range(r: np.ndarray, g: np.ndarray, b: np.ndarray, single_channel: bool = False):
    """As ``rgb2bt601_full_range``, in BT.601 video range (Y from 16)."""
    planes = colour.vendor_yuv(r, g, b, "bt601_video", 1 if single_channel else 3)
    return planes[0] if single_channel else tuple(planes)


class RGB2YUV444Transformer(_SpaceTransformer):
    """RGB -> YUV444 float32, unrounded (the vendor's BT.601 full range; video range with
    ``space_and_range='bt601_video'``)."""


class BGR2YUV444Transformer(_SpaceTransformer):
    """BGR -> YUV444 float32, unrounded (the vendor's BT.601 full range; video range with
    ``space_and_range='bt601_video'``)."""

    order = (2, 1, 0)


class RGB2GRAYTransformer(_SpaceTransformer):
    """RGB -> one luma channel, float32 (the vendor's BT.601 weights)."""

    planes = 1

    def __init__(self, data_format: str | None = None) -> None:
        super().__init__(data_format)


class BGR2GRAYTransformer(RGB2GRAYTransformer):
    """BGR -> one luma channel, float32 (the vendor's BT.601 weights)."""

    order = (2, 1, 0)


class RGB2GRAY_128Transformer(RGB2GRAYTransformer):  # noqa: N801 - vendor name
    """RGB -> luma minus 128 (-128..127), float32."""

    shift = 128.0


class RGB2YUV444_128Transformer(RGB2YUV444Transformer):  # noqa: N801 - vendor name
    """RGB -> YUV444 minus 128 (-128..127), float32."""

    shift = 128.0


class BGR2YUV444_128Transformer(BGR2YUV444Transformer):  # noqa: N801 - vendor name
    """BGR -> YUV444 minus 128 (-128..127), float32."""

    shift = 128.0


class RGB2YUVBT601VIDEOTransformer(RGB2YUV444Transformer):
    """RGB -> YUV444 in BT.601 video range (Y 16..235), as some cameras deliver; float32."""

    def __init__(self, data_format: str | None = None) -> None:
        super().__init__(data_format, space_and_range="bt601_video")


class BGR2YUVBT601VIDEOTransformer(BGR2YUV444Transformer):
    """BGR -> YUV444 in BT.601 video range (Y 16..235), as some cameras deliver; float32."""

    def __init__(self, data_format: str | None = None) -> None:
        super().__init__(data_format, space_and_range="bt601_video")


class YUVTransformer(Transformer):
    """``color_sequence`` (``'RGB'`` or ``'BGR'``, how the picture was read) -> YUV444, float32, as the vendor's:
    the picture cast to uint8 (``astype``), OpenCV's I420 conversion (``colour.rgb_to_nv12_opencv``: BT.601
    video range in fixed point, each chroma sample from its 2x2 block's top-left pixel), each chroma sample
    repeated over its block. Even height and width, as OpenCV's conversion needs. For exact full-range
    BT.601 use ``colour.rgb_to_yuv444``."""

    def __init__(self, color_sequence: str, data_format: str | None = None) -> None:
        if str(color_sequence).upper() not in ("RGB", "BGR"):
            raise ValueError(f"color_sequence {color_sequence!r} is not 'RGB' or 'BGR'")
        self.color_sequence, self.data_format = color_sequence, data_format

    def run_transform(self, image: np.ndarray) -> np.ndarray:
        last, axis = channels_last(image, self.data_format)
        if last.ndim != 3 or last.shape[-1] != 3:
            raise ValueError(f"YUVTransformer needs one 3-channel image, got shape {image.shape}")
        rgb = last if self.color_sequence.upper() == "RGB" else colour.bgr_to_rgb(last)
        nv12 = colour.rgb_to_nv12_opencv(colour.astype_wrapped(rgb, np.uint8))
        yuv = colour.nv12_decode(nv12).astype(np.float32)
        return np.ascontiguousarray(np.moveaxis(yuv, -1, axis))


class ReduceChannelTransformer(Transformer):
    """Keep only the first channel (C becomes 1, e.g. 1x3x224x224 -> 1x1x224x224): grey pictures read
    as three equal channels, or Y of YUV444. ``data_format`` says where C is (None: from the shape)."""

    def __init__(self, data_format: str | None = None) -> None:
        self.data_format = data_format

    def run_transform(self, image: np.ndarray) -> np.ndarray:
        last, axis = channels_last(image, self.data_format)
        return np.ascontiguousarray(np.moveaxis(last[..., :1], -1, axis))


class _NV12Transformer(_SpaceTransformer):
    """RGB/BGR (0..255, even width) -> NV12 bytes, shape (H * 3 // 2, W).

    ``cvt_mode``: ``'rgb_calc'`` / ``'bgr_calc'`` (the default: the vendor's arithmetic, ``colour.vendor_nv12``
    in the range ``space_and_range`` says, each chroma sample from the top-left pixel of its 2x2 block,
    Y, U and V truncated to uint8 as its ``astype``; an odd height gives ``H + (H + 1) // 2`` rows, as the
    vendor's) or ``'opencv'`` (OpenCV's own I420 conversion, which the vendor's scripts call: video range
    in fixed point, chroma of each block's top-left pixel, the image cast to uint8 first; even height
    and width, as OpenCV requires)."""

    source = "rgb"
    CVT_MODES = ("rgb_calc", "bgr_calc", "opencv")

    def __init__(self, data_format: str | None = None, space_and_range: str = "regular",
                 cvt_mode: str = "rgb_calc") -> None:
        super().__init__(data_format, space_and_range)
        if cvt_mode not in self.CVT_MODES:
            raise ValueError(f"cvt_mode {cvt_mode!r} is not one of {', '.join(self.CVT_MODES)}")
        self.cvt_mode = cvt_mode

    def run_transform(self, image: np.ndarray) -> np.ndarray:
        last, _ = channels_last(image, self.data_format)
        if last.ndim != 3 or last.shape[-1] != 3:
            raise ValueError(f"{type(self).__name__} needs one 3-channel image, got shape {image.shape}")
        rgb = last if self.source == "rgb" else colour.bgr_to_rgb(last)
        if self.cvt_mode == "opencv":
            return colour.rgb_to_nv12_opencv(np.asarray(rgb).astype(np.uint8))
        return colour.vendor_nv12(rgb, self.space_and_range)


class RGB2NV12Transformer(_NV12Transformer):
    __doc__ = _NV12Transformer.__doc__
    source = "rgb"


class BGR2NV12Transformer(_NV12Transformer):
    __doc__ = _NV12Transformer.__doc__
    source = "bgr"


class NV12ToYUV444Transformer(Transformer):
    """NV12 bytes -> YUV444 uint8, each chroma sample repeated over its 2x2 block.

    Takes the (H * 3 // 2, W) array the ``*2NV12`` transformers make, or a flat
    buffer when ``target_size`` = (H, W) is given. Output layout
    ``yuv444_output_layout``: ``'CHW'`` (any case) gives CHW; anything else, ``''`` included (what
    the vendor's ``cls_inference.py`` passes by default), gives HWC, as the vendor's.
    """

    def __init__(self, target_size: int | Sequence[int] | None = None,
                 yuv444_output_layout: str = "HWC") -> None:
        self.target_size = None if target_size is None else size_hw(target_size, "target_size")
        self.yuv444_output_layout = "CHW" if str(yuv444_output_layout).upper() == "CHW" else "HWC"

    def run_transform(self, image: np.ndarray) -> np.ndarray:
        if self.target_size is not None:
            h, w = self.target_size
            if image.size != h * w * 3 // 2:
                raise ValueError(f"NV12 of {h}x{w} has {h * w * 3 // 2} bytes, got {image.size}")
            image = image.reshape(h * 3 // 2, w)
        yuv = colour.nv12_decode(image)
        return np.ascontiguousarray(np.moveaxis(yuv, -1, 0)) if self.yuv444_output_layout == "CHW" else yuv


# --------------------------------------------------------------------------- values


def _per_channel(values: float | Sequence[float], image: np.ndarray, data_format: str | None) -> np.ndarray:
    """``values`` shaped to broadcast over ``image``'s channel axis (a scalar over all)."""
    v = np.asarray(values, dtype=np.float64).reshape(-1)
    if v.size == 1:
        return v.reshape(())
    last, axis = channels_last(image, data_format)
    if last.shape[-1] != v.size:
        raise ValueError(f"{v.size} per-channel values for an image with {last.shape[-1]} channels")
    shape = [1] * image.ndim
    shape[axis] = v.size
    return v.reshape(shape)


class ScaleTransformer(Transformer):
    """Multiply by ``scale_value`` (e.g. 255 to take a skimage float image to 0..255), one for all
    channels or one per channel (``data_format`` as for ``MeanTransformer``)."""

    def __init__(self, scale_value: float | Sequence[float], data_format: str | None = None) -> None:
        self.scale_value = scale_value
        self.data_format = data_format

    def run_transform(self, image: np.ndarray) -> np.ndarray:
        dtype = float_dtype(image)
        return image.astype(dtype) * _per_channel(self.scale_value, image, self.data_format).astype(dtype)


class AddTransformer(Transformer):
    """Add ``value`` to every pixel (e.g. -128 to centre 0..255 on zero). Floats out, so a
    uint8 image does not wrap around."""

    def __init__(self, value: float) -> None:
        self.value = value

    def run_transform(self, image: np.ndarray) -> np.ndarray:
        dtype = float_dtype(image)
        return image.astype(dtype) + dtype(self.value)


class MeanTransformer(Transformer):
    """Subtract ``means`` (one per channel, or one for all)."""

    def __init__(self, means: float | Sequence[float], data_format: str | None = None) -> None:
        self.means = means
        self.data_format = data_format

    def run_transform(self, image: np.ndarray) -> np.ndarray:
        dtype = float_dtype(image)
        return image.astype(dtype) - _per_channel(self.means, image, self.data_format).astype(dtype)


class NormalizeTransformer(Transformer):
    """Divide by ``std`` (one per channel, or one for all)."""

    def __init__(self, std: float | Sequence[float], data_format: str | None = None) -> None:
        self.std = std
        self.data_format = data_format

    def run_transform(self, image: np.ndarray) -> np.ndarray:
        dtype = float_dtype(image)
        return image.astype(dtype) / _per_channel(self.std, image, self.data_format).astype(dtype)


class F32ToU8Transformer(Transformer):
    """To uint8 as the vendor's ``data.astype(np.uint8)``: truncated toward zero (127.99 gives 127), values
    outside 0..255 wrapped (``colour.astype_wrapped``). ``rounding=True`` rounds half to even and saturates
    instead, for floats that stand for whole values (a skimage picture times 255 holds 127.99999...)."""

    def __init__(self, rounding: bool = False) -> None:
        self.rounding = rounding

    def run_transform(self, image: np.ndarray) -> np.ndarray:
        if self.rounding:
            return colour.round_to_uint8(image)
        return colour.astype_wrapped(image, np.uint8)


class F32ToS8Transformer(Transformer):
    """To int8 as the vendor's ``data.astype(np.int8)``: truncated toward zero, values outside -128..127
    wrapped; data already on the signed scale (``AddTransformer(-128)``, the ``*_128`` conversions, a signed
    featuremap) keeps its values. ``rounding=True`` rounds half to even and saturates to -128..127."""

    def __init__(self, rounding: bool = False) -> None:
        self.rounding = rounding

    def run_transform(self, image: np.ndarray) -> np.ndarray:
        if self.rounding:
            return np.clip(np.rint(image), -128, 127).astype(np.int8)
        return colour.astype_wrapped(image, np.int8)
