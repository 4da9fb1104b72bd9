"""Colour conversions: the single source of every pixel transform in hbtools.

Pixel arrays are channel-last (``..., C``) with values in the uint8 domain
(0..255), computed in float64. Every linear conversion is a 3x3 matrix plus an
offset, ``out = M @ pixel + b``, so calibration-data conversion, the
HzPreprocess op and the ``.bin`` simulator all use the same numbers.

Colour spaces (``Space``):
- ``rgb``, ``bgr``, ``gray``: plain 0..255 values.
- ``yuv444``: BT.601 full range (JFIF): Y 0..255, U/V centred on 128.
- ``yuv444_video``: BT.601 video range: Y 16..235, U/V 16..240.

Two more variants, for the preprocessing transformers that reproduce other tools' own arithmetic
and are not used on model inputs: the vendor sample package's (``vendor_yuv``, ``vendor_nv12``: its
three-decimal coefficients, unrounded or truncated) and OpenCV's (``rgb_to_nv12_opencv``).

``input_space_and_range`` only describes the data the device is fed, so it
selects the intermediate YUV space; a ``yuv444`` train type is always full range.
"""

from __future__ import annotations

import numpy as np

# BT.601 luma weights.
_KR, _KB = 0.299, 0.114
_KG = 1.0 - _KR - _KB

# RGB -> full-range YCbCr (the JFIF definition of BT.601).
_RGB_TO_YUV_FULL = np.array(
    [
        [_KR, _KG, _KB],
        [-0.5 * _KR / (1 - _KB), -0.5 * _KG / (1 - _KB), 0.5],
        [0.5, -0.5 * _KG / (1 - _KR), -0.5 * _KB / (1 - _KR)],
    ]
)
_YUV_OFFSET = np.array([0.0, 128.0, 128.0])
# Video range squeezes luma to 219 steps above 16 and chroma to 224 steps.
_VIDEO_GAIN = np.array([219.0, 224.0, 224.0]) / 255.0
_VIDEO_OFFSET = np.array([16.0, 128.0, 128.0])

_SWAP = np.eye(3)[::-1].copy()  # RGB <-> BGR is its own inverse

# space -> (M, b) taking an RGB pixel into that space.
_FROM_RGB: dict[str, tuple[np.ndarray, np.ndarray]] = {
    "rgb": (np.eye(3), np.zeros(3)),
    "bgr": (_SWAP, np.zeros(3)),
    "yuv444": (_RGB_TO_YUV_FULL, _YUV_OFFSET),
    "yuv444_video": (_VIDEO_GAIN[:, None] * _RGB_TO_YUV_FULL, _VIDEO_OFFSET),
}
SPACES = (*_FROM_RGB, "gray")
SPACE_AND_RANGE = ("regular", "bt601_video")


def _inverse(m: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    mi = np.linalg.inv(m)
    return mi, -mi @ b


_TO_RGB = {space: _inverse(*mb) for space, mb in _FROM_RGB.items()}


def intermediate_space(type_rt: str, space_and_range: str = "regular") -> str:
    """Colour space of the intermediate (``*_128``) data for an ``input_type_rt``."""
    if type_rt in ("nv12", "yuv444"):
        if space_and_range not in SPACE_AND_RANGE:
            raise ValueError(f"unknown input_space_and_range {space_and_range!r}")
        return "yuv444_video" if space_and_range == "bt601_video" else "yuv444"
    if type_rt in ("rgb", "bgr", "gray"):
        return type_rt
    raise ValueError(f"input_type_rt {type_rt!r} has no colour space")


def linear(src: str, dst: str) -> tuple[np.ndarray, np.ndarray]:
    """``(M, b)`` with ``dst_pixel = M @ src_pixel + b``, composed through RGB."""
    if src == "gray" or dst == "gray":
        if src != dst:
            raise ValueError(f"no linear conversion between {src!r} and {dst!r}")
        return np.eye(1), np.zeros(1)
    m1, b1 = _TO_RGB[src]
    m2, b2 = _FROM_RGB[dst]
    return m2 @ m1, m2 @ b1 + b2


def affine_from_intermediate(
    type_rt: str, type_train: str, space_and_range: str = "regular"
) -> tuple[np.ndarray, np.ndarray]:
    """``(M, b)`` taking an intermediate pixel (uint8 domain, i.e. q + 128) to the train space."""
    return linear(intermediate_space(type_rt, space_and_range), type_train)


def affine_to_intermediate(
    type_train: str, type_rt: str, space_and_range: str = "regular"
) -> tuple[np.ndarray, np.ndarray]:
    """``(M, b)`` taking a train-space pixel to the intermediate space (uint8 domain)."""
    return linear(type_train, intermediate_space(type_rt, space_and_range))


def reordering(src: str, dst: str) -> slice | None:
    """The channel order taking ``src`` pixels to ``dst`` when the conversion only reorders channels (RGB <-> BGR,
    or none), else None: whole-number pixels then convert exactly without the float64 matrix products."""
    if src == dst:
        return slice(None)
    return slice(None, None, -1) if {src, dst} == {"rgb", "bgr"} else None


def apply(x: np.ndarray, m: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Apply ``M @ pixel + b`` to every pixel of a channel-last array."""
    return np.asarray(x, dtype=np.float64) @ m.T + b


def convert(x: np.ndarray, src: str, dst: str) -> np.ndarray:
    """Convert channel-last pixels between colour spaces, step by step via RGB."""
    if src == "gray" or dst == "gray":
        if src != dst:
            raise ValueError(f"no conversion between {src!r} and {dst!r}; use rgb_to_gray")
        return np.asarray(x, dtype=np.float64)
    return apply(apply(x, *_TO_RGB[src]), *_FROM_RGB[dst])


def round_to_uint8(x: np.ndarray) -> np.ndarray:
    """Round half to even and saturate to 0..255, as a uint8 array."""
    return np.clip(np.rint(x), 0, 255).astype(np.uint8)


def astype_wrapped(x: np.ndarray, dtype: type) -> np.ndarray:
    """``x.astype(dtype)`` for ``np.uint8`` / ``np.int8`` as numpy computes it on x86, where the vendor's
    ``astype`` calls run: truncated toward zero, then wrapped modulo 256 (200.7 -> -56 in int8, -3.5 -> 253
    in uint8). Written out because numpy leaves casts of out-of-range floats to the platform (and warns);
    NaN, infinities and values beyond the int32 range give 0, as there."""
    if dtype not in (np.uint8, np.int8):
        raise ValueError(f"astype_wrapped casts to uint8 or int8, not {dtype}")
    x = np.asarray(x)
    if x.dtype.kind in "iub":
        wrapped = x.astype(np.int64) & 0xFF
    else:
        whole = np.trunc(np.where(np.isfinite(x), x, 0.0))
        whole = np.where((whole >= -(2.0**31)) & (whole < 2.0**31), whole, 0.0)  # x86 gives INT_MIN: low byte 0
        # fmod keeps the sign: -3.5 -> -3 -> 253 after the second modulo; exact for every float.
        wrapped = np.mod(np.fmod(whole, 256.0), 256.0).astype(np.int64)
    return wrapped.astype(np.uint8).view(np.int8) if dtype is np.int8 else wrapped.astype(np.uint8)


def rgb_to_bgr(x: np.ndarray) -> np.ndarray:
    return np.asarray(x)[..., ::-1]


bgr_to_rgb = rgb_to_bgr


def _yuv_space(space_and_range: str) -> str:
    return intermediate_space("yuv444", space_and_range)


def rgb_to_yuv444(x: np.ndarray, space_and_range: str = "regular") -> np.ndarray:
    return convert(x, "rgb", _yuv_space(space_and_range))


def yuv444_to_rgb(x: np.ndarray, space_and_range: str = "regular") -> np.ndarray:
    return convert(x, _yuv_space(space_and_range), "rgb")


def bgr_to_yuv444(x: np.ndarray, space_and_range: str = "regular") -> np.ndarray:
    return convert(x, "bgr", _yuv_space(space_and_range))


def yuv444_to_bgr(x: np.ndarray, space_and_range: str = "regular") -> np.ndarray:
    return convert(x, _yuv_space(space_and_range), "bgr")


def rgb_to_gray(x: np.ndarray) -> np.ndarray:
    """Luma (BT.601 full range) of channel-last RGB pixels, keeping a 1-channel axis."""
    return apply(x, _RGB_TO_YUV_FULL[:1], np.zeros(1))


def _check_even(h: int, w: int) -> None:
    if h % 2 or w % 2:
        raise ValueError(f"nv12 needs an even height and width, got {h}x{w}")


def nv12_encode(yuv: np.ndarray) -> np.ndarray:
    """YUV444 pixels ``(..., H, W, 3)`` -> NV12 bytes ``(..., H * 3 // 2, W)``.

    The Y plane is followed by one interleaved U, V row per two image rows; each
    chroma sample is the mean of its 2x2 block (taken before rounding).
    """
    yuv = np.asarray(yuv, dtype=np.float64)
    *lead, h, w, _ = yuv.shape
    _check_even(h, w)
    blocks = yuv[..., 1:].reshape(*lead, h // 2, 2, w // 2, 2, 2)
    uv = blocks.mean(axis=(-4, -2)).reshape(*lead, h // 2, w)
    return round_to_uint8(np.concatenate([yuv[..., 0], uv], axis=-2))


def nv12_decode(nv12: np.ndarray) -> np.ndarray:
    """NV12 bytes ``(..., H * 3 // 2, W)`` -> YUV444 uint8 ``(..., H, W, 3)``.

    Chroma is upsampled by repeating each sample over its 2x2 block.
    """
    nv12 = np.asarray(nv12)
    *lead, rows, w = nv12.shape
    h = rows * 2 // 3
    if rows % 3 or h % 2 or w % 2:
        raise ValueError(f"not an nv12 buffer of an even-sized image: shape {nv12.shape}")
    uv = nv12[..., h:, :].reshape(*lead, h // 2, w // 2, 2)
    uv = uv.repeat(2, axis=-3).repeat(2, axis=-2)
    return np.concatenate([nv12[..., :h, :, None], uv], axis=-1).astype(np.uint8)


def rgb_to_nv12(rgb: np.ndarray, space_and_range: str = "regular") -> np.ndarray:
    return nv12_encode(rgb_to_yuv444(rgb, space_and_range))


# The vendor's BT.601 coefficients (three decimals), rows Y, U, V over R, G, B, and offsets.
VENDOR_YUV = {
    "regular": (((0.299, 0.587, 0.114), (-0.169, -0.331, 0.5), (0.5, -0.419, -0.081)), (0.0, 128.0, 128.0)),
    "bt601_video": (((0.257, 0.504, 0.098), (-0.148, -0.291, 0.439), (0.439, -0.368, -0.071)), (16.0, 128.0, 128.0)),
}


def vendor_yuv(r: np.ndarray, g: np.ndarray, b: np.ndarray, space_and_range: str = "regular",
               planes: int = 3) -> list[np.ndarray]:
    """The first ``planes`` of Y, U, V of R, G, B planes as the vendor's transformers compute them:
    ``kr * r + kg * g + kb * b + offset`` in that order, in the planes' own float type (float64 for
    integers), unrounded."""
    rows, offsets = VENDOR_YUV[space_and_range]
    r, g, b = (np.asarray(x) + 0.0 for x in (r, g, b))
    out = []
    for (kr, kg, kb), offset in list(zip(rows, offsets, strict=True))[:planes]:
        plane = kr * r + kg * g + kb * b
        out.append(plane + offset if offset else plane)
    return out


def vendor_nv12(rgb: np.ndarray, space_and_range: str = "regular") -> np.ndarray:
    """RGB ``(H, W, 3)`` (0..255, W even) -> NV12 bytes ``(H + ceil(H / 2), W)`` as the vendor's
    ``rgb2nv12_calc``: ``vendor_yuv`` of every pixel for Y, of each 2x2 block's top-left pixel for U
    and V, truncated toward zero (values outside 0..255 saturate). An odd H is taken, as the vendor's
    takes it (its check refuses only H and W both odd): the last row of chroma comes from the last row
    alone. An odd W is refused, where the vendor's fails stacking its planes."""
    h, w, _ = rgb.shape
    if w % 2:
        raise ValueError(f"nv12 needs an even width, got {h}x{w}")
    y, u, v = vendor_yuv(rgb[..., 0], rgb[..., 1], rgb[..., 2], space_and_range)
    uv = np.stack([u[::2, ::2], v[::2, ::2]], axis=-1).reshape(-(-h // 2), w)
    return np.clip(np.concatenate([y, uv], axis=0), 0, 255).astype(np.uint8)


# OpenCV's RGB -> YUV 4:2:0 (BT.601 video range) in 20-bit fixed point: rows R, G, B -> Y, U, V.
_OPENCV_YUV420 = np.array([[269484, 528482, 102760], [-155188, -305135, 460324], [460324, -385875, -74448]],
                          dtype=np.int64)
_OPENCV_SHIFT = 20


def rgb_to_nv12_opencv(rgb: np.ndarray) -> np.ndarray:
    """uint8 RGB ``(H, W, 3)`` -> NV12 bytes ``(H * 3 // 2, W)`` as OpenCV's ``COLOR_RGB2YUV_I420``
    computes them (its integer arithmetic; each chroma sample from the top-left pixel of its 2x2
    block), interleaved as NV12."""
    rgb = np.asarray(rgb, dtype=np.int64)
    h, w, _ = rgb.shape
    _check_even(h, w)
    half = 1 << (_OPENCV_SHIFT - 1)
    y = (rgb @ _OPENCV_YUV420[0] + half + (16 << _OPENCV_SHIFT)) >> _OPENCV_SHIFT
    corner = rgb[::2, ::2]
    uv = (corner @ _OPENCV_YUV420[1:].T + half + (128 << _OPENCV_SHIFT)) >> _OPENCV_SHIFT
    planes = np.concatenate([y, uv.reshape(h // 2, w)], axis=0)
    return np.clip(planes, 0, 255).astype(np.uint8)


def nv12_to_rgb(nv12: np.ndarray, space_and_range: str = "regular") -> np.ndarray:
    return yuv444_to_rgb(nv12_decode(nv12), space_and_range)
