"""How much a corpus model's own outputs move under perturbations the size of int8 weight rounding.

For each model (``configs/zoo/``), the float model is scored against copies of itself whose
weights (every Conv, ConvTranspose, Gemm and constant-weight MatMul) carry random noise,
uniform within half a step of the per-output-channel int8 grid (``max|w| / 127``): the error
nearest rounding makes, but random. The held-out samples, preprocessing and metrics are the
zoo's (``zoo.py``), so the spread over the seeds reads against the zoo's targets and our
quantized rows (taken from ``--zoo-json``): where the float model itself, perturbed this
little, misses a target, the target measures that model's sensitivity (pictures at a knife
edge, low-margin characters) more than the quantizer.

    python benchmarks/noise_floor.py --models ppocrv5_det,ppocrv6_tiny_rec \\
        --json benchmarks/results/noise_floor.json --markdown benchmarks/results/noise_floor.md
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import compare_ort  # noqa: E402
import fetch_models  # noqa: E402
import zoo  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def output_channel_axes(model: onnx.ModelProto) -> dict[str, int]:
    """Constant weight (initializer or Constant node output) -> the axis of its output channels, for the
    nodes int8 weights would quantize."""
    constants = {t.name for t in model.graph.initializer}
    constants.update(n.output[0] for n in model.graph.node if n.op_type == "Constant")
    axes: dict[str, int] = {}
    for node in model.graph.node:
        if len(node.input) < 2 or node.input[1] not in constants:
            continue
        if node.op_type == "Conv":
            axes[node.input[1]] = 0
        elif node.op_type == "ConvTranspose":
            axes[node.input[1]] = 1
        elif node.op_type == "Gemm":
            trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0)
            axes[node.input[1]] = 0 if trans_b else 1
        elif node.op_type == "MatMul":
            axes[node.input[1]] = -1
    return axes


def perturbed(model: onnx.ModelProto, seed: int) -> onnx.ModelProto:
    """A copy of ``model`` whose quantizable weights carry uniform noise within half an int8 step."""
    rng = np.random.default_rng(seed)
    axes = output_channel_axes(model)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    tensors = [(t.name, t) for t in out.graph.initializer]
    tensors += [(n.output[0], a.t) for n in out.graph.node if n.op_type == "Constant"
                for a in n.attribute if a.name == "value"]
    for name, t in tensors:
        if name not in axes or t.data_type != onnx.TensorProto.FLOAT:
            continue
        w = numpy_helper.to_array(t)
        if w.ndim < 2:
            continue
        axis = axes[name] % w.ndim
        others = tuple(a for a in range(w.ndim) if a != axis)
        step = np.abs(w).max(axis=others, keepdims=True) / 127.0
        noisy = w + (rng.random(w.shape, dtype=np.float32) - 0.5) * step
        t.CopyFrom(numpy_helper.from_array(noisy.astype(np.float32), t.name))
    return out


def run_model(name: str, args: argparse.Namespace, work: Path, ours: dict | None) -> dict:
    setup, task = zoo.prepare(name, args, work / name)
    source = onnx.load(str(setup.source))
    rows = []
    for seed in range(args.seeds):
        path = work / name / f"noisy_{seed}.onnx"
        onnx.save(perturbed(source, seed), str(path))
        scores = zoo.evaluate(setup, task, path, False, args.threads)  # the noisy copy takes float input
        rows.append({"seed": seed, **{k: scores[k] for k in ("cosine_mean", "cosine_min", "agreement")}})
        path.unlink()
        print(f"{name} seed {seed}: cosine {scores['cosine_mean']:.4f} / {scores['cosine_min']:.4f}, "
              f"agreement {scores['agreement']:.3f}", flush=True)
    result = {"model": name, "task": task, "heldout_samples": args.heldout_num, "seeds": rows}
    if ours is not None:
        result["ours"] = {k: ours.get(k) for k in ("cosine_mean", "cosine_min", "agreement")}
    return result


def _span(rows: list[dict], key: str) -> str:
    values = [r[key] for r in rows]
    return f"{min(values):.4f} / {float(np.median(values)):.4f} / {max(values):.4f}"


def markdown(result: dict) -> str:
    lines = ["## Noise floor: the float model against itself with int8-sized random weight noise", "",
             f"{result['date']}, `{result['command']}`. {result['seeds']} seeds, the zoo's held-out samples and "
             "metrics (`zoo.py`): cosine of the first output (det: pictures whose float map has text), agreement "
             "(det: IoU of the maps at 0.3; rec: same greedy-CTC string). Noise: uniform within half a step of "
             "each output channel's int8 grid on every Conv, ConvTranspose, Gemm and constant-weight MatMul "
             "weight. Ours: the `hbtools makertbin (default)` row of `zoo.json`.", "",
             "| model | targets | noisy float: cosine mean (min / median / max over seeds) | cosine min (same) | "
             "agreement (same) | ours: cosine mean / min, agreement |",
             "|---|---|--:|--:|--:|--:|"]
    for m in result["models"]:
        target = zoo.target_text(m["task"])
        ours = m.get("ours")
        ours_cell = (f"{ours['cosine_mean']:.4f} / {ours['cosine_min']:.4f}, {ours['agreement']:.3f}"
                     if ours and ours.get("cosine_mean") is not None else "—")
        lines.append(f"| {m['model']} | {target} | {_span(m['seeds'], 'cosine_mean')} | "
                     f"{_span(m['seeds'], 'cosine_min')} | {_span(m['seeds'], 'agreement')} | {ours_cell} |")
    return "\n".join(lines) + "\n"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    zoo.add_corpus_arguments(parser, calibration=False)
    parser.add_argument("--seeds", type=int, default=5, help="noise draws per model (5)")
    parser.add_argument("--threads", type=int, default=2, help="onnxruntime threads (2)")
    parser.add_argument("--zoo-json", type=Path, default=REPO / "benchmarks" / "results" / "zoo.json",
                        help="our quantized rows to show beside (benchmarks/results/zoo.json)")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--markdown", type=Path)
    parser.add_argument("--work-dir", type=Path, help="keep configs and data here (default: a temp dir)")
    args = parser.parse_args(argv)
    args.models = zoo.model_names(args.models)
    if args.seeds < 1 or args.heldout_num < 1:
        raise zoo.UsageError("--seeds and --heldout-num must be at least 1")
    args.cal_num, args.detect_size = 1, 0  # zoo.prepare writes calibration samples; none are used here
    return args


def run(args: argparse.Namespace, work: Path) -> dict:
    ours = zoo.our_runs(args.zoo_json) if args.zoo_json.is_file() else {}
    fetch_models.fetch_zoo(args.models)
    started = time.perf_counter()
    result = {"command": "python benchmarks/noise_floor.py " + " ".join(sys.argv[1:]),
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": compare_ort.machine(),
              "seeds": args.seeds, "load_average_at_start": os.getloadavg(), "models": []}
    for name in args.models:
        result["models"].append(run_model(name, args, work, ours.get(name)))
        result["total_wall_s"] = round(time.perf_counter() - started)
        if args.json:
            args.json.write_text(json.dumps(result, indent=2, default=float) + "\n")
        if args.markdown:
            args.markdown.write_text(markdown(result))
    return result


def main(argv: Sequence[str] | None = None) -> int:
    return zoo.run_benchmark(argv, parse_args, run, markdown, "noise_floor_")


if __name__ == "__main__":
    sys.exit(main())
