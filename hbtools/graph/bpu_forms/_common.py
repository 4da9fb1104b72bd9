"""Helpers the rewrites of several modules share."""

from __future__ import annotations

import numpy as np
from onnx import ModelProto, NodeProto, helper, numpy_helper

from hbtools.graph.model_io import default_opset


def _axes_node(model: ModelProto, opset: int, op_type: str, src: str, dst: str, axes: list[int],
               name: str, **attrs: object) -> NodeProto:
    """An Unsqueeze / Squeeze / ReduceSum of ``axes``: an attribute before opset 13, an input (a constant added
    to ``model``) from it."""
    if opset < 13:
        return helper.make_node(op_type, [src], [dst], name=name, axes=axes, **attrs)
    model.graph.initializer.append(numpy_helper.from_array(np.array(axes, np.int64), f"{name}_axes"))
    return helper.make_node(op_type, [src, f"{name}_axes"], [dst], name=name, **attrs)


def _opset(model: ModelProto) -> int:
    return default_opset(model) or 13


def per_channel_const(value: np.ndarray, channels: int) -> np.ndarray | None:
    """A constant that broadcasts as one value per channel of an NCHW tensor, as a [C] vector (None: it does not)."""
    if value.size == 1:
        return np.full(channels, float(value.reshape(-1)[0]))
    squeezed = value.reshape(-1)
    if squeezed.size == channels and value.ndim >= 3 and value.shape[-1] == 1 and value.shape[-2] == 1:
        return squeezed.astype(np.float64)
    return None
