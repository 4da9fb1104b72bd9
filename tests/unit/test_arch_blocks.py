"""Architecture blocks of real model families, converted end to end (issue 13).

Two of them reproduce the structure (not the weights) of models that used to stop
with an internal error: a MobileNetV3 block exported at opset 15 (unfolded
BatchNormalization, the HardSwish function op, an SE gate [N, C, 1, 1] times
[N, C, H, W]) and a YOLOX decoupled head (one tensor read by two MaxPools, which
emitted the same integer-to-float Cast twice). A third is a CRNN that onnxruntime's
``quantize_dynamic`` already quantized: its com.microsoft ops leave the output without an
inferable shape, and the optimized model failed the ONNX checker.
"""

from __future__ import annotations

from pathlib import Path

import arch_builders
import pytest
from conformance import convert_and_check

COSINE = 0.99  # quantized vs float model, every output, random held-out image

BLOCKS = sorted(arch_builders.BLOCKS)


@pytest.mark.parametrize("calibration_type", ["max", "default"])
@pytest.mark.parametrize("block", BLOCKS)
def test_block_converts(block: str, calibration_type: str, tmp_path: Path) -> None:
    fm = arch_builders.BLOCKS[block]()
    outcome = convert_and_check(fm, tmp_path, calibration_type, checker=calibration_type == "max")
    print(f"{block} ({calibration_type}): cosine {[round(c, 5) for c in outcome.cosine]}; {outcome.placement()}")
    assert min(outcome.cosine) >= COSINE, f"quantized vs float cosine {outcome.cosine} < {COSINE}"
    assert outcome.bpu_nodes, "nothing went to the BPU"
