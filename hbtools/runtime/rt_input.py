"""``input_type_rt`` data -> the model's input tensor, as the device's input path does it.

Runtime data per type (``N`` = batch, ``H``/``W`` of the model input):
- nv12: uint8, per frame the ``H x W`` Y plane then ``H/2`` rows of interleaved U, V
  (``N * H * W * 3 / 2`` bytes); chroma is upsampled to yuv444.
- yuv444, rgb, bgr, gray: uint8 in the model input's layout and shape.
- featuremap: the model input's dtype and shape (float32 unless a Quantize was removed).
Image data then becomes the intermediate int8 (``uint8 - 128``); the colour
conversion and normalisation are in the graph (the preprocess convolution).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hbtools.data import colour
from hbtools.data.intermediate import from_channels_last
from hbtools.errors import HbError
from hbtools.runtime.runtime_model import InputDesc


def rt_dtype(desc: InputDesc) -> np.dtype:
    return np.dtype(np.uint8) if desc.is_image else desc.dtype


def rt_shape(desc: InputDesc) -> tuple[int, ...]:
    """Shape of one input's runtime data (nv12: ``N, H * 3 / 2, W``)."""
    if desc.type_rt != "nv12":
        return desc.shape
    h, w = desc.hw
    return (desc.shape[0], h * 3 // 2, w)


def to_model_input(desc: InputDesc, data: np.ndarray) -> np.ndarray:
    """Check one input's runtime data and convert it to the model input tensor."""
    data = np.asarray(data)
    want_dtype, want_shape = rt_dtype(desc), rt_shape(desc)
    if data.dtype != want_dtype:
        raise HbError(f"input '{desc.name}' ({desc.type_rt}) takes {want_dtype} data, got {data.dtype}")
    if data.size != int(np.prod(want_shape)):
        raise HbError(f"input '{desc.name}' ({desc.type_rt}) takes {int(np.prod(want_shape))} values "
                      f"(shape {list(want_shape)}), got {data.size} (shape {list(data.shape)})")
    data = data.reshape(want_shape)
    if not desc.is_image:
        return np.require(data, requirements="C")  # keeps a scalar 0-d (ascontiguousarray makes it [1])
    if desc.type_rt == "nv12":
        data = from_channels_last(colour.nv12_decode(data), desc.layout)
    return np.ascontiguousarray((data.astype(np.int16) - 128).astype(np.int8))


def random_rt_input(desc: InputDesc, rng: np.random.Generator) -> np.ndarray:
    """Random runtime data: uniform bytes for images, standard normal featuremaps."""
    shape = rt_shape(desc)
    if desc.is_image:
        return rng.integers(0, 256, size=shape, dtype=np.uint8)
    if np.issubdtype(desc.dtype, np.integer):
        info = np.iinfo(desc.dtype)
        return rng.integers(max(info.min, -127), min(info.max, 127) + 1, size=shape).astype(desc.dtype)
    return rng.standard_normal(shape).astype(desc.dtype)


IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp")


def load_rt_file(desc: InputDesc, path: str | Path) -> np.ndarray:
    """Runtime data from a file: ``.npy``, an image (converted to ``type_rt``), or raw bytes."""
    path = Path(path)
    if not path.is_file():
        raise HbError(f"input file '{path}' does not exist")
    suffix = path.suffix.lower()
    if suffix == ".npy":
        try:
            return np.load(path, allow_pickle=False)
        except (ValueError, OSError) as e:
            raise HbError(f"'{path}' is not a readable .npy file: {e}") from None
    if suffix in IMAGE_SUFFIXES:
        return image_to_rt(desc, path)
    raw = np.fromfile(path, dtype=rt_dtype(desc))
    expected = int(np.prod(rt_shape(desc)))
    if raw.size != expected:
        raise HbError(f"'{path}' holds {raw.size} {rt_dtype(desc)} values; input '{desc.name}' "
                      f"({desc.type_rt}) takes {expected} ({expected * rt_dtype(desc).itemsize} bytes)")
    return raw.reshape(rt_shape(desc))


def image_to_rt(desc: InputDesc, path: Path) -> np.ndarray:
    """An image file resized to the input and converted to its runtime type, one copy per batch item."""
    import skimage.transform

    from hbtools.data.images import read_rgb_or_gray

    if not desc.is_image:
        raise HbError(f"input '{desc.name}' is a featuremap; give a .npy or raw .bin file, not an image")
    img = read_rgb_or_gray(Path(path), "image")
    if img.ndim == 2:
        img = np.repeat(img[..., None], 3, axis=-1)
    rgb = skimage.transform.resize(img[..., :3].astype(np.float64), desc.hw, preserve_range=True)
    frame = _rgb_to_rt(rgb, desc)
    return np.repeat(frame[None], desc.shape[0], axis=0).reshape(rt_shape(desc))


def _rgb_to_rt(rgb: np.ndarray, desc: InputDesc) -> np.ndarray:
    if desc.type_rt == "nv12":
        return colour.rgb_to_nv12(rgb, desc.space_and_range)
    if desc.type_rt == "gray":
        pixels = colour.rgb_to_gray(rgb)
    elif desc.type_rt == "yuv444":
        pixels = colour.rgb_to_yuv444(rgb, desc.space_and_range)
    else:
        pixels = colour.convert(rgb, "rgb", desc.type_rt)
    return from_channels_last(colour.round_to_uint8(pixels)[None], desc.layout)[0]
