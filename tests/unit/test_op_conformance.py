"""Op conformance (issue 13): every op of the list, at opsets 11/13/17/21 where it exists.

Each op group (tests/op_cases.py) goes through ``hb_mapper checker`` and ``makertbin``
(``max`` at every opset, ``default`` at opset 13), its artefacts through HB_ONNXRuntime
and hb_verifier (tests/conformance.py). Every op output must agree with the float model
within quantization error, whether the op went to the BPU or stayed on the CPU; a CPU
op must say why, and nothing may print "internal error".
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conformance import Outcome, convert_and_check
from op_cases import GROUPS, OPSET_LIST, H, _stem

COSINE = 0.98  # op output, quantized vs float model (int8 activations, random held-out image)
# Groups whose every op has a BPU form on bayes-e (pools with auto_pad and dilations, BatchNorm1d after a Gemm)
ALL_ON_BPU = {"conv_family", "pooling"}
# ... but for SegNet's pooling indices, which the BPU does not give: the MaxPool whose Indices a MaxUnpool reads
INDICES_ON_CPU = {"MaxPool", "MaxUnpool"}
SMALL_WORK = "costs more as a BPU call than in float"  # the reason of a small BPU subgraph between CPU nodes

CASES = [(group, opset, "max") for group in GROUPS for opset in OPSET_LIST] + \
    [(group, 13, "default") for group in GROUPS]


def _report(group: str, opset: int, outcome: Outcome, outputs: list[str], producers: dict[str, str]) -> list[str]:
    """One line per op output: its op, where it ran, and its cosine (printed with -s)."""
    cpu = {c["name"]: c["reason"] for c in outcome.cpu}
    lines = []
    for name, cos in zip(outputs, outcome.cosine, strict=True):
        node = producers[name]
        where = f"CPU ({cpu[node]})" if node in cpu else "BPU"
        lines.append(f"  {group}@{opset} {node}: cosine {cos:.5f} on {where}")
    return lines


@pytest.mark.parametrize(("group", "opset", "calibration_type"), CASES,
                         ids=[f"{g}-opset{o}-{c}" for g, o, c in CASES])
def test_op_group(group: str, opset: int, calibration_type: str, tmp_path: Path) -> None:
    fm = GROUPS[group](opset)
    outcome = convert_and_check(fm, tmp_path, calibration_type, checker=calibration_type == "max")
    outputs = [o.name for o in fm.model.graph.output]
    producers = {o: n.name for n in fm.model.graph.node for o in n.output}
    print("\n".join(_report(group, opset, outcome, outputs, producers)))
    assert all(c["reason"] for c in outcome.cpu), f"CPU nodes without a reason: {outcome.cpu}"
    # the test models are small: a conv between the SegNet pool and unpool is less work than a BPU call
    elsewhere = [c for c in outcome.cpu if c["type"] not in INDICES_ON_CPU and SMALL_WORK not in c["reason"]]
    assert group not in ALL_ON_BPU or not elsewhere, f"{group}: nodes on the CPU: {outcome.placement()}"
    low = {producers[o]: round(c, 5) for o, c in zip(outputs, outcome.cosine, strict=True)
           if c < COSINE and not producers[o].startswith("Cast")}  # ArgMax indices (cast) may flip on ties
    assert not low, f"ops whose output is not within quantization error of float: {low}"


def test_dilated_same_average_pool_runs_on_the_cpu_with_its_reason(tmp_path: Path) -> None:
    """onnxruntime pads a dilated AveragePool with auto_pad SAME for the undilated kernel (not as the spec
    says), which no explicit pads express: it stays a float CPU op that says why, and computes what the
    exported model does."""
    g, x = _stem(38)
    out = g.op("AveragePool", [x], kernel_shape=[3, 3], dilations=[2, 2], auto_pad="SAME_UPPER")
    fm = g.model({"data": [1, 3, H, H]}, [out], 19)
    outcome = convert_and_check(fm, tmp_path, "max", checker=False)
    assert [(c["type"], "auto_pad SAME" in c["reason"]) for c in outcome.cpu] == [("AveragePool", True)]
    assert outcome.cosine[0] > 0.999


@pytest.mark.parametrize("op", ["Celu", "Softsign"])
def test_a_unary_function_the_table_computes_runs_on_the_bpu(op: str) -> None:
    """Celu (torch's F.celu) and Softsign went to the CPU on every march while Elu and Selu ran as lookup tables,
    splitting the BPU graph around them (hunt 33 D4)."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    from hbtools.march.profiles import get_profile
    from hbtools.pipeline import optimize
    from hbtools.quant.units import build_partition

    w = numpy_helper.from_array(np.ones((4, 4, 1, 1), np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv1"), helper.make_node(op, ["c"], ["a"], name="act"),
             helper.make_node("Conv", ["a", "w"], ["y"], name="conv2")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], [w])
    model = optimize.run(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8))
    for march in ("bayes-e", "bernoulli2"):
        part = build_partition(model, get_profile(march), {})
        assert {u.main.name: u.on for u in part.units}.get("act") == "BPU", (march, [(u.main.name, u.on, u.reason)
                                                                                    for u in part.units])
