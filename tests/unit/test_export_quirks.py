"""Graphs written the way exporters and users write them, found to stop or go wrong in a survey of
small models (tf2onnx, PyTorch and hand-edited exports): each converts, and its quantized model
computes what the float model computes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from builders import _Graph
from conformance import convert_and_check
from onnx import TensorProto, helper, numpy_helper

from hbtools.ops.base import attrs_of
from hbtools.runtime.rt_input import random_rt_input
from hbtools.runtime.runtime_model import open_model
from hbtools.runtime.simulator import Simulator

COSINE = 0.99


def _i64(values: list[int]) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def test_an_image_input_the_graph_takes_only_the_size_of_converts(tmp_path: Path) -> None:
    """A second image input read only by Shape (resize to the original picture's size), and a third
    nothing reads: their preprocessing has no reader, and the report compares the units anyway."""
    g = _Graph(2)
    logits = g.conv(g.op("Relu", [g.conv("data", 3, 8, stride=2)]), 8, 4, k=1)
    size = g.op("Slice", [g.op("Shape", ["ref"]), g.const(_i64([2]), "a"), g.const(_i64([4]), "b")])
    sizes = g.op("Concat", [g.const(_i64([1, 4]), "nc"), size], axis=0)
    out = g.op("Resize", [logits, "", "", sizes], mode="nearest")
    fm = g.model({"data": [1, 3, 16, 16], "ref": [1, 3, 32, 32], "unused": [1, 3, 16, 16]}, [out])
    outcome = convert_and_check(fm, tmp_path, "max", checker=False)
    assert min(outcome.cosine) > COSINE


def test_a_model_tensor_named_like_the_preprocessed_input_converts(tmp_path: Path) -> None:
    """The parse stage's own names (``<input>_hz_preprocessed``) may already be taken, e.g. by an
    artefact whose preprocessing was cut out by hand and converted again."""
    g = _Graph(1)
    g.conv("data", 3, 8)
    g.nodes[-1].output[0] = "data_hz_preprocessed"
    out = g.conv(g.op("Relu", ["data_hz_preprocessed"]), 8, 4, k=1)
    outcome = convert_and_check(g.model({"data": [1, 3, 16, 16]}, [out]), tmp_path, "max", checker=False)
    assert min(outcome.cosine) > COSINE


@pytest.mark.parametrize("added", [False, True])
def test_a_conv_transpose_with_an_output_shape_keeps_it(added: bool, tmp_path: Path) -> None:
    """tf2onnx writes Keras' Conv2DTranspose with ``output_shape`` (here 64 where the pads alone give 65);
    the quantized op reads pads, so the optimize stage writes the output shape as the pads it stands for.
    Without that the quantized output was 65 x 65 (``convert_and_check`` compares the shapes), and an Add
    with a 64 x 64 branch stopped the conversion."""
    g = _Graph(5)
    a = g.op("Relu", [g.conv("data", 3, 16, stride=2)])
    wt = (g.rng.standard_normal((16, 16, 3, 3)) / 12).astype(np.float32)
    up = g.op("ConvTranspose", [a, g.const(wt, "wt")], kernel_shape=[3, 3], strides=[2, 2], output_shape=[64, 64])
    out = g.conv(g.op("Add", [up, g.conv("data", 3, 16, k=1)]) if added else up, 16, 8, k=1)
    outcome = convert_and_check(g.model({"data": [1, 3, 64, 64]}, [out]), tmp_path, "max", checker=False)
    assert min(outcome.cosine) > COSINE


@pytest.mark.parametrize("size", [66])
def test_a_conv_transpose_with_an_output_shape_beyond_its_natural_output_gives_that_shape(size: int,
                                                                                        tmp_path: Path) -> None:
    """``output_shape`` may ask for more than the natural 65 x 65 (ONNX's test_convtranspose_output_shape):
    ONNX adds the rows and columns at the end, as output_padding does. The quantized model and the .bin
    gave the natural 65 x 65 silently (the verifier passed: both were wrong alike)."""
    g = _Graph(5)
    a = g.op("Relu", [g.conv("data", 3, 16, stride=2)])
    wt = (g.rng.standard_normal((16, 8, 3, 3)) / 12).astype(np.float32)
    out = g.op("ConvTranspose", [a, g.const(wt, "wt")], kernel_shape=[3, 3], strides=[2, 2],
               output_shape=[size, size])
    fm = g.model({"data": [1, 3, 64, 64]}, [out])
    outcome = convert_and_check(fm, tmp_path, "max", checker=False)
    assert min(outcome.cosine) > COSINE
    sim = Simulator(open_model(outcome.project.artefact("bin")))
    feeds = {d.name: random_rt_input(d, np.random.default_rng(0)) for d in sim.model.inputs}
    assert [list(v.shape) for v in sim.run(feeds).values()] == [[1, 8, size, size]]


def test_a_gemm_with_a_bias_per_row_and_column_stays_on_the_cpu_with_its_reason(tmp_path: Path) -> None:
    """Gemm's C may be a whole [M, N] matrix (ONNX's test_gemm_default_matrix_bias, a broadcast-materialised
    addmm bias); the BPU adds one bias per output column, and the conversion ended in "internal error"
    (the M * N values given as N per-column biases). The Gemm after it, with a per-column bias, stays on
    the BPU."""
    g = _Graph(3)
    b = (g.rng.standard_normal((6, 4)) / 3).astype(np.float32)
    c = (0.5 * g.rng.standard_normal((3, 4))).astype(np.float32)
    rows = g.op("Gemm", ["x", g.const(b, "b"), g.const(c, "c")])
    out = g.gemm(g.op("Relu", [rows]), 4, 4)
    outcome = convert_and_check(g.model({"x": [3, 6]}, [out], featuremap={"x"}), tmp_path, "max")
    assert min(outcome.cosine) > COSINE
    reasons = {c["name"]: c["reason"] for c in outcome.cpu}
    assert "Gemm_0" in reasons and "[3, 4]" in reasons["Gemm_0"] and "row to row" in reasons["Gemm_0"], reasons
    assert "Gemm_1" in outcome.bpu_nodes


def _input_bits(calibrated: onnx.ModelProto, op_types: tuple[str, ...]) -> list[tuple[str, int | None]]:
    """Per node of ``op_types``, the bits of the grid its input has (through data movement back to the
    HzCalibration that makes it)."""
    producer = {o: n for n in calibrated.graph.node for o in n.output}
    bits = {n.output[0]: attrs_of(n)["bits"] for n in calibrated.graph.node
            if n.op_type == "HzCalibration" and attrs_of(n)["kind"] == "activation"}
    found = []
    for node in calibrated.graph.node:
        if node.op_type in op_types:
            t = node.input[0]
            while t not in bits and t in producer:
                t = producer[t].input[0]
            found.append((node.op_type, bits.get(t)))
    return found


def test_a_layer_norm_or_softmax_behind_a_transpose_or_reshape_reads_int16(tmp_path: Path) -> None:
    """The integer LayerNorm and Softmax read int16 (``HzOp.int16_input``); PyTorch puts a permute or a
    view in front of nearly every one (ConvNeXt, ViT, YOLOv8's DFL). The request reaches the grid the
    data movement hands on, which it used to miss (the tensors stayed int8, silently)."""
    g = _Graph(3)
    x = g.conv("data", 3, 16)
    gamma, beta = (g.const(g.rng.uniform(0.5, 1.5, 16).astype(np.float32), "ln") for _ in range(2))
    normed = g.op("LayerNormalization", [g.op("Transpose", [x], perm=[0, 2, 3, 1]), gamma, beta], axis=-1)
    a = g.conv(g.op("Transpose", [normed], perm=[0, 3, 1, 2]), 16, 8, k=1)
    bins = g.op("Reshape", [g.conv("data", 3, 64, k=1), g.const(_i64([1, 4, 16, -1]), "shape")])
    b = g.op("Softmax", [g.op("Transpose", [bins], perm=[0, 2, 1, 3])], axis=1)
    fm = g.model({"data": [1, 3, 8, 8]}, [a, b], opset=17)
    outcome = convert_and_check(fm, tmp_path, "max", checker=False)
    calibrated = onnx.load(str(outcome.project.artefact("calibrated")))
    assert _input_bits(calibrated, ("HzLayerNorm", "HzSoftmax")) == [("HzLayerNorm", 16), ("HzSoftmax", 16)]
    assert min(outcome.cosine) > COSINE


def test_a_zero_pad_of_listed_axes_becomes_the_convs_padding(tmp_path: Path) -> None:
    """Opset 18 lets a Pad name its axes (PyTorch's F.pad exports them): a zero Pad of the spatial axes
    before a Conv is the Conv's own padding, as the Pad without axes is; it used to run on the CPU."""
    g = _Graph(4)
    x = g.op("Relu", [g.conv("data", 3, 8)])
    padded = g.op("Pad", [x, g.const(_i64([1, 2, 1, 2]), "pads"), g.const(np.array(0.0, np.float32), "zero"),
                          g.const(_i64([2, 3]), "axes")])
    w = (g.rng.standard_normal((8, 8, 3, 3)) / 8).astype(np.float32)
    out = g.op("Conv", [padded, g.const(w, "w")], kernel_shape=[3, 3])
    outcome = convert_and_check(g.model({"data": [1, 3, 16, 16]}, [out], opset=19), tmp_path, "max", checker=False)
    assert not outcome.cpu, outcome.placement()
    assert min(outcome.cosine) > COSINE


def test_a_division_by_a_sum_that_is_often_zero_keeps_its_quotient(tmp_path: Path) -> None:
    """ReLU'd features over their sum plus eps (EfficientViT's linear attention normalizes so): where every
    feature is 0 the reciprocal is 1 / eps and the quotient 0. Its grid counts only where the numerator is
    not 0; fitted to 1 / eps, every other reciprocal rounded to 0 and the output was all zeros (cosine 0.66)."""
    g = _Graph(6)
    w = (g.rng.standard_normal((8, 3, 3, 3)) / 5).astype(np.float32)
    conv = g.op("Conv", ["data", g.const(w, "w"), g.const(np.full(8, -0.6, np.float32), "b")], kernel_shape=[3, 3],
                pads=[1, 1, 1, 1])
    features = g.op("Relu", [conv])
    total = g.op("ReduceSum", [features, g.const(_i64([1]), "axes")], keepdims=1)
    quotient = g.op("Div", [features, g.op("Add", [total, g.const(np.array(1e-6, np.float32), "eps")])])
    out = g.conv(quotient, 8, 8, k=1)
    outcome = convert_and_check(g.model({"data": [1, 3, 16, 16]}, [out]), tmp_path, "max", checker=False)
    assert min(outcome.cosine) > COSINE


@pytest.mark.parametrize("opset", [13, 18])
def test_an_l2_normalized_embedding_runs_on_the_bpu(opset: int, tmp_path: Path) -> None:
    """``F.normalize(y, dim=-1)`` exports as ReduceL2 -> Clip(eps) -> Expand -> Div: ReduceL2 is written as
    the square root of a sum of squares, which the BPU has; it used to put the head on the CPU."""
    g = _Graph(8)
    pooled = g.op("Flatten", [g.op("GlobalAveragePool", [g.conv("data", 3, 16, stride=2)])], axis=1)
    w = (g.rng.standard_normal((32, 16)) / 4).astype(np.float32)
    y = g.op("Gemm", [pooled, g.const(w, "fc"), g.const(np.zeros(32, np.float32), "fcb")], transB=1)
    norm = g.op("ReduceL2", [y, g.const(_i64([1]), "axes")], keepdims=1) if opset >= 18 else \
        g.op("ReduceL2", [y], axes=[1], keepdims=1)
    clipped = g.op("Clip", [norm, g.const(np.array(1e-12, np.float32), "eps")])
    out = g.op("Div", [y, g.op("Expand", [clipped, g.const(_i64([1, 32]), "shape")])])
    outcome = convert_and_check(g.model({"data": [1, 3, 16, 16]}, [out], opset=opset), tmp_path, "max", checker=False)
    assert not outcome.cpu, outcome.placement()
    assert min(outcome.cosine) > COSINE


def test_a_normalization_with_one_scale_and_bias_runs_on_the_bpu(tmp_path: Path) -> None:
    """GroupNorm(1, C) (PoolFormer) and a one-channel InstanceNorm normalize with one scale and one bias:
    single-element constants, which make an element-wise op a lookup table, but a normalization has no
    table form; it used to go to the CPU for that."""
    g = _Graph(9)
    one = g.conv("data", 3, 1)
    normed = g.op("InstanceNormalization", [one, g.const(np.array([1.3], np.float32), "s"),
                                            g.const(np.array([0.2], np.float32), "b")])
    out = g.conv(g.op("Relu", [normed]), 1, 4, k=1)
    outcome = convert_and_check(g.model({"data": [1, 3, 16, 16]}, [out]), tmp_path, "max", checker=False)
    assert not outcome.cpu, outcome.placement()
    assert min(outcome.cosine) > COSINE


@pytest.mark.parametrize("form", ["query_first", "query_batched_second"])
def test_learned_queries_attend_on_the_bpu(form: str, tmp_path: Path) -> None:
    """Learned queries (a constant [1, 8, 16]) against image tokens: ``q @ k^T`` has the constant first,
    ``k @ q^T`` a weight with a leading axis of one. Both are written as a MatMul by a 2-D weight second;
    both went to the CPU with the token branch."""
    g = _Graph(10)
    tokens = g.op("Transpose", [g.op("Reshape", [g.conv("data", 3, 16, stride=2), g.const(_i64([1, 16, -1]), "s")])],
                  perm=[0, 2, 1])
    queries = (g.rng.standard_normal((1, 8, 16)) * 0.3).astype(np.float32)
    if form == "query_first":
        scores = g.op("MatMul", [g.const(queries, "q"), g.op("Transpose", [tokens], perm=[0, 2, 1])])
    else:
        scores = g.op("Transpose", [g.op("MatMul", [tokens, g.const(queries.transpose(0, 2, 1).copy(), "q")])],
                      perm=[0, 2, 1])
    out = g.op("MatMul", [g.op("Softmax", [scores], axis=-1), tokens])
    outcome = convert_and_check(g.model({"data": [1, 3, 16, 16]}, [out]), tmp_path, "max", checker=False)
    assert not outcome.cpu, outcome.placement()
    assert min(outcome.cosine) > COSINE


def _all_on_the_bpu(march: str, fm, root: Path) -> dict[str, Path]:
    """Convert ``fm`` for ``march`` (``max``) under ``root``; check that no node runs on the CPU and that the
    quantized model computes what the float model does on held-out samples. The artefact paths."""
    from builders import EXACT_MEAN, EXACT_SCALE, held_out, make_project
    from conformance import _source_feed

    from hbtools.log import setup
    from hbtools.metrics import cosine_similarity
    from hbtools.pipeline.runner import makertbin
    from hbtools.runtime import HB_ONNXRuntime
    from hbtools.runtime.binfile import read_bin

    setup(None)
    project = make_project(root, fm, cal_count=6)
    project.write(model_parameters={"march": march}, calibration_parameters={"calibration_type": "max"})
    paths = makertbin(project.config_path, "onnx")
    cpu = read_bin(paths["bin"]).models[0].partition["cpu_nodes"]
    assert not cpu, cpu
    quantized = HB_ONNXRuntime(model_file=str(paths["quantized"]))
    for x in held_out(fm, count=3, seed=2):
        want = HB_ONNXRuntime(onnx_model=fm.model).run(None, _source_feed(fm, {"data": x}, EXACT_MEAN, EXACT_SCALE))[0]
        layout = x if list(quantized.get_inputs()[0].shape) == list(x.shape) else x.transpose(0, 2, 3, 1)
        assert cosine_similarity(want, quantized.run(None, {"data": layout})[0]) > COSINE
    return paths


def test_a_focus_layer_stays_on_the_bpu_of_rdk_x3(tmp_path: Path) -> None:
    """YOLOv5's Focus (four strided Slices and a Concat): onnxruntime's optimizer writes it as SpaceToDepth
    and a Gather that reorders the channels. bernoulli2 has no BPU Gather, so the first layer ran on the CPU
    at full resolution; the Gather now goes into the next Conv's weight."""


    g = _Graph(11)
    big = np.iinfo(np.int64).max
    slices = [g.op("Slice", ["data", g.const(_i64([h, w]), "start"), g.const(_i64([big, big]), "end"),
                             g.const(_i64([2, 3]), "axes"), g.const(_i64([2, 2]), "steps")])
              for h, w in ((0, 0), (1, 0), (0, 1), (1, 1))]
    focus = g.op("Concat", slices, axis=1)
    out = g.conv(g.op("Relu", [g.conv(focus, 12, 16)]), 16, 8, k=1)
    fm = g.model({"data": [1, 3, 32, 32]}, [out])
    _all_on_the_bpu("bernoulli2", fm, tmp_path)


@pytest.mark.parametrize("split", [[1, 4, 4, 8, 8], [1, 4, 4, 64]], ids=["5-D", "flat map"])
def test_a_channel_shuffle_stays_on_the_bpu_of_rdk_x3(split: list[int], tmp_path: Path) -> None:
    """ShuffleNet's channel shuffle (Reshape to [N, g, C/g, ...], Transpose of the two channel axes, Reshape
    back) before a grouped Conv, which cannot take a channel reordering into its weights: bernoulli2 has no
    BPU Reshape, and every shuffle ran on the CPU with a BPU subgraph between each two. As one Gather of
    channels it stays on the BPU."""


    g = _Graph(14)
    x = g.op("Relu", [g.conv("data", 3, 16)])
    moved = g.op("Transpose", [g.op("Reshape", [x, g.const(_i64(split), "split")])],
                 perm=[0, 2, 1, *range(3, len(split))])
    shuffled = g.op("Reshape", [moved, g.const(_i64([1, 16, 8, 8]), "back")])
    w = (g.rng.standard_normal((16, 4, 3, 3)) / 6).astype(np.float32)
    out = g.op("Conv", [shuffled, g.const(w, "w")], kernel_shape=[3, 3], pads=[1, 1, 1, 1], group=4)
    fm = g.model({"data": [1, 3, 8, 8]}, [out])
    paths = _all_on_the_bpu("bernoulli2", fm, tmp_path)
    assert [n.op_type for n in onnx.load(paths["optimized"]).graph.node].count("Gather") == 1


@pytest.mark.parametrize("perm", [[0, 1, 3, 5, 2, 4], [0, 3, 5, 1, 2, 4]], ids=["pixel_unshuffle", "depth_order"])
def test_a_pixel_unshuffle_at_the_input_stays_on_the_bpu_of_rdk_x3(perm: list[int], tmp_path: Path) -> None:
    """``F.pixel_unshuffle(x, 2)`` as torch exports it (Reshape to [N, C, H/2, 2, W/2, 2], Transpose, Reshape to
    [N, 4C, H/2, W/2]), Real-ESRGAN's input, and the same chain in SpaceToDepth's channel order: the 5-D Transpose
    ran on RDK X3's CPU between the input's preprocessing and the first conv, 2 BPU subgraphs. It is a
    SpaceToDepth and a channel order the conv takes into its weights: the same values, all on the BPU."""
    from hbtools.march.profiles import get_profile
    from hbtools.pipeline import optimize
    from hbtools.runtime import HB_ONNXRuntime

    g = _Graph(21)
    blocks = g.op("Reshape", ["data", g.const(_i64([1, 3, 8, 2, 8, 2]), "blocks")])
    unshuffled = g.op("Reshape", [g.op("Transpose", [blocks], perm=perm), g.const(_i64([1, 12, 8, 8]), "channels")])
    out = g.conv(g.op("Relu", [g.conv(unshuffled, 12, 16)]), 16, 8, k=1)
    fm = g.model({"data": [1, 3, 16, 16]}, [out])
    x = {"data": g.rng.standard_normal((1, 3, 16, 16)).astype(np.float32)}
    want = HB_ONNXRuntime(onnx_model=fm.model).run(None, x)[0]
    for march in ("bernoulli2", "bayes-e"):
        optimized = optimize.run(fm.model, get_profile(march))
        assert "Transpose" not in {n.op_type for n in optimized.graph.node}, march
        got = HB_ONNXRuntime(onnx_model=optimized).run(None, x)[0]
        assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max(), march
    _all_on_the_bpu("bernoulli2", fm, tmp_path)


@pytest.mark.parametrize(("march", "size", "kernel", "view"), [("bayes-e", 60, 30, False), ("bayes-e", 60, 20, False),
                                                           ("bernoulli2", 14, 14, True), ("bayes-e", 16, 16, False)],
                         ids=["psp 2x2", "psp 3x3", "se on x3", "16x16 map"])
def test_a_large_average_pool_over_whole_windows_stays_on_the_bpu(march: str, size: int, kernel: int, view: bool,
                                                                   tmp_path: Path) -> None:
    """Non-overlapping AveragePools larger than the BPU's kernel or stride limit: PSPNet's AdaptiveAvgPool2d(2)
    and (3) of a 60x60 map (kernel = stride 30 and 20), MobileOne's squeeze-and-excitation pool over the whole
    map and its view of the gate as (-1, C, 1, 1): each went to the CPU. As a global pool, or as pools in
    steps (30 = 6 x 5), and without the Reshape to the shape it has, they stay on the BPU."""


    g = _Graph(17)
    x = g.op("Relu", [g.conv("data", 3, 8)])
    pooled = g.op("AveragePool", [x], kernel_shape=[kernel, kernel], strides=[kernel, kernel])
    gate = g.op("Sigmoid", [g.conv(pooled, 8, 8, k=1)])
    if view:
        gate = g.op("Reshape", [gate, g.const(_i64([-1, 8, 1, 1]), "view")])
    out = g.op("Mul", [x, gate]) if kernel == size else g.conv(gate, 8, 4, k=1)
    fm = g.model({"data": [1, 3, size, size]}, [out])
    _all_on_the_bpu(march, fm, tmp_path)


@pytest.mark.parametrize("bias", [False, True])
def test_levit_linear_bn_folds_into_one_gemm(bias: bool, tmp_path: Path) -> None:
    """LeViT's Linear_BN: a MatMul of [1, N, K] tokens, a Reshape to rows [N, C], BatchNorm1d, a Reshape back.
    The Reshape kept the BatchNorm from its layer: it ran as a depthwise conv of its own (a 1.35 ms model
    at 1.76 ms). Folded, the layer is one Gemm over the rows."""
    from hbtools.march.profiles import get_profile
    from hbtools.pipeline import optimize

    g = _Graph(18)
    x = g.op("Relu", [g.conv("data", 3, 8)])
    tokens = g.op("Transpose", [g.op("Reshape", [x, g.const(_i64([1, 8, 64]), "tokens")])], perm=[0, 2, 1])
    w = (g.rng.standard_normal((8, 16)) / 3).astype(np.float32)
    y = g.op("MatMul", [tokens, g.const(w, "w")])
    if bias:
        y = g.op("Add", [y, g.const((0.1 * g.rng.standard_normal(16)).astype(np.float32), "b")])
    rows = g.bn(g.op("Reshape", [y, g.const(_i64([64, 16]), "rows")]), 16)
    out = g.op("Reshape", [rows, g.const(_i64([1, 64, 16]), "back")])
    fm = g.model({"data": [1, 3, 8, 8]}, [out])
    optimized = optimize.run(fm.model, get_profile("bayes-e"))
    kinds = [n.op_type for n in optimized.graph.node]
    assert "BatchNormalization" not in kinds and kinds.count("Gemm") == 1 and "MatMul" not in kinds, kinds
    outcome = convert_and_check(fm, tmp_path, "max", checker=False)
    assert min(outcome.cosine) > COSINE


def test_rows_of_one_product_divided_by_another_row_get_their_own_grids(tmp_path: Path) -> None:
    """EfficientViT's ReLU linear attention: ``out = [v; 1] @ k^T @ q``, then ``out[:, :-1] / (out[:, -1:] + eps)``.
    One product, one grid: spanning the numerators' range, it rounded small denominators to 0 (EfficientViT-B1
    held out at cosine 0.81 mean, 0.94 with this). Each slice of the product is a product of its own, which
    computes the same values; the quotient keeps its accuracy."""
    from hbtools.march.profiles import get_profile
    from hbtools.pipeline import optimize

    g = _Graph(19)

    def tokens(channels: int) -> str:  # [1, channels, 64]
        return g.op("Reshape", [g.conv("data", 3, channels, k=1), g.const(_i64([1, channels, 64]), "tokens")])

    k = g.op("Relu", [g.op("Transpose", [tokens(4)], perm=[0, 2, 1])])  # [1, 64, 4]
    v, q = tokens(4), g.op("Relu", [tokens(4)])
    vk = g.op("MatMul", [g.op("Concat", [v, g.const(np.ones((1, 1, 64), np.float32), "ones")], axis=1), k])
    out = g.op("MatMul", [vk, q])  # [1, 5, 64]: four numerator rows, then the denominators
    rows = g.op("Slice", [out, g.const(_i64([0]), "s"), g.const(_i64([-1]), "e"), g.const(_i64([1]), "a")])
    last = g.op("Slice", [out, g.const(_i64([-1]), "s"), g.const(_i64([5]), "e"), g.const(_i64([1]), "a")])
    g.op("Div", [rows, g.op("Add", [last, g.const(np.array(1e-3, np.float32), "eps")])])
    fm = g.model({"data": [1, 3, 8, 8]}, [g.nodes[-1].output[0]])
    optimized = optimize.run(fm.model, get_profile("bayes-e"))
    assert [n.op_type for n in optimized.graph.node].count("MatMul") == 3
    outcome = convert_and_check(fm, tmp_path, "default", checker=False)
    assert min(outcome.cosine) > 0.999


def test_a_reshape_chain_that_moves_more_than_channels_is_no_shuffle() -> None:
    """A Reshape / Transpose / Reshape chain that gives back the input's shape but moves values across the
    map (a transpose of rows and columns through [N, C, H, W] -> [N, C, W, H]) is not a Gather of channels."""
    from hbtools.graph.bpu_forms import channel_shuffles_as_gathers

    g = _Graph(15)
    x = g.conv("data", 3, 4)
    moved = g.op("Transpose", [g.op("Reshape", [x, g.const(_i64([1, 4, 8, 8]), "same")])], perm=[0, 1, 3, 2])
    out = g.op("Reshape", [moved, g.const(_i64([1, 4, 8, 8]), "back")])
    model = g.model({"data": [1, 3, 8, 8]}, [out]).model
    assert channel_shuffles_as_gathers(model) == 0
    assert "Gather" not in {n.op_type for n in model.graph.node}


def test_a_float_model_that_gives_nan_on_some_samples_converts_with_a_warning(tmp_path: Path) -> None:
    """A 0 / 0 in the float model on some calibration pictures (torch's dynamo exporter dropped EfficientViT's
    epsilon): the cross-validated method search compared NaN scores and stopped with an internal error. Those
    samples are left out of the scores, with a WARNING that says so; on none left, one ERROR."""
    from builders import EXACT_MEAN, EXACT_SCALE, make_project
    from conformance import INTERNAL, _cli, _source_feed

    from hbtools.runtime import HB_ONNXRuntime
    from hbtools.runtime.binfile import read_bin

    g = _Graph(16)
    a = g.op("Relu", [g.conv("data", 3, 8)])
    pixel = g.op("Relu", [g.op("Slice", ["data", g.const(_i64([0, 0, 0, 0]), "s"), g.const(_i64([1, 1, 1, 1]), "e")])])
    gate = g.op("Div", [pixel, pixel])  # 1, or NaN where the first pixel is not above 0
    out = g.conv(g.op("Mul", [a, gate]), 8, 4, k=1)
    fm = g.model({"data": [1, 3, 8, 8]}, [out])
    project = make_project(tmp_path, fm, cal_count=8, calibration_type="default")
    session = HB_ONNXRuntime(onnx_model=fm.model)
    nan = [bool(np.isnan(session.run(None, _source_feed(fm, {"data": np.fromfile(f, np.uint8).reshape(1, 3, 8, 8)},
                                                          EXACT_MEAN, EXACT_SCALE))[0]).any())
           for f in sorted((project.root / "cal_data").iterdir())]
    assert any(nan) and not all(nan), nan
    code, out_text = _cli(["makertbin", "--config", str(project.config_path), "--model-type", "onnx"], tmp_path)
    assert INTERNAL not in out_text and code == 0, out_text[-3000:]
    assert f"NaN or inf in output '{fm.model.graph.output[0].name}' on {sum(nan)} of the 8 calibration" in out_text
    assert read_bin(project.artefact("bin")).models


def test_the_checker_does_not_blame_the_model_for_its_own_random_pixels(tmp_path: Path) -> None:
    """The checker runs the float model on random pixels without the mean and scale (it has none): a
    YOLO box decode's Exp overflows there, which says nothing of the model; it warned of a model that
    "gives NaN or inf on the calibration samples" and of an exporter's dropped epsilon."""
    from conformance import INTERNAL, _cli

    w = numpy_helper.from_array(np.full((4, 3, 1, 1), 0.5, np.float32), "w")
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
                               helper.make_node("Exp", ["c"], ["y"], name="decode")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 32, 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 32, 32])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(tmp_path / "decode.onnx"))
    code, out_text = _cli(["checker", "--model-type", "onnx", "--model", str(tmp_path / "decode.onnx"),
                           "--march", "bayes-e"], tmp_path)
    assert code == 0 and INTERNAL not in out_text, out_text[-3000:]
    assert "WARNING" not in out_text, out_text[-3000:]
    assert "1 BPU subgraph(s) and 0 CPU node(s)" in out_text


@pytest.mark.parametrize("pads", [[0, 0, -1, -2, 0, 0, -1, 0], [0, 0, -1, 2, 0, 0, 1, -2]])
def test_a_pad_that_crops_runs_on_the_bpu(pads: list[int], tmp_path: Path) -> None:
    """A constant Pad with negative amounts crops (``F.pad`` with negative values): written as a Slice, and a
    Pad of what it still adds (into the next Conv's padding here); it ran on the CPU."""
    g = _Graph(12)
    x = g.op("Relu", [g.conv("data", 3, 8)])
    cropped = g.op("Pad", [x, g.const(_i64(pads), "pads"), g.const(np.array(0.0, np.float32), "zero")])
    w = (g.rng.standard_normal((4, 8, 3, 3)) / 8).astype(np.float32)
    out = g.op("Conv", [cropped, g.const(w, "w")], kernel_shape=[3, 3])
    outcome = convert_and_check(g.model({"data": [1, 3, 16, 16]}, [out]), tmp_path, "max", checker=False)
    assert not outcome.cpu, outcome.placement()
    assert min(outcome.cosine) > COSINE


def _cpu_types_on(march: str, fm, root: Path) -> list[str]:
    """The op types the .bin of a ``max`` conversion of ``fm`` for ``march`` runs on the CPU."""
    from builders import make_project

    from hbtools.log import setup
    from hbtools.pipeline.runner import makertbin
    from hbtools.runtime.binfile import read_bin

    setup(None)
    project = make_project(root, fm, cal_count=4)
    project.write(model_parameters={"march": march}, calibration_parameters={"calibration_type": "max"})
    return [c["type"] for c in read_bin(makertbin(project.config_path, "onnx")["bin"]).models[0].partition["cpu_nodes"]]


def test_rewrites_for_the_bpu_leave_a_model_alone_where_the_march_cannot_take_them(tmp_path: Path) -> None:
    """bernoulli2 (RDK X3) has no ReduceSum and no Transpose of the last two axes: a ReduceL2 stays one CPU node
    (not a product, a sum and a root on the CPU), and a MatMul with its constant first gets no Transposes, which
    would split its BPU graph."""
    g = _Graph(13)
    x = g.op("Relu", [g.conv("data", 3, 16, stride=2)])
    mixed = g.op("MatMul", [g.const((g.rng.standard_normal((8, 8)) / 3).astype(np.float32), "A"), x])
    norm = g.op("ReduceL2", [mixed], axes=[1], keepdims=1)
    out = g.op("Mul", [g.conv(mixed, 16, 4, k=1), norm])
    types = _cpu_types_on("bernoulli2", g.model({"data": [1, 3, 16, 16]}, [out]), tmp_path)
    assert "ReduceL2" in types and "ReduceSum" not in types and "Transpose" not in types, types
