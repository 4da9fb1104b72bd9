"""hb_mapper makertbin side by side with onnxruntime's quantize_static on the PP-OCR models.

For each model the same calibration and held-out samples go to (a) ``hb_mapper makertbin``
with ``calibration_type: default`` and (b) ``onnxruntime.quantization.quantize_static``
(QDQ, per-channel int8; MinMax, Percentile, Entropy), run alternately, each in its own
process under a memory cap. Reported per run: wall time, peak RSS, output cosine against
the float model on the held-out samples, task agreement and inference time. A peer run
that fails is a row with its error.

    python benchmarks/compare_ort.py --models cls,det,rec \\
        --json benchmarks/results/compare_ort.json --markdown benchmarks/results/compare_ort.md
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import compare_report as report  # noqa: E402
import ort_peer  # noqa: E402

from hbtools.config.loader import load_config  # noqa: E402
from hbtools.eval import ppocr  # noqa: E402
from hbtools.pipeline.runner import artefact_paths  # noqa: E402
from hbtools.runtime import HB_ONNXRuntime  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
MODELS = ("cls", "det", "rec")
PEER_METHODS = ("MinMax", "Percentile", "Entropy")
OURS = "hbtools makertbin (default)"
FAST_RUN_S = 0.2  # inference faster than this is timed as the best of 3 runs per sample
_ERROR_LINE = re.compile(r"^(?:\d{4}-\d\d-\d\d [\d:,.]+ )?ERROR (.*)$")


class UsageError(Exception):
    """Bad command-line input: one ERROR line, exit 1."""


@dataclasses.dataclass
class Measured:
    """A finished child process: how it ended and what it cost."""

    returncode: int  # negative: killed by that signal
    wall_s: float
    peak_rss_mb: float
    stdout: str
    stderr: str
    timed_out: bool = False

    def error(self) -> str | None:
        """None on success, else the reason in one line."""
        if self.returncode == 0:
            return None
        if self.timed_out:
            return f"timed out after {self.wall_s:.0f} s (killed)"
        if self.returncode < 0:
            name = signal.Signals(-self.returncode).name
            return f"killed by {name}" + (f" ({self._last_line()})" if self._last_line() else "")
        return self._last_line() or f"exit status {self.returncode}"

    def _last_line(self) -> str:
        """The first ``ERROR ...`` line (hb_mapper's log lines carry a timestamp first; the
        later ones are trailers), else the last line of output."""
        lines = [ln.strip() for ln in (self.stderr + "\n" + self.stdout).splitlines() if ln.strip()]
        errors = [m.group(1) for m in map(_ERROR_LINE.match, lines) if m]
        return errors[0] if errors else (lines or [""])[-1]


def run_measured(cmd: Sequence[str], *, mem_limit_gb: float, cwd: Path, timeout_s: float | None = None) -> Measured:
    """Run ``cmd`` with its address space capped; peak RSS from wait4, i.e. of this child alone
    (getrusage(RUSAGE_CHILDREN) would give the largest child so far)."""
    limit = int(mem_limit_gb * 2**30)
    timed_out = threading.Event()

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        start = time.perf_counter()
        proc = subprocess.Popen(list(cmd), cwd=cwd, stdout=out, stderr=err, preexec_fn=cap)

        def kill() -> None:
            timed_out.set()
            proc.kill()

        timer = threading.Timer(timeout_s, kill) if timeout_s else None
        if timer:
            timer.start()
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        if timer:
            timer.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return Measured(proc.returncode, wall, usage.ru_maxrss / 1024, out.read()[-20000:], err.read()[-20000:],
                        timed_out.is_set())


def parse_shapes(items: Sequence[str], det_size: int | None) -> dict[str, tuple[int, int]]:
    """``model=HxW`` overrides (and ``--det-size N``) of the configs' input sizes."""
    shapes = {}
    for item in items:
        name, _, size = item.partition("=")
        try:
            height, width = (int(v) for v in size.lower().split("x"))
        except ValueError:
            raise UsageError(f"--input-shape {item!r}: expected MODEL=HxW, e.g. det=960x960") from None
        if name not in MODELS:
            raise UsageError(f"--input-shape {item!r}: unknown model {name!r}; expected one of {', '.join(MODELS)}")
        shapes[name] = (height, width)
    if det_size:
        shapes["det"] = (det_size, det_size)
    if "det" in shapes and shapes["det"][0] != shapes["det"][1]:
        raise UsageError("det input must be square (the sample generator makes square pictures)")
    return shapes


def sample_generator() -> Callable:
    """scripts/make_calibration_data.py's ``generate`` (the one sample generator)."""
    import importlib.util

    script = REPO / "scripts" / "make_calibration_data.py"
    spec = importlib.util.spec_from_file_location("make_calibration_data", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.generate


@dataclasses.dataclass
class Setup:
    """One model's inputs to every run: config, data and the float reference."""

    name: str
    config: Path
    source: Path
    input_name: str
    shape: tuple[int, ...]
    mean: np.ndarray
    scale: np.ndarray
    cal_dir: Path
    heldout: list[np.ndarray]
    work: Path


def prepare_model(name: str, size: tuple[int, int] | None, args: argparse.Namespace, work: Path) -> Setup:
    """Write the model's calibration data and hb_mapper config under ``work``."""
    base = REPO / "configs"
    config = yaml.safe_load((base / f"ppocr_{name}.yaml").read_text())
    model_params, input_params = config["model_parameters"], config["input_parameters"]
    model_params["onnx_model"] = str((base / model_params["onnx_model"]).resolve())
    if size:
        n, c, _, _ = (int(v) for v in input_params["input_shape"].split("x"))
        input_params["input_shape"] = f"{n}x{c}x{size[0]}x{size[1]}"
    shape = tuple(int(v) for v in input_params["input_shape"].split("x"))
    splits = sample_generator()(name, args.cal_num, args.heldout_num, size=shape[2:])
    cal_dir = work / "calibration"
    cal_dir.mkdir(parents=True)
    for i, (kind, arr) in enumerate(splits["calibration"]):
        arr.tofile(cal_dir / f"{i:04d}_{kind}.bin")
    model_params["working_dir"] = str(work / "hbtools")
    config["calibration_parameters"]["cal_data_dir"] = str(cal_dir)
    config["calibration_parameters"]["calibration_type"] = "default"
    path = work / f"ppocr_{name}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    spec = load_config(path).inputs[0]
    if spec.type_rt != spec.type_train or spec.layout_train != "NCHW":
        raise UsageError(f"{path}: the benchmark feeds the float model NCHW data in the rt colour order")
    channels = shape[1]
    return Setup(name, path, Path(model_params["onnx_model"]), spec.name, shape,
                 ort_peer.channel_vector(spec.mean, channels), ort_peer.channel_vector(spec.scale, channels),
                 cal_dir, [arr for _, arr in splits["heldout"]], work)


def precision(calibrated: Path, log: Path) -> dict:
    """What ``calibration_type: default`` chose: the method (from the log) and how many
    activation tensors it made int16 (from the calibrated model's HzCalibration nodes)."""
    import onnx

    bits = [next(onnx.helper.get_attribute_value(a) for a in n.attribute if a.name == "bits")
            for n in onnx.load(str(calibrated), load_external_data=False).graph.node
            if n.op_type == "HzCalibration" and any(a.name == "kind" and a.s == b"activation" for a in n.attribute)]
    chosen = re.findall(r"INFO Select (.+) method", log.read_text()) if log.is_file() else []
    return {"calibration_method": chosen[-1] if chosen else None,
            "int16_activations": sum(b == 16 for b in bits), "activations": len(bits)}


def run_ours(setup: Setup, args: argparse.Namespace) -> tuple[Measured, Path]:
    hb_mapper = shutil.which("hb_mapper", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    if hb_mapper is None:
        raise UsageError("hb_mapper is not on PATH; install hbtools first (pip install -e .)")
    run_dir = setup.work / "hbtools_run"
    run_dir.mkdir(exist_ok=True)
    measured = run_measured([hb_mapper, "makertbin", "--config", str(setup.config), "--model-type", "onnx"],
                            mem_limit_gb=args.mem_limit_gb, cwd=run_dir, timeout_s=60 * args.timeout_min)
    return measured, artefact_paths(load_config(setup.config))["quantized"]


def run_peer(setup: Setup, method: str, stride: int, args: argparse.Namespace) -> tuple[Measured, Path, dict]:
    tag = method + (f"_stride{stride}" if stride else "")
    out = setup.work / f"ort_{tag}.onnx"
    steps = setup.work / f"ort_{tag}.json"
    cmd = [sys.executable, str(Path(ort_peer.__file__)), "--model", str(setup.source), "--out", str(out),
           "--method", method, "--data", str(setup.cal_dir), "--input-name", setup.input_name,
           "--shape", "x".join(map(str, setup.shape)), "--mean", " ".join(map(str, setup.mean.ravel())),
           "--scale", " ".join(map(str, setup.scale.ravel())), "--stride", str(stride),
           "--activation-type", args.activation_type, "--report", str(steps)]
    measured = run_measured(cmd, mem_limit_gb=args.mem_limit_gb, cwd=setup.work, timeout_s=60 * args.timeout_min)
    detail = json.loads(steps.read_text()) if measured.returncode == 0 and steps.is_file() else {}
    return measured, out, detail


def evaluate(setup: Setup, quantized: Path, takes_uint8: bool, threads: int) -> dict:
    """Held-out comparison with the float model (cosine, task agreement, timings)."""
    ref, quant, timing = infer_pairs(setup, quantized, takes_uint8, threads)
    characters = ppocr.rec_characters(setup.source) if setup.name == "rec" else None
    comparison = ppocr.compare_outputs(setup.name, ref, quant, characters)
    return {**dataclasses.asdict(comparison), **timing}


def infer_pairs(setup: Setup, quantized: Path, takes_uint8: bool,
                threads: int) -> tuple[list[np.ndarray], list[np.ndarray], dict]:
    """First outputs of the float and the quantized model on every held-out sample, and the
    median times; both sessions alternate per sample so that the load of other processes
    hits their timings alike."""
    float_sess = HB_ONNXRuntime(model_file=setup.source, threads=threads)
    quant_sess = HB_ONNXRuntime(model_file=quantized, threads=threads)
    ref, quant, float_t, quant_t = [], [], [], []
    repeats = {}
    for k, raw in enumerate(setup.heldout):
        normalised = ((raw.astype(np.float32) - setup.mean) * setup.scale).astype(np.float32)
        # uint8 feeds go through input_offset=128 (the runtime's image convention).
        feed = raw if takes_uint8 else normalised
        if quant_sess.layout[0] == "NHWC" and feed.ndim == 4:  # bernoulli2 takes pictures channels-last
            feed = np.ascontiguousarray(feed.transpose(0, 2, 3, 1))
        for sess, x, outs, times in ((float_sess, normalised, ref, float_t), (quant_sess, feed, quant, quant_t)):
            if k == 0:  # warm-up, not timed; fast models get the best of 3 runs per sample
                start = time.perf_counter()
                sess.run(None, {setup.input_name: x})
                repeats[id(sess)] = 3 if time.perf_counter() - start < FAST_RUN_S else 1
            best = float("inf")
            for _ in range(repeats[id(sess)]):
                start = time.perf_counter()
                out = sess.run(None, {setup.input_name: x})[0]
                best = min(best, time.perf_counter() - start)
            outs.append(out)
            times.append(best)
    return ref, quant, {"infer_ms": 1000 * float(np.median(quant_t)), "float_ms": 1000 * float(np.median(float_t))}


def finish(tool: str, measured: Measured, quantized: Path, setup: Setup, takes_uint8: bool,
           args: argparse.Namespace, detail: dict | None = None) -> dict:
    row = {"tool": tool, "status": "ok", "error": None, "wall_s": round(measured.wall_s, 1),
           "peak_rss_mb": round(measured.peak_rss_mb), **(detail or {})}
    error = measured.error()
    if error is None:
        try:
            row.update(evaluate(setup, quantized, takes_uint8, args.threads))
        except Exception as exc:  # an unusable model is a result, not a crash of the benchmark
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            error = f"evaluation failed: {type(exc).__name__}: {first}"
    if error is not None:
        row.update(status="failed", error=error)
    print(report.progress_line(setup.name, row), flush=True)
    return row


def compare_model(name: str, size: tuple[int, int] | None, args: argparse.Namespace, work: Path) -> dict:
    setup = prepare_model(name, size, args, work / name)
    rows = []
    measured, quantized = run_ours(setup, args)
    detail = {}
    if measured.returncode == 0:
        detail = precision(artefact_paths(load_config(setup.config))["calibrated"],
                           setup.work / "hbtools_run" / "hb_mapper_makertbin.log")
    rows.append(finish(OURS, measured, quantized, setup, True, args, detail))
    for method in PEER_METHODS:
        measured, out, detail = run_peer(setup, method, 0, args)
        rows.append(finish(f"ORT {method}", measured, out, setup, False, args, detail))
        stride = report.stride_for(args.cal_num, args.stride)
        if rows[-1]["status"] == "failed" and method != "MinMax" and stride:
            # What a careful user tries next: calibrate in chunks (histograms are merged).
            measured, out, detail = run_peer(setup, method, stride, args)
            rows.append(finish(f"ORT {method}, CalibStridedMinMax={stride}", measured, out, setup, False,
                               args, {**detail, "stride": stride}))
    return {"model": name, "source": setup.source.name, "input_shape": list(setup.shape),
            "calibration_samples": args.cal_num, "heldout_samples": args.heldout_num,
            "cosine_samples": next((r["cosine_samples"] for r in rows if r["status"] == "ok"), None),
            "agreement": report.AGREEMENT[name], "runs": rows}


def machine() -> dict:
    import onnx
    import onnxruntime

    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), platform.processor())
    mem_kb = next(int(ln.split()[1]) for ln in Path("/proc/meminfo").read_text().splitlines()
                  if ln.startswith("MemTotal"))
    def git(*cmd: str) -> str:
        return subprocess.run(["git", *cmd], cwd=REPO, capture_output=True, text=True).stdout.strip()

    commit = git("rev-parse", "--short", "HEAD")
    return {"cpu": cpu, "cores": os.cpu_count(), "ram_gb": round(mem_kb / 2**20, 1),
            "os": platform.platform(), "python": platform.python_version(), "onnxruntime": onnxruntime.__version__,
            "onnx": onnx.__version__, "numpy": np.__version__, "hbtools_commit": commit or None,
            "uncommitted_changes": bool(git("status", "--porcelain", "--untracked-files=no")),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated subset of cls,det,rec")
    parser.add_argument("--cal-num", type=int, default=50, help="calibration samples (50)")
    parser.add_argument("--heldout-num", type=int, default=20, help="held-out samples (20)")
    parser.add_argument("--input-shape", action="append", default=[], metavar="MODEL=HxW",
                        help="input size instead of the config's, e.g. rec=48x480 (repeatable)")
    parser.add_argument("--det-size", type=int, help="det input N x N (same as --input-shape det=NxN)")
    parser.add_argument("--mem-limit-gb", type=float, default=12.0,
                        help="address-space cap of every quantization process (12)")
    parser.add_argument("--stride", type=int, default=0,
                        help="after a failed Percentile/Entropy run, retry with CalibStridedMinMax of "
                             "this many samples (largest divisor of --cal-num not above it); 0 (default): "
                             "no retry. On det, 10 keeps ORT under 12 GB but takes ~10 CPU-minutes per method")
    parser.add_argument("--timeout-min", type=float, default=15.0,
                        help="kill a quantization run after this many minutes and report it (15)")
    parser.add_argument("--activation-type", default="QInt8", choices=["QInt8", "QUInt8", "QInt16"],
                        help="onnxruntime's activation type (QInt8)")
    parser.add_argument("--threads", type=int, default=1, help="onnxruntime threads for the timed inference (1)")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--markdown", type=Path, help="write the tables here")
    parser.add_argument("--work-dir", type=Path, help="keep the configs, data and models here (default: a temp dir)")
    args = parser.parse_args(argv)
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in args.models if m not in MODELS]
    if unknown or not args.models:
        raise UsageError(f"--models: unknown {', '.join(unknown) or '(none given)'}; choose from {','.join(MODELS)}")
    if args.cal_num < 1 or args.heldout_num < 1:
        raise UsageError("--cal-num and --heldout-num must be at least 1")
    if args.mem_limit_gb <= 0 or args.timeout_min <= 0 or args.threads < 0 or args.stride < 0:
        raise UsageError("--mem-limit-gb and --timeout-min must be positive, --threads and --stride not negative")
    args.shapes = parse_shapes(args.input_shape, args.det_size)
    return args


def run(args: argparse.Namespace, work: Path) -> dict:
    subprocess.run([sys.executable, str(REPO / "scripts" / "fetch_models.py")], check=True, capture_output=True)
    started = time.perf_counter()
    result = {"command": "python benchmarks/compare_ort.py " + " ".join(sys.argv[1:]), "machine": machine(),
              "load_average_at_start": os.getloadavg(), "settings": report.settings(args), "models": []}
    for name in args.models:
        result["models"].append(compare_model(name, args.shapes.get(name), args, work))
    result["load_average_at_end"] = os.getloadavg()
    result["notes"] = report.NOTES
    result["total_wall_s"] = round(time.perf_counter() - started)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = parse_args(argv)
        if args.work_dir:
            args.work_dir.mkdir(parents=True, exist_ok=True)
            if any(args.work_dir.iterdir()):
                raise UsageError(f"--work-dir {args.work_dir} is not empty; give a new or empty folder")
            result = run(args, args.work_dir)
        else:
            with tempfile.TemporaryDirectory(prefix="compare_ort_") as tmp:
                result = run(args, Path(tmp))
    except UsageError as exc:
        print(f"ERROR {exc}", file=sys.stderr)
        return 1
    markdown = report.markdown(result)
    print(markdown)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
