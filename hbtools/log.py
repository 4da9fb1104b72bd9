"""Logging in the seed's format: ``YYYY-MM-DD HH:MM:SS,mmm LEVEL message``.

Tools log through the ``hbtools`` logger. ``setup`` sends INFO and above to the
console and DEBUG and above (tracebacks included) to the tool's log file.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import re
import secrets
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hbtools.errors import HbError

LOGGER_NAME = "hbtools"
FORMAT = "%(asctime)s %(levelname)s %(message)s"
# Room the log folder must have when a tool starts: a log of a few dozen lines up to a makertbin log.
PROBE_BYTES = 64 * 1024
_NO_ROOM = (errno.ENOSPC, errno.EDQUOT)
_FIX = "run the tool from a folder you may write (the log goes to the current folder)"
# A log that keeps its earlier calls is cut back to its last calls once it outgrows this: a debugger traceback is a
# few KB, so the calls of a working day stay while a script calling the debugger in a loop cannot fill the disk.
KEPT_LOG_LIMIT = 1024 * 1024
KEPT_LOG_TAIL = 256 * 1024
CALL_HEADER = "====="
_FIX_NO_ROOM = ("the disk is full; free some space, or run the tool from a folder on another disk (the log goes "
                "to the current folder)")

logger = logging.getLogger(LOGGER_NAME)


def setup(log_file: str | Path | None, *, console_level: int = logging.INFO,
          call: Sequence[str] | None = None) -> logging.Logger:
    """Configure the ``hbtools`` logger for one tool run (idempotent).

    ``call``: the command line of a tool whose calls are separate questions (the debugger): its log keeps the
    earlier calls, each after a header line naming the call, instead of starting afresh as the seed's tools do.
    """
    for h in list(logger.handlers):
        logger.removeHandler(h)
        h.close()
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    fmt = _Formatter(FORMAT)
    console = _Console(sys.stdout)
    console.setLevel(console_level)
    console.setFormatter(fmt)
    logger.addHandler(console)
    if log_file is not None:
        try:
            os.getcwd()
        except FileNotFoundError:  # a shell left in a folder that was removed meanwhile
            from hbtools.errors import ResourceError

            raise ResourceError("the current folder no longer exists (it was removed or moved after the shell "
                                "entered it); cd to an existing folder and run the tool again") from None
        path = Path(os.path.abspath(log_file))
        try:
            _probe_room(path)
            fh = _LogFile(path, mode="a", encoding="utf-8")
            if call is None:
                _start_fresh_unless_shared(fh)
            else:
                _keep_recent_calls(fh)
        except OSError as exc:
            raise _log_error(exc, path) from None
        fh.setLevel(logging.DEBUG)
        fh.setFormatter(fmt)
        logger.addHandler(fh)
        if call is not None:  # DEBUG: the log file only
            logger.debug("%s %s %s", CALL_HEADER, shlex.join(call), CALL_HEADER)
    return logger


def first_of(names: Sequence[str], shown: int = 3) -> str:
    """``names`` for a message: the first ``shown`` joined by commas, then how many more there are."""
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def printable(text: str) -> str:
    """``text`` with the bytes of a file name that is not UTF-8 (a GBK folder from a Windows zip: Python holds
    them as lone surrogates, which no UTF-8 stream takes) written as ``\\xNN``; other text as it is."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return text


class _Formatter(logging.Formatter):
    """Lines any UTF-8 stream takes (``printable``): a path of such bytes printed logging's traceback for every
    line naming it, and the log file lost the line."""

    def format(self, record: logging.LogRecord) -> str:
        return printable(super().format(record))


def _start_fresh_unless_shared(handler: logging.FileHandler) -> None:
    """Empty the log file as the seed does, unless another run in this folder is writing to it.

    Truncating under a running makertbin would cut its log (and its lines would then overwrite
    ours): while one run holds the lock, a second appends (O_APPEND), so both stay readable.
    The lock lasts as long as the handler's file is open.
    """
    with contextlib.suppress(OSError):
        fcntl.flock(handler.stream.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        handler.stream.truncate(0)


def _keep_recent_calls(handler: logging.FileHandler) -> None:
    """Cut a log that keeps its calls back to the calls in its last ``KEPT_LOG_TAIL`` bytes once it is over
    ``KEPT_LOG_LIMIT``, and to the whole last call where that call alone is longer (its ERROR is at its end);
    left alone while another call in this folder is writing to it."""
    path = Path(handler.baseFilename)
    with contextlib.suppress(OSError):
        fcntl.flock(handler.stream.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        if path.stat().st_size <= KEPT_LOG_LIMIT:
            return
        text = path.read_bytes()
        kept = text[_recent_calls_start(text):]
        handler.stream.truncate(0)
        handler.stream.write(kept.decode("utf-8", "replace"))
        handler.stream.flush()


def _recent_calls_start(text: bytes) -> int:
    """Where the kept part of a log over its limit begins: the first call header in its last ``KEPT_LOG_TAIL``
    bytes, else the last header (one call longer than that), else the first whole line of that tail (a log
    written before calls had headers)."""
    cut = len(text) - KEPT_LOG_TAIL
    header = re.compile(rb"^\S+ \S+ DEBUG " + re.escape(CALL_HEADER.encode()) + rb" ", re.MULTILINE)
    starts = [match.start() for match in header.finditer(text)]
    recent = [start for start in starts if start >= cut]
    if recent:
        return recent[0]
    if starts:
        return starts[-1]
    newline = text.find(b"\n", cut - 1)
    return len(text) if newline < 0 else newline + 1


def _log_error(exc: OSError, path: Path, what: str = "cannot write the log file") -> HbError:
    from hbtools.errors import os_error

    fix = _FIX_NO_ROOM if exc.errno in _NO_ROOM else None if exc.errno in (errno.EFBIG, errno.EIO) else _FIX
    return os_error(OSError(exc.errno, exc.strerror, str(path)), what, fix)


def _probe_room(path: Path) -> None:
    """Refuse to start (exit 3, before any work) when the log's folder has no room left.

    Opening a log file on a full disk succeeds; only its writes fail, later, line by line. A
    probe file beside it is written and removed again (the log itself may be another run's,
    so nothing is written to it). A folder the probe cannot even be created in is left to the
    log's own ``open`` to report.
    """
    probe = path.with_name(f".{path.name}.{secrets.token_hex(4)}.probe")
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError:
        return
    try:
        with os.fdopen(fd, "wb") as fh:  # close() reports a write the file system deferred
            fh.write(bytes(PROBE_BYTES))
    finally:
        with contextlib.suppress(OSError):
            os.unlink(probe)


class _LogFile(logging.FileHandler):
    """The tool's log file. When the disk fills up during a run, the failure is one ERROR line on the
    console and the log stops there, instead of logging's "--- Logging error ---" traceback for every line.

    The run itself goes on: a log line is written from anywhere, also in the middle of a commit or a
    clean-up, where an exception would itself leave things half-done; the run's outputs and exit code
    are those of its work (docs/errors.md).
    """

    failure: OSError | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if self.failure is None:
            super().emit(record)

    def flush(self) -> None:
        if self.failure is None:
            try:
                super().flush()
            except OSError as exc:  # at close: what the last lines left in the buffer
                self._failed(exc)

    def handleError(self, record: logging.LogRecord) -> None:
        exc = sys.exc_info()[1]
        if not isinstance(exc, OSError):
            super().handleError(record)  # a bug in a log call (bad format arguments): logging's own report
            return
        self._failed(exc)

    def _failed(self, exc: OSError) -> None:
        if self.failure is not None:
            return
        self.failure = exc
        stream, self.stream = self.stream, None
        with contextlib.suppress(OSError, ValueError):
            stream.close()  # drops what it could not write
        error = _log_error(exc, Path(self.baseFilename))
        # through the logger, so it looks like every ERROR; this handler skips it (failure is set)
        logger.error("%s; the run goes on, and the rest of its log is not saved", error)


class _Console(logging.StreamHandler):
    """The console. A console that cannot take more lines (a closed pipe, a redirect to a full disk) ends
    the output quietly instead of printing a traceback for every line."""

    broken = False

    def emit(self, record: logging.LogRecord) -> None:
        if not self.broken:
            super().emit(record)

    def format(self, record: logging.LogRecord) -> str:
        """The line, with what the console's encoding cannot show escaped: an ASCII or Latin-1 console printed
        logging's traceback instead of an ERROR naming a non-ASCII path."""
        text = super().format(record)
        encoding = getattr(self.stream, "encoding", None)
        if encoding and encoding.lower().replace("-", "") != "utf8":
            text = text.encode(encoding, "backslashreplace").decode(encoding)
        return text

    def handleError(self, record: logging.LogRecord) -> None:
        if isinstance(sys.exc_info()[1], OSError):
            self.broken = True
        else:
            super().handleError(record)
