"""ppocr_det sample, step 2: calibration data for the text detector.

1. Make source pictures from images that ship with scikit-image and save them as
   PNG files in OUT/calibration_images/: parts of the printed page(), the
   handwritten text(), pages pasted onto photos, and photos without any text. With
   your own model, this folder would hold pictures from its training or validation
   set.
2. Prepare every PNG like the model's input (``prepare``) and write it to
   OUT/calibration_data/ with numpy.tofile, the format ppocr_det.yaml expects.

The whole page() is kept out: 04_inference.sh finds the text on it.

    python preprocess.py --out DIR [--read_mode skimage|opencv]
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from hbtools.data.pictures import NATURAL_GREY, NATURAL_RGB, bundled
from hbtools.data.transforms import (
    Compose,
    F32ToU8Transformer,
    HWC2CHWTransformer,
    PadResizeTransformer,
    Transformer,
    opencv_like,
    read_image,
)
from hbtools.data.transforms.geometry import resize
from hbtools.eval import samples

SIZE = 640  # input_shape 1x3x640x640 in ppocr_det.yaml


def letterbox() -> PadResizeTransformer:
    """Scale the picture to fit 640x640 and pad with black on the right and bottom, so
    a point on the input maps back to the picture by dividing by one scale factor.
    Resampled by scikit-image ('bilinear'); the canvas is float32, as the vendor's."""
    return PadResizeTransformer(target_size=SIZE, pad_value=0, pad_position="bottom_right", interpolation="bilinear")


def transformers(read_mode: str) -> list[Transformer]:
    """A picture as read -> uint8 BGR 3x640x640, the input before normalisation."""
    # PaddleOCR trained on pictures read by OpenCV: uint8 BGR.
    return [*opencv_like(read_mode), letterbox(), F32ToU8Transformer(rounding=True), HWC2CHWTransformer()]


def prepare(path: Path, read_mode: str = "skimage") -> np.ndarray:
    """One picture file -> the model input, uint8 1x3x640x640."""
    return Compose(transformers(read_mode))(read_image(path, read_mode))[None]


def _rgb(img: np.ndarray) -> np.ndarray:
    return np.repeat(img[..., None], 3, axis=-1) if img.ndim == 2 else img


def source_pictures() -> Iterator[tuple[str, np.ndarray]]:
    """(name, uint8 picture) pairs; names say what the picture shows."""
    rng = np.random.default_rng(640)
    page, text = bundled("page"), bundled("text")
    for i in range(5):  # parts of the page: fewer, larger letters after the letterbox
        h, w = int(page.shape[0] * rng.uniform(0.5, 0.8)), int(page.shape[1] * rng.uniform(0.5, 0.8))
        y, x = rng.integers(0, page.shape[0] - h), rng.integers(0, page.shape[1] - w)
        yield f"page_part{i}", page[y : y + h, x : x + w]
    yield "page_tiled", np.tile(page, (2, 2))  # many small lines
    yield "text", text
    yield "text_part", text[:, : text.shape[1] // 2]
    for i, name in enumerate(NATURAL_RGB[:3]):  # a page lying on a photo
        photo = _rgb(bundled(name)).copy()
        small = resize(_rgb(page), photo.shape[0] // 3, photo.shape[1] // 2)
        y, x = (photo.shape[0] - small.shape[0]) // (i + 2), (photo.shape[1] - small.shape[1]) // 2
        photo[y : y + small.shape[0], x : x + small.shape[1]] = small
        yield f"page_on_{name}", photo
    for name in NATURAL_RGB + NATURAL_GREY[:4]:  # no text at all
        yield name, bundled(name)


def main() -> None:
    args = samples.parse_arguments(__doc__)
    samples.write_calibration(args.out, source_pictures(), lambda png: prepare(png, args.read_mode),
                              f"uint8 BGR 1x3x{SIZE}x{SIZE}")


if __name__ == "__main__":
    main()
