"""The optimize stage's rewrites compute what the exported graph computes (float32 rounding apart).

Each rewrite puts an exporter's form into one the BPU takes; here the original and the
optimized model run in onnxruntime on the same random input, over the forms' variants.
"""

from __future__ import annotations

import itertools

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from hbtools.pipeline import optimize


def _run(model, x: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def _pool_model(size: int, k: int, s: int, begin: int, end: int, ceil: int, include: int, opset: int):
    node = helper.make_node("AveragePool", ["x"], ["y"], name="pool", kernel_shape=[k, k], strides=[s, s],
                            pads=[begin, begin, end, end], ceil_mode=ceil, count_include_pad=include)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                          [1, 2, size, size + 1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("opset", [11, 19])
def test_average_pools_over_whole_windows_compute_the_same(opset: int) -> None:
    """count_include_pad=0 with padding and ceil_mode windows hanging over the end become a pool of
    whole windows times a constant map; every variant gives onnxruntime's values and shape, and no
    pool is left with a divisor that depends on the position."""
    rng = np.random.default_rng(3)
    rewritten = 0
    for size, k, s, begin, end, ceil, include in itertools.product((7, 8), (2, 3), (1, 2, 3), (0, 1), (0, 1),
                                                                    (0, 1), (0, 1)):
        if k <= max(begin, end):
            continue
        model = _pool_model(size, k, s, begin, end, ceil, include, opset)
        x = rng.standard_normal((1, 2, size, size + 1)).astype(np.float32)
        want = _run(model, x)
        optimized = optimize.run(model)
        got = _run(optimized, x)
        case = (size, k, s, begin, end, ceil, include)
        assert got.shape == want.shape, case
        np.testing.assert_allclose(got, want, atol=1e-5, err_msg=str(case))
        for node in optimized.graph.node:
            if node.op_type == "AveragePool":
                a = {x.name: helper.get_attribute_value(x) for x in node.attribute}
                assert not a.get("ceil_mode", 0), case
                assert a.get("count_include_pad", 0) or not any(a.get("pads", [0])), case
        rewritten += any(n.op_type == "Mul" for n in optimized.graph.node)
    assert rewritten > 20
