"""The vendor sample scripts' image loaders (``horizon_tc_ui.data.dataloader``).

A loader reads pictures, runs a list of transformers over each and hands back batches
with a leading batch axis, ready to feed a session::

    data = SingleImageDataLoader(transformers, "cat.jpg", imread_mode="opencv")   # (1, ...)
    for data, labels, names in ImageNetDataLoader(transformers, "val/", "val.txt",
                                                  batch_size=1, return_img_name=True):
        ...
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np

from hbtools.data import colour
from hbtools.data.images import read_rgb_or_gray
from hbtools.data.transforms.imread import READ_MODES, opencv_available, read_image
from hbtools.errors import HbError

logger = logging.getLogger(__name__)

TransformerList = Sequence[Callable[[np.ndarray], np.ndarray]]


def load_picture(image_path: str | Path, imread_mode: str = "opencv") -> np.ndarray:
    """One picture as ``read_image`` gives it; ``'opencv'`` without OpenCV installed reads with Pillow
    and converts to uint8 BGR, so the samples' scripts (which all pass ``imread_mode='opencv'``) run.
    Lossless pictures come out identical; JPEG decoders may differ by a level here and there."""
    if imread_mode not in READ_MODES:
        raise HbError(f"imread_mode {imread_mode!r} is not one of {READ_MODES}")
    if imread_mode == "skimage" or opencv_available():
        return read_image(image_path, imread_mode)
    rgb = read_rgb_or_gray(Path(image_path), "image")
    if rgb.ndim == 2:
        rgb = np.repeat(rgb[..., None], 3, axis=-1)
    return np.ascontiguousarray(colour.rgb_to_bgr(rgb))


def _transform(image: np.ndarray, transformers: TransformerList) -> np.ndarray:
    for t in transformers:
        image = t(image)
    return image


def SingleImageDataLoader(transformers: TransformerList, image_path: str | Path,  # noqa: N802 - vendor name
                          imread_mode: str = "opencv") -> np.ndarray:
    """``image_path`` read, transformed and given a batch axis: shape ``(1, ...)``."""
    return _transform(load_picture(image_path, imread_mode), transformers)[None]


def SingleImageDataLoaderWithOrigin(transformers: TransformerList, image_path: str | Path,  # noqa: N802
                                    imread_mode: str = "opencv") -> tuple[np.ndarray, np.ndarray]:
    """``(original, processed)``, each with a batch axis of 1: the picture as read (to draw
    detections on) and as transformed (to feed)."""
    image = load_picture(image_path, imread_mode)
    return image[None], _transform(image, transformers)[None]


class ImageNetDataLoader:
    """Batches of an ImageNet-style evaluation set.

    ``label_path`` lists one picture per line, its file name (relative to ``image_path``) and its
    integer class: ``ILSVRC2012_val_00000001.JPEG 65``. Iterating gives ``(data, labels)``, or
    ``(data, labels, names)`` with ``return_img_name``: ``data`` the transformed pictures stacked
    (``batch_size`` of them, fewer in the last batch), ``labels`` an int64 array and ``names`` the
    file names, both in file order. ``len()`` is the number of batches.
    """

    def __init__(self, transformers: TransformerList, image_path: str | Path, label_path: str | Path,
                 imread_mode: str = "opencv", batch_size: int = 1, return_img_name: bool = False) -> None:
        if not isinstance(batch_size, int) or batch_size < 1:
            raise HbError(f"batch_size must be a positive int, got {batch_size!r}")
        if imread_mode not in READ_MODES:
            raise HbError(f"imread_mode {imread_mode!r} is not one of {READ_MODES}")
        self.transformers = list(transformers)
        self.image_path = Path(image_path)
        self.imread_mode = imread_mode
        self.batch_size = batch_size
        self.return_img_name = return_img_name
        self.samples = _read_labels(Path(label_path))
        self._iterator: Iterator | None = None

    def __len__(self) -> int:
        return -(-len(self.samples) // self.batch_size)

    def __iter__(self) -> Iterator[tuple]:
        for start in range(0, len(self.samples), self.batch_size):
            chunk = self.samples[start : start + self.batch_size]
            data = np.stack([_transform(load_picture(self.image_path / name, self.imread_mode), self.transformers)
                             for name, _ in chunk])
            labels = np.array([label for _, label in chunk], dtype=np.int64)
            names = [name for name, _ in chunk]
            yield (data, labels, names) if self.return_img_name else (data, labels)

    def __next__(self) -> tuple:
        # Some scripts call next(loader) on the loader itself rather than on iter(loader).
        if self._iterator is None:
            self._iterator = iter(self)
        return next(self._iterator)


def _read_labels(label_path: Path) -> list[tuple[str, int]]:
    try:
        lines = label_path.read_text().splitlines()
    except OSError as e:
        raise HbError(f"cannot read the label file {label_path}: {e.strerror}") from e
    samples = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        parts = line.split()
        if len(parts) != 2 or not parts[1].lstrip("-").isdigit():
            raise HbError(f"{label_path}:{number}: expected '<image file> <class number>', got {line.strip()!r}")
        samples.append((parts[0], int(parts[1])))
    if not samples:
        raise HbError(f"the label file {label_path} lists no pictures")
    return samples
