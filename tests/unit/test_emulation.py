"""The calibrated model is the quantized model's exact float emulation (SPEC §7).

Per held-out sample the two agree to cosine >= 0.9999 (in practice bit for bit): the
calibrated model follows the integer rounding (bias on the accumulator grid, the
preprocessing's integer coefficients, float64 requantization), and the quantized
model's integers are the ones the calibrated model's nodes imply.
"""

from __future__ import annotations

import arch_builders
import numpy as np
import onnx
import pytest
from builders import (
    FloatModel,
    _Graph,
    act_matmul,
    activations,
    cpu_island,
    data_movement,
    featuremap_mlp,
    held_out,
    make_project,
    resnet_like,
)
from onnx import TensorProto, helper, numpy_helper

from hbtools.log import setup
from hbtools.metrics import cosine_similarity
from hbtools.ops.base import attrs_of
from hbtools.ops.calibration import HzBiasCalibration, quantize_weight
from hbtools.pipeline.runner import makertbin
from hbtools.runtime import HB_ONNXRuntime
from hbtools.runtime.lowering import lower_model

# (model builder, calibration_parameters overrides)
CASES = {
    "resnet_max": (resnet_like, {"calibration_type": "max"}),
    "resnet_default": (resnet_like, {"calibration_type": "default"}),
    "resnet_int16": (resnet_like, {"calibration_type": "max", "optimization": "set_all_nodes_int16"}),
    "activations_kl": (activations, {"calibration_type": "kl"}),
    "movement_asymmetric": (data_movement, {"calibration_type": "max", "optimization": "asymmetric"}),
    "movement_per_channel": (data_movement, {"calibration_type": "max", "per_channel": True}),
    "attention_max": (act_matmul, {"calibration_type": "max"}),
    "mlp_weights_default": (featuremap_mlp, {"calibration_type": "default"}),
    "layer_norms_default": (arch_builders.layer_norms, {"calibration_type": "default"}),
    "wide_heads_default": (arch_builders.wide_heads, {"calibration_type": "default"}),
    "bilinear_decoder_default": (arch_builders.bilinear_decoder, {"calibration_type": "default"}),
    "prelu_default": (arch_builders.prelu_upsampler, {"calibration_type": "default"}),
    "recurrent_default": (arch_builders.recurrent_head, {"calibration_type": "default"}),
    "grouped_upsampler_default": (arch_builders.grouped_upsampler, {"calibration_type": "default"}),
    "grouped_upsampler_per_channel": (arch_builders.grouped_upsampler, {"calibration_type": "max",
                                                                        "per_channel": True}),
    "grouped_upsampler_int16": (arch_builders.grouped_upsampler,
                                {"calibration_type": "max", "optimization": "set_all_nodes_int16"}),
    "vit_embedding_default": (lambda: arch_builders.vit_embedding(opset=18), {"calibration_type": "default"}),
    "layer_norms_int16": (lambda: arch_builders.layer_norms(opset=18),
                          {"calibration_type": "max", "optimization": "set_all_nodes_int16"}),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def converted(request, tmp_path_factory):
    setup(None)
    build, overrides = CASES[request.param]
    root = tmp_path_factory.mktemp(request.param)
    fm = build()
    project = make_project(root, fm, cal_count=8)
    project.write(calibration_parameters=overrides)
    paths = makertbin(project.config_path, "onnx")
    return paths, held_out(fm, count=6, seed=99)


def _outputs(path, samples):
    sess = HB_ONNXRuntime(model_file=str(path))
    return [sess.run(None, {sess.input_names[0]: x})[0] for x in samples]


def test_calibrated_and_quantized_agree_per_sample(converted) -> None:
    paths, samples = converted
    calibrated, quantized = _outputs(paths["calibrated"], samples), _outputs(paths["quantized"], samples)
    for k, (c, q) in enumerate(zip(calibrated, quantized, strict=True)):
        assert cosine_similarity(c, q) >= 0.9999, f"held-out sample {k}: cosine {cosine_similarity(c, q):.6f}"
        assert np.argmax(c) == np.argmax(q), f"held-out sample {k} changes its argmax"
        # Same integers everywhere: the outputs agree to float32 rounding.
        diff = float(np.abs(c - q).max())
        assert diff <= 1e-6 * float(np.abs(q).max()) + 1e-12, f"held-out sample {k}: max difference {diff}"


@pytest.mark.parametrize("calibration_type", ["max", "default"])
def test_cpu_island_is_emulated_in_float32(tmp_path, calibration_type: str) -> None:
    """Nodes the quantized model runs on the CPU compute in float32 on dequantized values: the
    calibrated model computes them so too (not on its float64 twins), and the conv accumulators
    they read are dequantized with the float32 scale the quantized model stores."""
    setup(None)
    fm = cpu_island()
    project = make_project(tmp_path, fm, cal_count=8)
    project.write(calibration_parameters={"calibration_type": calibration_type})
    paths = makertbin(project.config_path, "onnx")
    samples = held_out(fm, count=6, seed=99)
    calibrated, quantized = (HB_ONNXRuntime(model_file=str(paths[k])) for k in ("calibrated", "quantized"))
    for k, x in enumerate(samples):
        for c, q, out in zip(calibrated.run(None, {"data": x}), quantized.run(None, {"data": x}),
                             calibrated.output_names, strict=True):
            assert np.array_equal(c, q), f"held-out sample {k}, output {out}: {int((c != q).sum())} values differ"


def test_gelu_table_rounds_as_the_calibrated_nodes(tmp_path) -> None:
    """An Erf GELU on int16 levels becomes one lookup table. onnxruntime fuses the chain into a
    Gelu kernel that rounds differently, and whether it does depends on the graph around it (the
    table's nodes on their own, or inside the calibrated model); no session fuses it, so every
    level of a ramp over the input's range gives the calibrated model's value."""
    g = _Graph(3)
    x = g.op("Conv", ["feat", g.const(np.full((1, 1, 1, 1), 1.5, np.float32), "w")], kernel_shape=[1, 1])
    erf = g.op("Erf", [g.op("Div", [x, g.const(np.float32(1.4142135))])])
    gelu = g.op("Mul", [g.op("Mul", [x, g.op("Add", [erf, g.const(np.float32(1.0))])]), g.const(np.float32(0.5))])
    fm = g.model({"feat": [1, 1, 256, 256]}, [gelu], featuremap={"feat"})
    setup(None)
    project = make_project(tmp_path, fm, cal_count=4)
    project.write(calibration_parameters={"calibration_type": "max", "optimization": "set_all_nodes_int16"})
    paths = makertbin(project.config_path, "onnx")
    ramp = np.linspace(-4, 4, 256 * 256, dtype=np.float32).reshape(fm.inputs["feat"])
    c, q = (HB_ONNXRuntime(model_file=str(paths[k])).run(None, {"feat": ramp})[0] for k in ("calibrated", "quantized"))
    assert np.array_equal(c, q), f"{int((c != q).sum())} of {c.size} values differ"


def test_integer_weights_and_biases_are_the_calibrated_ones(converted) -> None:
    paths, _ = converted
    calibrated = onnx.load(str(paths["calibrated"]))
    quantized = onnx.load(str(paths["quantized"]))
    c_inits = {t.name: numpy_helper.to_array(t) for t in calibrated.graph.initializer}
    q_inits = {t.name: numpy_helper.to_array(t) for t in quantized.graph.initializer}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in calibrated.graph.node:
        for i in node.input:
            readers.setdefault(i, []).append(node)
    compared = 0
    for node in calibrated.graph.node:
        if node.op_type == "HzCalibration" and attrs_of(node)["kind"] == "weight":
            rounding = c_inits[node.input[1]] if len(node.input) > 1 and node.input[1] else None
            levels, _ = quantize_weight(c_inits[node.input[0]], attrs_of(node), rounding)
            for conv in readers[node.output[0]]:
                out_axis = 0 if conv.op_type == "Conv" else 1
                got = _joined(q_inits, f"{conv.name}_weight", out_axis)
                want = levels.T if conv.op_type == "Gemm" and attrs_of(conv).get("transB", 0) else levels
                np.testing.assert_array_equal(got, want.astype(np.int8), err_msg=f"weight of {conv.name}")
                compared += 1
        elif node.op_type == HzBiasCalibration.op_type:
            steps = HzBiasCalibration.steps(HzBiasCalibration.read(node))
            levels = np.clip(np.round(c_inits[node.input[0]].astype(np.float64).reshape(-1) / steps), -2**31, 2**31 - 1)
            conv = readers[node.output[0]][0]
            np.testing.assert_array_equal(_joined(q_inits, f"{conv.name}_bias", 0), levels.astype(np.int32),
                                          err_msg=f"bias of {conv.name}")
            compared += 1
    assert compared >= 2, "the model has integer weights to compare"


def _joined(inits: dict[str, np.ndarray], name: str, axis: int) -> np.ndarray:
    """A quantized weight or bias: one initializer, or the parts of a conv split by output channels."""
    if f"{name}_quantized" in inits:
        return inits[f"{name}_quantized"]
    parts = []
    while f"{name}_part{len(parts)}_quantized" in inits:
        parts.append(inits[f"{name}_part{len(parts)}_quantized"])
    assert len(parts) > 1, f"no quantized {name}"
    return np.concatenate(parts, axis=axis)


def _one_conv(w: np.ndarray, b: np.ndarray) -> FloatModel:
    """A 3x3 Conv (padding 1) of an 8x8 picture with the given weight and bias."""
    graph = helper.make_graph(
        [helper.make_node("Conv", ["data", "w", "b"], ["y"], pads=[1, 1, 1, 1], name="conv")], "one_conv",
        [helper.make_tensor_value_info("data", TensorProto.FLOAT, [1, w.shape[1], 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, w.shape[0], 8, 8])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    return FloatModel(model, {"data": [1, w.shape[1], 8, 8]}, set())


def test_channel_of_subnormal_weights_quantizes_to_zero(tmp_path) -> None:
    """A channel whose weights are subnormal float32 (max |w| / 127 underflows float32) gets a usable
    step: no division by zero, no NaN, and the channel outputs its (zero) bias."""
    import warnings

    setup(None)
    rng = np.random.default_rng(6)
    w = rng.normal(0, 0.3, size=(4, 3, 3, 3)).astype(np.float32)
    w[1] = np.float32(7e-45)  # what a re-parameterised export leaves in a dead channel
    w[1, 0, 0, 0] = 0.0
    b = np.array([0.1, 0.0, -0.45, 0.3], dtype=np.float32)
    project = make_project(tmp_path, _one_conv(w, b), cal_count=4)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # 0/0 in the weight quantization
        paths = makertbin(project.config_path, "onnx")
    calibrated = onnx.load(str(paths["calibrated"]))
    scales = [s for n in calibrated.graph.node if n.op_type == "HzCalibration"
              for s in attrs_of(n)["scales"]]
    assert min(scales) > 0
    samples = held_out(project.fm, count=2, seed=3)
    for q in _outputs(paths["quantized"], samples):
        assert np.isfinite(q).all() and not q[0, 1].any()


def test_dead_channel_keeps_its_bias(tmp_path) -> None:
    """A channel whose weights are ~0 still outputs its bias (the int32 accumulator has room for it)."""
    setup(None)
    rng = np.random.default_rng(5)
    w = rng.normal(0, 0.3, size=(4, 3, 3, 3)).astype(np.float32)
    w[2] = 1e-15  # e.g. a pruned or re-parameterised channel
    b = np.array([0.1, -0.2, -0.45, 0.3], dtype=np.float32)
    fm = _one_conv(w, b)
    project = make_project(tmp_path, fm, cal_count=4)
    paths = makertbin(project.config_path, "onnx")
    samples = held_out(fm, count=2, seed=3)
    for c, q in zip(_outputs(paths["calibrated"], samples), _outputs(paths["quantized"], samples), strict=True):
        step = np.abs(q).max() / 127.0
        np.testing.assert_allclose(q[0, 2], -0.45, atol=step)
        np.testing.assert_allclose(c, q, rtol=0, atol=1e-6)



@pytest.mark.parametrize("build", [resnet_like, featuremap_mlp], ids=["convs", "matmuls"])
def test_integer_product_sums_are_requantized_without_float64(tmp_path, build) -> None:
    """In the lowered calibrated model an int16 conv's or matrix product's int32 sum and its constant
    bias go to the output grid in one DequantizeLinear (the bias as zero point), or with the channels on
    the last axis in its three operations (the zero point subtracted in int32, a cast to float32, the
    product), as the quantized model does, not through float64 copies of the whole map. (int8 convs with
    constant grids are one QLinearConv.)"""
    fm = build()
    project = make_project(tmp_path, fm, cal_count=4)
    project.write(calibration_parameters={"calibration_type": "max", "optimization": "set_all_nodes_int16"})
    paths = makertbin(project.config_path, "onnx")
    lowered = lower_model(onnx.load(str(paths["calibrated"])))
    sums = set()
    for node in lowered.graph.node:
        if node.op_type in ("ConvInteger", "MatMulInteger") or (node.op_type in ("Add", "Mul") and
                                                                 node.input[0] in sums):
            sums.add(node.output[0])
    assert sums, "the calibrated model runs its products on integer kernels"
    widened = [n.name for n in lowered.graph.node if n.op_type == "Cast" and n.input[0] in sums]
    assert not widened, f"int32 sums cast to float64: {widened}"
    shifted = {n.output[0] for n in lowered.graph.node if n.op_type == "Sub" and n.input[0] in sums}
    requantized = [n for n in lowered.graph.node if (n.op_type == "DequantizeLinear" and n.input[0] in sums) or
                   (n.op_type == "Cast" and n.input[0] in shifted and attrs_of(n)["to"] == TensorProto.FLOAT)]
    assert requantized, "no sum is requantized by DequantizeLinear or its int32 / float32 operations"


def test_float_convs_between_dequantize_and_quantize_keep_their_float_weights() -> None:
    """onnxruntime quantizes the float weight and bias of a Conv between a DequantizeLinear and a
    QuantizeLinear (to make a QDQ unit of it); a CPU conv between two BPU subgraphs, or a calibrated
    model's conv, must compute with its own float weights. HB_ONNXRuntime's sessions agree with
    onnxruntime running the graph unoptimized (they differed by 0.12)."""
    import onnxruntime as ort

    rng = np.random.default_rng(3)
    w = rng.standard_normal((6, 4, 3, 3)).astype(np.float32) * np.float32(0.37)
    graph = helper.make_graph(
        [helper.make_node("DequantizeLinear", ["q", "s", "z"], ["x"]),
         helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1]),
         helper.make_node("QuantizeLinear", ["y", "s", "z"], ["yq"])], "dq_conv_q",
        [helper.make_tensor_value_info("q", TensorProto.UINT8, [1, 4, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6, 8, 8]),
         helper.make_tensor_value_info("yq", TensorProto.UINT8, [1, 6, 8, 8])],
        [numpy_helper.from_array(np.array(0.0371, np.float32), "s"),
         numpy_helper.from_array(np.array(128, np.uint8), "z"), numpy_helper.from_array(w, "w"),
         numpy_helper.from_array(rng.standard_normal(6).astype(np.float32), "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    q = rng.integers(0, 256, (1, 4, 8, 8)).astype(np.uint8)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    want = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"]).run(
        None, {"q": q})[0]
    got = HB_ONNXRuntime(onnx_model=model).run(None, {"q": q})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_inputs_with_zero_point_minus_128_take_the_fast_integer_kernels(tmp_path) -> None:
    """RDK X3 gives a tensor after a Relu the zero point -128 (its levels 0..255); the lowering sent every conv
    reading one to onnxruntime's generic int8 x int8 ConvInteger, about 5x slower than the uint8 kernels, which
    take such levels as they are (hunt 41 D1: the quantized model 11-15x float). Same values either way."""
    fm = resnet_like()
    project = make_project(tmp_path, fm, march="bernoulli2", cal_count=8)
    project.write(calibration_parameters={"calibration_type": "max", "optimization": "asymmetric"})
    paths = makertbin(project.config_path, "onnx")
    quantized = onnx.load(str(paths["quantized"]))
    zero_points = [attrs_of(n).get("x_zero_point", 0) for n in quantized.graph.node if n.op_type == "HzSQuantizedConv"]
    assert -128 in zero_points, zero_points
    lowered = lower_model(quantized)
    inits = {t.name: t.data_type for t in lowered.graph.initializer}
    slow = [n.name for n in lowered.graph.node
            if n.op_type == "ConvInteger" and inits.get(n.input[1]) != TensorProto.UINT8]
    assert not slow, f"convs on int8 x int8 ConvInteger: {slow}"
    samples = held_out(fm, count=4, seed=7)
    runs = []
    for kind in ("calibrated", "quantized"):
        sess = HB_ONNXRuntime(model_file=str(paths[kind]))
        nhwc = sess.layout[0] == "NHWC"  # RDK X3 takes pictures channels last
        runs.append([sess.run(None, {sess.input_names[0]: x.transpose(0, 2, 3, 1) if nhwc else x})[0]
                     for x in samples])
    for a, b in zip(*runs, strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_dropped_session_lets_its_model_go(tmp_path) -> None:
    """The lowering remembered each integer node's decoded attributes by the node object, which keeps the whole
    model alive: a session per picture (or per worker task) over a quantized model grew by the model's size each
    time, up to 4096 nodes' models (hunt 41 D2)."""
    from hbtools.ops import quantized

    g = _Graph(3)
    gated = g.op("Mul", [g.op("Relu", [g.conv("data", 3, 8)]), g.op("Sigmoid", [g.conv("data", 3, 8)])])
    fm = g.model({"data": [1, 3, 16, 16]}, [g.conv(gated, 8, 4)])
    mul = next(n.name for n in fm.model.graph.node if n.op_type == "Mul")
    project = make_project(tmp_path, fm, cal_count=4)
    # int8 x int8 -> int16: lowered through a table of the integer rule, which decodes the node's attributes
    project.write(calibration_parameters={"calibration_type": "max"},
                  model_parameters={"node_info": {mul: {"OutputType": "int16"}}})
    path = str(makertbin(project.config_path, "onnx")["quantized"])
    HB_ONNXRuntime(model_file=path)
    before = len(quantized._cache)
    for _ in range(3):
        sess = HB_ONNXRuntime(model_file=path)
        sess.run(None, {sess.input_names[0]: held_out(fm, count=1, seed=1)[0]})
        del sess
    assert len(quantized._cache) == before
