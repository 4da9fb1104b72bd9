"""Bias correction removes the mean shift that weight rounding puts on each conv output channel."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from builders import make_project, resnet_like, write_calibration
from onnx import TensorProto, helper

from hbtools.log import setup
from hbtools.pipeline.runner import makertbin
from hbtools.runtime.lowering import lower_model
from hbtools.runtime.session import make_session


def _conv_mean_errors(project, paths: dict[str, Path], samples: list[dict]) -> float:
    """Mean over conv outputs of |per-channel mean(float) - mean(fake-quant)|."""
    optimized = onnx.load(str(paths["optimized"]))
    calibrated = onnx.load(str(paths["calibrated"]))
    convs = [n.output[0] for n in optimized.graph.node if n.op_type == "Conv"]
    errors = []
    runs = []
    for model in (optimized, calibrated):
        lowered = lower_model(model, keep=convs)
        for t in convs:
            lowered.graph.output.append(helper.make_tensor_value_info(t, TensorProto.FLOAT, None))
        sess = make_session(lowered)
        runs.append([sess.run(convs, s) for s in samples])
    for k in range(len(convs)):
        f = np.mean([r[k].mean(axis=(0, 2, 3)) for r in runs[0]], axis=0)
        q = np.mean([r[k].mean(axis=(0, 2, 3)) for r in runs[1]], axis=0)
        errors.append(np.abs(f - q).mean())
    return float(np.mean(errors))


def test_bias_correction_shrinks_channel_mean_error(tmp_path: Path) -> None:
    setup(None)
    fm = resnet_like()
    results = {}
    for mode in ("plain", "corrected"):
        project = make_project(tmp_path / mode, fm, cal_count=12)
        if mode == "corrected":
            project.write(calibration_parameters={"optimization": "bias_correction"})
        paths = makertbin(project.config_path, "onnx")
        held = write_calibration(fm, tmp_path / f"held_{mode}", count=6, seed=99)
        samples = []
        for f in sorted(next(iter(held.values())).iterdir()):
            x = np.fromfile(f, np.uint8).reshape(fm.inputs["data"])
            samples.append({"data": (x.astype(np.int16) - 128).astype(np.int8)})
        results[mode] = _conv_mean_errors(project, paths, samples)
    assert results["corrected"] < 0.8 * results["plain"], f"channel mean error {results}"
