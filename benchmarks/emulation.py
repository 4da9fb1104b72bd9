"""The emulation contract and accuracy of the PP-OCR models, measured on held-out samples.

For each of cls, det and rec: makertbin with the repository's config and a chosen
``calibration_type``, then per held-out sample (never used for calibration):
cosine(calibrated, quantized) — the emulation contract, which should be 1.0 — and
float vs quantized cosine with the task agreement (same class, same text pixels,
same CTC string). Results: ``benchmarks/results/emulation.{json,md}``.

Set-up as for the tests: ``python scripts/fetch_models.py`` and
``python scripts/make_calibration_data.py --model {cls,det,rec}``.

    python benchmarks/emulation.py [--models cls rec] [--calibration-type default]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

from hbtools.eval import ppocr
from hbtools.log import setup
from hbtools.metrics import cosine_similarity
from hbtools.pipeline.runner import makertbin
from hbtools.runtime import HB_ONNXRuntime

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
SHAPES = {"cls": (1, 3, 48, 192), "det": (1, 3, 640, 640), "rec": (1, 3, 48, 320)}


def _outputs(model_file: Path, samples: list[np.ndarray]) -> list[np.ndarray]:
    sess = HB_ONNXRuntime(model_file=model_file)
    return [sess.run(None, {sess.input_names[0]: x})[0] for x in samples]


def measure(model: str, calibration_type: str, work: Path) -> dict:
    config = yaml.safe_load((ROOT / "configs" / f"ppocr_{model}.yaml").read_text())
    base = ROOT / "configs"
    for section, key in (("model_parameters", "onnx_model"), ("calibration_parameters", "cal_data_dir")):
        config[section][key] = str((base / config[section][key]).resolve())
    config["model_parameters"]["working_dir"] = str(work / model)
    config["calibration_parameters"]["calibration_type"] = calibration_type
    path = work / f"{model}.yaml"
    path.write_text(yaml.safe_dump(config))
    start = time.perf_counter()
    paths = makertbin(path, "onnx")
    wall = time.perf_counter() - start
    files = sorted((ROOT / "build" / "heldout" / f"ppocr_{model}").iterdir())
    samples = [np.fromfile(f, np.uint8).reshape(SHAPES[model]) for f in files]
    outs = {k: _outputs(paths[k], samples) for k in ("original", "calibrated", "quantized")}
    emulation = [cosine_similarity(c, q) for c, q in zip(outs["calibrated"], outs["quantized"], strict=True)]
    chars = ppocr.rec_characters(paths["original"]) if model == "rec" else None
    task = ppocr.compare_outputs(model, outs["original"], outs["quantized"], chars)
    return {"model": model, "calibration_type": calibration_type, "samples": len(samples),
            "makertbin_s": round(wall, 1),
            "emulation_min": float(np.min(emulation)), "emulation_mean": float(np.mean(emulation)),
            "identical_samples": int(sum(np.array_equal(c, q) for c, q in
                                         zip(outs["calibrated"], outs["quantized"], strict=True))),
            "float_quant_mean": task.cosine_mean, "float_quant_min": task.cosine_min,
            "agreement": task.agreement, "iou": task.iou}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--calibration-type", default="default")
    args = parser.parse_args()
    setup(None)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models:
            rows.append(measure(model, args.calibration_type, Path(tmp)))
            print(json.dumps(rows[-1]))
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "emulation.json").write_text(json.dumps(rows, indent=1) + "\n")
    lines = ["| model | calibration | cal vs quant min / mean | identical samples | float vs quant mean / min "
             "| task agreement | makertbin s |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['calibration_type']} | {r['emulation_min']:.6f} / "
                     f"{r['emulation_mean']:.6f} | {r['identical_samples']} of {r['samples']} | "
                     f"{r['float_quant_mean']:.5f} / {r['float_quant_min']:.5f} | {r['agreement']:.3f} | "
                     f"{r['makertbin_s']} |")
    (RESULTS / "emulation.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
