"""A Softmax output's grid reaches beyond the calibration samples' largest probability (twice it, up to 1): the
attention of another picture peaks higher, and a grid ending at the calibration peak clipped it (a MobileViT's
attention 0.436 where the grid ended at 0.153: held-out cosine 0.978 minimum). A clipping method (kl,
max-percentile) never cuts a Softmax output below its calibration max (hunt 52 D1)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from builders import FloatModel, _Graph, held_out, make_project, ort_outputs


def _attention_like() -> FloatModel:
    """Probabilities over 64 positions of a map, as an attention row or a soft-argmax takes them."""
    g = _Graph(4)
    scores = g.op("Reshape", [g.conv("x", 4, 1, k=1), g.const(np.array([1, 64], np.int64), "shape")])
    return FloatModel(g.model({"x": [1, 4, 8, 8]}, [g.op("Softmax", [scores], axis=1)]).model, {"x": [1, 4, 8, 8]},
                      {"x"})


@pytest.mark.parametrize("calibration_type", ["max", "kl"])
def test_peaks_beyond_the_calibration_samples_are_not_clipped(tmp_path: Path, calibration_type: str) -> None:
    from hbtools.pipeline.runner import makertbin
    from horizon_tc_ui import HB_ONNXRuntime

    fm = _attention_like()
    project = make_project(tmp_path, fm, march="bayes-e", cal_count=6, calibration_type=calibration_type)
    paths = makertbin(project.config_path, "onnx")
    quantized = HB_ONNXRuntime(model_file=str(paths["quantized"]))
    calibration_peak = max(float(ort_outputs(fm.model, {"x": x})[0].max()) for x in held_out(fm, 6, seed=10))
    for x in held_out(fm, 6):
        # The same values at the same places, but one position standing out: a peakier picture whose scores stay
        # within the calibration samples' range (so that only the output grid can clip).
        scores = ort_outputs(fm.model, {"x": x})[0].reshape(8, 8)
        low, high = np.unravel_index(scores.argmin(), (8, 8)), np.unravel_index(scores.argmax(), (8, 8))
        flat = np.broadcast_to(x[:, :, low[0]:low[0] + 1, low[1]:low[1] + 1], x.shape).copy()
        flat[:, :, high[0], high[1]] = x[:, :, high[0], high[1]]
        # blended towards it until the peak is 1.6 times the calibration samples' (the scores are linear in x)
        blends = (((1 - a) * x + a * flat).astype(np.float32) for a in np.linspace(0, 1, 101))
        peaky = next(b for b in blends if ort_outputs(fm.model, {"x": b})[0].max() >= 1.6 * calibration_peak)
        want = ort_outputs(fm.model, {"x": peaky})[0]
        got = quantized.run_feature(None, {"x": peaky})[0]
        assert np.abs(got - want).max() < 0.1 * want.max(), (want.max(), got.max(), calibration_peak)
