"""The PaddleOCR sample models, their data and configs fit together.

Checks what the README's main job relies on: the scripts produce the documented
files, the configs describe those files, and the float models, fed the data
normalised exactly as the configs say, give sensible answers (so later accuracy
comparisons measure quantization, not broken inputs).
"""

from __future__ import annotations

import hashlib
import importlib.util
import re
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import yaml

from hbtools.eval import ctc_decode, rec_characters

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[2]
SHAPES = {"cls": (1, 3, 48, 192), "det": (1, 3, 640, 640), "rec": (1, 3, 48, 320)}
NAME = re.compile(r"^\d{4}_[a-z0-9]+\.bin$")
# Words printed on skimage.data.page(); the rec model should read some of them.
PAGE_WORDS = {"Region", "segmentation", "markers", "background", "extreme", "pixels", "coins"}


def _config(path: Path) -> dict:
    with path.open() as fh:
        return yaml.safe_load(fh)


def _numbers(value: str | float) -> np.ndarray:
    return np.array([float(v) for v in str(value).split()], dtype=np.float32)


def _load(folder: Path, shape: tuple[int, ...]) -> list[tuple[str, np.ndarray]]:
    files = sorted(folder.glob("*.bin"))
    return [(f.name, np.fromfile(f, dtype=np.uint8).reshape(shape)) for f in files]


def _run_float(
    onnx_path: Path, config: Path, model: str, folder: Path
) -> list[tuple[str, np.ndarray]]:
    """Outputs of the float model on every sample, normalised per the config."""
    inputs = _config(config)["input_parameters"]
    mean = _numbers(inputs["mean_value"]).reshape(-1, 1, 1)
    scale = _numbers(inputs["scale_value"]).reshape(-1, 1, 1)
    sess = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    out = []
    for name, x in _load(folder, SHAPES[model]):
        feed = ((x.astype(np.float32) - mean) * scale).astype(np.float32)
        out.append((name, sess.run(None, {inputs["input_name"]: feed})[0]))
    return out


@pytest.mark.parametrize("model", sorted(SHAPES))
def test_files_have_the_documented_layout(ppocr_sample_data, model: str) -> None:
    nbytes = int(np.prod(SHAPES[model]))  # uint8
    digests = {}
    for split, folder, count in (
        ("calibration", ppocr_sample_data.calibration[model], 50),
        ("heldout", ppocr_sample_data.heldout[model], 20),
    ):
        files = sorted(folder.iterdir())
        assert len(files) == count, f"{folder}: {len(files)} files"
        for f in files:
            assert NAME.match(f.name), f.name
            assert f.stat().st_size == nbytes, f"{f}: {f.stat().st_size} bytes"
        digests[split] = {hashlib.sha256(f.read_bytes()).hexdigest() for f in files}
        assert len(digests[split]) == count, f"{split} samples repeat"
    assert not digests["calibration"] & digests["heldout"], "held-out overlaps calibration"


def test_generation_is_deterministic(ppocr_sample_data) -> None:
    spec = importlib.util.spec_from_file_location(
        "make_calibration_data", REPO_ROOT / "scripts" / "make_calibration_data.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    again = module.generate("cls", 50, 20)
    for split, folder in (
        ("calibration", ppocr_sample_data.calibration["cls"]),
        ("heldout", ppocr_sample_data.heldout["cls"]),
    ):
        on_disk = _load(folder, SHAPES["cls"])
        assert [n.split("_", 1)[1] for n, _ in on_disk] == [f"{k}.bin" for k, _ in again[split]]
        for (_, a), (_, b) in zip(on_disk, again[split], strict=True):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("model", sorted(SHAPES))
def test_config_points_at_the_data(ppocr_sample_data, model: str) -> None:
    config_path = ppocr_sample_data.configs[model]
    cfg = _config(config_path)
    assert set(cfg) == {
        "model_parameters",
        "input_parameters",
        "calibration_parameters",
        "compiler_parameters",
    }
    base = config_path.parent  # relative paths resolve against the YAML's folder
    onnx_model = (base / cfg["model_parameters"]["onnx_model"]).resolve()
    cal_dir = (base / cfg["calibration_parameters"]["cal_data_dir"]).resolve()
    assert onnx_model == ppocr_sample_data.models[model].resolve()
    assert cal_dir == ppocr_sample_data.calibration[model].resolve()
    inputs = cfg["input_parameters"]
    shape = tuple(int(d) for d in inputs["input_shape"].split("x"))
    assert shape == SHAPES[model]
    assert inputs["input_type_train"] == inputs["input_type_rt"] == "bgr"
    assert cfg["calibration_parameters"]["cal_data_type"] == "uint8"
    mean, scale = _numbers(inputs["mean_value"]), _numbers(inputs["scale_value"])
    if model == "det":  # ImageNet statistics applied to the BGR image as PaddleOCR does
        np.testing.assert_allclose(mean / 255, [0.485, 0.456, 0.406], rtol=1e-6)
        np.testing.assert_allclose(1 / (scale * 255), [0.229, 0.224, 0.225], rtol=1e-6)
    else:  # (x / 255 - 0.5) / 0.5
        np.testing.assert_allclose(mean, [127.5], rtol=1e-6)
        np.testing.assert_allclose(scale, [1 / 127.5], rtol=1e-6)


@pytest.mark.parametrize("model", sorted(SHAPES))
def test_config_loads_and_finds_the_calibration_set(ppocr_sample_data, model: str) -> None:
    loader = pytest.importorskip("hbtools.config.loader")
    calibration = pytest.importorskip("hbtools.data.calibration")
    cfg = loader.load_config(ppocr_sample_data.configs[model])
    assert cfg.model.march == "bayes-e"
    assert calibration.preflight(cfg.inputs) == 50


def test_cls_float_model_tells_upright_from_upside_down(ppocr_sample_data) -> None:
    d = ppocr_sample_data
    outputs = [
        *_run_float(d.models["cls"], d.configs["cls"], "cls", d.calibration["cls"]),
        *_run_float(d.models["cls"], d.configs["cls"], "cls", d.heldout["cls"]),
    ]
    # Printed page lines are unambiguous; handwriting and photos may go either way.
    page = [(name, y) for name, y in outputs if "_page" in name]
    assert len(page) >= 20
    correct = [int(np.argmax(y)) == (1 if "page180" in name else 0) for name, y in page]
    assert np.mean(correct) >= 0.8, f"cls accuracy on page lines {np.mean(correct):.2f}"
    for _, y in outputs:
        assert y.shape == (1, 2)
        np.testing.assert_allclose(y.sum(), 1.0, atol=1e-4)


def test_det_float_model_finds_text_on_pages(ppocr_sample_data) -> None:
    d = ppocr_sample_data
    # Held-out only: det is the slow model and 20 samples cover every kind.
    outputs = _run_float(d.models["det"], d.configs["det"], "det", d.heldout["det"])
    text_fraction = {name: float(np.mean(y > 0.3)) for name, y in outputs}
    assert all(y.shape == (1, 1, 640, 640) for _, y in outputs)
    page = [v for name, v in text_fraction.items() if "_page" in name]
    natural = [v for name, v in text_fraction.items() if "_natural" in name]
    assert page and natural
    assert min(page) > 0.01, text_fraction
    assert np.mean(natural) < np.mean(page) / 5, text_fraction


def test_rec_float_model_reads_page_lines(ppocr_sample_data) -> None:
    d = ppocr_sample_data
    characters = rec_characters(d.models["rec"])
    outputs = [
        *_run_float(d.models["rec"], d.configs["rec"], "rec", d.calibration["rec"]),
        *_run_float(d.models["rec"], d.configs["rec"], "rec", d.heldout["rec"]),
    ]
    assert outputs[0][1].shape[-1] == len(characters) + 2  # blank + dictionary + space
    page = [ctc_decode(y, characters)[0] for name, y in outputs if "_page" in name]
    assert len(page) >= 20
    assert np.mean([bool(t.strip()) for t in page]) >= 0.9, page
    read = {w for t in page for w in re.findall(r"[A-Za-z]+", t)}
    assert len(read & PAGE_WORDS) >= 3, sorted(read)
