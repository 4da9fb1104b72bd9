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


def _resize_model(mode: str, coords: str, opset: int, *, scales=None, sizes=None, h: int = 6, w: int = 7):
    inputs = ["x", "roi", "scales", "sizes"] if sizes is not None else ["x", "roi", "scales"]
    consts = [helper.make_tensor("roi", TensorProto.FLOAT, [0], []),
              helper.make_tensor("scales", TensorProto.FLOAT, [4] if scales is not None else [0], scales or [])]
    if sizes is not None:
        consts.append(helper.make_tensor("sizes", TensorProto.INT64, [4], sizes))
    node = helper.make_node("Resize", inputs, ["y"], name="resize", mode=mode, coordinate_transformation_mode=coords)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, h, w])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], consts)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


RESIZES = {
    "align_corners_x2": ("linear", "align_corners", {"scales": [1, 1, 2, 2]}),
    "half_pixel_x8": ("linear", "half_pixel", {"scales": [1, 1, 8, 8]}),
    "pytorch_half_pixel_sizes": ("linear", "pytorch_half_pixel", {"sizes": [1, 3, 20, 9]}),
    "asymmetric_x1_5": ("linear", "asymmetric", {"scales": [1, 1, 1.5, 1.5]}),
    "width_only": ("linear", "half_pixel", {"scales": [1, 1, 1, 3]}),
    "downsample": ("linear", "half_pixel", {"scales": [1, 1, 0.5, 0.5]}),
    "cubic_x2": ("cubic", "half_pixel", {"scales": [1, 1, 2, 2]}),
}


@pytest.mark.parametrize("opset", [11, 13, 18])
@pytest.mark.parametrize("case", sorted(RESIZES))
def test_interpolations_as_matmuls_compute_the_same(case: str, opset: int) -> None:
    """A linear or cubic Resize the ConvTranspose form does not cover becomes MatMuls by its interpolation
    matrices (align_corners, a factor of 8, sizes, non-integer scales, one axis, downsampling, cubic)."""
    mode, coords, given = RESIZES[case]
    model = _resize_model(mode, coords, opset, **given)
    x = np.random.default_rng(4).standard_normal((1, 3, 6, 7)).astype(np.float32)
    want = _run(model, x)
    optimized = optimize.run(model)
    assert not [n for n in optimized.graph.node if n.op_type == "Resize"], [n.op_type for n in optimized.graph.node]
    got = _run(optimized, x)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, atol=2e-5)
