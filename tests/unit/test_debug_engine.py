"""The debugger's engine: one session whose calibration nodes switch per run.

A configuration "these calibration nodes on, the rest off" must give exactly what the
calibrated model gives with the other calibration nodes deleted, whether the run
skips stages or not; all off is the float model, all on the calibrated model.
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import onnx
import pytest
from builders import MODELS
from debug_support import Dumped, convert_with_dump, two_inputs
from onnx import helper

from hbtools.debug.board import Switchboard
from hbtools.debug.data import load_samples
from hbtools.debug.model import load_calibrated
from hbtools.runtime import HB_ONNXRuntime

CASES = {**{name: build for name, build in MODELS.items()}, "two_inputs": two_inputs}


@pytest.fixture(scope="module", params=sorted(CASES))
def dumped(request, tmp_path_factory: pytest.TempPathFactory) -> Dumped:
    return convert_with_dump(tmp_path_factory.mktemp(request.param), CASES[request.param]())


def without(model: onnx.ModelProto, removed: set[str]) -> onnx.ModelProto:
    """The calibrated model with some calibration nodes deleted (their readers take the float input)."""
    model = copy.deepcopy(model)
    outputs = {o.name for o in model.graph.output}
    bypass = {n.output[0]: n.input[0] for n in model.graph.node if n.name in removed and n.output[0] not in outputs}
    kept = [n if n.name not in removed or n.output[0] not in outputs else
            helper.make_node("Identity", [n.input[0]], [n.output[0]], name=n.name)  # keep the output's name
            for n in model.graph.node if n.name not in removed or n.output[0] in outputs]
    for n in kept:
        n.input[:] = [bypass.get(i, i) for i in n.input]
    del model.graph.node[:]
    model.graph.node.extend(kept)
    return model


def reference(model: onnx.ModelProto, sample: dict) -> list[np.ndarray]:
    return HB_ONNXRuntime(onnx_model=model).run(None, sample)


@pytest.mark.parametrize("max_stages", [1, 16])
def test_configurations_match_the_model_without_the_other_nodes(dumped: Dumped, max_stages: int) -> None:
    cm = load_calibrated(dumped.calibrated)
    samples = load_samples(dumped.data, cm, 2)
    board = Switchboard(cm, max_stages=max_stages)
    if max_stages == 1:
        assert board.stage_count == 1
    rng = np.random.default_rng(0)
    names = sorted(cm.calibration)
    configs = [set(), set(names), *({n} for n in names),
               *(set(rng.choice(names, size=max(1, len(names) // 2), replace=False)) for _ in range(3))]
    for sample in samples:
        cache = board.float_pass(sample)
        for enabled in configs:
            got = board.run(sample, cache, enabled)
            expected = reference(without(cm.model, set(names) - enabled), sample)
            for g, e in zip(got, expected, strict=True):
                np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5, err_msg=f"enabled={sorted(enabled)}")


def test_float_pass_is_the_float_model_and_stages_are_used(dumped: Dumped) -> None:
    cm = load_calibrated(dumped.calibrated)
    sample = load_samples(dumped.data, cm, 1)[0]
    board = Switchboard(cm)
    optimized = Path(str(dumped.calibrated).replace("_calibrated_model", "_optimized_float_model"))
    floats = HB_ONNXRuntime(model_file=optimized).run(None, sample)
    cache = board.float_pass(sample)
    for name, f in zip(cm.outputs, floats, strict=True):
        np.testing.assert_allclose(cache[name], f, rtol=1e-5, atol=1e-6)
    assert board.stage_count > 1, "small models are still cut into stages"


def test_a_late_switch_skips_the_float_prefix(dumped: Dumped) -> None:
    cm = load_calibrated(dumped.calibrated)
    board = Switchboard(cm)
    runs = {c: board.stages_run({c}) for c in cm.calibration}
    assert all(r and r[-1] == board.stage_count - 1 for r in runs.values())
    assert any(r[0] > 0 for r in runs.values()), "some calibration node starts after the first stage"
    assert board.stages_run(set()) == []
