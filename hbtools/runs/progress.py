"""Progress of a long loop: a bar on a terminal, a line in the log elsewhere.

A conversion of a large model spends minutes in one step (GPTQ's Hessians, the int16
search's sensitivity measurements, a debugger sweep). On a terminal tqdm draws a bar;
run under ``nohup``, piped into ``tee`` or in CI there is no bar, and the console and
the log file went silent for those minutes. There, every ``EVERY_SECONDS`` a line says
how far the loop is.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterable, Iterator
from typing import TypeVar

from tqdm import tqdm

log = logging.getLogger("hbtools")

EVERY_SECONDS = 60.0  # between two progress lines where no bar is drawn
T = TypeVar("T")


def on_terminal() -> bool:
    """Whether a progress bar can be drawn (stderr is a terminal)."""
    return sys.stderr.isatty()


class Progress:
    """Counts done units of ``total``: tqdm's bar on a terminal; otherwise an INFO line every
    ``every`` seconds (and DEBUG lines to the log file under a bar, which the file does not see)."""

    def __init__(self, total: int | None, desc: str, unit: str = "step", *, leave: bool = False,
                 every: float = EVERY_SECONDS) -> None:
        self.total, self.desc, self.unit, self.every = total, desc, unit, every
        self.done = 0
        self.bar = tqdm(total=total, desc=desc, unit=unit, leave=leave) if on_terminal() else None
        self._start = self._last = time.monotonic()

    def update(self, n: int = 1) -> None:
        self.done += n
        if self.bar is not None:
            self.bar.update(n)
        now = time.monotonic()
        if now - self._last >= self.every:
            self._last = now
            of = f" of {self.total}" if self.total else ""
            log.log(logging.DEBUG if self.bar is not None else logging.INFO, "%s: %d%s %ss done in %.0f s",
                    self.desc, self.done, of, self.unit, now - self._start)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def progress(items: Iterable[T], desc: str, unit: str = "step", *, total: int | None = None,
             leave: bool = False, every: float = EVERY_SECONDS) -> Iterator[T]:
    """``items``, counted by a ``Progress`` as each one's work finishes (when the next is asked for)."""
    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]
    counter = Progress(total, desc, unit, leave=leave, every=every)
    try:
        for item in items:
            yield item
            counter.update()
    finally:
        counter.close()
