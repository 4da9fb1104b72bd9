"""Similarity metrics between a float and a quantized tensor: the one implementation.

The debugger, the makertbin similarity table, vec_diff and the benchmarks all use
these. Each takes two arrays and returns a float. The arrays normally have one size; where they
do not (an output whose size depends on the data, such as NonMaxSuppression's selections, a
NonZero, or boxes gathered by them), the shorter is taken as zeros past its end, so each value
one side has and the other lacks counts as an error.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np


def _flat(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return _same_size(np.asarray(a, dtype=np.float64).reshape(-1), np.asarray(b, dtype=np.float64).reshape(-1))


def _same_size(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Flat ``a`` and ``b``, the shorter padded with zeros to the other's size."""
    if a.size < b.size:
        a = np.concatenate([a, np.zeros(b.size - a.size, a.dtype)])
    elif b.size < a.size:
        b = np.concatenate([b, np.zeros(a.size - b.size, b.dtype)])
    return a, b


CHUNK = 1 << 20  # elements converted to float64 at a time: large tensors get no full-size copies


def _dot(x: np.ndarray, y: np.ndarray) -> float:
    """``x . y`` of two flat float64 arrays on the calling thread.

    Not BLAS: OpenBLAS splits a long dot product over threads that then spin for a while, and
    the metrics run between onnxruntime runs (debugger sweeps, makertbin's searches), whose
    threads they starved: the debugger's PP-OCR rec weight sensitivity took 15.0 s instead of
    9.3 s. A threaded sum also depends on the machine's core count; this one does not.
    """
    return float(np.einsum("i,i->", x, y))


def cosine_similarity(a: np.ndarray, b: np.ndarray) -> float:
    return cosine_of_products(*products(a, b))


def products(a: np.ndarray, b: np.ndarray) -> tuple[float, float, float]:
    """``a . b``, ``a . a`` and ``b . b`` of two tensors, accumulated in float64."""
    a, b = _same_size(np.asarray(a).reshape(-1), np.asarray(b).reshape(-1))
    return _products((a[s:s + CHUNK], b[s:s + CHUNK]) for s in range(0, a.size, CHUNK))


def _products(pairs: Iterable[tuple[np.ndarray, np.ndarray]]) -> tuple[float, float, float]:
    dot = aa = bb = 0.0
    for x, y in pairs:
        x, y = _flat(x, y)
        dot, aa, bb = dot + _dot(x, y), aa + _dot(x, x), bb + _dot(y, y)
    return dot, aa, bb


class CosineTo:
    """``cosine_similarity(a, b)`` of one ``a`` against many ``b`` (a float output against its quantized runs).

    The float64 pieces of ``a`` and ``a . a`` are made once, and each ``b`` is converted into a
    buffer kept between calls: two fresh float64 copies per call were mostly the system handing
    out pages (2.6 ms of 3.8 on a PP-OCR rec output). The same products are summed in the same
    order, so the value is exactly ``cosine_similarity``'s.
    """

    def __init__(self, a: np.ndarray) -> None:
        self.a = np.asarray(a).reshape(-1)
        self._pieces = [np.asarray(self.a[s:s + CHUNK], dtype=np.float64) for s in range(0, self.a.size, CHUNK)]
        self._squares = [_dot(x, x) for x in self._pieces]
        self._buffer = np.empty(0)

    def __call__(self, b: np.ndarray) -> float:
        b = np.asarray(b).reshape(-1)
        if b.size != self.a.size:
            return cosine_similarity(self.a, b)
        if self._buffer.size < min(b.size, CHUNK):
            self._buffer = np.empty(min(b.size, CHUNK))
        dot = aa = bb = 0.0
        for s, x, xx in zip(range(0, b.size, CHUNK), self._pieces, self._squares, strict=True):
            y = self._buffer[:x.size]
            np.copyto(y, b[s:s + CHUNK], casting="unsafe")
            dot, aa, bb = dot + _dot(x, y), aa + xx, bb + _dot(y, y)
        return cosine_of_products(dot, aa, bb)


def cosine_of_chunks(pairs: Iterable[tuple[np.ndarray, np.ndarray]]) -> float:
    """Cosine similarity of two tensors given as matching pieces (accumulated in float64)."""
    return cosine_of_products(*_products(pairs))


def cosine_of_products(dot: float, aa: float, bb: float) -> float:
    """The cosine of two vectors from ``a . b``, ``a . a`` and ``b . b`` (1 for two zero vectors)."""
    na, nb = np.sqrt(aa), np.sqrt(bb)
    if na == 0 and nb == 0:
        return 1.0
    if na == 0 or nb == 0:
        return 0.0
    with np.errstate(invalid="ignore"):  # inf outputs (a -inf mask fill): NaN, shown as such, not a console warning
        return float(dot / (na * nb))


def mse(a: np.ndarray, b: np.ndarray) -> float:
    a, b = _flat(a, b)
    return float(np.mean((a - b) ** 2)) if a.size else 0.0


def mre(a: np.ndarray, b: np.ndarray) -> float:
    """Mean relative error |a - b| / |a| over elements where a is not zero."""
    a, b = _flat(a, b)
    mask = a != 0
    return float(np.mean(np.abs(a[mask] - b[mask]) / np.abs(a[mask]))) if mask.any() else 0.0


def sqnr(a: np.ndarray, b: np.ndarray) -> float:
    """Signal-to-quantization-noise ratio in dB (a is the reference)."""
    a, b = _flat(a, b)
    noise = np.sum((a - b) ** 2)
    signal = np.sum(a**2)
    if noise == 0:
        return float("inf")
    if signal == 0:
        return float("-inf")
    return float(10.0 * np.log10(signal / noise))


def chebyshev(a: np.ndarray, b: np.ndarray) -> float:
    """Largest absolute difference."""
    a, b = _flat(a, b)
    return float(np.max(np.abs(a - b))) if a.size else 0.0


def l1_distance(a: np.ndarray, b: np.ndarray) -> float:
    """Mean absolute difference (the vendor's makertbin output table: ``||a - b||_1 / n``)."""
    a, b = _flat(a, b)
    return float(np.mean(np.abs(a - b))) if a.size else 0.0


def l2_distance(a: np.ndarray, b: np.ndarray) -> float:
    """Euclidean norm of the difference over the element count (the vendor's table: ``||a - b||_2 / n``)."""
    a, b = _flat(a, b)
    return float(np.linalg.norm(a - b) / a.size) if a.size else 0.0


def relative_euclidean_distance(a: np.ndarray, b: np.ndarray) -> float:
    a, b = _flat(a, b)
    na = np.linalg.norm(a)
    return float(np.linalg.norm(a - b) / na) if na else float(np.linalg.norm(b))


METRICS = {
    "cosine-similarity": cosine_similarity,
    "mse": mse,
    "mre": mre,
    "sqnr": sqnr,
    "chebyshev": chebyshev,
}
# Metrics where a larger value means closer (rank ascending to find the worst first).
HIGHER_IS_BETTER = {"cosine-similarity", "sqnr"}


def average(metric: str, values, axis: int | None = None):
    """The mean of ``metric`` values (over samples, outputs or nodes).

    SQNR is averaged as noise power relative to the signal, then put back in dB: a plain mean of dB values
    is infinite as soon as one sample or output has no error at all, which ranked nodes that do cause
    error as the least sensitive.
    """
    v = np.asarray(values, dtype=np.float64)
    if metric != "sqnr":
        return v.mean(axis=axis)
    with np.errstate(over="ignore", divide="ignore"):
        return -10.0 * np.log10(np.power(10.0, -v / 10.0).mean(axis=axis))


def running_average(metric: str, values) -> np.ndarray:
    """``average`` of the first 1, 2, ... values along the last axis."""
    v = np.asarray(values, dtype=np.float64)
    count = np.arange(1, v.shape[-1] + 1)
    if metric != "sqnr":
        return np.cumsum(v, axis=-1) / count
    with np.errstate(over="ignore", divide="ignore"):
        return -10.0 * np.log10(np.cumsum(np.power(10.0, -v / 10.0), axis=-1) / count)
