"""vec_diff: compare vectors dumped by two models (files, or folders matched by file name).

Typical use: the ``${layer}_float.bin`` files ``hb_mapper infer`` writes for a
float and a quantized artefact. The metrics are those of ``hbtools.metrics``
(the one implementation); the right-hand file is the reference for the
relative Euclidean distance, as in the seed's example (quantized left, float
right).
"""

from __future__ import annotations

import csv
import io
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hbtools.data.folders import natural_key, sample_files
from hbtools.data.npy import load_npy
from hbtools.errors import HbError
from hbtools.metrics import chebyshev, cosine_similarity, mse, relative_euclidean_distance
from hbtools.outputs import write_file

log = logging.getLogger("hbtools")

COLUMNS = ("Left Files", "Right Files", "Cosine Similarity", "Relative Euclidean Distance", "Max Absolute Error",
           "Mean Square Error")


@dataclass(frozen=True)
class Row:
    left: str
    right: str
    cosine: float
    relative_euclidean: float
    max_abs: float
    mse: float

    def values(self) -> tuple:
        return self.left, self.right, self.cosine, self.relative_euclidean, self.max_abs, self.mse


def read_vector(path: Path) -> np.ndarray:
    """A dumped vector: ``.npy``, text (``.txt``: numbers separated by spaces, commas or newlines),
    or raw float32 (``numpy.tofile``, what ``hb_mapper infer`` writes)."""
    try:
        suffix = path.suffix.lower()
        if suffix == ".npy":
            return load_npy(path).reshape(-1)
        if suffix == ".txt":
            return np.array(path.read_text().replace(",", " ").split(), dtype=np.float64)
        if path.stat().st_size % 4:
            raise ValueError(f"{path.stat().st_size} bytes is not a whole number of float32 values")
        return np.fromfile(path, dtype=np.float32)
    except (OSError, ValueError) as exc:
        raise HbError(f"cannot read {path}: {exc}") from exc


def pairs(left: Path, right: Path) -> list[tuple[Path, Path]]:
    """File pairs to compare: the two files, or same-named files of two folders."""
    for p in (left, right):
        if not p.exists():
            raise HbError(f"{p} does not exist")
    if left.is_file() and right.is_file():
        return [(left, right)]
    if not (left.is_dir() and right.is_dir()):
        raise HbError(f"{left} and {right} must both be files or both be folders")
    names_l = {p.name for p in sample_files(left)}
    names_r = {p.name for p in sample_files(right)}
    common = sorted(names_l & names_r, key=natural_key)
    if not common:
        raise HbError(f"{left} and {right} have no file name in common")
    for only, side in ((names_l - names_r, right), (names_r - names_l, left)):
        if only:
            log.warning("%d file(s) have no counterpart in %s: %s", len(only), side, ", ".join(sorted(only)))
    return [(left / n, right / n) for n in common]


def compare(left: Path, right: Path) -> list[Row]:
    rows = []
    matched = pairs(left, right)
    folder = left.is_dir()
    for lp, rp in matched:
        a, b = read_vector(lp), read_vector(rp)
        message = None
        if a.size != b.size:
            message = f"{lp} has {a.size} values but {rp} has {b.size}"
        elif a.size == 0:
            message = f"{lp} and {rp} hold no values"
        if message is not None:
            if not folder:
                raise HbError(f"cannot compare: {message}; give two dumps of the same tensor")
            log.warning("skipped: %s", message)
            continue
        for path, values in ((lp, a), (rp, b)):
            bad = int(values.size - np.count_nonzero(np.isfinite(values)))
            if bad:  # every metric of the row is then nan/inf; say where that comes from
                log.warning("%s holds %d NaN/infinite value(s) of %d: its row is not a measure of agreement",
                            path, bad, values.size)
        rows.append(Row(lp.name if folder else str(lp), rp.name if folder else str(rp), cosine_similarity(a, b),
                        relative_euclidean_distance(b, a), chebyshev(a, b), mse(a, b)))
    if not rows:
        raise HbError(f"no file pair of {left} and {right} could be compared (all {len(matched)} skipped, see the "
                      f"warnings); give folders of dumps of the same tensors")
    return rows


def table(rows: list[Row]) -> str:
    """The rows as a fixed-width console table."""
    cells = [COLUMNS, *((r.left, r.right, f"{r.cosine:.6f}", f"{r.relative_euclidean:.6f}", f"{r.max_abs:.6g}",
                         f"{r.mse:.6g}") for r in rows)]
    widths = [max(len(str(c[k])) for c in cells) + 2 for k in range(len(COLUMNS))]
    lines = ["".join(f"{str(v):<{w}}" for v, w in zip(c, widths, strict=True)).rstrip() for c in cells]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def write_csv(rows: list[Row], path: Path) -> None:
    buffer = io.StringIO(newline="")
    writer = csv.writer(buffer)
    writer.writerow(COLUMNS)
    for r in rows:
        # repr keeps every digit, so the CSV can be checked against a direct computation.
        writer.writerow([r.left, r.right, *(repr(float(v)) for v in r.values()[2:])])
    write_file(path, buffer.getvalue().encode("utf-8"))
