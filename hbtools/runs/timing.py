"""Seconds spent in each named step of a conversion, for one INFO line at the end."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator

log = logging.getLogger("hbtools")


class StepTimes:
    """Wall seconds per step, in the order the steps first ran (a step may run in several parts)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def step(self, name: str) -> Iterator[None]:
        # in the log file only: a step of many minutes (GPTQ, the int16 search on a large model) shows there
        log.debug("%s: started", name)
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start

    def line(self) -> str:
        return "step timings: " + ", ".join(f"{name} {s:.1f} s" for name, s in self.seconds.items())
