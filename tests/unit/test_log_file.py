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


def test_a_folder_name_that_is_not_utf8_converts_without_tracebacks(tmp_path: Path) -> None:
    """A project unpacked from a Windows zip keeps its GBK folder name as bytes that are not UTF-8: makertbin ended
    in an internal error writing the .bin, and every tool printed logging's traceback for each line naming the
    path (the log file could not take it). The run completes; the lines show the bytes as ``\\xNN``."""
    from builders import MODELS, make_project

    root = Path(os.fsdecode(os.fsencode(tmp_path) + b"/proj_" + "模型".encode("gbk")))
    project = make_project(root, MODELS["resnet_like"]())
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1", "LC_ALL": "C.UTF-8"}

    def tool(module: str, *args: str) -> str:
        run = subprocess.run([sys.executable, "-c", f"from hbtools.cli.{module} import main; main()", *args],
                             cwd=root, capture_output=True, text=True, errors="replace", timeout=600, env=env)
        out = run.stdout + run.stderr
        assert run.returncode == 0 and "Logging error" not in out and "Traceback" not in out, out[-3000:]
        return out

    tool("hb_mapper", "makertbin", "--config", str(project.config_path), "--model-type", "onnx")
    log = (root / "hb_mapper_makertbin.log").read_text(errors="strict")
    assert "\\xd0\\xcd/model.onnx" in log and "Convert to runtime bin file successfully" in log  # C4 A3 is UTF-8
    info = tool("hb_model_info", "model_output/small.bin")
    assert "cal_data_dir" in info and "proj_" in info
    assert "PASSED" in tool("hb_verifier", "-m", "model_output/small_quantized_model.onnx,model_output/small.bin")


def test_a_current_folder_that_was_removed_is_named(tmp_path: Path) -> None:
    """A shell left in a build folder that was removed meanwhile: every tool said 'cannot access: No such file or
    directory' without a path (it was the current folder, where the log goes)."""
    gone = tmp_path / "build"
    gone.mkdir()
    code = (f"import os, sys; os.chdir({str(gone)!r}); os.rmdir({str(gone)!r}); sys.argv = ['hb_model_info', 'm.bin']; "
            "from hbtools.cli.hb_model_info import main; main()")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1"})
    assert run.returncode == 3 and "Traceback" not in run.stderr, run.stdout + run.stderr
    assert ERROR.findall(run.stdout) == ["the current folder no longer exists (it was removed or moved after the shell "
                                         "entered it); cd to an existing folder and run the tool again"]
