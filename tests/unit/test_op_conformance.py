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
from op_cases import GROUPS, OPSET_LIST

COSINE = 0.98  # op output, quantized vs float model (int8 activations, random held-out image)

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
    low = {producers[o]: round(c, 5) for o, c in zip(outputs, outcome.cosine, strict=True)
           if c < COSINE and not producers[o].startswith("Cast")}  # ArgMax indices (cast) may flip on ties
    assert not low, f"ops whose output is not within quantization error of float: {low}"
