"""benchmarks/compare_ort.py's run measurement and failure reporting, on tiny models."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from builders import resnet_like

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
import compare_ort  # noqa: E402
import compare_report  # noqa: E402


def _peer_cmd(model: Path, out: Path, data: Path, shape: str, report: Path) -> list[str]:
    return [sys.executable, str(BENCHMARKS / "ort_peer.py"), "--model", str(model), "--out", str(out),
            "--method", "MinMax", "--data", str(data), "--input-name", "data", "--shape", shape,
            "--mean", "127.5", "--scale", "0.0078125", "--report", str(report)]


@pytest.fixture
def tiny(tmp_path: Path) -> tuple[Path, Path]:
    """An opset-11 Conv/BN/Gemm model (so the opset-13 fix has work to do) and 4 uint8 samples."""
    model = tmp_path / "tiny.onnx"
    onnx.save(resnet_like(h=16, opset=11).model, str(model))
    data = tmp_path / "cal"
    data.mkdir()
    rng = np.random.default_rng(0)
    for k in range(4):
        rng.integers(0, 256, (1, 3, 16, 16), dtype=np.uint8).tofile(data / f"{k:04d}.bin")
    return model, data


def test_peer_run_makes_a_valid_per_channel_qdq_model(tiny, tmp_path: Path) -> None:
    model, data = tiny
    out, report = tmp_path / "q.onnx", tmp_path / "steps.json"
    measured = compare_ort.run_measured(_peer_cmd(model, out, data, "1x3x16x16", report),
                                        mem_limit_gb=8, cwd=tmp_path)
    assert measured.error() is None, measured.stderr[-2000:]
    assert measured.peak_rss_mb > 10
    quant = onnx.load(str(out))
    onnx.checker.check_model(quant)
    assert max(o.version for o in quant.opset_import if o.domain in ("", "ai.onnx")) >= 13
    inits = {t.name: t for t in quant.graph.initializer}
    conv = next(n for n in quant.graph.node if n.op_type == "Conv")
    weight_dq = next(n for n in quant.graph.node if n.output[0] == conv.input[1])
    assert weight_dq.op_type == "DequantizeLinear"
    assert list(inits[weight_dq.input[1]].dims) == [8], "per-channel: one weight scale per output channel"
    assert set(json.loads(report.read_text())) == {"prepare_s", "quantize_s"}


def test_failing_peer_run_is_a_table_row_with_its_error(tiny, tmp_path: Path) -> None:
    model, data = tiny
    # Four channels into a Conv whose weights take three: onnxruntime refuses the model.
    for f in data.iterdir():
        np.zeros((1, 4, 16, 16), np.uint8).tofile(f)
    out = tmp_path / "q.onnx"
    measured = compare_ort.run_measured(_peer_cmd(model, out, data, "1x4x16x16", tmp_path / "r.json"),
                                        mem_limit_gb=8, cwd=tmp_path)
    error = measured.error()
    assert measured.returncode == 1 and error and not error.startswith("exit status")
    assert not out.exists()
    ours = {"tool": compare_ort.OURS, "status": "ok", "error": None, "wall_s": 20.0, "peak_rss_mb": 300,
            "cosine_mean": 0.999, "cosine_min": 0.99, "cosine_samples": 4, "agreement": 1.0, "iou": None,
            "infer_ms": 30.0, "float_ms": 2.0}
    failed = {"tool": "ORT MinMax", "status": "failed", "error": error, "wall_s": round(measured.wall_s, 1),
              "peak_rss_mb": round(measured.peak_rss_mb)}
    result = {"model": "cls", "source": "tiny.onnx", "input_shape": [1, 4, 16, 16], "calibration_samples": 4,
              "heldout_samples": 4, "cosine_samples": 4, "agreement": "same class", "runs": [ours, failed]}
    table = compare_report.model_table(result)
    row = next(line for line in table.splitlines() if line.startswith("| ORT MinMax"))
    assert "**failed**" in row and error.replace("|", "\\|")[:60] in row
    assert "No comparison: every ORT run failed." in table


def test_memory_cap_and_signals_are_reported(tmp_path: Path) -> None:
    hog = compare_ort.run_measured([sys.executable, "-c", "b = bytearray(3 * 2**30)"], mem_limit_gb=1, cwd=tmp_path)
    assert "MemoryError" in hog.error()
    killed = compare_ort.run_measured([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"],
                                      mem_limit_gb=1, cwd=tmp_path)
    assert killed.error().startswith("killed by SIGKILL")
    slow = compare_ort.run_measured([sys.executable, "-c", "import time; time.sleep(30)"], mem_limit_gb=1,
                                    cwd=tmp_path, timeout_s=0.5)
    assert slow.error().startswith("timed out")


def test_standing_lists_where_ours_is_behind() -> None:
    def row(tool: str, **values: float) -> dict:
        base = {"status": "ok", "cosine_mean": 0.99, "cosine_min": 0.95, "agreement": 0.9, "wall_s": 10.0,
                "peak_rss_mb": 100, "infer_ms": 5.0}
        return {"tool": tool, **base, **values}

    model = {"runs": [row("ours"), row("ORT A", cosine_mean=0.995, wall_s=2.0), row("ORT B", agreement=0.8),
                      {"tool": "ORT C", "status": "failed", "error": "MemoryError"}]}
    summary = compare_report.standing(model)
    assert summary["best_peer"] == "ORT A"
    assert {e["metric"] for e in summary["behind"]} == {"cosine_mean", "wall_s"}
    assert summary["ahead"] == []


@pytest.mark.parametrize(("cal", "stride", "want"), [(50, 10, 10), (48, 10, 8), (7, 10, 0), (50, 0, 0), (8, 4, 4)])
def test_stride_divides_the_calibration_set(cal: int, stride: int, want: int) -> None:
    assert compare_report.stride_for(cal, stride) == want


def test_bad_options_are_one_error_line(capsys) -> None:
    assert compare_ort.main(["--models", "cls,foo"]) == 1
    assert capsys.readouterr().err.strip() == "ERROR --models: unknown foo; choose from cls,det,rec"
    assert compare_ort.main(["--input-shape", "det=640x320"]) == 1
    assert capsys.readouterr().err.startswith("ERROR det input must be square")
