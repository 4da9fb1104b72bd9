"""YOLO heads on bayes-e: Softmax and constant-tensor arithmetic run on the BPU (issue 16).

The YOLOv8 head's DFL Softmax and the YOLOX decode (grid Add, stride Mul) have integer
kernels; the quantized model stays within quantization error of float, the calibrated
model emulates it exactly and hb_verifier finds the ``.bin`` equal to it.
"""

from __future__ import annotations

from pathlib import Path

import arch_builders
import numpy as np
import pytest
from builders import random_sample
from conformance import convert_and_check

from hbtools.runtime import HB_ONNXRuntime

# block -> the op types that must be on the BPU
ON_BPU = {"yolov8_head": ("Softmax",), "yolox_head": ("Add", "Mul")}


@pytest.mark.parametrize("block", sorted(ON_BPU))
def test_head_runs_on_the_bpu_and_calibrated_emulates_it(block: str, tmp_path: Path) -> None:
    fm = arch_builders.BLOCKS[block]()
    outcome = convert_and_check(fm, tmp_path, "max", checker=True)  # includes hb_verifier
    assert min(outcome.cosine) >= 0.99, outcome.cosine
    cpu_types = {c["type"] for c in outcome.cpu}
    assert not cpu_types & set(ON_BPU[block]), outcome.placement()
    assert "runs on the BPU of bayes-e" not in outcome.log and "only scalar constants" not in outcome.log
    rng = np.random.default_rng(7)
    sessions = {k: HB_ONNXRuntime(model_file=str(outcome.project.artefact(k))) for k in ("calibrated", "quantized")}
    for _ in range(3):
        x = {n: random_sample(fm, n, rng) for n in fm.inputs}
        cal, quant = (sessions[k].run(None, x)[0] for k in ("calibrated", "quantized"))
        span = float(np.abs(quant).max())
        np.testing.assert_allclose(cal, quant, rtol=0, atol=1e-6 * span + 1e-12)
