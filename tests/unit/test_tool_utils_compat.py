"""Scripts written for the vendor toolkit import horizon_tc_ui.utils.tool_utils and
horizon_tc_ui.data.raw_data_reader (D-Robotics sample inference and evaluation scripts)."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hbtools.errors import HbError
from horizon_tc_ui.data.raw_data_reader import raw_data_read
from horizon_tc_ui.utils import tool_utils

SCRIPT = '''
import logging, sys
from horizon_tc_ui.utils.tool_utils import init_root_logger, on_exception_exit, report_flag_start, report_flag_end

@on_exception_exit
def main(fail):
    init_root_logger("inference.log", console_level=logging.INFO, file_level=logging.DEBUG)
    logging.debug("only in the file")
    report_flag_start("MAPPER-EVAL")
    logging.info("0.7512")
    report_flag_end("MAPPER-EVAL")
    if fail:
        raise ValueError("the label file has 999 lines, expected 1000")

main(len(sys.argv) > 1)
'''


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    (tmp_path / "script.py").write_text(SCRIPT)
    return subprocess.run([sys.executable, "script.py", *args], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)


def test_a_sample_script_logs_to_console_and_file_and_marks_its_report(tmp_path: Path) -> None:
    done = _run(tmp_path)
    assert done.returncode == 0, done.stderr
    console = done.stdout.splitlines()
    assert [line.split(" ", 3)[2:] for line in console] == [
        ["INFO", "==========MAPPER-EVAL START=========="], ["INFO", "0.7512"],
        ["INFO", "==========MAPPER-EVAL END=========="]]
    assert "DEBUG only in the file" in (tmp_path / "inference.log").read_text()


def test_on_exception_exit_ends_with_an_error_line_and_code_1(tmp_path: Path) -> None:
    done = _run(tmp_path, "fail")
    assert done.returncode == 1
    assert done.stdout.splitlines()[-1].endswith("ERROR ValueError: the label file has 999 lines, expected 1000")
    assert "Traceback" not in done.stdout + done.stderr
    assert "Traceback" in (tmp_path / "inference.log").read_text()


def test_init_root_logger_again_replaces_its_handlers(tmp_path: Path) -> None:
    root = logging.getLogger()
    before = list(root.handlers)
    try:
        tool_utils.init_root_logger(tmp_path / "a.log")
        tool_utils.init_root_logger(tmp_path / "b.log", console_level=logging.WARNING)
        added = [h for h in root.handlers if h not in before]
        assert len(added) == 2 and {type(h).__name__ for h in added} == {"StreamHandler", "FileHandler"}
    finally:
        for h in [h for h in root.handlers if h not in before]:
            root.removeHandler(h)
            h.close()


def test_raw_data_read(tmp_path: Path) -> None:
    x = np.arange(2 * 3 * 4, dtype=np.float32).reshape(1, 2, 3, 4)
    x.tofile(tmp_path / "feature.bin")
    np.testing.assert_array_equal(raw_data_read(tmp_path / "feature.bin", [1, 2, 3, 4], np.float32), x)
    with pytest.raises(HbError, match=r"holds 24 values of float32, but shape 1x64x56x56 needs 200704"):
        raw_data_read(tmp_path / "feature.bin", [1, 64, 56, 56], np.float32)
