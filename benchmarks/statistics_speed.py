#!/usr/bin/env python
"""Seconds per sample of calibration's statistics on a real model: the onnxruntime run fetching every
tensor, and the binning of those values into the main collector and the two cross-validation folds'
collectors, each binning alone (as before session 53) and together (``statistics.update_together``).

Calibration with ``default`` updates three collectors per sample (the main one and the folds' ones that
do not hold out that sample); binning together bins each tensor once and sums coarser ranges from the
finer counts. Both ways give identical histograms (tests/unit/test_statistics.py).

    python benchmarks/statistics_speed.py --json benchmarks/results/statistics_speed.json \
        --markdown benchmarks/results/statistics_speed.md
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import numpy as np
import onnx
from skimage import data as pictures
from skimage.transform import resize

from hbtools.quant.statistics import StatsCollector, update_together
from hbtools.runtime.session import fetching_session

REPO = Path(__file__).resolve().parent.parent
MODEL = REPO / "build" / "models" / "ch_PP-OCRv4_det_infer.onnx"
FOLDS = 2


def _samples(count: int, size: int) -> list[np.ndarray]:
    """ImageNet-normalised NCHW crops of scikit-image pictures."""
    names = ["astronaut", "coffee", "chelsea", "rocket", "page", "text"]
    mean, std = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])
    out = []
    for k in range(count):
        img = getattr(pictures, names[k % len(names)])()
        img = np.stack([img] * 3, axis=-1) if img.ndim == 2 else img[..., :3]
        x = (resize(img, (size, size), anti_aliasing=True) - mean) / std
        out.append(x.transpose(2, 0, 1)[None].astype(np.float32))
    return out


def measure(model_path: Path, size: int, count: int) -> dict:
    model = onnx.load(model_path)
    tensors = [o for n in model.graph.node for o in n.output if o]
    session = fetching_session(model, tensors)
    name = model.graph.input[0].name
    start = time.perf_counter()
    values = [dict(zip(tensors, session.run(tensors, {name: x}), strict=True)) for x in _samples(count, size)]
    run_s = (time.perf_counter() - start) / count
    elements = sum(v.size for v in values[0].values() if v.dtype == np.float32)
    seconds = {}
    for mode in ("alone", "together"):
        collectors = [StatsCollector(tensors) for _ in range(1 + FOLDS)]
        start = time.perf_counter()
        for index, sample in enumerate(values):
            # every sample but the odd ones is in every collector; an odd one is held out of one fold
            chosen = [c for f, c in enumerate(collectors) if not (index % 2 and f == 1 + (index // 2) % FOLDS)]
            if mode == "alone":
                for c in chosen:
                    c.update(sample)
            else:
                update_together(chosen, sample)
        seconds[mode] = (time.perf_counter() - start) / count
    return {"model": model_path.name, "input": f"{size}x{size}", "samples": count, "tensors": len(tensors),
            "float_elements_per_sample": elements, "ort_run_s": round(run_s, 3),
            "binning_alone_s": round(seconds["alone"], 3), "binning_together_s": round(seconds["together"], 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=MODEL)
    parser.add_argument("--size", type=int, default=640)
    parser.add_argument("--samples", type=int, default=6)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args()
    row = measure(args.model, args.size, args.samples)
    row.update(cpu=platform.processor() or platform.machine(), load=[round(v, 1) for v in os.getloadavg()])
    print(json.dumps(row, indent=1))
    if args.json:
        args.json.write_text(json.dumps(row, indent=1) + "\n")
    if args.markdown:
        args.markdown.write_text(
            "## Calibration statistics: seconds per sample\n\n"
            f"`python benchmarks/statistics_speed.py` on {row['model']} at {row['input']}, {row['samples']} samples, "
            f"load average at the end {row['load']} (shared machine: indicative).\n\n"
            "| tensors | float values per sample | onnxruntime run, every tensor fetched | binning, 3 collectors "
            "each alone | binning, together |\n|--:|--:|--:|--:|--:|\n"
            f"| {row['tensors']} | {row['float_elements_per_sample'] / 1e6:.1f} M | {row['ort_run_s']} s | "
            f"{row['binning_alone_s']} s | {row['binning_together_s']} s |\n")


if __name__ == "__main__":
    main()
