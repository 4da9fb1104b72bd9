"""Progress of long loops where no bar can be drawn (a log file, nohup, CI)."""

from __future__ import annotations

import logging

import pytest

from hbtools.runs.progress import Progress, progress


@pytest.fixture
def lines():
    """The messages the hbtools logger gets (it may not propagate to pytest's capture)."""
    got: list[tuple[int, str]] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            got.append((record.levelno, record.getMessage()))

    logger = logging.getLogger("hbtools")
    handler, level = Keep(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    yield got
    logger.removeHandler(handler)
    logger.setLevel(level)


def test_off_a_terminal_each_interval_logs_how_far_the_loop_is(lines):
    assert list(progress(["a", "b", "c"], "int16 search: sensitivity", "tensor", every=0.0)) == ["a", "b", "c"]
    messages = [m for level, m in lines if level == logging.INFO]
    assert len(messages) == 3
    assert messages[0].startswith("int16 search: sensitivity: 1 of 3 tensors done in ")
    assert messages[-1].startswith("int16 search: sensitivity: 3 of 3 tensors done in ")


def test_a_short_loop_stays_silent(lines):
    assert sum(progress(range(100), "calibration", "sample")) == sum(range(100))
    counter = Progress(None, "debugger sweep", "run")
    counter.update(5)
    counter.close()
    assert counter.done == 5
    assert lines == []


def test_a_loop_left_early_counts_only_what_was_done(lines):
    for k in progress(iter(range(10)), "calibration", "sample", every=0.0):
        if k == 2:
            break
    assert [m.split(" done")[0] for _, m in lines] == ["calibration: 1 samples", "calibration: 2 samples"]
