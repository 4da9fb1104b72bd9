"""Logging in the seed's format: ``YYYY-MM-DD HH:MM:SS,mmm LEVEL message``.

Tools log through the ``hbtools`` logger. ``setup`` sends INFO and above to the
console and DEBUG and above (tracebacks included) to the tool's log file.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import sys
from pathlib import Path

LOGGER_NAME = "hbtools"
FORMAT = "%(asctime)s %(levelname)s %(message)s"

logger = logging.getLogger(LOGGER_NAME)


def setup(log_file: str | Path | None, *, console_level: int = logging.INFO) -> logging.Logger:
    """Configure the ``hbtools`` logger for one tool run (idempotent)."""
    for h in list(logger.handlers):
        logger.removeHandler(h)
        h.close()
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    fmt = logging.Formatter(FORMAT)
    console = logging.StreamHandler(sys.stdout)
    console.setLevel(console_level)
    console.setFormatter(fmt)
    logger.addHandler(console)
    if log_file is not None:
        try:
            fh = logging.FileHandler(log_file, mode="a", encoding="utf-8")
            _start_fresh_unless_shared(fh)
        except OSError as exc:
            from hbtools.errors import os_error

            raise os_error(exc, "cannot write the log file",
                           "run the tool from a folder you may write (the log goes to the current folder)") from None
        fh.setLevel(logging.DEBUG)
        fh.setFormatter(fmt)
        logger.addHandler(fh)
    return logger


def _start_fresh_unless_shared(handler: logging.FileHandler) -> None:
    """Empty the log file as the seed does, unless another run in this folder is writing to it.

    Truncating under a running makertbin would cut its log (and its lines would then overwrite
    ours): while one run holds the lock, a second appends (O_APPEND), so both stay readable.
    The lock lasts as long as the handler's file is open.
    """
    with contextlib.suppress(OSError):
        fcntl.flock(handler.stream.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        handler.stream.truncate(0)
