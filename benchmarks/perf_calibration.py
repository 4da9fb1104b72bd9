#!/usr/bin/env python
"""Calibrate hb_perf's cost model against public compile logs and write the table of docs/hb_perf.md.

Each public point is a network, a march, an input size and the latency / DDR bytes the vendor compiler
printed (``FPS=..., latency = ... us, DDR = ... bytes``). The networks are rebuilt with onnx.helper
(tests/arch_builders.py: real structure and shapes, random weights), converted with makertbin (nv12
input, ``max`` calibration on one random picture) and estimated by hbtools.tools.perf_model.

    python benchmarks/perf_calibration.py          # table with the committed constants
    python benchmarks/perf_calibration.py --fit    # also the constants that fit the points best

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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import arch_builders  # noqa: E402
from builders import make_project  # noqa: E402

from hbtools.log import setup  # noqa: E402
from hbtools.march.profiles import get_profile  # noqa: E402
from hbtools.pipeline.runner import makertbin  # noqa: E402
from hbtools.runtime.runtime_model import RuntimeModel, open_model  # noqa: E402
from hbtools.tools import perf_model  # noqa: E402
from hbtools.tools.perf_model import CostConstants  # noqa: E402

ZOO = "https://github.com/D-Robotics/rdk_model_zoo/blob/be4f89b/samples/vision/ultralytics_yolo/source/reference_logs/"


@dataclasses.dataclass(frozen=True)
class Point:
    network: str
    march: str
    size: int
    latency_us: float
    ddr_bytes: int
    source: str
    input_type_rt: str = "nv12"


POINTS = [
    Point("yolov8n", "bayes-e", 640, 3964.1, 12651904, ZOO + "hb_mapper_log_yolov8n.txt"),
    Point("yolov8n", "bayes-e", 640, 3835.1, 14293568,
          "https://github.com/D-Robotics/rdk_model_zoo/blob/640027d/demos/detect/YOLOv8/README_cn.md", "rgb"),
    Point("yolov5nu", "bayes-e", 640, 3320.5, 11696480, ZOO + "hb_mapper_log_yolov5nu.txt"),
    Point("yolov8n_cls", "bayes-e", 224, 495.4, 2682784, ZOO + "hb_mapper_log_yolov8n_cls.txt"),
]


def build(pt: Point, work: Path) -> RuntimeModel:
    network = pt.network
    root = work / f"{network}_{pt.march}_{pt.size}_{pt.input_type_rt}"
    bin_path = root / "model_output" / f"{network}.bin"
    if not bin_path.exists():
        project = make_project(root, arch_builders.NETWORKS[network](pt.size), march=pt.march, cal_count=1)
        project.write(input_parameters={"input_type_rt": pt.input_type_rt},
                      model_parameters={"output_model_file_prefix": network})
        makertbin(project.config_path, "onnx")
    return open_model(bin_path)


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


ON_CHIP = [k << 17 for k in range(2, 25)]  # 256 KiB to 3 MiB


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


def fit(points: list[tuple[Point, Parts]]) -> CostConstants:
    """Least squares on log(modelled / public): first the on-chip size from DDR, then the latency constants."""
    def ddr_error(size: int) -> float:
        return sum(math.log(p.ddr[size] / pt.ddr_bytes) ** 2 for pt, p in points)

    on_chip = min(ON_CHIP, key=ddr_error)
    grid = itertools.product(np.arange(0.05, 1.0001, 0.01), [1 / 128, 1 / 64, 1 / 32, 1 / 16],
                             [0.0, 0.0005, 0.001, 0.002, 0.003, 0.005, 0.008, 0.012])

    def error(k: CostConstants) -> float:
        return sum(math.log(p.latency_ms(k) * 1e3 / pt.latency_us) ** 2 for pt, p in points)

    return min((CostConstants(float(e), v, o, on_chip) for e, v, o in grid), key=error)


def rows(points: list[tuple[Point, Parts]], k: CostConstants) -> list[dict]:
    out = []
    for pt, p in points:
        latency = p.latency_ms(k) * 1e3
        ddr = p.ddr[k.on_chip_bytes]
        out.append({**dataclasses.asdict(pt), "modelled_latency_us": round(latency, 1), "modelled_ddr_bytes": ddr,
                    "latency_ratio": round(latency / pt.latency_us, 3), "ddr_ratio": round(ddr / pt.ddr_bytes, 3)})
    return out


def markdown(table: list[dict], k: CostConstants) -> str:
    lines = [f"Constants: mac_efficiency {k.mac_efficiency:.2f}, vector_share 1/{round(1 / k.vector_share)}, "
             f"layer_overhead {k.layer_overhead_ms * 1e3:.1f} us, on_chip {k.on_chip_bytes // 1024} KiB.", "",
             "| model | march | input | input_type_rt | public latency (us) | public DDR (bytes) "
             "| modelled latency (us) | modelled DDR (bytes) | latency ratio | DDR ratio | source |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in table:
        lines.append(f"| {r['network']} | {r['march']} | {r['size']}x{r['size']} | {r['input_type_rt']} | "
                     f"{r['latency_us']} | {r['ddr_bytes']} | {r['modelled_latency_us']} | {r['modelled_ddr_bytes']} | "
                     f"{r['latency_ratio']} | {r['ddr_ratio']} | {r['source']} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fit", action="store_true", help="also search the constants that fit the points best")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args(argv)
    setup(None, console_level=logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp:
        points = [(pt, parts(build(pt, Path(tmp)), pt.march)) for pt in POINTS]
    result: dict = {}
    committed = perf_model.COSTS["bayes-e"]
    if committed.on_chip_bytes not in ON_CHIP:
        raise SystemExit(f"on_chip_bytes {committed.on_chip_bytes} is not one of the candidates {ON_CHIP}")
    result["committed"] = {"constants": dataclasses.asdict(committed), "rows": rows(points, committed)}
    text = "## committed constants\n\n" + markdown(result["committed"]["rows"], committed)
    if args.fit:
        best = fit(points)
        result["fitted"] = {"constants": dataclasses.asdict(best), "rows": rows(points, best)}
        text += "\n## best fit\n\n" + markdown(result["fitted"]["rows"], best)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "perf_calibration.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / "perf_calibration.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
