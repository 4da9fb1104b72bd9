"""HzPreprocess: intermediate int8 pixels -> normalised float train input (SPEC §5, §7)."""

from __future__ import annotations

import numpy as np
from onnx import NodeProto, TensorProto, helper, numpy_helper

from hbtools.config.model import ALLOWED_RT_FOR_TRAIN, InputSpec
from hbtools.config.schema import NORM_TYPES
from hbtools.data import colour
from hbtools.data.intermediate import channels_last, from_channels_last
from hbtools.errors import HbError
from hbtools.ops import twins
from hbtools.ops.base import REQUIRED, HzOp, LoweringContext, attrs_of
from hbtools.ops.registry import register
from hbtools.quant import grids

_CHANNELS = {"rgb": 3, "bgr": 3, "yuv444": 3, "gray": 1}


@register
class HzPreprocess(HzOp):
    """Colour conversion plus mean/scale for one image input.

    Input: int8 tensor of the intermediate type (uint8 value − 128), 4-D in
    ``layout``. Output: float32, same shape, ``(convert(x + 128) − mean) × scale``.

    Attributes:
        input_type_rt (str): nv12 | yuv444 | rgb | bgr | gray. For nv12 the
            input is already upsampled yuv444, as the hardware delivers it.
        input_type_train (str): yuv444 | rgb | bgr | gray.
        input_space_and_range (str): regular | bt601_video (range of the YUV input).
        layout (str): NCHW | NHWC, the input and output layout.
        norm_type (str): no_preprocess | data_mean | data_scale | data_mean_and_scale.
        mean (floats): one per channel, in train channel order.
        scale (floats): one per channel, in train channel order.
        integer (int, default 0): 1 computes with the BPU's integer coefficients
            (``integer_affine``) instead of the exact ones. The calibrated model sets
            it, so it emulates the quantized model's preprocessing conv exactly.
    """

    op_type = "HzPreprocess"
    attributes = {"input_type_rt": REQUIRED, "input_type_train": REQUIRED, "input_space_and_range": "regular",
                  "layout": REQUIRED, "norm_type": REQUIRED, "mean": REQUIRED, "scale": REQUIRED, "integer": 0}
    shape_preserving = True
    float_output = True

    @classmethod
    def lower(cls, node: NodeProto, ctx: LoweringContext) -> list[NodeProto]:
        m, b, step = _coefficients(node)
        layout = attrs_of(node)["layout"]
        x, y = node.input[0], node.output[0]
        xf = ctx.unique(f"{node.name}_float")
        nodes = [helper.make_node("Cast", [x], [xf], name=ctx.unique(f"{node.name}_cast"), to=TensorProto.FLOAT)]
        affine_out = y if step is None else ctx.unique(f"{node.name}_accumulator")
        if not np.any(m - np.diag(np.diag(m))):
            # No colour conversion: a scale and a shift per channel, element-wise. onnxruntime ran the
            # 1x1 convolution over three channels at about 11 ns a pixel (13.4 ms of a 640x640 image,
            # 8 % of PP-OCRv4 det's float run), the two products at under 2. With integer coefficients
            # both forms are exact; with float ones they may differ in the last bit.
            shape = [1, -1, 1, 1] if layout == "NCHW" else [-1]
            scale = ctx.constant(f"{node.name}_diagonal", np.diag(m).astype(np.float32).reshape(shape))
            shift = ctx.constant(f"{node.name}_shift", b.astype(np.float32).reshape(shape))
            scaled = ctx.unique(f"{node.name}_scaled")
            nodes += [helper.make_node("Mul", [xf, scale], [scaled], name=ctx.unique(f"{node.name}_mul")),
                      helper.make_node("Add", [scaled, shift], [affine_out], name=ctx.unique(f"{node.name}_add"))]
        elif layout == "NCHW":
            bias = ctx.constant(f"{node.name}_bias", b.astype(np.float32))
            c = m.shape[0]
            w = ctx.constant(f"{node.name}_weight", m.reshape(c, c, 1, 1).astype(np.float32))
            nodes.append(helper.make_node("Conv", [xf, w, bias], [affine_out], name=ctx.unique(f"{node.name}_conv")))
        else:
            bias = ctx.constant(f"{node.name}_bias", b.astype(np.float32))
            w = ctx.constant(f"{node.name}_weight", m.T.astype(np.float32))
            xm = ctx.unique(f"{node.name}_matmul_out")
            nodes += [
                helper.make_node("MatMul", [xf, w], [xm], name=ctx.unique(f"{node.name}_matmul")),
                helper.make_node("Add", [xm, bias], [affine_out], name=ctx.unique(f"{node.name}_add")),
            ]
        if step is not None:
            # Integer coefficients: the sums above are exact in float32; one product scales them,
            # in float64 where the calibrated model keeps twins (hbtools.ops.twins).
            shape = [1, -1, 1, 1] if layout == "NCHW" else [-1]
            if not ctx.exact:
                s = ctx.constant(f"{node.name}_step", step.astype(np.float32).reshape(shape))
                nodes.append(helper.make_node("Mul", [affine_out, s], [y], name=ctx.unique(f"{node.name}_scale")))
                return nodes
            s = ctx.constant(f"{node.name}_step", step.astype(np.float64).reshape(shape))
            acc = twins.to_double(ctx, affine_out, f"{node.name}_accumulator", nodes)
            value = ctx.unique(f"{node.name}_value_f64")
            nodes.append(helper.make_node("Mul", [acc, s], [value], name=value))
            twins.to_float(ctx, value, y, nodes)
            # An integer conv's accumulator: its fake quant follows the conv requantization.
            ctx.twins[y] = twins.Twin(value, acc, s, twins.ACCUMULATOR_BITS, scalar_step=False)
        return nodes

    @classmethod
    def reference(cls, node: NodeProto, inputs: list[np.ndarray]) -> list[np.ndarray]:
        a = attrs_of(node)
        if a.get("integer", 0):
            w_q, step, bias_q = integer_affine(node)
            pixels = channels_last(inputs[0].astype(np.int64), a["layout"])
            acc = (pixels @ w_q.astype(np.int64).T + bias_q.astype(np.int64)).astype(np.float32)
            out = acc * step.astype(np.float32)
            return [np.ascontiguousarray(from_channels_last(out, a["layout"])).astype(np.float32)]
        pixels = channels_last(inputs[0].astype(np.float64) + 128.0, a["layout"])
        src = colour.intermediate_space(a["input_type_rt"], a["input_space_and_range"])
        v = colour.convert(pixels, src, a["input_type_train"])
        mean, scale = _norm(a)
        out = (v - mean) * scale
        return [np.ascontiguousarray(from_channels_last(out, a["layout"])).astype(np.float32)]


def _coefficients(node: NodeProto) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Matrix, bias and (integer mode) the per-channel step the lowering multiplies by."""
    if attrs_of(node).get("integer", 0):
        w_q, step, bias_q = integer_affine(node)
        return w_q.astype(np.float64), bias_q.astype(np.float64), step
    m, b = affine(node)
    return m, b, None


def integer_affine(node: NodeProto) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The BPU's form of the preprocessing: int8 matrix, float32 step per output channel, int32 bias.

    Output channel ``c`` is ``(w_q[c] @ q + bias_q[c]) * step[c]`` for the int8 input ``q``;
    each row of ``M`` is quantized on its own int8 grid, the bias on the same step.
    """
    m, b = affine(node)
    step = grids.scales_for(np.abs(m).max(axis=1), grids.WEIGHT_BITS)
    w_q = grids.quantize(m, step[:, None], grids.WEIGHT_BITS).astype(np.int8)
    bias_q = grids.bias_levels(b, step).astype(np.int32)
    return w_q, step, bias_q


def _norm(a: dict) -> tuple[np.ndarray, np.ndarray]:
    """Effective per-channel mean and scale: the ones norm_type does not use are 0 and 1."""
    norm = a["norm_type"]
    mean = np.asarray(a["mean"], dtype=np.float64)
    scale = np.asarray(a["scale"], dtype=np.float64)
    if "mean" not in norm:
        mean = np.zeros_like(mean)
    if "scale" not in norm:
        scale = np.ones_like(scale)
    return mean, scale


def affine(node: NodeProto) -> tuple[np.ndarray, np.ndarray]:
    """``(M, b)`` (float64) with output pixel = ``M @ q + b`` for the int8 input vector ``q``."""
    a = attrs_of(node)
    mc, bc = colour.affine_from_intermediate(
        a["input_type_rt"], a["input_type_train"], a["input_space_and_range"]
    )
    mean, scale = _norm(a)
    # The op sees q = pixel - 128, so the +128 folds into the bias.
    m = scale[:, None] * mc
    b = scale * (mc @ np.full(len(bc), 128.0) + bc - mean)
    return m, b


def _per_channel(
    values: list[float] | None, default: float, c: int, what: str, spec: InputSpec
) -> list[float]:
    if values is None:
        return [default] * c
    if len(values) == 1:
        return [float(values[0])] * c
    if len(values) != c:
        raise HbError(
            f"input '{spec.name}': {what} has {len(values)} values but the input has {c} channels"
        )
    return [float(v) for v in values]


def featuremap_normalisation(spec: InputSpec, input_name: str, output_name: str,
                             channels: int) -> tuple[list[NodeProto], list[TensorProto]]:
    """Standard ``Sub`` / ``Mul`` nodes computing ``(x - mean) * scale`` per channel for a 4-D featuremap
    input with a norm_type: float data needs no HzPreprocess, and the nodes quantize like any other."""
    uses_mean, uses_scale = "mean" in spec.norm_type, "scale" in spec.norm_type
    shape = [1, channels, 1, 1] if spec.layout_train == "NCHW" else [1, 1, 1, channels]
    nodes: list[NodeProto] = []
    inits: list[TensorProto] = []
    current = input_name
    steps = [("Sub", "mean", spec.mean, 0.0, "mean_value")] if uses_mean else []
    steps += [("Mul", "scale", spec.scale, 1.0, "scale_value")] if uses_scale else []
    for k, (op, what, values, default, key) in enumerate(steps):
        constant = f"{output_name}_{what}"
        inits.append(numpy_helper.from_array(
            np.array(_per_channel(values, default, channels, key, spec), dtype=np.float32).reshape(shape), constant))
        out = output_name if k == len(steps) - 1 else f"{output_name}_{op.lower()}"
        nodes.append(helper.make_node(op, [current, constant], [out], name=f"{output_name}_{op}"))
        current = out
    return nodes, inits


def make_preprocess_node(
    spec: InputSpec, input_name: str, output_name: str, node_name: str, channels: int
) -> NodeProto:
    """The HzPreprocess node for one image input; ``channels`` is the model's C."""
    if spec.is_featuremap or spec.type_train == "featuremap":
        raise ValueError(f"featuremap input {spec.name!r} gets no HzPreprocess")
    if spec.type_rt not in ALLOWED_RT_FOR_TRAIN.get(spec.type_train, ()):
        raise HbError(
            f"input '{spec.name}': input_type_rt {spec.type_rt} cannot feed "
            f"input_type_train {spec.type_train}"
        )
    if spec.layout_train not in ("NCHW", "NHWC"):
        raise HbError(
            f"input '{spec.name}': image input needs layout NCHW or NHWC, got {spec.layout_train}"
        )
    if channels != _CHANNELS[spec.type_train]:
        raise HbError(
            f"input '{spec.name}': input_type_train {spec.type_train} needs "
            f"{_CHANNELS[spec.type_train]} channels but the model input has {channels}"
        )
    if spec.norm_type not in NORM_TYPES:
        raise HbError(f"input '{spec.name}': unknown norm_type {spec.norm_type}")
    uses_mean, uses_scale = "mean" in spec.norm_type, "scale" in spec.norm_type
    if uses_mean and spec.mean is None:
        raise HbError(f"input '{spec.name}': norm_type {spec.norm_type} needs mean_value")
    if uses_scale and spec.scale is None:
        raise HbError(f"input '{spec.name}': norm_type {spec.norm_type} needs scale_value")
    mean = _per_channel(spec.mean if uses_mean else None, 0.0, channels, "mean_value", spec)
    scale = _per_channel(spec.scale if uses_scale else None, 1.0, channels, "scale_value", spec)
    return HzPreprocess.make_node(
        [input_name],
        [output_name],
        node_name,
        input_type_rt=spec.type_rt,
        input_type_train=spec.type_train,
        input_space_and_range=spec.space_and_range,
        layout=spec.layout_train,
        norm_type=spec.norm_type,
        mean=mean,
        scale=scale,
    )
