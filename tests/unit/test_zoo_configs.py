"""configs/zoo/ and the corpus table of scripts/fetch_models.py describe the same models."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
import fetch_models  # noqa: E402
import make_calibration_data  # noqa: E402


def test_every_corpus_model_has_a_config_and_sample_data() -> None:
    configs = {p.stem: yaml.safe_load(p.read_text()) for p in (REPO / "configs" / "zoo").glob("*.yaml")}
    assert set(configs) == set(fetch_models.ZOO)
    for name, config in configs.items():
        assert config["model_parameters"]["onnx_model"] == f"../../build/models/zoo/{name}.onnx"
        assert config["calibration_parameters"]["cal_data_dir"] == f"../../build/calibration/zoo_{name}"
        assert fetch_models.ZOO[name].task in make_calibration_data.SHAPES
        shape = [int(v) for v in config["input_parameters"]["input_shape"].split("x")]
        assert len(shape) == 4 and shape[:2] == [1, 3], (name, shape)


def test_captcha_samples_are_distinct_pictures() -> None:
    splits = make_calibration_data.generate("captcha", 3, 2)
    arrays = [a for split in splits.values() for _, a in split]
    assert all(a.shape == (1, 3, 60, 160) and a.dtype.name == "uint8" for a in arrays)
    assert len({a.tobytes() for a in arrays}) == 5
    assert all(a.std() > 10 for a in arrays), "a rendered captcha must not be blank"
