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


def reshape_node(model: ModelProto, src: str, dst: str, shape: list[int], name: str) -> NodeProto:
    """A Reshape of ``src`` to a constant ``shape`` (added to ``model``)."""
    model.graph.initializer.append(numpy_helper.from_array(np.array(shape, np.int64), f"{name}_shape"))
    return helper.make_node("Reshape", [src, f"{name}_shape"], [dst], name=name)


def around_one_row(model: ModelProto, opset: int, node: NodeProto, four_d: NodeProto) -> list[NodeProto]:
    """``four_d``, the form of ``node`` (of a 3-D [N, C, L] tensor) over [N, C, 1, L], between an Unsqueeze of
    that row and a Squeeze of it: the BPU's pools and Resize take 4-D tensors only. ``four_d``'s first input
    and output are set here."""
    wide, done = f"{node.input[0]}_{node.name}_2d", f"{node.output[0]}_{node.name}_2d"
    four_d.input[0], four_d.output[0] = wide, done
    return [_axes_node(model, opset, "Unsqueeze", node.input[0], wide, [2], f"{node.name}_to_2d"), four_d,
            _axes_node(model, opset, "Squeeze", done, node.output[0], [2], f"{node.name}_from_2d")]


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
