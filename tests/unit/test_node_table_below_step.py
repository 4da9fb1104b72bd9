"""makertbin's node table and the debugger's sensitivity table: an output whose float values all round to 0
says so next to its cosine 0."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import numpy as np
from builders import _Graph, make_project

import hbtools.log
from hbtools.pipeline.runner import makertbin


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _table(tmp_path: Path, first_offset: float) -> str:
    """The node table of Sigmoid(x - 20) whose first calibration sample is ``x ~ N(first_offset, 1)``."""
    g = _Graph()
    y = g.op("Sigmoid", [g.op("Sub", ["x", g.const(np.float32(20.0))])])
    fm = g.model({"x": [1, 4, 8, 8]}, [y], featuremap={"x"})
    project = make_project(tmp_path, fm, calibration_type="max")
    rng = np.random.default_rng(0)
    # The threshold comes from the samples near 20 (Sigmoid ~0.5); the table's sample is the first one.
    for i, f in enumerate(sorted((tmp_path / "cal_x").iterdir())):
        (rng.standard_normal((1, 4, 8, 8)) + (first_offset if i == 0 else 20.0)).astype(np.float32).tofile(f)
    hbtools.log.setup(None)
    collect = _Collect()
    logger = logging.getLogger("hbtools")
    logger.addHandler(collect)
    try:
        makertbin(project.config_path, "onnx")
    finally:
        logger.removeHandler(collect)
    (table,) = [m for m in collect.lines if m.startswith("The converted model node information")]
    return table


def test_tiny_output_cosine_is_explained(tmp_path: Path) -> None:
    # Sigmoid(x - 20) at x ~ 0 is ~2e-9, far below half a step of a [0, ~1] grid: every value quantizes to 0.
    table = _table(tmp_path, 0.0)
    row = re.search(r"^Sigmoid_0\s+BPU\s+\S+\s+\S+\s+(\S+)\s+(\S+)$", table, re.M)
    assert row, table
    assert row.group(1) == "0.000000*", table  # the number stays, marked
    assert re.search(r"^\* all float values below half a quantization step", table, re.M), table


def test_ordinary_output_unmarked(tmp_path: Path) -> None:
    table = _table(tmp_path, 20.0)
    row = re.search(r"^Sigmoid_0\s+BPU\s+\S+\s+\S+\s+(\S+)\s+(\S+)$", table, re.M)
    assert row and float(row.group(1)) > 0.99, table
    assert "*" not in table, table


def test_debugger_table_marks_an_output_rounded_to_zero(tmp_path: Path, capsys) -> None:
    from hbtools.debug.sensitivity import get_sensitivity_of_nodes

    _table(tmp_path, 0.0)
    data = tmp_path / "debug_data" / "x"
    data.mkdir(parents=True)
    for f in sorted((tmp_path / "cal_x").iterdir()):
        np.save(data / f"{f.stem}.npy", np.fromfile(f, np.float32).reshape(1, 4, 8, 8))
    calibrated = str(tmp_path / "model_output" / "small_calibrated_model.onnx")
    capsys.readouterr()
    result = get_sensitivity_of_nodes(calibrated, calibrated_data=str(tmp_path / "debug_data"), data_num=1,
                                      node_type="activation", verbose=True)
    table = capsys.readouterr().out
    (out_row,) = [name for name in result if name.startswith("Sigmoid_0")]
    assert float(result[out_row]["cosine-similarity"]) == 0.0  # the returned numbers stay numbers
    assert re.search(rf"^{out_row}\s.*\s0\.0\*$", table, re.M), table
    assert re.search(r"^\* on some samples an output's float values are all below half a quantization step", table,
                     re.M), table
    assert table.count("*") == 2, table  # the input's row is not marked
