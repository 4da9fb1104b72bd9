"""Peak RSS and wall time of makertbin on PP-OCR det for several calibration set sizes.

Calibration streams statistics, so peak memory must not grow with the number of
samples. Each run is a separate process; its peak RSS comes from getrusage.

    python benchmarks/calibration_memory.py --counts 20 100
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent


def run_once(count: int, work: Path) -> dict:
    data = work / f"cal_{count}"
    subprocess.run([sys.executable, str(REPO / "scripts" / "make_calibration_data.py"), "--model", "det",
                    "--count", str(count), "--heldout", "1", "--out", str(data)], check=True,
                   capture_output=True)
    cal_dir = data / "calibration" / "ppocr_det"
    config = yaml.safe_load((REPO / "configs" / "ppocr_det.yaml").read_text())
    config["model_parameters"]["onnx_model"] = str(REPO / "build" / "models" / "ch_PP-OCRv4_det_infer.onnx")
    config["model_parameters"]["working_dir"] = str(work / f"out_{count}")
    config["calibration_parameters"]["cal_data_dir"] = str(cal_dir)
    cfg = work / f"det_{count}.yaml"
    cfg.write_text(yaml.safe_dump(config))
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    start = time.perf_counter()
    proc = subprocess.run(["hb_mapper", "makertbin", "--config", str(cfg), "--model-type", "onnx"],
                          cwd=work, capture_output=True, text=True)
    wall = time.perf_counter() - start
    peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    if proc.returncode != 0:
        raise SystemExit(f"makertbin failed for {count} samples:\n{proc.stdout[-2000:]}")
    if peak_kb <= before:
        print(f"warning: an earlier child had a larger peak than the {count}-sample run", file=sys.stderr)
    return {"samples": count, "peak_rss_mb": round(peak_kb / 1024, 1), "wall_s": round(wall, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", type=int, nargs="+", default=[20, 100])
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    subprocess.run([sys.executable, str(REPO / "scripts" / "fetch_models.py")], check=True, capture_output=True)
    rows = []
    # Smallest first: getrusage reports the largest child so far, and more samples must not need more.
    with tempfile.TemporaryDirectory() as tmp:
        for count in sorted(args.counts):
            rows.append(run_once(count, Path(tmp)))
            print(f"{rows[-1]['samples']:>5} samples  peak RSS {rows[-1]['peak_rss_mb']:>7.1f} MB  "
                  f"wall {rows[-1]['wall_s']:>6.1f} s", flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
