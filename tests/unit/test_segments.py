"""A model's tensors fetched part by part (``runtime.segments``): the same values as one run, with at
most a budget of them alive at a time; calibration statistics the same either way."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from builders import MODELS, make_project
from onnx import TensorProto, helper, numpy_helper

from hbtools.runtime import segments
from hbtools.runtime.segments import Segments
from hbtools.runtime.session import fetching_session


def _skip_net() -> onnx.ModelProto:
    """Convs with a skip over several of them and a late read of the graph input (values crossing cuts)."""
    rng = np.random.default_rng(2)
    inits, nodes, x = [], [], "x"
    for k in range(6):
        w = f"w{k}"
        inits.append(numpy_helper.from_array((rng.standard_normal((4, 4, 3, 3)) / 6).astype(np.float32), w))
        nodes += [helper.make_node("Conv", [x, w], [f"c{k}"], pads=[1, 1, 1, 1], name=f"conv{k}"),
                  helper.make_node("Relu", [f"c{k}"], [f"r{k}"], name=f"relu{k}")]
        x = f"r{k}"
    nodes += [helper.make_node("Add", [x, "r0"], ["s"], name="skip"),
              helper.make_node("Add", ["s", "x"], ["y"], name="input_again")]
    graph = helper.make_graph(nodes, "skips", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 16, 16])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return onnx.shape_inference.infer_shapes(model)


def test_parts_give_the_values_of_one_run() -> None:
    model = _skip_net()
    wanted = ["x", *[o for n in model.graph.node for o in n.output]]
    feed = {"x": np.random.default_rng(0).standard_normal((1, 4, 16, 16)).astype(np.float32)}
    whole = dict(zip(wanted[1:], fetching_session(model, wanted[1:]).run(wanted[1:], feed), strict=True))
    tensor_bytes = 4 * 16 * 16 * 4
    parted = Segments(model, wanted, budget=3 * tensor_bytes)
    assert not parted.single
    got: dict[str, np.ndarray] = {}
    for part in parted.run(feed):
        assert sum(v.nbytes for t, v in part.items() if t != "x") <= 3 * tensor_bytes
        assert not set(part) & set(got), "each tensor comes once"
        got.update(part)
    assert set(got) == set(wanted)
    np.testing.assert_array_equal(got["x"], feed["x"])
    for t in wanted[1:]:
        np.testing.assert_allclose(got[t], whole[t], rtol=1e-6, atol=1e-6)
    assert Segments(model, wanted).single  # within the default budget: one session, as before


def test_calibration_in_parts_gives_the_same_statistics(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """makertbin with every activation fetched in parts of a few kB gives the same thresholds."""
    from hbtools.pipeline.runner import makertbin
    from hbtools.quant.calibrated import read_calibrated

    grids, single = [], []
    built = Segments.__init__

    def recording(self: Segments, *args: object, **kwargs: object) -> None:
        built(self, *args, **kwargs)
        single.append(self.single)

    monkeypatch.setattr(Segments, "__init__", recording)
    for name, budget in (("whole", None), ("parts", 20_000)):
        if budget is not None:
            monkeypatch.setattr(segments, "SEGMENT_BYTES", budget)
        project = make_project(tmp_path / name, MODELS["resnet_like"](), cal_count=3, calibration_type="max")
        paths = makertbin(project.config_path, "onnx")
        acts = read_calibrated(onnx.load(paths["calibrated"])).activations
        grids.append({t: np.asarray(g.scales, np.float64) for t, g in acts.items()})
    assert single == [True, False], single  # the second statistics pass ran in parts
    assert grids[0].keys() == grids[1].keys() and len(grids[0]) > 5
    for t in grids[0]:
        np.testing.assert_allclose(grids[1][t], grids[0][t], rtol=1e-5, err_msg=t)


def test_the_node_table_compares_tensors_in_groups_within_the_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """makertbin's per-node cosine fetches the compared tensors of both models a group at a time."""
    from hbtools.quant.report import _fetch_groups

    model = _skip_net()
    pairs = {o: (o, None) for n in model.graph.node for o in n.output}
    assert _fetch_groups(model, pairs) == [list(pairs)]  # within the default budget: one run
    per_tensor = 2 * 4 * 16 * 16 * 4  # float and float values of a 1x4x16x16 map
    monkeypatch.setattr(segments, "SEGMENT_BYTES", 3 * per_tensor)
    groups = _fetch_groups(model, pairs)
    assert [t for g in groups for t in g] == list(pairs) and all(len(g) <= 3 for g in groups) and len(groups) > 3
