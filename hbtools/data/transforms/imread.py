"""Reading image files the two ways the vendor samples do (``read_mode``).

- ``'skimage'`` (default): RGB, float64 in 0..1 (``skimage.img_as_float``).
- ``'opencv'``: BGR, uint8 in 0..255 (``cv2.imread``); needs OpenCV, which hbtools
  does not depend on (``pip install opencv-python-headless``).

Both give three channels: grey images are repeated, alpha is dropped.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import skimage.util

from hbtools.data.images import read_rgb_or_gray
from hbtools.data.transforms.base import Transformer
from hbtools.data.transforms.pixels import F32ToU8Transformer, RGB2BGRTransformer, ScaleTransformer
from hbtools.errors import HbError

READ_MODES = ("skimage", "opencv")


def opencv_available() -> bool:
    try:
        import cv2  # noqa: F401
    except ImportError:
        return False
    return True


def read_image(path: str | Path, read_mode: str = "skimage") -> np.ndarray:
    """One image file as HxWx3: float RGB 0..1 (skimage) or uint8 BGR (opencv)."""
    path = Path(path)
    if read_mode == "skimage":
        img = read_rgb_or_gray(path, "image")
        if img.ndim == 2:
            img = np.repeat(img[..., None], 3, axis=-1)
        return skimage.util.img_as_float(img)
    if read_mode == "opencv":
        return _read_opencv(path)
    raise HbError(f"read_mode {read_mode!r} is not one of {READ_MODES}")


def opencv_like(read_mode: str = "skimage") -> list[Transformer]:
    """Transformers that turn ``read_image(path, read_mode)`` into what ``cv2.imread``
    returns (uint8 BGR HWC): scale, round and swap for ``'skimage'``, none for ``'opencv'``.

    Models trained with OpenCV-read pictures (PaddleOCR, most detectors) start their
    preprocessing from there, whichever way the file was read.
    """
    if read_mode not in READ_MODES:
        raise HbError(f"read_mode {read_mode!r} is not one of {READ_MODES}")
    if read_mode == "opencv":
        return []
    # Rounded: img_as_float(uint8) * 255 is 127.99999... where the file holds 128.
    return [ScaleTransformer(scale_value=255), F32ToU8Transformer(rounding=True), RGB2BGRTransformer(data_format="HWC")]


def _read_opencv(path: Path) -> np.ndarray:
    try:
        import cv2
    except ImportError as e:
        raise HbError(
            "read_mode 'opencv' needs OpenCV, which is not installed",
            hint="pip install opencv-python-headless, or use read_mode 'skimage'",
        ) from e
    img = cv2.imread(str(path), cv2.IMREAD_COLOR)  # always 3 channels, BGR, uint8
    if img is None:
        raise HbError(f"cannot read image {path} (missing, or not an image OpenCV decodes)")
    return img
