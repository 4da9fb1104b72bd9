"""Transformers that do what torchvision does on PIL images, for models trained that way.

Pillow's resampling filters are not scikit-image's or OpenCV's (Pillow widens its kernel
when shrinking), so a model trained on ``torchvision.transforms.Resize`` is best fed
pictures resized by Pillow itself.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import PIL.Image

from hbtools.data import colour
from hbtools.data.transforms.base import Transformer, check_image, size_hw

# Filter names -> Pillow's resampling constants (which are also accepted as they are).
PIL_FILTERS = {
    "nearest": PIL.Image.Resampling.NEAREST,
    "bilinear": PIL.Image.Resampling.BILINEAR,
    "bicubic": PIL.Image.Resampling.BICUBIC,
    "lanczos": PIL.Image.Resampling.LANCZOS,
    "box": PIL.Image.Resampling.BOX,
    "hamming": PIL.Image.Resampling.HAMMING,
}


def _pil_filter(interpolation: int | str) -> PIL.Image.Resampling:
    if isinstance(interpolation, str) and interpolation.lower() in PIL_FILTERS:
        return PIL_FILTERS[interpolation.lower()]
    try:
        return PIL.Image.Resampling(interpolation)
    except ValueError:
        raise ValueError(f"interpolation {interpolation!r} is not a Pillow filter "
                         f"(Image.NEAREST, Image.BILINEAR, ...) or one of {sorted(PIL_FILTERS)}") from None


def pil_resize(image: np.ndarray, height: int, width: int, interpolation: int | str = "bilinear") -> np.ndarray:
    """``image`` (HW or HWC) resized by Pillow. uint8 goes through Pillow's 8-bit path (as
    ``Image.fromarray(img).resize``, uint8 out); floats are resized channel by channel as
    32-bit float images and come back as float32."""
    check_image(image, "PILResize")
    resample = _pil_filter(interpolation)
    if image.dtype == np.uint8 and (image.ndim == 2 or image.shape[2] in (3, 4)):
        return np.asarray(PIL.Image.fromarray(image).resize((width, height), resample))
    planes = image[..., None] if image.ndim == 2 else image
    out = np.stack([np.asarray(PIL.Image.fromarray(np.ascontiguousarray(planes[..., c], dtype=np.float32))
                               .resize((width, height), resample)) for c in range(planes.shape[2])], axis=-1)
    return out[..., 0] if image.ndim == 2 else out


class PILResizeTransformer(Transformer):
    """Resize with Pillow as ``torchvision.transforms.Resize(size)`` does on a PIL image.

    ``size`` an int: the shorter side becomes ``size`` and the longer
    ``int(size * long / short)``; ``(height, width)``: exactly that. ``interpolation``: a
    Pillow filter (``Image.BILINEAR``, the default, ``Image.NEAREST``, ``Image.BICUBIC``,
    ``Image.LANCZOS``, ...) or its name.
    """

    def __init__(self, size: int | Sequence[int], interpolation: int | str = PIL.Image.Resampling.BILINEAR) -> None:
        self._short_side = isinstance(size, int | np.integer)
        self.size = size_hw(size, "size")[0] if self._short_side else size_hw(size, "size")
        _pil_filter(interpolation)  # fail at construction, not on the first image
        self.interpolation = interpolation

    def output_hw(self, height: int, width: int) -> tuple[int, int]:
        if not self._short_side:
            return self.size
        s = self.size
        return (s, int(s * width / height)) if height <= width else (int(s * height / width), s)

    def run_transform(self, image: np.ndarray) -> np.ndarray:
        check_image(image, "PILResize")
        return pil_resize(image, *self.output_hw(*image.shape[:2]), self.interpolation)


class PILCenterCropTransformer(Transformer):
    """Cut the central ``size`` = side or (height, width) window the way torchvision's
    ``CenterCrop`` places it: top-left at ``(round((H - h) / 2), round((W - w) / 2))``
    (Python's ``round``, halves to even), one row or column off ``CenterCropTransformer``'s
    ``//`` for some odd margins. As the vendor's (which crops a uint8 Pillow image): the picture truncated
    to uint8 (``astype``), float32 out."""

    def __init__(self, size: int | Sequence[int]) -> None:
        self.size = size_hw(size, "size")

    def run_transform(self, image: np.ndarray) -> np.ndarray:
        check_image(image, "PILCenterCrop")
        (h, w), (ch, cw) = image.shape[:2], self.size
        if ch > h or cw > w:
            raise ValueError(f"PILCenterCrop: crop {ch}x{cw} is larger than the image {h}x{w}")
        top, left = round((h - ch) / 2), round((w - cw) / 2)
        return colour.astype_wrapped(image[top : top + ch, left : left + cw], np.uint8).astype(np.float32)
