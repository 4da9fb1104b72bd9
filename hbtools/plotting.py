"""matplotlib as hbtools draws with it: no display, and no warnings on the console.

Node and tensor names in scripts the default font lacks (CJK names) are drawn as boxes; matplotlib warns of each
missing glyph with its source lines, which are no console line of a tool (``LEVEL message``).
"""

from __future__ import annotations

import warnings

import matplotlib

matplotlib.use("Agg")
warnings.filterwarnings("ignore", message=r"Glyph \d+ .* missing from", category=UserWarning)

import matplotlib.pyplot as plt  # noqa: E402 - the backend must be chosen first

__all__ = ["plt"]
