"""Maps gated by a one-channel tensor on RDK X3 (bernoulli2).

CBAM's spatial attention ``x * sigmoid(conv7x7(x.mean(1, keepdim=True)))`` sent the Mul of [N, C, H, W] by
[N, 1, H, W] to the CPU ('needs general broadcasting; the BPU of bernoulli2 takes equal shapes, a single-value
operand, a per-channel operand'), and the Sigmoid with it: two BPU subgraphs, the whole map out to the CPU and back
(hunt 27 D3).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from builders import _Graph

from hbtools.march.profiles import get_profile
from hbtools.pipeline import optimize
from hbtools.quant.units import build_partition

C, H, W = 8, 12, 16


def _run(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)


def _placed(model: onnx.ModelProto, march: str, placed: dict[str, str] | None = None):
    """The optimized model, its count of BPU subgraphs and its CPU nodes (name, type, reason)."""
    profile = get_profile(march)
    optimized = optimize.run(model, profile, placed=placed)
    part = build_partition(optimized, profile, {})
    subgraphs = len({u.subgraph for u in part.units if u.on == "BPU"})
    return optimized, subgraphs, [(n.name, n.op_type, u.reason) for u in part.units if u.on == "CPU" for n in u.nodes]


def _same_outputs(optimized: onnx.ModelProto, model: onnx.ModelProto) -> None:
    feed = {"x": np.random.default_rng(5).standard_normal((1, 3, H, W)).astype(np.float32)}
    for got, want in zip(_run(optimized, feed), _run(model, feed), strict=True):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _axes(g: _Graph, op: str, x: str, axes: list[int], opset: int, **attrs) -> str:
    as_input = opset >= (18 if op.startswith("Reduce") and op != "ReduceSum" else 13)
    if as_input:
        return g.op(op, [x, g.const(np.array(axes, np.int64), "axes")], **attrs)
    return g.op(op, [x], axes=axes, **attrs)


def _gate(g: _Graph, x: str, source: str, opset: int) -> str:
    """A [1, 1, H, W] tensor computed from the map ``x`` the way ``source`` says."""
    if source == "conv":
        return g.conv(x, C, 1, k=3)
    if source == "mean":
        return _axes(g, "ReduceMean", x, [1], opset, keepdims=1)
    return g.op("Sigmoid", [g.conv(_axes(g, "ReduceMean", x, [1], opset, keepdims=1), 1, 1, k=7)])  # CBAM


def _gated(source: str = "cbam", op: str = "Mul", gate_first: bool = False, opset: int = 13, expand: bool = False):
    g = _Graph(4)
    x = g.op("Relu", [g.conv("x", 3, C)])
    gate = _gate(g, x, source, opset)
    if expand:  # ``gate.expand_as(x)``
        gate = g.op("Expand", [gate, g.const(np.array([1, C, H, W], np.int64), "shape")])
    gated = g.op(op, [gate, x] if gate_first else [x, gate])
    return g.model({"x": [1, 3, H, W]}, [g.conv(gated, C, 4)], opset=opset)


@pytest.mark.parametrize(("source", "op", "gate_first", "opset"), [
    ("cbam", "Mul", False, 13), ("cbam", "Mul", True, 11), ("cbam", "Mul", False, 18), ("conv", "Mul", False, 13),
    ("mean", "Mul", True, 13), ("conv", "Add", False, 13), ("mean", "Sub", True, 13), ("cbam-expand", "Mul", False, 13),
])
def test_a_one_channel_gate_runs_on_the_bpu_of_x3(source: str, op: str, gate_first: bool, opset: int) -> None:
    expand = source.endswith("-expand")
    fm = _gated(source.removesuffix("-expand"), op, gate_first, opset, expand)
    optimized, subgraphs, cpu = _placed(fm.model, "bernoulli2")
    assert (subgraphs, cpu) == (1, [])
    _same_outputs(optimized, fm.model)
    copies = [n for n in optimized.graph.node if n.name.endswith("_channel_copy")]
    assert len(copies) == 1 and "Expand" not in [n.op_type for n in optimized.graph.node]


def test_bayes_e_broadcasts_the_gate_itself() -> None:
    fm = _gated()
    optimized, subgraphs, cpu = _placed(fm.model, "bayes-e")
    assert (subgraphs, cpu) == (1, [])
    assert not [n for n in optimized.graph.node if n.name.endswith("_channel_copy")]
    gate = next(n for n in optimized.graph.node if n.op_type == "Sigmoid").output[0]
    assert gate in next(n for n in optimized.graph.node if n.op_type == "Mul").input


def test_gates_of_one_tensor_share_one_copy() -> None:
    g = _Graph(6)
    x = g.op("Relu", [g.conv("x", 3, C)])
    gate = _gate(g, x, "cbam", 13)
    y = g.op("Relu", [g.conv(x, C, C)])
    fm = g.model({"x": [1, 3, H, W]}, [g.op("Add", [g.op("Mul", [x, gate]), g.op("Mul", [gate, y])])])
    optimized, subgraphs, cpu = _placed(fm.model, "bernoulli2")
    assert (subgraphs, cpu) == (1, [])
    assert len([n for n in optimized.graph.node if n.name.endswith("_channel_copy")]) == 1
    _same_outputs(optimized, fm.model)


def test_node_info_keeps_a_cpu_gate_as_it_is() -> None:
    fm = _gated()
    mul = fm.node("Mul", 0)
    optimized, _, cpu = _placed(fm.model, "bernoulli2", placed={mul: "CPU"})
    assert not [n for n in optimized.graph.node if n.name.endswith("_channel_copy")]
    assert any(name == mul for name, _, _ in cpu)


def test_a_gate_wider_than_x3s_convs_stays_on_the_cpu() -> None:
    g = _Graph(8)
    x = g.op("Relu", [g.conv("x", 3, 2056)])  # more output channels than the 2048 an X3 Conv takes
    fm = g.model({"x": [1, 3, 4, 4]}, [g.op("Mul", [x, g.op("Sigmoid", [g.conv(x, 2056, 1, k=1)])])])
    optimized, _, cpu = _placed(fm.model, "bernoulli2")
    assert not [n for n in optimized.graph.node if n.name.endswith("_channel_copy")]
    assert any(kind == "Mul" and "general broadcasting" in reason for _, kind, reason in cpu)


def test_a_gated_map_converts_for_x3(tmp_path: Path) -> None:
    """makertbin on RDK X3: the copy is a BPU convolution of weight 1 that keeps its input's scale (an identity on
    the int8 grid), and the quantized model stays close to the float one."""
    from conformance import convert_featuremaps

    from hbtools.runtime import HB_ONNXRuntime

    fm = _gated()
    rng = np.random.default_rng(0)
    samples = [rng.standard_normal((1, 3, H, W)).astype(np.float32) for _ in range(8)]
    convert_featuremaps(tmp_path, fm.model, {"x": samples}, f"1x3x{H}x{W}", "float32", "m", calibration_type="max",
                        march="bernoulli2")
    quantized = onnx.load(next((tmp_path / "out").glob("*_quantized_model.onnx")))
    assert not [n for n in quantized.graph.node if n.op_type in ("Mul", "Sigmoid", "Conv")]
    x = rng.standard_normal((1, 3, H, W)).astype(np.float32)
    want = _run(fm.model, {"x": x})[0]
    got = HB_ONNXRuntime(onnx_model=quantized).run(None, {"x": x})[0]
    cos = float(np.dot(want.ravel(), got.ravel()) / np.linalg.norm(want) / np.linalg.norm(got))
    assert cos >= 0.99, cos
