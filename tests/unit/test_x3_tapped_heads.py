"""A flattened head vector asked for as an extra graph output on RDK X3 (bernoulli2, 4-D tensors only).

MTCNN's ONet with ``output_nodes: 'conv5; conv6-2'``: the dense layer conv5 (a Gemm over a flattened 3x3 map,
written as a Conv over the map) is a graph output, so its Flatten was left where it was, on the main path; the
PReLU after it then read a 2-D tensor and ran on the CPU between two BPU subgraphs (hunt 30 D1). The graph output
keeps a Flatten of its own (a branch to that output) and the layers after it stay on the map, on the BPU.
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


def _onet_like(tap: str):
    """A conv trunk to a 3x3 map, flattened into a dense layer, PReLU, two heads; ``tap`` names which flattened
    vector is a graph output besides the heads: the dense layer's ('dense'), or the flattened map ('flat')."""
    g = _Graph(3)
    x = g.op("Relu", [g.conv("img", 3, 8, 3, stride=2)])
    x = g.op("MaxPool", [g.op("Relu", [g.conv(x, 8, 16, 3, stride=2)])], kernel_shape=[2, 2], strides=[2, 2])
    flat = g.op("Flatten", [x], axis=1)
    dense = g.gemm(flat, 16 * 3 * 3, 32)
    slope = g.const(g.rng.uniform(0.1, 0.3, 32).astype(np.float32), "slope")
    act = g.op("PRelu", [dense, slope])
    heads = [g.gemm(act, 32, 4), g.gemm(act, 32, 10)]
    return g.model({"img": [1, 3, 24, 24]}, [{"dense": dense, "flat": flat}[tap], *heads])


def _run(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)


@pytest.mark.parametrize("tap", ["dense", "flat"])
def test_a_flattened_vector_as_an_extra_output_keeps_the_head_in_one_bpu_subgraph_on_x3(tap: str) -> None:
    fm = _onet_like(tap)
    profile = get_profile("bernoulli2")
    optimized = optimize.run(fm.model, profile)
    units = build_partition(optimized, profile, {}).units
    cpu = [(n.op_type, n.name, u.reason) for u in units if u.on == "CPU" for n in u.nodes]
    assert len({u.subgraph for u in units if u.on == "BPU"}) == 1, cpu
    # only flattens, each ending a branch to a graph output, are left on the CPU
    assert {kind for kind, _, _ in cpu} == {"Flatten"}, cpu
    outputs = {o.name for o in optimized.graph.output}
    assert all(n.output[0] in outputs for u in units if u.on == "CPU" for n in u.nodes), cpu
    assert [o.name for o in optimized.graph.output] == [o.name for o in fm.model.graph.output]
    feed = {"img": np.random.default_rng(5).standard_normal([1, 3, 24, 24]).astype(np.float32)}
    for got, want in zip(_run(optimized, feed), _run(fm.model, feed), strict=True):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
