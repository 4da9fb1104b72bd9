"""Integer sums of large maps (global average pools, the integer ReduceMean) one axis at a time.

onnxruntime lays the maps behind its uint8 convolutions out as NHWC and runs a sum over H and W
there on a slow strided path (about 4x). The calibrated and the quantized model sum a large
map's levels one axis at a time, the last first; integer sums are exact in any order, so both
models keep every bit.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from builders import _Graph, held_out, make_project
from onnx import TensorProto, helper

from hbtools.log import setup
from hbtools.ops.base import AXIS_BY_AXIS_ELEMENTS, LoweringContext, exact_sum
from hbtools.pipeline.runner import makertbin
from hbtools.runtime import HB_ONNXRuntime
from hbtools.runtime.lowering import lower_model
from hbtools.runtime.session import make_session


@pytest.mark.parametrize("opset", [12, 13])
@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize(("dtype", "elem"), [(np.int32, TensorProto.INT32), (np.float64, TensorProto.DOUBLE)])
@pytest.mark.parametrize("axes", [[2, 3], [1, 2, 3], [3]])
def test_exact_sum_is_the_sum_over_the_axes(opset: int, keepdims: int, dtype: type, elem: int,
                                            axes: list[int]) -> None:
    shape = [2, 8, 128, 160]  # over AXIS_BY_AXIS_ELEMENTS: summed one axis at a time
    rng = np.random.default_rng(4)
    x = rng.integers(-32767, 32768, shape).astype(dtype)
    ctx = LoweringContext(opset, {"x"}, {})
    nodes: list[onnx.NodeProto] = []
    y = exact_sum(ctx, "x", axes, keepdims, x.size, "sum", nodes)
    assert x.size >= AXIS_BY_AXIS_ELEMENTS and len(nodes) == len(axes)
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", elem, shape)],
                              [helper.make_tensor_value_info(y, elem, None)], ctx.initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 7
    got = make_session(model).run([y], {"x": x})[0]
    want = x.astype(np.int64).sum(axis=tuple(axes), keepdims=bool(keepdims))
    np.testing.assert_array_equal(got.astype(np.int64), want)


def _squeeze_excite(h: int) -> object:
    """A conv, then a squeeze-and-excitation gate: the global average pool reads an h x h map."""
    g = _Graph(5)
    x = g.op("Relu", [g.conv("data", 3, 16)])
    gate = g.op("HardSigmoid", [g.conv(g.op("Relu", [g.conv(g.op("GlobalAveragePool", [x]), 16, 4, k=1)]), 4, 16, k=1)])
    return g.model({"data": [1, 3, h, h]}, [g.conv(g.op("Mul", [x, gate]), 16, 8)], 13)


@pytest.mark.parametrize("calibration_type", ["max", "default"])
def test_large_global_average_pools_sum_one_axis_at_a_time_and_keep_every_bit(tmp_path,
                                                                               calibration_type: str) -> None:
    setup(None)
    fm = _squeeze_excite(128)  # 16 x 128 x 128 levels: 2**18
    project = make_project(tmp_path, fm, cal_count=3)
    project.write(calibration_parameters={"calibration_type": calibration_type})
    paths = makertbin(project.config_path, "onnx")
    for kind in ("calibrated", "quantized"):
        sums = [n for n in lower_model(onnx.load(str(paths[kind]))).graph.node if n.op_type == "ReduceSum"]
        assert len(sums) == 2, f"{kind}: {[n.name for n in sums]}"  # the pool's H and W, one at a time
    calibrated, quantized, floats = (HB_ONNXRuntime(model_file=str(paths[k]))
                                     for k in ("calibrated", "quantized", "original"))
    for x in held_out(fm, count=3, seed=8):
        want = floats.run(None, {"data": x})[0]
        got = calibrated.run(None, {"data": x})[0]
        np.testing.assert_array_equal(quantized.run(None, {"data": x})[0].astype(np.float32), got)
        assert np.corrcoef(want.ravel(), got.ravel())[0, 1] > 0.99
