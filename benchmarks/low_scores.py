"""How well a detector's quantized class scores keep their small values (a mAP evaluation keeps
detections down to a score of 0.001), per score band, against the float model.

    python benchmarks/low_scores.py FLOAT.onnx SAMPLES_DIR QUANTIZED.onnx [QUANTIZED.onnx ...] [--first-score N]
    python benchmarks/low_scores.py FLOAT.onnx zoo:N QUANTIZED.onnx ...   # the zoo's first N held-out pictures

SAMPLES_DIR holds uint8 NCHW ``.bin`` samples (a makertbin calibration folder); ``zoo:N`` makes the
held-out pictures ``benchmarks/zoo.py --heldout-num N`` scores a detector on. The float model is fed
them as the tools' original float model is (``input_offset=128``). The output is ``[1, C, anchors]``
with the class scores from channel ``--first-score`` on (YOLOv8: 4).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from hbtools.runtime import HB_ONNXRuntime

BANDS = ((0.001, 0.01), (0.01, 0.1), (0.1, 1.0))
NEAR = (0.2, 0.3)  # around the 0.25 at which the zoo counts a detection: a bias there changes the count


def scores(session: HB_ONNXRuntime, samples: list[np.ndarray], first: int, offset: int | None) -> np.ndarray:
    spec = session.get_inputs()[0]
    out = []
    for x in samples:
        feed = {spec.name: x if list(spec.shape)[1] == x.shape[1] else x.transpose(0, 2, 3, 1)}
        got = session.run(None, feed, input_offset=offset) if offset is not None else session.run(None, feed)
        out.append(got[0][:, first:].ravel())
    return np.concatenate(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("float_model")
    parser.add_argument("samples")
    parser.add_argument("quantized", nargs="+")
    parser.add_argument("--first-score", type=int, default=4)
    args = parser.parse_args()
    reference = HB_ONNXRuntime(model_file=args.float_model)
    shape = [d if isinstance(d, int) else 1 for d in reference.get_inputs()[0].shape]
    if args.samples.startswith("zoo:"):
        import compare_ort

        split = compare_ort.sample_generator()("detect", 1, int(args.samples[4:]), size=tuple(shape[2:]), rgb=True)
        samples = [arr for _, arr in split["heldout"]]
    else:
        samples = [np.fromfile(f, np.uint8).reshape(shape) for f in sorted(Path(args.samples).glob("*.bin"))]
    want = scores(reference, samples, args.first_score, 128)
    print(f"{len(samples)} samples\n")
    print("| quantized model | scores | count | read 0 | relative error median | p95 | mean signed error |")
    print("|---|---|--:|--:|--:|--:|--:|")
    for path in args.quantized:
        got = scores(HB_ONNXRuntime(model_file=path), samples, args.first_score, None)
        for low, high in (*BANDS, NEAR):
            band = (want >= low) & (want < high)
            error = np.abs(got[band] - want[band]) / want[band]
            print(f"| {path} | {low}..{high} | {band.sum()} | {(got[band] == 0).mean():.3f} | "
                  f"{np.median(error):.4f} | {np.percentile(error, 95):.4f} | {np.mean(got[band] - want[band]):+.4f} |")


if __name__ == "__main__":
    main()
