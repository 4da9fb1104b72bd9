"""Convs (and dense layers written as 1x1 Convs) with more channels than the BPU takes, on RDK X3 (bernoulli2).

VGG's classifier on RDK X3: fc6 over the flattened 7x7x512 map became a 7x7 Conv, but the 4096-input fc7 and fc8
stayed on the CPU ('Conv with 4096 input / 4096 output channels exceeds ... limit of 2048'), 21 M float MACs a
frame on the board's ARM cores (hunt 30 D4). Split over its input channels (Convs of at most the limit, summed
by Adds) fc7 runs on the BPU; fc8, whose result leaves the BPU, stays whole (its pieces' sum would leave as int8:
the held-out softmax cosine fell from 0.986 to 0.789). A grouped Conv splits into runs of whole groups joined by a
Concat.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from builders import _Graph

from hbtools.march.profiles import get_profile
from hbtools.pipeline import optimize
from hbtools.quant.units import build_partition

X3 = "bernoulli2"


def _limit() -> int:
    return get_profile(X3).rule("Conv").channels


def _vgg_head():
    """A conv trunk to a 4x4 map, flattened into three dense layers with ReLUs: 512 -> wide -> wide -> 10, wide
    a few channels over the limit on both sides."""
    wide = _limit() + 512
    g = _Graph(11)
    x = g.op("Relu", [g.conv("img", 3, 32, 3, stride=2)])
    flat = g.op("Flatten", [x], axis=1)
    h = g.op("Relu", [g.gemm(flat, 32 * 4 * 4, wide)])
    h = g.op("Relu", [g.gemm(h, wide, wide)])
    return g.model({"img": [1, 3, 8, 8]}, [g.gemm(h, wide, 10)])


def _grouped(groups: int, per_group: int, out_per_group: int | None = None):
    """A featuremap through a grouped 3x3 Conv of ``groups`` groups of ``per_group`` input channels (and as many
    outputs unless ``out_per_group`` says), then a 1x1 Conv from all of its outputs down to 8 channels, one to 4."""
    c = groups * per_group
    cout = groups * (out_per_group or per_group)
    g = _Graph(12)
    w = (g.rng.standard_normal((cout, per_group, 3, 3)) / np.sqrt(9 * per_group)).astype(np.float32)
    b = (0.1 * g.rng.standard_normal(cout)).astype(np.float32)
    y = g.op("Relu", [g.op("Conv", ["fm", g.const(w, "w"), g.const(b, "b")], kernel_shape=[3, 3], pads=[1] * 4,
                           group=groups)])
    y = g.op("Relu", [g.conv(y, cout, 8, 1)])
    return g.model({"fm": [1, c, 4, 4]}, [g.conv(y, 8, 4, 1)], featuremap={"fm"})


def _run(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)


def _placed(fm):
    profile = get_profile(X3)
    optimized = optimize.run(fm.model, profile)
    units = build_partition(optimized, profile, {}).units
    name = next(iter(fm.inputs))
    feed = {name: np.random.default_rng(3).standard_normal(fm.inputs[name]).astype(np.float32)}
    for got, want in zip(_run(optimized, feed), _run(fm.model, feed), strict=True):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    return optimized, units


def _input_channels(model: onnx.ModelProto) -> list[int]:
    inits = {t.name: t for t in model.graph.initializer}
    return [int(inits[n.input[1]].dims[1]) * next((a.i for a in n.attribute if a.name == "group"), 1)
            for n in model.graph.node if n.op_type == "Conv"]


def test_dense_layers_wider_than_the_channel_limit_run_on_the_bpu_in_one_subgraph() -> None:
    optimized, units = _placed(_vgg_head())
    cpu = [(n.op_type, n.name, u.reason) for u in units if u.on == "CPU" for n in u.nodes]
    assert len({u.subgraph for u in units if u.on == "BPU"}) == 1, cpu
    # the wide hidden layer runs on the BPU in pieces; the last layer, whose result leaves the BPU, stays whole
    # (as a sum of pieces it would leave as int8) and says so; then the flatten of the classifier's output (the
    # ReLU before the last layer is kept in float next to it)
    last = [(kind, reason) for kind, _, reason in cpu if kind != "Relu"]
    assert [kind for kind, _ in last] == ["Conv", "Flatten"], cpu
    assert f"limit of {_limit()}" in last[0][1] and "result leaves the BPU" in last[0][1], cpu
    inputs = _input_channels(optimized)
    assert sorted(inputs)[-2] <= _limit() < inputs[-1]
    assert sum(1 for n in optimized.graph.node if n.op_type == "Add") == 1


def test_a_grouped_conv_wider_than_the_limit_runs_as_runs_of_whole_groups() -> None:
    optimized, units = _placed(_grouped(groups=_limit() // 2 + 8, per_group=2))
    assert all(u.on == "BPU" for u in units), [(n.name, u.reason) for u in units if u.on == "CPU" for n in u.nodes]
    assert max(_input_channels(optimized)) <= _limit()
    assert "Concat" in {n.op_type for n in optimized.graph.node}


def test_a_conv_whose_single_group_is_too_wide_keeps_its_reason() -> None:
    limit = _limit()
    optimized, units = _placed(_grouped(groups=2, per_group=limit + 8, out_per_group=2))
    reasons = [u.reason for u in units if u.on == "CPU" and any(n.op_type == "Conv" and
                                                                 "group" in {a.name for a in n.attribute}
                                                                 for n in u.nodes)]
    assert reasons and all(f"limit of {limit}" in r for r in reasons), reasons
