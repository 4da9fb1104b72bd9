"""Pictures bundled in the scikit-image wheel, and the text lines of ``page()``.

Samples, tests and ``scripts/make_calibration_data.py`` build their images from
these, never from pictures skimage would download (``bundled`` refuses those), so
everything works offline and reproducibly.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import numpy as np

# Colour and grey pictures without text.
NATURAL_RGB = (
    "astronaut",
    "coffee",
    "chelsea",
    "rocket",
    "hubble_deep_field",
    "immunohistochemistry",
)
NATURAL_GREY = ("camera", "coins", "moon", "brick", "grass", "gravel", "clock", "cell")
# (top, bottom, left, right) of handwritten formula lines in text().
TEXT_LINE_BOXES = ((20, 62, 95, 290), (55, 100, 0, 170), (0, 32, 140, 320), (110, 165, 40, 260))

# skimage.data function -> file in skimage/data/ (names differ for a few).
BUNDLED_FILES = {
    "astronaut": "astronaut.png",
    "coffee": "coffee.png",
    "chelsea": "chelsea.png",
    "rocket": "rocket.jpg",
    "hubble_deep_field": "hubble_deep_field.jpg",
    "immunohistochemistry": "ihc.png",
    "camera": "camera.png",
    "coins": "coins.png",
    "moon": "moon.png",
    "brick": "brick.png",
    "grass": "grass.png",
    "gravel": "gravel.png",
    "clock": "clock_motion.png",
    "cell": "cell.png",
    "page": "page.png",
    "text": "text.png",
}


@cache
def bundled(name: str) -> np.ndarray:
    """A bundled skimage picture as uint8 HxW (grey) or HxWx3 (RGB)."""
    import skimage.data

    if name not in BUNDLED_FILES:
        raise ValueError(f"{name!r} is not one of the bundled pictures {sorted(BUNDLED_FILES)}")
    path = Path(skimage.data.__file__).parent / BUNDLED_FILES[name]
    if not path.is_file():
        # Calling the loader would make pooch try the network, which we must not do.
        raise RuntimeError(f"skimage image {name!r} is not bundled ({path} missing)")
    img = np.asarray(getattr(skimage.data, name)())
    if img.ndim == 3:
        img = img[..., :3]
    return img.astype(np.uint8)


@cache
def ink(name: str) -> np.ndarray:
    """Boolean ink mask; Sauvola because page() is unevenly lit (dark lower right)."""
    from skimage.filters import threshold_sauvola

    img = bundled(name)
    return img < threshold_sauvola(img, window_size=25, k=0.2, r=128)


@cache
def page_lines() -> tuple[tuple[int, int, tuple[tuple[int, int], ...]], ...]:
    """Text lines of page() as (y0, y1, words) with words as (x0, x1) column spans.

    Rows whose ink fraction exceeds a threshold form line bands (row projection);
    within a band, runs of ink-free columns wider than a letter gap split words.
    """
    mask = ink("page")
    rows = runs(mask.mean(axis=1) > 0.08, min_len=6)
    lines = []
    for y0, y1 in rows:
        cols = mask[y0:y1].any(axis=0)
        # Close gaps narrower than 5 px (letter spacing) so each run is one word.
        words = runs(~runs_mask(~cols, min_len=5), min_len=3)
        if words:
            lines.append((y0, y1, tuple(words)))
    return tuple(lines)


def page_line(index: int, first_word: int = 0, words: int | None = None,
              margin: int = 3) -> np.ndarray:
    """Crop of page() line ``index`` (uint8 grey), from word ``first_word`` on."""
    page = bundled("page")
    y0, y1, spans = page_lines()[index]
    chosen = spans[first_word:] if words is None else spans[first_word : first_word + words]
    if not chosen:
        raise ValueError(f"page line {index} has {len(spans)} words")
    top, bottom = max(0, y0 - margin), min(page.shape[0], y1 + margin)
    left, right = max(0, chosen[0][0] - margin), min(page.shape[1], chosen[-1][1] + margin)
    return page[top:bottom, left:right]


def text_lines() -> list[np.ndarray]:
    """The handwritten formula lines of text() (uint8 grey crops, ``TEXT_LINE_BOXES``)."""
    text = bundled("text")  # handwriting on a slanted sheet
    return [text[y0:y1, x0:x1] for y0, y1, x0, x1 in TEXT_LINE_BOXES]


def runs(mask: np.ndarray, min_len: int = 1) -> list[tuple[int, int]]:
    """[start, end) spans of True runs in a 1-D mask, at least ``min_len`` long."""
    padded = np.concatenate(([False], mask, [False])).astype(np.int8)
    edges = np.flatnonzero(np.diff(padded))
    return [
        (int(a), int(b)) for a, b in zip(edges[::2], edges[1::2], strict=True) if b - a >= min_len
    ]


def runs_mask(mask: np.ndarray, min_len: int) -> np.ndarray:
    """``mask`` keeping only True runs at least ``min_len`` long."""
    out = np.zeros_like(mask)
    for a, b in runs(mask, min_len):
        out[a:b] = True
    return out


def page_windows(index: int, max_aspect: float, margin: int = 3) -> list[np.ndarray]:
    """Line ``index`` of page() cut into runs of whole words, each at most about
    ``max_aspect`` times as wide as high (a single longer word stays whole)."""
    y0, y1, spans = page_lines()[index]
    height = y1 - y0 + 2 * margin
    crops, start = [], 0
    while start < len(spans):
        end = start + 1
        while end < len(spans) and (spans[end][1] - spans[start][0]) / height <= max_aspect:
            end += 1
        crops.append(page_line(index, start, end - start, margin))
        start = end
    return crops
