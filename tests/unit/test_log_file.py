"""The log file on a disk that is or becomes full (report T4): one ERROR line, never logging's traceback per line."""

from __future__ import annotations

import errno
import logging
import os
import re
import resource
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from bin_fixtures import build_bin, logger_restored

from hbtools.log import setup

REPO = Path(__file__).resolve().parents[2]
ERROR = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ERROR (.*)$", re.M)


def _no_file_writes() -> None:
    # A file-size limit of 0: every write to a regular file fails (EFBIG) as on a full disk, for
    # this process only and without root; SIGXFSZ would kill it instead of failing the write.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))


def test_a_log_that_cannot_be_written_stops_the_tool_before_any_work(tmp_path: Path) -> None:
    built = build_bin(tmp_path / "m", "resnet_like", prefix="m")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    (cwd / "hb_model_info.log").write_text("the previous run's log\n")
    run = subprocess.run([sys.executable, "-c", "from hbtools.cli.hb_model_info import main; main()", str(built.bin)],
                         cwd=cwd, capture_output=True, text=True, preexec_fn=_no_file_writes, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1"})
    assert run.returncode == 3, run.stdout + run.stderr
    assert "Traceback" not in run.stderr and "Logging error" not in run.stderr, run.stderr
    assert ERROR.findall(run.stdout) == [f"cannot write the log file '{cwd / 'hb_model_info.log'}': File too large; "
                                         "the file is too large for this file system; choose another disk"]
    assert "Start hb_model_info" not in run.stdout  # refused before the work
    assert sorted(os.listdir(cwd)) == ["hb_model_info.log"]  # no probe file left
    assert (cwd / "hb_model_info.log").read_text() == "the previous run's log\n"  # not emptied


class _FullDiskStream:
    """The log's text stream on a disk that just filled up: writes are buffered, the flush fails."""

    def __init__(self, real: Any) -> None:
        self.real = real

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def close(self) -> None:
        self.real.close()


def test_a_disk_filling_up_during_the_run_is_one_error_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "tool.log"
    with logger_restored():
        log = setup(path)
        log.info("first line")
        handler = next(h for h in log.handlers if isinstance(h, logging.FileHandler))
        handler.stream = _FullDiskStream(handler.stream)
        for k in range(5):
            log.info("line %d", k)
        log.warning("still on the console")
        setup(None)  # closes the log file: nothing more to report
    out, err = capsys.readouterr()
    assert "Logging error" not in err and "Traceback" not in err, err
    assert ERROR.findall(out) == [f"cannot write the log file '{path}': No space left on device; the disk is full; "
                                  "free some space, or run the tool from a folder on another disk (the log goes to "
                                  "the current folder); the run goes on, and the rest of its log is not saved"]
    assert "INFO line 4" in out and "WARNING still on the console" in out  # the run's output goes on
    assert path.read_text().endswith("INFO first line\n")
