"""Sessions compute every op on the layout it is written with.

onnxruntime's transpose optimizers push a Transpose through the ops around it as far as the session's graph
allows: a LayerNorm's ReduceMean then sums along a strided axis, in another order, and its values move in the
last bits. The .bin simulator runs float CPU regions as sessions of their own, cut at every Hz op, so the same
ops summed differently there than in the whole quantized model, and hb_verifier strict failed on PP-OCRv6
small rec converted for bernoulli2 (all 748400 outputs off, by up to 0.037).
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from hbtools.runtime.session import make_session


def _tokens_then_layer_norm(channels: int, tokens: int):
    """[1, C, T] -> Transpose -> LayerNorm over C written out (ReduceMean, Sub, Pow, Sqrt, Div, Mul, Add), and a
    residual Add of the transposed tokens: the pattern the transpose optimizers rewrite."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(np.array([2], np.int64), "axis"),
             numpy_helper.from_array(np.array(1e-5, np.float32), "eps"),
             numpy_helper.from_array((1 + 0.1 * rng.standard_normal(channels)).astype(np.float32), "gamma"),
             numpy_helper.from_array((0.1 * rng.standard_normal(channels)).astype(np.float32), "beta")]
    n = helper.make_node
    nodes = [n("Transpose", ["x"], ["t"], perm=[0, 2, 1]),
             n("ReduceMean", ["t", "axis"], ["mean"], keepdims=1), n("Sub", ["t", "mean"], ["centred"]),
             n("Mul", ["centred", "centred"], ["square"]), n("ReduceMean", ["square", "axis"], ["var"], keepdims=1),
             n("Add", ["var", "eps"], ["var_eps"]), n("Sqrt", ["var_eps"], ["std"]),
             n("Div", ["centred", "std"], ["z"]),
             n("Mul", ["z", "gamma"], ["scaled"]), n("Add", ["scaled", "beta"], ["normed"]),
             n("Add", ["t", "other"], ["residual"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, tokens]),
                     helper.make_tensor_value_info("other", TensorProto.FLOAT, [1, tokens, channels])],
        [helper.make_tensor_value_info("normed", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("residual", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("channels, tokens", [(120, 40), (384, 80), (64, 300)])
def test_a_layer_norm_after_a_transpose_sums_as_written(channels: int, tokens: int) -> None:
    model = _tokens_then_layer_norm(channels, tokens)
    rng = np.random.default_rng(1)
    feeds = {"x": (3 * rng.standard_normal((1, channels, tokens)) + 1).astype(np.float32),
             "other": rng.standard_normal((1, tokens, channels)).astype(np.float32)}
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    as_written = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    want = as_written.run(None, feeds)
    got = make_session(model).run(None, feeds)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)


def test_a_requantized_accumulator_is_not_folded_into_its_conv() -> None:
    """A calibrated model requantizes a conv over whole-number levels in float32: Conv (integer weights) -> Add
    (bias levels) -> Mul (multiplier). onnxruntime's ConvAddFusion / ConvMulFusion fold both into the conv's bias
    and weights, which are then no longer whole numbers and sum with other roundings: a calibrated model with zero
    points on RDK X3 left its quantized model by up to 0.37 (hunt 23's face detector)."""
    rng = np.random.default_rng(2)
    w = rng.integers(-127, 128, (64, 64, 3, 3)).astype(np.float32)
    inits = [numpy_helper.from_array(w, "w"),
             numpy_helper.from_array(rng.integers(-5000, 5000, (1, 64, 1, 1)).astype(np.float32), "bias"),
             numpy_helper.from_array(np.full((1, 64, 1, 1), 1 / 3000, np.float32), "m")]
    n = helper.make_node
    nodes = [n("Conv", ["x", "w"], ["acc"], pads=[1, 1, 1, 1]), n("Add", ["acc", "bias"], ["biased"]),
             n("Mul", ["biased", "m"], ["scaled"]), n("Round", ["scaled"], ["levels"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, 16, 16])],
                              [helper.make_tensor_value_info("levels", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    x = rng.integers(-128, 128, (1, 64, 16, 16)).astype(np.float32)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    want = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"]).run(None,
                                                                                                          {"x": x})
    np.testing.assert_array_equal(make_session(model).run(None, {"x": x})[0], want[0])
