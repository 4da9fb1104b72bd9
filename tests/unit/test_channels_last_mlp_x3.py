"""On RDK X3, a pointwise MLP written channels-last (``x.permute(0, 2, 3, 1)``, Linear, activation, Linear,
``permute(0, 3, 1, 2)``: ConvNeXt's and ConvFormer's 1x1 convolutions) is the same MLP as 1x1 Convs over the map
itself. Viewed as [HW, C, 1, 1] rows, the Reshapes to and from that view ran on the CPU, and the Transposes with
them: 3 BPU subgraphs and 4 CPU nodes for one block (hunt 52 D5)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from builders import _Graph, checked, optimized_agreeing


def _block(tail_reader: str = "Add") -> onnx.ModelProto:
    g = _Graph(4)
    x = g.conv("x", 3, 8)
    tokens = g.op("Transpose", [x], perm=[0, 2, 3, 1])
    w1 = g.const((g.rng.standard_normal((8, 16)) / 3).astype(np.float32), "w1")
    b1 = g.const((0.1 * g.rng.standard_normal(16)).astype(np.float32), "b1")
    w2 = g.const((g.rng.standard_normal((16, 8)) / 4).astype(np.float32), "w2")
    hidden = g.op("Relu", [g.op("Add", [g.op("MatMul", [tokens, w1]), b1])])
    back = g.op("Transpose", [g.op("MatMul", [hidden, w2])], perm=[0, 3, 1, 2])
    return g.model({"x": [1, 3, 6, 6]}, [g.conv(g.op(tail_reader, [x, back]), 8, 4)]).model


def test_a_channels_last_mlp_is_one_bpu_subgraph_on_x3(tmp_path: Path) -> None:
    model = _block()
    x = np.random.default_rng(0).standard_normal((1, 3, 6, 6)).astype(np.float32)
    optimized_agreeing(model, "bernoulli2", {"x": x})
    assert "1 BPU subgraph(s) and 0 CPU node(s)" in checked(model, "bernoulli2", tmp_path)


def test_channels_last_outputs_keep_their_single_transpose(tmp_path: Path) -> None:
    """A channels-last map read by an element-wise op and given out as it is (a detection head's permute):
    the op runs over the map and one Transpose gives the output, as before (no Reshapes)."""
    g = _Graph(4)
    model = g.model({"x": [1, 3, 6, 6]},
                    [g.op("Sigmoid", [g.op("Transpose", [g.conv("x", 3, 8)], perm=[0, 2, 3, 1])])]).model
    x = np.random.default_rng(0).standard_normal((1, 3, 6, 6)).astype(np.float32)
    optimized = optimized_agreeing(model, "bernoulli2", {"x": x})
    assert "Reshape" not in {n.op_type for n in optimized.graph.node}
    assert "1 BPU subgraph(s) and 0 CPU node(s)" in checked(model, "bernoulli2", tmp_path)
