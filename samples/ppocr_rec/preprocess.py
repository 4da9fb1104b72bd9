"""ppocr_rec sample, step 2: calibration data for the text recogniser.

1. Cut source pictures out of images that ship with scikit-image and save them as
   PNG files in OUT/calibration_images/: runs of words from the text lines of
   page(), a few handwritten formula lines and text-free patches. With your own
   model, this folder would hold pictures from its training or validation set.
2. Prepare every PNG like the model's input (``prepare``) and write it to
   OUT/calibration_data/ with numpy.tofile, the format ppocr_rec.yaml expects.

Line 0 of page() (the title) is kept out: 04_inference.sh reads it.

    python preprocess.py --out DIR [--read_mode skimage|opencv]
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from hbtools.data.pictures import NATURAL_RGB, bundled, page_windows, text_lines
from hbtools.data.transforms import (
    Compose,
    HWC2CHWTransformer,
    TextLineResizeTransformer,
    Transformer,
    opencv_like,
    read_image,
)
from hbtools.eval import samples

HEIGHT, WIDTH = 48, 320  # input_shape 1x3x48x320 in ppocr_rec.yaml


def transformers(read_mode: str) -> list[Transformer]:
    """A picture as read -> uint8 BGR 3x48x320, the input before normalisation."""
    return [
        *opencv_like(read_mode),  # PaddleOCR trained on pictures read by OpenCV
        # PaddleOCR's resize_norm_img: height 48 keeping the aspect ratio, mid-grey
        # padding on the right up to width 320; its normalisation is in the model.
        TextLineResizeTransformer(target_size=(HEIGHT, WIDTH), pad_value=128),
        HWC2CHWTransformer(),
    ]


def prepare(path: Path, read_mode: str = "skimage") -> np.ndarray:
    """One picture file -> the model input, uint8 1x3x48x320."""
    return Compose(transformers(read_mode))(read_image(path, read_mode))[None]


def source_pictures() -> Iterator[tuple[str, np.ndarray]]:
    """(name, uint8 picture) pairs; names say what the picture shows."""
    for line in range(1, 7):
        # Long runs of words (up to the input's aspect ratio) and short ones.
        for aspect in (WIDTH / HEIGHT, 4.0):
            for i, crop in enumerate(page_windows(line, max_aspect=aspect)):
                yield f"page{line}_a{aspect:.0f}_{i}", crop
    for i, crop in enumerate(text_lines()):
        yield f"text_{i}", crop
    for name in NATURAL_RGB[:3]:  # no text at all
        img = bundled(name)
        yield name, img[: img.shape[0] // 5, : img.shape[1] // 2]


def main() -> None:
    args = samples.parse_arguments(__doc__)
    samples.write_calibration(args.out, source_pictures(), lambda png: prepare(png, args.read_mode),
                              f"uint8 BGR 1x3x{HEIGHT}x{WIDTH}")


if __name__ == "__main__":
    main()
