"""benchmarks/precision_ceiling.py: the calibrated model with its float weights put back."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
from builders import make_project
from onnx import helper
from test_pipeline_small import convert
from test_weight_precision import SHAPE, _edge_model

from hbtools.runtime import HB_ONNXRuntime

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import precision_ceiling  # noqa: E402


def _without_activation_grids(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with every activation calibration node passing its input through."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    nodes = list(out.graph.node)
    del out.graph.node[:]
    for n in nodes:
        kind = next((a.s for a in n.attribute if a.name == "kind"), None)
        out.graph.node.append(helper.make_node("Identity", [n.input[0]], [n.output[0]], name=n.name)
                              if n.op_type == "HzCalibration" and kind == b"activation" else n)
    return out


def test_float_weights_leave_only_the_activation_grids(tmp_path: Path) -> None:
    """Every conv's weight goes back to float: without its activation grids too, the calibrated model
    computes the optimized float model; with them it is closer to float than the quantized model."""
    fm = _edge_model()
    paths = convert(make_project(tmp_path, fm, cal_count=4)).paths
    calibrated, optimized = onnx.load(str(paths["calibrated"])), onnx.load(str(paths["optimized"]))
    floated, switched = precision_ceiling.with_float_weights(calibrated, optimized)
    assert switched == 2  # the two convs' weights (neither has a bias)
    x = np.random.default_rng(1).standard_normal(SHAPE).astype(np.float32) + 2.0
    want = HB_ONNXRuntime(onnx_model=optimized).run(None, {"x": x})[0]
    bare = HB_ONNXRuntime(onnx_model=_without_activation_grids(floated)).run(None, {"x": x})[0]
    np.testing.assert_allclose(bare, want, atol=1e-5 * np.abs(want).max())
    got = HB_ONNXRuntime(onnx_model=floated).run(None, {"x": x})[0]
    quantized = HB_ONNXRuntime(model_file=str(paths["quantized"])).run(None, {"x": x})[0]
    assert np.abs(got - want).max() < np.abs(quantized - want).max()
