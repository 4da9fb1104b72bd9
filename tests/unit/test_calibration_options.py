"""``calibration_parameters.per_channel`` and ``optimization: asymmetric`` (SPEC §7, seeds 001/004).

Op level: zero points and folded per-channel input scales lower to onnxruntime
exactly as the numpy references compute them. Pipeline level: small float models
with random calibration data are converted with and without the options; the
options must bring the calibrated and quantized models closer to float where the
data calls for them, keep the calibrated model a float emulation of the quantized
one (integer levels within one step), and the ``.bin`` simulator must equal the
quantized ONNX model bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from builders import FloatModel, make_project
from onnx import TensorProto, helper, numpy_helper
from test_debug_engine import without
from test_hz_ops import assert_exact, build, conv_int64, hz_node, run_lowered, run_op
from test_pipeline_small import Converted, all_tensors, calibration_nodes, convert, warnings

from hbtools.debug.model import load_calibrated
from hbtools.debug.switchboard import Switchboard
from hbtools.ops import registry
from hbtools.ops.base import attrs_of
from hbtools.ops.calibration import HzCalibration
from hbtools.ops.quantized import table_of
from hbtools.pipeline.calibrate import zero_point_margin
from hbtools.quant.statistics import ChannelStats, TensorStats
from hbtools.quant.thresholds import threshold_for
from hbtools.runtime import HB_ONNXRuntime
from hbtools.runtime.runtime_model import open_model
from hbtools.runtime.simulator import Simulator

CAL_SAMPLES = 16
HELD_OUT = 8


# ---------------------------------------------------------------- ops


def test_conv_integer_pads_with_the_zero_point() -> None:
    """The lowering relies on it: a padded position contributes (z - z) * w = 0, the float value 0."""
    rng = np.random.default_rng(0)
    x = rng.integers(-128, 128, (1, 2, 5, 5)).astype(np.int8)
    w = rng.integers(-127, 128, (3, 2, 3, 3)).astype(np.int8)
    zp = np.int8(37)
    node = helper.make_node("ConvInteger", ["x", "w", "z"], ["y"], pads=[1, 1, 1, 1])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.INT8, x.shape)],
                              [helper.make_tensor_value_info("y", TensorProto.INT32, None)],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array(zp), "z")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    y = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(y, conv_int64(x.astype(np.int64) - zp, w, pads=(1, 1, 1, 1)))


def _calibration_model(node: onnx.NodeProto, x: np.ndarray) -> onnx.ModelProto:
    return build(node, {node.input[0]: x}, np.float32, list(x.shape))


def test_asymmetric_activation_calibration() -> None:
    rng = np.random.default_rng(1)
    scale, zp = np.float32(2.0**-5), -128  # a non-negative grid: 0 .. 255 * scale
    node = HzCalibration.build("x", "y", kind="activation", thresholds=[255 * scale], bits=8,
                               scales=[scale], zero_points=[zp])
    x = np.concatenate([(np.arange(-3, 300) + 0.5) * scale, rng.uniform(-1, 9, 200)]).astype(np.float32)
    y = run_lowered(_calibration_model(node, x), {"x": x})
    assert_exact(y, HzCalibration.reference(node, [x])[0])
    q = np.clip(np.round(x / scale) + zp, -128, 127)  # the documented formula
    assert_exact(y, ((q - zp) * scale).astype(np.float32))
    assert y.min() == 0 and y.max() == np.float32(255 * scale), "the whole int8 range holds [0, threshold]"
    # The fed form (method search) gives the same values from graph inputs.
    fed = {"x": x, "y_HzCalibration_scale": np.array(scale),
           "y_HzCalibration_zero_point": np.array(zp, np.float32), "y_HzCalibration_qmin": np.array(-128, np.float32),
           "y_HzCalibration_qmax": np.array(127, np.float32)}
    node.name = "y_HzCalibration"
    assert_exact(run_lowered(_calibration_model(node, x), fed, feed_calibration=True), y)


def test_per_channel_activation_calibration() -> None:
    rng = np.random.default_rng(2)
    thresholds = np.array([0.5, 4.0, 50.0])
    node = HzCalibration.build("x", "y", kind="activation", thresholds=thresholds, bits=8, axis=1)
    x = (rng.standard_normal((2, 3, 4, 4)) * thresholds.reshape(1, 3, 1, 1)).astype(np.float32)
    y = run_lowered(_calibration_model(node, x), {"x": x})
    assert_exact(y, HzCalibration.reference(node, [x])[0])
    s = (thresholds / 127).astype(np.float32).reshape(1, 3, 1, 1)
    assert_exact(y, (np.clip(np.round(x / s), -127, 127) * s).astype(np.float32))


@pytest.mark.parametrize(("shape", "axis", "input_axis", "group"),
                         [([6, 4, 3, 3], 0, 1, 1), ([6, 2, 3, 3], 0, 1, 2), ([6, 1, 3, 3], 0, 1, 6),
                          ([4, 5], 1, 0, 1), ([5, 4], 0, 1, 1)])
def test_folded_weight_calibration(shape: list[int], axis: int, input_axis: int, group: int) -> None:
    """A weight whose conv reads a per-channel input: rounded as w * u per output channel, then unfolded."""
    rng = np.random.default_rng(3)
    w = rng.standard_normal(shape).astype(np.float32)
    channels = shape[input_axis] * (group if input_axis == 1 and len(shape) == 4 else 1)
    u = rng.uniform(0.01, 1.0, channels).astype(np.float32)
    # Input channel of every weight element: Conv [O, C/g, k, k] reads channel (o // (O/g)) * C/g + j.
    if len(shape) == 4:
        o, j = np.meshgrid(np.arange(shape[0]), np.arange(shape[1]), indexing="ij")
        per_element = u[(o // (shape[0] // group)) * shape[1] + j][:, :, None, None]
    else:
        per_element = u.reshape([-1 if k == input_axis else 1 for k in range(2)])
    folded = w * per_element
    thresholds = np.abs(folded).max(axis=tuple(k for k in range(len(shape)) if k != axis))
    node = HzCalibration.build("w", "y", kind="weight", thresholds=thresholds, bits=8, axis=axis,
                               input_scales=u, input_axis=input_axis, group=group)
    y = run_lowered(_calibration_model(node, w), {"w": w})
    assert_exact(y, HzCalibration.reference(node, [w])[0])
    s = (thresholds / 127).astype(np.float32).reshape([-1 if k == axis else 1 for k in range(len(shape))])
    assert_exact(y, (np.clip(np.round(folded / s), -127, 127) * s / per_element).astype(np.float32))


def _check_reference(node: onnx.NodeProto, feeds: dict, consts: dict | None = None) -> np.ndarray:
    values = {**feeds, **(consts or {})}
    want = registry.get(node.op_type).reference(node, [values[n] for n in node.input])[0]
    assert_exact(run_op(node, feeds, want.dtype, list(want.shape), consts), want)
    return want


def _i8(rng: np.random.Generator, shape: list[int]) -> np.ndarray:
    return rng.integers(-128, 128, shape).astype(np.int8)


def test_conv_with_input_and_output_zero_points() -> None:
    rng = np.random.default_rng(4)
    x, w = _i8(rng, [1, 4, 6, 5]), rng.integers(-127, 128, [3, 4, 3, 3]).astype(np.int8)
    bias = rng.integers(-3000, 3000, 3).astype(np.int32)
    mult = np.float32(1 / 2000.0)
    node = hz_node("HzSQuantizedConv", ["x", "w", "b"], kind="Conv", x_bits=8, axis=1, kernel_shape=[3, 3],
                   pads=[1, 1, 1, 1], multiplier=[float(mult)], out_type="int8", out_min=-128.0, out_max=127.0,
                   x_zero_point=-128, zero_point=-20)
    y = _check_reference(node, {"x": x}, {"w": w, "b": bias})
    acc = conv_int64(x.astype(np.int64) + 128, w, pads=(1, 1, 1, 1)) + bias.reshape(1, 3, 1, 1)
    np.testing.assert_array_equal(y, np.clip(np.round(acc * np.float64(mult)) - 20, -128, 127))
    dw = rng.integers(-127, 128, [4, 1, 3, 3]).astype(np.int8)  # depthwise
    node = hz_node("HzSQuantizedConv", ["x", "w"], kind="Conv", x_bits=8, axis=1, kernel_shape=[3, 3], group=4,
                   pads=[1, 1, 1, 1], multiplier=[0.002] * 4, out_type="int8", out_min=-128.0, out_max=127.0,
                   x_zero_point=55)
    _check_reference(node, {"x": x}, {"w": dw})
    mm = hz_node("HzSQuantizedConv", ["x", "w"], kind="MatMul", x_bits=8, axis=-1, multiplier=[0.001],
                 out_type="int8", out_min=-128.0, out_max=127.0, x_zero_point=-7, zero_point=3)
    _check_reference(mm, {"x": _i8(rng, [2, 3, 6])}, {"w": rng.integers(-127, 128, [6, 4]).astype(np.int8)})


def test_other_integer_ops_with_zero_points() -> None:
    rng = np.random.default_rng(5)
    req = {"out_type": "int8", "out_min": -128.0, "out_max": 127.0, "zero_point": -100}
    a, b = _i8(rng, [1, 4, 5, 5]), _i8(rng, [1, 4, 5, 5])
    _check_reference(hz_node("HzSQuantizedMatMul", ["a", "b"], a_bits=8, b_bits=8, axis=-1, multiplier=[0.0005],
                             a_zero_point=-128, b_zero_point=9, **req), {"a": a, "b": b})
    _check_reference(hz_node("HzSQuantizedEltwise", ["a", "b"], mode="add", a_multiplier=0.4, b_multiplier=-0.7,
                             multiplier=[1.0], a_zero_point=-128, b_zero_point=12, **req), {"a": a, "b": b})
    _check_reference(hz_node("HzSQuantizedEltwise", ["a", "b"], mode="mul", multiplier=[0.004],
                             a_zero_point=-128, b_zero_point=-3, **req), {"a": a, "b": b})
    _check_reference(hz_node("HzSQuantizedPool", ["a"], kind="GlobalAveragePool", multiplier=[0.04],
                             x_zero_point=-128, **req), {"a": a})
    _check_reference(hz_node("HzSQuantizedPool", ["a"], kind="AveragePool", channels=4, x_bits=8,
                             kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], multiplier=[0.1],
                             x_zero_point=-128, **req), {"a": a})
    _check_reference(hz_node("HzSQuantizedConcat", ["a", "b"], multipliers=[1.0, 0.6], in_types=["int8", "int8"],
                             concat_axis=1, zero_points=[-100, 5], **req), {"a": a, "b": b})
    acc = rng.integers(-40000, 40000, [1, 4, 5, 5]).astype(np.int32)
    _check_reference(hz_node("HzRequantize", ["acc"], multiplier=[0.003, 0.002, 0.001, 0.004], axis=1, **req),
                     {"acc": acc})
    x = (rng.standard_normal([1, 3, 4, 4]) * np.array([1, 10, 100]).reshape(1, 3, 1, 1)).astype(np.float32)
    q = _check_reference(hz_node("HzQuantize", ["x"], scales=[0.01, 0.1, 1.0], axis=1, zero_point=-20,
                                 out_type="int8", out_min=-128.0, out_max=127.0), {"x": x})
    s = np.array([0.01, 0.1, 1.0], np.float32).reshape(1, 3, 1, 1)
    np.testing.assert_array_equal(q, np.clip(np.round(x / s) - 20, -128, 127))
    back = _check_reference(hz_node("HzDequantize", ["q"], scales=[0.01, 0.1, 1.0], axis=1, zero_point=-20),
                            {"q": q})
    np.testing.assert_array_equal(back, ((q.astype(np.float64) + 20) * s.astype(np.float64)).astype(np.float32))


def test_channel_statistics_are_streamed() -> None:
    rng = np.random.default_rng(6)
    stats = ChannelStats(axis=1)
    batches = [rng.standard_normal((1, 3, 6, 6)) * np.array([0.1, 1.0, 10.0]).reshape(1, 3, 1, 1) * (k + 1)
               for k in range(5)]
    for b in batches:
        stats.update(b)
        assert stats.hist.shape == (3, stats.bins), "memory does not grow with the samples"
    data = np.concatenate([np.moveaxis(b, 1, 0).reshape(3, -1) for b in batches], axis=1)
    np.testing.assert_allclose(stats.max_abs, np.abs(data).max(axis=1), rtol=1e-6)
    np.testing.assert_allclose(stats.min, data.min(axis=1), rtol=1e-6)
    assert (stats.hist.sum(axis=1) == data.shape[1]).all()
    for method in ("max", "kl", "percentile"):
        th = threshold_for(method, stats, 8, 0.99)
        assert th.shape == (3,) and (th > 0).all() and (th <= stats.max_abs + 1e-9).all()
        assert th[2] > 10 * th[0], f"{method}: each channel keeps its own range"


def test_int16_tensors_take_the_max_with_every_method() -> None:
    """Clipping buys an int8 grid a finer step; a 16-bit grid is fine at the max, and a tensor clipped
    on the calibration pictures is clipped further on others."""
    rng = np.random.default_rng(8)
    stats = TensorStats()
    for _ in range(4):
        x = rng.standard_normal((1, 4, 32, 32))
        x.flat[rng.integers(x.size)] = 40.0  # a rare outlier each sample
        stats.update(x.astype(np.float32))
    for method in ("max", "kl", "percentile"):
        assert threshold_for(method, stats, 16, 0.999) == pytest.approx(stats.max_abs)
    assert threshold_for("percentile", stats, 8, 0.999) < stats.max_abs / 4
    assert threshold_for("kl", stats, 8) < stats.max_abs / 2



@pytest.mark.parametrize("per_channel", [False, True])
def test_kl_is_not_moved_by_exact_zeros(per_channel: bool) -> None:
    """A ReLU's output: the same positive values with none, as many or four times as many exact zeros
    get the same KL bound, and it clips next to nothing (counted, the zeros' spike in bin 0 pulled the
    bound down to where 60 % of the values were clipped)."""
    rng = np.random.default_rng(3)
    positive = np.abs(rng.normal(0.0, 30.0, 40000)).astype(np.float32)
    bounds = []
    for zeros in (0, 40000, 160000):
        x = np.concatenate([positive, np.zeros(zeros, np.float32)])
        stats = ChannelStats(axis=0) if per_channel else TensorStats()
        stats.update(x[None] if per_channel else x)
        assert int(np.asarray(stats.zeros).sum()) == zeros
        bounds.append(float(np.asarray(threshold_for("kl", stats, 8)).reshape(-1)[0]))
    assert bounds[1] == bounds[0] and bounds[2] == bounds[0]
    assert np.mean(positive > bounds[0]) < 0.01

# ---------------------------------------------------------------- pipeline


def _conv(nodes: list, inits: list, rng: np.random.Generator, x: str, cin: int, cout: int, name: str,
          out_gain: np.ndarray | None = None, in_gain: np.ndarray | None = None) -> str:
    w = rng.standard_normal((cout, cin, 3, 3)) / np.sqrt(cin * 9)
    b = 0.1 * rng.standard_normal(cout)
    if out_gain is not None:
        w, b = w * out_gain[:, None, None, None], b * out_gain
    if in_gain is not None:
        w = w / in_gain[None, :, None, None]
    inits += [numpy_helper.from_array(w.astype(np.float32), f"{name}_w"),
              numpy_helper.from_array(b.astype(np.float32), f"{name}_b")]
    nodes.append(helper.make_node("Conv", [x, f"{name}_w", f"{name}_b"], [f"{name}_out"], name=name,
                                  kernel_shape=[3, 3], pads=[1, 1, 1, 1]))
    return f"{name}_out"


def conv_act_conv(act: str, channels: int = 8, *, gains: np.ndarray | None = None,
                  input_gains: np.ndarray | None = None) -> FloatModel:
    """featuremap x [1, 4, 8, 8] -> Conv -> ``act`` (tensor "act") -> Conv.

    ``gains`` scale the first conv's output channels and divide the second conv's
    weights, so the float output is unchanged in character but the channels of
    "act" span very different ranges; ``input_gains`` do the same for the input
    channels (with data scaled accordingly).
    """
    rng = np.random.default_rng(0)
    nodes: list = []
    inits: list = []
    y = _conv(nodes, inits, rng, "x", 4, channels, "conv1", gains, input_gains)
    nodes.append(helper.make_node(act, [y], ["act"], name=act.lower()))
    out = _conv(nodes, inits, rng, "act", channels, 4, "conv2", None, gains)
    shape = [1, 4, 8, 8]
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return FloatModel(onnx.shape_inference.infer_shapes(model), {"x": shape}, {"x"})


def samples(rng: np.random.Generator, count: int, input_gains: np.ndarray | None, side: int = 8) -> np.ndarray:
    x = rng.standard_normal((count, 1, 4, side, side)).astype(np.float32)
    return x * input_gains.reshape(1, 1, 4, 1, 1).astype(np.float32) if input_gains is not None else x


@dataclass
class Case:
    conv: Converted
    held_out: np.ndarray
    float_out: np.ndarray  # held-out outputs of the source model, concatenated

    def outputs(self, kind: str) -> np.ndarray:
        sess = self.conv.session(kind)
        return np.concatenate([sess.run(None, {"x": x})[0].ravel() for x in self.held_out])

    def error(self, kind: str) -> float:
        """Relative L2 error of the artefact's outputs against float."""
        return float(np.linalg.norm(self.outputs(kind) - self.float_out) / np.linalg.norm(self.float_out))

    def model(self, kind: str) -> onnx.ModelProto:
        return onnx.load(str(self.conv.paths[kind]))


def run_case(root: Path, fm: FloatModel, *, input_gains: np.ndarray | None = None,
             calibration_type: str = "max", march: str = "bayes-e", **options) -> Case:
    side = fm.inputs["x"][-1]
    project = make_project(root, fm, calibration_type=calibration_type, cal_count=CAL_SAMPLES, march=march)
    for k, sample in enumerate(samples(np.random.default_rng(100), CAL_SAMPLES, input_gains, side)):
        sample.tofile(project.root / "cal_x" / f"{k:03d}.bin")
    if options:
        project.write(calibration_parameters=options)
    conv = convert(project)
    held = samples(np.random.default_rng(7), HELD_OUT, input_gains, side)
    sess = ort.InferenceSession(fm.model.SerializeToString(), providers=["CPUExecutionProvider"])
    float_out = np.concatenate([sess.run(None, {"x": x})[0].ravel() for x in held])
    return Case(conv, held, float_out)


def assert_emulates(case: Case) -> None:
    """The calibrated model emulates the quantized one.

    Integer levels (``round(y / s) + z`` of each calibrated tensor against the quantized
    model's integers) agree except at near-ties, where float and integer arithmetic may
    round apart by one step; such a flip then propagates downstream (a sigmoid's table
    may turn it into two steps), so beyond the first tensor only its rarity is checked.
    The outputs differ far less than either differs from float.
    """
    cal_sess, q_sess = case.conv.session("calibrated"), case.conv.session("quantized")
    nodes = [n for n in cal_sess.model.graph.node
             if n.op_type == "HzCalibration" and attrs_of(n)["kind"] == "activation"]
    flipped_upstream = False
    results = [(all_tensors(cal_sess.model, {"x": x}), all_tensors(q_sess.model, {"x": x})) for x in case.held_out]
    for node in nodes:  # graph order
        a = attrs_of(node)
        tensor = node.name[: -len("_HzCalibration")]
        if f"{tensor}_quantized" not in results[0][1]:
            continue
        rank = results[0][0][node.output[0]].ndim
        shape = [-1 if k == a["axis"] else 1 for k in range(rank)] if a["axis"] >= 0 else []
        s = np.asarray(a["scales"], np.float32).reshape(shape)
        z = np.float32(a.get("zero_points", [0])[0])
        diff = np.concatenate([np.abs(np.round(cal[node.output[0]] / s) + z - quant[f"{tensor}_quantized"]).ravel()
                               for cal, quant in results])
        assert (diff > 0).mean() <= 0.01, f"{tensor}: {(diff > 0).sum()} of {diff.size} levels differ"
        if not flipped_upstream:
            assert diff.max() <= 1, f"{tensor}: calibrated and quantized levels differ by {diff.max()}"
        flipped_upstream |= bool(diff.any())
    cal, quant = case.outputs("calibrated"), case.outputs("quantized")
    assert np.linalg.norm(cal - quant) < 0.1 * np.linalg.norm(cal - case.float_out)


def assert_simulator_equals_quantized(case: Case) -> None:
    sim = Simulator(open_model(case.conv.paths["bin"]))
    quantized = case.conv.session("quantized")
    for x in case.held_out[:3]:
        ours = list(sim.run({"x": x}).values())
        theirs = quantized.run(None, {"x": x})
        for a, b in zip(ours, theirs, strict=True):
            np.testing.assert_array_equal(a, b)


GAINS = np.logspace(0, 2, 8)  # "act" channels from 1x to 100x


@pytest.fixture(scope="module")
def relu_cases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Case]:
    root = tmp_path_factory.mktemp("relu")
    fm = conv_act_conv("Relu", gains=GAINS)
    return {"plain": run_case(root / "plain", fm),
            "per_channel": run_case(root / "pc", fm, per_channel=True),
            "both": run_case(root / "both", fm, per_channel=True, optimization="asymmetric"),
            "no_gains": run_case(root / "no_gains", conv_act_conv("Relu"), per_channel=True),
            "bias_correction": run_case(root / "bc", fm, per_channel=True, optimization="bias_correction")}


def test_per_channel_gets_channels_of_different_ranges_right(relu_cases: dict[str, Case]) -> None:
    plain, pc = relu_cases["plain"], relu_cases["per_channel"]
    # Measured: calibrated 0.464 -> 0.042, quantized 0.464 -> 0.042 (per tensor, the small
    # channels of "act" fall below one step of the 100x channel).
    for kind in ("calibrated", "quantized"):
        assert pc.error(kind) < 0.25 * plain.error(kind), (kind, pc.error(kind), plain.error(kind))
    assert_emulates(pc)
    assert_simulator_equals_quantized(pc)
    assert not any("per_channel" in w or "not implemented" in w for w in warnings(pc.conv))


def test_per_channel_is_blind_to_gains_the_next_conv_undoes(relu_cases: dict[str, Case]) -> None:
    """Scaling a channel by g and the next conv's weights by 1/g changes nothing per channel (up to float)."""
    gained, plain = relu_cases["per_channel"], relu_cases["no_gains"]
    for kind in ("calibrated", "quantized"):
        a, b = gained.outputs(kind), plain.outputs(kind)
        assert np.linalg.norm(a - b) < 1e-5 * np.linalg.norm(b), kind  # measured 1.5e-7


def test_bias_correction_sees_the_folded_weights(relu_cases: dict[str, Case]) -> None:
    """The weight-rounding shift is measured on the weight the conv really uses (folded, then rounded)."""
    # Measured: 0.0421 without, 0.0420 with (0.147 when the shift was taken from the unfolded grid).
    assert relu_cases["bias_correction"].error("quantized") < 1.1 * relu_cases["per_channel"].error("quantized")


def test_per_channel_attributes(relu_cases: dict[str, Case]) -> None:
    cal = relu_cases["per_channel"].model("calibrated")
    acts = calibration_nodes(cal)
    act = acts["act_HzCalibration"]
    assert act["axis"] == 1 and len(act["thresholds"]) == 8 and "zero_points" not in act
    np.testing.assert_allclose(act["scales"], np.float32(np.array(act["thresholds"]) / 127), rtol=1e-6)
    assert act["thresholds"][-1] > 30 * act["thresholds"][0], "channel ranges follow the gains"
    weight = calibration_nodes(cal, "weight")["conv2_w_HzCalibration"]
    assert weight["input_scales"] == act["scales"] and weight["input_axis"] == 1 and weight["axis"] == 0
    assert calibration_nodes(cal)["x_HzCalibration"]["axis"] == 1, "the model input is read by a conv only"
    quantized = relu_cases["per_channel"].model("quantized")
    q = {n.name: attrs_of(n) for n in quantized.graph.node}
    assert q["x_HzQuantize"]["axis"] == -3 and len(q["x_HzQuantize"]["scales"]) == 4  # axis 1 of 4, from the end
    assert len(q["conv1"]["multiplier"]) == 8, "the producer requantizes per output channel"
    plain = calibration_nodes(relu_cases["plain"].model("calibrated"))
    assert all(a["axis"] == -1 and len(a["thresholds"]) == 1 and "zero_points" not in a for a in plain.values())
    assert all("input_scales" not in a for a in calibration_nodes(relu_cases["plain"].model("calibrated"),
                                                                    "weight").values())


def test_per_channel_with_asymmetric_non_negative_channels(relu_cases: dict[str, Case]) -> None:
    both = relu_cases["both"]
    act = calibration_nodes(both.model("calibrated"))["act_HzCalibration"]
    assert act["zero_points"] == [-128] * 8, "Relu output: every channel non-negative, one shared zero point"
    np.testing.assert_allclose(act["scales"], np.float32(np.array(act["thresholds"]) / 255), rtol=1e-6)
    conv2 = next(attrs_of(n) for n in both.model("quantized").graph.node if n.name == "conv2")
    assert conv2["x_zero_point"] == -128
    assert both.error("quantized") < 0.25 * relu_cases["plain"].error("quantized")
    assert_emulates(both)
    assert_simulator_equals_quantized(both)


def test_debugger_switches_per_channel_and_zero_point_nodes(relu_cases: dict[str, Case]) -> None:
    cm = load_calibrated(relu_cases["both"].conv.paths["calibrated"])
    switchboard = Switchboard(cm)
    sample = {"x": relu_cases["both"].held_out[0]}
    cache = switchboard.float_pass(sample)
    names = sorted(cm.calibration)
    calibrated = relu_cases["both"].model("calibrated")
    for enabled in (set(names), {"act_HzCalibration", "conv2_w_HzCalibration"}, {"x_HzCalibration"}):
        got = switchboard.run(sample, cache, enabled)
        want = HB_ONNXRuntime(onnx_model=without(calibrated, set(names) - enabled)).run(None, sample)
        np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5)


def test_per_channel_input_with_one_wide_channel(tmp_path: Path) -> None:
    gains = np.array([100.0, 1.0, 1.0, 1.0])
    fm = conv_act_conv("Relu", input_gains=gains)
    plain = run_case(tmp_path / "plain", fm, input_gains=gains)
    pc = run_case(tmp_path / "pc", fm, input_gains=gains, per_channel=True)
    # Measured: 0.707 -> 0.042 (calibrated and quantized alike).
    for kind in ("calibrated", "quantized"):
        assert pc.error(kind) < 0.15 * plain.error(kind), (kind, pc.error(kind), plain.error(kind))
    x_node = calibration_nodes(pc.model("calibrated"))["x_HzCalibration"]
    assert x_node["thresholds"][0] > 30 * max(x_node["thresholds"][1:])
    assert_emulates(pc)
    assert_simulator_equals_quantized(pc)


@pytest.fixture(scope="module")
def sigmoid_cases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Case]:
    root = tmp_path_factory.mktemp("sigmoid")
    fm = conv_act_conv("Sigmoid")
    return {"plain": run_case(root / "plain", fm), "asym": run_case(root / "asym", fm, optimization="asymmetric"),
            "default": run_case(root / "default", fm, calibration_type="default"),
            "default_asym": run_case(root / "default_asym", fm, calibration_type="default",
                                     optimization="asymmetric", per_channel=True)}


def _own_rounding_error(case: Case) -> float:
    """Relative error the "act" calibration node itself adds (its input vs its output)."""
    sess = case.conv.session("calibrated")
    diffs, values = [], []
    for x in case.held_out:
        t = all_tensors(sess.model, {"x": x})
        diffs.append(t["act_calibrated"] - t["act"])
        values.append(t["act"])
    return float(np.linalg.norm(np.concatenate(diffs)) / np.linalg.norm(np.concatenate(values)))


def test_asymmetric_sigmoid_output(sigmoid_cases: dict[str, Case]) -> None:
    plain, asym = sigmoid_cases["plain"], sigmoid_cases["asym"]
    # Measured: the node's own rounding 0.0049 -> 0.0021 (half the step), output 0.0144 -> 0.0132.
    assert _own_rounding_error(asym) < 0.6 * _own_rounding_error(plain)
    for kind in ("calibrated", "quantized"):
        assert asym.error(kind) < 0.95 * plain.error(kind), (kind, asym.error(kind), plain.error(kind))
    nodes = calibration_nodes(asym.model("calibrated"))
    act = nodes["act_HzCalibration"]
    assert act["zero_points"] == [-128] and act["axis"] == -1 and 0.9 < act["thresholds"][0] <= 1.0
    np.testing.assert_allclose(act["scales"], np.float32(act["thresholds"][0] / 255), rtol=1e-6)
    assert all("zero_points" in a for a in nodes.values()), "every int8 tensor here is read by zero-point ops"
    quantized = {n.name: n for n in asym.model("quantized").graph.node}
    assert attrs_of(quantized["conv2"])["x_zero_point"] == -128
    table = table_of(quantized["sigmoid"])
    assert table.min() >= -128 and table.max() == 127 and (table < -100).any(), "the LUT writes the whole range"
    assert_emulates(asym)
    assert_simulator_equals_quantized(asym)
    assert not any("asymmetric" in w for w in warnings(asym.conv))


def test_asymmetric_in_the_default_search(sigmoid_cases: dict[str, Case]) -> None:
    """default tries its methods with zero points fed to the search session; per_channel is ignored there."""
    plain, asym = sigmoid_cases["plain"], sigmoid_cases["default_asym"]
    # Measured: 0.0144 (max, symmetric) -> 0.0099. (default alone takes zero points here too: its int8 model
    # meets the int16 search's goal, ``test_default_search_with_int16_tries_zero_points_only_on_int8_models``.)
    assert asym.error("quantized") < 0.95 * plain.error("quantized")
    nodes = calibration_nodes(asym.model("calibrated"))
    assert nodes["act_HzCalibration"]["zero_points"] == [-128]
    assert all(a["axis"] == -1 for a in nodes.values())
    assert any("per_channel takes effect with calibration_type max or kl, not default" in w
               for w in warnings(asym.conv))
    assert any(line.startswith("INFO Select") for line in asym.conv.log)
    assert_emulates(asym)


def test_default_search_gives_int8_only_marches_zero_points_where_they_help(tmp_path: Path) -> None:
    """SPEC §7: default tries asymmetric variants and keeps them if they help. On a march without int16
    (RDK X3) every activation stays int8, and a Sigmoid's or Relu's output spends half a symmetric grid's
    levels on values it never takes."""
    fm = conv_act_conv("Sigmoid")
    x3 = run_case(tmp_path / "x3", fm, calibration_type="default", march="bernoulli2")
    x3_max = run_case(tmp_path / "x3_max", fm, march="bernoulli2")
    summary = next(line for line in x3.conv.log if "INFO calibration summary: method" in line)
    assert "zero points on" in summary, summary
    assert any("zero points on" in line and "(kept)" in line for line in x3.conv.log)
    assert calibration_nodes(x3.model("calibrated"))["act_HzCalibration"]["zero_points"] == [-128]
    # Measured: 0.0144 with max's symmetric grids, 0.0092 here (GPTQ included).
    assert x3.error("quantized") < 0.9 * x3_max.error("quantized")
    assert not any("zero_points" in a for a in calibration_nodes(x3_max.model("calibrated")).values()), \
        "max is one method, as asked: no variants"
    assert_emulates(x3)


def test_default_search_with_int16_tries_zero_points_only_on_int8_models(sigmoid_cases: dict[str, Case],
                                                                         tmp_path: Path) -> None:
    """With int16 to follow, the int16 search serves the sensitive tensors: no zero points unless asked (a Relu
    chain's int8 model scores 0.99985, below the search's goal). Where the int8 model already meets the goal the
    search gives no tensor int16, and zero points are tried as on a march without int16 (the Sigmoid chain's
    0.99992; hunt 45 D2)."""
    relu = run_case(tmp_path, conv_act_conv("Relu"), calibration_type="default")
    assert not any("zero_points" in a for a in calibration_nodes(relu.model("calibrated")).values())
    assert not any("zero points" in line for line in relu.conv.log)
    assert any("zero points on" in line for line in sigmoid_cases["default"].conv.log)


def test_lstm_batch_last_still_warns(tmp_path: Path) -> None:
    case = run_case(tmp_path, conv_act_conv("Relu"), optimization="lstm_batch_last")
    assert any("lstm_batch_last has no effect" in w for w in warnings(case.conv))


@pytest.mark.parametrize("march", ["bayes-e", "bernoulli2"])
def test_zero_point_models_run_as_their_quantized_model(tmp_path: Path, march: str) -> None:
    """The calibrated model, run as the tools run it (HB_ONNXRuntime, nothing kept), gives the quantized model's
    outputs. onnxruntime folded the float32 requantization of a conv accumulator (Conv -> Add(bias levels) ->
    Mul(multiplier)) into the conv's weights, which then were no longer whole numbers: with zero points a face
    detector's calibrated model on RDK X3 was off its quantized model by up to 0.37 (hunt 23)."""
    case = run_case(tmp_path, _conv_relu_chain(), march=march, optimization="asymmetric")
    assert any("zero_points" in a for a in calibration_nodes(case.model("calibrated")).values())
    np.testing.assert_array_equal(case.outputs("calibrated"), case.outputs("quantized"))


@pytest.mark.parametrize("march", ["bayes-e", "bernoulli2"])
def test_per_channel_models_run_as_their_quantized_model(tmp_path: Path, march: str) -> None:
    """With per-channel activation grids a conv's weight carries its input's steps, and the quantized conv
    requantizes its accumulator by the float64 rule; the calibrated model used the float32 rule of the integer
    kernels, and one level in about 100000 came out one off (hunt 27, RDK X3, up to 0.001 on a box output): 64x64
    maps give the near-ties enough chances."""
    case = run_case(tmp_path, _conv_relu_chain(side=64), march=march, per_channel=True)
    assert any(len(a["scales"]) > 1 and a["kind"] == "activation"
               for a in calibration_nodes(case.model("calibrated")).values())
    np.testing.assert_array_equal(case.outputs("calibrated"), case.outputs("quantized"))


def _conv_relu_chain(side: int = 8) -> FloatModel:
    """Three conv -> relu, each read by the next conv, then a conv to 4 channels, on ``side`` x ``side`` maps."""
    rng = np.random.default_rng(0)
    nodes: list = []
    inits: list = []
    x = "x"
    for k in range(3):
        nodes.append(helper.make_node("Relu", [_conv(nodes, inits, rng, x, 4 if k == 0 else 32, 32, f"conv{k}", None,
                                                     None)], [f"act{k}"], name=f"relu{k}"))
        x = f"act{k}"
    out = _conv(nodes, inits, rng, x, 32, 4, "conv_out", None, None)
    shape = [1, 4, side, side]
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return FloatModel(onnx.shape_inference.infer_shapes(model), {"x": shape}, {"x"})


def test_one_calibration_sample_is_judged_on_itself(tmp_path: Path) -> None:
    """With one sample, one cross-validation fold was fitted to no sample: every method scored alike there, and on
    RDK X3 zero points that brought the sample from 0.925 to 0.9996 were dropped for a meaningless 0.537."""
    fm = conv_act_conv("Sigmoid")
    project = make_project(tmp_path / "p", fm, calibration_type="default", cal_count=1, march="bernoulli2")
    for f in (project.root / "cal_x").iterdir():
        samples(np.random.default_rng(100), 1, None)[0].tofile(f)
    log = convert(project).log
    assert not any("not fitted to" in line for line in log), [line for line in log if "fitted" in line]
    decision = next(line for line in log if line.startswith("INFO zero points on"))
    before, after = map(float, decision.split("output cosine ")[1].split(" with")[0].split(" -> "))
    assert ("(kept)" in decision) == (after > before + zero_point_margin(before)), decision
