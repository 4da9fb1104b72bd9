"""How every command reports failures: ERROR lines on the console, traceback in the log only."""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable
from typing import Any

from hbtools.errors import ConfigError, HbError

log = logging.getLogger("hbtools")


def reports_errors(command: str) -> Callable:
    def wrap(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def inner(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except HbError as exc:
                log.debug("traceback", exc_info=True)
                for line in exc.lines():
                    log.error(line)
                if isinstance(exc, ConfigError):
                    log.error("yaml file parse failed. Please double check your input")
            except KeyboardInterrupt:
                log.error("interrupted")
            except Exception as exc:  # anything else is our bug: say so in one line
                log.debug("traceback", exc_info=True)
                log.error("internal error: %s: %s (details in the log file)", type(exc).__name__, exc)
            log.error("exception in command: %s", command)
            sys.exit(1)

        return inner

    return wrap
