"""Agreement between float and quantized PaddleOCR (PP-OCR) model outputs.

Conventions follow PaddleOCR / RapidOCR post-processing:

- cls (``ch_ppocr_mobile_v2.0_cls``): output N x 2 softmax over the labels
  ``['0', '180']``; the prediction is the argmax.
- det (PP-OCRv4 DB-Net): output N x 1 x H x W text probability map; DBPostProcess
  binarises it at ``thresh`` = 0.3 before finding boxes.
- rec (PP-OCRv4 CRNN/SVTR): output N x T x C softmax; greedy CTC with index 0 the
  blank, then the model's dictionary (ONNX ``metadata_props['character']``, one
  character per line), then ``' '`` appended last (``use_space_char``), so
  C = len(dictionary) + 2.

Only numpy is needed, except ``rec_characters`` which reads the ONNX file.
``cosine`` is ``hbtools.metrics.cosine_similarity``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np

# One cosine implementation for the whole toolchain; re-exported here so task-level
# reports can import everything from hbtools.eval.
from hbtools.metrics import cosine_similarity as cosine

__all__ = [
    "DET_THRESH",
    "DetAgreement",
    "TaskComparison",
    "cls_agreement",
    "compare_outputs",
    "cosine",
    "cosine_samples",
    "ctc_decode",
    "det_agreement",
    "rec_agreement",
    "rec_characters",
]

# DBPostProcess's ``thresh``: a det map pixel above it is text.
DET_THRESH = 0.3


def cls_agreement(float_out: np.ndarray, quant_out: np.ndarray) -> float:
    """Fraction of samples whose argmax class is the same (classes on the last axis)."""
    f = np.asarray(float_out)
    q = np.asarray(quant_out)
    if f.shape != q.shape:
        raise ValueError(f"cls_agreement: shapes differ ({f.shape} vs {q.shape})")
    same = np.argmax(f, axis=-1) == np.argmax(q, axis=-1)
    return float(np.mean(same))


class DetAgreement(NamedTuple):
    """How well two DB probability maps agree after thresholding."""

    pixel_agreement: float  # fraction of pixels on the same side of the threshold
    iou: float  # IoU of the text regions (1.0 when both have none)


def det_agreement(
    float_map: np.ndarray, quant_map: np.ndarray, thresh: float = DET_THRESH
) -> DetAgreement:
    """Compare two det probability maps binarised at ``thresh`` (DBPostProcess's 0.3).

    Pixel agreement alone is dominated by background on sparse text; the IoU of the
    text regions shows whether the text itself is still found.
    """
    f = np.asarray(float_map) > thresh
    q = np.asarray(quant_map) > thresh
    if f.shape != q.shape:
        raise ValueError(f"det_agreement: shapes differ ({f.shape} vs {q.shape})")
    union = int(np.count_nonzero(f | q))
    inter = int(np.count_nonzero(f & q))
    iou = 1.0 if union == 0 else inter / union
    return DetAgreement(float(np.mean(f == q)), float(iou))


def ctc_decode(probs: np.ndarray, characters: Sequence[str]) -> list[str]:
    """Greedy CTC decoding of rec output ``probs`` (N x T x C, or T x C for one line).

    ``characters`` is the model's dictionary as stored (``rec_characters``); the blank
    (index 0) and the trailing space are added here, as RapidOCR's CTCLabelDecode does.
    Repeated indices collapse, then blanks drop.
    """
    p = np.asarray(probs)
    if p.ndim == 2:
        p = p[None]
    if p.ndim != 3:
        raise ValueError(f"ctc_decode: expected N x T x C probabilities, got shape {p.shape}")
    table = ["", *characters, " "]
    if p.shape[-1] != len(table):
        raise ValueError(
            f"ctc_decode: {p.shape[-1]} classes but {len(characters)} characters "
            f"(+ blank + space = {len(table)})"
        )
    idx = np.argmax(p, axis=-1)
    keep = np.ones_like(idx, dtype=bool)
    keep[:, 1:] = idx[:, 1:] != idx[:, :-1]
    keep &= idx != 0
    return ["".join(table[i] for i in row[k]) for row, k in zip(idx, keep, strict=True)]


def rec_agreement(
    float_probs: np.ndarray, quant_probs: np.ndarray, characters: Sequence[str]
) -> float:
    """Fraction of text lines whose greedy-decoded strings are identical."""
    f = ctc_decode(float_probs, characters)
    q = ctc_decode(quant_probs, characters)
    if len(f) != len(q):
        raise ValueError(f"rec_agreement: {len(f)} vs {len(q)} lines")
    return float(np.mean([a == b for a, b in zip(f, q, strict=True)]))


def rec_characters(model_path: str | Path) -> list[str]:
    """The rec model's dictionary from ONNX ``metadata_props['character']``.

    Split with ``str.splitlines`` exactly as RapidOCR's ``get_character_list`` does,
    so indices line up with the model's classes.
    """
    import onnx

    model = onnx.load(str(model_path), load_external_data=False)
    for prop in model.metadata_props:
        if prop.key == "character":
            return prop.value.splitlines()
    raise ValueError(f"{model_path}: no 'character' entry in the model's metadata_props")


def cosine_samples(task: str, float_outs: Sequence[np.ndarray], thresh: float = DET_THRESH) -> list[int]:
    """Indices of the samples over which output cosine similarity means something.

    All of them for cls and rec. For det only the pictures whose float map has text
    (a pixel above ``thresh``): on a map that is ~0 everywhere cosine measures noise.
    """
    if task != "det":
        return list(range(len(float_outs)))
    return [k for k, out in enumerate(float_outs) if (np.asarray(out) > thresh).any()]


@dataclass(frozen=True)
class TaskComparison:
    """A quantized model's held-out outputs against the float model's."""

    cosine_mean: float  # over ``cosine_samples`` (nan when there are none)
    cosine_min: float
    cosine_samples: int
    agreement: float  # cls: same class; det: same side of DET_THRESH per pixel; rec: same string
    iou: float | None = None  # det only: IoU of the thresholded text regions, all samples pooled


def compare_outputs(
    task: str,
    float_outs: Sequence[np.ndarray],
    quant_outs: Sequence[np.ndarray],
    characters: Sequence[str] | None = None,
) -> TaskComparison:
    """Cosine and task agreement of one output per sample; ``characters`` is needed for rec."""
    if len(float_outs) != len(quant_outs) or not float_outs:
        raise ValueError(f"compare_outputs: {len(float_outs)} float vs {len(quant_outs)} quantized outputs")
    keep = cosine_samples(task, float_outs)
    cos = [cosine(float_outs[k], quant_outs[k]) for k in keep]
    mean, low = (float(np.mean(cos)), float(np.min(cos))) if cos else (float("nan"), float("nan"))
    ref, quant = np.concatenate(float_outs), np.concatenate(quant_outs)
    iou = None
    if task == "cls":
        agreement = cls_agreement(ref, quant)
    elif task == "det":
        agreement, iou = det_agreement(ref, quant)
    elif task == "rec":
        if characters is None:
            raise ValueError("compare_outputs: rec needs the model's characters (rec_characters)")
        agreement = rec_agreement(ref, quant, characters)
    else:
        raise ValueError(f"compare_outputs: unknown task {task!r}; expected cls, det or rec")
    return TaskComparison(mean, low, len(keep), agreement, iou)
