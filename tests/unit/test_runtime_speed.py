"""benchmarks/runtime_speed.py: reading makertbin's step timings, the table and its targets, bad options."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import runtime_speed  # noqa: E402

LOG = """2026-11-23 16:31:14,001 INFO Select max method
2026-11-23 16:31:20,002 INFO step timings: statistics 3.1 s, method search 4.2 s, GPTQ 10.0 s, int16 search 20.1 s, \
bias correction 2.0 s, quantize 1.5 s, compile 0.8 s
2026-11-23 16:31:20,003 INFO End Model Convert
"""


def test_step_timings_read_from_the_log() -> None:
    assert runtime_speed.step_timings(LOG) == {"statistics": 3.1, "method search": 4.2, "GPTQ": 10.0,
                                               "int16 search": 20.1, "bias correction": 2.0, "quantize": 1.5,
                                               "compile": 0.8}
    assert runtime_speed.step_timings("INFO Select max method\n") == {}


def _row(kind: str, quantized_ms: float, quantized_bytes: int) -> dict:
    ms = {"float": 10.0, "calibrated": 12.0, "quantized": quantized_ms}
    return {"calibration_type": kind,
            "conversion": {"status": "ok", "wall_s": 5.0, "reused": False, "calibration_samples": 50,
                           "int16_activations": 3, "activations": 20,
                           "step_timings_s": runtime_speed.step_timings(LOG) if kind == "default" else {}},
            "sizes": {"quantized_onnx_bytes": quantized_bytes, "bin_bytes": quantized_bytes + 100,
                      "calibrated_onnx_bytes": 4000},
            "ms": {"1": ms, "2": ms}}


def test_table_says_which_targets_hold() -> None:
    result = {"machine": {"date": "2026-11-23", "cpu": "x", "cores": 2, "onnxruntime": "1", "hbtools_commit": "abc"},
              "load_average": [1.0, 1.0, 1.0], "total_wall_s": 9, "command": "python benchmarks/runtime_speed.py",
              "settings": {"runs": 10, "threads": [1, 2]},
              "models": [{"model": "cls", "float_onnx_bytes": 10_000_000,
                          "runs": [_row("max", 15.0, 3_000_000), _row("default", 40.0, 8_000_000),
                                   {"calibration_type": "kl", "conversion": {"status": "failed", "error": "boom"}}]}]}
    text = runtime_speed.markdown(result)
    lines = [ln for ln in text.splitlines() if ln.startswith("| cls |")]
    assert len(lines) == 3
    assert "15.0 (1.50×)" in lines[0] and "3.00 (0.30×)" in lines[0]
    assert lines[0].endswith("latency yes, calibrated yes, size yes |")
    assert lines[1].endswith("latency **no**, calibrated yes, size **no** |")
    assert "**failed**: boom" in lines[2]
    assert "- cls default (50 samples, 5.0 s in all): statistics 3.1, method search 4.2, GPTQ 10.0" in text


@pytest.mark.parametrize(("argv", "message"), [
    (["--models", "cls,nosuch"], "unknown nosuch"),
    (["--types", "fast"], "--types fast"),
    (["--threads", "0"], "--threads"),
    (["--update"], "--update needs an existing --json"),
])
def test_bad_options_are_one_error_line(argv: list[str], message: str, capsys: pytest.CaptureFixture) -> None:
    assert runtime_speed.main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("ERROR ") and message in err[0], err
