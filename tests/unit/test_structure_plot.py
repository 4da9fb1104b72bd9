"""hb_perf's structure picture of a model with hundreds of CPU nodes stays a picture a viewer opens."""

from __future__ import annotations

from pathlib import Path

import matplotlib.image
from onnx import TensorProto, helper

from hbtools.runtime.structure import Structure
from hbtools.tools import structure_plot


def _unrolled_recurrence(steps: int) -> tuple:
    """A BPU subgraph, then ``steps`` cells of four CPU nodes each reading the previous state and the
    subgraph's output (the long arrows of an exporter-unrolled LSTM whose state runs on the CPU)."""
    nodes = [helper.make_node("Relu", ["x"], ["features"], name="conv")]
    state = "features"
    for k in range(steps):
        a, b, c, d = (f"s{k}_{j}" for j in range(4))
        nodes += [helper.make_node("Add", [state, "features"], [a], name=a),
                  helper.make_node("Sigmoid", [a], [b], name=b), helper.make_node("Tanh", [a], [c], name=c),
                  helper.make_node("Mul", [b, c], [d], name=d)]
        state = d
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                              [helper.make_tensor_value_info(state, TensorProto.FLOAT, [1, 8])])
    on = ["BPU"] + ["CPU"] * (len(nodes) - 1)
    return helper.make_model(graph), Structure(on, {0: 0}, [[0]])


def test_a_picture_of_hundreds_of_cpu_nodes_is_capped(tmp_path: Path) -> None:
    model, structure = _unrolled_recurrence(150)
    path = structure_plot.draw(model, structure, "m", tmp_path / "m.png")
    picture = matplotlib.image.imread(path)
    height, width = picture.shape[:2]
    assert max(height, width) <= structure_plot.MAX_SIDE
    assert height * width <= structure_plot.MAX_PIXELS * 1.01  # rounding of the figure's inches to pixels
    assert height > 1000  # still a picture of the whole chain


def test_a_small_model_keeps_its_full_resolution(tmp_path: Path) -> None:
    model, structure = _unrolled_recurrence(2)
    picture = matplotlib.image.imread(structure_plot.draw(model, structure, "m", tmp_path / "m.png"))
    boxes, _ = structure_plot.boxes_and_arrows(model, structure, "m")
    assert len(boxes) == 11
    assert picture.shape[0] >= 1000  # nine rows of boxes, about an inch each with the gaps, at 100 px per inch
