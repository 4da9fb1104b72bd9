"""A comparison with a constant and the Where / Cast reading it, as one function of one tensor, is a BPU table.

torch's ``F.threshold(x, t, v)`` exports as ``Where(x <= t, v, x)`` and Caffe's Threshold layer as
``Cast(x > t)``: the comparison and the Where or Cast went to the CPU and cut the BPU graph around them
(hunt 30 D6, hunt 33 D4). A mask that leaves the model (or feeds something else) stays on the CPU, with a reason.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conformance import convert_featuremaps
from onnx import TensorProto, helper, numpy_helper

from hbtools.march.profiles import get_profile
from hbtools.pipeline import optimize
from hbtools.quant.units import build_partition
from hbtools.runtime import HB_ONNXRuntime


def _model(form: str) -> onnx.ModelProto:
    rng = np.random.default_rng(7)
    inits = [numpy_helper.from_array(rng.normal(0, 0.4, (8, 4, 3, 3)).astype(np.float32), "w1"),
             numpy_helper.from_array(rng.normal(0, 0.3, (4, 8, 1, 1)).astype(np.float32), "w2"),
             numpy_helper.from_array(np.array(0.1, np.float32), "t"),
             numpy_helper.from_array(np.array(0.0, np.float32), "v")]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c"], name="conv1", pads=[1, 1, 1, 1])]
    if form == "threshold":  # torch's F.threshold(c, 0.1, 0.0)
        nodes += [helper.make_node("LessOrEqual", ["c", "t"], ["m"], name="le"),
                  helper.make_node("Where", ["m", "v", "c"], ["a"], name="where")]
    else:  # Caffe's Threshold: 1 where c > t
        nodes += [helper.make_node("Greater", ["c", "t"], ["m"], name="gt"),
                  helper.make_node("Cast", ["m"], ["a"], name="cast", to=TensorProto.FLOAT)]
    nodes.append(helper.make_node("Conv", ["a", "w2"], ["y"], name="conv2"))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


@pytest.mark.parametrize("form", ["threshold", "caffe_threshold"])
def test_a_thresholding_runs_on_the_bpu_as_one_table(tmp_path: Path, form: str) -> None:
    model = _model(form)
    rng = np.random.default_rng(0)
    samples = [rng.standard_normal((1, 4, 8, 8)).astype(np.float32) for _ in range(8)]
    out = convert_featuremaps(tmp_path, model, {"x": samples}, "1x4x8x8", "float32", "m")
    assert "The model has 1 BPU subgraph(s) and 0 CPU node(s)" in out, out[-3000:]
    float_model = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    quantized = HB_ONNXRuntime(model_file=str(tmp_path / "out" / "m_quantized_model.onnx"))
    calibrated = HB_ONNXRuntime(model_file=str(tmp_path / "out" / "m_calibrated_model.onnx"))
    for x in (rng.standard_normal((1, 4, 8, 8)).astype(np.float32) for _ in range(4)):
        want = float_model.run(None, {"x": x})[0].ravel()
        got = quantized.run(None, {"x": x})[0].ravel()
        np.testing.assert_array_equal(got, calibrated.run(None, {"x": x})[0].ravel())
        # a step function: a value within a step of the threshold may land on the other side
        assert float(want @ got / np.linalg.norm(want) / np.linalg.norm(got)) > 0.98


def test_a_mask_that_leaves_the_model_stays_on_the_cpu_with_its_reason() -> None:
    w = numpy_helper.from_array(np.ones((4, 4, 1, 1), np.float32), "w")
    t = numpy_helper.from_array(np.array(0.1, np.float32), "t")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"), helper.make_node("Greater", ["c", "t"], ["m"],
                                                                                       name="gt")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
                              [helper.make_tensor_value_info("m", TensorProto.BOOL, [1, 4, 8, 8])], [w, t])
    model = optimize.run(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8))
    units = {u.main.name: u for u in build_partition(model, get_profile("bayes-e"), {}).units}
    assert units["gt"].on == "CPU" and "bool mask" in units["gt"].reason, units["gt"].reason
