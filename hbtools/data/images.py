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

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp")


def image_hw(spec: InputSpec) -> tuple[int, int]:
    """Height and width of a 4-D image input."""
    shape = spec.shape or []
    if len(shape) != 4:
        raise HbError(f"input '{spec.name}': image input needs a 4-D shape, got {shape}")
    return (shape[2], shape[3]) if spec.layout_train == "NCHW" else (shape[1], shape[2])


def read_rgb_or_gray(path: Path, what: str = "calibration image") -> np.ndarray:
    """An image file as uint8 HxW (grey) or HxWx3 (RGB; alpha dropped)."""
    try:
        img = skimage.io.imread(path)
    except Exception as e:  # skimage raises many types for unreadable files
        raise HbError(f"cannot read {what} {path}: {e}") from e
    if img.dtype != np.uint8:
        img = skimage.util.img_as_ubyte(img)
    if img.ndim == 3 and img.shape[-1] == 4:
        img = img[..., :3]  # alpha carries no colour
    if img.ndim == 3 and img.shape[-1] == 1:
        img = img[..., 0]
    if img.ndim not in (2, 3) or (img.ndim == 3 and img.shape[-1] != 3):
        raise HbError(f"{what} {path} has unsupported shape {img.shape}")
    return img


def _to_train_type(img: np.ndarray, type_train: str) -> np.ndarray:
    """HWC RGB (or HW gray) float image -> HWC in the train colour space."""
    if type_train == "gray":
        return img[..., None] if img.ndim == 2 else colour.rgb_to_gray(img)
    rgb = np.repeat(img[..., None], 3, axis=-1) if img.ndim == 2 else img
    return colour.convert(rgb, "rgb", type_train)


def load_image(path: Path, spec: InputSpec) -> np.ndarray:
    """One image resized to the input's HxW, in the train colour space, HWC, 0..255 float."""
    img = read_rgb_or_gray(path)
    resized = skimage.transform.resize(img.astype(np.float64), image_hw(spec), preserve_range=True)
    return _to_train_type(resized, spec.type_train)


def load_images(paths: Sequence[Path], spec: InputSpec) -> np.ndarray:
    """One sample (``len(paths)`` = batch) as uint8 in ``layout_train``."""
    batch = np.stack([colour.round_to_uint8(load_image(p, spec)) for p in paths])
    return np.ascontiguousarray(from_channels_last(batch, spec.layout_train))
