"""GPTQ weight rounding: lower layer output error than nearest rounding, same grid."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from hbtools.graph.graph import GraphView
from hbtools.quant import weight_rounding as wr


def _conv_model(w: np.ndarray, group: int, pads: list[int]):
    c_in = w.shape[1] * group
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c_in, 12, 12])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    conv = helper.make_node("Conv", ["x", "w"], ["y"], name="conv", group=group, pads=pads,
                            kernel_shape=list(w.shape[2:]))
    graph = helper.make_graph([conv], "g", [x], [y], [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8  # what the installed onnxruntime reads
    return model


def _correlated_inputs(rng: np.random.Generator, channels: int, count: int) -> list[np.ndarray]:
    """Inputs whose channels share a common component (as real feature maps do)."""
    common = rng.normal(size=(count, 1, 12, 12))
    return [np.maximum(1.0 + common[k] + 0.2 * rng.normal(size=(channels, 12, 12)), 0)[None].astype(np.float32)
            for k in range(count)]


@pytest.mark.parametrize("group", [1, 8])
def test_gptq_rounding_lowers_layer_output_error(group: int) -> None:
    rng = np.random.default_rng(1)
    w = rng.normal(size=(8, 8 // group, 3, 3)).astype(np.float32)
    model = _conv_model(w, group, [1, 1, 1, 1])
    node = model.graph.node[0]
    assert wr.roundable(node, GraphView(model))
    feeds = [{"x": x} for x in _correlated_inputs(rng, 8, 6)]
    hessian = wr.input_hessians(model, [node], feeds, positions=144)["conv"]
    assert hessian.shape == (group, (8 // group) * 9, (8 // group) * 9)
    thresholds = np.abs(w).reshape(8, -1).max(axis=1).astype(np.float64)
    offsets = wr.rounding_offsets(w, thresholds, group, hessian)
    assert offsets.dtype == np.int8 and offsets.shape == w.shape
    scale = (thresholds / 127).reshape(-1, 1, 1, 1)
    nearest = np.clip(np.round(w / scale), -127, 127)
    chosen = np.clip(nearest + offsets, -127, 127)
    assert np.abs(offsets).max() <= 3, "GPTQ moves weights by a few steps at most"
    # The measured output error of the conv on the data, not only the proxy.
    def out_err(integers: np.ndarray) -> float:
        wq = (integers * scale).astype(np.float32)
        ref_model, q_model = _conv_model(w, group, [1, 1, 1, 1]), _conv_model(wq, group, [1, 1, 1, 1])
        import onnxruntime as ort
        ref = ort.InferenceSession(ref_model.SerializeToString(), providers=["CPUExecutionProvider"])
        got = ort.InferenceSession(q_model.SerializeToString(), providers=["CPUExecutionProvider"])
        return float(np.mean([np.mean((ref.run(None, f)[0] - got.run(None, f)[0]) ** 2) for f in feeds]))

    before, after = out_err(nearest), out_err(chosen)
    assert after < 0.8 * before, f"output MSE {before:.3g} -> {after:.3g}"
    proxy_before = wr.output_error(w, nearest, thresholds, group, hessian)
    proxy_after = wr.output_error(w, chosen, thresholds, group, hessian)
    assert proxy_after < proxy_before


def test_patches_match_a_direct_convolution() -> None:
    """Sampled patches times the weight reproduce the conv output at those positions."""
    rng = np.random.default_rng(2)
    w = rng.normal(size=(4, 2, 3, 3)).astype(np.float32)
    x = rng.normal(size=(4, 9, 9)).astype(np.float32)
    geo = wr.ConvGeometry(group=2, kernel=(3, 3), strides=(2, 2), dilations=(1, 1), pads=(1, 1, 1, 1))
    cols = wr.patches(x, geo, np.random.default_rng(0), positions=10_000)  # all 25 positions, shuffled
    import onnxruntime as ort
    model = _conv_model(w, 2, [1, 1, 1, 1])
    for n in model.graph.node:
        n.attribute.extend([helper.make_attribute("strides", [2, 2])])
    model.graph.input[0].type.tensor_type.shape.dim[2].dim_value = 9
    model.graph.input[0].type.tensor_type.shape.dim[3].dim_value = 9
    y = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x[None]})[0]
    got = np.matmul(w.reshape(2, 2, -1), cols)  # [group, out/group, positions]
    expected = np.sort(y[0].reshape(2, 2, -1), axis=2)
    assert np.allclose(np.sort(got, axis=2), expected, atol=1e-4)
