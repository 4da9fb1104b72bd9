"""A border zeroed in place (``f[:, :, 0, :] = 0``) exports as a ScatterND of zeros at constant indices; it ran on
the CPU between two BPU subgraphs (hunt 48 D5). It is a product by a 0/1 mask, which the BPU computes. Other values
written stay a ScatterND: an Add of them stretched the map's grid (a 60 written into a map of +-1 on RDK X3: held-out
error 0.008 -> 0.13; hunt 50 D3)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from builders import _Graph
from click.testing import CliRunner

from hbtools.cli.hb_mapper import main
from hbtools.march.profiles import get_profile
from hbtools.pipeline import optimize


def _border(value: float) -> onnx.ModelProto:
    g = _Graph(8)
    features = g.op("Relu", [g.conv("x", 3, 8)])
    index = np.stack(np.meshgrid(np.arange(1), np.arange(8), np.arange(1), np.arange(6), indexing="ij"), -1)
    updates = np.full((1, 8, 1, 6), value, np.float32)
    edited = g.op("ScatterND", [features, g.const(index.astype(np.int64), "idx"), g.const(updates, "upd")])
    return g.model({"x": [1, 3, 6, 6]}, [g.conv(edited, 8, 4)]).model


@pytest.mark.parametrize("march", ["bayes-e", "bernoulli2"])
@pytest.mark.parametrize("value", [0.0, 0.5], ids=["zeroed", "set"])
def test_a_row_zeroed_in_place_runs_on_the_bpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, march: str,
                                                value: float) -> None:
    model = _border(value)
    optimized = optimize.run(model, get_profile(march))
    assert ("ScatterND" in {n.op_type for n in optimized.graph.node}) == bool(value)
    x = np.random.default_rng(1).normal(0, 1, (1, 3, 6, 6)).astype(np.float32)
    want, got = (ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
                 for m in (model, optimized))
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6)
    monkeypatch.chdir(tmp_path)
    onnx.save(model, "model.onnx")
    result = CliRunner().invoke(main, ["checker", "--model-type", "onnx", "--march", march, "--model", "model.onnx"],
                                catch_exceptions=False)
    placed = "2 BPU subgraph(s) and 1 CPU node(s)" if value else "1 BPU subgraph(s) and 0 CPU node(s)"
    assert result.exit_code == 0 and placed in result.output, result.output
