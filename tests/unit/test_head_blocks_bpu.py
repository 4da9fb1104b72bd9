"""YOLO heads on bayes-e: Softmax and constant-tensor arithmetic run on the BPU (issue 16).

The YOLOv8 head's DFL Softmax and the YOLOX decode (grid Add, stride Mul) have integer
kernels; the quantized model stays within quantization error of float, the calibrated
model emulates it exactly and hb_verifier finds the ``.bin`` equal to it.
"""

from __future__ import annotations

from pathlib import Path

import arch_builders
import numpy as np
import onnx
import pytest
from builders import FloatModel, make_project, random_sample
from conformance import convert_and_check
from onnx import TensorProto, helper, numpy_helper

from hbtools.log import setup
from hbtools.metrics import cosine_similarity
from hbtools.pipeline.runner import makertbin
from hbtools.runtime import HB_ONNXRuntime
from hbtools.runtime.runtime_model import open_model
from hbtools.runtime.simulator import Simulator

# block -> the op types that must be on the BPU
ON_BPU = {"yolov8_head": ("Softmax",), "yolox_head": ("Add", "Mul")}


@pytest.mark.parametrize("block", sorted(ON_BPU))
def test_head_runs_on_the_bpu_and_calibrated_emulates_it(block: str, tmp_path: Path) -> None:
    fm = arch_builders.BLOCKS[block]()
    outcome = convert_and_check(fm, tmp_path, "max", checker=True)  # includes hb_verifier
    assert min(outcome.cosine) >= 0.99, outcome.cosine
    cpu_types = {c["type"] for c in outcome.cpu}
    assert not cpu_types & set(ON_BPU[block]), outcome.placement()
    assert "runs on the BPU of bayes-e" not in outcome.log and "only scalar constants" not in outcome.log
    rng = np.random.default_rng(7)
    sessions = {k: HB_ONNXRuntime(model_file=str(outcome.project.artefact(k))) for k in ("calibrated", "quantized")}
    for _ in range(3):
        x = {n: random_sample(fm, n, rng) for n in fm.inputs}
        cal, quant = (sessions[k].run(None, x)[0] for k in ("calibrated", "quantized"))
        span = float(np.abs(quant).max())
        np.testing.assert_allclose(cal, quant, rtol=0, atol=1e-6 * span + 1e-12)


def _softmax_model(opset: int = 13) -> FloatModel:
    """Conv -> Softmax over channels -> Mul by a full-size constant -> a per-channel constant minus it."""
    rng = np.random.default_rng(3)
    w = rng.normal(0, 0.6, size=(8, 3, 3, 3)).astype(np.float32)
    gain = rng.uniform(0.5, 4.0, size=(1, 8, 8, 8)).astype(np.float32)
    offset = rng.normal(0, 0.3, size=(8, 1, 1)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["data", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Softmax", ["c"], ["p"], axis=1, name="softmax"),
             helper.make_node("Mul", ["p", "gain"], ["g"], name="gain_mul"),
             helper.make_node("Sub", ["offset", "g"], ["y"], name="offset_sub")]
    inits = [numpy_helper.from_array(v, n) for v, n in ((w, "w"), (gain, "gain"), (offset, "offset"))]
    data = helper.make_tensor_value_info("data", TensorProto.FLOAT, [1, 3, 8, 8])
    graph = helper.make_graph(nodes, "softmax", [data],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 8, 8])],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
    return FloatModel(model, {"data": [1, 3, 8, 8]}, set())


def test_softmax_and_constant_tensors_follow_the_integer_kernels(tmp_path: Path) -> None:
    """Every output level of the calibrated model is the quantized one; the simulator equals the lowering."""
    setup(None)
    fm = _softmax_model()
    project = make_project(tmp_path, fm, cal_count=6)
    paths = makertbin(project.config_path, "onnx")
    types = {n.name: n.op_type for n in onnx.load(str(paths["quantized"])).graph.node}
    assert types["softmax"] == "HzSQuantizedSoftmax"
    assert types["gain_mul"] == types["offset_sub"] == "HzSQuantizedConstantEltwise"
    sessions = {k: HB_ONNXRuntime(model_file=str(paths[k])) for k in ("original", "calibrated", "quantized")}
    sim = Simulator(open_model(paths["bin"]))
    rng = np.random.default_rng(11)
    for _ in range(6):
        x = random_sample(fm, "data", rng)
        out = {k: s.run(None, {"data": x})[0] for k, s in sessions.items()}
        assert cosine_similarity(out["original"], out["quantized"]) >= 0.99
        np.testing.assert_allclose(out["calibrated"], out["quantized"], rtol=0,
                                   atol=1e-6 * float(np.abs(out["quantized"]).max()))
        np.testing.assert_array_equal(sim.run({"data": x})["y"], out["quantized"])
