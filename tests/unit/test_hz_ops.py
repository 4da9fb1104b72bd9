"""Hz ops lowered to standard ONNX and run in onnxruntime, against independent numpy maths.

Each test builds a one-node model in the ``horizon`` domain, lowers it with
``hbtools.runtime.lowering.lower_model`` (what ``HB_ONNXRuntime`` does), runs it in a
real onnxruntime session and compares with a numpy computation written here from
the op's documented numerics: integer products accumulated in int64, requantization
``clip(round(acc * m))`` in float64 with round half to even. Results must be equal
bit for bit.

Multipliers and scales are chosen as float32 values up front, because ONNX float
attributes are float32: that is the value the op really uses.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import NodeProto, TensorProto, helper, numpy_helper

from hbtools.ops import uint8_kernels
from hbtools.ops.base import DOMAIN, DOMAIN_VERSION
from hbtools.ops.calibration import HzCalibration
from hbtools.runtime.lowering import lower_model

ELEM = {
    np.dtype(np.float32): TensorProto.FLOAT,
    np.dtype(np.int8): TensorProto.INT8,
    np.dtype(np.uint8): TensorProto.UINT8,
    np.dtype(np.int16): TensorProto.INT16,
    np.dtype(np.int32): TensorProto.INT32,
    np.dtype(np.int64): TensorProto.INT64,  # indices (HzSQuantizedArgMax)
}
NP_INT = {"int8": np.int8, "int16": np.int16, "int32": np.int32}
QMAX = {8: 127, 16: 32767}


def hz_node(op_type: str, inputs: list[str], output: str = "y", **attrs) -> onnx.NodeProto:
    return helper.make_node(op_type, inputs, [output], name=f"{op_type}_node", domain=DOMAIN, **attrs)


def build(node: onnx.NodeProto, feeds: dict[str, np.ndarray], out_dtype, out_shape: list[int],
          consts: dict[str, np.ndarray] | None = None, opset: int = 13) -> onnx.ModelProto:
    graph = helper.make_graph(
        [node], "one_node",
        [helper.make_tensor_value_info(k, ELEM[v.dtype], list(v.shape)) for k, v in feeds.items()],
        [helper.make_tensor_value_info(node.output[0], ELEM[np.dtype(out_dtype)], out_shape)],
        [numpy_helper.from_array(v, k) for k, v in (consts or {}).items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset),
                                                    helper.make_opsetid(DOMAIN, DOMAIN_VERSION)])
    model.ir_version = 8
    return model


def run_lowered(model: onnx.ModelProto, feeds: dict[str, np.ndarray], **lower_kw) -> np.ndarray:
    lowered = lower_model(model, **lower_kw)
    # com.microsoft: onnxruntime's own contrib ops (per-axis DequantizeLinear at any opset)
    assert all(n.domain in ("", "ai.onnx", "com.microsoft") for n in lowered.graph.node), "lowering left a custom op"
    onnx.checker.check_model(lowered)
    sess = ort.InferenceSession(lowered.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)[0]


def run_op(node, feeds, out_dtype, out_shape, consts=None, opset=13) -> np.ndarray:
    y = run_lowered(build(node, feeds, out_dtype, out_shape, consts, opset), feeds)
    assert y.dtype == np.dtype(out_dtype), f"output dtype {y.dtype}, expected {np.dtype(out_dtype)}"
    assert list(y.shape) == list(out_shape)
    return y


def assert_exact(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.dtype, want.shape)
    diff = np.flatnonzero(got != want)
    assert diff.size == 0, (
        f"{diff.size} of {got.size} elements differ; first at {diff[:5]}: "
        f"got {got.reshape(-1)[diff[:5]]}, want {want.reshape(-1)[diff[:5]]}"
    )


# ---------------------------------------------------------------- numpy integer reference


def f32(values) -> np.ndarray:
    """Multipliers as the float32 numbers an ONNX float attribute stores."""
    return np.asarray(values, dtype=np.float32)


def requant(acc: np.ndarray, mult: np.ndarray, lo: float, hi: float, dtype) -> np.ndarray:
    scaled = acc.astype(np.float64) * mult.astype(np.float64)
    return np.clip(np.round(scaled), lo, hi).astype(dtype)


def conv_int64(x: np.ndarray, w: np.ndarray, strides=(1, 1), pads=(0, 0, 0, 0), dilations=(1, 1),
               group: int = 1) -> np.ndarray:
    """Direct 2-D convolution on int64, NCHW / OIHW, zero padding."""
    x = x.astype(np.int64)
    w = w.astype(np.int64)
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    xp = np.zeros((n, c, h + pads[0] + pads[2], wd + pads[1] + pads[3]), dtype=np.int64)
    xp[:, :, pads[0]: pads[0] + h, pads[1]: pads[1] + wd] = x
    oh = (xp.shape[2] - dilations[0] * (kh - 1) - 1) // strides[0] + 1
    ow = (xp.shape[3] - dilations[1] * (kw - 1) - 1) // strides[1] + 1
    out = np.zeros((n, o, oh, ow), dtype=np.int64)
    og = o // group
    for g in range(group):
        xs = xp[:, g * cg: (g + 1) * cg]
        ws = w[g * og: (g + 1) * og]
        for i in range(kh):
            for j in range(kw):
                patch = xs[:, :, i * dilations[0]: i * dilations[0] + strides[0] * (oh - 1) + 1: strides[0],
                           j * dilations[1]: j * dilations[1] + strides[1] * (ow - 1) + 1: strides[1]]
                out[:, g * og: (g + 1) * og] += np.einsum("nchw,oc->nohw", patch, ws[:, :, i, j])
    return out


def ints(rng: np.random.Generator, bits: int, shape, full: bool = True) -> np.ndarray:
    """Random symmetric integers; with ``full`` the extremes ±qmax are present too."""
    q = QMAX[bits]
    x = rng.integers(-q, q + 1, size=shape).astype(np.int8 if bits == 8 else np.int16)
    if full:
        flat = x.reshape(-1)
        flat[0], flat[-1] = q, -q
    return x


# ---------------------------------------------------------------- HzCalibration


def calib_model(node: onnx.NodeProto, shape: list[int]) -> onnx.ModelProto:
    x = np.zeros(shape, dtype=np.float32)
    return build(node, {node.input[0]: x}, np.float32, shape)


@pytest.mark.parametrize("bits", [8, 16])
def test_calibration_per_tensor_rounds_half_to_even(bits: int) -> None:
    scale = 2.0**-4  # exact in float32, so x / s below is exactly k + 0.5
    threshold = scale * QMAX[bits]
    node = HzCalibration.build("x", "y", kind="activation", thresholds=[threshold], bits=bits)
    halves = (np.arange(-6, 6) + 0.5) * scale  # -5.5 .. 5.5 steps
    beyond = np.array([threshold * 1.5, -threshold * 3, threshold, -threshold], dtype=np.float64)
    rng = np.random.default_rng(0)
    x = np.concatenate([halves, beyond, rng.uniform(-1.2, 1.2, 100) * threshold]).astype(np.float32)
    y = run_lowered(calib_model(node, [x.size]), {"x": x})
    assert_exact(y, HzCalibration.reference(node, [x])[0])
    # Independent of the op's own reference: the documented formula.
    q = np.clip(np.round(x / np.float32(scale)), -QMAX[bits], QMAX[bits])
    assert_exact(y, (q * np.float32(scale)).astype(np.float32))
    # Round half to even on the .5 cases: -5.5 -> -6, -4.5 -> -4, ..., 0.5 -> 0, 1.5 -> 2, 2.5 -> 2.
    assert list(y[:12] / scale) == [-6, -4, -4, -2, -2, 0, 0, 2, 2, 4, 4, 6]
    assert y[12] == y[14] == np.float32(threshold) and y[13] == y[15] == -np.float32(threshold)


@pytest.mark.parametrize("bits", [8, 16])
@pytest.mark.parametrize(("shape", "axis"), [([4, 3, 2, 2], 0), ([3, 5, 1, 2], 1), ([6, 4], 1)])
def test_calibration_per_channel_weight(bits: int, shape: list[int], axis: int) -> None:
    rng = np.random.default_rng(1)
    w = rng.standard_normal(shape).astype(np.float32)
    other = tuple(k for k in range(len(shape)) if k != axis)
    thresholds = np.abs(w).max(axis=other) * rng.uniform(0.6, 1.0, shape[axis])  # some values clip
    node = HzCalibration.build("w", "y", kind="weight", thresholds=thresholds, bits=bits, axis=axis)
    y = run_lowered(calib_model(node, shape), {"w": w})
    assert_exact(y, HzCalibration.reference(node, [w])[0])
    bshape = [1] * len(shape)
    bshape[axis] = -1
    s = (thresholds / QMAX[bits]).astype(np.float32).reshape(bshape)
    want = (np.clip(np.round(w / s), -QMAX[bits], QMAX[bits]) * s).astype(np.float32)
    assert_exact(y, want)
    per_channel_levels = [len(np.unique(np.take(y, c, axis=axis))) for c in range(shape[axis])]
    assert min(per_channel_levels) > 1


@pytest.mark.parametrize(("c_in", "c_out", "group"), [(8, 6, 2), (6, 6, 6), (4, 8, 2)])
def test_calibration_grouped_conv_transpose_weight_per_output_channel(c_in: int, c_out: int, group: int) -> None:
    """A grouped ConvTranspose weight ``[C_in, C_out/group, k, k]`` on one step per output channel: by the
    ONNX definition, output channel o reads ``w[c, o % (C_out/group)]`` for the input channels c of group
    ``o // (C_out/group)``; axis 1 alone lists only C_out/group channels."""
    rng = np.random.default_rng(3)
    per_group, c_per_group = c_out // group, c_in // group
    w = rng.standard_normal((c_in, per_group, 3, 3)).astype(np.float32)
    blocks = [(slice(o // per_group * c_per_group, (o // per_group + 1) * c_per_group), o % per_group)
              for o in range(c_out)]
    gain = np.linspace(0.1, 1.0, c_out)  # channels of unlike ranges: a shared step would show
    for o, (rows, j) in enumerate(blocks):
        w[rows, j] *= gain[o]
    thresholds = np.array([np.abs(w[rows, j]).max() for rows, j in blocks]) * rng.uniform(0.6, 1.0, c_out)
    node = HzCalibration.build("w", "y", kind="weight", thresholds=thresholds, bits=8, axis=1, groups=group)
    y = run_lowered(calib_model(node, list(w.shape)), {"w": w})
    assert_exact(y, HzCalibration.reference(node, [w])[0])
    want = np.empty_like(w)
    for o, (rows, j) in enumerate(blocks):
        s = np.float32(thresholds[o] / 127)
        want[rows, j] = np.clip(np.round(w[rows, j] / s), -127, 127) * s
    assert_exact(y, want)


def test_calibration_zero_threshold_is_finite() -> None:
    node = HzCalibration.build("x", "y", kind="activation", thresholds=[0.0], bits=8)
    x = np.zeros([8], dtype=np.float32)
    assert_exact(run_lowered(calib_model(node, [8]), {"x": x}), x)


def test_feed_calibration_graph_inputs() -> None:
    act = HzCalibration.build("x", "xq", kind="activation", thresholds=[2.0], bits=8)
    wnode = HzCalibration.build("w", "wq", kind="weight", thresholds=[1.0, 2.0], bits=8, axis=0)
    add = helper.make_node("Add", ["xq", "wq"], ["y"], name="add")
    graph = helper.make_graph(
        [act, wnode, add], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
         helper.make_tensor_value_info("w", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13),
                                                    helper.make_opsetid(DOMAIN, DOMAIN_VERSION)])
    model.ir_version = 8
    lowered = lower_model(model, feed_calibration=True)
    names = [i.name for i in lowered.graph.input]
    assert {"x_HzCalibration_scale", "x_HzCalibration_qmax"} <= set(names)
    assert not any(n.startswith("w_HzCalibration_") for n in names), "weights keep constant scales"
    sess = ort.InferenceSession(lowered.SerializeToString(), providers=["CPUExecutionProvider"])

    rng = np.random.default_rng(2)
    x = rng.uniform(-3, 3, [2, 3]).astype(np.float32)
    w = np.zeros([2, 3], dtype=np.float32)  # the weight path adds exactly 0
    for scale, qmax in ((0.5, 127), (0.03125, 127), (2.0 / 127, 127), (2.0 / 32767, 32767)):
        s = np.float32(scale)
        got = sess.run(None, {"x": x, "w": w, "x_HzCalibration_scale": np.array(s),
                              "x_HzCalibration_qmax": np.array(qmax, np.float32)})[0]
        assert_exact(got, (np.clip(np.round(x / s), -qmax, qmax) * s).astype(np.float32))
    # Without feed_calibration the same model uses the attribute threshold.
    fixed = ort.InferenceSession(lower_model(model).SerializeToString(), providers=["CPUExecutionProvider"])
    s = np.float32(2.0 / 127)
    assert_exact(fixed.run(None, {"x": x, "w": w})[0], (np.clip(np.round(x / s), -127, 127) * s).astype(np.float32))


# ---------------------------------------------------------------- HzSQuantizedConv


CONV_CASES = {
    # name: (x_bits, x shape, w shape, conv attrs, out_type, (out_min, out_max) or None)
    "int8_3x3_pad": (8, [2, 4, 7, 6], [5, 4, 3, 3], {"pads": [1, 1, 1, 1]}, "int8", None),
    "int8_stride_dilation": (8, [1, 3, 9, 9], [4, 3, 3, 3],
                             {"strides": [2, 2], "dilations": [2, 1], "pads": [2, 1, 2, 1]}, "int8", None),
    "int8_depthwise": (8, [1, 6, 5, 5], [6, 1, 3, 3], {"group": 6, "pads": [1, 1, 1, 1]}, "int8", None),
    "int16_input_split": (16, [1, 4, 6, 5], [3, 4, 3, 3], {"pads": [1, 0, 1, 2]}, "int16", None),
    "int16_in_int8_out": (16, [2, 2, 4, 4], [4, 2, 1, 1], {}, "int8", None),
    "fused_clip_range": (8, [1, 4, 5, 5], [6, 4, 3, 3], {"pads": [1, 1, 1, 1]}, "int8", (0, 48)),
    "int16_fused_relu": (16, [1, 3, 4, 4], [5, 3, 3, 3], {"pads": [1, 1, 1, 1]}, "int16", (0, 32767)),
    "int32_accumulator": (8, [1, 4, 5, 5], [3, 4, 3, 3], {}, "int32", None),
    # 576 terms of int16 x int8, random weights: the sums of |w| keep every accumulator in int32.
    "int16_wide_sums": (16, [1, 64, 4, 4], [3, 64, 3, 3], {"pads": [1, 1, 1, 1]}, "int16", None),
    # Grouped convs run as float32 convs: of int8 levels in one, of int16 levels over their two bytes.
    "int8_depthwise_int16_out": (8, [1, 6, 5, 5], [6, 1, 3, 3], {"group": 6, "pads": [1, 1, 1, 1]}, "int16", None),
    "int16_depthwise": (16, [1, 6, 7, 7], [6, 1, 5, 5], {"group": 6, "pads": [2, 2, 2, 2], "strides": [2, 2]},
                        "int16", None),
    "int16_grouped": (16, [1, 8, 5, 5], [6, 4, 3, 3], {"group": 2, "pads": [1, 1, 1, 1]}, "int8", None),
}


def test_int16_conv_sums_past_int32_stay_exact() -> None:
    """576 terms of int16 x int8 with signs aligned reach 32767 * 127 * 576 > 2**31 (and the
    negated input -2**31 - ...): the accumulator must not wrap, one channel's sum of |w| sets the
    bound; a channel of small weights beside it stays exact too."""
    rng = np.random.default_rng(30)
    w = np.where(rng.random((2, 64, 3, 3)) < 0.5, -127, 127).astype(np.int8)
    w[1] = np.sign(w[1]) * 3
    sign = np.sign(w[0].astype(np.int32))
    x = np.stack([sign * 32767, -sign * 32767]).astype(np.int16)  # 2 x 64 x 3 x 3
    mult = f32([2.0**-16, 2.0**-5])
    node = hz_node("HzSQuantizedConv", ["x", "w"], kind="Conv", x_bits=16, axis=1,
                   multiplier=[float(m) for m in mult], out_type="int16", out_min=-32767.0, out_max=32767.0,
                   kernel_shape=[3, 3])
    acc = conv_int64(x, w)
    assert np.abs(acc[:, 0]).max() > 2**31
    want = requant(acc, mult.reshape(1, -1, 1, 1), -32767, 32767, np.int16)
    got = run_op(node, {"x": x}, np.int16, list(want.shape), {"w": w})
    assert_exact(got, want)


@pytest.mark.parametrize("case", sorted(CONV_CASES))
def test_quantized_conv(case: str) -> None:
    x_bits, xs, ws, conv_attrs, out_type, clip = CONV_CASES[case]
    rng = np.random.default_rng(sorted(CONV_CASES).index(case))
    x = ints(rng, x_bits, xs)
    w = ints(rng, 8, ws)
    cout = ws[0]
    bias = rng.integers(-5000, 5000, cout).astype(np.int32)
    if out_type == "int32":
        mult, lo, hi = f32([1.0]), -(2.0**31), 2.0**31 - 1
    else:
        # Mostly small multipliers; one channel at 0.5 so .5 ties occur in the requantization.
        q = QMAX[int(out_type[3:])]
        typical = 1.5 * q / (QMAX[x_bits] * 127 * np.prod(ws[1:]) ** 0.5)
        mult = f32(rng.uniform(0.3, 1.0, cout) * typical)
        mult[0] = 0.5
        lo, hi = clip if clip else (-q, q)
    kernel = ws[2:]
    attrs = {"kernel_shape": kernel, **conv_attrs}
    node = hz_node("HzSQuantizedConv", ["x", "w", "b"], kind="Conv", x_bits=x_bits, axis=1,
                   multiplier=[float(m) for m in mult], out_type=out_type,
                   out_min=float(lo), out_max=float(hi), **attrs)
    acc = conv_int64(x, w, conv_attrs.get("strides", (1, 1)), conv_attrs.get("pads", (0, 0, 0, 0)),
                     conv_attrs.get("dilations", (1, 1)), conv_attrs.get("group", 1))
    acc = acc + bias.astype(np.int64).reshape(1, -1, 1, 1)
    want = requant(acc, mult.reshape(1, -1, 1, 1) if mult.size > 1 else mult, lo, hi, NP_INT[out_type])
    got = run_op(node, {"x": x}, NP_INT[out_type], list(want.shape), {"w": w, "b": bias})
    assert_exact(got, want)
    if clip:
        assert got.min() >= lo and got.max() <= hi and (got == lo).any()
    if out_type != "int32":
        ties = acc[:, :1].astype(np.float64) * 0.5
        assert (ties % 1 == 0.5).any(), "the test data should contain .5 ties"


def test_int16_between_two_convs_is_read_as_the_float_it_was_cast_from() -> None:
    """conv (int8 -> int16, float32 requantization) -> conv (int16 -> int8) and an int16 add: the readers
    take the producer's float levels (no int16 round trip when nothing else reads it), bit for bit."""
    rng = np.random.default_rng(21)
    x = ints(rng, 8, [1, 4, 6, 6])
    w1, w2 = ints(rng, 8, [5, 4, 3, 3]), ints(rng, 8, [3, 5, 1, 1])
    m1, m2 = f32([0.37 * 32767 / (127 * 127 * 6)]), f32([0.5 * 127 / (32767 * 127 * 2)])
    nodes = [hz_node("HzSQuantizedConv", ["x", "w1"], "h", kind="Conv", x_bits=8, axis=1, requantize_f32=1,
                     multiplier=[float(m1[0])], out_type="int16", out_min=-32767.0, out_max=32767.0,
                     kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             hz_node("HzSQuantizedConv", ["h", "w2"], "c", kind="Conv", x_bits=16, axis=1,
                     multiplier=[float(m2[0])], out_type="int8", out_min=-127.0, out_max=127.0, kernel_shape=[1, 1]),
             hz_node("HzSQuantizedEltwise", ["h", "h"], "y", mode="add", a_multiplier=0.25, b_multiplier=0.5,
                     multiplier=[1.0], out_type="int16", out_min=-32767.0, out_max=32767.0)]
    for k, n in enumerate(nodes):
        n.name = f"n{k}"
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.INT8, [1, 4, 6, 6])],
                              [helper.make_tensor_value_info("c", TensorProto.INT8, [1, 3, 6, 6]),
                               helper.make_tensor_value_info("y", TensorProto.INT16, [1, 5, 6, 6])],
                              [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13),
                                                    helper.make_opsetid(DOMAIN, DOMAIN_VERSION)])
    model.ir_version = 8
    lowered = lower_model(model)
    def casts_to(kind: int) -> list[NodeProto]:
        return [n for n in lowered.graph.node if n.op_type == "Cast" and any(a.name == "to" and a.i == kind
                                                                              for a in n.attribute)]
    readers_of_h = [n.op_type for n in lowered.graph.node if "h" in n.input]
    if uint8_kernels.signed_weights_exact():
        assert len(casts_to(TensorProto.INT16)) == 1  # only y's: h is never made as int16
    else:
        # h is made as int16 once, for the one byte its int16 form gives for free: its low byte (a
        # Cast to uint8), which the conv reads; the add and the high byte read the float levels.
        assert len(casts_to(TensorProto.INT16)) == 2 and readers_of_h == ["Cast"], readers_of_h
        assert [n.input[0] for n in casts_to(TensorProto.UINT8)] == ["h"]
    h = np.clip(np.round(conv_int64(x, w1, pads=(1, 1, 1, 1)).astype(np.float32) * m1[0]), -32767, 32767)
    c = requant(conv_int64(h.astype(np.int16), w2), m2, -127, 127, np.int8)
    y = np.clip(np.round(h.astype(np.float64) * 0.25 + h.astype(np.float64) * 0.5), -32767, 32767).astype(np.int16)
    sess = ort.InferenceSession(lowered.SerializeToString(), providers=["CPUExecutionProvider"])
    got_c, got_y = sess.run(["c", "y"], {"x": x})
    assert_exact(got_c, c)
    assert_exact(got_y, y)


@pytest.mark.parametrize("x_bits", [8, 16])
def test_quantized_conv_matmul_kind(x_bits: int) -> None:
    """Gemm / MatMul with a constant weight: HzSQuantizedConv kind MatMul, channels on the last axis."""
    rng = np.random.default_rng(3)
    x = ints(rng, x_bits, [2, 3, 16])
    w = ints(rng, 8, [16, 5])
    bias = rng.integers(-20000, 20000, 5).astype(np.int32)
    mult = f32(rng.uniform(0.2, 1.0, 5) * 127 / (QMAX[x_bits] * 127 * 4))
    mult[2] = 0.25
    node = hz_node("HzSQuantizedConv", ["x", "w", "b"], kind="MatMul", x_bits=x_bits, axis=-1,
                   multiplier=[float(m) for m in mult], out_type="int8", out_min=-127.0, out_max=127.0)
    acc = np.matmul(x.astype(np.int64), w.astype(np.int64)) + bias.astype(np.int64)
    want = requant(acc, mult, -127, 127, np.int8)
    assert_exact(run_op(node, {"x": x}, np.int8, [2, 3, 5], {"w": w, "b": bias}), want)


# ---------------------------------------------------------------- HzSQuantizedMatMul


@pytest.mark.parametrize(("a_bits", "b_bits"), [(8, 8), (16, 8), (8, 16), (16, 16)])
def test_quantized_matmul_of_activations(a_bits: int, b_bits: int) -> None:
    rng = np.random.default_rng(a_bits + b_bits)
    a = ints(rng, a_bits, [2, 3, 4, 9])
    b = ints(rng, b_bits, [2, 3, 9, 5])
    out_bits = max(a_bits, b_bits)
    q = QMAX[out_bits]
    mult = f32([q / (QMAX[a_bits] * QMAX[b_bits] * 3)])
    node = hz_node("HzSQuantizedMatMul", ["a", "b"], a_bits=a_bits, b_bits=b_bits, axis=-1,
                   multiplier=[float(mult[0])], out_type=f"int{out_bits}", out_min=float(-q), out_max=float(q))
    acc = np.matmul(a.astype(np.int64), b.astype(np.int64))
    want = requant(acc, mult, -q, q, NP_INT[f"int{out_bits}"])
    assert_exact(run_op(node, {"a": a, "b": b}, want.dtype, [2, 3, 4, 5]), want)


def test_quantized_matmul_half_ties() -> None:
    rng = np.random.default_rng(5)
    a = ints(rng, 8, [4, 6])
    b = ints(rng, 8, [6, 4])
    node = hz_node("HzSQuantizedMatMul", ["a", "b"], a_bits=8, b_bits=8, axis=-1, multiplier=[0.5],
                   out_type="int16", out_min=-32767.0, out_max=32767.0)
    acc = a.astype(np.int64) @ b.astype(np.int64)
    assert (acc % 2 == 1).any()
    assert_exact(run_op(node, {"a": a, "b": b}, np.int16, [4, 4]), requant(acc, f32([0.5]), -32767, 32767, np.int16))


# ---------------------------------------------------------------- HzSQuantizedEltwise


@pytest.mark.parametrize(("a_bits", "b_bits", "out_bits", "b_shape"),
                         [(8, 8, 8, [1, 4, 5, 5]), (16, 8, 16, [1, 4, 5, 5]), (8, 8, 8, [1, 4, 1, 1])])
def test_quantized_add(a_bits: int, b_bits: int, out_bits: int, b_shape: list[int]) -> None:
    rng = np.random.default_rng(6)
    a = ints(rng, a_bits, [1, 4, 5, 5])
    b = ints(rng, b_bits, b_shape)
    ma, mb = f32(0.5 * QMAX[out_bits] / QMAX[a_bits]), f32(-0.75 * QMAX[out_bits] / QMAX[b_bits])
    q = QMAX[out_bits]
    node = hz_node("HzSQuantizedEltwise", ["a", "b"], mode="add", a_multiplier=float(ma), b_multiplier=float(mb),
                   multiplier=[1.0], out_type=f"int{out_bits}", out_min=float(-q), out_max=float(q))
    acc = a.astype(np.float64) * np.float64(ma) + b.astype(np.float64) * np.float64(mb)
    want = requant(acc, f32([1.0]), -q, q, NP_INT[f"int{out_bits}"])
    assert_exact(run_op(node, {"a": a, "b": b}, want.dtype, [1, 4, 5, 5]), want)


def test_quantized_add_half_ties() -> None:
    x = np.arange(-127, 128, dtype=np.int8).reshape(1, 1, 15, 17)
    y = np.full_like(x, 1)
    node = hz_node("HzSQuantizedEltwise", ["a", "b"], mode="add", a_multiplier=0.5, b_multiplier=0.0,
                   multiplier=[1.0], out_type="int8", out_min=-127.0, out_max=127.0)
    got = run_op(node, {"a": x, "b": y}, np.int8, [1, 1, 15, 17])
    assert_exact(got, np.round(x.astype(np.float64) * 0.5).astype(np.int8))
    # 1.5 -> 2, 2.5 -> 2, -0.5 -> 0: round half to even.
    idx = {v: k for k, v in enumerate(x.reshape(-1).tolist())}
    assert [got.reshape(-1)[idx[v]] for v in (3, 5, -1, -3)] == [2, 2, 0, -2]


@pytest.mark.parametrize(("a_bits", "b_bits", "out_bits"), [(8, 8, 8), (16, 16, 16), (8, 16, 8)])
def test_quantized_mul(a_bits: int, b_bits: int, out_bits: int) -> None:
    rng = np.random.default_rng(7)
    a = ints(rng, a_bits, [2, 3, 4])
    b = ints(rng, b_bits, [2, 3, 4])
    q = QMAX[out_bits]
    mult = f32([2.0 * q / (QMAX[a_bits] * QMAX[b_bits])])
    node = hz_node("HzSQuantizedEltwise", ["a", "b"], mode="mul", multiplier=[float(mult[0])],
                   out_type=f"int{out_bits}", out_min=float(-q), out_max=float(q))
    acc = a.astype(np.int64) * b.astype(np.int64)
    want = requant(acc, mult, -q, q, NP_INT[f"int{out_bits}"])
    got = run_op(node, {"a": a, "b": b}, want.dtype, [2, 3, 4])
    assert_exact(got, want)
    assert (got == q).any() and (got == -q).any(), "a ×2 gain must saturate somewhere"


@pytest.mark.parametrize(("mode", "out_bits", "zero_points"), [("add", 8, (0, 0)), ("add", 16, (3, -5)),
                                                                ("mul", 8, (-7, 2))])
def test_int8_eltwise_every_pair_of_levels_by_lookup(mode: str, out_bits: int, zero_points: tuple[int, int]) -> None:
    """Two int8 inputs: the lowering looks the result up (no float64 arithmetic), exact for all 65,536 pairs."""
    levels = np.arange(-128, 128, dtype=np.int8)
    a, b = np.repeat(levels, 256).reshape(1, 256, 256), np.tile(levels, 256).reshape(1, 256, 256)
    q = QMAX[out_bits]
    za, zb = zero_points
    if mode == "add":
        ma, mb = f32(0.37 * q / 127), f32(-0.81 * q / 127)
        attrs = {"a_multiplier": float(ma), "b_multiplier": float(mb), "multiplier": [1.0]}
        acc = (a.astype(np.float64) - za) * np.float64(ma) + (b.astype(np.float64) - zb) * np.float64(mb)
        mult = f32([1.0])
    else:
        mult = f32([1.3 * q / 127**2])
        attrs = {"multiplier": [float(mult[0])]}
        acc = (a.astype(np.int64) - za) * (b.astype(np.int64) - zb)
    node = hz_node("HzSQuantizedEltwise", ["a", "b"], mode=mode, out_type=f"int{out_bits}", out_min=float(-q),
                   out_max=float(q), a_zero_point=za, b_zero_point=zb, **attrs)
    want = requant(acc, mult, -q, q, NP_INT[f"int{out_bits}"])
    model = build(node, {"a": a, "b": b}, want.dtype, [1, 256, 256])
    lowered = lower_model(model)
    assert not [n.name for n in lowered.graph.node if n.op_type in ("Round", "Max", "Min")], "float arithmetic left"
    assert_exact(run_op(node, {"a": a, "b": b}, want.dtype, [1, 256, 256]), want)


def test_int8_levels_wrapped_in_float_casts_move_as_uint8() -> None:
    """int8 -> Cast float -> Resize nearest -> Cast int8 (as a quantized model wraps a float-only op): the
    lowered add reads the resized levels without float arithmetic, and the result is unchanged."""
    rng = np.random.default_rng(11)
    a = ints(rng, 8, [1, 2, 4, 4])
    b = ints(rng, 8, [1, 2, 2, 2])
    nodes = [helper.make_node("Cast", ["b"], ["bf"], to=TensorProto.FLOAT),
             helper.make_node("Resize", ["bf", "", "scales"], ["rf"], mode="nearest"),
             helper.make_node("Cast", ["rf"], ["r"], to=TensorProto.INT8),
             hz_node("HzSQuantizedEltwise", ["a", "r"], mode="add", a_multiplier=0.5, b_multiplier=0.75,
                     multiplier=[1.0], out_type="int8", out_min=-127.0, out_max=127.0)]
    graph = helper.make_graph(nodes, "wrapped", [helper.make_tensor_value_info(k, TensorProto.INT8, list(v.shape))
                                                 for k, v in (("a", a), ("b", b))],
                              [helper.make_tensor_value_info("y", TensorProto.INT8, [1, 2, 4, 4])],
                              [numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13),
                                                    helper.make_opsetid(DOMAIN, DOMAIN_VERSION)])
    model.ir_version = 8
    lowered = lower_model(model)
    resizes = [n for n in lowered.graph.node if n.op_type == "Resize"]
    assert len(resizes) == 1 and resizes[0].input[0] != "bf", "the resize should run on the uint8 copy"
    r = b.repeat(2, axis=2).repeat(2, axis=3)
    want = np.clip(np.round(a.astype(np.float64) * 0.5 + r.astype(np.float64) * 0.75), -127, 127).astype(np.int8)
    assert_exact(run_lowered(model, {"a": a, "b": b}), want)


# ---------------------------------------------------------------- HzLut


@pytest.mark.parametrize(("in_bits", "out_type"), [(8, "int8"), (8, "int16"), (16, "int16"), (16, "int8")])
def test_lut_every_input_level(in_bits: int, out_type: str) -> None:
    rng = np.random.default_rng(8)
    lo = -(1 << (in_bits - 1))
    levels = np.arange(lo, -lo, dtype=np.int64)
    q = QMAX[int(out_type[3:])]
    table = np.clip(np.round(np.tanh(levels / (-lo / 4)) * q), -q, q).astype(np.int64)
    table[rng.integers(0, table.size, 20)] = rng.integers(-q, q + 1, 20)  # not a smooth function
    x = rng.permutation(levels).astype(np.int8 if in_bits == 8 else np.int16).reshape(2, -1, 4)
    node = hz_node("HzLut", ["x"], table=[int(v) for v in table], in_min=int(lo), out_type=out_type)
    want = table[x.astype(np.int64) - lo].astype(NP_INT[out_type])
    assert_exact(run_op(node, {"x": x}, NP_INT[out_type], list(x.shape)), want)


# ---------------------------------------------------------------- HzSQuantizedPool


@pytest.mark.parametrize("opset", [11, 13])
@pytest.mark.parametrize("x_bits", [8, 16])
def test_global_average_pool(opset: int, x_bits: int) -> None:
    rng = np.random.default_rng(9)
    x = ints(rng, x_bits, [2, 3, 5, 7])
    mult = f32([1.0 / 35 * 0.9])
    q = QMAX[x_bits]
    node = hz_node("HzSQuantizedPool", ["x"], kind="GlobalAveragePool", multiplier=[float(mult[0])],
                   out_type=f"int{x_bits}", out_min=float(-q), out_max=float(q))
    acc = x.astype(np.int64).sum(axis=(2, 3), keepdims=True)
    want = requant(acc, mult, -q, q, x.dtype)
    assert_exact(run_op(node, {"x": x}, x.dtype, [2, 3, 1, 1], opset=opset), want)


@pytest.mark.parametrize("x_bits", [8, 16])
@pytest.mark.parametrize(("kernel", "strides", "pads"),
                         [([2, 2], [2, 2], [0, 0, 0, 0]), ([3, 3], [1, 1], [1, 1, 1, 1]),
                          ([3, 2], [2, 1], [1, 0, 1, 1])])
def test_average_pool(x_bits: int, kernel: list[int], strides: list[int], pads: list[int]) -> None:
    rng = np.random.default_rng(10)
    c = 3
    x = ints(rng, x_bits, [1, c, 6, 7])
    window = int(np.prod(kernel))
    mult = f32([1.0 / window])
    q = QMAX[x_bits]
    node = hz_node("HzSQuantizedPool", ["x"], kind="AveragePool", channels=c, x_bits=x_bits,
                   kernel_shape=kernel, strides=strides, pads=pads, multiplier=[float(mult[0])],
                   out_type=f"int{x_bits}", out_min=float(-q), out_max=float(q))
    ones = np.ones([c, 1, *kernel], dtype=np.int64)
    acc = conv_int64(x, ones, strides, pads, group=c)  # count_include_pad: padding counts as 0
    want = requant(acc, mult, -q, q, x.dtype)
    assert_exact(run_op(node, {"x": x}, x.dtype, list(want.shape)), want)


# ---------------------------------------------------------------- HzSQuantizedConcat


def test_quantized_concat() -> None:
    rng = np.random.default_rng(11)
    a = ints(rng, 8, [1, 2, 3, 4])  # already on the output grid: copied
    b = ints(rng, 8, [1, 3, 3, 4])  # rescaled, with .5 ties
    c = ints(rng, 16, [1, 1, 3, 4])  # int16 -> int8
    mults = f32([1.0, 0.5, 127 / 32767 * 1.3])
    node = hz_node("HzSQuantizedConcat", ["a", "b", "c"], multipliers=[float(m) for m in mults],
                   in_types=["int8", "int8", "int16"], concat_axis=1, out_type="int8",
                   out_min=-127.0, out_max=127.0)
    want = np.concatenate(
        [a, requant(b, mults[1:2], -127, 127, np.int8), requant(c, mults[2:3], -127, 127, np.int8)], axis=1)
    got = run_op(node, {"a": a, "b": b, "c": c}, np.int8, [1, 6, 3, 4])
    assert_exact(got, want)
    assert (got[:, 5] == 127).any() and (got[:, 5] == -127).any(), "int16 part saturates at ±127"


def test_int8_concat_requantizes_each_part_by_a_table() -> None:
    """All parts int8: every level of a rescaled part goes through a 256-entry table of the op's rule
    (here with .5 ties, clipping and a zero point), on the uint8 copies; a part on the output grid is
    copied. The lowering computes nothing in float64."""
    levels = np.arange(-128, 128, dtype=np.int8)
    a = levels.reshape(1, 1, 16, 16)  # already on the output grid: copied
    b, c = np.roll(levels, 7).reshape(1, 1, 16, 16), np.roll(levels, 90).reshape(1, 1, 16, 16)
    mults = f32([1.0, 0.5, 1.7])
    node = hz_node("HzSQuantizedConcat", ["a", "b", "c"], multipliers=[float(m) for m in mults],
                   in_types=["int8"] * 3, zero_points=[0, 0, 9], concat_axis=1, out_type="int8",
                   out_min=-127.0, out_max=127.0)
    want = np.concatenate([a, requant(b, mults[1:2], -127, 127, np.int8),
                           requant(c.astype(np.int16) - 9, mults[2:3], -127, 127, np.int8)], axis=1)
    feeds = {"a": a, "b": b, "c": c}
    assert_exact(run_op(node, feeds, np.int8, [1, 3, 16, 16]), want)
    lowered = lower_model(build(node, feeds, np.int8, [1, 3, 16, 16]))
    assert sum(n.op_type == "GatherElements" for n in lowered.graph.node) == 2
    assert not any(a.name == "to" and a.i == TensorProto.DOUBLE for n in lowered.graph.node for a in n.attribute)


def test_quantized_concat_last_axis_int16() -> None:
    rng = np.random.default_rng(12)
    a = ints(rng, 16, [2, 3, 5])
    b = ints(rng, 8, [2, 3, 2])
    mults = f32([0.75, 200.0])
    node = hz_node("HzSQuantizedConcat", ["a", "b"], multipliers=[float(m) for m in mults],
                   in_types=["int16", "int8"], concat_axis=-1, out_type="int16",
                   out_min=-32767.0, out_max=32767.0)
    want = np.concatenate([requant(a, mults[:1], -32767, 32767, np.int16),
                           requant(b, mults[1:], -32767, 32767, np.int16)], axis=-1)
    assert_exact(run_op(node, {"a": a, "b": b}, np.int16, [2, 3, 7]), want)


# ---------------------------------------------------------------- HzRequantize / HzQuantize / HzDequantize


@pytest.mark.parametrize(("shape", "axis", "out_type"),
                         [([2, 4, 3, 3], 1, "int8"), ([2, 3, 5], -1, "int16"), ([6, 5], 1, "int8")])
def test_requantize_per_channel(shape: list[int], axis: int, out_type: str) -> None:
    rng = np.random.default_rng(13)
    x = rng.integers(-(2**24), 2**24, size=shape).astype(np.int32)
    x.reshape(-1)[:2] = [2**31 - 1, -(2**31)]
    c = shape[axis]
    q = QMAX[int(out_type[3:])]
    mult = f32(rng.uniform(0.5, 1.0, c) * q / 2**24)
    mult[0] = 0.5
    node = hz_node("HzRequantize", ["x"], multiplier=[float(m) for m in mult], axis=axis, out_type=out_type,
                   out_min=float(-q), out_max=float(q))
    bshape = [1] * len(shape)
    bshape[axis] = c
    want = requant(x.astype(np.int64), mult.reshape(bshape), -q, q, NP_INT[out_type])
    assert_exact(run_op(node, {"x": x}, NP_INT[out_type], shape), want)


@pytest.mark.parametrize("out_type", ["int8", "int16"])
def test_quantize(out_type: str) -> None:
    q = QMAX[int(out_type[3:])]
    scale = np.float32(0.25)
    rng = np.random.default_rng(14)
    x = np.concatenate([(np.arange(-8, 8) + 0.5) * 0.25, [q * 0.25 * 3, -q * 0.25 * 3, 0.0, -0.0],
                        rng.normal(0, q * 0.25 / 3, 200)]).astype(np.float32).reshape(4, -1)
    node = hz_node("HzQuantize", ["x"], scale=float(scale), out_type=out_type, out_min=float(-q), out_max=float(q))
    want = np.clip(np.round(x / scale), -q, q).astype(NP_INT[out_type])
    got = run_op(node, {"x": x}, NP_INT[out_type], list(x.shape))
    assert_exact(got, want)
    assert list(got.reshape(-1)[:16]) == [-8, -6, -6, -4, -4, -2, -2, 0, 0, 2, 2, 4, 4, 6, 6, 8]


@pytest.mark.parametrize(("dtype", "shape", "axis", "n_scales"),
                         [(np.int8, [2, 3, 4], 1, 1), (np.int16, [1, 4, 2, 3], 1, 4),
                          (np.int32, [2, 5, 6], -1, 6), (np.int32, [3, 7], 1, 7)])
def test_dequantize(dtype, shape: list[int], axis: int, n_scales: int) -> None:
    rng = np.random.default_rng(15)
    info = np.iinfo(dtype)
    x = rng.integers(info.min, info.max, size=shape, endpoint=True).astype(dtype)
    scales = f32(rng.uniform(1e-6, 1e-2, n_scales))
    node = hz_node("HzDequantize", ["x"], scales=[float(s) for s in scales], axis=axis)
    if n_scales > 1:
        bshape = [1] * len(shape)
        bshape[axis] = n_scales
        s = scales.astype(np.float64).reshape(bshape)
    else:
        s = scales.astype(np.float64)
    want = (x.astype(np.float64) * s).astype(np.float32)
    assert_exact(run_op(node, {"x": x}, np.float32, shape), want)


def test_int32_output_saturates_at_int32_bounds() -> None:
    """An int32 result clips to [-2**31, 2**31 - 1]; it never wraps around."""
    x = np.array([2**30, -(2**30), 2**29 + 3, 5, -(2**31)], dtype=np.int32)
    node = hz_node("HzRequantize", ["x"], multiplier=[4.0], axis=-1, out_type="int32",
                   out_min=float(-(2**31)), out_max=float(2**31 - 1))
    got = run_op(node, {"x": x}, np.int32, [5])
    assert_exact(got, np.array([2**31 - 1, -(2**31), 2**31 - 1, 20, -(2**31)], dtype=np.int32))


@pytest.mark.parametrize(("weight", "x_bits", "taps", "float_convs"),
                         [(1, 16, 9, 1), (127, 16, 9, 2), (-128, 16, 25, 2), (3, 16, 576, 2), (100, 16, 576, 2),
                          (127, 8, 576, 1), (127, 16, 576, 0)])
def test_grouped_conv_runs_as_float32_where_exact(weight: int, x_bits: int, taps: int, float_convs: int) -> None:
    """A grouped conv's accumulator comes from float32 convs while every partial sum stays below
    2**24: one conv of the levels; or two over the weight's nibbles (int16 levels, 3x3 and 5x5
    windows), or over the bytes of int16 levels; else ConvInteger. Each form equals the reference
    bit for bit, extreme levels and weights included."""
    from hbtools.runtime.lowering import lower_model

    rng = np.random.default_rng(abs(weight) + x_bits)
    ws = [4, taps, 1, 1]  # 2 groups: 576 * 127 * 255 > 2**24 > 576 * 100 * 255; 9 * 32768 < 2**24
    w = np.clip(np.where(rng.random(ws) < 0.5, -1, 1) * weight, -128, 127).astype(np.int8)
    w[0, : taps // 2] = np.int8(min(weight, 127) if weight > 0 else -128)  # one output at its largest sum
    q = QMAX[x_bits]
    x = ints(rng, x_bits, [1, 2 * taps, 2, 2])
    x[0, :, 1, 1] = np.where(rng.random(2 * taps) < 0.5, -q - 1, q)  # the extreme levels
    x[0, :taps, 0, 0] = np.sign(w[0, :, 0, 0].astype(np.int32)) * q  # one sum at its largest
    # The accumulator itself (int32 out, multiplier 1): a sum off by one shows.
    node = hz_node("HzSQuantizedConv", ["x", "w"], kind="Conv", x_bits=x_bits, axis=1, group=2, multiplier=[1.0],
                   out_type="int32", out_min=-(2.0**31), out_max=2.0**31 - 1, kernel_shape=[1, 1])
    want = np.clip(conv_int64(x, w, group=2), -(2**31), 2**31 - 1).astype(np.int32)
    model = build(node, {"x": x}, np.int32, list(want.shape), {"w": w})
    ops = [n.op_type for n in lower_model(model).graph.node]
    assert ops.count("Conv") == float_convs and ("ConvInteger" in ops) == (float_convs == 0)
    # The nibbles (taps up to 25) split the constant weight, not the levels: no per-pixel Floor.
    assert ("Floor" in ops) == (float_convs == 2 and taps > 25)
    assert_exact(want, run_lowered(model, {"x": x}))
