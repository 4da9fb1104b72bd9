"""An input with the same values in every calibration sample is named (hunt 33 D2).

Its grid fits those values only: a PaddleDetection-style ``scale_factor`` of [1, 1] in every calibration file
clipped the scale factors of real pictures (boxes 27 px off), and a prompt input left at zeros got a zero range.
Nothing said so.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from builders import FloatModel, make_project
from onnx import TensorProto, helper, numpy_helper
from test_calibration_options import convert


def _model() -> FloatModel:
    """A conv map scaled by a 1x2 side input's mean (a scale factor): x [1, 3, 8, 8], scale [1, 2]."""
    rng = np.random.default_rng(0)
    w = rng.normal(0, 0.3, (4, 3, 3, 3)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("ReduceMean", ["scale"], ["s"], name="mean", axes=[1], keepdims=1),
             helper.make_node("Unsqueeze", ["s", "axes"], ["s4"], name="unsq"),
             helper.make_node("Mul", ["c", "s4"], ["y"], name="scaled")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8]),
                                           helper.make_tensor_value_info("scale", TensorProto.FLOAT, [1, 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array([2, 3]), "axes")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    return FloatModel(onnx.shape_inference.infer_shapes(model), {"x": [1, 3, 8, 8], "scale": [1, 2]}, {"x", "scale"})


@pytest.mark.parametrize("varied", [False, True])
def test_an_input_the_same_in_every_calibration_sample_is_named(tmp_path: Path, varied: bool) -> None:
    fm = _model()
    project = make_project(tmp_path / "p", fm, calibration_type="default", cal_count=4)
    folder = project.root / "cal_scale"
    for k, f in enumerate(sorted(folder.iterdir())):
        np.array([[1.0 + (0.25 * k if varied else 0.0), 1.0]], np.float32).tofile(f)
    log = convert(project).log
    named = [line for line in log if line.startswith("WARNING input 'scale' has the same values")]
    others = [line for line in log if "has the same values" in line and "'scale'" not in line]
    assert not others, others  # the picture input varies
    if varied:
        assert not named, named
    else:
        assert len(named) == 1 and "in all 4 calibration samples (1, 1)" in named[0], named


def test_an_input_only_float_cpu_nodes_read_is_not_named(tmp_path: Path) -> None:
    """A score threshold fed as an input and read by a comparison on the CPU (an NMS's thresholds) has no grid: the
    WARNING said other values are "clipped on the board", and nothing clips them (hunt 48 D7)."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Greater", ["c", "thr"], ["keep"], name="keep")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8]),
                                           helper.make_tensor_value_info("thr", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("c", TensorProto.FLOAT, [1, 4, 8, 8]),
                               helper.make_tensor_value_info("keep", TensorProto.BOOL, [1, 4, 8, 8])],
                              [numpy_helper.from_array(rng.normal(0, 0.3, (4, 3, 3, 3)).astype(np.float32), "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    fm = FloatModel(onnx.shape_inference.infer_shapes(model), {"x": [1, 3, 8, 8], "thr": [1]}, {"x", "thr"})
    project = make_project(tmp_path / "p", fm, calibration_type="max", cal_count=3)
    for f in sorted((project.root / "cal_thr").iterdir()):
        np.array([0.5], np.float32).tofile(f)
    log = convert(project).log
    assert not [line for line in log if "has the same values" in line], log
