"""Train-type data -> the intermediate type the ONNX artefacts take (SPEC §5).

This is what the device's input path does to a sample: colour conversion to
the ``input_type_rt`` space, rounding to uint8 (through NV12 chroma subsampling
for nv12), then ``- 128`` as int8. Featuremaps only become float32.
"""

from __future__ import annotations

import numpy as np

from hbtools.config.model import InputSpec
from hbtools.data import colour


def channels_last(x: np.ndarray, layout: str) -> np.ndarray:
    """View an NCHW/NHWC array with the channel axis last."""
    return np.moveaxis(x, 1, -1) if layout == "NCHW" else x


def from_channels_last(x: np.ndarray, layout: str) -> np.ndarray:
    """Inverse of ``channels_last``."""
    return np.moveaxis(x, -1, 1) if layout == "NCHW" else x


def to_intermediate(x: np.ndarray, spec: InputSpec) -> np.ndarray:
    """Convert one sample of ``input_type_train`` data (0..255, ``layout_train``).

    Float data is rounded and clipped to 0..255 first: the device can only ever
    see whole uint8 values.
    """
    x = np.asarray(x)
    if spec.is_featuremap:
        return x.astype(spec.model_dtype)  # float32, or what an integer input (a sample rate, an index) takes
    if x.ndim != 4:
        raise ValueError(f"image input {spec.name!r} needs 4-D data, got shape {x.shape}")
    space = colour.intermediate_space(spec.type_rt, spec.space_and_range)
    order = colour.reordering(spec.type_train, space)
    if x.dtype == np.uint8 and order is not None and spec.type_rt != "nv12":
        # The same values as the conversion below gives whole-number pixels, at a fraction of its cost (every
        # calibration sample and every input of infer, verifier and the debugger come through here).
        inter = channels_last(x, spec.layout_train)[..., order]
        q = (inter.astype(np.int16) - 128).astype(np.int8)
        return np.ascontiguousarray(from_channels_last(q, spec.layout_train))
    pixels = channels_last(colour.round_to_uint8(x), spec.layout_train)
    inter = colour.convert(pixels, spec.type_train, space)
    if spec.type_rt == "nv12":
        inter = colour.nv12_decode(colour.nv12_encode(inter))
    else:
        inter = colour.round_to_uint8(inter)
    q = (inter.astype(np.int16) - 128).astype(np.int8)
    return np.ascontiguousarray(from_channels_last(q, spec.layout_train))
