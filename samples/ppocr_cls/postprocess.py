"""ppocr_cls sample, step 4: classify a text line with the float and the quantized model.

The picture is the first word of scikit-image's page() title ("Region-based"),
once upright and once turned by 180 degrees. Both are saved as PNG
files, prepared exactly like the calibration data (``preprocess.prepare``) and run
through the float model and the quantized model that 03_build.sh wrote. The models'
output is a softmax over the labels "0" and "180" degrees.

    python postprocess.py --out DIR [--read_mode skimage|opencv]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import skimage.io
from preprocess import prepare

from hbtools.data.pictures import page_line
from hbtools.data.transforms import READ_MODES
from hbtools.runtime import HB_ONNXRuntime

LABELS = ("0", "180")  # PaddleOCR's cls label_list


def classify(session: HB_ONNXRuntime, sample: np.ndarray) -> tuple[str, float]:
    """Label and score of one prepared sample."""
    probs = session.run(None, {session.input_names[0]: sample})[0][0]
    best = int(np.argmax(probs))
    return LABELS[best], float(probs[best])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="the sample's output folder")
    parser.add_argument("--read_mode", choices=READ_MODES, default="skimage")
    args = parser.parse_args()

    models = {
        # makertbin's float artefact takes the same uint8 input as the quantized one.
        "float": args.out / "model_output" / "ppocr_cls_original_float_model.onnx",
        "quantized": args.out / "model_output" / "ppocr_cls_quantized_model.onnx",
    }
    for path in models.values():
        if not path.is_file():
            sys.exit(f"ERROR {path} is missing; run 03_build.sh first")
    sessions = {kind: HB_ONNXRuntime(model_file=str(path)) for kind, path in models.items()}

    pictures = args.out / "inference"
    pictures.mkdir(parents=True, exist_ok=True)
    line = page_line(0, first_word=0, words=1)  # "Region-based"
    agree = 0
    for expected, picture in (("0", line), ("180", line[::-1, ::-1])):
        png = pictures / f"region_based_{expected}.png"
        skimage.io.imsave(png, picture, check_contrast=False)
        sample = prepare(png, args.read_mode)
        print(f"{png} (turned by {expected} degrees):")
        answers = {}
        for kind, session in sessions.items():
            answers[kind], score = classify(session, sample)
            print(f"  {kind:<9} model: {answers[kind]:>3} degrees (score {score:.3f})")
        agree += answers["float"] == answers["quantized"]
    verdict = "yes" if agree == 2 else "no"
    print(f"float and quantized agree: {verdict} ({agree} of 2 pictures)")


if __name__ == "__main__":
    main()
