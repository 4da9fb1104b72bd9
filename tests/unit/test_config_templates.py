"""configs/templates: every parameter present at its default, valid once the paths exist, and
(for ONNX) convertible by ``hb_mapper makertbin`` as they stand.

A user copies a template next to their model and calibration folder; so does this test:
the template's own relative paths (./model.onnx, ./calibration_data ...) are made to exist.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml
from bin_fixtures import invoke
from builders import resnet_like

from hbtools.cli.hb_mapper import main as hb_mapper
from hbtools.config.loader import load_config
from hbtools.config.schema import GROUP_KEYS, GROUPS, LEGACY_KEYS, validate_group

TEMPLATES = Path(__file__).resolve().parents[2] / "configs" / "templates"
# template -> (march, model type)
EXPECTED = {
    "x3_onnx": ("bernoulli2", "onnx"),
    "x3_caffe": ("bernoulli2", "caffe"),
    "ultra_onnx": ("bayes", "onnx"),
    "ultra_caffe": ("bayes", "caffe"),
    "x5_onnx": ("bayes-e", "onnx"),
    "x5_caffe": ("bayes-e", "caffe"),
}
CAL_SAMPLES = 3
REQUIRED = {
    "model_parameters": {"march": "bayes", "onnx_model": "m.onnx", "prototxt": "m.prototxt",
                         "caffe_model": "m.caffemodel"},
    "input_parameters": {"input_type_train": "rgb", "input_layout_train": "NCHW", "input_type_rt": "rgb"},
}


def _raw(name: str) -> dict:
    return yaml.safe_load((TEMPLATES / f"{name}.yaml").read_text())


def _place(name: str, folder: Path) -> Path:
    """Copy the template into ``folder`` and create the files its relative paths name."""
    config = shutil.copy(TEMPLATES / f"{name}.yaml", folder / f"{name}.yaml")
    raw = _raw(name)
    mp, cp = raw["model_parameters"], raw["calibration_parameters"]
    h = 16
    if EXPECTED[name][1] == "onnx":
        onnx.save(resnet_like(h).model, str(folder / mp["onnx_model"]))
    else:  # the Caffe front end reads these; validation only needs them to exist
        (folder / mp["prototxt"]).write_text('name: "template"\n')
        (folder / mp["caffe_model"]).write_bytes(b"")
    cal = folder / cp["cal_data_dir"]
    cal.mkdir()
    rng = np.random.default_rng(0)
    for i in range(CAL_SAMPLES):  # uint8 rgb NCHW, the template's input_type_train / layout
        rng.integers(0, 256, size=(1, 3, h, h), dtype=np.uint8).tofile(cal / f"{i}.bin")
    return Path(config)


def test_every_template_is_there() -> None:
    assert sorted(p.stem for p in TEMPLATES.glob("*.yaml")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_template_lists_every_parameter_at_its_default(name: str) -> None:
    raw = _raw(name)
    assert list(raw) == list(GROUPS)
    for group in GROUPS:
        assert set(raw[group]) == set(GROUP_KEYS[group]) - LEGACY_KEYS, group
    model_type = EXPECTED[name][1]
    for group in GROUPS:
        # The schema's defaults are what a group holding only its required parameters
        # normalises to; the template must normalise to the same value for each of them.
        required = REQUIRED.get(group, {})
        defaults = validate_group(group, required, model_type)
        ours = validate_group(group, raw[group], model_type)
        for key in set(defaults) - set(required):
            assert ours.get(key) == defaults[key], f"{name}: {group}.{key}"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_template_validates_once_the_paths_exist(name: str, tmp_path: Path) -> None:
    march, model_type = EXPECTED[name]
    config = load_config(_place(name, tmp_path), model_type)
    assert config.model.march == march
    assert config.calibration.calibration_type == "default"
    assert config.inputs[0].type_rt == "nv12" and config.inputs[0].norm_type == "no_preprocess"
    assert config.custom_op.op_register_files == []


@pytest.mark.parametrize("name", [n for n, (_, kind) in sorted(EXPECTED.items()) if kind == "onnx"])
def test_onnx_template_converts(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = _place(name, tmp_path)
    monkeypatch.chdir(tmp_path)
    result = invoke(hb_mapper, ["makertbin", "--config", config, "--model-type", "onnx"])
    assert result.exit_code == 0, result.output
    assert "Convert to runtime bin file successfully!" in result.output
    assert "ERROR" not in result.output
    out = tmp_path / "model_output"
    for suffix in ("_original_float_model.onnx", "_optimized_float_model.onnx", "_calibrated_model.onnx",
                   "_quantized_model.onnx", ".bin"):
        assert (out / f"model{suffix}").is_file(), suffix
