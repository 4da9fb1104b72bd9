"""An op added as one class (hbtools/ops/maxmin.py) plus its march profile entry: Max / Min of two or more tensors."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from builders import FloatModel, held_out, make_project
from onnx import TensorProto, helper, numpy_helper

from hbtools.log import setup
from hbtools.metrics import cosine_similarity
from hbtools.pipeline.runner import makertbin
from hbtools.runtime import HB_ONNXRuntime
from hbtools.runtime.runtime_model import open_model
from hbtools.runtime.simulator import Simulator


def _model(op: str, third: str | None = None) -> FloatModel:
    """conv_a, conv_b (and a third input: ``full`` another conv, ``channel`` a per-channel mean) -> op -> conv."""
    rng = np.random.default_rng(1)
    w1 = rng.normal(0, 0.4, size=(4, 3, 3, 3)).astype(np.float32)
    w2 = rng.normal(0, 0.2, size=(4, 3, 3, 3)).astype(np.float32)
    w4 = rng.normal(0, 0.3, size=(4, 3, 3, 3)).astype(np.float32)
    picked = ["a", "b"]
    nodes = [helper.make_node("Conv", ["data", "w1"], ["a"], pads=[1, 1, 1, 1], name="conv_a"),
             helper.make_node("Conv", ["data", "w2"], ["b"], pads=[1, 1, 1, 1], name="conv_b")]
    if third:
        nodes.append(helper.make_node("Conv", ["data", "w4"], ["c"], pads=[1, 1, 1, 1], name="conv_c"))
        picked.append("c")
        if third == "channel":
            nodes.append(helper.make_node("GlobalAveragePool", ["c"], ["c_mean"], name="mean_c"))
            picked[-1] = "c_mean"
    nodes += [helper.make_node(op, picked, ["m"], name="pick"),
              helper.make_node("Conv", ["m", "w3"], ["y"], name="conv_out")]
    w3 = rng.normal(0, 0.5, size=(2, 4, 1, 1)).astype(np.float32)
    weights = ((w1, "w1"), (w2, "w2"), (w3, "w3")) + (((w4, "w4"),) if third else ())
    graph = helper.make_graph(nodes, op, [helper.make_tensor_value_info("data", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 8, 8])],
                              [numpy_helper.from_array(w, n) for w, n in weights])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    return FloatModel(model, {"data": [1, 3, 8, 8]}, set())


@pytest.mark.parametrize("third", [None, "full", "channel"])
@pytest.mark.parametrize("op", ["Max", "Min"])
def test_max_min_of_tensors_run_on_the_bpu(tmp_path, op: str, third: str | None) -> None:
    setup(None)
    fm = _model(op, third)
    project = make_project(tmp_path, fm, cal_count=6)
    paths = makertbin(project.config_path, "onnx")
    quantized = onnx.load(str(paths["quantized"]))
    assert [n.op_type for n in quantized.graph.node if n.name == "pick"] == ["HzSQuantizedMaxMin"]
    samples = held_out(fm, count=3, seed=4)
    outs = {}
    for kind in ("original", "calibrated", "quantized"):
        sess = HB_ONNXRuntime(model_file=str(paths[kind]))
        outs[kind] = [sess.run(None, {"data": x})[0] for x in samples]
    sim = Simulator(open_model(paths["bin"]))
    for k, x in enumerate(samples):
        assert cosine_similarity(outs["original"][k], outs["quantized"][k]) >= 0.99
        np.testing.assert_allclose(outs["calibrated"][k], outs["quantized"][k], rtol=0, atol=1e-6)
        simulated = sim.run({"data": x})["y"]  # the numpy reference, independent of the lowering
        np.testing.assert_array_equal(simulated, outs["quantized"][k])
