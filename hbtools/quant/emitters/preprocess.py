"""HzPreprocess -> a 1x1 integer conv with the coefficients ``integer_affine`` defines."""

from __future__ import annotations

from onnx import helper

from hbtools.ops.names import quantized_tensor
from hbtools.ops.preprocess import HzPreprocess, integer_affine
from hbtools.ops.quantized import HzSQuantizedConv
from hbtools.quant import grids
from hbtools.quant.emitters import emits
from hbtools.quant.emitters.state import ELEM_TYPES, EmitState
from hbtools.quant.units import Unit


@emits("preprocess")
def emit(state: EmitState, unit: Unit) -> None:
    node = unit.main
    w_q, step, bias_q = integer_affine(node)
    out = unit.outputs[0]
    qt, oa = state.out_attrs(out)
    layout = HzPreprocess.read(node)["layout"]
    x = state.input_in_rt_layout(node.input[0], layout)
    if layout == "NHWC":
        x = state.transpose(x, [0, 3, 1, 2], f"{x}_nchw")
    conv_out = qt.name if layout == "NCHW" else quantized_tensor(f"{out}_nchw")
    w = state.init(quantized_tensor(f"{node.name}_weight"), w_q.reshape(*w_q.shape, 1, 1))
    bias = state.init(quantized_tensor(f"{node.name}_bias"), bias_q)
    state.nodes.append(HzSQuantizedConv.make_node(
        [x, w, bias], [conv_out], node.name, kind="Conv", x_bits=8, kernel_shape=[1, 1], axis=1,
        multiplier=grids.multiplier(step, qt.scale), requantize_f32=1, **oa))
    if layout == "NHWC":
        shape = state.view.shapes.get(out)
        nchw = [shape[0], shape[3], shape[1], shape[2]] if shape else None
        state.value_info.append(helper.make_tensor_value_info(conv_out, ELEM_TYPES[qt.dtype], nchw))
        state.transpose(conv_out, [0, 2, 3, 1], qt.name)
    state.record(out, qt)
