"""onnxruntime's MaxPool on 8-bit integers against what the lowering runs instead.

An int8 or uint8 MaxPool runs onnxruntime's generic loop; the lowering
(``hbtools.ops.uint8_kernels.on_float_kernel``) runs a 2-D pool as NhwcMaxPool between two
Transposes and other ranks as Cast, float32 MaxPool, Cast. For the pools of common detectors
and classifiers this times, per dtype: the integer MaxPool, the lowering's nodes, and the float32
MaxPool alone (one thread, best of 3 rounds), and checks the two integer results are equal.

    python benchmarks/integer_pooling.py --json benchmarks/results/integer_pooling.json \\
        --markdown benchmarks/results/integer_pooling.md
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
from onnx import ModelProto, NodeProto, TensorProto, helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
import compare_ort  # noqa: E402

from hbtools.ops.base import CONTRIB_DOMAIN, LoweringContext  # noqa: E402
from hbtools.ops.uint8_kernels import on_float_kernel  # noqa: E402

POOLS = {  # name: (input shape, MaxPool attributes)
    "YOLO SPPF 5x5 s1, 256x20x20": ([1, 256, 20, 20], {"kernel_shape": [5, 5], "pads": [2, 2, 2, 2]}),
    "ResNet stem 3x3 s2, 64x112x112": ([1, 64, 112, 112], {"kernel_shape": [3, 3], "strides": [2, 2],
                                                          "pads": [1, 1, 1, 1]}),
    "2x2 s2, 32x80x80": ([1, 32, 80, 80], {"kernel_shape": [2, 2], "strides": [2, 2]}),
    "PP-OCR cls 2x2 s2, 200x2x96": ([1, 200, 2, 96], {"kernel_shape": [2, 2], "strides": [2, 2]}),
    "1-D 3 s2, 64x4096": ([1, 64, 4096], {"kernel_shape": [3], "strides": [2], "pads": [1, 1]}),
}
TYPES = {"int8": (TensorProto.INT8, np.int8), "uint8": (TensorProto.UINT8, np.uint8)}


def _model(nodes: list[NodeProto], elem: int, shape: list[int]) -> ModelProto:
    graph = helper.make_graph(nodes, "pool", [helper.make_tensor_value_info("x", elem, shape)],
                              [helper.make_tensor_value_info("y", elem, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid(CONTRIB_DOMAIN, 1)])


def _time(model: ModelProto, x: np.ndarray, runs: int) -> tuple[float, np.ndarray]:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    y = session.run(None, {"x": x})[0]
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(runs):
            session.run(None, {"x": x})
        best = min(best, (time.perf_counter() - start) / runs)
    return 1e6 * best, y


def run(runs: int) -> dict:
    rows = []
    for name, (shape, attrs) in POOLS.items():
        for dtype, (elem, np_type) in TYPES.items():
            info = np.iinfo(np_type)
            x = np.random.default_rng(0).integers(info.min, info.max + 1, shape).astype(np_type)
            pool = helper.make_node("MaxPool", ["x"], ["y"], name="pool", **attrs)
            lowered = on_float_kernel(pool, elem, LoweringContext(13, {"x", "y", "pool"}))
            integer_us, want = _time(_model([pool], elem, shape), x, runs)
            lowered_us, got = _time(_model(lowered, elem, shape), x, runs)
            float_pool = _model([helper.make_node("MaxPool", ["x"], ["y"], **attrs)], TensorProto.FLOAT, shape)
            float_us, _ = _time(float_pool, x.astype(np.float32), runs)
            rows.append({"pool": name, "dtype": dtype, "integer_maxpool_us": round(integer_us, 1),
                         "lowered_us": round(lowered_us, 1), "lowered_nodes": [n.op_type for n in lowered],
                         "float32_maxpool_us": round(float_us, 1), "same_result": bool(np.array_equal(want, got))})
            print(f"{name:34s} {dtype:5s} integer {integer_us:9.1f} us, lowered {lowered_us:8.1f} us, "
                  f"float32 {float_us:8.1f} us, same {rows[-1]['same_result']}", flush=True)
    return {"machine": compare_ort.machine(), "runs_per_round": runs, "rows": rows}


def markdown(result: dict) -> str:
    m = result["machine"]
    lines = ["## 8-bit MaxPool: onnxruntime's integer kernel against the lowering", "",
             f"{m['cpu']} ({m['cores']} cores), onnxruntime {m['onnxruntime']}, hbtools {m['hbtools_commit']}. "
             "One thread, best of 3 rounds; µs per run. Shared machine: timings are indicative.", "",
             "`python benchmarks/integer_pooling.py --json benchmarks/results/integer_pooling.json "
             "--markdown benchmarks/results/integer_pooling.md`", "",
             "| pool | dtype | integer MaxPool | lowered (nodes) | float32 MaxPool alone | same integers |",
             "|---|---|--:|--:|--:|---|"]
    for r in result["rows"]:
        lines.append(f"| {r['pool']} | {r['dtype']} | {r['integer_maxpool_us']} | {r['lowered_us']} "
                     f"({', '.join(r['lowered_nodes'])}) | {r['float32_maxpool_us']} | "
                     f"{'yes' if r['same_result'] else 'NO'} |")
    return "\n".join(lines) + "\n"


def kernel_benchmark_main(description: str, measure, table, argv: list[str] | None) -> int:
    """The command line of a kernel benchmark: ``measure(runs)`` gives rows with ``same_result``,
    ``table(result)`` their markdown; exit status 1 when any row's variants disagree."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--runs", type=int, default=20, help="runs per timing round (20)")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--markdown", type=Path, help="write the table here")
    args = parser.parse_args(argv)
    result = measure(args.runs)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    if args.markdown:
        args.markdown.write_text(table(result))
    return 0 if all(r["same_result"] for r in result["rows"]) else 1


def main(argv: list[str] | None = None) -> int:
    return kernel_benchmark_main(__doc__.splitlines()[0], run, markdown, argv)


if __name__ == "__main__":
    sys.exit(main())
