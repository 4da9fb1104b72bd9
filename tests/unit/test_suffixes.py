"""Rerunning a model from a cut with the values an earlier run left there."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from hbtools.runtime.session import make_session
from hbtools.runtime.suffixes import Suffixes


def _chain() -> onnx.ModelProto:
    nodes = [helper.make_node("Mul", ["x", "a"], ["m"], name="n0"),
             helper.make_node("Relu", ["m"], ["r"], name="n1"),
             helper.make_node("Shape", ["r"], ["s"], name="n2"),  # an int64 value crosses the later cuts
             helper.make_node("Add", ["r", "b"], ["t"], name="n3"),
             helper.make_node("Reshape", ["t", "s"], ["u"], name="n4"),
             helper.make_node("Sigmoid", ["u"], ["y"], name="n5")]
    vi = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 3]) for n in ("x", "a", "b")]
    graph = helper.make_graph(nodes, "chain", vi, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3]),
                                                   helper.make_tensor_value_info("r", TensorProto.FLOAT, [2, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def test_rerun_from_a_cut_matches_a_whole_run() -> None:
    model = _chain()
    whole = make_session(model)
    suffixes = Suffixes(model, ["y", "r"], [2, 3, 5])
    assert suffixes.cuts == [2, 3]  # before n5 the Reshape's output has no static size: not kept
    rng = np.random.default_rng(0)
    feed = {k: rng.normal(size=(2, 3)).astype(np.float32) for k in ("x", "a", "b")}
    earlier = suffixes.run(feed)
    np.testing.assert_array_equal(earlier["y"], whole.run(["y"], feed)[0])
    changed = {**feed, "b": feed["b"] + 1.0}  # read by n3 only
    want = whole.run(["y", "r"], changed)
    for got, expected in zip(suffixes.rerun(3, changed, earlier), want, strict=True):
        np.testing.assert_array_equal(got, expected)
    # From cut 3 on, nothing reads x: a wrong x changes nothing, so the prefix really is not rerun.
    wrong_x = {**changed, "x": np.full((2, 3), 1e6, np.float32)}
    np.testing.assert_array_equal(suffixes.rerun(4, wrong_x, earlier)[0], want[0])
    # A change before the first cut reruns the whole model.
    new_a = {**feed, "a": -feed["a"]}
    for got, expected in zip(suffixes.rerun(0, new_a, earlier), whole.run(["y", "r"], new_a), strict=True):
        np.testing.assert_array_equal(got, expected)


def test_cuts_keep_within_their_byte_budget() -> None:
    """Cut 2 keeps r (24 bytes), cut 3 also s (16 bytes): a 24-byte budget keeps the smaller crossing."""
    assert Suffixes(_chain(), ["y", "r"], [2, 3], budget=24).cuts == [2]
    assert Suffixes(_chain(), ["y", "r"], [2, 3], budget=40).cuts == [2, 3]


def test_cuts_keep_their_sessions_weights_within_the_budget() -> None:
    """Every suffix session holds the weights its nodes read (VGG-19's fully connected layers are in each),
    and any cut makes the whole model a session more: cuts stop where the weights would pass the budget,
    the latest (lightest) first; reruns give the same values either way."""
    from onnx import numpy_helper

    rng = np.random.default_rng(1)
    weights = [rng.normal(size=(64, 64)).astype(np.float32) / 8 for _ in range(4)]  # 16 KiB each
    nodes, x = [], "x"
    for k in range(4):
        nodes += [helper.make_node("MatMul", [x, f"w{k}"], [f"m{k}"], name=f"mm{k}"),
                  helper.make_node("Relu", [f"m{k}"], [f"r{k}"], name=f"relu{k}")]
        x = f"r{k}"
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, [2, 64])],
                              [numpy_helper.from_array(w, f"w{k}") for k, w in enumerate(weights)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    kib = 1 << 14  # one weight
    # the whole model (4 weights) again, then the suffixes from node 6 (1 weight), 4 (2) and 2 (3)
    assert Suffixes(model, [x], [2, 4, 6]).cuts == [2, 4, 6]
    assert Suffixes(model, [x], [2, 4, 6], weight_budget=7 * kib).cuts == [4, 6]
    assert Suffixes(model, [x], [2, 4, 6], weight_budget=4 * kib).cuts == []
    feed = {"x": rng.normal(size=(2, 64)).astype(np.float32)}
    tight = Suffixes(model, [x], [2, 4, 6], weight_budget=5 * kib)
    assert tight.cuts == [6]
    earlier = tight.run(feed)
    np.testing.assert_array_equal(tight.rerun(6, feed, earlier)[0], make_session(model).run([x], feed)[0])


def test_a_rerun_after_every_output_hands_back_the_earlier_values() -> None:
    """A search scoring the tensors a pick reads (DGCNN's TopK over pairwise distances) measures a tensor read
    only after all of them: its cut's suffix makes no output, and running it stopped makertbin with "internal
    error: ... At least one output should be requested" (hunt 20)."""
    model = _chain()
    suffixes = Suffixes(model, ["r"], [3])  # r is made by n1, before the cut
    assert suffixes.cuts == [3]
    rng = np.random.default_rng(1)
    feed = {k: rng.normal(size=(2, 3)).astype(np.float32) for k in ("x", "a", "b")}
    earlier = suffixes.run(feed)
    got = suffixes.rerun(3, {**feed, "b": feed["b"] + 1.0}, earlier)
    np.testing.assert_array_equal(got[0], earlier["r"])
    assert suffixes.session_of(3) is not None
