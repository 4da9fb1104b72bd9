"""What every transformer shares: the call protocol, layouts and the dtype rule.

A transformer is a small callable object, configured once and applied to one image
at a time (``image = t(image)``). Subclasses implement ``run_transform`` (the
method name the vendor's transformer classes use, so their subclasses port over).

Dtype rule: the transformers named as the vendor's return what the vendor's do
(float32 from ``Resize``/``ShortSideResize``/``CenterCrop`` by default, from
``PadResize``/``PaddedCenterCrop``/``LongSideCrop``/``Pad``/``PILCenterCrop``/``WarpAffine``
and the YUV/gray conversions always; NV12 bytes; the ``F32To*`` integers of ``astype``).
Resizes that keep the input's type give uint8 for uint8 (rounded half to even and saturated,
or OpenCV's fixed point), floats for floats (``like``). ``Scale``/``Add``/``Mean``/``Normalize``
always return floats (float32 stays float32, the rest float64).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import numpy as np

from hbtools.data import colour

LAYOUTS = ("HWC", "CHW", "NHWC", "NCHW")


class Transformer:
    """Base class: ``transformer(image) -> image``, ``transformer([images]) -> [images]``.

    Around each image's ``run_transform`` the vendor's base class calls two hooks a subclass may override,
    and so does this one: ``pre_process(data_list, data)`` with the input list and the image, and
    ``post_process(result_list, result)`` with the list of results so far and this image's result; a hook
    may append to the result list (``ShortLongResizeTransformer`` appends ``im_info``).
    """

    def __call__(self, image: np.ndarray | list[np.ndarray]) -> np.ndarray | list[np.ndarray]:
        # The vendor's transformer classes take and return a list of images
        # (``images = t([image])``, how its sample preprocess scripts call them); a list must
        # not be stacked into one 4-D array, so each element is transformed on its own.
        if isinstance(image, list | tuple):
            results: list[np.ndarray] = []
            for one in image:
                self.pre_process(image, one)
                out = self.run_transform(np.asarray(one))
                results.append(out)
                # The vendor passes results[i], which after an appending hook is an earlier entry (and its
                # ShortLongResize then fails on a second image); this image's result is what the hook means.
                self.post_process(results, out)
            return results
        # One image (hbtools' own call): the hooks see a one-element list; what they append comes back
        # with the result as a tuple.
        image = np.asarray(image)
        self.pre_process([image], image)
        out = self.run_transform(image)
        results = [out]
        self.post_process(results, out)
        return out if len(results) == 1 else tuple(results)

    def run_transform(self, image: np.ndarray) -> np.ndarray:
        """The transformation of one image; the base class returns it unchanged, as the vendor's."""
        return image

    def pre_process(self, data_list: Sequence[np.ndarray], data: np.ndarray) -> None:
        """Called before ``run_transform`` of ``data``, an element of ``data_list``; does nothing here."""

    def post_process(self, data_list: list[np.ndarray], data: np.ndarray) -> None:
        """Called after ``run_transform`` with the results so far and ``data``, the new one; may append."""

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({params})"


class Compose(Transformer):
    """Apply ``transformers`` in order."""

    def __init__(self, transformers: Iterable[Callable[[np.ndarray], np.ndarray]]) -> None:
        self.transformers = list(transformers)

    def run_transform(self, image: np.ndarray) -> np.ndarray:
        for t in self.transformers:
            image = t(image)
        return image


def like(out: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """``out`` in the dtype family of ``ref``: uint8 if ``ref`` is uint8, else float."""
    if ref.dtype == np.uint8:
        return colour.round_to_uint8(out)
    return np.asarray(out, dtype=float_dtype(ref))


def float_dtype(image: np.ndarray) -> type:
    """float32 stays float32; everything else computes in float64."""
    return np.float32 if image.dtype == np.float32 else np.float64


def channel_axis(image: np.ndarray, data_format: str | None) -> int:
    """The channel axis of ``image`` in ``data_format`` (``None``: tell from the shape).

    Without a layout, a 3-D image whose last axis has 1 or 3 entries (and whose first
    has not) is HWC, the reverse CHW; anything else needs an explicit ``data_format``.
    """
    if data_format is not None:
        fmt = data_format.upper()
        if fmt not in LAYOUTS:
            raise ValueError(f"data_format {data_format!r} is not one of {LAYOUTS}")
        if image.ndim != len(fmt):
            raise ValueError(f"data_format {fmt} needs a {len(fmt)}-D image, got shape {image.shape}")
        return fmt.index("C")
    if image.ndim == 3:
        first, last = image.shape[0] in (1, 3), image.shape[-1] in (1, 3)
        if last and not first:
            return 2
        if first and not last:
            return 0
    raise ValueError(
        f"cannot tell the channel axis of an image of shape {image.shape}; "
        "pass data_format='HWC' or 'CHW'"
    )


def channels_last(image: np.ndarray, data_format: str | None) -> tuple[np.ndarray, int]:
    """``image`` with channels moved last, and the axis to move them back to."""
    axis = channel_axis(image, data_format)
    return np.moveaxis(image, axis, -1), axis


def size_hw(size: int | Sequence[int], what: str) -> tuple[int, int]:
    """An ``int`` (square) or ``(height, width)`` size, checked positive."""
    hw = (size, size) if isinstance(size, int | np.integer) else tuple(size)
    if len(hw) != 2 or any(int(v) != v or v < 1 for v in hw):
        raise ValueError(f"{what} must be a positive int or (height, width), got {size!r}")
    return int(hw[0]), int(hw[1])


def check_image(image: np.ndarray, what: str) -> None:
    """Geometric transformers work on HW or HWC images (as read, before HWC2CHW)."""
    if image.ndim not in (2, 3):
        raise ValueError(f"{what} needs an HW or HWC image, got shape {image.shape}")
