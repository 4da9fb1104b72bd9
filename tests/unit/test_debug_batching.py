"""Work the debugger shares between runs, used only where it changes no number.

Scores computed with stacked samples (``hbtools.debug.batching``) must equal, bit for
bit, those computed one sample at a time; a model whose batch cannot pass (a Reshape
that mixes samples) keeps one sample per run and still gives the right scores. A
configuration scored once on the same samples is not run again.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from builders import MODELS, FloatModel, _Graph
from debug_support import Dumped, convert_with_dump
from onnx import TensorProto, helper, numpy_helper

from hbtools.debug import batching
from hbtools.debug import switchboard as board
from hbtools.debug.data import load_samples
from hbtools.debug.evaluate import scores
from hbtools.debug.model import load_calibrated
from hbtools.graph.batch_reshapes import free_batch
from hbtools.runtime.session import ort_session


def mixing(h: int = 4) -> FloatModel:
    """conv -> Reshape to channels x pixels (drops the batch) -> Transpose -> Reshape back: batches mix."""
    g = _Graph(11)
    c = g.op("Relu", [g.conv("data", 3, 4)])
    flat = g.op("Reshape", [c, g.const(np.array([4, h * h], dtype=np.int64), "s2")])
    t = g.op("Transpose", [flat], perm=[1, 0])
    out = g.conv(g.op("Reshape", [t, g.const(np.array([1, 4, h, h], dtype=np.int64), "s4")]), 4, 2, k=1)
    return g.model({"data": [1, 3, h, h]}, [out])


CASES = {"data_movement": MODELS["data_movement"], "act_matmul": MODELS["act_matmul"], "mixing": mixing}


@pytest.fixture(scope="module", params=sorted(CASES))
def dumped(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Dumped]:
    return request.param, convert_with_dump(tmp_path_factory.mktemp(request.param), CASES[request.param](),
                                            cal_count=5)


def test_stacked_samples_give_the_same_scores(dumped: tuple[str, Dumped], monkeypatch: pytest.MonkeyPatch) -> None:
    name, d = dumped
    monkeypatch.setattr(board, "BATCH_GAIN", float("inf"))  # stack whenever it is exact, however fast
    cm = load_calibrated(d.calibrated)
    samples = load_samples(d.data, cm)
    names = sorted(cm.calibration)
    configs = [frozenset(), frozenset(names), *(frozenset({n}) for n in names)]
    metrics = ["cosine-similarity", "mse", "mre", "sqnr", "chebyshev"]
    stacked = board.Switchboard(cm)
    size = stacked.batch_for(samples)
    if name == "mixing":
        assert size == 1, "a Reshape that mixes samples must keep one sample per run"
    else:
        assert size == 3, "5 samples over 2 workers: batches of 3 and 2"
    single = board.Switchboard(cm)
    single._batchable = False
    assert single.batch_for(samples) == 1
    assert scores(stacked, samples, configs, metrics, "t") == scores(single, samples, configs, metrics, "t")


def test_free_batch_keeps_batch_one_and_lets_the_batch_through() -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 3, 4])
    shapes = {"x": [1, 2, 3, 4], "flat": [1, 24]}
    nodes = [helper.make_node("Reshape", ["x", "s1"], ["flat"]), helper.make_node("Reshape", ["flat", "s2"], ["y"])]
    inits = [numpy_helper.from_array(np.array([1, 24], dtype=np.int64), "s1"),
             numpy_helper.from_array(np.array([1, 6, -1], dtype=np.int64), "s2")]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [helper.make_tensor_value_info("y", 1, None)],
                                                inits), opset_imports=[helper.make_opsetid("", 17)])
    before = onnx.ModelProto()
    before.CopyFrom(model)
    free_batch(model, shapes)
    targets = {t.name: numpy_helper.to_array(t).tolist() for t in model.graph.initializer}
    assert [targets[n.input[1]] for n in model.graph.node] == [[-1, 24], [0, 6, -1]]
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = batching.BATCH_DIM
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((1, 2, 3, 4)).astype(np.float32) for _ in range(3)]
    one = ort_session(before)
    free = ort_session(model)
    np.testing.assert_array_equal(free.run(None, {"x": xs[0]})[0], one.run(None, {"x": xs[0]})[0])
    stacked = free.run(None, {"x": np.concatenate(xs)})[0]
    assert stacked.shape == (3, 6, 4)
    for i, s in enumerate(xs):
        np.testing.assert_array_equal(stacked[i:i + 1], one.run(None, {"x": s})[0])


def test_configurations_scored_before_are_not_run_again(dumped: tuple[str, Dumped]) -> None:
    cm = load_calibrated(dumped[1].calibrated)
    samples = load_samples(dumped[1].data, cm)
    names = sorted(cm.calibration)
    first = [frozenset({n}) for n in names]
    later = [frozenset(names), *first[:2], frozenset(names[:2])]
    fresh = board.Switchboard(cm)
    expected = scores(fresh, samples, later, ["cosine-similarity", "mse"], "t")
    sb = board.Switchboard(cm)
    sb._batchable = False  # one run per sample and configuration: runs count configurations
    scores(sb, samples, first, ["cosine-similarity", "mse"], "t")
    before = sb.runs
    assert scores(sb, samples, later, ["cosine-similarity", "mse"], "t") == expected
    # runs counts float passes too: one per sample and sweep
    assert sb.runs - before == 3 * len(samples), "only the two new configurations run"
    assert scores(sb, samples[:2], first[:1], ["cosine-similarity"], "t")  # other samples: computed afresh
    assert sb.runs - before == 3 * len(samples) + 4
