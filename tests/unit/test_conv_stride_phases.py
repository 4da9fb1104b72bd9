"""1-D Convs with a stride larger than the BPU takes run on the BPU as stride-1 Convs over the stride's phases.
So do 2-D Convs over a single row or column, as tf2onnx writes Keras' Conv1D (Spotify's basic-pitch: its
constant-Q transform is ten Convs of kernel [1, 256] with strides up to 256 over [N, 1, 1, L]).

Found on openwakeword's melspectrogram (PyPI): its STFT is two Conv1d of kernel 512 and stride 160 over the
raw samples, and both ran on the CPU ('Conv kernel [512] exceeds 15 and stride [160] exceeds 8'): the kernel
pieces keep the stride, so they did not apply.
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


def _conv1d(shape: list[int], cout: int, kernel: int, stride: int, pads: list[int], bias: bool, row: int = 0):
    """A 1-D Conv over ``shape`` [N, C, L]; with ``row`` 2 or 3, the same as a 2-D Conv over [N, C, 1, L] (``row``
    2) or [N, C, L, 1] (3), one tap, stride 1 and no padding across the single row or column."""
    rng = np.random.default_rng(kernel + stride)
    w = rng.standard_normal((cout, shape[1], kernel)).astype(np.float32)
    attrs = {"kernel_shape": [kernel], "strides": [stride], "pads": pads}
    if row:
        shape = [*shape[:2], 1, shape[2]] if row == 2 else [*shape, 1]
        w = w[:, :, None, :] if row == 2 else w[:, :, :, None]
        signal = [(kernel, stride, pads[0], pads[1]), (1, 1, 0, 0)]
        k, st, first, last = zip(*(signal[::-1] if row == 2 else signal), strict=True)
        attrs = {"kernel_shape": list(k), "strides": list(st), "pads": [*first, *last]}
    inits = [numpy_helper.from_array(w, "w")]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(cout).astype(np.float32), "b"))
    node = helper.make_node("Conv", ["x", "w", *(["b"] if bias else [])], ["y"], name="conv", **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def _run(model, x: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


@pytest.mark.parametrize("shape, cout, kernel, stride, pads, bias", [
    ([1, 1, 1112], 9, 112, 40, [0, 0], False),   # an STFT: frames end exactly at the last sample
    ([1, 1, 1130], 9, 112, 40, [0, 0], True),    # samples after the last frame are never read
    ([1, 2, 300], 5, 25, 10, [7, 3], True),      # two channels, a kernel not a multiple of the stride, pads
    ([1, 3, 200], 4, 12, 12, [0, 0], False),     # kernel = stride: one tap over the phases
    ([1, 1, 1000], 4, 400, 20, [0, 0], False),   # 20 taps over the phases, more than 15: then kernel pieces
])
@pytest.mark.parametrize("row", [0, 2, 3], ids=["1d", "2d_one_row", "2d_one_column"])
def test_strided_convs_over_phases_give_the_same_values(shape, cout, kernel, stride, pads, bias, row) -> None:
    model = _conv1d(shape, cout, kernel, stride, pads, bias, row)
    shape = model.graph.input[0].type.tensor_type.shape
    shape = [d.dim_value for d in shape.dim]
    rule = get_profile("bayes-e").rule("Conv")
    optimized = optimize.run(model, get_profile("bayes-e"))
    convs = [n for n in optimized.graph.node if n.op_type == "Conv"]
    assert convs
    for node in convs:
        a = {x.name: helper.get_attribute_value(x) for x in node.attribute}
        assert max(a.get("strides", [1])) <= rule.stride and max(a["kernel_shape"]) <= rule.kernel, a
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    ref = _run(model, x)
    np.testing.assert_allclose(_run(optimized, x), ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


def test_a_keras_conv1d_over_one_row_runs_on_the_bpu(tmp_path: Path) -> None:
    """tf2onnx's Conv1D (kernel [1, 256], stride [1, 128] over [N, 1, 1, L]) and a Relu: no CPU node (it was
    'kernel exceeds 15 and stride exceeds 8'), the quantized model close to float."""
    g = _Graph(5)
    w = g.const((g.rng.standard_normal((16, 1, 1, 256)) * 0.05).astype(np.float32))
    y = g.op("Relu", [g.op("Conv", ["signal", w], kernel_shape=[1, 256], strides=[1, 128])])
    fm = g.model({"signal": [1, 1, 1, 4096]}, [y], featuremap={"signal"})
    outcome = convert_and_check(fm, tmp_path, calibration_type="max")
    assert not outcome.cpu, outcome.placement()
    assert min(outcome.cosine) >= 0.99, outcome.cosine


@pytest.mark.parametrize("kernel, stride, phases", [(512, 4, True), (512, 1, False), (64, 4, False)])
def test_a_kernel_too_long_for_pieces_runs_over_the_phases_within_the_stride_limit(kernel, stride, phases) -> None:
    """CREPE's first layer on RDK X3: kernel [512, 1], stride [4, 1] (X3 takes 7 taps and stride 4) stayed on the
    CPU, 'kernel exceeds 7': 74 pieces of 7 are more than the pieces go to, and the phases were only for strides
    beyond the limit. Over the stride's 4 phases it is 128 taps, 19 pieces, with the same values. A stride of 1
    has no phases, and a kernel that pieces take alone stays in pieces."""
    model = _conv1d([1, 1, 1024], 8, kernel, stride, [0, 0], True, row=3)
    profile = get_profile("bernoulli2")
    optimized = optimize.run(model, profile)
    ops = [n.op_type for n in optimized.graph.node]
    assert ("Transpose" in ops) == phases, ops
    convs = [n for n in optimized.graph.node if n.op_type == "Conv"]
    rule = profile.rule("Conv")
    kernels = [helper.get_attribute_value(a) for n in convs for a in n.attribute if a.name == "kernel_shape"]
    fits = all(max(k) <= rule.kernel for k in kernels)
    assert fits == (kernel * stride != 512), kernels  # 512 taps at stride 1 stay one Conv: the CPU's
    x = np.random.default_rng(1).standard_normal([1, 1, 1024, 1]).astype(np.float32)
    ref = _run(model, x)
    np.testing.assert_allclose(_run(optimized, x), ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


def test_a_conv_over_rows_of_more_than_one_pixel_is_left_as_it_is() -> None:
    """Only a single row or column is a 1-D signal: a [1, 256] kernel over two rows keeps its Conv."""
    model = _conv1d([1, 1, 2048], 4, 256, 128, [0, 0], False, row=2)
    model.graph.input[0].type.tensor_type.shape.dim[2].dim_value = 2
    optimized = optimize.run(model, get_profile("bayes-e"))
    assert not [n for n in optimized.graph.node if n.op_type == "Transpose"]


def test_an_stft_as_a_conv_runs_on_the_bpu(tmp_path: Path) -> None:
    """Real and imaginary Conv1d (kernel 112, stride 40) over samples, their power and a mel matrix: one BPU
    subgraph, no CPU node, the quantized model close to float."""
    g = _Graph(4)
    n = np.arange(112)
    k = np.arange(1, 17)[:, None]
    window = np.hanning(112)
    re = g.const((np.cos(2 * np.pi * k * n / 112) * window)[:, None, :].astype(np.float32))
    im = g.const((np.sin(2 * np.pi * k * n / 112) * window)[:, None, :].astype(np.float32))
    x = g.op("Unsqueeze", ["audio", g.const(np.array([1], np.int64))])
    power = g.op("Add", [g.op("Mul", [r, r]) for r in [g.op("Conv", [x, re], kernel_shape=[112], strides=[40])]]
                 + [g.op("Mul", [i, i]) for i in [g.op("Conv", [x, im], kernel_shape=[112], strides=[40])]])
    mel = g.const(np.abs(g.rng.standard_normal((16, 8))).astype(np.float32) / 8)
    y = g.op("MatMul", [g.op("Transpose", [power], perm=[0, 2, 1]), mel])
    fm = g.model({"audio": [1, 1112]}, [y], featuremap={"audio"})
    outcome = convert_and_check(fm, tmp_path, calibration_type="max")
    assert not outcome.cpu, outcome.placement()
    assert min(outcome.cosine) >= 0.99, outcome.cosine


def test_convs_reading_the_same_samples_share_one_phase_chain() -> None:
    """An STFT's real and imaginary convs read the same frames: one pad / reshape / transpose chain feeds both."""
    rng = np.random.default_rng(2)
    inits = [numpy_helper.from_array(rng.standard_normal((6, 1, 112)).astype(np.float32), w) for w in ("re", "im")]
    nodes = [helper.make_node("Conv", ["x", w], [f"y_{w}"], name=f"conv_{w}", kernel_shape=[112], strides=[40],
                              pads=[8, 8]) for w in ("re", "im")]
    # a product: a sum of the two would be one conv of the summed kernels (RepVGG-style branch merging)
    nodes.append(helper.make_node("Mul", ["y_re", "y_im"], ["y"], name="mul"))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 1130])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    optimized = optimize.run(model, get_profile("bayes-e"))
    assert [n.op_type for n in optimized.graph.node].count("Transpose") == 1
    assert [n.op_type for n in optimized.graph.node].count("Conv") == 2
    x = np.random.default_rng(3).standard_normal([1, 1, 1130]).astype(np.float32)
    ref = _run(model, x)
    np.testing.assert_allclose(_run(optimized, x), ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
