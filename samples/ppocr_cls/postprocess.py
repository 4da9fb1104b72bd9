"""ppocr_cls sample, step 4: classify a text line with the float and the quantized model.

The picture is the first word of scikit-image's page() title ("Region-based"),
once upright and once turned by 180 degrees. Both are saved as PNG
files, prepared exactly like the calibration data (``preprocess.prepare``) and run
through the float model and the quantized model that 03_build.sh wrote. The models'
output is a softmax over the labels "0" and "180" degrees.

    python postprocess.py --out DIR [--read_mode skimage|opencv]
"""

from __future__ import annotations

import numpy as np
from preprocess import prepare

from hbtools.data.pictures import page_line
from hbtools.eval import samples
from hbtools.runtime import HB_ONNXRuntime

LABELS = ("0", "180")  # PaddleOCR's cls label_list


def classify(session: HB_ONNXRuntime, sample: np.ndarray) -> tuple[str, float]:
    """Label and score of one prepared sample."""
    probs = samples.first_output(session, sample)[0]
    best = int(np.argmax(probs))
    return LABELS[best], float(probs[best])


def main() -> None:
    args = samples.parse_arguments(__doc__)
    sessions = samples.open_models(args.out, "ppocr_cls")
    line = page_line(0, first_word=0, words=1)  # "Region-based"
    agree = 0
    for expected, picture in (("0", line), ("180", line[::-1, ::-1])):
        png = samples.inference_picture(args.out, f"region_based_{expected}", picture)
        sample = prepare(png, args.read_mode)
        print(f"{png} (turned by {expected} degrees):")
        answers = {}
        for kind, session in sessions.items():
            answers[kind], score = classify(session, sample)
            print(f"  {kind:<9} model: {answers[kind]:>3} degrees (score {score:.3f})")
        agree += answers["float"] == answers["quantized"]
    samples.print_agreement(agree == 2, f"{agree} of 2 pictures")


if __name__ == "__main__":
    main()
