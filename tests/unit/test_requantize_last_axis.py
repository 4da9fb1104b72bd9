"""Requantizing an int32 accumulator whose channels are the last axis (Gemm, MatMul outputs).

onnxruntime's per-axis DequantizeLinear walks the channel blocks one by one; with the channels
last each block is one element and the node runs three to four times slower than Sub, Cast and
Mul, which compute the same IEEE operations. Both the calibrated and the quantized model take the
three nodes there, and keep DequantizeLinear where the blocks are maps (conv outputs).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from builders import _Graph, held_out, make_project
from onnx import TensorProto, helper, numpy_helper

from hbtools.log import setup
from hbtools.ops import uint8_kernels
from hbtools.ops.base import LoweringContext
from hbtools.pipeline.runner import makertbin
from hbtools.runtime import HB_ONNXRuntime
from hbtools.runtime.lowering import lower_model
from hbtools.runtime.session import make_session


@pytest.mark.parametrize(("shape", "axis"), [([3, 40, 257], 2), ([5, 64], 1), ([2, 16, 5, 7], 1)])
def test_dequantize_int32_is_dequantize_linear_bit_for_bit(shape: list[int], axis: int) -> None:
    rng = np.random.default_rng(3)
    channels = shape[axis]
    scale = rng.uniform(1e-5, 1e-2, channels).astype(np.float32)
    zero = rng.integers(-2**20, 2**20, channels).astype(np.int32)
    x = rng.integers(-2**30, 2**30, shape).astype(np.int32)
    outputs = []
    for last in (False, True):
        if last and axis != len(shape) - 1:
            continue
        ctx = LoweringContext(13, {"x"}, {})
        nodes: list[onnx.NodeProto] = []
        uint8_kernels.dequantize_int32(ctx, "x", ctx.constant("scale", scale), ctx.constant("zero", zero), axis, last,
                                       "y", nodes)
        assert {n.op_type for n in nodes} == ({"Sub", "Cast", "Mul"} if last else {"DequantizeLinear"})
        graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.INT32, shape)],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)], ctx.initializers)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13),
                                                        helper.make_opsetid("com.microsoft", 1)])
        model.ir_version = 8
        outputs.append(make_session(model).run(["y"], {"x": x})[0])
    blocks = (x.astype(np.int64) - zero.reshape([-1] + [1] * (len(shape) - axis - 1))).astype(np.float32)
    want = blocks * scale.reshape([-1] + [1] * (len(shape) - axis - 1))
    for got in outputs:
        np.testing.assert_array_equal(got, want)


def _head() -> object:
    """A CTC-like head: conv features, a per-channel Gemm to many classes (channels last), a MatMul."""
    g = _Graph(17)
    feat = g.op("Flatten", [g.op("GlobalAveragePool", [g.conv("data", 3, 16)])], axis=1)
    w = (g.rng.standard_normal((64, 16)) / 4).astype(np.float32)
    logits = g.op("Gemm", [feat, g.const(w, "fc"), g.const((0.1 * g.rng.standard_normal(64)).astype(np.float32))],
                  transB=1)
    m = (g.rng.standard_normal((64, 96)) / 8).astype(np.float32)
    return g.model({"data": [1, 3, 8, 8]}, [g.op("MatMul", [g.op("Relu", [logits]), g.const(m, "mm")])], 13)


@pytest.mark.parametrize("calibration_type", ["max", "default"])
def test_gemm_and_matmul_requantize_without_a_per_axis_dequantize_along_the_last_axis(tmp_path,
                                                                                     calibration_type: str) -> None:
    setup(None)
    fm = _head()
    project = make_project(tmp_path, fm, cal_count=4)
    project.write(calibration_parameters={"calibration_type": calibration_type})
    paths = makertbin(project.config_path, "onnx")
    for kind in ("calibrated", "quantized"):
        lowered = lower_model(onnx.load(str(paths[kind])))
        shapes = {v.name: len(v.type.tensor_type.shape.dim)
                  for v in onnx.shape_inference.infer_shapes(lowered).graph.value_info}
        constants = {t.name: numpy_helper.to_array(t) for t in lowered.graph.initializer}
        per_axis_last = [n.name for n in lowered.graph.node if n.op_type == "DequantizeLinear"
                         and n.input[1] in constants and constants[n.input[1]].size > 1
                         and shapes.get(n.input[0]) is not None
                         and next((a.i for a in n.attribute if a.name == "axis"), 1) in (-1, shapes[n.input[0]] - 1)]
        assert not per_axis_last, f"{kind}: per-axis DequantizeLinear along the last axis: {per_axis_last}"
    calibrated, quantized = (HB_ONNXRuntime(model_file=str(paths[k])) for k in ("calibrated", "quantized"))
    for x in held_out(fm, count=4, seed=21):
        np.testing.assert_array_equal(quantized.run(None, {"data": x})[0].astype(np.float32),
                                      calibrated.run(None, {"data": x})[0])
