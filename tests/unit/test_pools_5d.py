"""MaxPool3d / AvgPool3d of video nets run on the BPU of the bayes marches as 2-D pools of views of the 5-D tensor.

X3D, R(2+1)D and C3D stems pool a [N, C, T, H, W] map with kernels such as (1, 3, 3) or (2, 1, 1): the pool went
to the CPU with 'MaxPool on a 5-D tensor ...: the BPU of bayes-e (RDK X5) takes 4-D tensors only', between the
Conv3d layers that run on that BPU (hunt 20 D4).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from builders import _Graph
from click.testing import CliRunner
from conformance import convert_and_check
from onnx import TensorProto, helper

from hbtools.cli.hb_mapper import main
from hbtools.march.profiles import get_profile
from hbtools.pipeline import optimize

POOLS = [
    ("MaxPool", {"kernel_shape": [1, 3, 3], "strides": [1, 2, 2], "pads": [0, 1, 1, 0, 1, 1]}, 17),
    ("AveragePool", {"kernel_shape": [2, 1, 1], "strides": [2, 1, 1]}, 17),
    ("MaxPool", {"kernel_shape": [2, 2, 2], "strides": [2, 2, 2]}, 13),
    ("MaxPool", {"kernel_shape": [3, 3, 2], "strides": [2, 1, 2], "pads": [1, 0, 1, 1, 1, 0], "ceil_mode": 1}, 13),
    ("MaxPool", {"kernel_shape": [3, 2, 3], "dilations": [2, 1, 2], "pads": [2, 0, 1, 0, 1, 2]}, 13),
    ("AveragePool", {"kernel_shape": [3, 3, 3], "strides": [2, 2, 1], "pads": [1, 1, 1, 1, 1, 1]}, 11),
    ("AveragePool", {"kernel_shape": [3, 3, 3], "strides": [2, 2, 1], "pads": [1, 1, 1, 1, 1, 1],
                     "count_include_pad": 1}, 13),
    ("AveragePool", {"kernel_shape": [2, 3, 3], "strides": [2, 2, 2], "pads": [0, 1, 1, 1, 1, 1], "ceil_mode": 1},
     19),
]


def _run(model, x: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


@pytest.mark.parametrize("op, attrs, opset", POOLS)
def test_video_pools_keep_their_values_as_4d_pools(op: str, attrs: dict, opset: int) -> None:
    node = helper.make_node(op, ["x"], ["y"], name="pool", **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 7, 9, 10])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    optimized = optimize.run(model, get_profile("bayes-e"))
    pools = [n for n in optimized.graph.node if n.op_type == op]
    assert pools and all(len(helper.get_attribute_value(next(a for a in p.attribute if a.name == "kernel_shape")))
                         == 2 for p in pools), [n.op_type for n in optimized.graph.node]
    x = np.random.default_rng(5).standard_normal((1, 3, 7, 9, 10)).astype(np.float32)
    want, got = _run(model, x), _run(optimized, x)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_conv3d_stem_with_a_spatial_and_a_temporal_pool_runs_on_the_bpu(tmp_path: Path) -> None:
    """Conv3d (1, 3, 3), MaxPool3d (1, 3, 3) stride (1, 2, 2), Conv3d (3, 1, 1), AvgPool3d (2, 1, 1): one BPU
    subgraph, no CPU node, close to float."""
    g = _Graph(9)
    y = g.op("Conv", ["clip", g.const(g.rng.standard_normal((8, 3, 1, 3, 3)).astype(np.float32) * 0.4)],
             kernel_shape=[1, 3, 3], pads=[0, 1, 1, 0, 1, 1])
    y = g.op("Relu", [y])
    y = g.op("MaxPool", [y], kernel_shape=[1, 3, 3], strides=[1, 2, 2], pads=[0, 1, 1, 0, 1, 1])
    y = g.op("Conv", [y, g.const(g.rng.standard_normal((8, 8, 3, 1, 1)).astype(np.float32) * 0.3)],
             kernel_shape=[3, 1, 1], pads=[1, 0, 0, 1, 0, 0])
    y = g.op("AveragePool", [y], kernel_shape=[2, 1, 1], strides=[2, 1, 1])
    fm = g.model({"clip": [1, 3, 4, 16, 16]}, [y], featuremap={"clip"})
    outcome = convert_and_check(fm, tmp_path, calibration_type="max")
    assert not outcome.cpu, outcome.placement()
    assert min(outcome.cosine) >= 0.995, outcome.cosine

def test_a_5d_op_without_a_5d_form_says_so_where_the_bpu_takes_5d_tensors(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A nearest Resize of a video map (3-D U-Nets) stays on the CPU; on the bayes marches the Conv3d before it
    runs on the BPU, so 'the BPU takes 4-D tensors only' was not true there: its Resize has no 5-D form. RDK X3's
    BPU takes 4-D tensors only, and says so."""
    g = _Graph(10)
    y = g.op("Conv", ["clip", g.const(g.rng.standard_normal((8, 3, 1, 3, 3)).astype(np.float32))],
             kernel_shape=[1, 3, 3], pads=[0, 1, 1, 0, 1, 1])
    y = g.op("Resize", [y, "", g.const(np.array([1, 1, 2, 2, 2], np.float32))], mode="nearest")
    monkeypatch.chdir(tmp_path)
    onnx.save(g.model({"clip": [1, 3, 4, 16, 16]}, [y]).model, "model.onnx")
    shape = "Resize on a 5-D tensor [1, 8, 4, 16, 16]"
    for march, reason in (("bayes-e", f"{shape}: the BPU of bayes-e (RDK X5) has no 5-D Resize (its Resize takes "
                                      f"4-D tensors only)"),
                          ("bernoulli2", f"{shape}: the BPU of bernoulli2 (RDK X3) takes 4-D tensors only")):
        out = CliRunner().invoke(main, ["checker", "--model-type", "onnx", "--march", march, "--model", "model.onnx"],
                                 catch_exceptions=False).output
        assert reason in out, (march, out[-2000:])


@pytest.mark.parametrize("op", ["ReduceMean", "ReduceSum", "ReduceMax"])
def test_x3_names_the_rank_of_a_5d_reduction(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, op: str) -> None:
    """A video net's pooling head or SE gate (ReduceMean over T, H, W of a 5-D map) on RDK X3 said 'ReduceMean is
    not supported on the BPU of bernoulli2', though X3 runs a reduction of a 4-D map; the reason is the rank, as
    for every other node of such a model (hunt 46 D3)."""
    g = _Graph(3)
    w = g.const(np.random.default_rng(0).standard_normal((8, 3, 1, 1, 1)).astype(np.float32), "w")
    reduced = g.op(op, [g.op("Relu", [g.op("Conv", ["x", w])]), g.const(np.array([2, 3, 4], np.int64), "axes")],
                   keepdims=1)
    model = g.model({"x": [1, 3, 4, 8, 8]}, [reduced], opset=18).model
    monkeypatch.chdir(tmp_path)
    onnx.save(model, "model.onnx")
    result = CliRunner().invoke(main, ["checker", "--model-type", "onnx", "--march", "bernoulli2", "--model",
                                       "model.onnx"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert f"{op} on a 5-D tensor [1, 8, 4, 8, 8]: the BPU of bernoulli2 (RDK X3) takes 4-D tensors only" in \
        result.output, result.output
    assert "is not supported" not in result.output
