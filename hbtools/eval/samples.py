"""What the scripts in ``samples/`` share: their two arguments, the calibration folders
step 2 writes, and the float / quantized artefact pair step 4 compares.

It lives in the library rather than next to the samples so that a sample folder
copied elsewhere (docs/samples.md suggests it) keeps working from any directory.
What is particular to a model (its preprocessing, its pictures, the meaning of its
outputs) stays in the sample's own ``preprocess.py`` and ``postprocess.py``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

from hbtools.data.transforms import READ_MODES
from hbtools.outputs import write_array
from hbtools.runtime import HB_ONNXRuntime

# makertbin's artefacts step 4 runs. The float one is the float model plus the input
# conversion, so both take the same uint8 input as the calibration data.
ARTEFACTS = {"float": "original_float_model", "quantized": "quantized_model"}


def parse_arguments(doc: str) -> argparse.Namespace:
    """Parse ``--out DIR`` and ``--read_mode``; ``doc`` (the script's docstring) gives
    ``--help`` its description from its first paragraph."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="the sample's output folder")
    parser.add_argument("--read_mode", choices=READ_MODES, default="skimage")
    return parser.parse_args()


def save_png(path: Path, picture: np.ndarray) -> Path:
    import skimage.io

    skimage.io.imsave(path, picture, check_contrast=False)
    return path


def write_calibration(out: Path, pictures: Iterable[tuple[str, np.ndarray]],
                      prepare: Callable[[Path], np.ndarray], what: str) -> int:
    """Save each (name, picture) as ``OUT/calibration_images/NNNN_name.png``, prepare
    that file and write the result to ``OUT/calibration_data/NNNN_name.bin`` with
    ``numpy.tofile``; print and return the count. ``what`` describes one sample.

    Preparing the saved file rather than the array in memory means calibration reads
    pictures exactly the way step 4 and a user's own pictures are read.
    """
    images, data = out / "calibration_images", out / "calibration_data"
    for folder in (images, data):
        shutil.rmtree(folder, ignore_errors=True)  # no stale files from earlier runs
        folder.mkdir(parents=True)
    for i, (name, picture) in enumerate(pictures):
        png = save_png(images / f"{i:04d}_{name}.png", picture)
        write_array(data / f"{png.stem}.bin", prepare(png))
    count = len(list(data.iterdir()))
    print(f"{count} pictures in {images}")
    print(f"{count} calibration samples ({what}) in {data}")
    return count


def built_models(out: Path, model: str) -> dict[str, Path]:
    """``{"float": ..., "quantized": ...}`` artefacts of ``model`` in ``OUT/model_output``;
    exits with an ERROR line when step 3 has not written them."""
    folder = out / "model_output"
    paths = {kind: folder / f"{model}_{suffix}.onnx" for kind, suffix in ARTEFACTS.items()}
    for path in paths.values():
        if not path.is_file():
            sys.exit(f"ERROR {path} is missing; run 03_build.sh first")
    return paths


def open_models(out: Path, model: str) -> dict[str, HB_ONNXRuntime]:
    """Sessions on ``built_models(out, model)``, float first."""
    paths = built_models(out, model)
    return {kind: HB_ONNXRuntime(model_file=str(path)) for kind, path in paths.items()}


def first_output(session: HB_ONNXRuntime, sample: np.ndarray) -> np.ndarray:
    """The first output of a single-input model for one prepared sample."""
    return session.run(None, {session.input_names[0]: sample})[0]


def inference_picture(out: Path, name: str, picture: np.ndarray) -> Path:
    """Save a picture step 4 runs on as ``OUT/inference/NAME.png``."""
    folder = out / "inference"
    folder.mkdir(parents=True, exist_ok=True)
    return save_png(folder / f"{name}.png", picture)


def print_agreement(agree: bool, detail: str = "") -> None:
    """The line every sample ends with; ``detail`` is added in brackets."""
    verdict = "yes" if agree else "no"
    print(f"float and quantized agree: {verdict}" + (f" ({detail})" if detail else ""))
