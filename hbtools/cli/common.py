"""How every command reports failures: ERROR lines on the console, traceback in the log only.

Two layers, one policy (docs/errors.md):
- ``reports_errors`` wraps a command's body: any exception becomes ERROR line(s) and the
  exit code of its class.
- ``ToolCommand`` / ``ToolGroup`` (``cls=`` of every click command) do the same for what
  happens before the body runs: click's usage errors (unknown option, bad choice, missing
  argument, value out of range) and a log file that cannot be opened.
"""

from __future__ import annotations

import functools
import logging
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

import click

from hbtools.errors import (
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_TERMINATED,
    ConfigError,
    HbError,
    Terminated,
    UsageError,
    memory_error,
    os_error,
)
from hbtools.runs.signals import signals_ignored

log = logging.getLogger("hbtools")


def describe(exc: BaseException) -> tuple[int, list[str]]:
    """The exit code and the ERROR lines for ``exc``."""
    if isinstance(exc, HbError):
        lines = exc.lines()
        if isinstance(exc, ConfigError):
            lines.append("yaml file parse failed. Please double check your input")
        return exc.exit_code, lines
    if _terminated(exc):
        return EXIT_TERMINATED, ["terminated (SIGTERM)"]
    if isinstance(exc, KeyboardInterrupt | click.exceptions.Abort):
        return EXIT_INTERRUPTED, ["interrupted"]
    if isinstance(exc, click.UsageError):
        return describe(_usage(exc))
    if isinstance(exc, click.ClickException):
        return describe(UsageError(exc.format_message()))
    if isinstance(exc, OSError):
        return describe(os_error(exc))
    if isinstance(exc, MemoryError):
        return describe(memory_error())
    if _interrupted_underneath(exc):  # a library turned the Ctrl-C into its own error
        return describe(_interrupted_underneath(exc))
    # anything else is our bug: say so in one line
    return EXIT_INTERNAL, [f"internal error: {type(exc).__name__}: {exc} (details in the log file)"]


def _interrupted_underneath(exc: BaseException) -> BaseException | None:
    """The Ctrl-C or SIGTERM that ``exc`` was raised while handling, if any: onnxruntime interrupted while it
    loads raises ImportError('initialization failed') from the KeyboardInterrupt."""
    seen: set[int] = set()
    cause = exc.__cause__ or exc.__context__
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, KeyboardInterrupt):
            return cause
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return None


def _terminated(exc: BaseException | None) -> bool:
    """SIGTERM, also when click turned it into Abort (and a caller into KeyboardInterrupt) on the way."""
    while exc is not None:
        if isinstance(exc, Terminated):
            return True
        if not isinstance(exc, KeyboardInterrupt | click.exceptions.Abort):
            return False
        exc = exc.__cause__ or exc.__context__
    return False


def _emit(lines: list[str], command: str, single_line: bool) -> None:
    if single_line:
        log.error(" ".join("; ".join(line.strip().rstrip(".;") for line in lines).split()))
    else:
        for line in [*lines, f"exception in command: {command}"]:
            log.error(line)


def exit_with_error(exc: BaseException, command: str = "", *, single_line: bool = True) -> None:
    """Report ``exc`` as ERROR line(s) and exit with its class's code (a console is set up if needed)."""
    with signals_ignored():  # the run is stopping: Ctrl-C again must not cut its report short
        if not log.handlers:
            _setup_quietly(None)
        log.debug("traceback", exc_info=exc)
        code, lines = describe(exc)
        _emit(lines, command, single_line)
    sys.exit(code)


def reports_errors(command: str, *, single_line: bool = False) -> Callable:
    """``single_line``: the whole failure is one ERROR line (message and hint joined, no
    trailing "exception in command" line), as ``hb_mapper checker`` reports it."""

    def wrap(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def inner(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except (Exception, KeyboardInterrupt) as exc:
                exit_with_error(exc, command, single_line=single_line)

        return inner

    return wrap


def _usage(exc: click.UsageError) -> UsageError:
    ctx = exc.ctx
    path = ctx.command_path if ctx is not None else ""
    return UsageError(f"{exc.format_message()} (see {path} --help)".replace("  ", " "))


class _ToolMixin:
    """Click's standalone handling replaced by ours: one ERROR line, documented exit codes.

    ``log_file`` may contain ``{command}``, filled with the sub-command's name.
    """

    log_file: str | None
    call: list[str] | None = None  # set by a tool whose log keeps its earlier calls (log.setup)

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True, **extra: Any) -> Any:
        _terminate_like_ctrl_c()
        try:
            result = super().main(args=args, prog_name=prog_name, complete_var=complete_var,  # type: ignore[misc]
                                  standalone_mode=False, **extra)
        except click.exceptions.NoArgsIsHelpError as exc:  # a bare command asks for its help
            click.echo(exc.ctx.get_help() if exc.ctx is not None else "")
            sys.exit(0)
        except (Exception, KeyboardInterrupt) as exc:
            if isinstance(exc, click.ClickException):  # raised before the command set up its log
                _setup_quietly(self._log_name(exc), self.call)
            exit_with_error(exc)
        if standalone_mode and isinstance(result, int) and result:
            sys.exit(result)  # click's --help / --version return their exit code
        return result

    def _log_name(self, exc: BaseException) -> str | None:
        if self.log_file is None:
            return None
        ctx = getattr(exc, "ctx", None)
        name = ctx.info_name if ctx is not None and ctx.parent is not None else "main"
        return self.log_file.format(command=name)


def _raise_terminated(signum: int, frame: Any) -> None:
    raise Terminated()


def _terminate_like_ctrl_c() -> None:
    # SIGTERM's default action kills the process on the spot, leaving makertbin's staging folder
    # behind; as an exception it unwinds through the same clean-up as Ctrl-C.
    if threading.current_thread() is threading.main_thread() and \
            signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _raise_terminated)


def _setup_quietly(log_file: str | None, call: list[str] | None = None) -> None:
    from hbtools.log import setup

    try:
        setup(log_file, call=call)
    except HbError:  # the log file itself cannot be written: report on the console only
        setup(None)


class ToolCommand(_ToolMixin, click.Command):
    def __init__(self, *args: Any, log_file: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.log_file = log_file


class ToolGroup(_ToolMixin, click.Group):
    def __init__(self, *args: Any, log_file: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.log_file = log_file
