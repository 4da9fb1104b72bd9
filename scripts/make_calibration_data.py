#!/usr/bin/env python
"""Make calibration and held-out samples for the PaddleOCR sample models.

    python scripts/make_calibration_data.py --model cls|det|rec|captcha|detect [--count 50] [--heldout 20]
                                            [--out build] [--size HxW] [--name NAME]

writes ``<out>/calibration/ppocr_<model>/`` (what ``configs/ppocr_<model>.yaml`` calibrates
on) and a disjoint ``<out>/heldout/ppocr_<model>/`` for measuring accuracy. Each file is
one sample as hb_mapper expects it (SPEC §5): a raw ``numpy.tofile`` uint8 array,
1x3xHxW (NCHW), colour order BGR because PaddleOCR reads images with OpenCV (``--rgb``
for a model trained on RGB). The name
is ``<index>_<source>.bin`` (sorted order = index order), where ``<source>`` says what
the sample shows (``page``, ``page180``, ``text``, ``natural``, …) so tests can pick
e.g. the samples that must contain text.

Content comes only from images bundled in the scikit-image wheel (no pooch downloads):
text-line crops of ``page()``/``text()`` for cls/rec, prepared like PaddleOCR's
``resize_norm_img`` but stopping before normalisation (that is the model's
HzPreprocess job); for det, ``page()``/``text()`` and natural images scaled, cropped,
tiled and flipped to 640x640; for ``detect`` (YOLO-style object detectors), natural
images cropped at several aspects and letterboxed. ``captcha`` samples are strings of digits and capital
letters rendered with matplotlib's bundled font on noisy backgrounds (60x160).
``--size`` changes the input size, ``--name`` the folder name (``zoo_<model>`` for
the corpus configs in ``configs/zoo/``). Everything is seeded, so runs are reproducible.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from hbtools.data import colour
from hbtools.data.pictures import NATURAL_GREY, NATURAL_RGB, page_lines
from hbtools.data.pictures import bundled as _load
from hbtools.data.transforms import TextLineResizeTransformer
from hbtools.data.transforms.geometry import resize

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO_ROOT / "build"

# (height, width) of the model input, from PaddleOCR's inference configs.
SHAPES: dict[str, tuple[int, int]] = {"cls": (48, 192), "det": (640, 640), "rec": (48, 320), "captcha": (60, 160),
                                      "detect": (640, 640)}

# Separate seeds per split: the held-out set must not change when --count changes.
SPLIT_SEEDS = {"calibration": 1_000_003, "heldout": 2_000_003}
MODEL_SEEDS = {"cls": 11, "det": 22, "rec": 33, "captcha": 44, "detect": 55}
CAPTCHA_ALPHABET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"

# Value that pads text crops on the right (see TextLineResizeTransformer).
PAD_VALUE = 128


def _resize(img: np.ndarray, height: int, width: int) -> np.ndarray:
    """Bilinear resize to (height, width); anti-aliased only when shrinking, so that
    downscaled natural images do not alias into patterns a camera would not produce."""
    return resize(img, height, width, "bilinear")  # skimage's, in the image's type (not the vendor's float32)


def _to_bgr(img: np.ndarray) -> np.ndarray:
    """Grey or RGB uint8 -> BGR HxWx3 (the colour order cv2.imread gives PaddleOCR)."""
    if img.ndim == 2:
        return np.repeat(img[..., None], 3, axis=2)
    return np.ascontiguousarray(colour.rgb_to_bgr(img))


def _photometric(img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Random contrast/brightness so calibration covers a range of exposures."""
    contrast = rng.uniform(0.75, 1.25)
    brightness = rng.uniform(-25.0, 25.0)
    out = (img.astype(np.float32) - 128.0) * contrast + 128.0 + brightness
    return np.clip(np.rint(out), 0, 255).astype(np.uint8)


# --------------------------------------------------------------------------- text lines


def _page_crop(rng: np.random.Generator, max_aspect: float) -> np.ndarray:
    """A run of consecutive words from one page() line, with a little margin jitter."""
    page = _load("page")
    lines = page_lines()
    y0, y1, words = lines[rng.integers(len(lines))]
    # Mostly one crop per detected box (aspect up to the input's), sometimes a long
    # line that resize_norm_img has to squeeze, as happens with real det boxes.
    limit = max_aspect * rng.uniform(0.4, 1.3)
    start = int(rng.integers(len(words)))
    top = max(0, y0 - int(rng.integers(0, 4)))
    bottom = min(page.shape[0], y1 + int(rng.integers(0, 4)))
    end = start + 1
    while end < len(words) and (words[end][1] - words[start][0]) / (bottom - top) <= limit:
        end += 1
    left = max(0, words[start][0] - int(rng.integers(1, 6)))
    right = min(page.shape[1], words[end - 1][1] + int(rng.integers(1, 6)))
    return page[top:bottom, left:right]


def _window(
    img: np.ndarray,
    rng: np.random.Generator,
    h_range: tuple[int, int],
    aspect_range: tuple[float, float],
) -> np.ndarray:
    """A random window of ``img`` with height in h_range and width/height in aspect_range."""
    h = min(img.shape[0], int(rng.integers(*h_range)))
    w = min(img.shape[1], max(8, int(h * rng.uniform(*aspect_range))))
    y = int(rng.integers(0, img.shape[0] - h + 1))
    x = int(rng.integers(0, img.shape[1] - w + 1))
    return img[y : y + h, x : x + w]


def resize_norm_img(img: np.ndarray, height: int, width: int) -> np.ndarray:
    """PaddleOCR's cls/rec ``resize_norm_img`` up to (not including) normalisation."""
    return TextLineResizeTransformer((height, width), pad_value=PAD_VALUE)(img)


def _line_sample(kind: str, rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """One cls/rec sample (HxWx3 BGR uint8) of the given kind."""
    max_aspect = width / height
    if kind.startswith("page"):
        crop = _photometric(_page_crop(rng, max_aspect), rng)
    elif kind.startswith("text"):
        # text() is handwriting on a slanted sheet: windows about one line tall.
        crop = _photometric(_window(_load("text"), rng, (28, 56), (1.5, max_aspect)), rng)
    else:
        name = (
            NATURAL_RGB[rng.integers(len(NATURAL_RGB))]
            if rng.random() < 0.6
            else (NATURAL_GREY[rng.integers(len(NATURAL_GREY))])
        )
        crop = _window(_load(name), rng, (40, 160), (1.5, max_aspect))
    if kind.endswith("180"):
        # The cls model decides 0 vs 180 degrees: show it upside-down lines too.
        crop = crop[::-1, ::-1]
    return resize_norm_img(_to_bgr(crop), height, width)


# --------------------------------------------------------------------------- det images


def _tile_to(img: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
    """Tile ``img`` periodically and cut a size x size window at a random offset."""
    reps = (math.ceil(size / img.shape[0]) + 1, math.ceil(size / img.shape[1]) + 1)
    tiled = np.tile(img, reps + (1,) * (img.ndim - 2))
    y = int(rng.integers(0, img.shape[0]))
    x = int(rng.integers(0, img.shape[1]))
    return tiled[y : y + size, x : x + size]


def _scaled(img: np.ndarray, scale: float) -> np.ndarray:
    h, w = img.shape[:2]
    return _resize(img, max(1, round(h * scale)), max(1, round(w * scale)))


def _natural_square(rng: np.random.Generator, size: int) -> np.ndarray:
    """A random square crop (35-100 % of the short side) of a natural image, maybe
    mirrored, resized to size x size, BGR."""
    names = NATURAL_RGB + NATURAL_GREY
    img = _load(names[rng.integers(len(names))])
    side = int(min(img.shape[:2]) * rng.uniform(0.35, 1.0))
    crop = _window(img, rng, (side, side + 1), (1.0, 1.0))
    if rng.random() < 0.5:
        crop = crop[:, ::-1]
    if rng.random() < 0.2:
        crop = crop[::-1]
    return _to_bgr(_resize(crop, size, size))


def _det_sample(kind: str, rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """One det sample (HxWx3 BGR uint8) of the given kind."""
    size = height  # det inputs are square here; checked in generate()
    if kind == "page":
        # Several copies of the page at a text size DB-Net sees in real documents.
        page = _scaled(_load("page"), rng.uniform(1.0, 2.6))
        out = _to_bgr(_tile_to(_photometric(page, rng), size, rng))
    elif kind == "pagepaste":
        # One page pasted on a natural image: text and clutter in the same frame.
        out = _natural_square(rng, size)
        page = _to_bgr(_photometric(_scaled(_load("page"), rng.uniform(0.9, 1.6)), rng))
        ph, pw = min(page.shape[0], size), min(page.shape[1], size)
        y, x = int(rng.integers(0, size - ph + 1)), int(rng.integers(0, size - pw + 1))
        out[y : y + ph, x : x + pw] = page[:ph, :pw]
    elif kind == "text":
        text = _scaled(_load("text"), rng.uniform(1.0, 2.2))
        if rng.random() < 0.5:
            text = text[:, ::-1]
        out = _to_bgr(_tile_to(_photometric(text, rng), size, rng))
    else:
        out = _natural_square(rng, size)
    return out


# --------------------------------------------------------------------------- object detectors

LETTERBOX_FILL = 114  # the grey YOLO exporters pad with


def _detect_sample(kind: str, rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """A natural picture as a YOLO-style detector gets it (HxWx3 BGR uint8): a crop (square-ish
    ``scene``, landscape ``wide``, portrait ``tall``) resized to fit, aspect kept, top-left,
    the rest padded grey."""
    names = NATURAL_RGB + NATURAL_GREY
    img = _photometric(_load(names[rng.integers(len(names))]), rng)
    aspect = {"wide": (1.4, 2.0), "tall": (0.5, 0.7)}.get(kind, (0.8, 1.25))
    side = min(img.shape[:2])
    crop = _window(img, rng, (int(side * 0.4), side + 1), aspect)
    if rng.random() < 0.5:
        crop = crop[:, ::-1]
    r = min(height / crop.shape[0], width / crop.shape[1])
    fitted = _resize(crop, max(1, round(crop.shape[0] * r)), max(1, round(crop.shape[1] * r)))
    out = np.full((height, width, 3), LETTERBOX_FILL, np.uint8)
    out[: fitted.shape[0], : fitted.shape[1]] = _to_bgr(fitted)
    return out


# --------------------------------------------------------------------------- captchas


def _captcha_sample(kind: str, rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """A captcha-like picture (HxWx3 BGR uint8): 4-6 rotated characters, noise lines and dots."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    dpi = 100
    fig = Figure(figsize=(width / dpi, height / dpi), dpi=dpi)
    canvas = FigureCanvasAgg(fig)
    background = rng.uniform(0.75, 1.0, 3)
    fig.patch.set_facecolor(background)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_axis_off()
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    text = "".join(rng.choice(list(CAPTCHA_ALPHABET), size=int(rng.integers(4, 7))))
    x = rng.uniform(0.04, 0.12)
    step = (0.92 - x) / len(text)
    for ch in text:
        ax.text(x, rng.uniform(0.3, 0.7), ch, fontsize=float(rng.uniform(20, 30)), rotation=float(rng.uniform(-30, 30)),
                color=rng.uniform(0.0, 0.5, 3), family="DejaVu Sans", weight=str(rng.choice(["normal", "bold"])),
                va="center")
        x += step * rng.uniform(0.85, 1.1)
    if kind != "clean":
        for _ in range(int(rng.integers(1, 4))):
            ax.plot(rng.uniform(0, 1, 2), rng.uniform(0, 1, 2), color=rng.uniform(0.2, 0.7, 3),
                    linewidth=float(rng.uniform(0.8, 2.0)))
        ax.scatter(rng.uniform(0, 1, 60), rng.uniform(0, 1, 60), s=float(rng.uniform(0.5, 3)),
                   color=rng.uniform(0.2, 0.8, 3))
    canvas.draw()
    rgb = np.asarray(canvas.buffer_rgba())[:, :, :3]
    if rgb.shape[:2] != (height, width):
        rgb = _resize(rgb, height, width)
    return _to_bgr(np.ascontiguousarray(rgb))


# --------------------------------------------------------------------------- driver

# Kinds cycle in this order so every split, however small, has the same mix.
SCHEDULES: dict[str, tuple[str, ...]] = {
    "cls": ("page", "page180", "text", "page", "natural", "page180", "text180", "page"),
    "rec": ("page", "page", "text", "page", "natural", "page", "text", "page"),
    "det": ("page", "natural", "pagepaste", "text", "page", "natural", "pagepaste", "page"),
    "captcha": ("noisy", "noisy", "clean", "noisy"),
    "detect": ("scene", "scene", "wide", "scene", "tall", "scene"),
}


def _samples(model: str, split: str, size: tuple[int, int]) -> Iterator[tuple[str, np.ndarray]]:
    """Endless, deterministic stream of (kind, 1x3xHxW uint8 BGR) for one split."""
    height, width = size
    make: Callable[[str, np.random.Generator, int, int], np.ndarray]
    make = {"det": _det_sample, "captcha": _captcha_sample, "detect": _detect_sample}.get(model, _line_sample)
    rng = np.random.default_rng([SPLIT_SEEDS[split], MODEL_SEEDS[model]])
    schedule = SCHEDULES[model]
    i = 0
    while True:
        kind = schedule[i % len(schedule)]
        hwc = make(kind, rng, height, width)
        yield kind, np.ascontiguousarray(hwc.transpose(2, 0, 1)[None])
        i += 1


def generate(
    model: str, count: int, heldout: int, size: tuple[int, int] | None = None, rgb: bool = False
) -> dict[str, list[tuple[str, np.ndarray]]]:
    """Calibration and held-out samples; no sample occurs in both (nor twice in one).

    ``size`` is the (height, width) of the model input, ``SHAPES[model]`` by default;
    ``rgb``: channels in RGB order (a model trained on RGB), not OpenCV's BGR.
    """
    if model not in SHAPES:
        raise ValueError(f"unknown model {model!r}; expected one of {sorted(SHAPES)}")
    size = size or SHAPES[model]
    if model == "det" and size[0] != size[1]:
        raise ValueError(f"det samples are square; got {size[0]}x{size[1]}")
    seen: set[bytes] = set()
    splits: dict[str, list[tuple[str, np.ndarray]]] = {}
    # Held-out first so its content depends only on --heldout, not on --count.
    for split, n in (("heldout", heldout), ("calibration", count)):
        chosen: list[tuple[str, np.ndarray]] = []
        stream = _samples(model, split, size)
        for _ in range(100 * max(n, 1)):
            if len(chosen) == n:
                break
            kind, arr = next(stream)
            digest = hashlib.sha256(arr.tobytes()).digest()
            if digest not in seen:
                seen.add(digest)
                chosen.append((kind, arr))
        if len(chosen) < n:
            raise RuntimeError(f"could only make {len(chosen)} distinct {split} samples")
        splits[split] = [(kind, np.ascontiguousarray(arr[:, ::-1])) for kind, arr in chosen] if rgb else chosen
    return splits


def write_split(samples: list[tuple[str, np.ndarray]], folder: Path) -> list[Path]:
    """Write samples as ``NNNN_<kind>.bin``; stale .bin files from earlier runs go."""
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.bin"):
        old.unlink()
    paths = []
    for i, (kind, arr) in enumerate(samples):
        path = folder / f"{i:04d}_{kind}.bin"
        arr.astype(np.uint8).tofile(path)
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, choices=sorted(SHAPES))
    parser.add_argument("--count", type=int, default=50, help="calibration samples (50)")
    parser.add_argument("--heldout", type=int, default=20, help="held-out samples (20)")
    parser.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_OUT,
        help="root for calibration/ppocr_<model>/ and heldout/ppocr_<model>/ (build/)",
    )
    parser.add_argument("--size", help="input HxW instead of the model kind's default")
    parser.add_argument("--name", help="folder name under calibration/ and heldout/ (ppocr_<model>)")
    parser.add_argument("--rgb", action="store_true", help="RGB channel order (default BGR, as OpenCV reads)")
    args = parser.parse_args(argv)
    if args.count < 1 or args.heldout < 0:
        parser.error("--count must be >= 1 and --heldout >= 0")
    size = None
    if args.size:
        try:
            size = tuple(int(v) for v in args.size.lower().split("x"))
        except ValueError:
            parser.error(f"--size {args.size!r}: expected HxW, e.g. 48x320")
        if len(size) != 2:
            parser.error(f"--size {args.size!r}: expected HxW, e.g. 48x320")
    splits = generate(args.model, args.count, args.heldout, size, rgb=args.rgb)
    for split, samples in splits.items():
        folder = args.out / split / (args.name or f"ppocr_{args.model}")
        write_split(samples, folder)
        print(f"{split}: {len(samples)} samples -> {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
