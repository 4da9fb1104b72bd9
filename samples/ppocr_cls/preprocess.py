"""ppocr_cls sample, step 2: calibration data for the text-direction classifier.

1. Cut source pictures out of images that ship with scikit-image and save them as
   PNG files in OUT/calibration_images/: text lines of page() upright and turned by
   180 degrees (the two classes), a few handwriting and text-free patches. With your
   own model, this folder would hold pictures from its training or validation set.
2. Prepare every PNG like the model's input (``prepare``) and write it to
   OUT/calibration_data/ with numpy.tofile, the format ppocr_cls.yaml expects.

Line 0 of page() (the title) is kept out: 04_inference.sh classifies its first word.

    python preprocess.py --out DIR [--read_mode skimage|opencv]
"""

from __future__ import annotations

import argparse
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import skimage.io

from hbtools.data.pictures import NATURAL_RGB, bundled, page_windows
from hbtools.data.transforms import (
    READ_MODES,
    Compose,
    F32ToU8Transformer,
    HWC2CHWTransformer,
    RGB2BGRTransformer,
    ScaleTransformer,
    TextLineResizeTransformer,
    Transformer,
    read_image,
)

HEIGHT, WIDTH = 48, 192  # input_shape 1x3x48x192 in ppocr_cls.yaml
# (top, bottom, left, right) of handwritten formula lines in skimage's text() picture.
TEXT_BOXES = ((20, 62, 95, 290), (55, 100, 0, 170), (0, 32, 140, 320), (110, 165, 40, 260))


def transformers(read_mode: str) -> list[Transformer]:
    """A picture as read -> uint8 BGR 3x48x192, the input before normalisation."""
    # skimage gives RGB floats in 0..1; OpenCV gives uint8 BGR, as PaddleOCR trained on.
    to_bgr_uint8 = [] if read_mode == "opencv" else [
        ScaleTransformer(scale_value=255),
        F32ToU8Transformer(),
        RGB2BGRTransformer(data_format="HWC"),
    ]
    return [
        *to_bgr_uint8,
        # PaddleOCR's resize_norm_img: height 48 keeping the aspect ratio, mid-grey
        # padding on the right up to width 192; its normalisation is in the model.
        TextLineResizeTransformer(target_size=(HEIGHT, WIDTH), pad_value=128),
        HWC2CHWTransformer(),
    ]


def prepare(path: Path, read_mode: str = "skimage") -> np.ndarray:
    """One picture file -> the model input, uint8 1x3x48x192."""
    return Compose(transformers(read_mode))(read_image(path, read_mode))[None]


def source_pictures() -> Iterator[tuple[str, np.ndarray]]:
    """(name, uint8 picture) pairs; names say what the picture shows."""
    for line in range(1, 7):
        for i, crop in enumerate(page_windows(line, max_aspect=WIDTH / HEIGHT)):
            yield f"page{line}_{i}_0", crop
            yield f"page{line}_{i}_180", crop[::-1, ::-1]
    text = bundled("text")  # handwriting on a slanted sheet
    for i, (y0, y1, x0, x1) in enumerate(TEXT_BOXES):
        crop = text[y0:y1, x0:x1]
        yield f"text_{i}_0", crop
        yield f"text_{i}_180", crop[::-1, ::-1]
    for name in NATURAL_RGB[:4]:  # no text at all: the model must cope with these too
        img = bundled(name)
        yield f"{name}_0", img[: img.shape[0] // 4, : img.shape[1] // 2]


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
    print(f"{count} calibration samples (uint8 BGR 1x3x{HEIGHT}x{WIDTH}) in {data}")


if __name__ == "__main__":
    main()
