"""Wall time of get_sensitivity_of_nodes(node_type='node') against the naive cost.

The naive way to measure node sensitivity runs the whole model once per node and
sample: nodes x data_num x (one float inference). The debugger instead switches
calibration nodes by feeds, skips the float part upstream of the quantized node,
runs the float part downstream of it as one fused tail, runs nodes sharing the same
calibration inputs once and computes the float outputs once per sample. This script converts PP-OCR rec with
``debug_mode: dump_calibration_data`` (calibration_type max, to keep it short),
times the debugger and one float inference in the same run, and prints the ratio
(target: at most 0.5).

    python benchmarks/debugger_speed.py --data-num 8
"""

from __future__ import annotations

import os

# One BLAS thread: the metrics' dot products otherwise fight onnxruntime's threads on a
# small machine. Set before numpy is imported.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import yaml  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def convert(work: Path, model: str) -> Path:
    """makertbin with a dump of the calibration data; returns the working dir."""
    subprocess.run([sys.executable, str(REPO / "scripts" / "fetch_models.py")], check=True, capture_output=True)
    subprocess.run([sys.executable, str(REPO / "scripts" / "make_calibration_data.py"), "--model", model],
                   check=True, capture_output=True)
    config = yaml.safe_load((REPO / "configs" / f"ppocr_{model}.yaml").read_text())
    base = REPO / "configs"
    for group, key in (("model_parameters", "onnx_model"), ("calibration_parameters", "cal_data_dir")):
        config[group][key] = str((base / config[group][key]).resolve())
    config["model_parameters"]["working_dir"] = str(work / "out")
    config["model_parameters"]["debug_mode"] = "dump_calibration_data"
    config["calibration_parameters"]["calibration_type"] = "max"
    path = work / f"{model}.yaml"
    path.write_text(yaml.safe_dump(config))
    proc = subprocess.run(["hb_mapper", "makertbin", "--config", str(path), "--model-type", "onnx"], cwd=work,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"makertbin failed:\n{proc.stdout[-2000:]}")
    return work / "out"


def float_inference_seconds(float_model: Path, samples: list[dict], repeats: int) -> float:
    """Median time of one inference of the float model (the naive cost's unit).

    Measured with HB_ONNXRuntime and with onnxruntime threads that do not spin (as the
    debugger's session); the faster one counts, so a busy machine cannot flatter the ratio.
    """
    import onnx
    import onnxruntime as ort

    from hbtools.runtime import HB_ONNXRuntime
    from hbtools.runtime.lowering import lower_model

    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    quiet = ort.InferenceSession(lower_model(onnx.load(str(float_model))).SerializeToString(), options,
                                 providers=["CPUExecutionProvider"])
    best = float("inf")
    for run in (HB_ONNXRuntime(model_file=float_model).run, quiet.run):
        run(None, samples[0])
        times = []
        for _ in range(repeats):
            for s in samples:
                start = time.perf_counter()
                run(None, s)
                times.append(time.perf_counter() - start)
        best = min(best, float(np.median(times)))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="rec", choices=["cls", "det", "rec"])
    parser.add_argument("--data-num", type=int, default=8)
    parser.add_argument("--working-dir", type=Path, help="an existing makertbin working_dir (skips conversion)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()

    import horizon_nn.debug as dbg
    from hbtools.debug.data import load_samples
    from hbtools.debug.model import load_calibrated

    with tempfile.TemporaryDirectory() as tmp:
        out = args.working_dir or convert(Path(tmp), args.model)
        calibrated = next(out.glob("*_calibrated_model.onnx"))
        float_model = next(out.glob("*_optimized_float_model.onnx"))
        data = out / "calibration_data"
        samples = load_samples(data, load_calibrated(calibrated), args.data_num)
        before = float_inference_seconds(float_model, samples, 5)
        start = time.perf_counter()
        result = dbg.get_sensitivity_of_nodes(model_or_file=str(calibrated), calibrated_data=str(data),
                                              node_type="node", data_num=args.data_num)
        debugger = time.perf_counter() - start
        after = float_inference_seconds(float_model, samples, 5)
    one = (before + after) / 2  # the machine may be busier at one end of the run than the other
    naive = len(result) * args.data_num * one
    row = {"model": args.model, "nodes": len(result), "data_num": args.data_num,
           "float_inference_ms": round(one * 1e3, 2), "naive_s": round(naive, 2), "debugger_s": round(debugger, 2),
           "ratio": round(debugger / naive, 3)}
    print(f"{row['model']}: {row['nodes']} nodes x {row['data_num']} samples x {row['float_inference_ms']} ms "
          f"= naive {row['naive_s']} s; get_sensitivity_of_nodes {row['debugger_s']} s; ratio {row['ratio']}")
    if args.json:
        args.json.write_text(json.dumps(row, indent=2))


if __name__ == "__main__":
    main()
