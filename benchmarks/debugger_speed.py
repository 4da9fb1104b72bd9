"""Wall time of the debugger's sensitivity analyses against their naive cost, and of runall.

The naive way to measure sensitivity runs the whole model once per ranked node and
sample: nodes x data_num x (one float inference). The debugger instead switches
calibration nodes by feeds, skips the float part upstream of the quantized node,
runs the float part downstream of it as one fused tail, runs nodes sharing the same
calibration inputs once and computes the float outputs once per sample
(docs/debugger.md, "How it is fast").

Per model, this script converts it with ``debug_mode: dump_calibration_data``
(calibration_type max, to keep it short), then times in one process, back to back:
one float inference, ``get_sensitivity_of_nodes`` for node_type 'node', 'weight' and
'activation' (each against its own naive cost; target: at most 0.5), one float
inference again, and ``runall`` with its defaults (all dumped samples; reported, no
target). Models: PP-OCR det and rec (``configs/ppocr_*.yaml``) and corpus models of
``configs/zoo/`` (detectors at ``--det-size``).

    python benchmarks/debugger_speed.py --json benchmarks/results/debugger_speed.json \\
        --markdown benchmarks/results/debugger_speed.md

Sensitivity uses every dumped sample (``--cal-num``, 16), as the debugger does by
default (``data_num=None``); ``--data-num`` takes fewer. The former single-model
form still works: ``--model rec --data-num 8`` (one model, the 'node' ranking only
unless ``--node-types`` says otherwise); ``--working-dir`` takes an existing makertbin
working_dir of that one model.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

REPO = Path(__file__).resolve().parent.parent
PPOCR = ("cls", "det", "rec")
DEFAULT_MODELS = "det,rec,ppocrv5_cls,ppocrv6_tiny_det"
NODE_TYPES = ("node", "weight", "activation")
TARGET = 0.5


def convert(work: Path, model: str, args: argparse.Namespace) -> Path:
    """makertbin (max) with a dump of the calibration data; returns the working dir (reused if present)."""
    out = work / model / "hbtools"
    if next(out.glob("*_calibrated_model.onnx"), None) is not None and (out / "calibration_data").is_dir():
        return out
    shutil.rmtree(work / model, ignore_errors=True)  # an interrupted conversion
    import compare_ort
    import fetch_models
    import zoo

    prep = argparse.Namespace(cal_num=args.cal_num, heldout_num=1, det_size=args.det_size)
    if model in PPOCR:
        fetch_models.fetch()
        setup = compare_ort.prepare_model(model, None, prep, work / model)
    else:
        fetch_models.fetch_zoo([model])
        setup, _ = zoo.prepare(model, prep, work / model)
    config = yaml.safe_load(setup.config.read_text())
    config["model_parameters"]["debug_mode"] = "dump_calibration_data"
    config["calibration_parameters"]["calibration_type"] = "max"
    setup.config.write_text(yaml.safe_dump(config, sort_keys=False))
    proc = subprocess.run(["hb_mapper", "makertbin", "--config", str(setup.config), "--model-type", "onnx"],
                          cwd=setup.work, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"makertbin of {model} failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return out


def float_inference_seconds(float_model: Path, samples: list[dict], repeats: int) -> tuple[float, float]:
    """Median wall and CPU time of one inference of the float model (the naive cost's unit).

    Wall: with HB_ONNXRuntime and with onnxruntime threads that do not spin (as the
    debugger's sessions); the faster one counts, so a busy machine cannot flatter the
    ratio. CPU: the process time of the non-spinning session (spinning threads burn CPU
    without working), the smaller of one and all threads.
    """
    import onnx
    import onnxruntime as ort

    from hbtools.runtime import HB_ONNXRuntime
    from hbtools.runtime.lowering import lower_model

    lowered = lower_model(onnx.load(str(float_model))).SerializeToString()

    def quiet(threads: int) -> ort.InferenceSession:
        options = ort.SessionOptions()
        options.log_severity_level = 3
        options.intra_op_num_threads = threads
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        return ort.InferenceSession(lowered, options, providers=["CPUExecutionProvider"])

    best_wall = best_cpu = float("inf")
    for name, run in (("hb", HB_ONNXRuntime(model_file=float_model).run), ("quiet", quiet(0).run),
                      ("quiet1", quiet(1).run)):
        run(None, samples[0])
        walls, cpus = [], []
        for _ in range(repeats):
            for s in samples:
                start, cpu = time.perf_counter(), time.process_time()
                run(None, s)
                walls.append(time.perf_counter() - start)
                cpus.append(time.process_time() - cpu)
        if name != "quiet1":
            best_wall = min(best_wall, float(np.median(walls)))
        if name != "hb":
            best_cpu = min(best_cpu, float(np.median(cpus)))
    return best_wall, best_cpu


def measure_model(name: str, out: Path, args: argparse.Namespace) -> dict:
    import horizon_nn.debug as dbg
    from hbtools.debug.data import load_samples
    from hbtools.debug.model import load_calibrated

    calibrated = next(out.glob("*_calibrated_model.onnx"))
    float_model = next(out.glob("*_optimized_float_model.onnx"))
    data = out / "calibration_data"
    cm = load_calibrated(calibrated)
    available = len(load_samples(data, cm))
    data_num = min(args.data_num or available, available)
    samples = load_samples(data, cm, data_num)
    timed_float = samples[:min(len(samples), 4)]
    before, cpu_before = float_inference_seconds(float_model, timed_float, 3)
    runs: dict[str, dict] = {}
    for node_type in args.node_types:
        load = os.getloadavg()[0]
        start, cpu = time.perf_counter(), time.process_time()
        result = dbg.get_sensitivity_of_nodes(model_or_file=str(calibrated), calibrated_data=str(data),
                                              node_type=node_type, data_num=data_num)
        runs[node_type] = {"nodes": len(result), "debugger_s": time.perf_counter() - start,
                           "debugger_cpu_s": time.process_time() - cpu,
                           "load_before": round(load, 2), "load_after": round(os.getloadavg()[0], 2)}
    after, cpu_after = float_inference_seconds(float_model, timed_float, 3)
    one = (before + after) / 2  # the machine may be busier at one end of the run than the other
    one_cpu = (cpu_before + cpu_after) / 2
    for r in runs.values():
        r["naive_s"] = r["nodes"] * data_num * one
        r["ratio"] = round(r["debugger_s"] / r["naive_s"], 3) if r["naive_s"] else None
        naive_cpu = r["nodes"] * data_num * one_cpu
        r["cpu_ratio"] = round(r["debugger_cpu_s"] / naive_cpu, 3) if naive_cpu else None
        r["debugger_s"], r["naive_s"] = round(r["debugger_s"], 2), round(r["naive_s"], 2)
        r["debugger_cpu_s"] = round(r["debugger_cpu_s"], 2)
    row = {"model": name, "input_shape": list(cm.inputs[0].shape), "data_num": data_num,
           "float_inference_ms": round(one * 1e3, 2), "float_inference_cpu_ms": round(one_cpu * 1e3, 2),
           "float_ms_before_after": [round(before * 1e3, 2), round(after * 1e3, 2)], "sensitivity": runs}
    for node_type, r in runs.items():
        print(f"{name} {node_type}: {r['nodes']} nodes x {data_num} samples x {row['float_inference_ms']} ms "
              f"= naive {r['naive_s']} s; debugger {r['debugger_s']} s; ratio {r['ratio']} (CPU {r['cpu_ratio']}) "
              f"(load {r['load_before']} -> {r['load_after']})", flush=True)
    if args.runall:
        load = os.getloadavg()[0]
        start = time.perf_counter()
        with tempfile.TemporaryDirectory() as save, contextlib.redirect_stdout(io.StringIO()):
            dbg.runall(model_or_file=str(calibrated), calibrated_data=str(data), save_dir=save)
        row["runall"] = {"samples": available, "wall_s": round(time.perf_counter() - start, 1),
                         "load_before": round(load, 2), "load_after": round(os.getloadavg()[0], 2)}
        print(f"{name} runall (defaults, {available} samples): {row['runall']['wall_s']} s", flush=True)
    return row


def markdown(result: dict) -> str:
    lines = ["## Debugger speed against the naive cost", "",
             f"{result['date']}, {result['cores']} cores (shared: timings are indicative). `{result['command']}`",
             "", "naive = ranked nodes × samples × one float inference of the same model, measured in the same "
             "run (wall: the faster of HB_ONNXRuntime and a non-spinning session). CPU ratio: the debugger's "
             "process time against naive counted in the float inference's process time (less sensitive to the "
             f"other processes on the machine). Target: ratio ≤ {TARGET}. Load: 1-minute load average before → "
             "after each timing.", "",
             "| model | input | samples | float ms | node_type | nodes | debugger s | naive s | ratio | CPU ratio "
             "| load |",
             "|---|---|--:|--:|---|--:|--:|--:|--:|--:|---|"]
    for m in result["models"]:
        shape = "x".join(str(d) for d in m["input_shape"][2:])
        for node_type, r in m["sensitivity"].items():
            lines.append(f"| {m['model']} | {shape} | {m['data_num']} | {m['float_inference_ms']} | {node_type} "
                         f"| {r['nodes']} | {r['debugger_s']} | {r['naive_s']} | {r['ratio']} | {r['cpu_ratio']} "
                         f"| {r['load_before']} → {r['load_after']} |")
    if any("runall" in m for m in result["models"]):
        lines += ["", "`runall` with its defaults (weight and activation sensitivity, distributions, box plots, "
                  "accumulated error, sensitivity analysis; all dumped samples):", "",
                  "| model | samples | wall s | load |", "|---|--:|--:|---|"]
        lines += [f"| {m['model']} | {m['runall']['samples']} | {m['runall']['wall_s']} "
                  f"| {m['runall']['load_before']} → {m['runall']['load_after']} |"
                  for m in result["models"] if "runall" in m]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=DEFAULT_MODELS, help=f"comma-separated ({DEFAULT_MODELS}); PP-OCR "
                        "models are cls, det, rec, corpus models are named as in configs/zoo/")
    parser.add_argument("--model", help="one model, the former form (implies --node-types node --no-runall)")
    parser.add_argument("--node-types", default=",".join(NODE_TYPES), help="comma-separated (node,weight,activation)")
    parser.add_argument("--data-num", type=int, help="samples per sensitivity run (all dumped, as the debugger's "
                        "default data_num=None)")
    parser.add_argument("--cal-num", type=int, default=16, help="calibration samples dumped; runall uses all (16)")
    parser.add_argument("--det-size", type=int, default=480, help="corpus detectors' input N x N (480)")
    parser.add_argument("--no-runall", dest="runall", action="store_false", help="skip timing runall")
    parser.add_argument("--working-dir", type=Path, help="an existing makertbin working_dir of the one --model")
    parser.add_argument("--work-dir", type=Path, help="keep (and reuse) conversions here (default: a temp dir)")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--markdown", type=Path, help="write the table here")
    args = parser.parse_args()
    if args.model:
        args.models = args.model
        if "--node-types" not in sys.argv:
            args.node_types = "node"
        args.runall = False
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    args.node_types = [t.strip() for t in args.node_types.split(",") if t.strip()]
    if args.working_dir and len(args.models) != 1:
        parser.error("--working-dir needs exactly one model (--model)")
    result = {"command": "python benchmarks/debugger_speed.py " + " ".join(sys.argv[1:]),
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cores": os.cpu_count(),
              "load_average_at_start": os.getloadavg(), "models": []}
    with tempfile.TemporaryDirectory(prefix="debugger_speed_") as tmp:
        work = args.work_dir or Path(tmp)
        for name in args.models:
            out = args.working_dir or convert(work, name, args)
            result["models"].append(measure_model(name, out, args))
            result["load_average_at_end"] = os.getloadavg()
            if args.json:
                args.json.write_text(json.dumps(result, indent=2) + "\n")
            if args.markdown:
                args.markdown.write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
