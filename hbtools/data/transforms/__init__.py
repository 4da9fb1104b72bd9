"""Image preprocessing transformers, named as in the vendor's sample package.

Each ``XxxTransformer`` is a small callable configured once and applied per image;
each has a function twin without the suffix taking the image first::

    pipeline = Compose([ShortSideResizeTransformer(short_size=256),
                        CenterCropTransformer(crop_size=224),
                        HWC2CHWTransformer(), RGB2BGRTransformer(data_format="CHW"),
                        ScaleTransformer(scale_value=255), F32ToU8Transformer(rounding=True)])
    sample = pipeline(read_image("cat.jpg"))          # skimage: RGB float 0..1

    image = CenterCrop(ShortSideResize(image, short_size=256), crop_size=224)

Also importable as ``horizon_tc_ui.data.transformer``. See docs/transforms.md.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from hbtools.data.transforms.base import Compose, Transformer
from hbtools.data.transforms.geometry import (
    INTERPOLATION_DICT,
    INTERPOLATIONS,
    CenterCropTransformer,
    LongSideCropTransformer,
    PaddedCenterCropTransformer,
    PadResizeTransformer,
    PadTransformer,
    Placement,
    ResizeTransformer,
    ShortLongResizeTransformer,
    ShortSideResizeTransformer,
    TextLineResizeTransformer,
    WarpAffineTransformer,
    get_3rd_point,
    get_affine_transform,
    get_dir,
)
from hbtools.data.transforms.imread import READ_MODES, opencv_available, opencv_like, read_image
from hbtools.data.transforms.pil import PILCenterCropTransformer, PILResizeTransformer
from hbtools.data.transforms.pixels import (
    AddTransformer,
    BGR2GRAYTransformer,
    BGR2NV12Transformer,
    BGR2RGBTransformer,
    BGR2YUV444_128Transformer,
    BGR2YUV444Transformer,
    BGR2YUVBT601VIDEOTransformer,
    CHW2HWCTransformer,
    F32ToS8Transformer,
    F32ToU8Transformer,
    HWC2CHWTransformer,
    MeanTransformer,
    NormalizeTransformer,
    NV12ToYUV444Transformer,
    ReduceChannelTransformer,
    RGB2BGRTransformer,
    RGB2GRAY_128Transformer,
    RGB2GRAYTransformer,
    RGB2NV12Transformer,
    RGB2YUV444_128Transformer,
    RGB2YUV444Transformer,
    RGB2YUVBT601VIDEOTransformer,
    ScaleTransformer,
    TransposeTransformer,
    YUVTransformer,
    rgb2bt601_full_range,
    rgb2bt601_video_range,
)


def _functional(cls: type[Transformer]) -> Callable[..., np.ndarray]:
    """``Name(image, *args, **kwargs)`` = ``NameTransformer(*args, **kwargs)(image)``."""

    def apply(image: np.ndarray, *args: Any, **kwargs: Any) -> np.ndarray:
        return cls(*args, **kwargs)(image)

    apply.__name__ = apply.__qualname__ = cls.__name__.removesuffix("Transformer")
    apply.__doc__ = f"Function form of ``{cls.__name__}``: {(cls.__doc__ or '').strip()}"
    return apply


Resize = _functional(ResizeTransformer)
ShortSideResize = _functional(ShortSideResizeTransformer)
CenterCrop = _functional(CenterCropTransformer)
PadResize = _functional(PadResizeTransformer)
TextLineResize = _functional(TextLineResizeTransformer)
PaddedCenterCrop = _functional(PaddedCenterCropTransformer)
LongSideCrop = _functional(LongSideCropTransformer)
ShortLongResize = _functional(ShortLongResizeTransformer)
Pad = _functional(PadTransformer)
PILResize = _functional(PILResizeTransformer)
PILCenterCrop = _functional(PILCenterCropTransformer)
Transpose = _functional(TransposeTransformer)
HWC2CHW = _functional(HWC2CHWTransformer)
CHW2HWC = _functional(CHW2HWCTransformer)
RGB2BGR = _functional(RGB2BGRTransformer)
BGR2RGB = _functional(BGR2RGBTransformer)
RGB2YUV444 = _functional(RGB2YUV444Transformer)
BGR2YUV444 = _functional(BGR2YUV444Transformer)
RGB2GRAY = _functional(RGB2GRAYTransformer)
BGR2GRAY = _functional(BGR2GRAYTransformer)
RGB2NV12 = _functional(RGB2NV12Transformer)
BGR2NV12 = _functional(BGR2NV12Transformer)
NV12ToYUV444 = _functional(NV12ToYUV444Transformer)
Scale = _functional(ScaleTransformer)
Add = _functional(AddTransformer)
Mean = _functional(MeanTransformer)
Normalize = _functional(NormalizeTransformer)
F32ToU8 = _functional(F32ToU8Transformer)
F32ToS8 = _functional(F32ToS8Transformer)

__all__ = [
    "WarpAffineTransformer",
    "INTERPOLATION_DICT",
    "get_3rd_point",
    "get_affine_transform",
    "get_dir",
    "rgb2bt601_full_range",
    "rgb2bt601_video_range",
    "RGB2GRAY_128Transformer",
    "RGB2YUV444_128Transformer",
    "BGR2YUV444_128Transformer",
    "RGB2YUVBT601VIDEOTransformer",
    "BGR2YUVBT601VIDEOTransformer",
    "YUVTransformer",
    "ReduceChannelTransformer",
    "INTERPOLATIONS",
    "READ_MODES",
    "BGR2GRAY",
    "BGR2NV12",
    "BGR2RGB",
    "BGR2YUV444",
    "CHW2HWC",
    "HWC2CHW",
    "RGB2BGR",
    "RGB2GRAY",
    "RGB2NV12",
    "RGB2YUV444",
    "Add",
    "AddTransformer",
    "BGR2GRAYTransformer",
    "BGR2NV12Transformer",
    "BGR2RGBTransformer",
    "BGR2YUV444Transformer",
    "CHW2HWCTransformer",
    "CenterCrop",
    "CenterCropTransformer",
    "Compose",
    "F32ToS8",
    "F32ToS8Transformer",
    "F32ToU8",
    "F32ToU8Transformer",
    "HWC2CHWTransformer",
    "LongSideCrop",
    "LongSideCropTransformer",
    "Mean",
    "MeanTransformer",
    "NV12ToYUV444",
    "NV12ToYUV444Transformer",
    "Normalize",
    "NormalizeTransformer",
    "PILCenterCrop",
    "PILCenterCropTransformer",
    "PILResize",
    "PILResizeTransformer",
    "Pad",
    "PadResize",
    "PadResizeTransformer",
    "PadTransformer",
    "PaddedCenterCrop",
    "PaddedCenterCropTransformer",
    "Placement",
    "RGB2BGRTransformer",
    "RGB2GRAYTransformer",
    "RGB2NV12Transformer",
    "RGB2YUV444Transformer",
    "Resize",
    "ResizeTransformer",
    "Scale",
    "ScaleTransformer",
    "ShortLongResize",
    "ShortLongResizeTransformer",
    "ShortSideResize",
    "ShortSideResizeTransformer",
    "TextLineResize",
    "TextLineResizeTransformer",
    "Transformer",
    "Transpose",
    "TransposeTransformer",
    "opencv_available",
    "opencv_like",
    "read_image",
]
