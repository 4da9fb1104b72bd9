"""A Resize of the length of a 3-D [N, C, L] tensor runs on the BPU of the bayes marches as a Resize of one row.

Wave-U-Net's decoder upsamples with ``F.interpolate(mode='linear')`` between Conv1d layers: each upsampling ran
on the CPU with 'Resize on a 3-D tensor [1, 16, 1024]: the BPU of bayes-e (RDK X5) takes 4-D tensors only' (5 BPU
subgraphs, 8 CPU nodes), while the same interpolation of a [N, C, 1, L] map had a BPU form (hunt 20 D3).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from builders import _Graph
from conformance import convert_and_check
from onnx import TensorProto, helper, numpy_helper

from hbtools.graph.graph import GraphView
from hbtools.march.profiles import get_profile
from hbtools.pipeline import optimize

RESIZES = {
    "linear_align_corners_x2": ("linear", "align_corners", {"scales": [1, 1, 2]}),
    "linear_half_pixel_x2": ("linear", "half_pixel", {"scales": [1, 1, 2]}),
    "linear_pytorch_half_pixel_sizes": ("linear", "pytorch_half_pixel", {"sizes": [1, 4, 45]}),
    "linear_asymmetric_x1_5": ("linear", "asymmetric", {"scales": [1, 1, 1.5]}),
    "linear_downsample": ("linear", "half_pixel", {"scales": [1, 1, 0.5]}),
    "nearest_asymmetric_x2": ("nearest", "asymmetric", {"scales": [1, 1, 2]}),
    "nearest_half_pixel_sizes": ("nearest", "half_pixel", {"sizes": [1, 4, 50]}),
    "linear_align_corners_sizes": ("linear", "align_corners", {"sizes": [1, 4, 64]}),
}


def _resize_model(mode: str, coords: str, opset: int, scales: list[float] | None = None,
                  sizes: list[int] | None = None):
    consts = [numpy_helper.from_array(np.zeros(0, np.float32), "roi"),
              numpy_helper.from_array(np.array(scales or [], np.float32), "scales")]
    if sizes is not None:
        consts.append(numpy_helper.from_array(np.array(sizes, np.int64), "sizes"))
    node = helper.make_node("Resize", ["x", *(c.name for c in consts)], ["y"], name="resize", mode=mode,
                            coordinate_transformation_mode=coords)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 25])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], consts)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _run(model, x: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


@pytest.mark.parametrize("opset", [11, 13, 18])
@pytest.mark.parametrize("case", sorted(RESIZES))
def test_one_axis_resizes_keep_their_values_over_a_row(case: str, opset: int) -> None:
    """Every mode and coordinate mode, scales or sizes: no 3-D Resize is left, and the values are onnxruntime's."""
    mode, coords, given = RESIZES[case]
    model = _resize_model(mode, coords, opset, **given)
    optimized = optimize.run(model, get_profile("bayes-e"))
    resizes = [n for n in optimized.graph.node if n.op_type == "Resize"]
    assert all(len(GraphView(optimized).shapes[n.input[0]]) == 4 for n in resizes), \
        [n.op_type for n in optimized.graph.node]
    assert mode == "nearest" or not resizes, [n.op_type for n in optimized.graph.node]
    x = np.random.default_rng(8).standard_normal((1, 4, 25)).astype(np.float32)
    want, got = _run(model, x), _run(optimized, x)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("mode", ["linear", "nearest"])
def test_wave_u_net_upsampling_between_conv1d_layers_runs_on_the_bpu(tmp_path: Path, mode: str) -> None:
    """Conv1d, LeakyRelu, a x2 upsampling of the length (align_corners linear, or nearest), Conv1d: one BPU
    subgraph, no CPU node, close to float."""
    g = _Graph(11)
    y = g.op("Conv", ["audio", g.const(g.rng.standard_normal((8, 2, 5)).astype(np.float32) * 0.5)],
             kernel_shape=[5], pads=[2, 2])
    y = g.op("LeakyRelu", [y], alpha=0.2)
    coords = "align_corners" if mode == "linear" else "asymmetric"
    y = g.op("Resize", [y, "", g.const(np.array([1, 1, 2], np.float32))], mode=mode,
             coordinate_transformation_mode=coords)
    y = g.op("Conv", [y, g.const(g.rng.standard_normal((4, 8, 5)).astype(np.float32) * 0.3)],
             kernel_shape=[5], pads=[2, 2])
    fm = g.model({"audio": [1, 2, 64]}, [y], featuremap={"audio"})
    outcome = convert_and_check(fm, tmp_path, calibration_type="max")
    assert not outcome.cpu, outcome.placement()
    assert min(outcome.cosine) >= 0.995, outcome.cosine


def test_a_long_signals_linear_upsampling_stays_a_resize() -> None:
    """The interpolation matrix of a linear Resize is dense, [in, out]: at 2048 -> 4096 samples it is 8 million
    weights and in * out MACs per channel, and a Wave-U-Net at 16384 samples took the checker 5 minutes and
    3.8 GB (hunt 21 D7). Past ``MAX_INTERPOLATION_ELEMENTS`` the Resize stays as it is, on the CPU."""
    consts = [numpy_helper.from_array(np.zeros(0, np.float32), "roi"),
              numpy_helper.from_array(np.array([1, 1, 2], np.float32), "scales")]
    node = helper.make_node("Resize", ["x", "roi", "scales"], ["y"], name="resize", mode="linear",
                            coordinate_transformation_mode="align_corners")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 2048])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], consts)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    optimized = optimize.run(model, get_profile("bayes-e"))
    assert [n.op_type for n in optimized.graph.node] == ["Resize"]
    assert sum(t.dims[0] * t.dims[1] for t in optimized.graph.initializer if len(t.dims) == 2) == 0
