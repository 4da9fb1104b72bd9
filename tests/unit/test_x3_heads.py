"""Pooled-vector heads and MLPs over tokens on RDK X3 (bernoulli2), whose BPU takes 4-D tensors only.

A PFLD head (global pools of two maps and a 1x1 map, each flattened, joined by a Concat into one Linear) ran its
pools, Flattens and Concat on the CPU between two BPU subgraphs ('Concat on a 2-D tensor [1, 16]'). A token MLP
(Linear, ReLU, Linear, residual Add) ran each Linear as a BPU subgraph of its own and the ReLU and Add between
them on the CPU ('Relu on a 3-D tensor [1, 196, 64]') (hunt 23 D2, D3).
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from builders import _Graph

from hbtools.march.profiles import get_profile
from hbtools.pipeline import optimize
from hbtools.quant.units import build_partition

LAYOUT = ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose")


def _weight(g: _Graph, *shape: int) -> str:
    return g.const((g.rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32), "w")


def _relu_conv(g: _Graph, x: str, cin: int, cout: int, k: int, **attrs) -> str:
    bias = g.const((0.1 * g.rng.standard_normal(cout)).astype(np.float32), "b")
    return g.op("Relu", [g.op("Conv", [x, _weight(g, cout, cin, k, k), bias], kernel_shape=[k, k], **attrs)])


def _multiscale_head(flatten: str):
    """PFLD's head: two ReLU maps globally pooled, a conv down to a 1x1 map, each flattened, joined, one Linear."""
    g = _Graph(4)
    x1 = _relu_conv(g, "img", 3, 8, 3, strides=[2, 2], pads=[1, 1, 1, 1])
    x2 = _relu_conv(g, x1, 8, 16, 3, strides=[2, 2], pads=[1, 1, 1, 1])
    x3 = _relu_conv(g, x2, 16, 24, 4)

    def flat(x: str, c: int) -> str:
        if flatten == "Flatten":
            return g.op("Flatten", [x], axis=1)
        return g.op("Reshape", [x, g.const(np.array([1, c], np.int64), "shape")])

    joined = g.op("Concat", [flat(g.op("GlobalAveragePool", [x1]), 8), flat(g.op("GlobalAveragePool", [x2]), 16),
                             flat(x3, 24)], axis=1)
    return g.model({"img": [1, 3, 16, 16]}, [g.gemm(joined, 48, 10)])


def _token_mlp(opset: int):
    """A conv stem to tokens [1, 16, 8], then ``t + fc2(gelu(fc1(t)))``, a layer scale per channel, a Linear
    without bias and a mean over the tokens."""
    g = _Graph(6)
    stem = g.op("Conv", ["img", _weight(g, 8, 3, 4, 4)], kernel_shape=[4, 4], strides=[4, 4])
    tokens = g.op("Transpose", [g.op("Reshape", [stem, g.const(np.array([1, 8, 16], np.int64), "shape")])],
                  perm=[0, 2, 1])

    def linear(x: str, cin: int, cout: int, bias: bool = True) -> str:
        y = g.op("MatMul", [x, _weight(g, cin, cout)])
        return g.op("Add", [y, g.const((0.1 * g.rng.standard_normal(cout)).astype(np.float32), "b")]) if bias else y

    h = linear(tokens, 8, 32)
    erf = g.op("Erf", [g.op("Div", [h, g.const(np.float32(np.sqrt(2)), "c")])])
    gelu = g.op("Mul", [g.op("Mul", [h, g.op("Add", [erf, g.const(np.float32(1), "c")])]), g.const(np.float32(0.5))])
    mixed = g.op("Add", [tokens, linear(gelu, 32, 8)])
    scaled = g.op("Mul", [mixed, g.const(g.rng.uniform(0.5, 1.5, 8).astype(np.float32), "gamma")])
    out = g.op("Relu", [linear(scaled, 8, 12, bias=False)])
    axes = {"axes": [1]} if opset < 18 else {}
    mean_in = [out] if opset < 18 else [out, g.const(np.array([1], np.int64), "axes")]
    return g.model({"img": [1, 3, 16, 16]}, [g.op("ReduceMean", mean_in, keepdims=0, **axes)], opset=opset)


def _run(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)


def _placed(model: onnx.ModelProto, march: str):
    """The optimized model and its partition's units."""
    profile = get_profile(march)
    optimized = optimize.run(model, profile)
    return optimized, build_partition(optimized, profile, {}).units


def _same_values(optimized: onnx.ModelProto, fm) -> None:
    feed = {"img": np.random.default_rng(7).standard_normal(fm.inputs["img"]).astype(np.float32)}
    for got, want in zip(_run(optimized, feed), _run(fm.model, feed), strict=True):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _assert_one_subgraph_and_the_final_flatten(fm) -> None:
    """On RDK X3 the whole head is one BPU subgraph; only the output's Flatten runs on the CPU; same values."""
    optimized, units = _placed(fm.model, "bernoulli2")
    cpu = [(n.op_type, u.reason) for u in units if u.on == "CPU" for n in u.nodes]
    assert len({u.subgraph for u in units if u.on == "BPU"}) == 1, cpu
    assert [kind for kind, _ in cpu] == ["Flatten"], cpu  # the head's output, flattened at the end
    _same_values(optimized, fm)


@pytest.mark.parametrize("flatten", ["Flatten", "Reshape"])
def test_a_concat_of_pooled_vectors_into_a_linear_is_one_bpu_subgraph_on_x3(flatten: str) -> None:
    fm = _multiscale_head(flatten)
    _assert_one_subgraph_and_the_final_flatten(fm)


@pytest.mark.parametrize("opset", [11, 13, 18])
def test_a_token_mlp_is_one_bpu_subgraph_on_x3(opset: int) -> None:
    fm = _token_mlp(opset)
    optimized, units = _placed(fm.model, "bernoulli2")
    cpu = [(n.op_type, u.reason) for u in units if u.on == "CPU" for n in u.nodes]
    # the mean over the tokens (a GlobalAveragePool of the patch map since hunt 27 D5) ends the model next to the
    # flatten of its output, which may keep it in float
    computing = [u for u in units if not all(n.op_type in (*LAYOUT, "ReduceMean", "GlobalAveragePool")
                                             for n in u.nodes)]
    assert all(u.on == "BPU" for u in computing), cpu
    mlp = {u.subgraph for u in computing if u.nodes[0].op_type != "HzPreprocess" and u.nodes[0].input[0] != "img"}
    assert len(mlp) == 1, cpu  # every Linear, the GELU, the residual Add and the scale in one BPU call
    _same_values(optimized, fm)


@pytest.mark.parametrize("build", [lambda: _multiscale_head("Flatten"), lambda: _token_mlp(13)])
def test_marches_that_take_2d_tensors_keep_the_layers_as_they_are(build) -> None:
    fm = build()
    optimized, units = _placed(fm.model, "bayes-e")
    assert all(u.on == "BPU" for u in units), [(n.op_type, u.reason) for u in units if u.on == "CPU" for n in u.nodes]
    kinds = {n.op_type for n in optimized.graph.node}
    assert "Conv" in kinds and ("Gemm" in kinds or "MatMul" in kinds)  # the Linears stay Linears


def _activated_head(activation: str, order: str):
    """MobileNetV3's classifier: a pooled map flattened, Linear, hard-swish ``h * hardsigmoid(h)`` (or swish
    ``h * sigmoid(h)``; the product's operands in either order), Linear."""
    g = _Graph(9)
    pooled = g.op("GlobalAveragePool", [_relu_conv(g, "img", 3, 16, 3, strides=[2, 2], pads=[1, 1, 1, 1])])
    h = g.gemm(g.op("Flatten", [pooled], axis=1), 16, 24)
    gate = g.op("HardSigmoid", [h], alpha=1 / 6, beta=0.5) if activation == "hardswish" else g.op("Sigmoid", [h])
    return g.model({"img": [1, 3, 16, 16]}, [g.gemm(g.op("Mul", [h, gate] if order == "x_first" else [gate, h]),
                                                     24, 10)])


@pytest.mark.parametrize("activation", ["hardswish", "swish"])
@pytest.mark.parametrize("order", ["x_first", "gate_first"])
def test_a_hard_swish_between_two_linears_after_a_pool_is_one_bpu_subgraph_on_x3(activation: str, order: str) -> None:
    """hunt 35: MobileNetV3 on RDK X3 ran its Flatten, HardSigmoid and Mul on the CPU between two BPU subgraphs
    ('Mul on a 2-D tensor [1, 1024]')."""
    fm = _activated_head(activation, order)
    _assert_one_subgraph_and_the_final_flatten(fm)


def _gelu_head(form: str):
    """A pooled map flattened, Linear, GELU, Linear: the GELU as ``0.5 * h * (1 + erf(h / sqrt(2)))`` (torch's exact
    GELU exported before opset 20), its tanh approximation ``0.5 * h * (1 + tanh(0.798 * (h + 0.0447 * h ** 3)))``, or
    a scaled swish ``h * sigmoid(1.702 * h)``: element-wise regions whose products read the dense layer's output and a
    chain computed from it."""
    g = _Graph(11)
    pooled = g.op("GlobalAveragePool", [_relu_conv(g, "img", 3, 16, 3, strides=[2, 2], pads=[1, 1, 1, 1])])
    h = g.gemm(g.op("Flatten", [pooled], axis=1), 16, 24)

    def scalar(v: float) -> str:
        return g.const(np.array(v, dtype=np.float32))

    if form == "erf":
        gate = g.op("Add", [g.op("Erf", [g.op("Div", [h, scalar(np.sqrt(2.0))])]), scalar(1.0)])
        y = g.op("Mul", [g.op("Mul", [h, gate]), scalar(0.5)])
    elif form == "tanh":
        inner = g.op("Add", [h, g.op("Mul", [g.op("Pow", [h, scalar(3.0)]), scalar(0.044715)])])
        gate = g.op("Add", [g.op("Tanh", [g.op("Mul", [inner, scalar(0.7978846)])]), scalar(1.0)])
        y = g.op("Mul", [g.op("Mul", [scalar(0.5), h]), gate])
    else:
        y = g.op("Mul", [h, g.op("Sigmoid", [g.op("Mul", [h, scalar(1.702)])])])
    return g.model({"img": [1, 3, 16, 16]}, [g.gemm(y, 24, 10)])


@pytest.mark.parametrize("form", ["erf", "tanh", "scaled_swish"])
def test_a_gelu_between_two_linears_after_a_pool_is_one_bpu_subgraph_on_x3(form: str) -> None:
    """hunt 36 D2: on RDK X3 an exact GELU between the two Linears of a pooled head stayed on the CPU (its Div by
    a constant and the product of the dense layer's output with a chain computed from it kept the flatten where it
    was), the second Linear a BPU subgraph of its own."""
    fm = _gelu_head(form)
    _assert_one_subgraph_and_the_final_flatten(fm)


def _scaled_token_mixer():
    """A CAFormer block's shape: a conv stem to tokens [1, 16, 8], ``t * s + fc2(softmax(fc1(layernorm(t))))`` (a
    residual scale per channel), tokens back to the map."""
    g = _Graph(11)
    stem = g.op("Conv", ["img", _weight(g, 8, 3, 4, 4)], kernel_shape=[4, 4], strides=[4, 4])
    tokens = g.op("Transpose", [g.op("Reshape", [stem, g.const(np.array([1, 8, 16], np.int64), "shape")])],
                  perm=[0, 2, 1])
    normed = g.op("LayerNormalization", [tokens, g.const(np.ones(8, np.float32), "gamma"),
                                         g.const(np.zeros(8, np.float32), "beta")], axis=-1)
    fc1 = g.op("Add", [g.op("MatMul", [normed, _weight(g, 8, 8)]), g.const(np.full(8, 0.1, np.float32), "b")])
    fc2 = g.op("Add", [g.op("MatMul", [g.op("Softmax", [fc1], axis=-1), _weight(g, 8, 8)]),
                       g.const(np.full(8, -0.1, np.float32), "b")])
    scaled = g.op("Mul", [tokens, g.const(g.rng.uniform(0.5, 1.5, 8).astype(np.float32), "scale")])
    mixed = g.op("Add", [scaled, fc2])
    back = g.op("Reshape", [g.op("Transpose", [mixed], perm=[0, 2, 1]), g.const(np.array([1, 8, 4, 4], np.int64))])
    return g.model({"img": [1, 3, 16, 16]}, [back], opset=17)


def test_a_residual_scale_of_tokens_beside_a_token_mlp_gives_a_valid_graph_on_x3() -> None:
    """hunt 36 D1: the pass over the tokens' map wrote the scale's Mul as '<tensor>_row', and the pass over tokens
    wrote a Reshape of the same name for the residual Add: two writers of one tensor, a cycle upstream, and the
    checker and makertbin walked it forever (CAFormer, timm caformer_s18, on RDK X3)."""
    fm = _scaled_token_mixer()
    optimized, units = _placed(fm.model, "bernoulli2")
    written = [o for n in optimized.graph.node for o in n.output]
    assert len(written) == len(set(written))
    onnx.checker.check_model(optimized)
    assert any(u.on == "BPU" for u in units)
    from hbtools.runtime.session import fetching_session  # the optimized model holds an HzLayerNorm

    feed = {"img": np.random.default_rng(7).standard_normal(fm.inputs["img"]).astype(np.float32)}
    got = fetching_session(optimized, []).run(None, feed)[0]
    np.testing.assert_allclose(got, _run(fm.model, feed)[0], rtol=1e-4, atol=1e-5)
