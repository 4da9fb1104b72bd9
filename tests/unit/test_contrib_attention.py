"""onnxruntime's fused transformer ops (com.microsoft Attention, MultiHeadAttention, EmbedLayerNormalization,
the RMS norms) written as standard ops: each rewrite computes what onnxruntime's own
kernel computes, and a BERT-style attention converts with the attention on the BPU. They all ran on the CPU."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from conformance import convert_featuremaps
from onnx import ModelProto, TensorProto, helper, numpy_helper

from hbtools.graph.contrib import expand_contrib_ops, is_ort_op
from hbtools.metrics import cosine_similarity
from hbtools.runtime import HB_ONNXRuntime
from hbtools.runtime.binfile import read_bin

MS = "com.microsoft"
F, I32 = TensorProto.FLOAT, TensorProto.INT32
S, H, HEADS = 8, 16, 2


def _model(nodes, inputs, outputs, inits, opset: int = 13) -> ModelProto:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                              [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
                              [numpy_helper.from_array(v, n) for n, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(MS, 1)])
    model.ir_version = 8
    return model


def _run(model: ModelProto, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)


def _rewritten_agrees(model: ModelProto, feed: dict[str, np.ndarray]) -> ModelProto:
    """The rewrite leaves no contrib op and gives onnxruntime's numbers up to float32 rounding."""
    rewritten = copy.deepcopy(model)
    assert expand_contrib_ops(rewritten) == sum(is_ort_op(n) for n in model.graph.node)
    assert not [n.op_type for n in rewritten.graph.node if is_ort_op(n)]
    for want, got in zip(_run(model, feed), _run(rewritten, feed), strict=True):
        assert want.shape == got.shape and want.dtype == got.dtype
        assert np.abs(want.astype(np.float64) - got).max() <= 1e-5 * max(1.0, np.abs(want).max())
    return rewritten


def _weights(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)


def _attention(unidirectional: int = 0, with_bias: bool = False) -> ModelProto:
    rng = np.random.default_rng(30)
    inits = {"w": _weights(rng, H, 3 * H), "b": (0.1 * rng.standard_normal(3 * H)).astype(np.float32),
             "ab": (0.5 * rng.standard_normal((1, HEADS, S, S))).astype(np.float32)}
    ins = ["x", "w", "b", "", "", "ab"] if with_bias else ["x", "w", "b"]
    nodes = [helper.make_node("Attention", ins, ["a"], domain=MS, num_heads=HEADS, unidirectional=unidirectional),
             helper.make_node("Add", ["a", "x"], ["y"])]
    return _model(nodes, [("x", F, [1, S, H])], [("y", F, [1, S, H])], inits)


@pytest.mark.parametrize(("unidirectional", "with_bias"), [(0, False), (1, False), (0, True)])
def test_attention_is_written_as_standard_ops(unidirectional: int, with_bias: bool) -> None:
    x = np.random.default_rng(31).standard_normal((1, S, H)).astype(np.float32)
    _rewritten_agrees(_attention(unidirectional, with_bias), {"x": x})


@pytest.mark.parametrize("mask_shape", [[2], [2, S], [2, S, S]])
def test_attention_with_a_padding_mask_is_written_as_standard_ops(mask_shape: list[int]) -> None:
    """A 0 / 1 mask of keys (per query), or each sequence's end position (EmbedLayerNormalization's mask_index
    output, in BERT models onnxruntime's optimizer saved)."""
    model = _attention()
    model.graph.node[0].input.append("mask")
    model.graph.input.append(helper.make_tensor_value_info("mask", I32, mask_shape))
    for v in (*model.graph.input[:1], *model.graph.output):
        v.type.tensor_type.shape.dim[0].dim_value = 2
    rng = np.random.default_rng(37)
    mask = (rng.random(mask_shape) > 0.3).astype(np.int32)
    mask[..., 0] = 1
    if len(mask_shape) == 1:
        mask = np.array([S, 5], np.int32)
    _rewritten_agrees(model, {"x": rng.standard_normal((2, S, H)).astype(np.float32), "mask": mask})


def test_attention_converts_with_the_attention_on_the_bpu(tmp_path: Path) -> None:
    model = _attention()
    rng = np.random.default_rng(32)
    samples = [rng.standard_normal((1, S, H)).astype(np.float32) for _ in range(4)]
    out = convert_featuremaps(tmp_path, model, {"x": samples}, f"1x{S}x{H}", "float32", "m")
    assert "onnxruntime contrib ops" in out
    assert not read_bin(tmp_path / "out" / "m.bin").models[0].partition["cpu_nodes"]
    x = {"x": rng.standard_normal((1, S, H)).astype(np.float32)}
    got = HB_ONNXRuntime(model_file=str(tmp_path / "out" / "m_quantized_model.onnx")).run(None, x)[0]
    assert cosine_similarity(_run(model, x)[0], got) >= 0.99


def test_an_attention_with_start_and_end_positions_stays_on_the_cpu_and_says_why(tmp_path: Path) -> None:
    """mask_index as the end and start positions of each sequence ([2 * batch]) is not written: the node stays
    onnxruntime's, and the CPU node table gives the reason."""
    model = _attention()
    model.graph.node[0].input.append("mask")
    model.graph.input.append(helper.make_tensor_value_info("mask", I32, [2]))
    rng = np.random.default_rng(33)
    samples = {"x": [rng.standard_normal((1, S, H)).astype(np.float32) for _ in range(4)],
               "mask": [np.array([S, 0], np.int32) for _ in range(4)]}
    out = convert_featuremaps(tmp_path, model, samples, f"1x{S}x{H};2", "float32", "m")
    cpu = read_bin(tmp_path / "out" / "m.bin").models[0].partition["cpu_nodes"]
    reason = ("com.microsoft Attention is kept as onnxruntime's op: it takes a padding mask (mask_index) other than "
              "a raw [batch, keys] or [batch, queries, keys] mask or the end positions [batch]")
    assert [c["reason"] for c in cpu if c["type"] == "Attention"] == [reason]
    assert reason in out


@pytest.mark.parametrize("unidirectional", [0, 1])
def test_multi_head_attention_is_written_as_standard_ops(unidirectional: int) -> None:
    rng = np.random.default_rng(34)
    inits = {"bias": (0.1 * rng.standard_normal(3 * H)).astype(np.float32),
             "ab": (0.5 * rng.standard_normal((1, HEADS, S, S))).astype(np.float32)}
    nodes = [helper.make_node("MultiHeadAttention", ["q", "k", "v", "bias", "", "ab"], ["y"], domain=MS,
                              num_heads=HEADS, unidirectional=unidirectional, scale=0.3)]
    model = _model(nodes, [(n, F, [1, S, H]) for n in "qkv"], [("y", F, [1, S, H])], inits)
    _rewritten_agrees(model, {n: rng.standard_normal((1, S, H)).astype(np.float32) for n in "qkv"})


def test_embed_layer_norm_is_written_as_standard_ops() -> None:
    rng = np.random.default_rng(35)
    inits = {"word": rng.standard_normal((30, H)).astype(np.float32),
             "pos": rng.standard_normal((16, H)).astype(np.float32),
             "seg": rng.standard_normal((2, H)).astype(np.float32),
             "g": (1 + 0.1 * rng.standard_normal(H)).astype(np.float32),
             "b": (0.1 * rng.standard_normal(H)).astype(np.float32)}
    node = helper.make_node("EmbedLayerNormalization", ["ids", "segs", "word", "pos", "seg", "g", "b", "mask"],
                            ["y", "count", "sum"], domain=MS, epsilon=1e-5)
    model = _model([node], [("ids", I32, [2, S]), ("segs", I32, [2, S]), ("mask", I32, [2, S])],
                   [("y", F, [2, S, H]), ("count", I32, [2]), ("sum", F, [2, S, H])], inits)
    mask = np.ones((2, S), np.int32)
    mask[1, 5:] = 0
    _rewritten_agrees(model, {"ids": rng.integers(0, 30, (2, S)).astype(np.int32),
                              "segs": rng.integers(0, 2, (2, S)).astype(np.int32), "mask": mask})


@pytest.mark.parametrize("opset", [13, 18])
def test_rms_norms_are_written_as_standard_ops(opset: int) -> None:
    rng = np.random.default_rng(36)
    inits = {"g": (1 + 0.1 * rng.standard_normal(H)).astype(np.float32),
             "bias": (0.1 * rng.standard_normal(H)).astype(np.float32)}
    nodes = [helper.make_node("SimplifiedLayerNormalization", ["x", "g"], ["r"], domain="", epsilon=1e-5, axis=-1),
             helper.make_node("SkipSimplifiedLayerNormalization", ["r", "x", "g", "bias"], ["s", "", "", "sum"],
                              domain=MS, epsilon=1e-5),
             helper.make_node("Add", ["s", "sum"], ["y"])]
    model = _model(nodes, [("x", F, [1, S, H])], [("y", F, [1, S, H])], inits, opset)
    _rewritten_agrees(model, {"x": rng.standard_normal((1, S, H)).astype(np.float32)})


def test_onnxruntimes_rms_norm_in_the_onnx_domain_converts_on_the_bpu(tmp_path: Path) -> None:
    """onnxruntime registers SimplifiedLayerNormalization in the ONNX domain, where no opset defines it:
    makertbin refused it ('Not support layer ... not an ONNX op at opset 13'). It is written as standard ops."""
    rng = np.random.default_rng(38)
    inits = {"w": _weights(rng, H, H), "g": (1 + 0.1 * rng.standard_normal(H)).astype(np.float32)}
    nodes = [helper.make_node("MatMul", ["x", "w"], ["a"]),
             helper.make_node("SimplifiedLayerNormalization", ["a", "g"], ["y"], epsilon=1e-5)]
    model = _model(nodes, [("x", F, [1, S, H])], [("y", F, [1, S, H])], inits)
    samples = [rng.standard_normal((1, S, H)).astype(np.float32) for _ in range(4)]
    convert_featuremaps(tmp_path, model, {"x": samples}, f"1x{S}x{H}", "float32", "m")
    assert not read_bin(tmp_path / "out" / "m.bin").models[0].partition["cpu_nodes"]
    x = {"x": rng.standard_normal((1, S, H)).astype(np.float32)}
    got = HB_ONNXRuntime(model_file=str(tmp_path / "out" / "m_quantized_model.onnx")).run(None, x)[0]
    assert cosine_similarity(_run(model, x)[0], got) >= 0.99


def test_gpu_only_bias_add_and_bias_split_gelu_are_written_as_standard_ops() -> None:
    """BiasAdd and BiasSplitGelu (diffusion UNets) have no onnxruntime CPU kernel: a model with them stopped with
    'internal error: NotImplemented'. Written as standard ops, checked against their definitions in numpy."""
    import math

    rng = np.random.default_rng(39)
    inits = {"b": (0.1 * rng.standard_normal(H)).astype(np.float32),
             "b2": (0.1 * rng.standard_normal(2 * H)).astype(np.float32)}
    nodes = [helper.make_node("BiasAdd", ["x", "b", "s"], ["t"], domain=MS),
             helper.make_node("Concat", ["t", "s"], ["c"], axis=-1),
             helper.make_node("BiasSplitGelu", ["c", "b2"], ["y"], domain=MS)]
    model = _model(nodes, [("x", F, [1, S, H]), ("s", F, [1, S, H])], [("y", F, [1, S, H])], inits)
    assert expand_contrib_ops(model) == 2 and not [n for n in model.graph.node if is_ort_op(n)]
    x, s = (rng.standard_normal((1, S, H)).astype(np.float64) for _ in range(2))
    c = np.concatenate([x + inits["b"] + s, s], axis=-1) + inits["b2"]
    gate = c[..., H:]
    want = c[..., :H] * 0.5 * gate * (1 + np.vectorize(math.erf)(gate / math.sqrt(2)))
    got = _run(model, {"x": x.astype(np.float32), "s": s.astype(np.float32)})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_contrib_op_without_a_cpu_kernel_is_one_error_line(tmp_path: Path) -> None:
    """com.microsoft GroupNorm (GPU only, not rewritten): 'internal error: NotImplemented ...' before; now the
    ERROR names the node and says to export the model without it."""
    import onnx
    from conformance import INTERNAL, _cli

    inits = {"g": np.ones(4, np.float32), "b": np.zeros(4, np.float32)}
    nodes = [helper.make_node("GroupNorm", ["x", "g", "b"], ["y"], domain=MS, name="gn", epsilon=1e-5, groups=2,
                              activation=0)]
    onnx.save(_model(nodes, [("x", F, [1, 4, 4, 4])], [("y", F, [1, 4, 4, 4])], inits), tmp_path / "m.onnx")
    code, out = _cli(["checker", "--model-type", "onnx", "--march", "bayes-e", "--model", str(tmp_path / "m.onnx")],
                     tmp_path)
    assert code != 0 and INTERNAL not in out, out[-2000:]
    assert "ERROR node 'gn' is GroupNorm (version 1), which onnxruntime has no CPU kernel for" in out


@pytest.mark.parametrize(("layout", "interleaved", "rotary", "positions"), [
    ("bsd", 0, 0, "ids"), ("bsd", 1, 0, "offset"), ("bnsh", 0, 4, "ids"), ("bnsh", 1, 0, "ids")])
def test_rotary_embedding_with_constant_positions_is_written_as_standard_ops(layout: str, interleaved: int,
                                                                             rotary: int, positions: str) -> None:
    rng = np.random.default_rng(40)
    size, half = 8, (rotary or 8) // 2
    angles = np.arange(32)[:, None] * (1.0 / 100 ** (np.arange(half) / half))[None]
    inits = {"pos": (np.array([3], np.int64) if positions == "offset" else
                     rng.integers(0, 32, (2, S)).astype(np.int64)),
             "cos": np.cos(angles).astype(np.float32), "sin": np.sin(angles).astype(np.float32)}
    shape = [2, S, HEADS * size] if layout == "bsd" else [2, HEADS, S, size]
    attrs = {"interleaved": interleaved, **({"rotary_embedding_dim": rotary, "num_heads": HEADS} if rotary else {}),
             **({"num_heads": HEADS} if layout == "bsd" else {})}
    node = helper.make_node("RotaryEmbedding", ["x", "pos", "cos", "sin"], ["y"], domain=MS, **attrs)
    model = _model([node], [("x", F, shape)], [("y", F, shape)], inits)
    _rewritten_agrees(model, {"x": rng.standard_normal(shape).astype(np.float32)})


def test_the_layers_after_a_kept_attention_have_shapes_and_run_on_the_bpu(tmp_path: Path) -> None:
    """A MultiHeadAttention with a key padding mask stays onnxruntime's. Its output had no shape, so the
    LayerNormalization after it was not made one HzLayerNorm and went to the CPU ('a scale or bias computed
    at run time'). The kept op's output now has the shape onnxruntime gives it."""
    rng = np.random.default_rng(41)
    inits = {"w": _weights(rng, H, H), "g": (1 + 0.1 * rng.standard_normal(H)).astype(np.float32),
             "b": (0.1 * rng.standard_normal(H)).astype(np.float32)}
    nodes = [helper.make_node("MatMul", ["x", "w"], ["q"]),
             helper.make_node("MultiHeadAttention", ["q", "x", "x", "", "mask"], ["a"], domain=MS, num_heads=HEADS),
             helper.make_node("MatMul", ["a", "w"], ["m"]),
             helper.make_node("LayerNormalization", ["m", "g", "b"], ["n"], axis=-1, epsilon=1e-5),
             helper.make_node("Add", ["n", "x"], ["y"])]
    model = _model(nodes, [("x", F, [1, S, H]), ("mask", I32, [1, S])], [("y", F, [1, S, H])], inits, opset=17)
    samples = {"x": [rng.standard_normal((1, S, H)).astype(np.float32) for _ in range(4)],
               "mask": [np.ones((1, S), np.int32) for _ in range(4)]}
    out = convert_featuremaps(tmp_path, model, samples, f"1x{S}x{H};1x{S}", "float32", "m")
    assert "1 layer normalizations written as one HzLayerNorm node each" in out
    cpu = read_bin(tmp_path / "out" / "m.bin").models[0].partition["cpu_nodes"]
    assert [c["type"] for c in cpu] == ["MultiHeadAttention"]
    x = {"x": rng.standard_normal((1, S, H)).astype(np.float32), "mask": np.ones((1, S), np.int32)}
    got = HB_ONNXRuntime(model_file=str(tmp_path / "out" / "m_quantized_model.onnx")).run(None, x)[0]
    assert cosine_similarity(_run(model, x)[0], got) >= 0.99


def test_a_layer_norm_after_an_op_onnx_cannot_shape_runs_on_the_bpu(tmp_path: Path) -> None:
    """After a contrib op without a shape rule, a LayerNormalization with constant scale and bias went to the
    CPU ('with a scale or bias computed at run time', later 'of a tensor of unknown shape'): shape inference
    lost every shape after the op. The op's output now gets the shape onnxruntime gives it."""
    import onnx
    from conformance import _cli

    inits = {"g": np.ones(4, np.float32), "b": np.zeros(4, np.float32), "axis": np.array(0, np.int32)}
    nodes = [helper.make_node("ExpandDims", ["x", "axis"], ["e"], domain=MS),
             helper.make_node("LayerNormalization", ["e", "g", "b"], ["y"], axis=-1)]
    model = _model(nodes, [("x", F, [2, 4, 4])], [("y", F, [1, 2, 4, 4])], inits, opset=17)
    onnx.save(model, tmp_path / "m.onnx")
    code, out = _cli(["checker", "--model-type", "onnx", "--march", "bayes-e", "--model", str(tmp_path / "m.onnx")],
                     tmp_path)
    assert code == 0, out[-2000:]
    rows = [line.split() for line in out.splitlines() if "LayerNormalization" in line and " BPU " in line]
    assert rows, out[-3000:]
