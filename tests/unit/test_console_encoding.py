"""A console whose encoding cannot show a path's characters still gets the ERROR line (hunt 38 D9)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def test_an_ascii_console_gets_the_error_about_a_non_ascii_path(tmp_path: Path) -> None:
    missing = tmp_path / "模型" / "缺少.onnx"
    env = {**os.environ, "PYTHONIOENCODING": "ascii"}
    command = [sys.executable, "-c", "from hbtools.cli.entry import hb_mapper; hb_mapper()", "checker",
               "--model-type", "onnx", "--march", "bayes-e", "--model", str(missing)]
    done = subprocess.run(command,
                          cwd=tmp_path, env=env, capture_output=True, timeout=120)
    out = (done.stdout + done.stderr).decode("ascii", "replace")
    assert done.returncode != 0, out
    assert "Traceback" not in out and "Logging error" not in out, out
    errors = [line for line in out.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and "\\u6a21\\u578b" in errors[0] and "does not exist" in errors[0], out


def test_names_the_font_lacks_print_no_warnings(tmp_path: Path) -> None:
    """hunt 38 D17: a CJK node name in a structure picture put matplotlib's glyph warnings, with hbtools' source
    lines, on the console."""
    script = ("import io\nfrom hbtools.plotting import plt\nfig = plt.figure()\nfig.text(0.1, 0.5, '节点_输出')\n"
              "fig.savefig(io.BytesIO(), format='png')\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, timeout=120)
    assert done.returncode == 0 and done.stderr == b"", done.stderr.decode("utf-8", "replace")
