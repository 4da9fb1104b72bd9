"""Ctrl-C and SIGTERM held back while a set of results is moved into place.

A signal between the first and the last move of a set would leave old and new results
mixed; held back, it acts once the set is complete, after a WARNING that says so (exit
130 or 143 otherwise reads as "the previous results are untouched"). The same mechanism
as makertbin's commit of its artefacts (``runs.transaction``).
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Iterator

log = logging.getLogger("hbtools")


STOPPING = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def _handled_by(handler: object) -> Iterator[None]:
    """SIGINT and SIGTERM go to ``handler`` in the block (only the main thread gets signals: elsewhere as they are)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, handler) for sig in STOPPING}
    try:
        yield
    finally:
        for sig, before in previous.items():
            signal.signal(sig, before)


@contextlib.contextmanager
def signals_deferred(where: str) -> Iterator[None]:
    """Hold SIGINT and SIGTERM until the block is done, then act on the first one as usual.

    ``where``: the folder the block completes, named in the WARNING.
    """
    caught: list[int] = []
    with _handled_by(lambda number, frame: caught.append(number)):
        yield
    for sig in caught[:1]:
        log.warning("%s arrived while the new results were moved into place; the move was completed first, so "
                    "%s holds the complete new set", signal.Signals(sig).name, where)
        signal.raise_signal(sig)  # the original handler: KeyboardInterrupt, or SIGTERM's Terminated


def signals_ignored() -> contextlib.AbstractContextManager[None]:
    """SIGINT and SIGTERM dropped while a run that is stopping already cleans up or reports: a second Ctrl-C
    would stop the clean-up half way (a staging folder left) or the report (Python's traceback)."""
    return _handled_by(signal.SIG_IGN)
