"""Tokens transposed from a channels-first map on RDK X3 (bernoulli2), whose BPU takes 4-D tensors only.

A ViT's patch tokens ``conv(x).flatten(2).transpose(1, 2)`` and a sound-event detector's frames
``y.transpose(1, 2)`` of a 1-D net put the Reshape / Transpose / Squeeze making them, the residual Add and the
mean over the tokens on the CPU, splitting the model into 2-3 BPU subgraphs (hunt 27 D5). Over the map itself the
Linears are 1x1 Convs and the mean a GlobalAveragePool: one BPU subgraph.
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

FLAT = ("Flatten", "Reshape", "Squeeze", "Unsqueeze")


def _placed(model: onnx.ModelProto, march: str) -> tuple[onnx.ModelProto, int, list[str]]:
    """The optimized model, its count of BPU subgraphs and the types of its CPU nodes."""
    profile = get_profile(march)
    optimized = optimize.run(model, profile)
    part = build_partition(optimized, profile, {})
    return optimized, len({u.subgraph for u in part.units if u.on == "BPU"}), \
        [n.op_type for u in part.units if u.on == "CPU" for n in u.nodes]


def _same_outputs(optimized: onnx.ModelProto, model: onnx.ModelProto, inputs: dict[str, list[int]]) -> None:
    rng = np.random.default_rng(11)
    feed = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in inputs.items()}

    def run(m: onnx.ModelProto) -> list[np.ndarray]:
        return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)

    for got, want in zip(run(optimized), run(model), strict=True):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _linear(g: _Graph, x: str, k: int, n: int) -> str:
    """torch's Linear of tokens: a MatMul by the transposed weight and an Add of the bias."""
    w = (g.rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    return g.op("Add", [g.op("MatMul", [x, g.const(w, "w")]), g.const((0.1 * g.rng.standard_normal(n)).astype(
        np.float32), "b")])


def _axes(g: _Graph, op: str, x: str, axes: list[int], opset: int, **attrs) -> str:
    if opset >= (18 if op == "ReduceMean" else 13):
        return g.op(op, [x, g.const(np.array(axes, np.int64), "axes")], **attrs)
    return g.op(op, [x], axes=axes, **attrs)


def _patch_tokens(opset: int, tokens_out: bool = False):
    """Patch conv, tokens by flatten + transpose, a token MLP with a residual and a layer scale, the mean over
    the tokens, a Linear head (and the tokens themselves as an output)."""
    g = _Graph(4)
    patches = g.op("Conv", ["x", g.const((g.rng.standard_normal((8, 3, 4, 4)) / 7).astype(np.float32), "w")],
                   kernel_shape=[4, 4], strides=[4, 4])
    flat = g.op("Reshape", [patches, g.const(np.array([1, 8, -1], np.int64), "shape")])
    t = g.op("Transpose", [flat], perm=[0, 2, 1])
    h = _linear(g, g.op("Relu", [_linear(g, t, 8, 16)]), 16, 8)
    scaled = g.op("Mul", [h, g.const(g.rng.uniform(0.5, 1.5, 8).astype(np.float32), "gamma")])
    t2 = g.op("Add", [t, scaled])
    mean = _axes(g, "ReduceMean", t2, [1], opset, keepdims=0)
    outputs = [g.gemm(mean, 8, 5), *([t2] if tokens_out else [])]
    return g.model({"x": [1, 3, 16, 24]}, outputs, opset=opset)


def _frames(opset: int):
    """A 1-D net with a clip head (adaptive_avg_pool1d, squeeze, Linear) and a per-frame head (transpose to
    [N, T, C], Linear, Sigmoid), as sound-event detectors have."""
    g = _Graph(6)
    w = (g.rng.standard_normal((12, 6, 3)) / 4).astype(np.float32)
    y = g.op("Relu", [g.op("Conv", ["x", g.const(w, "w")], kernel_shape=[3], pads=[1, 1])])
    pooled = g.op("GlobalAveragePool", [y])
    clip = g.gemm(_axes(g, "Squeeze", pooled, [-1], opset), 12, 4)
    frames = g.op("Sigmoid", [_linear(g, g.op("Transpose", [y], perm=[0, 2, 1]), 12, 3)])
    return g.model({"x": [1, 6, 20]}, [clip, frames], opset=opset)


@pytest.mark.parametrize("opset", [13, 18])
def test_patch_tokens_run_over_their_map_on_x3(opset: int) -> None:
    fm = _patch_tokens(opset)
    optimized, subgraphs, cpu = _placed(fm.model, "bernoulli2")
    assert subgraphs == 1 and all(kind in FLAT for kind in cpu) and len(cpu) <= 1, cpu  # the head's flatten
    kinds = [n.op_type for n in optimized.graph.node]
    assert "Transpose" not in kinds and "ReduceMean" not in kinds and "GlobalAveragePool" in kinds
    _same_outputs(optimized, fm.model, fm.inputs)


def test_tokens_leaving_the_bpu_are_transposed_back_once() -> None:
    fm = _patch_tokens(13, tokens_out=True)
    optimized, subgraphs, cpu = _placed(fm.model, "bernoulli2")
    assert subgraphs == 1 and sorted(cpu) == ["Flatten", "Reshape", "Transpose"], cpu
    _same_outputs(optimized, fm.model, fm.inputs)


@pytest.mark.parametrize("opset", [11, 13])
def test_frames_of_a_1d_net_run_over_its_row_on_x3(opset: int) -> None:
    fm = _frames(opset)
    optimized, subgraphs, cpu = _placed(fm.model, "bernoulli2")
    assert subgraphs == 1, cpu
    # the input's Unsqueeze, the clip head's flatten, and the frames written back as tokens for the output
    assert "Conv" not in cpu and "GlobalAveragePool" not in cpu and "Squeeze" not in cpu, cpu
    _same_outputs(optimized, fm.model, fm.inputs)


def test_tokens_of_two_grids_of_one_count_stay_tokens() -> None:
    """Tokens of a 4x6 map and of a 2x12 map (24 each) added: over either map the other's would be misread."""
    g = _Graph(8)
    tokens = []
    for stride in ([4, 4], [8, 2]):
        patches = g.op("Conv", ["x", g.const((g.rng.standard_normal((8, 3, *stride)) / 7).astype(np.float32), "w")],
                       kernel_shape=stride, strides=stride)
        flat = g.op("Reshape", [patches, g.const(np.array([1, 8, -1], np.int64), "shape")])
        tokens.append(_linear(g, g.op("Transpose", [flat], perm=[0, 2, 1]), 8, 8))
    fm = g.model({"x": [1, 3, 16, 24]}, [g.op("Add", tokens)])
    optimized, _, _ = _placed(fm.model, "bernoulli2")
    _same_outputs(optimized, fm.model, fm.inputs)


@pytest.mark.parametrize("build", [_patch_tokens, _frames])
def test_marches_taking_3d_tensors_keep_the_tokens(build) -> None:
    fm = build(13)
    optimized, _, _ = _placed(fm.model, "bayes-e")
    assert "Transpose" in [n.op_type for n in optimized.graph.node]
    assert not [n.name for n in optimized.graph.node if n.op_type == "Conv" and "MatMul" in n.name]


def test_tokens_of_no_map_are_not_transposed_to_one() -> None:
    """A residual Add of patch tokens and of tokens a node without a view form wrote (a Softmax over the
    channels, as attention's output would be) stays on the tokens: turning the latter into a map would add a
    CPU Transpose each way where the Add on the tokens takes none."""
    g = _Graph(9)
    patches = g.op("Conv", ["x", g.const((g.rng.standard_normal((8, 3, 4, 4)) / 7).astype(np.float32), "w")],
                   kernel_shape=[4, 4], strides=[4, 4])
    t = g.op("Transpose", [g.op("Reshape", [patches, g.const(np.array([1, 8, -1], np.int64), "shape")])],
             perm=[0, 2, 1])
    mixed = g.op("Softmax", [_linear(g, t, 8, 8)], axis=-1)
    fm = g.model({"x": [1, 3, 16, 24]}, [_linear(g, g.op("Add", [t, mixed]), 8, 4)])
    optimized, _, _ = _placed(fm.model, "bernoulli2")
    assert not [n.name for n in optimized.graph.node if n.name.endswith("_to_map")]
    _same_outputs(optimized, fm.model, fm.inputs)


@pytest.mark.parametrize("back", ["Reshape", "Unsqueeze"])
def test_tokens_turned_back_into_their_map_are_that_map(back: str) -> None:
    """A token MLP between convs (``t.transpose(1, 2).reshape(N, C, H, W)``, or ``.unsqueeze(2)`` for the frames
    of a row) reads and writes the map: no Transpose or Reshape of the tokens is left."""
    g = _Graph(10)
    if back == "Reshape":
        x = g.conv("x", 3, 8)
        flat = g.op("Reshape", [x, g.const(np.array([1, 8, -1], np.int64), "shape")])
        inputs, shape = {"x": [1, 3, 4, 6]}, np.array([1, 8, 4, 6], np.int64)
    else:
        w = (g.rng.standard_normal((8, 3, 1, 3)) / 4).astype(np.float32)
        row = g.op("Conv", [_axes(g, "Unsqueeze", "x", [2], 13), g.const(w, "w")], kernel_shape=[1, 3],
                   pads=[0, 1, 0, 1])
        flat = _axes(g, "Squeeze", row, [2], 13)
        inputs = {"x": [1, 3, 10]}
    t = g.op("Transpose", [flat], perm=[0, 2, 1])
    h = g.op("Add", [t, _linear(g, g.op("Relu", [_linear(g, t, 8, 16)]), 16, 8)])
    channels_first = g.op("Transpose", [h], perm=[0, 2, 1])
    if back == "Reshape":
        y = g.conv(g.op("Reshape", [channels_first, g.const(shape, "shape")]), 8, 4)
    else:
        y = g.op("Conv", [_axes(g, "Unsqueeze", channels_first, [2], 13),
                          g.const((g.rng.standard_normal((4, 8, 1, 3)) / 4).astype(np.float32), "w")],
                 kernel_shape=[1, 3], pads=[0, 1, 0, 1])
    fm = g.model(inputs, [y])
    optimized, subgraphs, cpu = _placed(fm.model, "bernoulli2")
    assert subgraphs == 1 and cpu == (["Unsqueeze"] if back == "Unsqueeze" else []), cpu
    assert "Transpose" not in [n.op_type for n in optimized.graph.node]
    _same_outputs(optimized, fm.model, fm.inputs)
