"""User-facing errors and the exit code of each class of mistake (docs/errors.md).

Anything a user can get wrong (config, paths, data, models) raises ``HbError``.
The CLI prints its message as ``ERROR`` lines and exits with the class's code; the
traceback goes only to the log file.
"""

from __future__ import annotations

import errno

# One code per class of mistake, the same in every tool.
EXIT_INPUT = 1  # what was given is wrong: config, model, data, node names, input files
EXIT_USAGE = 2  # the command line: unknown option, missing argument, value out of range
EXIT_SYSTEM = 3  # the machine refused: cannot write/read a path, no permission, memory, busy
EXIT_INTERNAL = 4  # a bug in hbtools ("internal error")
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT, as shells report it)
EXIT_TERMINATED = 143  # SIGTERM (kill, timeout, a stopped container): 128 + 15


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C so the same clean-up runs (staging folder removed, lock released)."""


class HbError(Exception):
    """A mistake in the user's input, with a message saying what to fix."""

    exit_code = EXIT_INPUT

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint

    def lines(self) -> list[str]:
        """Lines to print after ``ERROR``: the message, then the hint if any."""
        out = [line for line in str(self).splitlines() if line.strip()]
        if self.hint:
            out.append(self.hint)
        return out


class ConfigError(HbError):
    """The YAML config is invalid."""


class UsageError(HbError):
    """The command line is wrong (unknown option, bad choice, missing argument)."""

    exit_code = EXIT_USAGE


class ResourceError(HbError):
    """The file system or the machine refused: a path cannot be written, not enough memory."""

    exit_code = EXIT_SYSTEM


_FIXES = {
    errno.ENOENT: "the folder or file does not exist; create the parent folder or correct the path",
    errno.ENOTDIR: "a part of the path is a file, not a folder; correct the path",
    errno.EISDIR: "it is a folder; give a file name",
    errno.EACCES: "no permission; change its permissions (chmod) or choose another path",
    errno.EPERM: "not permitted; change its permissions (chmod) or choose another path",
    errno.ENAMETOOLONG: "the name is too long; use a shorter path",
    errno.ENOSPC: "the disk is full; free some space or choose another disk",
    errno.EROFS: "the file system is read-only; choose a writable place",
    errno.EEXIST: "something is already there; remove it or choose another path",
    errno.ELOOP: "too many symbolic links; correct the path",
    errno.EDQUOT: "your disk quota is used up; free some space or choose another disk",
    errno.EFBIG: "the file is too large for this file system; choose another disk",
    errno.EIO: "the disk reported an input/output error; check the disk or choose another one",
}
# Errors of writing, not of reaching the path: "cannot access" would send the user to the wrong fix.
_WRITE_ERRORS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def os_error(exc: OSError, what: str = "cannot access", fix: str | None = None) -> ResourceError:
    """One-line ``ResourceError`` for an ``OSError``: what failed, on which path, how to fix it."""
    number = exc.errno
    reason = exc.strerror or str(exc)
    if number is None and _short_write(reason):  # numpy's fwrite wrote less than asked: a full disk, not permissions
        number, reason = errno.ENOSPC, f"could not write all of it ({reason})"
    if what == "cannot access" and number in _WRITE_ERRORS:
        what = "cannot write"
    where = f" '{exc.filename}'" if exc.filename is not None else ""
    hint = fix or _FIXES.get(number or 0, "check the path and its permissions")
    return ResourceError(f"{what}{where}: {reason}; {hint}")


def _short_write(text: str) -> bool:
    return "requested and" in text and text.rstrip().endswith("written")


def memory_error(what: str = "not enough memory") -> ResourceError:
    return ResourceError(f"{what}; use smaller inputs (input_shape) or a machine with more memory")


def last_line(exc: BaseException) -> str:
    """The last line of an exception's text (onnxruntime ends with the cause), or its type's name."""
    text = str(exc).strip()
    return text.splitlines()[-1] if text else type(exc).__name__
