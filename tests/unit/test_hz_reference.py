"""``HzOp.reference`` (numpy, used by the .bin simulator) equals the ONNX lowering bit for bit.

The two are independent implementations of the numerics in the op docstrings;
hb_verifier relies on them agreeing exactly. Each case builds one node, runs its
lowering in onnxruntime (helpers from test_hz_ops) and its reference in numpy.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from test_hz_ops import CONV_CASES, assert_exact, build, f32, hz_node, ints, run_lowered, run_op

from hbtools.ops import registry
from hbtools.ops.int_kernels import EXACT_LIMIT, conv
from hbtools.runtime.lowering import lower_model

QMAX = {8: 127, 16: 32767}
NP = {"int8": np.int8, "int16": np.int16, "int32": np.int32}


def use_kernel_layout(monkeypatch: pytest.MonkeyPatch, signed_weights: bool) -> None:
    """Lower with int8 (``signed_weights``) or uint8 weights. MLAS's u8 x s8 kernels sum pairs in
    saturating 16-bit on x86 without VNNI (AVX2 only), so there the int8 layout is not exact, and
    the lowering never picks it: that case is skipped."""
    from hbtools.ops import uint8_kernels

    if signed_weights and not uint8_kernels.signed_weights_exact():
        pytest.skip("this CPU's u8 x s8 kernels saturate (x86 without VNNI); the lowering uses u8 x u8 here")
    monkeypatch.setattr(uint8_kernels, "signed_weights_exact", lambda: signed_weights)


def check(node, feeds: dict, consts: dict | None = None) -> np.ndarray:
    consts = consts or {}
    values = {**feeds, **consts}
    want = registry.get(node.op_type).reference(node, [values[n] for n in node.input])[0]
    got = run_op(node, feeds, want.dtype, list(want.shape), consts)
    assert_exact(want, got)
    return want


def requant_attrs(rng: np.random.Generator, out_type: str, channels: int, typical: float) -> dict:
    if out_type == "int32":
        return {"multiplier": [1.0], "out_type": "int32", "out_min": -(2.0**31), "out_max": 2.0**31 - 1}
    q = QMAX[int(out_type[3:])]
    mult = f32(rng.uniform(0.3, 1.2, channels) * typical * q)
    mult[0] = 0.5  # ties
    return {"multiplier": [float(m) for m in mult], "out_type": out_type, "out_min": float(-q),
            "out_max": float(q)}


@pytest.mark.parametrize("rule", ["float64", "float32"])
@pytest.mark.parametrize("signed_weights", [True, False], ids=["s8_activations", "u8_activations"])
@pytest.mark.parametrize("case", sorted(CONV_CASES))
def test_conv_cases_of_the_lowering_tests(case: str, signed_weights: bool, rule: str, monkeypatch) -> None:
    """Both layouts of the ConvInteger path (int8 or uint8 activations against uint8 weights), with
    either requantization rule (float32: an int8 result is rounded and clipped by QuantizeLinear)."""
    use_kernel_layout(monkeypatch, signed_weights)
    x_bits, xs, ws, conv_attrs, out_type, clip = CONV_CASES[case]
    rng = np.random.default_rng(20 + sorted(CONV_CASES).index(case))
    x, w = ints(rng, x_bits, xs), ints(rng, 8, ws)
    bias = rng.integers(-5000, 5000, ws[0]).astype(np.int32)
    attrs = requant_attrs(rng, out_type, ws[0], 1.0 / (QMAX[x_bits] * 127 * np.prod(ws[1:]) ** 0.5))
    if clip:
        attrs["out_min"], attrs["out_max"] = map(float, clip)
    if rule == "float32":
        attrs.update(requantize_f32=1, zero_point=5 if out_type == "int8" else None)
    node = hz_node("HzSQuantizedConv", ["x", "w", "b"], kind="Conv", x_bits=x_bits, axis=1,
                   kernel_shape=ws[2:], **conv_attrs, **attrs)
    check(node, {"x": x}, {"w": w, "b": bias})


TRANSPOSE_CASES = {
    "stride2": ([1, 4, 5, 6], [4, 3, 2, 2], {"strides": [2, 2]}),
    "stride3": ([2, 5, 3, 4], [5, 6, 3, 3], {"strides": [3, 3]}),
    "int16_stride2": ([1, 16, 4, 5], [16, 5, 2, 2], {"strides": [2, 2]}),
    "pads_output_padding_groups": ([2, 6, 4, 4], [6, 2, 3, 3],
                                   {"strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 1], "group": 3}),
    "dilation_asymmetric_pads": ([1, 2, 3, 5], [2, 4, 3, 2], {"dilations": [2, 1], "pads": [0, 1, 1, 0]}),
    "int16_input": ([1, 3, 4, 4], [3, 2, 4, 4], {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
    # Sums far beyond 2**24: exact only because int16 inputs are split into 8-bit parts.
    "int16_wide_sums": ([1, 64, 5, 5], [64, 8, 3, 3], {"strides": [2, 2]}),
}


@pytest.mark.parametrize("rule", ["float64", "float32"])
@pytest.mark.parametrize("case", sorted(TRANSPOSE_CASES))
def test_conv_transpose(case: str, rule: str) -> None:
    """Every layout, with either requantization rule; with the float32 rule a kernel equal to its
    stride runs as a 1x1 integer conv to blocks of channels and DepthToSpace."""
    xs, ws, attrs = TRANSPOSE_CASES[case]
    rng = np.random.default_rng(sorted(TRANSPOSE_CASES).index(case))
    x_bits = 16 if case.startswith("int16") else 8
    x, w = ints(rng, x_bits, xs), ints(rng, 8, ws)
    cout = ws[1] * attrs.get("group", 1)
    bias = rng.integers(-3000, 3000, cout).astype(np.int32)
    out_type = "int16" if x_bits == 16 else "int8"
    req = requant_attrs(rng, out_type, cout, 1.0 / (QMAX[x_bits] * 127 * 3))
    if rule == "float32":
        req["requantize_f32"] = 1
    node = hz_node("HzSQuantizedConv", ["x", "w", "b"], kind="ConvTranspose", x_bits=x_bits, axis=1,
                   kernel_shape=ws[2:], **attrs, **req)
    y = check(node, {"x": x}, {"w": w, "b": bias})
    assert (np.abs(y) == QMAX[x_bits]).any() or np.unique(y).size > 10
    by_blocks = rule == "float32" and ws[2] == ws[3] == attrs.get("strides", [1])[0] and not attrs.get("pads")
    lowered = lower_model(build(node, {"x": x}, y.dtype, list(y.shape), {"w": w, "b": bias}))
    assert any(n.op_type == "DepthToSpace" for n in lowered.graph.node) == by_blocks


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER", "VALID"])
def test_conv_auto_pad(auto_pad: str) -> None:
    rng = np.random.default_rng(3)
    x, w = ints(rng, 8, [1, 3, 7, 6]), ints(rng, 8, [4, 3, 2, 3])
    node = hz_node("HzSQuantizedConv", ["x", "w"], kind="Conv", x_bits=8, axis=1, kernel_shape=[2, 3],
                   strides=[2, 1], auto_pad=auto_pad, **requant_attrs(rng, "int8", 4, 1 / (127 * 127 * 4)))
    check(node, {"x": x}, {"w": w})


def test_conv_1d_and_matmul_kind() -> None:
    rng = np.random.default_rng(4)
    x, w = ints(rng, 8, [2, 5, 9]), ints(rng, 8, [6, 5, 3])
    node = hz_node("HzSQuantizedConv", ["x", "w"], kind="Conv", x_bits=8, axis=1, kernel_shape=[3], pads=[1, 1],
                   **requant_attrs(rng, "int8", 6, 1 / (127 * 127 * 4)))
    check(node, {"x": x}, {"w": w})
    for x_bits in (8, 16):
        x, w = ints(rng, x_bits, [2, 3, 16]), ints(rng, 8, [16, 5])
        bias = rng.integers(-20000, 20000, 5).astype(np.int32)
        node = hz_node("HzSQuantizedConv", ["x", "w", "b"], kind="MatMul", x_bits=x_bits, axis=-1,
                       **requant_attrs(rng, "int8", 5, 1 / (QMAX[x_bits] * 127 * 4)))
        check(node, {"x": x}, {"w": w, "b": bias})


@pytest.mark.parametrize("signed_weights", [True, False], ids=["u8s8", "u8u8"])
@pytest.mark.parametrize(("a_bits", "b_bits", "zero_points"), [(8, 8, (0, 0)), (8, 8, (5, -3)), (16, 8, (0, 4)),
                                                                (8, 16, (-2, 0)), (16, 16, (0, 0))])
def test_matmul_of_activations(a_bits: int, b_bits: int, zero_points: tuple[int, int], signed_weights: bool,
                               monkeypatch) -> None:
    """Two activations (attention): MatMulInteger on uint8 parts of the first against int8 (VNNI) or
    uint8 parts of the second, exact."""
    use_kernel_layout(monkeypatch, signed_weights)
    rng = np.random.default_rng(a_bits * b_bits + sum(zero_points))
    a, b = ints(rng, a_bits, [2, 3, 4, 9]), ints(rng, b_bits, [2, 3, 9, 5])
    a[0, 0, 0], b[0, 0, :, 0] = -QMAX[a_bits] - 1, -QMAX[b_bits] - 1  # extreme levels
    out = f"int{max(a_bits, b_bits)}"
    node = hz_node("HzSQuantizedMatMul", ["a", "b"], a_bits=a_bits, b_bits=b_bits, axis=-1,
                   a_zero_point=zero_points[0] or None, b_zero_point=zero_points[1] or None,
                   **requant_attrs(rng, out, 1, 1 / (QMAX[a_bits] * QMAX[b_bits] * 3)))
    check(node, {"a": a, "b": b})


@pytest.mark.parametrize("mode", ["add", "mul"])
@pytest.mark.parametrize(("a_bits", "b_bits", "b_shape"), [(8, 8, [1, 4, 5, 5]), (16, 8, [1, 4, 1, 1])])
def test_eltwise(mode: str, a_bits: int, b_bits: int, b_shape: list[int]) -> None:
    rng = np.random.default_rng(6)
    a, b = ints(rng, a_bits, [1, 4, 5, 5]), ints(rng, b_bits, b_shape)
    q = QMAX[a_bits]
    if mode == "add":
        attrs = {"a_multiplier": float(f32(0.5)), "b_multiplier": float(f32(-0.75 * q / QMAX[b_bits])),
                 "multiplier": [1.0]}
    else:
        attrs = {"multiplier": [float(f32(2.0 / QMAX[b_bits]))]}
    node = hz_node("HzSQuantizedEltwise", ["a", "b"], mode=mode, out_type=f"int{a_bits}", out_min=float(-q),
                   out_max=float(q), **attrs)
    check(node, {"a": a, "b": b})


@pytest.mark.parametrize(("b_bits", "zero_point"), [(16, 0), (8, 0), (8, 5)])
def test_eltwise_add_sums_in_float32(b_bits: int, zero_point: int) -> None:
    """``requantize_f32``: the lowering rounds float32(float32(a * ma) + float32(b * mb)) as the reference
    does; on these levels the float64 sum rounds some values to the other integer, so the rule counts."""
    rng = np.random.default_rng(16 + b_bits + zero_point)
    a, b = ints(rng, 16, [1, 8, 40, 40]), ints(rng, b_bits, [1, 8, 40, 40])
    if zero_point:
        b = np.clip(b.astype(np.int16) + zero_point, -128, 127).astype(np.int8)
    attrs = {"mode": "add", "a_multiplier": float(f32(0.1)), "b_multiplier": float(f32(-0.3 * 32767 / QMAX[b_bits])),
             "multiplier": [1.0], "out_type": "int16", "out_min": -32767.0, "out_max": 32767.0,
             "b_zero_point": zero_point or None}
    node = hz_node("HzSQuantizedEltwise", ["a", "b"], requantize_f32=1, **attrs)
    want = check(node, {"a": a, "b": b})
    float64 = registry.get("HzSQuantizedEltwise").reference(hz_node("HzSQuantizedEltwise", ["a", "b"], **attrs),
                                                            [a, b])[0]
    assert np.count_nonzero(want != float64) > 0, "the levels should reach values the two rules round apart"


@pytest.mark.parametrize(("zero_points", "multipliers", "bounds"),
                         [((0, 0, 0), (0.5, 0.25, ), (-128, 127)), ((3, -7, 0), (0.37, -0.81), (-127, 127)),
                          ((0, 0, -4), (1.5, 0.75), (0, 127)), ((-128 + 1, 127, 2), (0.1, 0.3), (-128, 127))])
def test_int8_add_matches_the_reference_on_every_pair(zero_points: tuple, multipliers: tuple, bounds: tuple) -> None:
    """An int8 + int8 -> int8 add (``requantize_f32``) lowered on uint8 DequantizeLinear / QuantizeLinear
    rounds every one of the 65,536 level pairs as the reference does (ties included), with zero points
    on either input and the output and a clip narrower than int8."""
    levels = np.arange(-128, 128, dtype=np.int8)
    a, b = (v.reshape(1, 1, 256, 256) for v in np.meshgrid(levels, levels, indexing="ij"))
    za, zb, zy = zero_points
    multipliers = (*multipliers, 0.5)[:2]
    node = hz_node("HzSQuantizedEltwise", ["a", "b"], mode="add", requantize_f32=1, multiplier=[1.0],
                   a_multiplier=float(f32(multipliers[0])), b_multiplier=float(f32(multipliers[1])),
                   a_zero_point=za or None, b_zero_point=zb or None, zero_point=zy or None, out_type="int8",
                   out_min=float(bounds[0]), out_max=float(bounds[1]))
    check(node, {"a": a, "b": b})
    lowered = lower_model(build(node, {"a": a, "b": b}, np.int8, list(a.shape)))
    assert "GatherElements" not in {n.op_type for n in lowered.graph.node}, "expected the DequantizeLinear path"


@pytest.mark.parametrize(("zero_points", "multiplier", "bounds"),
                         [((0, 0, 0), 0.5, (-128, 127)), ((3, -7, 0), 0.0123, (-127, 127)), ((0, 0, -4), 1.0, (0, 127)),
                          ((-127, 127, 2), 0.25, (-128, 127))])
def test_int8_mul_matches_the_reference_on_every_pair(zero_points: tuple, multiplier: float, bounds: tuple) -> None:
    """An int8 x int8 -> int8 mul (``requantize_f32``) lowered on uint8 DequantizeLinear / QuantizeLinear
    rounds every one of the 65,536 level pairs as the reference does (ties included, and a multiplier of 1)."""
    levels = np.arange(-128, 128, dtype=np.int8)
    a, b = (v.reshape(1, 1, 256, 256) for v in np.meshgrid(levels, levels, indexing="ij"))
    za, zb, zy = zero_points
    node = hz_node("HzSQuantizedEltwise", ["a", "b"], mode="mul", requantize_f32=1, multiplier=[float(f32(multiplier))],
                   a_zero_point=za or None, b_zero_point=zb or None, zero_point=zy or None, out_type="int8",
                   out_min=float(bounds[0]), out_max=float(bounds[1]))
    check(node, {"a": a, "b": b})
    lowered = lower_model(build(node, {"a": a, "b": b}, np.int8, list(a.shape)))
    assert "GatherElements" not in {n.op_type for n in lowered.graph.node}, "expected the DequantizeLinear path"


@pytest.mark.parametrize(("a_bits", "b_bits", "zero_point"), [(16, 8, 0), (16, 8, 5), (16, 16, 0), (8, 8, 3)])
def test_eltwise_mul_requantizes_in_float32(a_bits: int, b_bits: int, zero_point: int) -> None:
    """``requantize_f32`` on a mul: the lowering rounds float32(float32(a * b) * float32(m)) as the reference
    does (an int16 x int16 product is itself rounded to float32); on these levels the float64 rule rounds
    some values to the other integer, so the rule counts."""
    rng = np.random.default_rng(40 + a_bits + b_bits + zero_point)
    a, b = ints(rng, a_bits, [1, 8, 40, 40]), ints(rng, b_bits, [1, 8, 1, 40])  # b broadcasts, as an SE gate
    if zero_point:
        b = np.clip(b.astype(np.int16) + zero_point, -128, 127).astype(np.int8)
    q = QMAX[a_bits]
    attrs = {"mode": "mul", "multiplier": [float(f32(0.7 * q / (QMAX[a_bits] * QMAX[b_bits])))],
             "out_type": f"int{a_bits}", "out_min": float(-q), "out_max": float(q), "b_zero_point": zero_point or None}
    want = check(hz_node("HzSQuantizedEltwise", ["a", "b"], requantize_f32=1, **attrs), {"a": a, "b": b})
    float64 = registry.get("HzSQuantizedEltwise").reference(hz_node("HzSQuantizedEltwise", ["a", "b"], **attrs),
                                                            [a, b])[0]
    assert np.count_nonzero(want != float64) > 0, "the levels should reach values the two rules round apart"


@pytest.mark.parametrize(("in_bits", "out_type"), [(8, "int8"), (16, "int16"), (16, "int8")])
def test_lut(in_bits: int, out_type: str) -> None:
    rng = np.random.default_rng(8)
    lo = -(1 << (in_bits - 1))
    q = QMAX[int(out_type[3:])]
    table = rng.integers(-q, q + 1, -2 * lo)
    x = rng.integers(lo, -lo, [2, 3, 40]).astype(np.int8 if in_bits == 8 else np.int16)
    node = hz_node("HzLut", ["x"], table=[int(v) for v in table], in_min=lo, out_type=out_type)
    check(node, {"x": x})


@pytest.mark.parametrize("opset", [11, 13])
@pytest.mark.parametrize("encoding", ["ints", "tensor", "packed"])
def test_compact_lut_clamps_inputs_beyond_its_ends(opset: int, encoding: str) -> None:
    """A table cut to its varying part (HzLut.compact): inputs past either end take that end's entry."""
    from onnx import numpy_helper

    from hbtools.ops.quantized import HzLut, packed_table

    levels = np.arange(-32768, 32768)
    full = np.clip(np.round(levels / 40.0), -127, 127).astype(np.int8)  # saturates at both ends
    table, in_min = HzLut.compact(full, -32768)
    # round(x / 40) leaves -127 above -5061 and reaches 127 at 5061 (ties to even)
    assert (in_min, table.size, table[0], table[-1]) == (-5061, 10123, -127, 127)
    x = np.array([-32768, -5062, -5061, -5060, -1, 0, 1, 5060, 5061, 5062, 32767], dtype=np.int16)
    value = {"ints": [int(v) for v in table], "tensor": numpy_helper.from_array(table),
             "packed": packed_table(table)}[encoding]
    node = hz_node("HzLut", ["x"], table=value, in_min=in_min, out_type="int8")
    want = registry.get("HzLut").reference(node, [x])[0]
    assert_exact(want, full[x.astype(np.int64) + 32768])
    assert_exact(run_op(node, {"x": x}, np.int8, list(x.shape), opset=opset), want)


def test_packed_table_round_trip_and_size() -> None:
    from hbtools.ops.quantized import packed_table, table_of

    rng = np.random.default_rng(3)
    levels = np.arange(-32768, 32768)
    smooth = np.clip(np.round(levels * 0.37 + 20), -32768, 32767)  # an int16 linear segment and its clip
    for values in (smooth, rng.integers(-32768, 32768, 1000), np.array([7]), np.array([-32768, 32767, -32768])):
        node = hz_node("HzLut", ["x"], table=packed_table(values), in_min=0, out_type="int16")
        assert_exact(table_of(node), values.astype(np.int64))
    assert packed_table(smooth).ByteSize() < 2 * smooth.size // 50, "a smooth table packs 50 times smaller than int16"


def test_damaged_packed_table_is_named() -> None:
    from onnx import numpy_helper

    node = hz_node("HzLut", ["x"], table=numpy_helper.from_array(np.arange(9, dtype=np.uint8)), in_min=0,
                   out_type="int8")
    with pytest.raises(ValueError, match="HzLut_node: the packed table attribute is damaged"):
        registry.get("HzLut").reference(node, [np.array([1], dtype=np.int8)])


@pytest.mark.parametrize("x_bits", [8, 16])
def test_pools(x_bits: int) -> None:
    rng = np.random.default_rng(9)
    q = QMAX[x_bits]
    x = ints(rng, x_bits, [2, 3, 6, 7])
    node = hz_node("HzSQuantizedPool", ["x"], kind="GlobalAveragePool", multiplier=[float(f32(1 / 42 * 0.9))],
                   out_type=f"int{x_bits}", out_min=float(-q), out_max=float(q))
    check(node, {"x": x})
    for kernel, strides, pads in [([2, 2], [2, 2], [0, 0, 0, 0]), ([3, 2], [2, 1], [1, 0, 1, 1])]:
        node = hz_node("HzSQuantizedPool", ["x"], kind="AveragePool", channels=3, x_bits=x_bits,
                       kernel_shape=kernel, strides=strides, pads=pads,
                       multiplier=[float(f32(1 / np.prod(kernel)))], out_type=f"int{x_bits}",
                       out_min=float(-q), out_max=float(q), x_zero_point=-7 if x_bits == 8 else None)
        y = check(node, {"x": x})
        ops = {n.op_type for n in lower_model(build(node, {"x": x}, y.dtype, list(y.shape))).graph.node}
        assert "Conv" in ops and "ConvInteger" not in ops, "a window sum is a float32 depthwise conv (exact)"


def test_concat_copies_and_rescales() -> None:
    rng = np.random.default_rng(11)
    a, b, c = ints(rng, 8, [1, 2, 3, 4]), ints(rng, 8, [1, 3, 3, 4]), ints(rng, 16, [1, 1, 3, 4])
    node = hz_node("HzSQuantizedConcat", ["a", "b", "c"], multipliers=[1.0, 0.5, float(f32(127 / 32767 * 1.3))],
                   in_types=["int8", "int8", "int16"], concat_axis=1, out_type="int8", out_min=-127.0,
                   out_max=127.0)
    y = check(node, {"a": a, "b": b, "c": c})
    assert_exact(y[:, :2], a)


@pytest.mark.parametrize(("shape", "axis", "out_type"), [([2, 4, 3, 3], 1, "int8"), ([2, 3, 5], -1, "int16")])
def test_requantize_quantize_dequantize(shape: list[int], axis: int, out_type: str) -> None:
    rng = np.random.default_rng(13)
    x = rng.integers(-(2**24), 2**24, size=shape).astype(np.int32)
    q = QMAX[int(out_type[3:])]
    mult = f32(rng.uniform(0.5, 1.0, shape[axis]) * q / 2**24)
    node = hz_node("HzRequantize", ["x"], multiplier=[float(m) for m in mult], axis=axis, out_type=out_type,
                   out_min=float(-q), out_max=float(q))
    check(node, {"x": x})
    xf = np.concatenate([(np.arange(-8, 8) + 0.5) * 0.25, rng.normal(0, q * 0.1, 100)]).astype(np.float32)
    node = hz_node("HzQuantize", ["x"], scale=0.25, out_type=out_type, out_min=float(-q), out_max=float(q))
    check(node, {"x": xf})
    scales = f32(rng.uniform(1e-5, 1e-2, shape[axis]))
    node = hz_node("HzDequantize", ["x"], scales=[float(s) for s in scales], axis=axis)
    check(node, {"x": x})


def test_int32_saturation() -> None:
    x = np.array([2**30, -(2**30), 5], dtype=np.int32)
    node = hz_node("HzRequantize", ["x"], multiplier=[4.0], axis=-1, out_type="int32",
                   out_min=float(-(2**31)), out_max=float(2**31 - 1))
    assert check(node, {"x": x}).tolist() == [2**31 - 1, -(2**31), 20]


def test_conv_falls_back_to_int64_beyond_float64_exactness() -> None:
    x = np.array([[[[3]]]], dtype=np.int64)
    w = np.array([[[[2**52 + 1]]]], dtype=np.int64)
    kwargs = dict(strides=[1, 1], pads_begin=[0, 0], pads_end=[0, 0], dilations=[1, 1], group=1)
    exact = conv(x, w, bound=3 * (2**52 + 1), **kwargs)
    assert exact.dtype == np.int64 and int(exact.reshape(-1)[0]) == 3 * (2**52 + 1)
    assert 3 * (2**52 + 1) > EXACT_LIMIT


@pytest.mark.parametrize(("mode", "constant_first", "c_shape"),
                         [("add", 0, [1, 4, 1, 1]), ("sub", 1, [4, 1, 1]), ("mul", 0, [1, 4, 5, 5]),
                          ("div", 0, [1, 4, 1, 1]), ("div", 1, [1, 4, 5, 5]), ("prelu", 0, [4, 1, 1])])
@pytest.mark.parametrize("x_bits", [8, 16])
def test_constant_eltwise(mode: str, constant_first: int, c_shape: list[int], x_bits: int) -> None:
    rng = np.random.default_rng(7)
    x = ints(rng, x_bits, [1, 4, 5, 5])
    c = f32(rng.uniform(0.5, 3.0, c_shape) * rng.choice([-1, 1], c_shape))
    q = QMAX[x_bits]
    node = registry.get("HzSQuantizedConstantEltwise").make_node(
        ["x", "c"], ["y"], "ce", mode=mode, constant_first=constant_first, x_scale=[float(f32(1.5 / q))],
        x_zero_point=3 if x_bits == 8 else None, out_scale=[float(f32(4.0 / q))], out_type=f"int{x_bits}",
        out_min=float(-q - 1), out_max=float(q), zero_point=-2 if x_bits == 8 else None)
    y = check(node, {"x": x}, {"c": c})
    assert len(np.unique(y)) > 10


@pytest.mark.parametrize(("x_bits", "out_type", "axis"), [(8, "int8", 1), (8, "int16", -1), (16, "int8", 2)])
def test_softmax(x_bits: int, out_type: str, axis: int) -> None:
    from hbtools.ops.quantized import packed_table
    from hbtools.ops.softmax import exp_table

    rng = np.random.default_rng(8)
    x = ints(rng, x_bits, [1, 16, 4, 6])
    step = float(f32(12.0 / QMAX[x_bits]))
    table = exp_table(step, x_bits)
    # cut where exp rounds to 0: one 0 stands for every smaller difference (the index clamps to it)
    assert table[-1] == 2**15 and table[0] == 0 != table[1] and len(table) < 2**x_bits
    q = QMAX[int(out_type[3:])]
    node = registry.get("HzSQuantizedSoftmax").make_node(  # the emitter's packed table, and a plain list
        ["x"], ["y"], "sm", axis=axis, table=packed_table(table) if x_bits == 16 else table,
        out_scale=[float(f32(1.0 / q))], out_type=out_type, out_min=float(-q), out_max=float(q))
    y = check(node, {"x": x})
    p = np.exp(x * np.float64(step) - (x * np.float64(step)).max(axis=axis, keepdims=True))
    p /= p.sum(axis=axis, keepdims=True)
    # within an output step plus the table's 2**-15 resolution of the float softmax
    assert np.abs(y / q - p).max() <= 1.0 / q + 2.0**-14


@pytest.mark.parametrize(("x_bits", "out_type", "axis"), [(8, "int8", 1), (8, "int16", -1), (16, "int16", 2),
                                                         (16, "int8", -1)])
def test_log_softmax(x_bits: int, out_type: str, axis: int) -> None:
    """Softmax's exp table and exact sum, then x - max - log(sum) with the log from a table interpolated by
    IEEE +, -, * only: the lowering and the reference agree bit for bit (float64 Log of numpy and onnxruntime
    differ in the last bit), and the result is float LogSoftmax to an output step."""
    from hbtools.ops.quantized import packed_table
    from hbtools.ops.softmax import exp_table, log_table

    rng = np.random.default_rng(9)
    x = ints(rng, x_bits, [1, 16, 4, 37])
    step = float(f32(12.0 / QMAX[x_bits]))
    q = QMAX[int(out_type[3:])]
    out_step = float(f32(16.0 / q))
    node = registry.get("HzSQuantizedLogSoftmax").make_node(
        ["x"], ["y"], "lsm", axis=axis, table=packed_table(exp_table(step, x_bits)), log_table=log_table(),
        x_scale=[step], out_scale=[out_step], out_type=out_type, out_min=float(-q), out_max=float(q))
    y = check(node, {"x": x})
    v = x * np.float64(step)
    v = v - v.max(axis=axis, keepdims=True)
    want = v - np.log(np.exp(v).sum(axis=axis, keepdims=True))
    # within half an output step plus the log of the sum's error (each table entry within half a 2**-15 level)
    assert np.abs(y * out_step - np.clip(want, -q * out_step, None)).max() <= 0.5 * out_step + x.shape[axis] * 2.0**-16

@pytest.mark.parametrize(("x_bits", "out_type", "axes", "shape", "zero_point"),
                         [(8, "int8", [-1], [2, 7, 24], 0), (16, "int8", [-1], [1, 5, 96], 0),
                          (16, "int16", [-2, -1], [1, 3, 6, 9], 0), (8, "int8", [-1], [1, 4, 33], -5),
                          (16, "int8", [-3], [1, 40, 3, 5], 0), (16, "int8", [-1], [1, 2, 1290], 0),
                          # beyond 1290 values, the form around an integer mean: LayerNorm over 1536 and 4096
                          # channels, a GroupNorm's 8 channels x 20 x 20 (its last half at full scale)
                          (16, "int8", [-1], [1, 2, 1536], 0), (16, "int16", [-1], [1, 2, 4096], 0),
                          (8, "int8", [-1], [1, 3, 1291], -5), (16, "int8", [-3, -2, -1], [1, 4, 8, 20, 20], 0)])
def test_layer_norm(x_bits: int, out_type: str, axes: list[int], shape: list[int], zero_point: int) -> None:
    """Integer statistics are exact (the largest int16 group of the plain form, 1290 values, and larger groups
    around their integer mean), so the lowering and the numpy reference agree bit for bit, and the result is
    float LayerNorm of the input's values to an output step; over the last axes or over the channels of an
    NCHW map."""

    rng = np.random.default_rng(12)
    x = ints(rng, x_bits, shape)
    x.reshape(-1)[:7] = QMAX[x_bits]  # full-scale outliers, and groups of equal values (variance 0)
    x[0, 0] = zero_point
    normalized = [a % len(shape) for a in axes]
    group = int(np.prod([shape[a] for a in normalized]))
    if group > 2000:  # a group at full scale both ways: the plain form's sum(D * D) would pass 2**63
        x.reshape(shape[0] * shape[1], -1)[-1] = np.where(np.arange(group) % 2, QMAX[x_bits], -QMAX[x_bits] - 1)
    step = float(f32(6.0 / QMAX[x_bits]))
    q = QMAX[int(out_type[3:])]
    out_step = float(f32(4.0 / q))
    param_shape = [shape[k] if k in normalized else 1 for k in range(normalized[0], len(shape))]
    gamma = (1 + 0.2 * rng.standard_normal(param_shape)).astype(np.float32)
    beta = (0.1 * rng.standard_normal(param_shape)).astype(np.float32)
    node = registry.get("HzSQuantizedLayerNorm").make_node(
        ["x", "g", "b"], ["y"], "ln", axes=axes, epsilon=1e-5, group=group, x_scale=[step], out_scale=[out_step],
        out_type=out_type, out_min=float(-q), out_max=float(q), zero_point=None)
    y = check(node, {"x": x}, {"g": gamma, "b": beta})
    v = (x.astype(np.float64) - zero_point) * step
    d = v - v.mean(axis=tuple(normalized), keepdims=True)
    want = d / np.sqrt((d * d).mean(axis=tuple(normalized), keepdims=True) + 1e-5) * gamma + beta
    assert np.abs(y * out_step - np.clip(want, -q * out_step, q * out_step)).max() <= 0.5 * out_step + 1e-9

FAST_CASES = {
    # name: (x shape, w shape, conv attrs, (out_min, out_max), x zero point, output zero point)
    "3x3_pad": ([2, 4, 7, 6], [5, 4, 3, 3], {"pads": [1, 1, 1, 1]}, (-128, 127), 0, 0),
    "depthwise_stride": ([1, 6, 9, 9], [6, 1, 3, 3], {"group": 6, "strides": [2, 2], "pads": [1, 1, 1, 1]},
                         (-128, 127), 0, 0),
    "fused_relu6": ([1, 4, 5, 5], [6, 4, 3, 3], {"pads": [1, 1, 1, 1]}, (0, 48), 0, 0),
    "zero_points": ([1, 3, 6, 6], [4, 3, 3, 3], {"pads": [1, 1, 1, 1]}, (-128, 127), -7, 5),
    "conv1d": ([1, 8, 17], [4, 8, 3], {"dilations": [2], "pads": [2, 2]}, (-128, 127), 0, 0),
    # A sum beyond 2**24: float32(acc) rounds before the multiplier, as in the kernel.
    "wide_sums": ([1, 2080, 2, 2], [2, 2080, 1, 1], {}, (-128, 127), 0, 0),
}


@pytest.mark.parametrize("signed_weights", [True, False], ids=["u8s8", "u8u8"])
@pytest.mark.parametrize("case", sorted(FAST_CASES))
def test_int8_conv_runs_on_onnxruntime_integer_kernels(case: str, signed_weights: bool, monkeypatch) -> None:
    """int8 -> int8 convolutions lower to QLinearConv on uint8 and still equal the reference bit for bit."""
    from test_hz_ops import build

    from hbtools.runtime.lowering import lower_model

    use_kernel_layout(monkeypatch, signed_weights)
    xs, ws, conv_attrs, (lo, hi), zx, zy = FAST_CASES[case]
    rng = np.random.default_rng(sorted(FAST_CASES).index(case))
    x, w = ints(rng, 8, xs), ints(rng, 8, ws)
    bias = rng.integers(-5000, 5000, ws[0]).astype(np.int32)
    attrs = requant_attrs(rng, "int8", ws[0], 1.0 / (127 * 127 * np.prod(ws[1:]) ** 0.5))
    if case == "wide_sums":
        # acc = 2080 * 127 * 127 + 6113 = 2**25 + 1; times 33 * 2**-26 that is 16.5 + 5e-7 (17 in
        # float64), while float32(acc) = 2**25 gives the tie 16.5 (16).
        x, w[0], bias[0], attrs["multiplier"][0] = np.full(xs, 127, dtype=np.int8), 127, 6113, 33 * 2.0**-26
    attrs.update(out_min=float(lo), out_max=float(hi))
    node = hz_node("HzSQuantizedConv", ["x", "w", "b"], kind="Conv", x_bits=8, axis=1, kernel_shape=ws[2:],
                   requantize_f32=1, x_zero_point=zx or None, zero_point=zy or None, **conv_attrs, **attrs)
    want = check(node, {"x": x}, {"w": w, "b": bias})
    model = build(node, {"x": x}, np.int8, [xs[0], ws[0], *[0] * (len(xs) - 2)], {"w": w, "b": bias})
    assert "QLinearConv" in {n.op_type for n in lower_model(model).graph.node}
    # An opset-11 model (Clip float only) is lowered at opset 12: its range clip stays on uint8.
    old = build(node, {"x": x}, np.int8, list(want.shape), {"w": w, "b": bias}, opset=11)
    lowered = lower_model(old)
    producer = {o: n.op_type for n in lowered.graph.node for o in n.output}
    assert all(producer[n.input[0]] == "QLinearConv" for n in lowered.graph.node if n.op_type == "Clip"), \
        "the opset-11 model clips in float"
    assert_exact(want, run_lowered(old, {"x": x}))


@pytest.mark.parametrize("signed_weights", [True, False], ids=["u8s8", "u8u8"])
@pytest.mark.parametrize("case", ["weight", "weight_relu", "two_activations", "gemm_bias"])
def test_int8_matmul_runs_on_onnxruntime_integer_kernels(case: str, signed_weights: bool, monkeypatch) -> None:
    """int8 -> int8 MatMuls lower to QLinearMatMul on uint8 and still equal the reference bit for bit."""
    from test_hz_ops import build

    from hbtools.runtime.lowering import lower_model

    use_kernel_layout(monkeypatch, signed_weights)
    rng = np.random.default_rng(len(case))
    a = ints(rng, 8, [2, 3, 5, 24])
    if case == "two_activations":
        b = ints(rng, 8, [2, 3, 24, 6])
        attrs = requant_attrs(rng, "int8", 1, 1.0 / (127 * 127 * 24**0.5))
        node = hz_node("HzSQuantizedMatMul", ["a", "b"], requantize_f32=1, a_zero_point=3, **attrs)
        feeds, consts, out_shape = {"a": a, "b": b}, {}, [2, 3, 5, 6]
    elif case == "gemm_bias":  # a Gemm's: 2-D input, int32 bias
        a, w = a.reshape(30, 24), ints(rng, 8, [24, 7])
        attrs = requant_attrs(rng, "int8", 7, 1.0 / (127 * 127 * 24**0.5))
        node = hz_node("HzSQuantizedConv", ["a", "w", "b"], kind="MatMul", x_bits=8, axis=-1, requantize_f32=1,
                       **attrs)
        feeds, out_shape = {"a": a}, [30, 7]
        consts = {"w": w, "b": rng.integers(-5000, 5000, 7).astype(np.int32)}
    else:
        w = ints(rng, 8, [24, 7])
        attrs = requant_attrs(rng, "int8", 7, 1.0 / (127 * 127 * 24**0.5))
        if case == "weight_relu":
            attrs["out_min"] = 0.0
        node = hz_node("HzSQuantizedConv", ["a", "w"], kind="MatMul", x_bits=8, axis=-1, requantize_f32=1, **attrs)
        feeds, consts, out_shape = {"a": a}, {"w": w}, [2, 3, 5, 7]
    check(node, feeds, consts)
    model = build(node, feeds, np.int8, out_shape, consts)
    kernel = "QLinearConv" if case == "gemm_bias" else "QLinearMatMul"
    assert kernel in {n.op_type for n in lower_model(model).graph.node}


@pytest.mark.parametrize("signed_weights", [True, False], ids=["u8s8", "u8u8"])
@pytest.mark.parametrize("rule", ["float64", "float32"])
@pytest.mark.parametrize(("x_bits", "out_type"), [(8, "int16"), (16, "int8"), (16, "int16")])
def test_matmul_kind_accumulates_in_int32(x_bits: int, out_type: str, rule: str, signed_weights: bool,
                                          monkeypatch) -> None:
    """A constant-weight MatMul (a recogniser's head) sums its int8/int16 parts, as uint8, in int32
    where every sum fits, and requantizes from there; equal to the reference bit for bit."""
    use_kernel_layout(monkeypatch, signed_weights)
    rng = np.random.default_rng(x_bits + len(out_type) + len(rule))
    x, w = ints(rng, x_bits, [1, 7, 40]), ints(rng, 8, [40, 9])
    x[0, 0] = -QMAX[x_bits] - 1  # the extreme level
    bias = rng.integers(-20000, 20000, 9).astype(np.int32)
    attrs = requant_attrs(rng, out_type, 9, 1 / (QMAX[x_bits] * 127 * 6))
    if rule == "float32":
        attrs["requantize_f32"] = 1
    node = hz_node("HzSQuantizedConv", ["x", "w", "b"], kind="MatMul", x_bits=x_bits, axis=-1, **attrs)
    y = check(node, {"x": x}, {"w": w, "b": bias})
    lowered = lower_model(build(node, {"x": x}, y.dtype, list(y.shape), {"w": w, "b": bias}))
    ops = [n.op_type for n in lowered.graph.node]
    assert "MatMulInteger" in ops
    types = {i.name: i.data_type for i in lowered.graph.initializer}
    kernels = [n for n in lowered.graph.node if n.op_type == "MatMulInteger"]
    assert {types.get(n.input[1]) for n in kernels} == {TensorProto.INT8 if signed_weights else TensorProto.UINT8}
    casts = {helper.get_attribute_value(a) for n in lowered.graph.node if n.op_type == "Cast" for a in n.attribute}
    assert TensorProto.DOUBLE not in casts or rule == "float64", "the float32 rule needs no float64"


@pytest.mark.parametrize("rule", ["float64", "float32"])
def test_conv_transpose_with_sums_beyond_float32_is_split_into_exact_chunks(rule: str) -> None:
    """A decoder upsampling (k 4, stride 2, pads 1, hundreds of channels: a ViT or U-Net head) sums more
    products per output than float32 holds exactly; the lowering splits the input channels so every
    chunk stays exact and adds the chunks in float64. Large same-sign values make the sums ~2**26."""
    rng = np.random.default_rng(11)
    x = rng.integers(100, 128, [1, 1100, 3, 3]).astype(np.int8)
    w = rng.integers(100, 128, [1100, 2, 4, 4]).astype(np.int8)
    req = requant_attrs(rng, "int8", 2, 1.0 / (127 * 127 * 1100 * 4))
    if rule == "float32":
        req["requantize_f32"] = 1
    node = hz_node("HzSQuantizedConv", ["x", "w"], kind="ConvTranspose", x_bits=8, axis=1, kernel_shape=[4, 4],
                   strides=[2, 2], pads=[1, 1, 1, 1], **req)
    check(node, {"x": x}, {"w": w})


@pytest.mark.parametrize("keepdims", [1, 0])
@pytest.mark.parametrize("bits", [8, 16])
@pytest.mark.parametrize("op", ["HzSQuantizedArgMax", "HzSQuantizedArgMin"])
def test_argmax_takes_the_first_of_equal_levels(op: str, bits: int, keepdims: int) -> None:
    """Levels drawn from a handful of values, so most positions hold several equal largest (smallest) ones:
    both take the first, as the float model's ArgMax of the dequantized values does."""
    rng = np.random.default_rng(12)
    x = rng.integers(-3, 3, [2, 19, 5, 7]).astype(np.int8 if bits == 8 else np.int16)
    node = hz_node(op, ["x"], axis=1, keepdims=keepdims)
    picked = check(node, {"x": x})
    pick = np.argmax if op.endswith("ArgMax") else np.argmin
    assert picked.dtype == np.int64 and picked.reshape(-1).tolist() == pick(x, axis=1).reshape(-1).tolist()
