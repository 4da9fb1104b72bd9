"""The tools' start-up imports nothing heavy (report T7).

Until a command's body runs, a Ctrl-C is no "ERROR interrupted" but a Python traceback (SIGTERM
is not even handled yet): the cli modules import click and argument parsing only, and the work's
modules (onnx, onnxruntime, numpy, scipy, scikit-image, matplotlib) inside the bodies that
``reports_errors`` wraps. hb_eval_preprocess was exposed for 0.7 s, hb_model_modifier 0.45 s.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("numpy", "onnx", "onnxruntime", "scipy", "skimage", "matplotlib", "PIL")
CLI = sorted(p.stem for p in (REPO / "hbtools" / "cli").glob("*.py") if p.stem not in ("__init__", "common"))


@pytest.mark.parametrize("module", CLI)
def test_importing_a_tool_loads_no_heavy_module(module: str) -> None:
    code = (f"import sys, json, hbtools.cli.{module}; "
            f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout) == [], f"hbtools.cli.{module} imports at start-up: {run.stdout}"


def test_the_tools_are_all_checked() -> None:
    assert {"hb_eval_preprocess", "hb_model_modifier", "hrt_model_exec", "hb_mapper"} <= set(CLI)
