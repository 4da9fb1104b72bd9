"""Layers whose int8 weights spoil their output keep their weights' remainder as a second convolution.

The model: a 3x3 filter whose taps sum to zero (an edge filter) over a small signal on a large level
that differs from sample to sample, as the brightness of pictures does. The filter's output is the
signal alone, a small part of ``|W| |x|``, and rounding its taps to int8 turns the level into an error
of the same order as that output: one that no bias correction repairs, since the level is another
on each sample.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx
import pytest
from builders import FloatModel, Project, make_project
from onnx import TensorProto, helper, numpy_helper
from test_pipeline_small import convert

from hbtools.metrics import cosine_similarity
from hbtools.quant import weight_precision
from hbtools.runtime import HB_ONNXRuntime

SHAPE = [1, 8, 16, 16]


def _edge_model(opset: int = 13) -> FloatModel:
    rng = np.random.default_rng(3)
    edge = rng.standard_normal((8, 8, 3, 3)).astype(np.float32)
    edge -= edge.mean(axis=(1, 2, 3), keepdims=True)  # the taps of each output channel cancel
    inits = [numpy_helper.from_array(edge, "edge_w"),
             numpy_helper.from_array(rng.standard_normal((32, 8, 3, 3)).astype(np.float32) * 0.1, "head_w")]
    nodes = [helper.make_node("Conv", ["x", "edge_w"], ["edges"], name="edge"),
             helper.make_node("Relu", ["edges"], ["edges_relu"], name="relu"),
             helper.make_node("Conv", ["edges_relu", "head_w"], ["y"], name="head", pads=[1, 1, 1, 1])]
    graph = helper.make_graph(nodes, "edge", [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32, 14, 14])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return FloatModel(model, {"x": SHAPE}, featuremap={"x"})


def _samples(levels: np.ndarray, seed: int) -> list[np.ndarray]:
    """A level that differs from sample to sample under a small signal."""
    rng = np.random.default_rng(seed)
    return [(level + 0.02 * rng.standard_normal(SHAPE)).astype(np.float32) for level in levels]


def _project(root: Path, fm: FloatModel, march: str = "bayes-e") -> Project:
    project = make_project(root, fm, cal_count=8, calibration_type="default", march=march)
    for index, x in enumerate(_samples(np.linspace(1.0, 4.0, 8), seed=5)):
        x.tofile(root / "cal_x" / f"{index:03d}.bin")
    return project


def _heldout_cosine(converted, fm: FloatModel) -> float:
    float_session = HB_ONNXRuntime(model_file=str(converted.paths["original"]))
    quantized = HB_ONNXRuntime(model_file=str(converted.paths["quantized"]))
    samples = _samples(np.random.default_rng(99).uniform(1.2, 3.8, 8), seed=99)
    return float(np.mean([cosine_similarity(quantized.run(None, {"x": x})[0], float_session.run(None, {"x": x})[0])
                          for x in samples]))


def test_split_is_the_same_function_with_the_first_weight_on_its_grid() -> None:
    model = _edge_model().model
    edge = weight_precision.ConvWeight("edge", "edge_w", "edges", 0)
    split = weight_precision.split_weights(model, [edge])
    onnx.checker.check_model(split)
    x = np.random.default_rng(0).standard_normal(SHAPE).astype(np.float32)
    want = HB_ONNXRuntime(onnx_model=model).run(None, {"x": x})[0]
    got = HB_ONNXRuntime(onnx_model=split).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, atol=1e-5 * np.abs(want).max())
    grid = numpy_helper.to_array(next(t for t in split.graph.initializer if t.name == "edge_w"))
    steps = np.abs(grid).reshape(8, -1).max(axis=1) / 127
    levels = grid / steps[:, None, None, None]
    np.testing.assert_allclose(levels, np.round(levels), atol=1e-3)  # exactly on the int8 grid
    assert [n.op_type for n in split.graph.node] == ["Conv", "Conv", "Add", "Relu", "Conv"]


@pytest.mark.parametrize("opset", [13, 21])
def test_a_filter_whose_taps_cancel_is_split_before_calibration(tmp_path, opset: int) -> None:
    """makertbin `default` splits the edge filter (and says so), the optimized model still computes the
    float model's function, and the quantized model agrees with float on held-out samples."""
    fm = _edge_model(opset)
    converted = convert(_project(tmp_path, fm))
    lines = [line for line in converted.log if "second int8 convolution" in line]
    assert len(lines) == 1 and lines[0].endswith(": edge"), converted.log_text()
    optimized = onnx.load(str(converted.paths["optimized"]))
    assert "edge" + weight_precision.RESIDUAL in {n.name for n in optimized.graph.node}
    calibrated = onnx.load(str(converted.paths["calibrated"]))
    bits = {n.input[0]: helper.get_attribute_value(a) for n in calibrated.graph.node
            if n.op_type == "HzCalibration" for a in n.attribute if a.name == "bits"}
    assert bits["edges_grid"] == bits["edges" + weight_precision.RESIDUAL] == 16, bits  # the halves: int16
    original = HB_ONNXRuntime(model_file=str(converted.paths["original"]))
    split = HB_ONNXRuntime(onnx_model=optimized)
    for x in _samples(np.array([1.5, 2.5, 3.5]), seed=7):
        want = original.run(None, {"x": x})[0]
        # float32 sums of taps that cancel over a level of 4: rounding at 1e-5 of the output
        np.testing.assert_allclose(split.run(None, {"x": x})[0], want, atol=1e-4 * np.abs(want).max())
    assert _heldout_cosine(converted, fm) >= 0.998


@pytest.mark.parametrize("calibration_type", ["max", "default"])
def test_weights_that_lose_little_are_left_alone(tmp_path, calibration_type: str) -> None:
    """A model whose int8 weights cost less than the floor converts as before: no layer split, no log line."""
    fm = _edge_model()
    model = fm.model
    edge = next(t for t in model.graph.initializer if t.name == "edge_w")
    w = numpy_helper.to_array(edge)
    edge.CopyFrom(numpy_helper.from_array(np.abs(w) + 0.5, "edge_w"))  # no cancelling taps
    converted = convert(make_project(tmp_path, fm, calibration_type=calibration_type))
    optimized = onnx.load(str(converted.paths["optimized"]))
    assert [n.op_type for n in optimized.graph.node if n.op_type == "Conv"] == ["Conv"] * 2
    assert not any("second int8 convolution" in line for line in converted.log)
    assert logging.getLogger("hbtools").level != logging.ERROR  # the quiet plan gave the level back


def test_no_split_on_a_march_without_int16(tmp_path) -> None:
    """The halves of a split layer cancel only in their sum and need int16: bernoulli2 (RDK X3) has none."""
    converted = convert(_project(tmp_path, _edge_model(), march="bernoulli2"))
    optimized = onnx.load(str(converted.paths["optimized"]))
    assert [n.op_type for n in optimized.graph.node if n.op_type == "Conv"] == ["Conv"] * 2
    assert not any("second int8 convolution" in line for line in converted.log)
