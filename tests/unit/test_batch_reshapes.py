"""The optimize stage's batch-free Reshape targets (``hbtools.graph.batch_reshapes``): kept only where a batch of
distinct samples gives each sample's own outputs. Its check passed models that mix samples where its trial
inputs could not show it (hunt 44 D3): integer inputs were all zeros (two identical samples), and outputs all NaN
or holding an inf compared equal."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from hbtools.graph.batch_reshapes import batch_free_reshapes, same_outputs


def _targets(model) -> list[list[int]]:
    inits = {t.name: numpy_helper.to_array(t).tolist() for t in model.graph.initializer}
    return [inits[n.input[1]] for n in model.graph.node if n.op_type == "Reshape"]


def _model(nodes, inputs, inits):
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def _attention_over_rows(first: list) -> list:
    """Rows [L, D] of one sample attending to each other: code written for one sample mixes a batch's rows."""
    return [*first,
            helper.make_node("Transpose", ["rows"], ["cols"], perm=[1, 0]),
            helper.make_node("MatMul", ["rows", "cols"], ["logits"]),
            helper.make_node("Softmax", ["logits"], ["weights"], axis=-1),
            helper.make_node("MatMul", ["weights", "rows"], ["mixed"]),
            helper.make_node("Reshape", ["mixed", "back"], ["y"])]


def test_token_ids_that_attend_across_the_rows_keep_the_batch_of_one() -> None:
    table = numpy_helper.from_array(np.random.default_rng(0).standard_normal((50, 8)).astype(np.float32), "table")
    shapes = [numpy_helper.from_array(np.array(s, np.int64), n) for s, n in (([5, 8], "flat"), ([1, 5, 8], "back"))]
    nodes = _attention_over_rows([helper.make_node("Gather", ["table", "ids"], ["emb"]),
                                  helper.make_node("Reshape", ["emb", "flat"], ["rows"])])
    model = _model(nodes, [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 5])], [table, *shapes])
    batch_free_reshapes(model)
    assert _targets(model) == [[5, 8], [1, 5, 8]]
    assert len(model.graph.initializer) == 3  # nothing added or left behind


def test_rows_that_do_not_mix_take_the_batch_and_leave_no_stale_target() -> None:
    shapes = [numpy_helper.from_array(np.array(s, np.int64), n) for s, n in (([5, 8], "flat"), ([1, 5, 8], "back"))]
    nodes = [helper.make_node("Reshape", ["x", "flat"], ["rows"]), helper.make_node("Relu", ["rows"], ["mixed"]),
             helper.make_node("Reshape", ["mixed", "back"], ["y"])]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 5, 8])], shapes)
    batch_free_reshapes(model)
    assert _targets(model) == [[-1, 8], [-1, 5, 8]]
    read = {i for n in model.graph.node for i in n.input}
    assert all(t.name in read for t in model.graph.initializer)  # the batch-1 targets are gone


def test_outputs_without_finite_values_or_with_an_inf_prove_nothing() -> None:
    nan = np.full((2, 3), np.nan, np.float32)
    assert not same_outputs(nan, nan.copy())
    want = np.array([[1.0, np.inf], [2.0, 3.0]], np.float32)
    assert same_outputs(want.copy(), want)
    assert not same_outputs(np.array([[1.0, np.inf], [9.0, 3.0]], np.float32), want)
    assert not same_outputs(np.array([[1.0, 5.0], [2.0, 3.0]], np.float32), want)
    huge = np.array([[1.0, 2.0], [3.0, 2.4e17]], np.float32)  # one value far larger than the rest hides nothing
    assert not same_outputs(np.array([[1.5, 2.0], [3.0, 2.4e17]], np.float32), huge)


def test_outputs_of_another_size_per_sample_or_scalars_leave_the_model_as_it_is() -> None:
    """A detector with its NMS inside keeps another number of boxes per picture, and a scalar output has no
    samples: the check cannot compare them, and it stopped the optimize stage with a numpy error on them."""
    shapes = [numpy_helper.from_array(np.array(s, np.int64), n) for s, n in (([5, 8], "flat"), ([1, 5, 8], "back"))]
    for last in (helper.make_node("ReduceSum", ["mixed"], ["y"], keepdims=0),  # a scalar
                 helper.make_node("NonZero", ["mixed"], ["y"])):  # as many rows as the sample has positives
        nodes = [helper.make_node("Reshape", ["x", "flat"], ["rows"]), helper.make_node("Relu", ["rows"], ["r"]),
                 helper.make_node("Reshape", ["r", "back"], ["mixed"]), last]
        model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 5, 8])], shapes)
        model.graph.output[0].type.tensor_type.elem_type = TensorProto.INT64 if last.op_type == "NonZero" else \
            TensorProto.FLOAT
        batch_free_reshapes(model)
        assert _targets(model) == [[5, 8], [1, 5, 8]], last.op_type
