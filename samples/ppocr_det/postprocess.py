"""ppocr_det sample, step 4: find text lines with the float and the quantized model.

The picture is scikit-image's page(). It is saved as a PNG file, prepared exactly
like the calibration data (``preprocess.prepare``) and run through the float model
and the quantized model that 03_build.sh wrote. Each returns a 640x640 map of text
probability; ``text_boxes`` turns it into boxes the way PaddleOCR's DBPostProcess
does, simplified to axis-aligned boxes. Both sets of boxes are drawn into one PNG.

    python postprocess.py --out DIR [--read_mode skimage|opencv]
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import skimage.measure
from matplotlib.figure import Figure  # a bare Figure draws to files without any display
from matplotlib.patches import Rectangle
from preprocess import letterbox, prepare

from hbtools.data.pictures import bundled
from hbtools.eval import samples
from hbtools.eval.ppocr import det_agreement

Box = tuple[float, float, float, float]  # left, top, right, bottom in picture pixels

# RapidOCR's DBPostProcess settings (PaddleOCR's own defaults are box_thresh 0.6, unclip 1.5).
THRESH, BOX_THRESH, UNCLIP_RATIO, MIN_SIZE = 0.3, 0.5, 1.6, 3


def text_boxes(prob: np.ndarray, scale: float, height: int, width: int) -> list[Box]:
    """Boxes around the text regions of one probability map, in picture pixels.

    Regions are the connected areas above THRESH; a region whose mean probability is
    under BOX_THRESH, or which is thinner than MIN_SIZE, is dropped. DB-Net marks a
    shrunken core of each text line, so every box grows by area * ratio / perimeter.
    """
    labels = skimage.measure.label(prob > THRESH, connectivity=2)
    boxes = []
    for region in skimage.measure.regionprops(labels, intensity_image=prob):
        top, left, bottom, right = region.bbox
        h, w = bottom - top, right - left
        if min(h, w) < MIN_SIZE or region.intensity_mean < BOX_THRESH:
            continue
        grow = h * w * UNCLIP_RATIO / (2 * (h + w))
        # The letterbox left the picture in the top-left corner: undo its scale only.
        box = np.array([left - grow, top - grow, right + grow, bottom + grow]) / scale
        boxes.append(tuple(np.clip(box, 0, [width, height, width, height]).tolist()))
    return sorted(boxes, key=lambda b: (round(b[1] / 10), b[0]))  # reading order


def iou(a: Box, b: Box) -> float:
    w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - w * h
    return w * h / union if union else 0.0


def matched(ref: list[Box], other: list[Box], min_iou: float = 0.5) -> int:
    """How many boxes of ``ref`` overlap a box of ``other`` by at least ``min_iou``
    (each box of ``other`` used once)."""
    free, count = list(other), 0
    for box in ref:
        best = max(free, key=lambda o: iou(box, o), default=None)
        if best is not None and iou(box, best) >= min_iou:
            free.remove(best)
            count += 1
    return count


def draw(picture: np.ndarray, boxes: dict[str, list[Box]], path: Path) -> None:
    fig = Figure(figsize=(8, 4.4 * len(boxes)))
    axes = fig.subplots(len(boxes), 1)
    for ax, (kind, found) in zip(np.atleast_1d(axes), boxes.items(), strict=True):
        ax.imshow(picture, cmap="gray")
        for left, top, right, bottom in found:
            ax.add_patch(Rectangle((left, top), right - left, bottom - top,
                                       fill=False, edgecolor="red", linewidth=1.2))
        ax.set_title(f"{kind} model: {len(found)} text boxes")
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    args = samples.parse_arguments(__doc__)
    sessions = samples.open_models(args.out, "ppocr_det")
    page = bundled("page")
    png = samples.inference_picture(args.out, "page", page)
    sample = prepare(png, args.read_mode)
    scale = letterbox().placement(*page.shape[:2]).scale

    maps, boxes = {}, {}
    for kind, session in sessions.items():
        maps[kind] = samples.first_output(session, sample)[0, 0]
        boxes[kind] = text_boxes(maps[kind], scale, *page.shape[:2])
    drawn = png.with_name("page_boxes.png")
    draw(page, boxes, drawn)

    print(f"{png}:")
    for kind, found in boxes.items():
        print(f"  {kind:<9} model: {len(found)} text boxes")
    same = matched(boxes["float"], boxes["quantized"])
    region_iou = det_agreement(maps["float"], maps["quantized"], THRESH).iou
    print(f"  {same} float boxes have a quantized box overlapping by IoU >= 0.5; "
          f"text-region IoU {region_iou:.3f}")
    print(f"boxes drawn into {drawn}")
    samples.print_agreement(len(boxes["float"]) == len(boxes["quantized"]) == same)


if __name__ == "__main__":
    main()
