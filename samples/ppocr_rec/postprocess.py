"""ppocr_rec sample, step 4: read text with the float and the quantized model.

The pictures are the two words of the title of scikit-image's page()
("Region-based" and "segmentation"). Each is saved as a PNG file, prepared exactly
like the calibration data (``preprocess.prepare``) and run through the float model
and the quantized model that 03_build.sh wrote. The output, per column of the
picture, is a softmax over the model's dictionary; greedy CTC decoding
(``hbtools.eval.ppocr.ctc_decode``) turns it into text.

    python postprocess.py --out DIR [--read_mode skimage|opencv]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import skimage.io
from preprocess import prepare

from hbtools.data.pictures import page_line
from hbtools.data.transforms import READ_MODES
from hbtools.eval.ppocr import ctc_decode, rec_characters
from hbtools.runtime import HB_ONNXRuntime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="the sample's output folder")
    parser.add_argument("--read_mode", choices=READ_MODES, default="skimage")
    args = parser.parse_args()

    models = {
        # makertbin's float artefact takes the same uint8 input as the quantized one.
        "float": args.out / "model_output" / "ppocr_rec_original_float_model.onnx",
        "quantized": args.out / "model_output" / "ppocr_rec_quantized_model.onnx",
    }
    for path in models.values():
        if not path.is_file():
            sys.exit(f"ERROR {path} is missing; run 03_build.sh first")
    sessions = {kind: HB_ONNXRuntime(model_file=str(path)) for kind, path in models.items()}
    # The dictionary travels in the model's metadata; the artefacts keep it.
    characters = rec_characters(models["float"])

    pictures = args.out / "inference"
    pictures.mkdir(parents=True, exist_ok=True)
    agree = 0
    for word in (0, 1):
        png = pictures / f"title_word{word}.png"
        skimage.io.imsave(png, page_line(0, first_word=word, words=1), check_contrast=False)
        sample = prepare(png, args.read_mode)
        print(f"{png}:")
        texts = {}
        for kind, session in sessions.items():
            probs = session.run(None, {session.input_names[0]: sample})[0]
            texts[kind] = ctc_decode(probs, characters)[0]
            print(f"  {kind:<9} model reads: {texts[kind]!r}")
        agree += texts["float"] == texts["quantized"]
    verdict = "yes" if agree == 2 else "no"
    print(f"float and quantized agree: {verdict} ({agree} of 2 pictures)")


if __name__ == "__main__":
    main()
