"""User-facing errors.

Anything a user can get wrong (config, paths, data, models) raises ``HbError``.
The CLI prints its message as ``ERROR`` lines and exits 1; the traceback goes
only to the log file.
"""


class HbError(Exception):
    """A mistake in the user's input, with a message saying what to fix."""

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
