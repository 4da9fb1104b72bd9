"""Image files -> ``input_type_train`` samples, for ``preprocess_on: True``."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import skimage.io
import skimage.transform
import skimage.util

from hbtools.config.model import InputSpec
from hbtools.data import colour
from hbtools.data.intermediate import from_channels_last
from hbtools.errors import HbError

# What Pillow reads, as OpenCV (the vendor tools' reader) does: TIFF and WebP pictures too.
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp")


def image_hw(spec: InputSpec) -> tuple[int, int]:
    """Height and width of a 4-D image input."""
    shape = spec.shape or []
    if len(shape) != 4:
        raise HbError(f"input '{spec.name}': image input needs a 4-D shape, got {shape}")
    return (shape[2], shape[3]) if spec.layout_train == "NCHW" else (shape[1], shape[2])


# Pillow modes whose pixels become grey or RGB through Pillow's own conversion: it drops alpha, resolves
# palettes and turns CMYK/YCbCr/LAB into RGB, where taking the first channels as RGB would give wrong colours.
_PIL_GREY = {"1", "L", "LA", "La"}
_PIL_RGB = {"P", "PA", "RGB", "RGBA", "RGBa", "RGBX", "CMYK", "YCbCr", "LAB", "HSV"}


def read_rgb_or_gray(path: Path, what: str = "calibration image") -> np.ndarray:
    """An image file as uint8 HxW (grey) or HxWx3 (RGB; alpha dropped, CMYK and palettes converted)."""
    import PIL.Image

    try:
        with PIL.Image.open(path) as im:
            if im.mode in _PIL_GREY:
                img = np.asarray(im.convert("L"))
            elif im.mode in _PIL_RGB:
                img = np.asarray(im.convert("RGB"))
            else:  # 16-bit and float images: skimage scales them to 0..255 below
                img = skimage.io.imread(path)
    except Exception as e:  # Pillow and skimage raise many types for unreadable files
        # Their messages suggest installing imageio plugins, which is no fix for a damaged file.
        path = Path(path)
        reason = ("no such file" if not path.is_file() else "the file is empty" if path.stat().st_size == 0
                  else "the file is damaged or not an image")
        raise HbError(f"cannot read {what} {path}: {reason} ({type(e).__name__}); replace or remove it") from e
    if img.dtype != np.uint8:
        img = skimage.util.img_as_ubyte(img)
    if img.ndim == 3 and img.shape[-1] in (2, 4):
        img = img[..., :-1]  # alpha carries no colour
    if img.ndim == 3 and img.shape[-1] == 1:
        img = img[..., 0]
    if img.ndim not in (2, 3) or (img.ndim == 3 and img.shape[-1] != 3):
        raise HbError(f"{what} {path} has unsupported shape {img.shape}; give a grey, RGB or RGBA picture")
    return img


def _to_train_type(img: np.ndarray, type_train: str) -> np.ndarray:
    """HWC RGB (or HW gray) float image -> HWC in the train colour space."""
    if type_train == "gray":
        return img[..., None] if img.ndim == 2 else colour.rgb_to_gray(img)
    rgb = np.repeat(img[..., None], 3, axis=-1) if img.ndim == 2 else img
    return colour.convert(rgb, "rgb", type_train)


def load_image(path: Path, spec: InputSpec, what: str = "calibration image") -> np.ndarray:
    """One image resized to the input's HxW, in the train colour space, HWC, 0..255 float (``what``: the
    file's role, as messages name it)."""
    img = read_rgb_or_gray(path, what)
    resized = skimage.transform.resize(img.astype(np.float64), image_hw(spec), preserve_range=True)
    return _to_train_type(resized, spec.type_train)


def load_images(paths: Sequence[Path], spec: InputSpec, what: str = "calibration image") -> np.ndarray:
    """One sample (``len(paths)`` = batch) as uint8 in ``layout_train``."""
    batch = np.stack([colour.round_to_uint8(load_image(p, spec, what)) for p in paths])
    return np.ascontiguousarray(from_channels_last(batch, spec.layout_train))
