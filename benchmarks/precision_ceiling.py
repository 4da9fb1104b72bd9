"""How close a corpus model can get to float with the grids the BPU offers, and which grid limits it.

For each model (``configs/zoo/``) makertbin converts it with every activation on an int16 grid
(``optimization: set_all_nodes_int16``, the finest the toolkit has); the held-out samples and
metrics are the zoo's (``zoo.py``). Two rows per model:

- *int16 activations*: that quantized model (int8 weights, GPTQ and bias correction as chosen);
- *int16 activations, float weights*: its calibrated model with every Conv, ConvTranspose, Gemm
  and MatMul reading the optimized float model's weight and bias instead of the calibrated ones.
  Activation grids alone: what no choice of weight rounding can win back.

Next to them, the `default` conversion (``--zoo-json``). Where the first row misses a target,
no int16 choice meets it; where the second does, the activation grids alone lose it (weights
cannot repair it); where only the float-weight row meets it, int8 weights are what lose it.

    python benchmarks/precision_ceiling.py --models ppocrv5_det,ppocrv2_rec \\
        --zoo-json benchmarks/results/zoo.json \\
        --json benchmarks/results/precision_ceiling.json --markdown benchmarks/results/precision_ceiling.md
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import onnx
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import compare_ort  # noqa: E402
import fetch_models  # noqa: E402
import zoo  # noqa: E402

from hbtools.config.loader import load_config  # noqa: E402
from hbtools.pipeline.runner import artefact_paths  # noqa: E402

PRODUCTS = ("Conv", "ConvTranspose", "Gemm", "MatMul")
ROWS = ("int16 activations", "int16 activations, float weights")


def with_float_weights(calibrated: onnx.ModelProto, optimized: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """``calibrated`` whose products read the optimized model's constant weights and biases (matched by node
    name), and how many inputs were switched."""
    constants = {t.name: t for t in optimized.graph.initializer}
    sources = {n.name: n for n in optimized.graph.node if n.op_type in PRODUCTS}
    out = onnx.ModelProto()
    out.CopyFrom(calibrated)
    present = {t.name for t in out.graph.initializer}
    switched = 0
    for node in out.graph.node:
        source = sources.get(node.name)
        if node.op_type not in PRODUCTS or source is None:
            continue
        for k in range(1, min(len(node.input), len(source.input))):
            name = source.input[k]
            if name in constants and node.input[k] != name:
                if name not in present:
                    out.graph.initializer.append(constants[name])
                    present.add(name)
                node.input[k] = name
                switched += 1
    return out, switched


def run_model(name: str, args: argparse.Namespace, work: Path, ours: dict | None) -> dict:
    setup, task = zoo.prepare(name, args, work / name)
    config = yaml.safe_load(setup.config.read_text())
    config["calibration_parameters"]["optimization"] = "set_all_nodes_int16"
    setup.config.write_text(yaml.safe_dump(config, sort_keys=False))
    measured, quantized = compare_ort.run_ours(setup, args)
    row: dict = {"model": name, "task": task, "input_shape": list(setup.shape), "wall_s": round(measured.wall_s, 1),
                 "ours_default": ours}
    if measured.returncode != 0:
        return {**row, "error": measured.error()}
    paths = artefact_paths(load_config(setup.config))
    floated, switched = with_float_weights(onnx.load(str(paths["calibrated"])), onnx.load(str(paths["optimized"])))
    float_weights = setup.work / f"{name}_float_weights_calibrated.onnx"
    onnx.save(floated, str(float_weights))
    for label, model in zip(ROWS, (quantized, float_weights), strict=True):
        result = zoo.evaluate(setup, task, model, True, 1)
        row[label] = {k: result[k] for k in ("cosine_mean", "cosine_min", "agreement")}
    row["weights_switched"] = switched
    return row


def _cells(r: dict | None) -> str:
    if not r:
        return "– | – | –"
    return f"{r['cosine_mean']:.4f} | {r['cosine_min']:.4f} | {r['agreement']:.3f}"


def markdown(result: dict) -> str:
    lines = ["## Precision ceiling: every activation int16, with int8 and with float weights", "",
             f"{result['date']}, `{result['command']}`. {result['settings']['heldout_num']} held-out samples "
             "and the zoo's metrics (`zoo.py`: det cosine over pictures whose float map has text, agreement the IoU "
             "of the maps at 0.3; rec: same greedy-CTC string; detect: class scores, IoU of the detections). "
             "*int16 activations*: makertbin with `optimization: set_all_nodes_int16`; *float weights*: its "
             "calibrated model with the optimized model's float weights and biases. Ours: `default` "
             "(from `--zoo-json`).", "",
             "| model | targets | ours (default): cosine mean / min / agreement | int16 activations | "
             "int16 activations, float weights |", "|---|---|--:|--:|--:|"]
    for m in result["models"]:
        target = zoo.target_text(m["task"])
        if "error" in m:
            lines.append(f"| {m['model']} | {target} | {m['error']} | | |")
            continue
        cells = [_cells(m.get("ours_default")).replace(" | ", " / ")] + \
                [_cells(m[label]).replace(" | ", " / ") for label in ROWS]
        lines.append(f"| {m['model']} | {target} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    zoo.add_corpus_arguments(parser)
    parser.add_argument("--zoo-json", type=Path, help="zoo.py results whose default rows go beside these")
    parser.add_argument("--mem-limit-gb", type=float, default=12.0, help="address-space cap per conversion")
    parser.add_argument("--timeout-min", type=float, default=20.0, help="kill a conversion after this (20)")
    parser.add_argument("--json", type=Path, help="write the results here (rewritten after every model)")
    parser.add_argument("--markdown", type=Path, help="write the table here (rewritten after every model)")
    parser.add_argument("--work-dir", type=Path, help="keep configs, data and models here (default: a temp dir)")
    args = parser.parse_args(argv)
    args.models = zoo.model_names(args.models)
    if args.zoo_json and not args.zoo_json.is_file():
        raise zoo.UsageError(f"--zoo-json {args.zoo_json}: no such file")
    return args


def run(args: argparse.Namespace, work: Path) -> dict:
    fetch_models.fetch_zoo(args.models)
    ours = {name: {k: row[k] for k in ("cosine_mean", "cosine_min", "agreement")}
            for name, row in (zoo.our_runs(args.zoo_json) if args.zoo_json else {}).items()}
    result = {"command": "python benchmarks/precision_ceiling.py " + " ".join(sys.argv[1:]),
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": compare_ort.machine(),
              "settings": {"cal_num": args.cal_num, "heldout_num": args.heldout_num, "det_size": args.det_size},
              "models": []}
    for name in args.models:
        result["models"].append(run_model(name, args, work, ours.get(name)))
        zoo.write(result, args, markdown)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    return zoo.run_benchmark(argv, parse_args, run, markdown, "hbtools_ceiling_")

if __name__ == "__main__":
    sys.exit(main())
