"""A tensor that holds whole numbers (the output of Floor, Ceil, Round or Sign, and what integer arithmetic makes of
it) gets a grid with a level at each integer it reaches: a step of 1 where the fitted step was finer.
A step fitted to its range (``max / 127``, or a zero point's ``span / 255``) put 1 on level 25.4 and gave it back
as 0.992, so a reader comparing with an integer (``Equal(y, 1)``) or an index made from it was wrong (hunt 50 D5)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from builders import FloatModel, _Graph, held_out, make_project, ort_outputs

from hbtools.graph.graph import GraphView
from hbtools.quant.bounds import integer_valued
from hbtools.quant.grids import activation_grid


def _model(op: str) -> onnx.ModelProto:
    g = _Graph(4)
    three = g.const(np.array(3.0, np.float32), "three")
    return g.model({"x": [1, 3, 6, 6]}, [g.op(op, [g.op("Mul", [g.conv("x", 3, 8), three])])]).model


@pytest.mark.parametrize(("march", "calibration_type"),
                         [("bayes-e", "max"), ("bernoulli2", "default"), ("bernoulli2", "max")])
@pytest.mark.parametrize("op", ["Floor", "Round", "Sign"])
def test_whole_numbers_come_back_whole_from_every_artefact(tmp_path: Path, march: str, calibration_type: str,
                                                           op: str) -> None:
    from hbtools.pipeline.runner import makertbin
    from horizon_tc_ui import HB_ONNXRuntime

    fm = FloatModel(_model(op), {"x": [1, 3, 6, 6]}, {"x"})
    project = make_project(tmp_path, fm, march=march, cal_count=4, calibration_type=calibration_type)
    paths = makertbin(project.config_path, "onnx")
    calibrated, quantized = (HB_ONNXRuntime(model_file=str(paths[k])) for k in ("calibrated", "quantized"))
    for x in held_out(fm, 3):
        q = quantized.run_feature(None, {"x": x})[0]
        np.testing.assert_array_equal(q, calibrated.run_feature(None, {"x": x})[0])
        np.testing.assert_array_equal(q, np.round(q))
        assert np.mean(q == ort_outputs(fm.model, {"x": x})[0]) > 0.8  # the rest: inputs near a step's jump


def test_whole_numbers_are_followed_through_integer_arithmetic_only() -> None:
    g = _Graph(4)
    f = g.op("Floor", [g.conv("x", 3, 8)])
    half = g.const(np.array(0.5, np.float32), "half")
    two = g.const(np.array(2.0, np.float32), "two")
    doubled, halved, pooled = g.op("Mul", [f, two]), g.op("Mul", [f, half]), g.op("GlobalAveragePool", [f])
    model = g.model({"x": [1, 3, 6, 6]}, [doubled, halved, pooled, g.op("MaxPool", [f], kernel_shape=[2, 2])]).model
    found = integer_valued(GraphView(model))
    assert {f, doubled} <= found and not {halved, pooled} & found


@pytest.mark.parametrize("asymmetric", [False, True])
@pytest.mark.parametrize(("low", "high"), [(-5.0, 7.0), (0.0, 1.0), (-1.0, 1.0), (0.0, 255.0), (-300.0, 700.0)])
def test_a_whole_number_grid_holds_every_integer_it_reaches(asymmetric: bool, low: float, high: float) -> None:
    fitted = activation_grid(max(-low, high), 8, asymmetric=asymmetric, low=low, high=high)
    grid = activation_grid(max(-low, high), 8, asymmetric=asymmetric, low=low, high=high, whole=True)
    step = float(grid.scales[0])
    assert step == max(1.0, float(fitted.scales[0]))  # never coarser than the fitted grid
    zp = 0 if grid.zero_points is None else int(grid.zero_points[0])
    lo, hi = (-128, 127) if grid.zero_points is not None else (-127, 127)
    assert (lo - zp) * step <= low + step / 2 and (hi - zp) * step >= high - step / 2
    if step == 1.0:
        whole = np.arange(np.ceil(max(low, (lo - zp) * step)), np.floor(min(high, (hi - zp) * step)) + 1)
        levels = np.round(whole.astype(np.float32) / grid.scales[0]) + zp
        np.testing.assert_array_equal((levels - zp).astype(np.float32) * grid.scales[0], whole)
