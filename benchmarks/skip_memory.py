"""Peak RSS of makertbin (`calibration_type: skip`) on a two-conv model at large input shapes.

Memory should be the model's own activations plus a few bytes per input element. The
reference is onnxruntime alone running the optimized float model once with every
tensor fetched (what calibration must do); both are separate processes measured with
getrusage, so the bytes per input element above that reference are the converter's
own cost.

    python benchmarks/skip_memory.py --sizes 2000 4000 --json benchmarks/results/skip_memory.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import yaml
from onnx import TensorProto, helper, numpy_helper

REPO = Path(__file__).resolve().parent.parent

ORT_ALONE = """
import sys, numpy as np, onnx
from hbtools.runtime.session import fetching_session
m = onnx.load(sys.argv[1])
outs = [n.output[0] for n in m.graph.node]
shape = [d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim]
fetching_session(m, outs).run(outs, {m.graph.input[0].name: np.zeros(shape, np.int8)})
"""


def two_conv() -> onnx.ModelProto:
    """Conv 3->4 3x3, Relu, Conv 4->4 3x3 (dynamic H, W so input_shape sets them)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal(s) * 0.2).astype(np.float32), n)
             for n, s in (("w1", (4, 3, 3, 3)), ("b1", (4,)), ("w2", (4, 4, 3, 3)), ("b2", (4,)))]
    nodes = [helper.make_node("Conv", ["data", "w1", "b1"], ["c1"], name="Conv_0", pads=[1] * 4),
             helper.make_node("Relu", ["c1"], ["r1"], name="Relu_0"),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["out"], name="Conv_1", pads=[1] * 4)]
    graph = helper.make_graph(nodes, "two_conv", [helper.make_tensor_value_info("data", TensorProto.FLOAT,
                                                                                [1, 3, "h", "w"])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return onnx.shape_inference.infer_shapes(model)


def child_peak(cmd: list[str], cwd: Path) -> tuple[int, float]:
    """Peak RSS in bytes of one child process (run in a fresh interpreter via a wrapper)."""
    wrapper = ("import resource, subprocess, sys; p = subprocess.run(sys.argv[1:]); "
               "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(p.returncode)")
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", wrapper, *cmd], cwd=cwd, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"{cmd[:4]} failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return int(proc.stdout.strip().splitlines()[-1]) * 1024, time.perf_counter() - start


def measure(size: int, work: Path) -> dict:
    onnx.save(two_conv(), work / "two_conv.onnx")
    config = {
        "model_parameters": {"onnx_model": "two_conv.onnx", "march": "bayes-e", "working_dir": f"out_{size}",
                             "output_model_file_prefix": "two_conv"},
        "input_parameters": {"input_name": "data", "input_type_train": "rgb", "input_layout_train": "NCHW",
                             "input_type_rt": "rgb", "norm_type": "data_mean_and_scale", "mean_value": "128",
                             "scale_value": "0.0078125", "input_shape": f"1x3x{size}x{size}"},
        "calibration_parameters": {"calibration_type": "skip"},
        "compiler_parameters": {"compile_mode": "latency"},
    }
    (work / "two_conv.yaml").write_text(yaml.safe_dump(config))
    peak, seconds = child_peak(["hb_mapper", "makertbin", "--config", "two_conv.yaml", "--model-type", "onnx"], work)
    optimized = work / f"out_{size}" / "two_conv_optimized_float_model.onnx"
    ort_peak, _ = child_peak([sys.executable, "-c", ORT_ALONE, str(optimized)], work)
    elements = 3 * size * size
    activations = elements * 4 + 3 * (4 * size * size) * 4  # preprocessed input + three 4-channel tensors
    return {"input_shape": f"1x3x{size}x{size}", "input_elements": elements, "peak_rss_bytes": peak,
            "bytes_per_input_element": round(peak / elements, 1),
            "onnxruntime_alone_peak_bytes": ort_peak,
            "float_activation_bytes": activations,
            "above_onnxruntime_alone_bytes_per_element": round((peak - ort_peak) / elements, 1),
            "wall_s": round(seconds, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[2000, 4000])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes:
            rows.append(measure(size, Path(tmp)))
            print(json.dumps(rows[-1]), flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"runs": rows, "host_max_rss_note": "getrusage ru_maxrss of each child",
                                         "python": sys.version.split()[0]}, indent=1) + "\n")


if __name__ == "__main__":
    main()
