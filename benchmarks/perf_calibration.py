#!/usr/bin/env python
"""Calibrate hb_perf's cost model against public figures and write the table of docs/hb_perf.md.

A public point is a network, a march, an input size and what the vendor published: the latency / DDR
bytes its compiler printed (``FPS=..., latency = ... us, DDR = ... bytes``: the same static estimate
hb_perf makes) or a board throughput (FPS with several threads, read as 1 / FPS of BPU time per frame).
The networks are rebuilt with onnx.helper (tests/arch_builders.py: real structure and shapes, random
weights) or taken from the model corpus (scripts/fetch_models.py --zoo), converted with makertbin (the
point's input type, ``max`` calibration on one random picture) and estimated by hbtools.tools.perf_model.

    python benchmarks/perf_calibration.py          # table with the committed constants
    python benchmarks/perf_calibration.py --fit    # also the constants that fit the points best

Fitting: bayes-e's four constants on its "fit" compile logs (least squares on log(modelled / public):
``on_chip_bytes`` from the DDR bytes, then the latency constants on a grid); bernoulli2's compute
rates as one factor on bayes-e's, from the X3 / X5 throughput ratio of the same network. "check" rows
are not fitted: they show how the model does on figures it did not see.
Writes benchmarks/results/perf_calibration.{json,md}.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import logging
import math
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "scripts")]

import arch_builders  # noqa: E402
from builders import FloatModel, make_project  # noqa: E402
from fetch_models import zoo_paths  # noqa: E402

from hbtools.log import setup  # noqa: E402
from hbtools.march.profiles import get_profile  # noqa: E402
from hbtools.pipeline.runner import makertbin  # noqa: E402
from hbtools.runtime.runtime_model import RuntimeModel, open_model  # noqa: E402
from hbtools.tools import perf_model  # noqa: E402
from hbtools.tools.perf_model import CostConstants  # noqa: E402

REPO = "https://github.com/D-Robotics/rdk_model_zoo/blob/"
LOGS = REPO + "be4f89b/samples/vision/ultralytics_yolo/source/reference_logs/"
OCR = REPO + "be4f89b/samples/vision/PaddleOCR/README.md"


@dataclasses.dataclass(frozen=True)
class Point:
    network: str  # tests/arch_builders.NETWORKS or a corpus model (scripts/fetch_models.py --zoo)
    march: str
    size: int
    latency_us: float
    ddr_bytes: int | None  # None: not published
    source: str
    kind: str = "compile log"  # or "board FPS"
    use: str = "fit"  # or "check"
    input_type_rt: str = "nv12"


POINTS = [
    Point("yolov8n", "bayes-e", 640, 3964.1, 12651904, LOGS + "hb_mapper_log_yolov8n.txt"),
    Point("yolov8n", "bayes-e", 640, 3835.1, 14293568, REPO + "640027d/demos/detect/YOLOv8/README_cn.md",
          input_type_rt="rgb"),
    Point("yolov5nu", "bayes-e", 640, 3320.5, 11696480, LOGS + "hb_mapper_log_yolov5nu.txt"),
    Point("yolov8n_cls", "bayes-e", 224, 495.4, 2682784, LOGS + "hb_mapper_log_yolov8n_cls.txt"),
    Point("yolov5n", "bayes-e", 640, 3461.4, 16197440, REPO + "be4f89b/samples/vision/yolov5/README.md",
          use="check"),
    Point("ppocrv3_det", "bayes-e", 640, 1e6 / 158.12, None, OCR, kind="board FPS", use="check"),
    Point("ppocrv3_det", "bernoulli2", 640, 1e6 / 41.96, None, OCR, kind="board FPS"),
]


def float_model(network: str, size: int) -> FloatModel:
    if network in arch_builders.NETWORKS:
        return arch_builders.NETWORKS[network](size)
    model = onnx.load(str(zoo_paths()[network]))
    return FloatModel(model, {model.graph.input[0].name: [1, 3, size, size]})


def build(pt: Point, work: Path) -> RuntimeModel:
    root = work / f"{pt.network}_{pt.march}_{pt.size}_{pt.input_type_rt}"
    bin_path = root / "model_output" / f"{pt.network}.bin"
    if not bin_path.exists():
        project = make_project(root, float_model(pt.network, pt.size), march=pt.march, cal_count=1)
        project.write(input_parameters={"input_type_rt": pt.input_type_rt},
                      model_parameters={"output_model_file_prefix": pt.network})
        makertbin(project.config_path, "onnx")
    return open_model(bin_path)


ON_CHIP = [k << 17 for k in range(2, 25)]  # 256 KiB to 3 MiB


@dataclasses.dataclass
class Parts:
    """Per layer, the model's pieces at unit constants, so the fit need not re-run the estimate."""

    mac_ms: np.ndarray  # compute at mac_efficiency 1
    vector_ms: np.ndarray  # compute at vector_share 1
    memory_ms: dict[int, np.ndarray]  # per on_chip_bytes candidate
    ddr: dict[int, int]

    def latency_ms(self, k: CostConstants) -> float:
        compute = self.mac_ms / k.mac_efficiency + self.vector_ms / k.vector_share
        return float(np.maximum(compute, self.memory_ms[k.on_chip_bytes]).sum() + len(compute) * k.layer_overhead_ms)


def parts(rm: RuntimeModel, march: str) -> Parts:
    profile = get_profile(march)
    memory, ddr = {}, {}
    for size in ON_CHIP:
        cost = perf_model.estimate(rm, profile, constants=CostConstants(1.0, 1.0, 0.0, size))
        layers = [layer for sub in cost.subgraphs for layer in sub.layers]
        memory[size] = np.array([layer.memory_ms for layer in layers])
        ddr[size] = cost.loaded_bytes + cost.stored_bytes
    mac = np.array([layer.compute_ms if layer.macs > 0 else 0.0 for layer in layers])
    vector = np.array([0.0 if layer.macs > 0 else layer.compute_ms for layer in layers])
    return Parts(mac, vector, memory, ddr)


def fit(points: list[tuple[Point, Parts]]) -> dict[str, CostConstants]:
    """bayes-e's constants on its fit points, then bernoulli2's compute factor on the X3 / X5 ratios."""
    own = [(pt, p) for pt, p in points if pt.march == "bayes-e" and pt.use == "fit"]

    def ddr_error(size: int) -> float:
        return sum(math.log(p.ddr[size] / pt.ddr_bytes) ** 2 for pt, p in own if pt.ddr_bytes)

    on_chip = min(ON_CHIP, key=ddr_error)
    grid = itertools.product(np.arange(0.05, 1.0001, 0.01), [1 / 128, 1 / 64, 1 / 32, 1 / 16],
                             [0.0, 0.0005, 0.001, 0.002, 0.003, 0.005, 0.008, 0.012])

    def error(k: CostConstants) -> float:
        return sum(math.log(p.latency_ms(k) * 1e3 / pt.latency_us) ** 2 for pt, p in own)

    best = min((CostConstants(round(float(e), 2), v, o, on_chip) for e, v, o in grid), key=error)
    fitted = {"bayes-e": best}
    x5 = {(pt.network, pt.size): (pt, p) for pt, p in points if pt.march == "bayes-e"}
    # (X3 public, X5 public, X3 parts, X5 parts) of each network published on both boards
    pairs = [(pt.latency_us, x5[pt.network, pt.size][0].latency_us, p, x5[pt.network, pt.size][1])
             for pt, p in points if pt.march == "bernoulli2" and pt.use == "fit" and (pt.network, pt.size) in x5]
    if pairs:
        def ratio_error(f: float) -> float:
            return sum(math.log(x3_parts.latency_ms(scaled(best, f)) / x5_parts.latency_ms(best)
                                / (x3_public / x5_public)) ** 2 for x3_public, x5_public, x3_parts, x5_parts in pairs)

        factors = (round(float(f), 2) for f in np.arange(0.05, 2.0001, 0.01))
        fitted["bernoulli2"] = scaled(best, min(factors, key=ratio_error))
    return fitted


def scaled(k: CostConstants, factor: float) -> CostConstants:
    """``k`` with both compute rates times ``factor`` (a march whose units sustain a different share of peak)."""
    return dataclasses.replace(k, mac_efficiency=round(k.mac_efficiency * factor, 4),
                               vector_share=k.vector_share * factor)


def rows(points: list[tuple[Point, Parts]], costs: dict[str, CostConstants]) -> list[dict]:
    out = []
    for pt, p in points:
        k = costs.get(pt.march, costs["bayes-e"])
        latency, ddr = p.latency_ms(k) * 1e3, p.ddr[k.on_chip_bytes]
        out.append({**dataclasses.asdict(pt), "latency_us": round(pt.latency_us, 1),
                    "modelled_latency_us": round(latency, 1), "modelled_ddr_bytes": ddr,
                    "latency_ratio": round(latency / pt.latency_us, 3),
                    "ddr_ratio": round(ddr / pt.ddr_bytes, 3) if pt.ddr_bytes else None})
    return out


def describe(march: str, k: CostConstants) -> str:
    return (f"{march}: mac_efficiency {k.mac_efficiency:.4g}, vector_share 1/{1 / k.vector_share:.4g}, "
            f"layer_overhead {k.layer_overhead_ms * 1e3:.1f} us, on_chip {k.on_chip_bytes // 1024} KiB")


def markdown(table: list[dict], costs: dict[str, CostConstants]) -> str:
    lines = ["Constants: " + "; ".join(describe(m, k) for m, k in costs.items()) + ".", "",
             "| model | march | input | public figure | use | public latency (us) | public DDR (bytes) "
             "| modelled latency (us) | modelled DDR (bytes) | latency ratio | DDR ratio | source |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in table:
        lines.append(f"| {r['network']} | {r['march']} | {r['size']}x{r['size']} {r['input_type_rt']} | {r['kind']} | "
                     f"{r['use']} | {r['latency_us']} | {r['ddr_bytes'] or '–'} | {r['modelled_latency_us']} | "
                     f"{r['modelled_ddr_bytes']} | {r['latency_ratio']} | {r['ddr_ratio'] or '–'} | {r['source']} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fit", action="store_true", help="also search the constants that fit the points best")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args(argv)
    setup(None, console_level=logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp:
        points = [(pt, parts(build(pt, Path(tmp)), pt.march)) for pt in POINTS]
    committed = {march: perf_model.constants_for(march) for march in dict.fromkeys(pt.march for pt in POINTS)}
    if any(k.on_chip_bytes not in ON_CHIP for k in committed.values()):
        raise SystemExit(f"a committed on_chip_bytes is not one of the candidates {ON_CHIP}")
    result: dict = {"committed": {"constants": {m: dataclasses.asdict(k) for m, k in committed.items()},
                                  "rows": rows(points, committed)}}
    text = "## committed constants\n\n" + markdown(result["committed"]["rows"], committed)
    if args.fit:
        best = fit(points)
        result["fitted"] = {"constants": {m: dataclasses.asdict(k) for m, k in best.items()},
                            "rows": rows(points, best)}
        text += "\n## best fit\n\n" + markdown(result["fitted"]["rows"], best)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "perf_calibration.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / "perf_calibration.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
