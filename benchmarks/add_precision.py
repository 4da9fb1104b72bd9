"""Latency of quantized models with their integer adds summed in float64 and in float32.

For each quantized model given, the same model twice in HB_ONNXRuntime's lowering: as written
(its ``HzSQuantizedEltwise`` adds without ``requantize_f32`` sum in float64), and with every
add marked ``requantize_f32`` (multipliers stored as float32), which sums in float32
(docs/ops.md, "Requantization"). The two sessions alternate runs on one input; the best of
``--runs`` counts. Give models quantized before the float32 rule (or any: a flagged add stays
flagged, and the two forms are then the same).

    python benchmarks/add_precision.py WORK/*/hbtools/*_quantized_model.onnx \\
        --json benchmarks/results/add_precision.json --markdown benchmarks/results/add_precision.md
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import AttributeProto, helper, numpy_helper

from hbtools.runtime.lowering import lower_model
from hbtools.runtime.session import ort_session

MULTIPLIERS = ("a_multiplier", "b_multiplier", "multiplier")


def with_float32_adds(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """A copy whose integer adds carry ``requantize_f32``, and how many there are."""
    out = copy.deepcopy(model)
    count = 0
    for node in out.graph.node:
        attrs = {a.name: a for a in node.attribute}
        if node.op_type != "HzSQuantizedEltwise" or attrs["mode"].s != b"add":
            continue
        count += 1
        if "requantize_f32" in attrs:
            continue
        for name in MULTIPLIERS:
            a = attrs.get(name)
            if a is not None and a.type == AttributeProto.TENSOR:
                a.t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(a.t).astype(np.float32), a.t.name))
        node.attribute.append(helper.make_attribute("requantize_f32", 1))
    return out, count


def measure(path: Path, runs: int, threads: int) -> dict:
    model = onnx.load(str(path))
    flagged, adds = with_float32_adds(model)
    sessions = [ort_session(lower_model(m), threads=threads) for m in (model, flagged)]
    feeds = {}
    for i in sessions[0].get_inputs():
        shape = [d if isinstance(d, int) else 1 for d in i.shape]
        dtype = {"tensor(float)": np.float32, "tensor(int8)": np.int8, "tensor(uint8)": np.uint8}[i.type]
        feeds[i.name] = (np.random.default_rng(0).random(shape) * 100).astype(dtype)
    times: list[list[float]] = [[], []]
    for s in sessions:
        s.run(None, feeds)
    for _ in range(runs):
        for k, s in enumerate(sessions):
            start = time.perf_counter()
            s.run(None, feeds)
            times[k].append(time.perf_counter() - start)
    f64, f32 = (min(t) * 1e3 for t in times)
    return {"model": path.name.removesuffix("_quantized_model.onnx"), "adds": adds, "float64_ms": round(f64, 1),
            "float32_ms": round(f32, 1), "ratio": round(f32 / f64, 3)}


def markdown(result: dict) -> str:
    lines = ["## Integer adds: float64 sum against float32 sum", "",
             f"{result['date']}, {result['cores']} cores, {result['threads']} thread(s), best of {result['runs']} "
             f"alternating runs. `{result['command']}`", "",
             "| model | integer adds | float64 sum ms | float32 sum ms | float32 / float64 |", "|---|--:|--:|--:|--:|"]
    lines += [f"| {r['model']} | {r['adds']} | {r['float64_ms']} | {r['float32_ms']} | {r['ratio']} |"
              for r in result["models"]]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", type=Path, help="quantized ONNX files")
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args()
    result = {"command": "python benchmarks/add_precision.py " + " ".join(
                  [*(p.name for p in args.models), "--runs", str(args.runs), "--threads", str(args.threads)]),
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cores": os.cpu_count(),
              "threads": args.threads, "runs": args.runs, "models": []}
    for path in args.models:
        result["models"].append(measure(path, args.runs, args.threads))
        print(json.dumps(result["models"][-1]), flush=True)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    if args.markdown:
        args.markdown.write_text(markdown(result))


if __name__ == "__main__":
    main()
