"""A border zeroed in place (``f[:, :, 0, :] = 0``) exports as a ScatterND of zeros at constant indices; it ran on
the CPU between two BPU subgraphs (hunt 48 D5). It is a product by a 0/1 mask, which the BPU computes. Other values
written stay a ScatterND: an Add of them stretched the map's grid (a 60 written into a map of +-1 on RDK X3: held-out
error 0.008 -> 0.13; hunt 50 D3)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from builders import _Graph, checked, optimized_agreeing


def _border(value: float) -> onnx.ModelProto:
    g = _Graph(8)
    features = g.op("Relu", [g.conv("x", 3, 8)])
    index = np.stack(np.meshgrid(np.arange(1), np.arange(8), np.arange(1), np.arange(6), indexing="ij"), -1)
    updates = np.full((1, 8, 1, 6), value, np.float32)
    edited = g.op("ScatterND", [features, g.const(index.astype(np.int64), "idx"), g.const(updates, "upd")])
    return g.model({"x": [1, 3, 6, 6]}, [g.conv(edited, 8, 4)]).model


@pytest.mark.parametrize("march", ["bayes-e", "bernoulli2"])
@pytest.mark.parametrize("value", [0.0, 0.5], ids=["zeroed", "set"])
def test_a_row_zeroed_in_place_runs_on_the_bpu(tmp_path: Path, march: str, value: float) -> None:
    model = _border(value)
    x = np.random.default_rng(1).normal(0, 1, (1, 3, 6, 6)).astype(np.float32)
    optimized = optimized_agreeing(model, march, {"x": x}, atol=1e-6)
    assert ("ScatterND" in {n.op_type for n in optimized.graph.node}) == bool(value)
    output = checked(model, march, tmp_path)
    placed = "2 BPU subgraph(s) and 1 CPU node(s)" if value else "1 BPU subgraph(s) and 0 CPU node(s)"
    assert placed in output, output
