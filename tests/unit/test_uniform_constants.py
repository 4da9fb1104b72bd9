"""``torch.where(x > t, x, torch.zeros_like(x))`` (or ``full_like``): the exporter folds ``zeros_like`` to a constant
of the map's whole shape, and the Where ran on the CPU while its scalar form is one lookup table on the BPU (hunt 48
D3). A constant whose elements are all equal is read as the scalar it is where the other inputs make the output's
shape alone; where the constant makes the shape (it broadcasts the other input up) it stays."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from builders import _Graph, checked, optimized_agreeing, ort_outputs


def _thresholded(fill: float) -> onnx.ModelProto:
    g = _Graph(5)
    features = g.conv("x", 3, 8)
    full = g.const(np.full((1, 8, 6, 6), fill, np.float32), "full")
    mask = g.op("Greater", [features, g.const(np.array(0.2, np.float32), "t")])
    return g.model({"x": [1, 3, 6, 6]}, [g.conv(g.op("Where", [mask, features, full]), 8, 4)]).model


@pytest.mark.parametrize("march", ["bayes-e", "bernoulli2"])
@pytest.mark.parametrize("fill", [0.0, 0.1], ids=["zeros_like", "full_like"])
def test_a_where_with_a_full_constant_of_one_value_runs_on_the_bpu(tmp_path: Path, march: str, fill: float) -> None:
    model = _thresholded(fill)
    x = np.random.default_rng(1).normal(0, 1, (1, 3, 6, 6)).astype(np.float32)
    optimized = optimized_agreeing(model, march, {"x": x})
    assert all(int(np.prod(t.dims)) < 8 * 36 for t in optimized.graph.initializer if t.name.startswith("full"))
    output = checked(model, march, tmp_path)
    assert "1 BPU subgraph(s) and 0 CPU node(s)" in output, output


def test_a_uniform_constant_that_makes_the_output_shape_stays() -> None:
    g = _Graph(6)
    pooled = g.op("GlobalAveragePool", [g.conv("x", 3, 8)])  # [1, 8, 1, 1], broadcast up by the constant
    spread = g.op("Add", [pooled, g.const(np.full((1, 8, 6, 6), 0.5, np.float32), "full")])
    model = g.model({"x": [1, 3, 6, 6]}, [g.conv(spread, 8, 4)]).model
    x = np.random.default_rng(2).normal(0, 1, (1, 3, 6, 6)).astype(np.float32)
    optimized = optimized_agreeing(model, "bayes-e", {"x": x})
    assert ort_outputs(optimized, {"x": x})[0].shape == (1, 4, 6, 6)
