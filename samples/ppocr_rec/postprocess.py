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

from preprocess import prepare

from hbtools.data.pictures import page_line
from hbtools.eval import samples
from hbtools.eval.ppocr import ctc_decode, rec_characters


def main() -> None:
    args = samples.parse_arguments(__doc__)
    sessions = samples.open_models(args.out, "ppocr_rec")
    # The dictionary travels in the model's metadata; the artefacts keep it.
    characters = rec_characters(samples.built_models(args.out, "ppocr_rec")["float"])
    agree = 0
    for word in (0, 1):
        picture = page_line(0, first_word=word, words=1)
        png = samples.inference_picture(args.out, f"title_word{word}", picture)
        sample = prepare(png, args.read_mode)
        print(f"{png}:")
        texts = {}
        for kind, session in sessions.items():
            texts[kind] = ctc_decode(samples.first_output(session, sample), characters)[0]
            print(f"  {kind:<9} model reads: {texts[kind]!r}")
        agree += texts["float"] == texts["quantized"]
    samples.print_agreement(agree == 2, f"{agree} of 2 pictures")


if __name__ == "__main__":
    main()
