"""configs/zoo/ and the corpus table of scripts/fetch_models.py describe the same models."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
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
        assert (fetch_models.ZOO[name].data or fetch_models.ZOO[name].task) in make_calibration_data.SHAPES
        shape = [int(v) for v in config["input_parameters"]["input_shape"].split("x")]
        assert len(shape) == 4 and shape[:2] == [1, 3], (name, shape)


def test_captcha_samples_are_distinct_pictures() -> None:
    splits = make_calibration_data.generate("captcha", 3, 2)
    arrays = [a for split in splits.values() for _, a in split]
    assert all(a.shape == (1, 3, 60, 160) and a.dtype.name == "uint8" for a in arrays)
    assert len({a.tobytes() for a in arrays}) == 5
    assert all(a.std() > 10 for a in arrays), "a rendered captcha must not be blank"


def test_detect_samples_are_letterboxed_pictures_in_the_asked_channel_order() -> None:
    bgr = make_calibration_data.generate("detect", 3, 2, (96, 128))
    rgb = make_calibration_data.generate("detect", 3, 2, (96, 128), rgb=True)
    for split in bgr:
        for (kind, a), (_, b) in zip(bgr[split], rgb[split], strict=True):
            assert a.shape == (1, 3, 96, 128) and a.dtype.name == "uint8"
            assert np.array_equal(a[:, ::-1], b), "rgb=True must be the same picture with R and B swapped"
            assert a.std() > 10, f"a {kind} sample must not be blank"
    # A picture is fitted in with its aspect kept: the bottom-right corner is the grey padding
    # on the landscape ('wide') samples of a taller-than-the-picture input.
    wide = [a for split in bgr.values() for kind, a in split if kind == "wide"]
    assert wide and all((a[0, :, -1, -1] == make_calibration_data.LETTERBOX_FILL).all() for a in wide)


def test_detect_agreement_reads_the_class_scores_of_either_layout() -> None:
    sys.path.insert(0, str(REPO / "benchmarks"))
    import zoo

    rng = np.random.default_rng(0)
    # YOLOv8 layout: 1 x (4 box + 3 classes) x anchors; boxes in pixels, scores in [0, 1].
    v8 = np.concatenate([rng.uniform(0, 320, (1, 4, 50)), rng.uniform(0, 0.5, (1, 3, 50))], axis=1)
    noisy = v8.copy()
    noisy[:, 4:] += rng.normal(0, 0.05, noisy[:, 4:].shape)
    same = zoo.compare("detect", [v8], [v8.copy()], (1, 4, None))
    assert same["cosine_mean"] == pytest.approx(1.0) and same["agreement"] == 1.0
    worse = zoo.compare("detect", [v8], [noisy], (1, 4, None))
    assert worse["cosine_mean"] < 0.999 and worse["agreement"] < 1.0
    quiet = v8.copy()
    quiet[:, 4:] *= 0.2  # nothing detected (every score < 0.25): no cosine, whatever the noise
    assert zoo.compare("detect", [v8, quiet], [v8, quiet + 0.01], (1, 4, None))["cosine_samples"] == 1
    moved = v8.copy()
    moved[:, :4] += 5.0  # boxes a few pixels off, scores the same: the scores are what is compared
    shifted = zoo.compare("detect", [v8], [moved], (1, 4, None))
    assert shifted["cosine_mean"] == pytest.approx(1.0)
    # The boxes are compared where the float model detects: centres moved 5 px on both axes.
    sized = v8.copy()
    sized[:, 2:4] = rng.uniform(20, 100, (1, 2, 50))
    centred = sized.copy()
    centred[:, :2] += 5.0
    boxes = zoo.compare("detect", [sized], [centred], (1, 4, None))
    detected = v8[0, 4:].max(axis=0) >= zoo.DETECT_THRESH
    w, h = sized[0, 2, detected], sized[0, 3, detected]
    iou = (w - 5) * (h - 5) / (2 * w * h - (w - 5) * (h - 5))
    assert boxes["boxes"] == detected.sum() > 0
    assert boxes["box_iou_min"] == pytest.approx(iou.min()) and boxes["box_iou_mean"] == pytest.approx(iou.mean())
    assert same["box_iou_mean"] == pytest.approx(1.0)
    # YOLOX layout: anchors x (4 box + objectness + classes); a class counts times the objectness.
    yolox = np.concatenate([rng.uniform(0, 416, (1, 50, 4)), rng.uniform(0, 1, (1, 50, 2))], axis=2)
    # A raw YOLOX head's boxes, decoded as ddddocr does: a 32 x 32 input has 16 + 4 + 1 cells at
    # strides 8, 16, 32, row by row; offsets 0.5 put each centre in its cell's middle, log 4 sizes 4 cells.
    raw = np.zeros((1, 21, 6))
    raw[0, :, :2], raw[0, :, 2:4] = 0.5, np.log(4.0)
    boxes = zoo.decoded_boxes(raw, (-1, 5, 4), ((8, 16, 32), (32, 32)))
    assert np.allclose(boxes[5], [12, 12, 32, 32]) and np.allclose(boxes[7], [28, 12, 32, 32])
    assert np.allclose(boxes[16], [8, 8, 64, 64]) and np.allclose(boxes[20], [16, 16, 128, 128])
    scores = zoo.detect_scores([yolox], (-1, 5, 4))[0]
    assert scores.shape == (50, 1)
    assert np.allclose(scores[:, 0], yolox[0, :, 4] * yolox[0, :, 5])
