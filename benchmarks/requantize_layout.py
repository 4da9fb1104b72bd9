"""Requantizing an int32 accumulator per channel: onnxruntime's DequantizeLinear against Sub, Cast, Mul.

``hbtools.ops.uint8_kernels.dequantize_int32`` computes ``float32(acc - zero) * scale`` per channel
as one per-axis DequantizeLinear, or, where the channels are the last axis (Gemm and MatMul
outputs), as Sub (int32), Cast and Mul. This times both forms on accumulators of real heads and
maps (one thread, best of 3 rounds) and checks they give the same bits.

    python benchmarks/requantize_layout.py --json benchmarks/results/requantize_layout.json \\
        --markdown benchmarks/results/requantize_layout.md
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from onnx import ModelProto, TensorProto, helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
import compare_ort  # noqa: E402
from integer_pooling import _time, kernel_benchmark_main  # noqa: E402

from hbtools.ops.base import CONTRIB_DOMAIN, LoweringContext  # noqa: E402
from hbtools.ops.uint8_kernels import dequantize_int32  # noqa: E402

CASES = {  # name: (accumulator shape, channel axis)
    "PP-OCR rec CTC head, 40 x 6625 (channels last)": ([1, 40, 6625], 2),
    "ViT-S linear, 197 x 384 (channels last)": ([197, 384], 1),
    "classifier Gemm, 1 x 1000 (channels last)": ([1, 1000], 1),
    "conv map, 64 x 120 x 120 (channels on axis 1)": ([1, 64, 120, 120], 1),
}


def _model(shape: list[int], axis: int, three_ops: bool, rng: np.random.Generator) -> ModelProto:
    """The requantization in one form; ``three_ops`` on channels not last broadcasts [C, 1, ...] vectors
    (what it would take there, timed to show why the lowering keeps DequantizeLinear for maps)."""
    channels = shape[axis]
    ctx = LoweringContext(13, {"x", "y"})
    along = [channels] + ([1] * (len(shape) - axis - 1) if three_ops else [])
    scale = ctx.constant("scale", rng.uniform(1e-5, 1e-2, channels).astype(np.float32).reshape(along))
    zero = ctx.constant("zero", rng.integers(-2**20, 2**20, channels).astype(np.int32).reshape(along))
    nodes = []
    dequantize_int32(ctx, "x", scale, zero, axis, three_ops, "y", nodes)
    graph = helper.make_graph(nodes, "requantize", [helper.make_tensor_value_info("x", TensorProto.INT32, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)], ctx.initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid(CONTRIB_DOMAIN, 1)])


def run(runs: int) -> dict:
    rows = []
    for name, (shape, axis) in CASES.items():
        acc = np.random.default_rng(0).integers(-2**30, 2**30, shape).astype(np.int32)
        # the same constants in both models: each is built from a generator with the same seed
        per_axis_us, want = _time(_model(shape, axis, False, np.random.default_rng(1)), acc, runs)
        three_us, got = _time(_model(shape, axis, True, np.random.default_rng(1)), acc, runs)
        rows.append({"case": name, "dequantize_linear_us": round(per_axis_us, 1), "sub_cast_mul_us": round(three_us, 1),
                     "same_result": bool(np.array_equal(want, got)), "lowering_uses": "Sub, Cast, Mul"
                     if axis == len(shape) - 1 else "DequantizeLinear"})
        print(f"{name:48s} DequantizeLinear {per_axis_us:8.1f} us, Sub/Cast/Mul {three_us:8.1f} us, "
              f"same {rows[-1]['same_result']}", flush=True)
    return {"machine": compare_ort.machine(), "runs_per_round": runs, "rows": rows}


def markdown(result: dict) -> str:
    m = result["machine"]
    lines = ["## Per-channel requantization of an int32 accumulator: DequantizeLinear against Sub, Cast, Mul", "",
             f"{m['cpu']} ({m['cores']} cores), onnxruntime {m['onnxruntime']}, hbtools {m['hbtools_commit']}. "
             "One thread, best of 3 rounds; µs per run. Shared machine: timings are indicative.", "",
             "`python benchmarks/requantize_layout.py --json benchmarks/results/requantize_layout.json "
             "--markdown benchmarks/results/requantize_layout.md`", "",
             "| accumulator | per-axis DequantizeLinear | Sub, Cast, Mul | same bits | the lowering uses |",
             "|---|--:|--:|---|---|"]
    for r in result["rows"]:
        lines.append(f"| {r['case']} | {r['dequantize_linear_us']} | {r['sub_cast_mul_us']} | "
                     f"{'yes' if r['same_result'] else 'NO'} | {r['lowering_uses']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    return kernel_benchmark_main(__doc__.splitlines()[0], run, markdown, argv)


if __name__ == "__main__":
    sys.exit(main())
