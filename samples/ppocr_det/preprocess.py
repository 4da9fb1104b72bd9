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

import argparse
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import skimage.io

from hbtools.data.pictures import NATURAL_GREY, NATURAL_RGB, bundled
from hbtools.data.transforms import (
    READ_MODES,
    Compose,
    F32ToU8Transformer,
    HWC2CHWTransformer,
    PadResizeTransformer,
    Resize,
    RGB2BGRTransformer,
    ScaleTransformer,
    Transformer,
    read_image,
)

SIZE = 640  # input_shape 1x3x640x640 in ppocr_det.yaml


def letterbox() -> PadResizeTransformer:
    """Scale the picture to fit 640x640 and pad with black on the right and bottom, so
    a point on the input maps back to the picture by dividing by one scale factor."""
    return PadResizeTransformer(target_size=SIZE, pad_value=0, pad_position="bottom_right")


def transformers(read_mode: str) -> list[Transformer]:
    """A picture as read -> uint8 BGR 3x640x640, the input before normalisation."""
    # skimage gives RGB floats in 0..1; OpenCV gives uint8 BGR, as PaddleOCR trained on.
    to_bgr_uint8 = [] if read_mode == "opencv" else [
        ScaleTransformer(scale_value=255),
        F32ToU8Transformer(),
        RGB2BGRTransformer(data_format="HWC"),
    ]
    return [*to_bgr_uint8, letterbox(), HWC2CHWTransformer()]


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
        small = Resize(_rgb(page), (photo.shape[0] // 3, photo.shape[1] // 2))
        y, x = (photo.shape[0] - small.shape[0]) // (i + 2), (photo.shape[1] - small.shape[1]) // 2
        photo[y : y + small.shape[0], x : x + small.shape[1]] = small
        yield f"page_on_{name}", photo
    for name in NATURAL_RGB + NATURAL_GREY[:4]:  # no text at all
        yield name, bundled(name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="the sample's output folder")
    parser.add_argument("--read_mode", choices=READ_MODES, default="skimage")
    args = parser.parse_args()

    images, data = args.out / "calibration_images", args.out / "calibration_data"
    for folder in (images, data):
        shutil.rmtree(folder, ignore_errors=True)  # no stale files from earlier runs
        folder.mkdir(parents=True)
    for i, (name, picture) in enumerate(source_pictures()):
        png = images / f"{i:04d}_{name}.png"
        skimage.io.imsave(png, picture, check_contrast=False)
        prepare(png, args.read_mode).tofile(data / f"{png.stem}.bin")
    count = len(list(data.iterdir()))
    print(f"{count} pictures in {images}")
    print(f"{count} calibration samples (uint8 BGR 1x3x{SIZE}x{SIZE}) in {data}")


if __name__ == "__main__":
    main()
