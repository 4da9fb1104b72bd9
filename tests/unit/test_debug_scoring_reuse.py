"""What the debugger's sweeps reuse between runs changes no value.

The switchboard's sessions allocate from one shared onnxruntime arena instead of the
system on every run; that must give exactly what it replaces.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from hbtools.runtime.session import ort_session, release_shared_arena


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
