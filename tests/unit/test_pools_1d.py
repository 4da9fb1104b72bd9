"""MaxPool1d / AvgPool1d after Conv1d layers run on the BPU as pools over a 4-D tensor of one row.

atspm-detector (PyPI) ships a 1-D CNN over [1, 15, T] traffic-signal rasters whose stem is Conv1d, GELU,
MaxPool1d: 'MaxPool on a 3-D tensor [1, 32, 300]: the BPU takes 4-D tensors only' put the pool and the GELU
before it on the CPU, splitting the model into two BPU subgraphs.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from builders import _Graph
from conformance import convert_and_check
from onnx import TensorProto, helper

from hbtools.march.profiles import get_profile
from hbtools.pipeline import optimize


@pytest.mark.parametrize("op, attrs, opset", [
    ("MaxPool", {"kernel_shape": [2], "strides": [2]}, 13),
    ("MaxPool", {"kernel_shape": [3], "strides": [2], "pads": [1, 1], "ceil_mode": 1}, 11),
    ("MaxPool", {"kernel_shape": [3], "dilations": [2], "pads": [2, 1]}, 13),
    ("AveragePool", {"kernel_shape": [4], "strides": [3], "pads": [1, 2], "count_include_pad": 1}, 13),
    ("AveragePool", {"kernel_shape": [3], "strides": [1], "pads": [1, 1]}, 11),
])
def test_one_axis_pools_keep_their_values(op: str, attrs: dict, opset: int) -> None:
    node = helper.make_node(op, ["x"], ["y"], name="pool", **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 5, 29])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    optimized = optimize.run(model, get_profile("bayes-e"))
    pool = next(n for n in optimized.graph.node if n.op_type == op)
    assert len(helper.get_attribute_value(next(a for a in pool.attribute if a.name == "kernel_shape"))) == 2
    x = np.random.default_rng(2).standard_normal((1, 5, 29)).astype(np.float32)
    run = [ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
           for m in (model, optimized)]
    assert run[0].shape == run[1].shape
    np.testing.assert_allclose(run[1], run[0], rtol=1e-6, atol=1e-6)


def test_conv1d_stem_with_max_pool_runs_on_the_bpu(tmp_path: Path) -> None:
    """Conv1d, Sigmoid-gated activation, MaxPool1d, Conv1d: one BPU subgraph, no CPU node, close to float."""
    g = _Graph(8)
    y = g.op("Conv", ["feat", g.const(g.rng.standard_normal((8, 4, 5)).astype(np.float32) * 0.5)],
             kernel_shape=[5], pads=[2, 2])
    y = g.op("Mul", [y, g.op("Sigmoid", [y])])
    y = g.op("MaxPool", [y], kernel_shape=[2], strides=[2])
    y = g.op("Conv", [y, g.const(g.rng.standard_normal((6, 8, 3)).astype(np.float32) * 0.4)],
             kernel_shape=[3], pads=[1, 1])
    fm = g.model({"feat": [1, 4, 60]}, [y], featuremap={"feat"})
    outcome = convert_and_check(fm, tmp_path, calibration_type="max")
    assert not outcome.cpu, outcome.placement()
    assert min(outcome.cosine) >= 0.995, outcome.cosine
