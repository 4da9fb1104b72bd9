"""1-D conv nets on RDK X3 (bernoulli2), whose BPU takes 4-D tensors only.

Every Conv1d of a TC-ResNet keyword spotter, and every Add and Relu between them, ran on the CPU in float there
('Conv on a 3-D tensor [1, 40, 98]: the BPU of bernoulli2 (RDK X3) takes 4-D tensors only'); a TCN ran with no
BPU subgraph at all, while the same nets written with Conv2d over [N, C, 1, T] ran on the BPU. A stereo net's
channel-mean correlation put each ReduceMean on the CPU (bernoulli2 has no BPU reduction) (hunt 24 D4), and a
channel sum written ``x.sum(1).unsqueeze(1)`` stayed a CPU ReduceSum and Unsqueeze (hunt 27 D6).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from builders import _Graph
from onnx import helper

from hbtools.march.profiles import get_profile
from hbtools.pipeline import optimize
from hbtools.quant.units import build_partition

LAYOUT = ("Unsqueeze", "Squeeze", "Flatten", "Reshape")


def _weight(g: _Graph, *shape: int) -> str:
    return g.const((g.rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32), "w")


def _conv(g: _Graph, x: str, cin: int, cout: int, k: int, **attrs) -> str:
    group = attrs.get("group", 1)
    bias = g.const((0.1 * g.rng.standard_normal(cout)).astype(np.float32), "b")
    return g.op("Conv", [x, _weight(g, cout, cin // group, k), bias], kernel_shape=[k], **attrs)


def _axes(g: _Graph, op: str, x: str, axes: list[int], opset: int, **attrs) -> str:
    """Unsqueeze / Squeeze / a reduction with ``axes`` as the opset writes them (an input from 13; 18 for most
    reductions)."""
    as_input = opset >= (18 if op.startswith("Reduce") and op != "ReduceSum" else 13)
    if as_input:
        return g.op(op, [x, g.const(np.array(axes, np.int64), "axes")], **attrs)
    return g.op(op, [x], axes=axes, **attrs)


def _keyword_spotter(opset: int):
    """A TC-ResNet-like classifier: strided Conv1d of kernel 9 (longer than X3 takes), a strided 1x1 shortcut,
    a dilated depthwise Conv1d, a per-channel Mul, BatchNorm, Concat of channels, Pad, a chomping Slice, the mean
    over time and a Linear head."""
    g = _Graph(3)
    r0 = g.op("Relu", [_conv(g, "feats", 8, 12, 3, pads=[1, 1])])
    c1 = _conv(g, r0, 12, 12, 9, strides=[2], pads=[4, 4])
    r1 = g.op("Relu", [c1])
    c2 = _conv(g, r1, 12, 12, 5, group=12, dilations=[2], pads=[4, 4])
    scaled = g.op("Mul", [c2, g.const(g.rng.uniform(0.5, 1.5, (12, 1)).astype(np.float32), "scale")])
    short = _conv(g, r0, 12, 12, 1, strides=[2])
    r2 = g.op("Relu", [g.bn(g.op("Add", [scaled, short]), 12)])
    joined = g.op("Concat", [r2, c1], axis=1)
    pads = [0, 0, 2, 0, 0, 0]
    padded = g.op("Pad", [joined], pads=pads) if opset < 11 else \
        g.op("Pad", [joined, g.const(np.array(pads, np.int64), "pads")])
    c3 = g.op("LeakyRelu", [_conv(g, padded, 24, 16, 3)], alpha=0.1)
    if opset < 10:
        chomped = g.op("Slice", [c3], starts=[0], ends=[-1], axes=[-1])
    else:
        chomped = g.op("Slice", [c3, *(g.const(np.array([v], np.int64), "slice") for v in (0, -1, -1))])
    pooled = _axes(g, "ReduceMean", chomped, [-1], opset, keepdims=0)
    return g.model({"feats": [1, 8, 50]}, [g.gemm(pooled, 16, 5)], opset=opset)


def _tcn(opset: int):
    """A causal TCN to a 3-D forecast: dilations up to 32 (beyond X3's 16), residual Adds, a ConvTranspose1d
    up and a strided Conv1d down, a linear Resize of the length, and a Conv2d over x.unsqueeze(2) in the middle,
    as exports mix them."""
    g = _Graph(5)
    x = _conv(g, "x", 4, 8, 1)
    for d in (1, 4, 32):
        h = g.op("Relu", [_conv(g, x, 8, 8, 3, dilations=[d], pads=[2 * d, 0])])
        x = g.op("Relu", [g.op("Add", [_conv(g, h, 8, 8, 3, dilations=[d], pads=[2 * d, 0]), x])])
    up = g.op("ConvTranspose", [x, _weight(g, 8, 8, 4)], kernel_shape=[4], strides=[2], pads=[1, 1])
    down = g.op("Sigmoid", [_conv(g, up, 8, 8, 3, strides=[2], pads=[1, 1])])
    if opset >= 11:  # F.interpolate(mode='linear') of the length, and back down
        scales = g.const(np.array([1, 1, 2], np.float32), "scales")
        longer = g.op("Resize", [down, g.const(np.zeros(0, np.float32), "roi"), scales], mode="linear")
        down = _conv(g, longer, 8, 8, 2, strides=[2])
    row = _axes(g, "Unsqueeze", down, [2], opset)
    wide = g.op("Conv", [row, g.const((g.rng.standard_normal((8, 8, 1, 3)) / 5).astype(np.float32), "w")],
                kernel_shape=[1, 3], pads=[0, 1, 0, 1])
    flat = _axes(g, "Squeeze", wide, [2], opset)
    return g.model({"x": [1, 4, 64]}, [_conv(g, g.op("Tanh", [flat]), 8, 1, 1)], opset=opset)


def _run(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)


def _placed(model: onnx.ModelProto, march: str) -> tuple[onnx.ModelProto, int, list[tuple[str, str]]]:
    """The optimized model, its count of BPU subgraphs and its CPU nodes (type, reason)."""
    profile = get_profile(march)
    optimized = optimize.run(model, profile)
    part = build_partition(optimized, profile, {})
    subgraphs = len({u.subgraph for u in part.units if u.on == "BPU"})
    return optimized, subgraphs, [(n.op_type, u.reason) for u in part.units if u.on == "CPU" for n in u.nodes]


@pytest.mark.parametrize("build", [_keyword_spotter, _tcn])
@pytest.mark.parametrize("opset", [9, 13, 18])
def test_a_1d_conv_net_is_one_bpu_subgraph_on_x3(build, opset: int) -> None:
    fm = build(opset)
    optimized, subgraphs, cpu = _placed(fm.model, "bernoulli2")
    assert subgraphs == 1, cpu
    assert all(kind in LAYOUT for kind, _ in cpu) and len(cpu) <= 2, cpu  # the input's Unsqueeze, the head's flatten
    name, shape = next(iter(fm.inputs.items()))
    feed = {name: np.random.default_rng(7).standard_normal(shape).astype(np.float32)}
    for got, want in zip(_run(optimized, feed), _run(fm.model, feed), strict=True):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("build", [_keyword_spotter, _tcn])
def test_marches_taking_3d_tensors_keep_the_1d_layers(build) -> None:
    fm = build(13)
    optimized, subgraphs, cpu = _placed(fm.model, "bayes-e")
    assert (subgraphs, cpu) == (1, [])

    def kernel_ranks(model: onnx.ModelProto) -> dict[str, int]:
        return {n.name: len(helper.get_attribute_value(next(a for a in n.attribute if a.name == "kernel_shape")))
                for n in model.graph.node if n.op_type in ("Conv", "ConvTranspose")}

    before, after = kernel_ranks(fm.model), kernel_ranks(optimized)
    assert {name: after.get(name) for name in before} == before


def _correlation(opset: int, channels: int = 8):
    """A stereo net's cost volume: the channel mean (and a channel sum) of the product of two feature maps."""
    g = _Graph(9)
    left = g.op("Relu", [g.conv("left", 3, channels)])
    right = g.op("Relu", [g.conv("right", 3, channels)])
    product = g.op("Mul", [left, right])
    mean = _axes(g, "ReduceMean", product, [1], opset, keepdims=1)
    total = _axes(g, "ReduceSum", product, [-3], opset, keepdims=1)
    volume = g.op("Concat", [mean, total], axis=1)
    return g.model({"left": [1, 3, 12, 16], "right": [1, 3, 12, 16]}, [g.conv(volume, 2, 4, k=1)], opset=opset)


@pytest.mark.parametrize("opset", [11, 13, 18])
def test_channel_means_run_on_the_bpu_of_x3_as_convs(opset: int) -> None:
    fm = _correlation(opset)
    optimized, subgraphs, cpu = _placed(fm.model, "bernoulli2")
    assert (subgraphs, cpu) == (1, [])
    rng = np.random.default_rng(3)
    feed = {n: rng.standard_normal(s).astype(np.float32) for n, s in fm.inputs.items()}
    np.testing.assert_allclose(_run(optimized, feed)[0], _run(fm.model, feed)[0], rtol=1e-5, atol=1e-5)
    # bayes-e reduces on the BPU: its reductions stay
    kinds = [n.op_type for n in _placed(fm.model, "bayes-e")[0].graph.node]
    assert kinds.count("ReduceMean") == 1 and kinds.count("ReduceSum") == 1


def test_a_channel_mean_wider_than_x3s_convs_stays_a_reduction() -> None:
    fm = _correlation(13, channels=2056)  # more input channels than the 2048 an X3 Conv takes
    optimized, _, cpu = _placed(fm.model, "bernoulli2")
    assert [n.op_type for n in optimized.graph.node].count("ReduceMean") == 1
    assert ("ReduceMean", "ReduceMean is not supported on the BPU of bernoulli2 (RDK X3)") in cpu


def _same_outputs(optimized: onnx.ModelProto, model: onnx.ModelProto) -> None:
    feed = {"x": np.random.default_rng(5).standard_normal((1, 3, 12, 16)).astype(np.float32)}
    for got, want in zip(_run(optimized, feed), _run(model, feed), strict=True):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _restored_sum(op: str, restore: str, opset: int):
    """``x.sum(1).unsqueeze(1)`` (or the mean; or a Reshape to [N, 1, H, W]) into a conv."""
    g = _Graph(9)
    x = g.op("Relu", [g.conv("x", 3, 8)])
    reduced = _axes(g, op, x, [1], opset, keepdims=0)
    if restore == "Unsqueeze":
        back = _axes(g, "Unsqueeze", reduced, [1], opset)
    else:
        back = g.op("Reshape", [reduced, g.const(np.array([1, 1, 12, 16], np.int64), "shape")])
    return g.model({"x": [1, 3, 12, 16]}, [g.conv(back, 1, 4)], opset=opset)


@pytest.mark.parametrize(("op", "restore", "opset"), [
    ("ReduceSum", "Unsqueeze", 11), ("ReduceSum", "Unsqueeze", 13), ("ReduceMean", "Unsqueeze", 18),
    ("ReduceMean", "Reshape", 13),
])
def test_a_channel_sum_without_keepdims_runs_on_the_bpu_of_x3(op: str, restore: str, opset: int) -> None:
    fm = _restored_sum(op, restore, opset)
    optimized, subgraphs, cpu = _placed(fm.model, "bernoulli2")
    assert (subgraphs, cpu) == (1, [])
    kinds = [n.op_type for n in optimized.graph.node]
    assert op not in kinds and restore not in kinds
    _same_outputs(optimized, fm.model)
    assert op in [n.op_type for n in _placed(fm.model, "bayes-e")[0].graph.node]  # bayes-e reduces on the BPU


def test_a_channel_sum_without_keepdims_read_otherwise_stays() -> None:
    """Read also as a 3-D graph output, the [N, H, W] sum is needed as it is."""
    g = _Graph(10)
    x = g.op("Relu", [g.conv("x", 3, 8)])
    reduced = _axes(g, "ReduceSum", x, [1], 13, keepdims=0)
    fm = g.model({"x": [1, 3, 12, 16]}, [g.conv(_axes(g, "Unsqueeze", reduced, [1], 13), 1, 4), reduced])
    optimized, _, _ = _placed(fm.model, "bernoulli2")
    assert "ReduceSum" in [n.op_type for n in optimized.graph.node]
    _same_outputs(optimized, fm.model)


def _converted_for_x3(tmp_path: Path, model: onnx.ModelProto, name: str, shape: tuple[int, ...]):
    """makertbin (max) on RDK X3 over 8 random samples: the quantized model's node types and its output's cosine
    against the float model on another sample (the .bin is checked against it in convert_featuremaps' run)."""
    from conformance import convert_featuremaps

    from hbtools.runtime import HB_ONNXRuntime

    rng = np.random.default_rng(0)
    samples = [rng.standard_normal(shape).astype(np.float32) for _ in range(8)]
    convert_featuremaps(tmp_path, model, {name: samples}, "x".join(map(str, shape)), "float32", "m",
                        calibration_type="max", march="bernoulli2")
    quantized = onnx.load(next((tmp_path / "out").glob("*_quantized_model.onnx")))
    x = rng.standard_normal(shape).astype(np.float32)
    want = _run(model, {name: x})[0]
    got = HB_ONNXRuntime(onnx_model=quantized).run(None, {name: x})[0]
    return [n.op_type for n in quantized.graph.node], float(np.dot(want.ravel(), got.ravel()) / np.linalg.norm(want)
                                                            / np.linalg.norm(got))


def test_a_1d_conv_net_converts_for_x3(tmp_path: Path) -> None:
    """makertbin on RDK X3: every Conv1d is a BPU convolution, the .bin matches the quantized model (checked in
    convert_featuremaps' run) and the output stays close to the float model's."""
    kinds, cos = _converted_for_x3(tmp_path, _keyword_spotter(13).model, "feats", (1, 8, 50))
    assert "Conv" not in kinds and kinds.count("HzSQuantizedConv") >= 5, sorted(set(kinds))
    assert cos >= 0.98, cos


def test_a_3d_graph_output_after_a_chain_is_squeezed_once() -> None:
    """A chain that is also read as a graph output mid-way keeps that output 3-D and the chain whole."""
    g = _Graph(11)
    hidden = g.op("Relu", [_conv(g, "x", 4, 6, 3, pads=[1, 1])])
    out = _conv(g, hidden, 6, 2, 3, pads=[1, 1])
    fm = g.model({"x": [1, 4, 20]}, [out, hidden])
    optimized, subgraphs, cpu = _placed(fm.model, "bernoulli2")
    assert subgraphs == 1 and sorted(kind for kind, _ in cpu) == ["Squeeze", "Squeeze", "Unsqueeze"], cpu
    shapes = {o.name: [d.dim_value for d in o.type.tensor_type.shape.dim] for o in optimized.graph.output}
    assert shapes == {out: [1, 2, 20], hidden: [1, 6, 20]}
    feed = {"x": np.random.default_rng(1).standard_normal((1, 4, 20)).astype(np.float32)}
    for got, want in zip(_run(optimized, feed), _run(fm.model, feed), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_node_info_keeps_a_cpu_conv1d_as_it_is() -> None:
    g = _Graph(2)
    first = _conv(g, "x", 4, 6, 3, pads=[1, 1])
    fm = g.model({"x": [1, 4, 20]}, [_conv(g, g.op("Relu", [first]), 6, 2, 3, pads=[1, 1])])
    name = fm.node("Conv", 0)
    optimized = optimize.run(fm.model, get_profile("bernoulli2"), placed={name: "CPU"})
    kept = next(n for n in optimized.graph.node if n.name == name)
    assert next(a for a in kept.attribute if a.name == "kernel_shape").ints == [3]
    assert helper.get_attribute_value(next(a for a in kept.attribute if a.name == "pads")) == [1, 1]


@pytest.mark.parametrize("opset", [11, 13])
def test_a_squeezed_pool_of_a_row_feeds_the_head_on_the_bpu_of_x3(opset: int) -> None:
    """``linear(adaptive_avg_pool1d(y, 1).squeeze(-1))``: the pool's Squeeze of the row and the squeeze(-1) after
    it kept the pool and the head on the CPU (hunt 27 D5); one Squeeze of the row lets the head read the pool."""
    g = _Graph(6)
    y = g.op("Relu", [_conv(g, "x", 6, 12, 3, pads=[1, 1])])
    pooled = _axes(g, "Squeeze", g.op("GlobalAveragePool", [y]), [-1], opset)
    fm = g.model({"x": [1, 6, 20]}, [g.gemm(pooled, 12, 4)], opset=opset)
    optimized, subgraphs, cpu = _placed(fm.model, "bernoulli2")
    assert subgraphs == 1 and all(kind in LAYOUT for kind, _ in cpu) and len(cpu) <= 2, cpu
    feed = {"x": np.random.default_rng(2).standard_normal((1, 6, 20)).astype(np.float32)}
    np.testing.assert_allclose(_run(optimized, feed)[0], _run(fm.model, feed)[0], rtol=1e-5, atol=1e-5)


def _keras_conv1d(opset: int, through_transpose: bool):
    """Keras' Conv1D as tf2onnx / jax2tf write it: a Conv2d of kernel [5, 1] over the column [N, C, L, 1] (an
    Unsqueeze of the last axis; in magika a Transpose of [N, L, C, 1] first), a Squeeze of the column, then a
    tanh-GELU and the max over the length before a Dense (hunt 42 D2: the Squeeze put the GELU and the max on
    the CPU of RDK X3 in float, and split the BPU graph)."""
    g = _Graph(8)
    if through_transpose:
        column = g.op("Transpose", [_axes(g, "Unsqueeze", "x", [3], opset)], perm=[0, 2, 1, 3])
        shape = [1, 40, 16]
    else:
        column = _axes(g, "Unsqueeze", "x", [-1], opset)
        shape = [1, 16, 40]
    conv = g.op("Conv", [column, g.const((g.rng.standard_normal((24, 16, 5, 1)) / 9).astype(np.float32), "w"),
                         g.const((0.1 * g.rng.standard_normal(24)).astype(np.float32), "b")],
                kernel_shape=[5, 1], pads=[2, 0, 2, 0])
    y = _axes(g, "Squeeze", conv, [-1], opset)
    cube = g.op("Mul", [g.op("Mul", [y, y]), y])
    inner = g.op("Mul", [g.op("Add", [y, g.op("Mul", [cube, g.const(np.array(0.044715, np.float32), "c")])]),
                         g.const(np.array(0.7978846, np.float32), "c")])
    gelu = g.op("Mul", [g.op("Mul", [y, g.const(np.array(0.5, np.float32), "c")]),
                        g.op("Add", [g.op("Tanh", [inner]), g.const(np.array(1.0, np.float32), "c")])])
    pooled = _axes(g, "ReduceMax", gelu, [2], opset, keepdims=0)
    return g.model({"x": shape}, [g.gemm(pooled, 24, 6)], opset=opset)


@pytest.mark.parametrize("through_transpose", [False, True], ids=["unsqueezed", "transposed"])
@pytest.mark.parametrize("opset", [11, 13])
def test_a_keras_conv1d_over_a_column_keeps_its_layers_on_the_bpu_of_x3(opset: int, through_transpose: bool) -> None:
    fm = _keras_conv1d(opset, through_transpose)
    optimized, subgraphs, cpu = _placed(fm.model, "bernoulli2")
    assert subgraphs == 1, cpu
    assert all(kind in (*LAYOUT, "Transpose") for kind, _ in cpu), cpu  # the input's view and the head's flatten
    name, shape = next(iter(fm.inputs.items()))
    feed = {name: np.random.default_rng(7).standard_normal(shape).astype(np.float32)}
    for got, want in zip(_run(optimized, feed), _run(fm.model, feed), strict=True):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _long_row_conv(k: int, *, stride: int = 1, dilation: int = 1, pads: tuple[int, int] = (0, 0), group: int = 1,
                   length: int = 64):
    """A Conv1d of kernel ``k`` (a DS-CNN's depthwise k9, an ECG ResNet's k15), with a Relu after it."""
    g = _Graph(k + stride + dilation)
    c = 8
    first = g.op("Relu", [_conv(g, "x", c, c, 3, pads=[1, 1])])  # the long conv reads a BPU tensor, as in a net
    y = g.op("Conv", [first, _weight(g, c, c // group, k),
                      g.const((0.1 * g.rng.standard_normal(c)).astype(np.float32), "b")],
             kernel_shape=[k], strides=[stride], dilations=[dilation], pads=list(pads), group=group)
    return g.model({"x": [1, c, length]}, [g.op("Relu", [y])], opset=13)


@pytest.mark.parametrize("k, stride, dilation, pads, group", [
    (9, 1, 1, (4, 4), 8),    # a keyword spotter's depthwise k9, 'same' padding
    (15, 2, 1, (7, 7), 1),   # an ECG ResNet's strided k15
    (16, 1, 2, (15, 15), 1),  # even kernel, dilated
    (11, 3, 1, (0, 5), 2),   # grouped, padding at the end only
    (8, 4, 1, (0, 0), 1),    # no padding, the last copy reading past the signal
])
def test_a_long_1d_kernel_on_x3_is_one_conv_over_stacked_rows(k, stride, dilation, pads, group) -> None:
    """On RDK X3 (7 taps) a Conv1d of a longer kernel was a sum of Convs over kernel pieces, each partial sum
    rounded to the int8 grid on its own and the Relu after the sum a table: a k9 keyword spotter and a k15 ECG
    net trailed onnxruntime's int8 peer held out, where their k7 twins led it (hunt 42 D1). Over copies of the
    row stacked along the row axis it is one Conv, one accumulator, the Relu fused; the same values."""
    fm = _long_row_conv(k, stride=stride, dilation=dilation, pads=pads, group=group)
    optimized, subgraphs, cpu = _placed(fm.model, "bernoulli2")
    assert subgraphs == 1 and all(kind in LAYOUT for kind, _ in cpu), cpu
    convs = [n for n in optimized.graph.node if n.op_type == "Conv"]
    assert len(convs) == 2 and not [n for n in optimized.graph.node if n.op_type in ("Add", "Sum")]
    kernel = next(helper.get_attribute_value(a) for a in convs[1].attribute if a.name == "kernel_shape")
    assert max(kernel) <= get_profile("bernoulli2").rule("Conv").kernel and kernel[0] > 1, kernel
    feed = {"x": np.random.default_rng(7).standard_normal([1, 8, 64]).astype(np.float32)}
    for got, want in zip(_run(optimized, feed), _run(fm.model, feed), strict=True):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_long_1d_kernel_on_x3_converts_close_to_float(tmp_path: Path) -> None:
    """makertbin on RDK X3: the k15 Conv1d and its Relu are one BPU convolution (no Eltwise sum of pieces, no Relu
    table), the quantized model close to float."""
    kinds, cos = _converted_for_x3(tmp_path, _long_row_conv(15, pads=(7, 7)).model, "x", (1, 8, 64))
    assert kinds.count("HzSQuantizedConv") == 2 and "HzSQuantizedEltwise" not in kinds and "HzLut" not in kinds, kinds
    assert cos >= 0.99, cos


def test_a_column_conv_read_from_the_bpu_keeps_its_column() -> None:
    """A column Conv whose input a model input or a BPU op makes (not an Unsqueeze, nor a layout op the CPU runs
    anyway) got a CPU Reshape to the row in front: the BPU part split in two (hunt 44 D6). It stays a column."""
    g = _Graph(9)
    first = g.op("Relu", [g.op("Conv", ["x", g.const((g.rng.standard_normal((16, 16, 3, 1)) / 7).astype(np.float32),
                                                        "w")], kernel_shape=[3, 1], pads=[1, 0, 1, 0])])
    conv = g.op("Conv", [first, g.const((g.rng.standard_normal((16, 16, 5, 1)) / 9).astype(np.float32), "w")],
                kernel_shape=[5, 1], pads=[2, 0, 2, 0])
    y = g.op("Relu", [_axes(g, "Squeeze", conv, [3], 13)])
    fm = g.model({"x": [1, 16, 40, 1]}, [_axes(g, "ReduceMax", y, [2], 13, keepdims=0)], opset=13)
    optimized, subgraphs, cpu = _placed(fm.model, "bernoulli2")
    assert subgraphs == 1 and "Reshape" not in [kind for kind, _ in cpu], cpu
    feed = {"x": np.random.default_rng(5).standard_normal((1, 16, 40, 1)).astype(np.float32)}
    np.testing.assert_allclose(_run(optimized, feed)[0], _run(fm.model, feed)[0], rtol=1e-5, atol=1e-5)
