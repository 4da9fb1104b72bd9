"""The logging helpers the toolkit's sample inference and evaluation scripts import.

``init_root_logger("inference.log", console_level=logging.INFO, file_level=logging.DEBUG)``,
``@on_exception_exit`` around a script's ``main`` and ``report_flag_start`` / ``report_flag_end``
around a result: scripts written for the vendor toolkit (D-Robotics samples and users' copies of
them) call these, so they are here with the behaviour the calls imply. Lines have the tools' format.
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hbtools.errors import HbError
from hbtools.log import FORMAT

_MARK = "_hbtools_root_handler"  # handlers this module added, replaced by the next init_root_logger


def init_root_logger(log_file: str | Path | None = None, console_level: int = logging.INFO,
                     file_level: int = logging.DEBUG) -> logging.Logger:
    """Send the root logger's records to the console from ``console_level`` and, with ``log_file``,
    to that file (rewritten) from ``file_level``; calling it again replaces what it set up."""
    root = logging.getLogger()
    for handler in [h for h in root.handlers if getattr(h, _MARK, False)]:
        root.removeHandler(handler)
        handler.close()
    formatter = logging.Formatter(FORMAT)
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stdout)]
    handlers[0].setLevel(console_level)
    if log_file is not None:
        handlers.append(logging.FileHandler(log_file, mode="w", encoding="utf-8"))
        handlers[1].setLevel(file_level)
    for handler in handlers:
        handler.setFormatter(formatter)
        setattr(handler, _MARK, True)
        root.addHandler(handler)
    root.setLevel(min(h.level for h in handlers))
    return root


def on_exception_exit(func: Callable) -> Callable:
    """Run ``func``; an exception becomes ERROR line(s) (the traceback at DEBUG, in the log file) and
    exit code 1, as the tools end on a failure."""

    @functools.wraps(func)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except (Exception, KeyboardInterrupt) as exc:
            log = logging.getLogger()
            log.debug("traceback", exc_info=exc)
            lines = exc.lines() if isinstance(exc, HbError) else [f"{type(exc).__name__}: {exc}"]
            for line in lines:
                log.error(line)
            sys.exit(1)

    return run


def report_flag_start(flag: str) -> None:
    """A line marking where the report ``flag`` (e.g. ``MAPPER-EVAL``) starts, for scripts that collect it."""
    logging.getLogger().info("==========%s START==========", flag)


def report_flag_end(flag: str) -> None:
    logging.getLogger().info("==========%s END==========", flag)
