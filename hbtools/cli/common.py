"""How every command reports failures: ERROR lines on the console, traceback in the log only."""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable
from typing import Any

from hbtools.errors import ConfigError, HbError

log = logging.getLogger("hbtools")


def reports_errors(command: str, *, single_line: bool = False) -> Callable:
    """``single_line``: the whole failure is one ERROR line (message and hint joined, no
    trailing "exception in command" line), as ``hb_mapper checker`` reports it."""

    def wrap(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def inner(*args: Any, **kwargs: Any) -> Any:
            lines: list[str] = []
            try:
                return fn(*args, **kwargs)
            except HbError as exc:
                log.debug("traceback", exc_info=True)
                lines = exc.lines()
                if isinstance(exc, ConfigError):
                    lines.append("yaml file parse failed. Please double check your input")
            except KeyboardInterrupt:
                lines = ["interrupted"]
            except Exception as exc:  # anything else is our bug: say so in one line
                log.debug("traceback", exc_info=True)
                lines = [f"internal error: {type(exc).__name__}: {exc} (details in the log file)"]
            if single_line:
                log.error(" ".join("; ".join(line.strip().rstrip(".;") for line in lines).split()))
            else:
                for line in [*lines, f"exception in command: {command}"]:
                    log.error(line)
            sys.exit(1)

        return inner

    return wrap
