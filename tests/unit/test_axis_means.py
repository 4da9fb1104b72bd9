"""A mean over one spatial axis of a map (a CRNN's height collapse, ``x.mean(2, keepdim=True)``) where the BPU pools
but has no reduction (RDK X3): an AveragePool over whole columns, on the BPU (it ran on the CPU and split the model
in two; hunt 39 D10). A max the same way as a MaxPool (PointPillars' max over the points of each pillar: hunt 46 D2),
taken in steps of whole windows where the axis is longer than the BPU's pool (the last window padded where the
length has a prime factor beyond the pool's limit; a mean then scaled back by a constant: hunt 47 D3)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from builders import _Graph
from click.testing import CliRunner

from hbtools.cli.hb_mapper import main
from hbtools.march.profiles import get_profile
from hbtools.pipeline import optimize


def _model(axis: int, op: str = "ReduceMean", keepdims: int = 1, length: int = 12) -> onnx.ModelProto:
    g = _Graph(6)
    reduced = g.op(op, [g.op("Relu", [g.conv("x", 3, 8)])], axes=[axis], keepdims=keepdims)
    if not keepdims:
        reduced = g.op("Unsqueeze", [reduced, g.const(np.array([axis], np.int64), "axes")])
    return g.model({"x": [1, 3, 6, length]}, [g.conv(reduced, 8, 4, k=1)]).model


def _outputs(model: onnx.ModelProto, optimized: onnx.ModelProto, x: np.ndarray) -> tuple[list, list]:
    """Both models' outputs for the input ``x`` (as float32)."""
    feed = {"x": x.astype(np.float32)}
    return tuple(ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)
                 for m in (model, optimized))


@pytest.mark.parametrize(("op", "keepdims", "length"), [("ReduceMean", 1, 12), ("ReduceMax", 1, 12),
                                                        ("ReduceMax", 0, 64), ("ReduceMax", 1, 13),
                                                        ("ReduceMean", 1, 13), ("ReduceMean", 0, 80)],
                         ids=["mean", "max", "max-64-no-keepdims", "max-13-padded", "mean-13-padded",
                              "mean-80-no-keepdims-padded"])
@pytest.mark.parametrize("axis", [2, 3], ids=["height", "width"])
def test_a_mean_or_max_over_one_axis_runs_on_the_bpu_of_rdk_x3(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               axis: int, op: str, keepdims: int, length: int) -> None:
    model = _model(axis, op, keepdims, length)
    optimized = optimize.run(model, get_profile("bernoulli2"))
    assert op not in {n.op_type for n in optimized.graph.node}
    want, got = _outputs(model, optimized, np.random.default_rng(7).normal(0, 1, (1, 3, 6, length)))
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6)
    monkeypatch.chdir(tmp_path)
    onnx.save(model, "model.onnx")
    result = CliRunner().invoke(main, ["checker", "--model-type", "onnx", "--march", "bernoulli2", "--model",
                                       "model.onnx"], catch_exceptions=False)
    assert result.exit_code == 0 and "1 BPU subgraph(s) and 0 CPU node(s)" in result.output, result.output


def test_a_max_over_integers_stays_a_reduction(tmp_path: Path) -> None:
    """A pool takes float tensors only: a ReduceMax over W of an int32 map written as a MaxPool made the optimized
    model invalid (hunt 47 D2)."""
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Cast", ["x"], ["i"], to=TensorProto.INT32),
             helper.make_node("ReduceMax", ["i"], ["m"], axes=[3], keepdims=1),
             helper.make_node("Cast", ["m"], ["y"], to=TensorProto.FLOAT)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 3, 13])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    optimized = optimize.run(model, get_profile("bernoulli2"))
    want, got = _outputs(model, optimized, np.random.default_rng(3).normal(0, 50, (1, 2, 3, 13)))
    np.testing.assert_array_equal(got[0], want[0])


@pytest.mark.parametrize(("kernel", "size"), [([5, 5], [10, 10]), ([1, 13], [4, 26]), ([13, 13], [26, 26])])
def test_max_pools_over_several_whole_windows_keep_their_values(kernel: list[int], size: list[int]) -> None:
    """A MaxPool with kernel = stride beyond RDK X3's limit over several windows along an axis: the padded steps
    that reduce one whole axis took values across the windows' borders (hunt 47 D1)."""
    from onnx import TensorProto, helper

    node = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=kernel, strides=kernel)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, *size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    optimized = optimize.run(model, get_profile("bernoulli2"))
    want, got = _outputs(model, optimized, np.random.default_rng(4).normal(0, 1, (1, 2, *size)))
    np.testing.assert_array_equal(got[0], want[0])


def test_a_squeezed_max_that_is_an_output_too_keeps_the_unsqueezed_path_on_the_bpu(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A max without keepdims that is a model output and is unsqueezed again for the next layer: the Unsqueeze's
    readers read the pool itself, so only the output's Squeeze runs on the CPU (hunt 47 D4)."""
    g = _Graph(6)
    reduced = g.op("ReduceMax", [g.op("Relu", [g.conv("x", 3, 8)])], axes=[3], keepdims=0)
    again = g.op("Unsqueeze", [reduced, g.const(np.array([3], np.int64), "axes")])
    model = g.model({"x": [1, 3, 6, 16]}, [reduced, g.conv(again, 8, 4, k=1)]).model
    optimized = optimize.run(model, get_profile("bernoulli2"))
    assert "Unsqueeze" not in {n.op_type for n in optimized.graph.node}
    want, got = _outputs(model, optimized, np.random.default_rng(7).normal(0, 1, (1, 3, 6, 16)))
    for w, o in zip(want, got, strict=True):
        np.testing.assert_allclose(o, w, rtol=1e-6, atol=1e-6)
    monkeypatch.chdir(tmp_path)
    onnx.save(model, "model.onnx")
    result = CliRunner().invoke(main, ["checker", "--model-type", "onnx", "--march", "bernoulli2", "--model",
                                       "model.onnx"], catch_exceptions=False)
    assert result.exit_code == 0 and "1 BPU subgraph(s) and 1 CPU node(s)" in result.output, result.output
