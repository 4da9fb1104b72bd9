"""Inference speed and file sizes of the float, calibrated and quantized models in HB_ONNXRuntime.

For each real model the project fetches (the PP-OCR samples ``cls``, ``det``, ``rec`` and the
corpus of ``benchmarks/zoo.py``) and each calibration type (``max``, ``default``): convert with
``hb_mapper makertbin`` (or reuse the conversion already in ``--cache-dir``), then time the
float ONNX, the calibrated and the quantized model in HB_ONNXRuntime (ms per sample, batch 1,
one and two onnxruntime threads; best and median over held-out samples, the three models alternating
so other processes' load hits them alike) and report the file sizes of the float ONNX, the
quantized ONNX and the ``.bin``, with makertbin's wall time, peak RSS and step timings.

    python benchmarks/runtime_speed.py --json benchmarks/results/runtime_speed.json \\
        --markdown benchmarks/results/runtime_speed.md

The default model set (cls, det, rec) took 25 minutes on 2 cores under a load average of
about 6 with nothing cached (det's ``default`` conversion is most of it), a few minutes
with the conversions cached; ``--models all`` adds the corpus. Conversions are kept in ``--cache-dir`` and reused
(``--reconvert`` converts again, e.g. after a change of the quantize stage; a change of the
lowering only needs a re-run).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import compare_ort  # noqa: E402
import fetch_models  # noqa: E402
import zoo  # noqa: E402

from hbtools.config.loader import load_config  # noqa: E402
from hbtools.pipeline.runner import artefact_paths  # noqa: E402
from hbtools.runtime import HB_ONNXRuntime  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
SAMPLES = compare_ort.MODELS  # cls, det, rec
DEFAULT_MODELS = ",".join(SAMPLES)
TYPES = ("max", "default")
KINDS = ("float", "calibrated", "quantized")
STEP_LINE = re.compile(r"INFO step timings: (.*)$", re.M)
STEP = re.compile(r"([A-Za-z0-9 ]+?) (\d+(?:\.\d+)?) s(?:, |$)")
# Acceptance (issue 15): quantized latency and size against float, per calibration type.
TARGET_LATENCY = {"max": 2.0, "default": 3.0}
TARGET_CALIBRATED = 1.5
TARGET_SIZE = {"max": 0.35, "default": 0.7}


class UsageError(Exception):
    """Bad command-line input: one ERROR line, exit 1."""


def prepare(name: str, args: argparse.Namespace, work: Path) -> compare_ort.Setup:
    """Calibration data, held-out samples and a makertbin config (the sample's or the corpus' own setup)."""
    if name in SAMPLES:
        return compare_ort.prepare_model(name, None, args, work)
    return zoo.prepare(name, args, work)[0]


def step_timings(log_text: str) -> dict[str, float]:
    """``{step: seconds}`` from makertbin's ``step timings`` log line (empty if it has none)."""
    lines = STEP_LINE.findall(log_text)
    return {k: float(v) for k, v in STEP.findall(lines[-1])} if lines else {}


def convert(setup: compare_ort.Setup, kind: str, args: argparse.Namespace) -> tuple[dict, dict[str, Path]]:
    """makertbin with calibration type ``kind`` into the cache (or the cached result)."""
    out = args.cache_dir / setup.name / kind
    config = yaml.safe_load(setup.config.read_text())
    config["model_parameters"]["working_dir"] = str(out / "model_output")
    config["calibration_parameters"]["calibration_type"] = kind
    path = setup.work / f"{setup.name}_{kind}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    paths = artefact_paths(load_config(path))
    record = out / "conversion.json"
    if not args.reconvert and record.is_file() and all(p.is_file() for p in paths.values()):
        return {**json.loads(record.read_text()), "reused": True}, paths
    run_dir = setup.work / f"run_{kind}"
    run_dir.mkdir()
    measured = compare_ort.run_measured([shutil.which("hb_mapper") or "hb_mapper", "makertbin", "--config",
                                         str(path), "--model-type", "onnx"],
                                        mem_limit_gb=args.mem_limit_gb, cwd=run_dir, timeout_s=60 * args.timeout_min)
    log = run_dir / "hb_mapper_makertbin.log"
    text = log.read_text() if log.is_file() else ""
    result = {"status": "ok" if measured.returncode == 0 else "failed", "error": measured.error(),
              "wall_s": round(measured.wall_s, 1), "peak_rss_mb": round(measured.peak_rss_mb),
              "calibration_samples": len(list(setup.cal_dir.iterdir())), "step_timings_s": step_timings(text),
              "internal_error": "internal error" in text + measured.stdout + measured.stderr,
              "converted": compare_ort.machine()["date"]}
    if measured.returncode == 0:
        result.update(compare_ort.precision(paths["calibrated"], log))
        out.mkdir(parents=True, exist_ok=True)
        record.write_text(json.dumps(result, indent=2) + "\n")
    return {**result, "reused": False}, paths


def latencies(setup: compare_ort.Setup, models: dict[str, Path], threads: int, runs: int) -> dict[str, float]:
    """Best and median ms per sample of each model, batch 1; one warm-up run each, then ``runs`` rounds in turn."""
    sessions = {k: HB_ONNXRuntime(model_file=str(p), threads=threads) for k, p in models.items()}
    times: dict[str, list[float]] = {k: [] for k in sessions}
    for r in range(runs + 1):
        raw = setup.heldout[r % len(setup.heldout)]
        normalised = ((raw.astype(np.float32) - setup.mean) * setup.scale).astype(np.float32)
        for kind, sess in sessions.items():
            # the float model takes the normalised picture; ours the uint8 rt data (HzPreprocess inside)
            feed = {setup.input_name: normalised if kind == "float" else raw}
            start = time.perf_counter()
            sess.run(None, feed)
            if r:
                times[kind].append(time.perf_counter() - start)
    # the best run shows the cost without other processes' load; the median is kept too
    return {**{k: round(1000 * min(v), 2) for k, v in times.items()},
            **{f"{k}_median": round(1000 * float(np.median(v)), 2) for k, v in times.items()}}


def run_model(name: str, args: argparse.Namespace, work: Path) -> dict:
    setup = prepare(name, args, work / name)
    entry = {"model": name, "source": setup.source.name, "input_shape": list(setup.shape),
             "float_onnx_bytes": setup.source.stat().st_size, "runs": []}
    for kind in args.types:
        conversion, paths = convert(setup, kind, args)
        row = {"calibration_type": kind, "conversion": conversion}
        if conversion["status"] == "ok":
            row["sizes"] = {"quantized_onnx_bytes": paths["quantized"].stat().st_size,
                            "bin_bytes": paths["bin"].stat().st_size,
                            "calibrated_onnx_bytes": paths["calibrated"].stat().st_size}
            models = {"float": setup.source, "calibrated": paths["calibrated"], "quantized": paths["quantized"]}
            try:
                row["ms"] = {str(t): latencies(setup, models, t, args.runs) for t in args.threads}
            except Exception as exc:  # a model that does not run is a result, not a crash of the benchmark
                row["error"] = f"inference failed: {type(exc).__name__}: {str(exc).strip()[:300]}"
        entry["runs"].append(row)
        print(progress(name, row, entry["float_onnx_bytes"]), flush=True)
    return entry


def progress(name: str, row: dict, float_bytes: int) -> str:
    c = row["conversion"]
    if c["status"] != "ok" or "ms" not in row:
        return f"{name} {row['calibration_type']}: failed: {c.get('error') or row.get('error')}"
    ms = row["ms"][min(row["ms"], key=int)]
    return (f"{name} {row['calibration_type']}: float {ms['float']} ms, calibrated {ms['calibrated']} ms, "
            f"quantized {ms['quantized']} ms; quantized ONNX {row['sizes']['quantized_onnx_bytes'] / float_bytes:.2f}× "
            f"float, .bin {row['sizes']['bin_bytes'] / float_bytes:.2f}×; makertbin {c['wall_s']} s"
            f"{' (cached)' if c['reused'] else ''}")


def targets(row: dict, float_bytes: int) -> str:
    """Which of issue 15's targets hold (latency with one thread)."""
    kind, ms, sizes = row["calibration_type"], row["ms"][min(row["ms"], key=int)], row["sizes"]
    checks = {"latency": ms["quantized"] <= TARGET_LATENCY.get(kind, TARGET_LATENCY["default"]) * ms["float"],
              "calibrated": ms["calibrated"] <= TARGET_CALIBRATED * ms["float"],
              "size": max(sizes["quantized_onnx_bytes"], sizes["bin_bytes"])
              <= TARGET_SIZE.get(kind, TARGET_SIZE["default"]) * float_bytes}
    return ", ".join(f"{k} {'yes' if ok else '**no**'}" for k, ok in checks.items())


def _mb(n: int) -> str:
    return f"{n / 1e6:.2f}"


def markdown(result: dict) -> str:
    m = result["machine"]
    lines = ["## Runtime speed and file sizes: float, calibrated and quantized models in HB_ONNXRuntime", "",
             f"{m['date']}, {m['cpu']} ({m['cores']} cores), onnxruntime {m['onnxruntime']}, hbtools "
             f"{m['hbtools_commit']}. Load average at start {'/'.join(f'{v:.1f}' for v in result['load_average'])} "
             f"(shared machine: timings are indicative). Total {result['total_wall_s']} s.", "",
             f"`{result['command']}`", "",
             f"ms per sample, batch 1, best of {result['settings']['runs']} runs on held-out samples (medians in the "
             "JSON); × float in brackets. Sizes in MB and × the float ONNX file. Targets (issue 15): quantized "
             "≤ 2× float latency with max, ≤ 3× with default, calibrated ≤ 1.5×; quantized ONNX and .bin "
             "≤ 0.35× float size with max, ≤ 0.7× with default.", ""]
    threads = [str(t) for t in result["settings"]["threads"]]
    head = "| model | type | " + " | ".join(f"float / calibrated / quantized ms ({t} thr)" for t in threads) + \
        " | float MB | quantized ONNX MB (×) | .bin MB (×) | makertbin s | int16 acts | targets met |"
    lines += [head, "|---|---|" + "--:|" * (len(threads) + 5) + "---|"]
    for e in result["models"]:
        fb = e["float_onnx_bytes"]
        for r in e["runs"]:
            c = r["conversion"]
            if c["status"] != "ok" or "ms" not in r:
                lines.append(f"| {e['model']} | {r['calibration_type']} | **failed**: "
                             f"{(c.get('error') or r.get('error') or '')[:120]} |")
                continue
            cells = []
            for t in threads:
                ms = r["ms"][t]
                cells.append(f"{ms['float']:.1f} / {ms['calibrated']:.1f} ({ms['calibrated'] / ms['float']:.2f}×) / "
                             f"{ms['quantized']:.1f} ({ms['quantized'] / ms['float']:.2f}×)")
            s = r["sizes"]
            int16 = f"{c.get('int16_activations')} of {c.get('activations')}"
            lines.append(f"| {e['model']} | {r['calibration_type']} | {' | '.join(cells)} | {_mb(fb)} "
                         f"| {_mb(s['quantized_onnx_bytes'])} ({s['quantized_onnx_bytes'] / fb:.2f}×) "
                         f"| {_mb(s['bin_bytes'])} ({s['bin_bytes'] / fb:.2f}×) | {c['wall_s']} | {int16} "
                         f"| {targets(r, fb)} |")
    timed = [(e["model"], r) for e in result["models"] for r in e["runs"] if r["conversion"].get("step_timings_s")]
    if timed:
        lines += ["", "makertbin step timings (s):", ""]
        for name, r in timed:
            steps = ", ".join(f"{k} {v:.1f}" for k, v in r["conversion"]["step_timings_s"].items())
            lines.append(f"- {name} {r['calibration_type']} ({r['conversion']['calibration_samples']} samples, "
                         f"{r['conversion']['wall_s']} s in all): {steps}")
    return "\n".join(lines) + "\n"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    every = [*SAMPLES, *fetch_models.ZOO]
    parser.add_argument("--models", default=DEFAULT_MODELS,
                        help=f"comma-separated, or 'all': {','.join(every)} ({DEFAULT_MODELS})")
    parser.add_argument("--types", default=",".join(TYPES), help="calibration types (max,default)")
    parser.add_argument("--threads", default="1,2", help="onnxruntime intra-op threads to time with (1,2)")
    parser.add_argument("--runs", type=int, default=10, help="timed runs per model and thread count (10)")
    parser.add_argument("--cal-num", type=int, help="calibration samples (samples 50, corpus 16)")
    parser.add_argument("--heldout-num", type=int, default=5, help="held-out samples to time on (5)")
    parser.add_argument("--det-size", type=int, default=480, help="corpus det input N x N (480); 0: the config's")
    parser.add_argument("--cache-dir", type=Path, default=REPO / "build" / "runtime_speed",
                        help="conversions kept here and reused (build/runtime_speed)")
    parser.add_argument("--reconvert", action="store_true", help="convert again even when the cache has the model")
    parser.add_argument("--mem-limit-gb", type=float, default=12.0, help="address-space cap per conversion")
    parser.add_argument("--timeout-min", type=float, default=30.0, help="kill a conversion after this (30)")
    parser.add_argument("--json", type=Path, help="write the results here (rewritten after every model)")
    parser.add_argument("--markdown", type=Path, help="write the table here (rewritten after every model)")
    parser.add_argument("--update", action="store_true",
                        help="keep the other models' results already in --json; replace those of --models")
    args = parser.parse_args(argv)
    names = every if args.models.strip() == "all" else [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in names if m not in every]
    if unknown or not names:
        raise UsageError(f"--models: unknown {', '.join(unknown) or '(none given)'}; choose from {','.join(every)} "
                         "or all")
    args.models = names
    args.types = [t.strip() for t in args.types.split(",") if t.strip()]
    if not args.types or any(t not in ("max", "default", "kl", "mix") for t in args.types):
        raise UsageError(f"--types {','.join(args.types)}: choose from max, default, kl, mix")
    try:
        args.threads = [int(t) for t in args.threads.split(",")]
    except ValueError:
        args.threads = []
    if not args.threads or min(args.threads) < 1:
        raise UsageError("--threads: comma-separated positive integers, e.g. 1,2")
    if args.runs < 1 or args.heldout_num < 1 or (args.cal_num is not None and args.cal_num < 1):
        raise UsageError("--runs, --heldout-num and --cal-num must be at least 1")
    if args.update and not (args.json and args.json.is_file()):
        raise UsageError("--update needs an existing --json file to update")
    if args.det_size < 0 or args.det_size % 32:
        raise UsageError("--det-size must be a multiple of 32 (0: the config's size)")
    return args


def run(args: argparse.Namespace, work: Path) -> dict:
    zoo_models = [m for m in args.models if m not in SAMPLES]
    if zoo_models:
        fetch_models.fetch_zoo(zoo_models)
    if any(m in SAMPLES for m in args.models):
        fetch_models.fetch()
    started = time.perf_counter()
    result = {"command": "python benchmarks/runtime_speed.py " + " ".join(sys.argv[1:]),
              "machine": compare_ort.machine(), "load_average": os.getloadavg(),
              "settings": {"types": args.types, "threads": args.threads, "runs": args.runs,
                           "cal_num": args.cal_num, "heldout_num": args.heldout_num, "det_size": args.det_size},
              "models": []}
    every = [*SAMPLES, *fetch_models.ZOO]
    runs = {m["model"]: m for m in json.loads(args.json.read_text())["models"]} if args.update else {}
    for name in args.models:
        per_model = argparse.Namespace(**vars(args))
        per_model.cal_num = args.cal_num or (50 if name in SAMPLES else 16)
        runs[name] = run_model(name, per_model, work)
        result["models"] = [runs[n] for n in every if n in runs]
        result["total_wall_s"] = round(time.perf_counter() - started)
        zoo.write(result, args, markdown)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = parse_args(argv)
        with tempfile.TemporaryDirectory(prefix="runtime_speed_") as tmp:
            result = run(args, Path(tmp))
    except (UsageError, compare_ort.UsageError, fetch_models.FetchError) as exc:
        print(f"ERROR {exc}", file=sys.stderr)
        return 1
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
