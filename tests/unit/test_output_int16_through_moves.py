"""``set_model_output_int16`` where a data movement op writes the model output: a super-resolution net ends in a
PixelShuffle (DepthToSpace) after its last conv. The DepthToSpace carries the conv's grid, and the request was
dropped without a word: the picture left the BPU on an int8 grid (141 grey levels; hunt 45 D5). The conv's output is
now int16, as for a conv that writes the output itself."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from conformance import convert_featuremaps
from onnx import TensorProto, helper, numpy_helper

from horizon_tc_ui import HB_ONNXRuntime


def _model(last: str) -> onnx.ModelProto:
    rng = np.random.default_rng(4)
    w = numpy_helper.from_array((rng.standard_normal((12, 3, 3, 3)) / 4).astype(np.float32), "w")
    shape = numpy_helper.from_array(np.array([1, 3, 16, 16], np.int64), "shape")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1])]
    nodes.append(helper.make_node("DepthToSpace", ["c"], ["y"], name="shuffle", blocksize=2, mode="CRD")
                 if last == "DepthToSpace" else helper.make_node("Reshape", ["c", "shape"], ["y"], name="view"))
    graph = helper.make_graph(nodes, "sr", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w, shape])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("last", ["DepthToSpace", "Reshape"])
def test_an_output_written_by_a_data_movement_takes_int16(tmp_path: Path, last: str) -> None:
    rng = np.random.default_rng(0)
    samples = [rng.uniform(0, 1, (1, 3, 8, 8)).astype(np.float32) for _ in range(4)]
    out = convert_featuremaps(tmp_path, _model(last), {"x": samples}, "1x3x8x8", "float32", "sr", "max",
                              {"optimization": "set_model_output_int16"})
    assert "model output types  : [<InputDataType.S16" in out, out[-3000:]
    quantized = HB_ONNXRuntime(model_file=str(tmp_path / "out" / "sr_quantized_model.onnx"))
    calibrated = HB_ONNXRuntime(model_file=str(tmp_path / "out" / "sr_calibrated_model.onnx"))
    x = {"x": rng.uniform(0, 1, (1, 3, 8, 8)).astype(np.float32)}
    levels, want = quantized.run(None, x)[0], calibrated.run(None, x)[0]
    assert levels.dtype == np.int16
    step = np.median(want[levels != 0] / levels[levels != 0])  # the output descriptor's scale
    np.testing.assert_allclose(levels * step, want, rtol=1e-6, atol=1e-7)
    assert len(np.unique(levels)) > 700  # int16: about one level per value, not an int8 grid's 255 at most


def test_default_says_why_no_tensor_is_int16(tmp_path: Path) -> None:
    """When every output already passes the int16 search's goal with all tensors int8, ``default`` gave nothing int16
    and said nothing of why (an SR net on RDK X5 left at 141 output levels: hunt 45 D2); one line says it and what
    gives an output more."""
    rng = np.random.default_rng(1)
    samples = [rng.uniform(0, 1, (1, 3, 8, 8)).astype(np.float32) for _ in range(4)]
    out = convert_featuremaps(tmp_path, _model("DepthToSpace"), {"x": samples}, "1x3x8x8", "float32", "sr")
    assert "mixed precision: the search makes no tensor int16: with every tensor it decides on int8, each output " \
           "already scores" in out, out[-3000:]
    assert "set_model_output_int16 give a tensor int16" in out
