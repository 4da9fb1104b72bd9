"""samples/ppocr_cls: the four scripts a new user runs, in order, from another folder."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[2]
SAMPLE = REPO_ROOT / "samples" / "ppocr_cls"
OUT = REPO_ROOT / "build" / "samples" / "ppocr_cls"


def _script(name: str, cwd: Path) -> str:
    done = subprocess.run(["bash", str(SAMPLE / name)], cwd=cwd, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, f"{name} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_cls_sample_scripts_run_in_order_and_models_agree(ppocr_sample_data, tmp_path):
    # Run from an unrelated folder: the scripts must find their own way.
    checked = _script("01_check.sh", tmp_path)
    assert "BPU subgraph" in checked and (OUT / "hb_mapper_checker.log").is_file()

    prepared = _script("02_preprocess.sh", tmp_path)
    samples = sorted((OUT / "calibration_data").iterdir())
    assert len(samples) >= 50 and f"{len(samples)} calibration samples" in prepared
    assert {p.stat().st_size for p in samples} == {3 * 48 * 192}

    _script("03_build.sh", tmp_path)
    for artefact in ("ppocr_cls.bin", "ppocr_cls_quantized_model.onnx",
                     "ppocr_cls_original_float_model.onnx"):
        assert (OUT / "model_output" / artefact).is_file()

    result = _script("04_inference.sh", tmp_path)
    lines = result.splitlines()
    # Upright first, then upside down; each answered by the float and the quantized model.
    answers = [line.split(":")[1].split()[0] for line in lines if " model: " in line]
    assert answers == ["0", "0", "180", "180"], result
    assert "float and quantized agree: yes (2 of 2 pictures)" in result
    assert list(tmp_path.iterdir()) == []  # nothing written into the caller's folder
