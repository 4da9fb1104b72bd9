"""``masked_fill`` with a constant mask (a causal attention's ``Where(mask, fill, scores)``): the Where ran
on the CPU and a fill of -1e9 / -inf / finfo.min set the range of the Softmax input, every score on one grid
step (output cosine 0.66). It is a Mul and an Add with constants, on the BPU, exact in float."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from conformance import convert_featuremaps
from onnx import ModelProto, TensorProto, helper, numpy_helper

from hbtools.metrics import cosine_similarity
from hbtools.runtime import HB_ONNXRuntime
from hbtools.runtime.binfile import read_bin

S, H = 8, 16
F = TensorProto.FLOAT


def _causal_attention(fill: float, softmax: bool = True) -> ModelProto:
    rng = np.random.default_rng(40)
    inits = {"w": (rng.standard_normal((H, H)) / 4).astype(np.float32), "mask": np.triu(np.ones((S, S), bool), 1),
             "fill": np.float32(fill)}
    nodes = [helper.make_node("MatMul", ["x", "w"], ["q"]),
             helper.make_node("Transpose", ["x"], ["xt"], perm=[0, 2, 1]),
             helper.make_node("MatMul", ["q", "xt"], ["s"]), helper.make_node("Where", ["mask", "fill", "s"], ["m"]),
             helper.make_node("Softmax", ["m"], ["p"], axis=-1) if softmax else helper.make_node("Relu", ["m"], ["p"]),
             helper.make_node("MatMul", ["p", "x"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [1, S, H])],
                              [helper.make_tensor_value_info("y", F, [1, S, H])],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def _convert(tmp_path: Path, model: ModelProto) -> tuple[list[dict], list[np.ndarray], list[np.ndarray], list]:
    rng = np.random.default_rng(41)
    samples = [rng.standard_normal((1, S, H)).astype(np.float32) for _ in range(4)]
    convert_featuremaps(tmp_path, model, {"x": samples}, f"1x{S}x{H}", "float32", "m")
    source = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    xs = [{"x": rng.standard_normal((1, S, H)).astype(np.float32)} for _ in range(4)]
    want = [source.run(None, x)[0] for x in xs]
    out = tmp_path / "out"
    optimized = [HB_ONNXRuntime(model_file=str(out / "m_optimized_float_model.onnx")).run(None, x)[0] for x in xs]
    quantized = [HB_ONNXRuntime(model_file=str(out / "m_quantized_model.onnx")).run(None, x)[0] for x in xs]
    return read_bin(out / "m.bin").models[0].partition["cpu_nodes"], want, optimized, quantized


@pytest.mark.parametrize("fill", [-1e9, float("-inf"), float(np.finfo(np.float32).min), 0.5])
def test_a_constant_masked_fill_runs_on_the_bpu_with_the_float_numbers(fill: float, tmp_path: Path) -> None:
    cpu, want, optimized, quantized = _convert(tmp_path, _causal_attention(fill))
    assert not cpu
    for w, o, q in zip(want, optimized, quantized, strict=True):
        assert np.abs(o - w).max() <= 1e-5 * np.abs(w).max()  # the rewrite is exact in float
        assert cosine_similarity(w, q) >= 0.999


def test_an_infinite_fill_not_read_by_a_softmax_stays_a_where_on_the_cpu(tmp_path: Path) -> None:
    """-inf has no place on an integer grid: the Where stays as it was, on the CPU."""
    cpu, want, optimized, _ = _convert(tmp_path, _causal_attention(float("-inf"), softmax=False))
    assert "Where" in [c["type"] for c in cpu]
    for w, o in zip(want, optimized, strict=True):
        np.testing.assert_array_equal(o, w)


def test_cosine_of_outputs_holding_inf_is_nan_without_a_console_warning() -> None:
    """A model output holding -inf (the fill above) makes every cosine of it undefined: the tables show NaN,
    and numpy's 'invalid value encountered' must not reach the console."""
    import warnings

    from hbtools.metrics import cosine_of_products, cosine_similarity

    x = np.array([1.0, -np.inf, 2.0], np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert np.isnan(cosine_similarity(x, x))
        assert np.isnan(cosine_of_products(np.inf, np.inf, np.inf))
