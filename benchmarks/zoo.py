"""The public model corpus: every model through hb_mapper makertbin, next to onnxruntime's quantize_static.

For each corpus model (``scripts/fetch_models.py --zoo``, configs in ``configs/zoo/``) the
same calibration and held-out samples (``scripts/make_calibration_data.py``) go to
``hb_mapper makertbin`` (``calibration_type: default``) and to onnxruntime's
``quantize_static`` (QDQ, per-channel int8; MinMax and Percentile), each in its own process
under a memory cap (compare_ort.py's machinery). Reported per model: the placement (BPU
subgraphs, CPU nodes, from the ``.bin``), makertbin wall time and peak RSS, held-out cosine
mean/min against the float model and task agreement (cls: argmax; det: IoU of the maps
thresholded at 0.3; detect: IoU of the (anchor, class) pairs scoring >= 0.25, cosine on the
class scores; rec and captcha: the greedy-CTC string), the hb_verifier verdict (the
quantized ONNX model against the ``.bin`` on the simulator) and the quantized/float
inference time in HB_ONNXRuntime.

    python benchmarks/zoo.py --json benchmarks/results/zoo.json --markdown benchmarks/results/zoo.md
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import compare_ort  # noqa: E402
import compare_report as report  # noqa: E402
import fetch_models  # noqa: E402
import ort_peer  # noqa: E402

from hbtools.config.loader import load_config  # noqa: E402
from hbtools.eval import ppocr  # noqa: E402
from hbtools.pipeline.runner import artefact_paths  # noqa: E402
from hbtools.runtime.binfile import read_bin  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
CONFIGS = REPO / "configs" / "zoo"
PEER_METHODS = ("MinMax", "Percentile")
OURS = compare_ort.OURS
AGREEMENT = {"cls": "same class", "det": "IoU @0.3", "rec": "same string", "captcha": "same string",
             "detect": "IoU @0.25"}
# Acceptance (issue 13): held-out cosine per task, CTC string agreement.
TARGET_COSINE = {"cls": 0.99, "det": 0.99, "rec": 0.98, "captcha": 0.98, "detect": 0.99}
# detect: an (anchor, class) pair whose score reaches this is a detection (Ultralytics' default conf).
DETECT_THRESH = 0.25
TARGET_STRINGS = 0.8


class UsageError(Exception):
    """Bad command-line input: one ERROR line, exit 1."""


def prepare(name: str, args: argparse.Namespace, work: Path) -> tuple[compare_ort.Setup, str]:
    """Calibration data and a makertbin config for one corpus model under ``work``."""
    task = fetch_models.ZOO[name].task
    config = yaml.safe_load((CONFIGS / f"{name}.yaml").read_text())
    model_params, input_params = config["model_parameters"], config["input_parameters"]
    model_params["onnx_model"] = str((CONFIGS / model_params["onnx_model"]).resolve())
    shape = [int(v) for v in input_params["input_shape"].split("x")]
    size = args.det_size if task == "det" else getattr(args, "detect_size", 0) if task == "detect" else 0
    if size:
        shape[2:] = [size, size]
        input_params["input_shape"] = "x".join(map(str, shape))
    rgb = input_params.get("input_type_train") == "rgb"
    data = fetch_models.ZOO[name].data or task
    splits = compare_ort.sample_generator()(data, args.cal_num, args.heldout_num, size=tuple(shape[2:]), rgb=rgb)
    cal_dir = work / "calibration"
    cal_dir.mkdir(parents=True)
    for i, (kind, arr) in enumerate(splits["calibration"]):
        arr.tofile(cal_dir / f"{i:04d}_{kind}.bin")
    model_params["working_dir"] = str(work / "hbtools")
    if getattr(args, "march", None):
        model_params["march"] = args.march
    config["calibration_parameters"]["cal_data_dir"] = str(cal_dir)
    config["calibration_parameters"]["calibration_type"] = getattr(args, "calibration_type", None) or "default"
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    spec = load_config(path).inputs[0]
    channels = shape[1]
    mean = ort_peer.channel_vector(spec.mean or [0.0], channels)
    scale = ort_peer.channel_vector(spec.scale or [1.0], channels)
    setup = compare_ort.Setup(name, path, Path(model_params["onnx_model"]), spec.name, tuple(shape), mean, scale,
                              cal_dir, [arr for _, arr in splits["heldout"]], work)
    return setup, task


def _ctc_ready(task: str, outs: list[np.ndarray]) -> list[np.ndarray]:
    """rec outputs as N x T x C with the blank first; the captcha model gives T x N x C, blank last."""
    if task != "captcha":
        return outs
    return [np.roll(np.transpose(o, (1, 0, 2)), 1, axis=-1) for o in outs]


def detect_scores(outs: list[np.ndarray], layout: tuple[int, int, int | None]) -> list[np.ndarray]:
    """Per sample, a detector's class scores as anchors x classes (objectness x class where the
    model has an objectness channel); ``layout`` is ``fetch_models.ZooModel.scores``."""
    axis, first, objectness = layout
    scored = []
    for out in outs:
        channels = np.moveaxis(np.asarray(out, dtype=np.float64)[0], axis if axis < 0 else axis - 1, -1)
        scores = channels[..., first:]
        if objectness is not None:
            scores = scores * channels[..., objectness:objectness + 1]
        scored.append(scores)
    return scored


def decoded_boxes(out: np.ndarray, layout: tuple[int, int, int | None],
                  grid: tuple[tuple[int, ...], tuple[int, int]] | None = None) -> np.ndarray:
    """A detector output's boxes as anchors x (centre x, centre y, width, height) in pixels. ``grid``:
    (strides, input height and width) of a raw YOLOX head, decoded as its package does
    (``(xy + cell) * stride``, ``exp(wh) * stride``); else the output holds pixels already."""
    axis = layout[0]
    boxes = np.moveaxis(np.asarray(out, np.float64)[0], axis if axis < 0 else axis - 1, -1)[..., :4].reshape(-1, 4)
    if grid is None:
        return boxes
    strides, (height, width) = grid
    cells = [np.stack(np.meshgrid(np.arange(width // s), np.arange(height // s)), -1).reshape(-1, 2) for s in strides]
    scale = np.concatenate([np.full((len(c), 1), s) for c, s in zip(cells, strides, strict=True)])
    return np.concatenate([(boxes[:, :2] + np.concatenate(cells)) * scale, np.exp(boxes[:, 2:]) * scale], axis=1)


def box_agreement(ref: list[np.ndarray], quant: list[np.ndarray], layout: tuple[int, int, int | None],
                  grid: tuple[tuple[int, ...], tuple[int, int]] | None = None) -> dict:
    """IoU of each quantized box with the float one, at every anchor where the float model detects
    (a class score, objectness x class for YOLOX, of at least ``DETECT_THRESH``); the boxes as
    ``decoded_boxes`` gives them."""
    ious = []
    for r, q, scores in zip(ref, quant, detect_scores(ref, layout), strict=True):
        keep = scores.max(axis=-1) >= DETECT_THRESH
        a, b = (decoded_boxes(t, layout, grid)[keep] for t in (r, q))
        lo = np.maximum(a[:, :2] - a[:, 2:] / 2, b[:, :2] - b[:, 2:] / 2)
        hi = np.minimum(a[:, :2] + a[:, 2:] / 2, b[:, :2] + b[:, 2:] / 2)
        inter = np.prod(np.clip(hi - lo, 0, None), axis=1)
        ious.append(inter / np.maximum(np.prod(a[:, 2:], axis=1) + np.prod(b[:, 2:], axis=1) - inter, 1e-12))
    iou = np.concatenate(ious) if ious else np.zeros(0)
    return {"box_iou_mean": float(iou.mean()) if iou.size else float("nan"),
            "box_iou_min": float(iou.min()) if iou.size else float("nan"), "boxes": int(iou.size)}


def compare(task: str, ref: list[np.ndarray], quant: list[np.ndarray],
            layout: tuple[int, int, int | None] | None = None,
            grid: tuple[tuple[int, ...], tuple[int, int]] | None = None) -> dict:
    """Cosine and task agreement; strings compare class-index sequences (no dictionary needed).

    detect: both measured on the class scores (``detect_scores``; the box coordinates, in pixels,
    would swamp a cosine), agreement the IoU of the (anchor, class) pairs at ``DETECT_THRESH``. As
    for det maps, the cosine counts only the pictures where the float model detects something:
    elsewhere every score is ~0 and the cosine measures rounding noise. The boxes are compared apart
    (``box_agreement``; ``grid`` decodes a raw YOLOX head's)."""
    if task == "detect":
        boxes = box_agreement(ref, quant, layout, grid)
        ref, quant = detect_scores(ref, layout), detect_scores(quant, layout)
        cos = [ppocr.cosine(r, q) for r, q in zip(ref, quant, strict=True) if (r >= DETECT_THRESH).any()]
        iou = ppocr.det_agreement(np.concatenate(ref), np.concatenate(quant), DETECT_THRESH).iou
        mean, low = (float(np.mean(cos)), float(np.min(cos))) if cos else (float("nan"), float("nan"))
        return {"cosine_mean": mean, "cosine_min": low, "cosine_samples": len(cos), "agreement": iou, **boxes}
    metric_task = "rec" if task == "captcha" else task
    ref, quant = _ctc_ready(task, ref), _ctc_ready(task, quant)
    characters = [chr(0x4E00 + k) for k in range(ref[0].shape[-1] - 2)] if metric_task == "rec" else None
    c = ppocr.compare_outputs(metric_task, ref, quant, characters)
    agreement = c.iou if task == "det" else c.agreement
    return {"cosine_mean": c.cosine_mean, "cosine_min": c.cosine_min, "cosine_samples": c.cosine_samples,
            "agreement": agreement}


def evaluate(setup: compare_ort.Setup, task: str, quantized: Path, takes_uint8: bool, threads: int) -> dict:
    ref, quant, timing = compare_ort.infer_pairs(setup, quantized, takes_uint8, threads)
    model = fetch_models.ZOO[setup.name]
    grid = (model.grid_strides, tuple(setup.shape[2:])) if model.grid_strides else None
    return {**compare(task, ref, quant, model.scores, grid), **timing}


def placement(bin_path: Path) -> dict:
    part = read_bin(bin_path).models[0].partition
    cpu = part.get("cpu_nodes", [])
    types: dict[str, int] = {}
    for node in cpu:
        types[node["type"]] = types.get(node["type"], 0) + 1
    return {"bpu_subgraphs": len(part.get("subgraphs", [])),
            "bpu_nodes": sum(len(s["nodes"]) for s in part.get("subgraphs", [])),
            "cpu_nodes": len(cpu), "cpu_types": types}


def verifier(quantized: Path, bin_path: Path) -> str:
    from hbtools.tools.verifier import verify

    try:
        result = verify(quantized, bin_path, None, 5)
    except Exception as exc:  # a verifier crash is a result of this model, not of the benchmark
        return f"error: {type(exc).__name__}: {exc}"[:200]
    bad = [c.name for c in result.outputs if not c.passed]
    return "PASS" if not bad else f"FAIL ({', '.join(bad)})"


def finish(tool: str, measured: compare_ort.Measured, quantized: Path, setup: compare_ort.Setup, task: str,
           takes_uint8: bool, args: argparse.Namespace, detail: dict | None = None) -> dict:
    row = {"tool": tool, "status": "ok", "error": None, "wall_s": round(measured.wall_s, 1),
           "peak_rss_mb": round(measured.peak_rss_mb), **(detail or {})}
    error = measured.error()
    if error is None:
        try:
            row.update(evaluate(setup, task, quantized, takes_uint8, args.threads))
        except Exception as exc:  # an unusable model is a result, not a crash of the benchmark
            error = f"evaluation failed: {type(exc).__name__}: {str(exc).strip()[:300]}"
    if error is not None:
        row.update(status="failed", error=error)
    print(report.progress_line(setup.name, row), flush=True)
    return row


def run_model(name: str, args: argparse.Namespace, work: Path) -> dict:
    setup, task = prepare(name, args, work / name)
    measured, quantized = compare_ort.run_ours(setup, args)
    detail: dict = {}
    paths = artefact_paths(load_config(setup.config))
    if measured.returncode == 0:
        detail = {**compare_ort.precision(paths["calibrated"], setup.work / "hbtools_run" / "hb_mapper_makertbin.log"),
                  **placement(paths["bin"]), "hb_verifier": verifier(quantized, paths["bin"])}
    internal = "internal error" in measured.stdout + measured.stderr
    rows = [finish(OURS, measured, quantized, setup, task, True, args, {**detail, "internal_error": internal})]
    for method in args.peers:
        measured, out, detail = compare_ort.run_peer(setup, method, 0, args)
        rows.append(finish(f"ORT {method}", measured, out, setup, task, False, args, detail))
    source = fetch_models.ZOO[name].requirement + " " + fetch_models.ZOO[name].member
    return {"model": name, "task": task, "source": source,
            "input_shape": list(setup.shape), "calibration_samples": args.cal_num,
            "heldout_samples": args.heldout_num, "agreement": AGREEMENT[task], "runs": rows}


def _f(value: float | None, spec: str = ".4f") -> str:
    return "—" if value is None or (isinstance(value, float) and np.isnan(value)) else format(value, spec)


def _meets(model: dict) -> bool:
    ours = model["runs"][0]
    if ours["status"] != "ok" or ours.get("hb_verifier") != "PASS":
        return False
    ok = ours["cosine_mean"] >= TARGET_COSINE[model["task"]]
    if model["task"] in ("rec", "captcha"):
        ok = ok and ours["agreement"] >= TARGET_STRINGS
    return ok


def markdown(result: dict) -> str:
    method = result["settings"].get("calibration_type", "default")
    lines = [f"## Model corpus: hb_mapper makertbin ({method}) next to onnxruntime quantize_static", "",
             f"{result['machine']['date']}, {result['machine']['cpu']} ({result['machine']['cores']} cores), "
             f"onnxruntime {result['machine']['onnxruntime']}. Load average at start "
             f"{'/'.join(f'{v:.1f}' for v in result['load_average_at_start'])} (shared machine: timings are "
             f"indicative). Total {result['total_wall_s']} s.", "", f"`{result['command']}`", "",
             f"{result['settings']['cal_num']} calibration and {result['settings']['heldout_num']} held-out samples "
             f"per model (scikit-image pictures; rendered strings for the captcha model); det inputs "
             f"{result['settings']['det_size'] or 'as configured'}, object detectors' "
             f"{result['settings'].get('detect_size') or 'as configured'}; march "
             f"{result['settings'].get('march', 'bayes-e')}. Cosine: first output against the float "
             "model (det: pictures whose float map has text; detect: the class scores, objectness x class for "
             "YOLOX, of pictures with a float detection). "
             "Agreement: cls same argmax, det IoU of the maps thresholded at 0.3, detect IoU of the "
             "(anchor, class) pairs scoring ≥ 0.25, rec/captcha same greedy-CTC string. Targets: cosine ≥ 0.99 "
             "(det, detect, cls), ≥ 0.98 (rec), strings ≥ 80 %.", "",
             "| model | input | BPU subgraphs / CPU nodes | wall s | peak MB | cosine mean / min | agreement "
             "| hb_verifier | ms (× float) | ORT MinMax cos / agr | ORT Percentile cos / agr | target met |",
             "|---|---|--:|--:|--:|--:|--:|---|--:|--:|--:|---|"]
    for m in result["models"]:
        ours, peers = m["runs"][0], {r["tool"]: r for r in m["runs"][1:]}
        shape = "x".join(map(str, m["input_shape"][2:]))
        if ours["status"] != "ok":
            lines.append(f"| {m['model']} | {shape} | — | {ours['wall_s']} | {ours['peak_rss_mb']} | — | — | — | — "
                         f"| | | **failed**: {report.shorten(ours['error'])} |")
            continue
        cells = []
        for method in PEER_METHODS:
            r = peers.get(f"ORT {method}")
            cells.append("—" if r is None else (f"{_f(r['cosine_mean'])} / {_f(r['agreement'], '.3f')}"
                                                 if r["status"] == "ok" else "failed"))
        lines.append(
            f"| {m['model']} | {shape} | {ours.get('bpu_subgraphs')} / {ours.get('cpu_nodes')} | {ours['wall_s']} "
            f"| {ours['peak_rss_mb']} | {_f(ours['cosine_mean'])} / {_f(ours['cosine_min'])} "
            f"| {_f(ours['agreement'], '.3f')} | {ours.get('hb_verifier')} "
            f"| {ours['infer_ms']:.1f} ({ours['infer_ms'] / ours['float_ms']:.2f}×) | {cells[0]} | {cells[1]} "
            f"| {'yes' if _meets(m) else '**no**'} |")
    lines += ["", "CPU nodes by type (ours):", ""]
    for m in result["models"]:
        types = m["runs"][0].get("cpu_types") or {}
        lines.append(f"- {m['model']}: " + (", ".join(f"{t} {n}" for t, n in sorted(types.items())) or "none"))
    detectors = [m for m in result["models"] if m["task"] == "detect" and "boxes" in m["runs"][0]]
    if detectors:
        lines += ["", f"Detector boxes: IoU of each quantized box with the float one where the float model detects "
                      f"(class score ≥ {DETECT_THRESH}), mean / min:", ""]
        for m in detectors:
            runs = [f"{'ours' if r['tool'] == OURS else r['tool']} {_f(r.get('box_iou_mean'))} / "
                    f"{_f(r.get('box_iou_min'))}" for r in m["runs"] if r["status"] == "ok" and "boxes" in r]
            lines.append(f"- {m['model']} ({m['runs'][0]['boxes']} boxes): " + ", ".join(runs))
    failed_peers = [(m["model"], r) for m in result["models"] for r in m["runs"][1:] if r["status"] != "ok"]
    if failed_peers:
        lines += ["", "onnxruntime runs that failed:", ""]
        lines += [f"- {name} {r['tool']}: {report.shorten(r['error'])}" for name, r in failed_peers]
    return "\n".join(lines) + "\n"


def model_names(text: str) -> list[str]:
    """The corpus models of a comma-separated ``--models`` value."""
    names = [m.strip() for m in text.split(",") if m.strip()]
    unknown = [m for m in names if m not in fetch_models.ZOO]
    if unknown or not names:
        raise UsageError(f"--models: unknown {', '.join(unknown) or '(none given)'}; choose from "
                         f"{','.join(fetch_models.ZOO)}")
    return names


def our_runs(path: Path) -> dict[str, dict]:
    """Per model, the ``default`` conversion's row of a zoo.py result (models whose run failed left out)."""
    runs = {}
    for m in json.loads(path.read_text())["models"]:
        row = next((r for r in m["runs"] if r["tool"] == OURS and r.get("status") == "ok"), None)
        if row is not None:
            runs[m["model"]] = row
    return runs


def add_corpus_arguments(parser: argparse.ArgumentParser, *, calibration: bool = True) -> None:
    """The options every corpus benchmark shares, with the zoo's defaults: which models, how many samples
    (``calibration``: the calibration ones too), and the input sizes."""
    parser.add_argument("--models", default=",".join(fetch_models.ZOO), help="comma-separated corpus models (all)")
    if calibration:
        parser.add_argument("--cal-num", type=int, default=16, help="calibration samples (16)")
    parser.add_argument("--heldout-num", type=int, default=40, help="held-out samples (40: strings to 2.5 %%)")
    parser.add_argument("--det-size", type=int, default=480, help="det input N x N (480); 0: the config's")
    if calibration:
        parser.add_argument("--detect-size", type=int, default=0,
                            help="object detectors' input N x N (0: the config's; only for exports of dynamic size)")


def target_text(task: str) -> str:
    """Issue 13's targets for a task, as the tables print them."""
    strings = f", strings ≥ {TARGET_STRINGS:.0%}" if task in ("rec", "captcha") else ""
    return f"cos ≥ {TARGET_COSINE[task]}{strings}"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_corpus_arguments(parser)
    parser.add_argument("--peers", default=",".join(PEER_METHODS), help="onnxruntime methods (MinMax,Percentile)")
    parser.add_argument("--mem-limit-gb", type=float, default=12.0, help="address-space cap per quantization run")
    parser.add_argument("--timeout-min", type=float, default=20.0, help="kill a quantization run after this (20)")
    parser.add_argument("--activation-type", default="QInt8", choices=["QInt8", "QUInt8", "QInt16"])
    parser.add_argument("--threads", type=int, default=1, help="onnxruntime threads for the timed inference (1)")
    parser.add_argument("--march", choices=["bernoulli2", "bayes", "bayes-e", "nash-e", "nash-m"],
                        help="convert for this march instead of the configs' (bayes-e)")
    parser.add_argument("--calibration-type", default="default", choices=["default", "max", "kl", "mix", "skip"],
                        help="makertbin's calibration_type (default)")
    parser.add_argument("--json", type=Path, help="write the results here (rewritten after every model)")
    parser.add_argument("--markdown", type=Path, help="write the table here (rewritten after every model)")
    parser.add_argument("--work-dir", type=Path, help="keep configs, data and models here (default: a temp dir)")
    parser.add_argument("--update", action="store_true",
                        help="keep the other models' results already in --json; replace those of --models")
    args = parser.parse_args(argv)
    args.models = model_names(args.models)
    args.peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    if any(p not in ("MinMax", "Percentile", "Entropy") for p in args.peers):
        raise UsageError(f"--peers {args.peers}: choose from MinMax, Percentile, Entropy")
    if args.update and not (args.json and args.json.is_file()):
        raise UsageError("--update needs an existing --json file to update")
    if args.cal_num < 1 or args.heldout_num < 1 or args.det_size < 0 or args.det_size % 32 \
            or args.detect_size < 0 or args.detect_size % 32:
        raise UsageError("--cal-num and --heldout-num must be at least 1, --det-size and --detect-size multiples of 32")
    return args


def run(args: argparse.Namespace, work: Path) -> dict:
    fetch_models.fetch_zoo(args.models)
    started = time.perf_counter()
    result = {"command": "python benchmarks/zoo.py " + " ".join(sys.argv[1:]), "machine": compare_ort.machine(),
              "load_average_at_start": os.getloadavg(),
              "settings": {"cal_num": args.cal_num, "heldout_num": args.heldout_num, "det_size": args.det_size,
                           "detect_size": args.detect_size, "march": args.march or "bayes-e",
                           "calibration_type": args.calibration_type,
                           "peers": args.peers, "activation_type": args.activation_type, "threads": args.threads,
                           "mem_limit_gb": args.mem_limit_gb, "timeout_min": args.timeout_min},
              "models": []}
    runs = {m["model"]: m for m in json.loads(args.json.read_text())["models"]} if args.update else {}
    for name in args.models:
        runs[name] = run_model(name, args, work)
        result["models"] = [runs[n] for n in fetch_models.ZOO if n in runs]
        result["total_wall_s"] = round(time.perf_counter() - started)
        result["load_average_at_end"] = os.getloadavg()
        write(result, args)
    return result


def write(result: dict, args: argparse.Namespace, render: Callable[[dict], str] | None = None) -> None:
    """``result`` as JSON to ``--json`` and as a markdown table (``render``, this module's by default)."""
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2, default=float) + "\n")
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text((render or markdown)(result))


def run_benchmark(argv: Sequence[str] | None, parse: Callable[[Sequence[str] | None], argparse.Namespace],
                  body: Callable[[argparse.Namespace, Path], dict], render: Callable[[dict], str], prefix: str) -> int:
    """A corpus benchmark's main: parse, run ``body`` in ``--work-dir`` (new or empty) or a temporary
    folder, print the table; bad input and failed downloads as one ERROR line, exit 1."""
    try:
        args = parse(argv)
        if args.work_dir:
            args.work_dir.mkdir(parents=True, exist_ok=True)
            if any(args.work_dir.iterdir()):
                raise UsageError(f"--work-dir {args.work_dir} is not empty; give a new or empty folder")
            result = body(args, args.work_dir)
        else:
            with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
                result = body(args, Path(tmp))
    except (UsageError, fetch_models.FetchError) as exc:
        print(f"ERROR {exc}", file=sys.stderr)
        return 1
    print(render(result))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_benchmark(argv, parse_args, run, markdown, "zoo_")


if __name__ == "__main__":
    sys.exit(main())
