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

HEIGHT, WIDTH = 48, 192  # input_shape 1x3x48x192 in ppocr_cls.yaml


def transformers(read_mode: str) -> list[Transformer]:
    """A picture as read -> uint8 BGR 3x48x192, the input before normalisation."""
    return [
        *opencv_like(read_mode),  # PaddleOCR trained on pictures read by OpenCV
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
    for i, crop in enumerate(text_lines()):  # handwriting on a slanted sheet
        yield f"text_{i}_0", crop
        yield f"text_{i}_180", crop[::-1, ::-1]
    for name in NATURAL_RGB[:4]:  # no text at all: the model must cope with these too
        img = bundled(name)
        yield f"{name}_0", img[: img.shape[0] // 4, : img.shape[1] // 2]


def main() -> None:
    args = samples.parse_arguments(__doc__)
    samples.write_calibration(args.out, source_pictures(), lambda png: prepare(png, args.read_mode),
                              f"uint8 BGR 1x3x{HEIGHT}x{WIDTH}")


if __name__ == "__main__":
    main()
