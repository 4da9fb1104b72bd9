"""Task-level accuracy helpers: compare a quantized model's outputs with the float
model's in terms the task cares about (same class, same text, same text regions),
beyond a raw cosine similarity."""

from hbtools.eval.ppocr import (
    DET_THRESH,
    DetAgreement,
    TaskComparison,
    cls_agreement,
    compare_outputs,
    cosine,
    cosine_samples,
    ctc_decode,
    det_agreement,
    rec_agreement,
    rec_characters,
)

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
