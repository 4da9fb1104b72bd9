"""TorchScript writes ``torch.split`` / ``unbind`` and edits of the list as SplitToSequence, SequenceAt,
SequenceInsert, SequenceErase and ConcatFromSequence; with constant sizes and positions the tensors the sequences
hold are known when the model is built, and the chain is a Split, picks and a Concat. It ran on the CPU between two
BPU subgraphs (hunt 48 D8)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from builders import checked, optimized_agreeing
from onnx import TensorProto, helper, numpy_helper


def _conv(x: str, cin: int, cout: int, name: str, rng: np.random.Generator, inits: list) -> onnx.NodeProto:
    inits.append(numpy_helper.from_array(rng.normal(0, 0.3, (cout, cin, 3, 3)).astype(np.float32), f"{name}_w"))
    return helper.make_node("Conv", [x, f"{name}_w"], [name], pads=[1, 1, 1, 1], name=name)


def _edited_split(form: str) -> onnx.ModelProto:
    rng = np.random.default_rng(2)
    inits = [numpy_helper.from_array(np.array(v, np.int64), k) for k, v in
             {"sizes": [4, 4], "one": 1, "zero": 0, "last": -1}.items()]
    nodes = [_conv("x", 3, 8, "c1", rng, inits)]
    if form == "split-edit":  # a, b = f.split(4, 1); cat([sigmoid(b), a, b][:-1]) written as list edits
        nodes += [helper.make_node("SplitToSequence", ["c1", "sizes"], ["seq"], axis=1),
                  helper.make_node("SequenceAt", ["seq", "one"], ["b"]),
                  helper.make_node("Sigmoid", ["b"], ["gate"]),
                  helper.make_node("SequenceInsert", ["seq", "gate", "zero"], ["seq2"]),
                  helper.make_node("SequenceErase", ["seq2", "last"], ["seq3"]),
                  helper.make_node("ConcatFromSequence", ["seq3"], ["joined"], axis=1)]
        cin = 8
    else:  # torch.stack(f.unbind(1), 1): pieces of one channel without the axis, stacked back
        nodes += [helper.make_node("SplitToSequence", ["c1"], ["seq"], axis=1, keepdims=0),
                  helper.make_node("SequenceErase", ["seq", "zero"], ["rest"]),
                  helper.make_node("ConcatFromSequence", ["rest"], ["joined"], axis=1, new_axis=1)]
        cin = 7
    nodes.append(_conv("joined", cin, 4, "c2", rng, inits))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("c2", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("form", ["split-edit", "unbind-stack"])
def test_sequences_of_constant_sizes_and_positions_run_on_the_bpu(tmp_path: Path, form: str) -> None:
    model = _edited_split(form)
    x = np.random.default_rng(3).normal(0, 1, (1, 3, 8, 8)).astype(np.float32)
    optimized = optimized_agreeing(model, "bayes-e", {"x": x})
    assert not [n.op_type for n in optimized.graph.node if "Sequence" in n.op_type]
    output = checked(model, "bayes-e", tmp_path)
    assert "1 BPU subgraph(s) and 0 CPU node(s)" in output, output
