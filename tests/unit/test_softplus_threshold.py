"""``F.softplus`` as torch's default (dynamo) exporter writes it: ``Where(x > 20, x, Softplus(x))``, with ``beta``
``Where(x * beta > 20, x, Softplus(x * beta) / beta)``. The BPU has no Greater nor Where: on RDK X5 both ran on the
CPU and every softplus cut the BPU graph (3 BPU subgraphs and 6 CPU nodes for two softplus layers). Above a
threshold of 20 softplus(x) is x to float32 rounding, so the optimize stage leaves the branch out; a threshold
where it is not (5) keeps the Where. TorchScript (``dynamo=False``) writes the Softplus without a branch.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conformance import INTERNAL, _cli, bayes_e_placement
from onnx import ModelProto, TensorProto, helper, numpy_helper

from hbtools.graph.bpu_forms.activations import neutral_softplus_threshold
from hbtools.march.profiles import get_profile
from hbtools.pipeline import optimize

F = TensorProto.FLOAT
SHAPE = [1, 3, 8, 8]


def _softplus(nodes: list, inits: list, x: str, tag: str, form: str, beta: float, threshold: float) -> str:
    """Nodes of ``F.softplus(x, beta, threshold)`` in the exporter's ``form``; the output's name.
    ``dynamo``: Greater then Where, as torch 2's default exporter writes it; ``reversed``: the comparison written
    the other way round, ``Where(x <= t, Softplus(x), x)``; ``torchscript``: no branch (``dynamo=False``)."""
    scaled = x
    if beta != 1:
        inits.append(numpy_helper.from_array(np.array(beta, np.float32), f"{tag}_beta"))
        scaled = f"{tag}_scaled"
        nodes.append(helper.make_node("Mul", [x, f"{tag}_beta"], [scaled], name=f"{tag}_mul"))
    nodes.append(helper.make_node("Softplus", [scaled], [f"{tag}_sp"], name=f"{tag}_softplus"))
    branch = f"{tag}_sp"
    if beta != 1:
        branch = f"{tag}_div"
        nodes.append(helper.make_node("Div", [f"{tag}_sp", f"{tag}_beta"], [branch], name=f"{tag}_div"))
    if form == "torchscript":
        return branch
    inits.append(numpy_helper.from_array(np.array(threshold, np.float32), f"{tag}_threshold"))
    if form == "dynamo":
        nodes += [helper.make_node("Greater", [scaled, f"{tag}_threshold"], [f"{tag}_above"], name=f"{tag}_gt"),
                  helper.make_node("Where", [f"{tag}_above", x, branch], [f"{tag}_out"], name=f"{tag}_where")]
    else:
        nodes += [helper.make_node("LessOrEqual", [scaled, f"{tag}_threshold"], [f"{tag}_below"], name=f"{tag}_le"),
                  helper.make_node("Where", [f"{tag}_below", branch, x], [f"{tag}_out"], name=f"{tag}_where")]
    return f"{tag}_out"


def _model(form: str, threshold: float = 20.0, gain: float = 8.0) -> ModelProto:
    """Conv, softplus, Conv, softplus with beta 2, Conv (the hunt's repro net). ``gain`` scales the first Conv so
    that many of its outputs lie above the threshold."""
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array((rng.standard_normal((16, 3, 3, 3)) * gain / 3).astype(np.float32), "w1"),
             numpy_helper.from_array((rng.standard_normal((16, 16, 3, 3)) / 6).astype(np.float32), "w2"),
             numpy_helper.from_array((rng.standard_normal((8, 16, 1, 1)) / 4).astype(np.float32), "w3")]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1])]
    a = _softplus(nodes, inits, "c1", "act1", form, 1.0, threshold)
    nodes.append(helper.make_node("Conv", [a, "w2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]))
    b = _softplus(nodes, inits, "c2", "act2", form, 2.0, threshold)
    nodes.append(helper.make_node("Conv", [b, "w3"], ["y"], name="conv3"))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, SHAPE)],
                              [helper.make_tensor_value_info("y", F, [1, 8, 8, 8])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    model.ir_version = 9
    return model


def _outputs(model: ModelProto, x: np.ndarray, names: list[str] | None = None) -> list[np.ndarray]:
    if names:
        model = onnx.ModelProto.FromString(model.SerializeToString())
        model.graph.output.extend(helper.make_tensor_value_info(n, F, None) for n in names)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})


def _inputs() -> list[np.ndarray]:
    return [np.random.default_rng(seed).standard_normal(SHAPE).astype(np.float32) * (1 + seed) for seed in range(4)]


@pytest.mark.parametrize("form", ["dynamo", "reversed", "torchscript"])
def test_a_softplus_with_torchs_threshold_runs_on_the_bpu_with_the_same_float_numbers(form: str) -> None:
    model = _model(form)
    optimized = optimize.run(model, get_profile("bayes-e"))
    assert bayes_e_placement(optimized) == (1, [])
    ops = [n.op_type for n in optimized.graph.node]
    assert "Where" not in ops and "Greater" not in ops and "LessOrEqual" not in ops and ops.count("Softplus") == 2
    above = 0
    for x in _inputs():
        pre = _outputs(model, x, ["c1", "act2_scaled"])
        above += sum(int((t > 20).sum()) for t in pre[1:])
        (got,) = _outputs(optimized, x)
        np.testing.assert_allclose(got, pre[0], rtol=0, atol=1e-6 * max(1.0, float(np.abs(pre[0]).max())))
    assert above > 100  # the inputs reach the branch the rewrite leaves out


def test_the_checker_puts_a_dynamo_softplus_in_one_bpu_subgraph(tmp_path: Path) -> None:
    """hb_mapper checker on RDK X5: 1 BPU subgraph and no CPU node (it was 3 and 6: the Greaters and Wheres and
    the first Softplus, which fed only them)."""
    onnx.save(_model("dynamo"), str(tmp_path / "softplus.onnx"))
    code, out = _cli(["checker", "--model-type", "onnx", "--model", str(tmp_path / "softplus.onnx"),
                      "--march", "bayes-e"], tmp_path)
    assert code == 0 and INTERNAL not in out, out[-3000:]
    assert "1 BPU subgraph(s) and 0 CPU node(s)" in out, out[-3000:]


def test_a_threshold_where_the_branch_changes_the_value_stays() -> None:
    """Below about 14 ``softplus(t) - t`` is more than float32 rounding of ``t``: torch's branch then returns
    other values than the Softplus, and the Where stays (on the CPU) with the values as they were."""
    model = _model("dynamo", threshold=5.0, gain=2.0)
    optimized = optimize.run(model, get_profile("bayes-e"))
    assert [n.op_type for n in optimized.graph.node].count("Where") == 2
    for x in _inputs():
        np.testing.assert_array_equal(_outputs(optimized, x)[0], _outputs(model, x)[0])


def test_the_neutral_threshold_bound() -> None:
    assert neutral_softplus_threshold(np.float32(20)) and neutral_softplus_threshold(np.float32(14.5))
    assert not neutral_softplus_threshold(np.float32(13.5)) and not neutral_softplus_threshold(np.float32(5))
    assert not neutral_softplus_threshold(np.float32(-20)) and not neutral_softplus_threshold(np.float32(np.inf))
    # the bound itself: softplus(t) in float32 is t at 20, not at 13.5
    for t, same in [(20.0, True), (13.5, False)]:
        value = np.float32(np.log1p(np.exp(-t)) + t)
        assert (value == np.float32(t)) == same
