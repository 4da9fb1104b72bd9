"""The console scripts' entry points: a tool's modules load with Ctrl-C and SIGTERM ending the process quietly.

Loading click, numpy and onnxruntime takes a few tenths of a second before a tool's own handling of Ctrl-C exists;
a Ctrl-C then printed Python's traceback of whatever was being imported. Nothing has been done at that point, so
there is nothing to clean up: the process ends with the exit code a later Ctrl-C or SIGTERM gives (130, 143)."""

from __future__ import annotations

import importlib
import os
import signal
from collections.abc import Callable
from typing import Any

from hbtools.errors import EXIT_INTERRUPTED, EXIT_TERMINATED


def _end_quietly(signum: int, frame: Any) -> None:
    os._exit(EXIT_INTERRUPTED if signum == signal.SIGINT else EXIT_TERMINATED)


def loaded_quietly(module: str, function: str = "main") -> Callable[[], Any]:
    """The entry point that imports ``module`` with ``_end_quietly`` in place, then runs its ``function``."""

    def run() -> Any:
        previous = {sig: signal.signal(sig, _end_quietly) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            tool = getattr(importlib.import_module(module), function)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        try:
            return tool()
        finally:
            # The tool has ended or reported why it stops: Ctrl-C again (the first one's clean-up is quick) would
            # only turn its exit status into the signal's (-2 to a caller instead of 130).
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, signal.SIG_IGN)

    run.tool = (module, function)  # type: ignore[attr-defined]  # what it runs, for tests and readers
    return run


hb_mapper = loaded_quietly("hbtools.cli.hb_mapper")
hmct_debugger = loaded_quietly("hbtools.cli.hmct_debugger")
hb_model_info = loaded_quietly("hbtools.cli.hb_model_info")
hb_pack = loaded_quietly("hbtools.cli.hb_pack")
hb_model_modifier = loaded_quietly("hbtools.cli.hb_model_modifier")
hb_perf = loaded_quietly("hbtools.cli.hb_perf")
hb_verifier = loaded_quietly("hbtools.cli.hb_verifier")
hb_model_verifier = loaded_quietly("hbtools.cli.hb_verifier", "model_verifier")
hrt_model_exec = loaded_quietly("hbtools.cli.hrt_model_exec")
vec_diff = loaded_quietly("hbtools.cli.vec_diff")
hb_custom_op = loaded_quietly("hbtools.cli.hb_custom_op")
hb_eval_preprocess = loaded_quietly("hbtools.cli.hb_eval_preprocess")
