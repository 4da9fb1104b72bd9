"""A Gemm with ``transA`` (torch's per-pixel MLP ``fc(f.view(c, h * w).t())``; onnxruntime's fusion writes a
Transpose before a Gemm this way too) ran in float on the CPU ("Gemm with transA has no BPU form") and split the
conv body in two, even where the model had written the Transpose apart (hunt 48 D2). Where the BPU has a 2-D
Transpose (RDK X5) it is a Transpose of the first input and a plain Gemm, both on the BPU."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from builders import _Graph, checked, optimized_agreeing


def _per_pixel_mlp(transposed_apart: bool) -> onnx.ModelProto:
    g = _Graph(3)
    features = g.op("Relu", [g.conv("x", 3, 8)])
    rows = g.op("Reshape", [features, g.const(np.array([8, 36], np.int64), "shape")])
    weight = g.const(np.random.default_rng(1).normal(0, 0.3, (8, 6)).astype(np.float32), "fc_w")
    if transposed_apart:
        mixed = g.op("Gemm", [g.op("Transpose", [rows], perm=[1, 0]), weight])
    else:
        mixed = g.op("Gemm", [rows, weight], transA=1)
    back = g.op("Reshape", [g.op("Relu", [mixed]), g.const(np.array([1, 6, 6, 6], np.int64), "back")])
    return g.model({"x": [1, 3, 6, 6]}, [g.conv(back, 6, 4)]).model


@pytest.mark.parametrize("transposed_apart", [False, True], ids=["transA", "transpose-then-gemm"])
def test_a_gemm_of_a_transposed_input_runs_on_the_bpu_of_rdk_x5(tmp_path: Path, transposed_apart: bool) -> None:
    model = _per_pixel_mlp(transposed_apart)
    x = np.random.default_rng(2).normal(0, 1, (1, 3, 6, 6)).astype(np.float32)
    optimized = optimized_agreeing(model, "bayes-e", {"x": x})
    assert not [n for n in optimized.graph.node if n.op_type == "Gemm" and
                any(a.name == "transA" and a.i for a in n.attribute)]
    output = checked(model, "bayes-e", tmp_path)
    assert "1 BPU subgraph(s) and 0 CPU node(s)" in output, output
