"""makertbin on the three real PP-OCR models, checked the way a user checks a conversion.

Held-out samples are never used for calibration. Cosine is meaningless on a det
map that is ~0 everywhere (a picture without text), so det similarity is measured
on held-out pictures whose float map has text pixels.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import onnx
import pytest

from hbtools.config.loader import load_config
from hbtools.eval import ppocr
from hbtools.log import setup
from hbtools.metrics import cosine_similarity
from hbtools.pipeline.runner import artefact_paths, makertbin
from hbtools.runtime import HB_ONNXRuntime
from hbtools.runtime.binfile import read_bin

pytestmark = pytest.mark.integration

SHAPES = {"cls": (1, 3, 48, 192), "det": (1, 3, 640, 640), "rec": (1, 3, 48, 320)}
# Regression floors for calibration_type: default, measured on this data (see the issue notes);
# the targets are in test_accuracy_targets.
FLOOR = {"cls": 0.995, "det": 0.985, "rec": 0.985}


@dataclasses.dataclass
class Converted:
    name: str
    paths: dict[str, Path]
    heldout: list[np.ndarray]
    source: Path
    config: Path


@pytest.fixture(scope="module", params=["cls", "det", "rec"])
def converted(request, ppocr_sample_data) -> Converted:
    name = request.param
    setup(None)
    config_path = ppocr_sample_data.configs[name]
    paths = makertbin(config_path, "onnx")
    files = sorted(ppocr_sample_data.heldout[name].iterdir())
    heldout = [np.fromfile(f, np.uint8).reshape(SHAPES[name]) for f in files]
    return Converted(name, paths, heldout, ppocr_sample_data.models[name], config_path)


def _outputs(model_file: Path, samples: list[np.ndarray]) -> list[np.ndarray]:
    sess = HB_ONNXRuntime(model_file=model_file)
    return [sess.run(None, {sess.input_names[0]: x})[0] for x in samples]


def test_artefacts_exist_check_and_run(converted: Converted) -> None:
    for key in ("original", "optimized", "calibrated", "quantized"):
        model = onnx.load(str(converted.paths[key]))
        onnx.checker.check_model(model)
        out = _outputs(converted.paths[key], converted.heldout[:1])[0]
        assert np.isfinite(out).all(), f"{key} artefact produced non-finite values"
    binfile = read_bin(converted.paths["bin"])
    model = binfile.model()
    assert model.inputs[0]["name"] == "x" and model.inputs[0]["input_type_rt"] == "bgr"
    assert onnx.load_from_string(model.graph).graph.node, "the .bin carries the quantized graph"


def test_original_equals_source_model(converted: Converted) -> None:
    spec = load_config(converted.config).inputs[0]
    mean = np.asarray(spec.mean, dtype=np.float32).reshape(-1, 1, 1)
    scale = np.asarray(spec.scale, dtype=np.float32).reshape(-1, 1, 1)
    source = HB_ONNXRuntime(model_file=converted.source)
    original = _outputs(converted.paths["original"], converted.heldout[:3])
    for x, got in zip(converted.heldout[:3], original, strict=True):
        want = source.run(None, {"x": ((x.astype(np.float32) - mean) * scale).astype(np.float32)})[0]
        # HzPreprocess folds (x - mean) * scale into x * scale + b: float32 rounding only.
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_optimized_matches_original(converted: Converted) -> None:
    original = _outputs(converted.paths["original"], converted.heldout)
    optimized = _outputs(converted.paths["optimized"], converted.heldout)
    diff = max(np.abs(a - b).max() for a, b in zip(original, optimized, strict=True))
    peak = max(np.abs(a).max() for a in original)
    assert diff / peak <= 1e-4, f"optimized vs original: max abs diff {diff} over max abs output {peak}"


def test_quantized_close_to_float(converted: Converted) -> None:
    ref = _outputs(converted.paths["original"], converted.heldout)
    quant = _outputs(converted.paths["quantized"], converted.heldout)
    keep = ppocr.cosine_samples(converted.name, ref)
    assert len(keep) >= 5, "too few usable held-out samples"
    cos = [cosine_similarity(ref[k], quant[k]) for k in keep]
    assert np.mean(cos) >= FLOOR[converted.name], f"{converted.name}: mean held-out cosine {np.mean(cos):.4f}"


def test_calibrated_model_emulates_quantized(converted: Converted) -> None:
    """The calibrated model is the quantized model's exact float emulation (SPEC §7).

    Per held-out sample the two agree (cosine >= 0.9999; a classifier keeps its class): the
    calibrated model follows the integer rounding, so what every search scores is what runs.
    """
    calibrated = _outputs(converted.paths["calibrated"], converted.heldout)
    quant = _outputs(converted.paths["quantized"], converted.heldout)
    ref = _outputs(converted.paths["original"], converted.heldout)
    for k in ppocr.cosine_samples(converted.name, ref):
        cos = cosine_similarity(calibrated[k], quant[k])
        assert cos >= 0.9999, f"{converted.name}: held-out sample {k}: calibrated vs quantized cosine {cos:.6f}"
    if converted.name == "cls":
        flipped = [k for k, (c, q) in enumerate(zip(calibrated, quant, strict=True)) if c.argmax() != q.argmax()]
        assert not flipped, f"cls: held-out samples {flipped} have another class in the quantized model"


def test_accuracy_targets(converted: Converted) -> None:
    """The issue's targets for calibration_type: default."""
    ref = _outputs(converted.paths["original"], converted.heldout)
    quant = _outputs(converted.paths["quantized"], converted.heldout)
    keep = ppocr.cosine_samples(converted.name, ref)
    cos = float(np.mean([cosine_similarity(ref[k], quant[k]) for k in keep]))
    target = {"cls": 0.995, "det": 0.99, "rec": 0.97}[converted.name]
    assert cos >= target, f"{converted.name}: mean held-out cosine {cos:.4f} < {target}"
    if converted.name == "cls":
        flipped = [k for k, (r, q) in enumerate(zip(ref, quant, strict=True)) if r.argmax() != q.argmax()]
        assert not flipped, f"cls: held-out samples {flipped} change class"
    if converted.name == "rec":
        chars = ppocr.rec_characters(converted.source)
        same = [ppocr.ctc_decode(r, chars) == ppocr.ctc_decode(q, chars) for r, q in zip(ref, quant, strict=True)]
        # onnxruntime's quantize_static reaches 35-50 % on this data; stay clearly above it.
        assert np.mean(same) >= 0.65, f"rec: only {np.mean(same):.0%} of held-out lines decode identically"


def test_artefact_paths_follow_prefix(converted: Converted) -> None:
    config = load_config(converted.config)
    assert artefact_paths(config) == converted.paths
