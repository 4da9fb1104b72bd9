"""Conv / ConvTranspose / Gemm / MatMul with a constant weight -> HzSQuantizedConv.

The weight's integers are the ones its calibration node implies (``quantize_weight``:
stored float32 steps, GPTQ offsets, folded per-channel input steps); the bias goes on
the accumulator grid exactly as the calibrated model's HzBiasCalibration puts it.
"""

from __future__ import annotations

import numpy as np
from onnx import NodeProto, helper

from hbtools.march.constraints import output_parts
from hbtools.ops.calibration import quantize_weight
from hbtools.ops.names import quantized_tensor
from hbtools.ops.quantized import HzRequantize, HzSQuantizedConv
from hbtools.quant import grids
from hbtools.quant.emitters import emits
from hbtools.quant.emitters.state import ELEM_TYPES, EmitState, QTensor
from hbtools.quant.plan import weight_axis, weight_groups
from hbtools.quant.units import Unit


@emits("conv")
def emit(state: EmitState, unit: Unit) -> None:
    node = unit.main
    a = state.view.attrs(node)
    xq = state.need_q(unit.inputs[0])
    w_attrs = state.weights[node.input[1]]
    w_q, w_scale = weight_integers(state, node, w_attrs)
    folded = "input_scales" in w_attrs
    if folded and not np.array_equal(np.asarray(w_attrs["input_scales"], dtype=np.float32),
                                      xq.scale.astype(np.float32)):
        raise RuntimeError(f"{node.name}: weight calibration was folded with other input scales than "
                           f"{node.input[0]}'s")
    # A folded weight carries the input's per-channel steps: the accumulator step is the weight's.
    acc_scale = w_scale if folded else xq.scale[0] * w_scale
    kind = "MatMul" if node.op_type == "Gemm" else node.op_type
    axis_w = 1 if kind == "MatMul" else weight_axis(node, state.view)
    out_axis = -1 if kind == "MatMul" else 1
    bias = state.view.const(node.input[2]) if len(node.input) > 2 and node.input[2] else None
    b_q = None
    if bias is not None:
        bias = bias.astype(np.float64)
        if node.op_type == "Gemm":
            bias = (bias * a.get("beta", 1.0)).reshape(-1)
        b_q = grids.bias_levels(bias, acc_scale).astype(np.int32)
    rule = state.profile.rule(node.op_type)
    parts = output_parts(node, state.view, rule.channels if rule is not None else None) or [slice(None)]
    pieces = []
    for k, channels in enumerate(parts):
        suffix = f"_part{k}" if len(parts) > 1 else ""
        w_k = w_q[(slice(None),) * axis_w + (channels,)]
        inputs = [xq.name, state.init(quantized_tensor(f"{node.name}_weight{suffix}"), w_k)]
        if b_q is not None:
            inputs.append(state.init(quantized_tensor(f"{node.name}_bias{suffix}"), b_q[channels]))
        pieces.append((inputs, channels))
    conv_attrs = {k: a[k] for k in ("kernel_shape", "strides", "pads", "dilations", "group", "output_padding",
                                    "auto_pad") if k in a}
    if "kernel_shape" not in conv_attrs and kind != "MatMul":
        conv_attrs["kernel_shape"] = list(w_q.shape[2:])
    common = {"kind": kind, "x_bits": xq.bits, "axis": out_axis, "x_zero_point": xq.zero_point or None,
              **conv_attrs}
    if not folded and xq.scale.size == 1 and not a.get("transA", 0):
        # Requantized as onnxruntime's integer kernels do; the calibrated twins keep this accumulator.
        common["requantize_f32"] = 1
    # Largest |accumulator| any input can produce, per output channel (a grouped ConvTranspose's channel
    # reads one group's rows of the weight only).
    groups = 1 if kind == "MatMul" else weight_groups(node, state.view)
    # int8 levels: |level| fits int16 (a copy in int64 was 8 bytes a weight); the sums are taken in int64
    rows = grids.output_channel_rows(np.abs(w_q.astype(np.int16)), axis_w, groups)
    bound = xq.levels_span() * float(rows.sum(axis=1, dtype=np.int64).max())
    if b_q is not None:
        bound += float(np.abs(b_q.astype(np.int64)).max())
    emit_accumulator(state, unit, HzSQuantizedConv, pieces, acc_scale, out_axis, common, bound)


def weight_integers(state: EmitState, node: NodeProto, w_attrs: dict) -> tuple[np.ndarray, np.ndarray]:
    """int8 weight (a Gemm's as MatMul [K, N]) and its float64 step per output channel."""
    levels, _ = quantize_weight(state.view.const(node.input[1]), w_attrs, w_attrs.get("rounding"))
    w_scale = np.asarray(w_attrs["scales"], dtype=np.float32).astype(np.float64)
    if node.op_type == "Gemm":
        a = state.view.attrs(node)
        alpha = float(a.get("alpha", 1.0))
        levels, w_scale = levels * np.sign(alpha), w_scale * abs(alpha)
        if a.get("transB", 0):
            levels = levels.T
    return levels.astype(np.int8), w_scale


def emit_accumulator(state: EmitState, unit: Unit, op: type, pieces: list[tuple[list[str], slice]],
                     acc_scale: np.ndarray, axis: int, common: dict, bound: float | None = None) -> None:
    """An integer product unit's output: requantized in the op, or int32 for CPU readers.

    ``pieces``: the op's inputs, one entry per range of output channels it computes (several where
    the march takes fewer output channels than the unit has; a Concat joins them)."""
    out = unit.outputs[0]
    lo, hi = activation_bounds(state, unit)
    calibrated = out in state.acts
    cpu = state.cpu_needs(out) or not calibrated
    name = unit.main.name
    if calibrated and not cpu:
        qt, oa = state.out_attrs(out, lo, hi)
        _products(state, op, pieces, qt.name, name, grids.multiplier(acc_scale, qt.scale), axis,
                  {**oa, **common}, out, qt.dtype)
        state.record(out, qt)
        return
    # int32 accumulator: dequantized exactly for CPU users / outputs (also at the end of layout moves that carry
    # it there), requantized for BPU users.
    # With int16 operands the sum can exceed int32: drop low bits (a power-of-two multiplier) so
    # it never saturates; the result keeps ~31 significant bits.
    shift = 0
    if bound is not None and bound > grids.INT32_MAX:
        shift = int(np.ceil(np.log2(bound / grids.INT32_MAX)))
    acc_scale = acc_scale * 2.0**shift
    acc_tensor = unit.activation.input[0] if unit.activation is not None else out
    acc = QTensor(f"{acc_tensor}_int32", "int32", np.atleast_1d(acc_scale), axis)
    single = common.pop("requantize_f32", None)  # the int32 accumulator itself stays exact
    _products(state, op, pieces, acc.name, name, [2.0**-shift], axis,
              {"out_type": "int32", "out_min": float(grids.INT32_MIN), "out_max": float(grids.INT32_MAX), **common},
              acc_tensor, "int32")
    state.record(acc_tensor, acc)
    state.int32_read_as_float(acc_tensor)
    if unit.activation is not None:
        state.nodes.append(unit.activation)
        state.floats.update(unit.activation.output)
    if calibrated:
        qt, oa = state.out_attrs(out, lo, hi)
        state.nodes.append(HzRequantize.make_node([acc.name], [qt.name], f"{name}_HzRequantize",
                                                  multiplier=grids.multiplier(acc_scale, qt.scale), axis=axis,
                                                  requantize_f32=single, **oa))
        state.record(out, qt)


def _products(state: EmitState, op: type, pieces: list[tuple[list[str], slice]], out: str, name: str,
              multiplier: list[float], axis: int, attrs: dict, tensor: str, dtype: str) -> None:
    """The product node writing ``out`` (the integer form of float ``tensor``), or one node per piece of
    output channels and the Concat that joins them."""
    if len(pieces) == 1:
        state.nodes.append(op.make_node(pieces[0][0], [out], name, multiplier=multiplier, **attrs))
        return
    shape = state.view.shapes.get(tensor)
    outs = []
    for k, (inputs, channels) in enumerate(pieces):
        outs.append(f"{out}_part{k}")
        state.nodes.append(op.make_node(inputs, [outs[-1]], f"{name}_part{k}", multiplier=multiplier[channels]
                                        if len(multiplier) > 1 else multiplier, **attrs))
        if shape is not None:
            part_shape = list(shape)
            part_shape[axis] = channels.stop - channels.start
            state.value_info.append(helper.make_tensor_value_info(outs[-1], ELEM_TYPES[dtype], part_shape))
    state.nodes.append(helper.make_node("Concat", outs, [out], name=f"{name}_concat", axis=axis))


def activation_bounds(state: EmitState, unit: Unit) -> tuple[float | None, float | None]:
    """The value range a conv unit's fused Relu / Clip allows."""
    act = unit.activation
    if act is None:
        return None, None
    if act.op_type == "Relu":
        return 0.0, None
    vals = [state.view.const(i) for i in act.input[1:3]]
    a = state.view.attrs(act)
    # onnxruntime also takes a bound of shape [1] (Caffe ReLU6 and some exporters write them so)
    lo = float(vals[0].reshape(-1)[0]) if len(vals) > 0 and vals[0] is not None else a.get("min")
    hi = float(vals[1].reshape(-1)[0]) if len(vals) > 1 and vals[1] is not None else a.get("max")
    return lo, hi
