"""What the debugger's sweeps reuse between runs changes no value.

Each sample's float outputs are prepared once for the cosine against every configuration
(``CosineTo``), and the switchboard's sessions allocate from one shared onnxruntime arena
instead of the system on every run; both must give exactly what they replace.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from hbtools import metrics
from hbtools.metrics import CosineTo, cosine_similarity
from hbtools.runtime.session import ort_session, release_shared_arena


def _same(x: float, y: float) -> bool:
    return x == y or (np.isnan(x) and np.isnan(y))


@pytest.mark.parametrize("chunk", [metrics.CHUNK, 7])  # 7: several pieces, the last one short
def test_cosine_against_a_prepared_reference_is_cosine_similarity_bit_for_bit(monkeypatch, chunk: int) -> None:
    monkeypatch.setattr(metrics, "CHUNK", chunk)
    rng = np.random.default_rng(0)
    cases = [rng.standard_normal((1, 3, 5, 5)).astype(np.float32), rng.standard_normal(40).astype(np.float64),
             rng.integers(-5, 5, (4, 6)).astype(np.int64), np.zeros(9, np.float32),
             np.array([1.0, np.inf, -2.0], np.float32), rng.random(10) > 0.5]
    for a in cases:
        prepared = CosineTo(a)
        others = [(a + rng.standard_normal(a.shape)).astype(a.dtype), np.zeros_like(a), a.copy(),
                  (a * 3).astype(a.dtype), rng.standard_normal(a.size + 2).astype(np.float32)]  # last: longer
        with np.errstate(invalid="ignore"):  # inf . inf - ...: NaN on both sides
            for b in others:
                assert _same(prepared(b), cosine_similarity(a, b)), (a.dtype, a.shape, b.shape)


def _conv_model() -> bytes:
    rng = np.random.default_rng(1)
    w = numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["y"])],
        "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 64, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 64, 64])], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def test_sessions_on_the_shared_arena_compute_the_same_and_give_their_memory_back() -> None:
    model = _conv_model()
    x = {"x": np.random.default_rng(2).standard_normal((1, 3, 64, 64)).astype(np.float32)}
    plain = ort_session(model, threads=1, spinning=False).run(None, x)[0]
    first, second = (ort_session(model, threads=1, spinning=False, shared_arena=True) for _ in range(2))
    kept = first.run(None, x)[0]  # an output allocated from the arena stays valid after release
    for _ in range(3):
        assert np.array_equal(second.run(None, x)[0], plain)
    release_shared_arena()
    assert np.array_equal(kept, plain)
    assert np.array_equal(first.run(None, x)[0], plain)
