"""The console scripts load their tool with Ctrl-C ending the process quietly (hunt 9 D12: a Ctrl-C in the first
tenths of a second, while click and numpy loaded, printed Python's traceback)."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from hbtools.cli import entry

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_every_console_script_reaches_its_tool(script: str) -> None:
    module, _, name = SCRIPTS[script].partition(":")
    assert module == "hbtools.cli.entry", SCRIPTS[script]
    tool_module, tool_function = getattr(entry, name).tool
    assert callable(getattr(importlib.import_module(tool_module), tool_function))


@pytest.mark.parametrize(("signal_name", "code"), [("SIGINT", 130), ("SIGTERM", 143)])
def test_a_signal_while_a_tool_loads_ends_it_quietly(tmp_path: Path, signal_name: str, code: int) -> None:
    (tmp_path / "slow_tool.py").write_text(
        f"import os, signal\nos.kill(os.getpid(), signal.{signal_name})\nimport time\ntime.sleep(5)\n"
        "def main():\n    print('ran')\n")
    run = subprocess.run([sys.executable, "-c", "from hbtools.cli.entry import loaded_quietly; "
                          "loaded_quietly('slow_tool')()"], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{tmp_path}"})
    assert run.returncode == code and "Traceback" not in run.stderr and "ran" not in run.stdout, run.stderr


@pytest.mark.parametrize("signal_name", ["SIGINT", "SIGTERM"])
def test_a_signal_once_a_tool_has_ended_changes_nothing(tmp_path: Path, signal_name: str) -> None:
    """Ctrl-C pressed twice: the second one arrived as the interrupted tool exited and turned its exit into
    Python's own (a KeyboardInterrupt printed at shutdown; status -2 instead of 130 to a caller; hunt 38)."""
    (tmp_path / "late_signal.py").write_text(
        "import atexit, signal, sys\n"
        "def main():\n"
        f"    atexit.register(signal.raise_signal, signal.{signal_name})  # as the process ends\n"
        "    sys.exit(130)\n")
    run = subprocess.run([sys.executable, "-c", "from hbtools.cli.entry import loaded_quietly; "
                          "loaded_quietly('late_signal')()"], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{tmp_path}"})
    assert run.returncode == 130 and not run.stderr, run.stderr
