"""The one rule for which files of a folder are samples, and in which order.

Hidden files (.DS_Store, editor swap files) are never samples. Files are taken in
natural name order: runs of digits compare as numbers, so ``2.npy`` comes before
``10.npy``, and zero-padded names (``0001.bin``) keep their plain sorted order.
Calibration folders, the debugger's ``calibration_data/`` and vec_diff's pairing
all list files here.
"""

from __future__ import annotations

import re
from pathlib import Path

_DIGITS = re.compile(r"(\d+)")


def natural_key(name: str) -> tuple:
    """Sort key of a file name: digit runs as numbers, the rest as text."""
    parts = _DIGITS.split(name)
    return tuple((0, int(p), p) if p.isdigit() else (1, 0, p) for p in parts if p), name


def sample_files(folder: Path, suffix: str | None = None) -> list[Path]:
    """The sample files of ``folder`` (optionally only ``suffix`` ones) in natural order. A broken link is
    one (its reader says it is broken); a folder, or a link to one, is not."""
    found = [p for p in Path(folder).iterdir()
             if not p.name.startswith(".") and (p.is_file() or (p.is_symlink() and not p.exists()))
             and (suffix is None or p.suffix == suffix)]
    return sorted(found, key=lambda p: natural_key(p.name))
