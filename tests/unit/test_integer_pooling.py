"""MaxPool of int8 / uint8 levels: lowered onto kernels that vectorize, with the same integers.

onnxruntime's 8-bit MaxPool is a generic loop, 10-50 times slower than the float32 one
(benchmarks in ``hbtools.ops.uint8_kernels.on_float_kernel``); the lowering of a quantized or
calibrated model must not leave one, and what replaces it must pool the same integers.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from test_pipeline_small import run_model

from hbtools.graph.graph import GraphView
from hbtools.ops.base import CONTRIB_DOMAIN, LoweringContext
from hbtools.ops.uint8_kernels import on_float_kernel
from hbtools.runtime.lowering import lower_model
from hbtools.runtime.session import make_session

POOLS = {
    "stem": ([1, 8, 23, 21], {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    "sppf": ([1, 16, 10, 10], {"kernel_shape": [5, 5], "pads": [2, 2, 2, 2]}),
    "ceil_mode": ([1, 4, 15, 17], {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
    "dilated_asymmetric": ([1, 4, 15, 17], {"kernel_shape": [2, 3], "strides": [1, 2], "pads": [0, 1, 1, 0],
                                            "dilations": [2, 1]}),
    "same_upper": ([1, 4, 9, 9], {"kernel_shape": [3, 3], "auto_pad": "SAME_UPPER", "storage_order": 1}),
    "one_dimensional": ([1, 4, 30], {"kernel_shape": [3], "strides": [2], "pads": [1, 1]}),
}
EIGHT_BIT = {"int8": (TensorProto.INT8, np.int8), "uint8": (TensorProto.UINT8, np.uint8)}


def _model(nodes: list[onnx.NodeProto], elem: int, shape: list[int], inits=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "pool", [helper.make_tensor_value_info("x", elem, shape)],
                              [helper.make_tensor_value_info("y", elem, None)], list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13),
                                                   helper.make_opsetid(CONTRIB_DOMAIN, 1)])


@pytest.mark.parametrize("dtype", sorted(EIGHT_BIT))
@pytest.mark.parametrize("case", sorted(POOLS))
def test_eight_bit_max_pool_is_lowered_to_a_fast_kernel_with_the_same_integers(case: str, dtype: str) -> None:
    shape, attrs = POOLS[case]
    elem, np_type = EIGHT_BIT[dtype]
    node = helper.make_node("MaxPool", ["x"], ["y"], name="pool", **attrs)
    nodes = on_float_kernel(node, elem, LoweringContext(13, {"x", "y", "pool"}))
    assert nodes, "an 8-bit MaxPool was left as it is"
    model = _model(nodes, elem, shape)
    types = GraphView(model).elem_types
    assert not [n.name for n in nodes if n.op_type == "MaxPool" and types.get(n.input[0]) == elem]
    info = np.iinfo(np_type)
    x = np.random.default_rng(3).integers(info.min, info.max + 1, shape).astype(np_type)
    got = make_session(model).run(None, {"x": x})[0]
    # The reference: onnxruntime's float32 MaxPool on the same integers.
    reference = _model([helper.make_node("Cast", ["x"], ["xf"], to=TensorProto.FLOAT),
                        helper.make_node("MaxPool", ["xf"], ["yf"], **attrs),
                        helper.make_node("Cast", ["yf"], ["y"], to=elem)], elem, shape)
    want = make_session(reference).run(None, {"x": x})[0]
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def test_other_max_pools_are_left_alone() -> None:
    ctx = LoweringContext(13, {"x", "y", "i", "pool"})
    pool = helper.make_node("MaxPool", ["x"], ["y"], name="pool", kernel_shape=[2, 2])
    assert on_float_kernel(pool, TensorProto.FLOAT, ctx) == []
    assert on_float_kernel(pool, TensorProto.INT16, ctx) == []  # the quantized model casts those itself
    with_indices = helper.make_node("MaxPool", ["x"], ["y", "i"], name="pool", kernel_shape=[2, 2])
    assert on_float_kernel(with_indices, TensorProto.INT8, ctx) == []


def test_converted_models_lower_no_eight_bit_max_pool(tmp_path: Path) -> None:
    converted = run_model(tmp_path, "data_movement")
    for kind in ("quantized", "calibrated"):
        lowered = lower_model(onnx.load(str(converted.paths[kind])))
        types = GraphView(lowered).elem_types
        pools = [n for n in lowered.graph.node if n.op_type in ("MaxPool", "NhwcMaxPool")]
        assert pools, f"{kind}: the pooling is gone"
        slow = [n.name for n in pools
                if n.op_type == "MaxPool" and types.get(n.input[0]) in (TensorProto.INT8, TensorProto.UINT8)]
        assert not slow, f"{kind}: 8-bit MaxPool left in the lowering: {slow}"


@pytest.mark.parametrize("zero_point", [None, np.uint8(128), np.int8(3)])
def test_a_pool_of_dequantized_levels_pools_the_levels_first(zero_point) -> None:
    """onnxruntime moves a DequantizeLinear after the MaxPool it feeds (QDQ propagation), leaving a MaxPool
    on 8-bit integers; the lowering pools the integers itself, on a fast kernel, with the same result."""
    from hbtools.runtime.lowering import _pools_before_dequantization

    np_type = np.uint8 if zero_point is None else type(zero_point)
    elem = TensorProto.INT8 if np_type == np.int8 else TensorProto.UINT8
    ctx = LoweringContext(13, {"x", "y", "v", "step", "zero"})
    inputs = ["x", ctx.constant("step", np.array(0.25, np.float32))]
    if zero_point is not None:
        inputs.append(ctx.constant("zero", np.array(zero_point)))
    nodes = [helper.make_node("DequantizeLinear", inputs, ["v"], name="dq"),
             helper.make_node("MaxPool", ["v"], ["y"], name="pool", kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4)]
    moved = _pools_before_dequantization(nodes, ctx)
    made = {o: n for n in moved for o in n.output}
    assert all(made[n.input[0]].op_type != "DequantizeLinear" for n in moved if n.op_type.endswith("MaxPool")
               and n.input[0] in made), "a pool still reads a DequantizeLinear"
    shape = [1, 8, 21, 19]
    info = np.iinfo(np_type)
    x = np.random.default_rng(5).integers(info.min, info.max + 1, shape).astype(np_type)

    def run(graph_nodes: list[onnx.NodeProto]) -> np.ndarray:
        graph = helper.make_graph(graph_nodes, "g", [helper.make_tensor_value_info("x", elem, shape)],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], ctx.initializers)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13),
                                                        helper.make_opsetid(CONTRIB_DOMAIN, 1)])
        return make_session(model).run(None, {"x": x})[0]

    np.testing.assert_array_equal(run(moved), run(nodes))
