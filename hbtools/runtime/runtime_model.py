"""One model of a ``.bin``, checked and typed for the tools that run or describe it.

``binfile`` guarantees the container is intact; this module checks that what it
holds makes sense (descriptors agree with the graph, shapes are plausible), so
the simulator and the tools can trust the fields. Every problem is a one-line
``BinFormatError`` naming the model.

``input_batch`` (descriptor key ``batch``) sets the batch of the ``.bin`` but not of
its graph, as in the vendor tool (the quantized ONNX keeps batch 1): the
descriptors here have the batch as first dimension and the simulator runs the
graph once per batch item.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from onnx import ModelProto, TensorProto, helper

from hbtools.runtime.binfile import BinFormatError, BinModel, read_bin

IMAGE_RT_TYPES = ("nv12", "yuv444", "rgb", "bgr", "gray")
RT_TYPES = (*IMAGE_RT_TYPES, "featuremap")
# A tensor larger than this is a corrupted shape, not a model (2**28 elements = 1 GiB of int32).
MAX_ELEMENTS = 1 << 28


@dataclass(frozen=True)
class InputDesc:
    """A model input as the runtime sees it: ``type_rt`` data laid out in ``layout``."""

    name: str
    type_rt: str
    layout: str  # of the model input tensor (NCHW / NHWC; featuremaps may have other ranks)
    shape: tuple[int, ...]  # of the model input tensor, in ``layout``
    dtype: np.dtype  # of the model input tensor: int8 (intermediate) for images
    space_and_range: str = "regular"
    source: str = "ddr"
    raw: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def is_image(self) -> bool:
        return self.type_rt in IMAGE_RT_TYPES

    @property
    def hw(self) -> tuple[int, int]:
        """Height and width of a 4-D image input."""
        return (self.shape[2], self.shape[3]) if self.layout == "NCHW" else (self.shape[1], self.shape[2])


@dataclass(frozen=True)
class OutputDesc:
    name: str
    shape: tuple[int | None, ...]
    dtype: np.dtype
    scale: tuple[float, ...] | None = None  # integer outputs: what one step is worth


@dataclass
class RuntimeModel:
    """A checked model: the raw ``BinModel``, its parsed graph and typed descriptors."""

    bin: BinModel
    graph: ModelProto
    inputs: list[InputDesc]
    outputs: list[OutputDesc]
    path: str = ""
    batch: int = 1  # items per run; the graph itself takes one


    @property
    def name(self) -> str:
        return self.bin.name

    @property
    def march(self) -> str:
        return str(self.bin.meta.get("march") or self.config_group("model_parameters").get("march") or "")

    def config_group(self, group: str) -> dict[str, Any]:
        value = self.bin.config.get(group)
        return value if isinstance(value, dict) else {}


def open_model(path: str | os.PathLike[str], name: str | None = None) -> RuntimeModel:
    """Read ``path`` and check the model called ``name`` (``None``: the only one)."""
    f = read_bin(path)
    return load(f.model(name), f.path)


def load(model: BinModel, path: str = "") -> RuntimeModel:
    graph = model.load_graph()
    where = f"{path}: model {model.name!r}" if path else f"model {model.name!r}"
    try:
        batch = _batch(model, graph)
        inputs = _inputs(model, graph, batch)
        outputs = _outputs(model, graph, batch)
    except _Bad as e:
        raise BinFormatError(f"{where}: {e}") from None
    return RuntimeModel(model, graph, inputs, outputs, path, batch)


def _batch(model: BinModel, graph: ModelProto) -> int:
    values = [d.get("batch", 1) for d in model.inputs]
    if not all(type(v) is int and 1 <= v <= 4096 for v in values) or len(set(values)) > 1:
        raise _Bad(f"input descriptors give batch {values}; expected one number from 1 to 4096")
    batch = values[0] if values else 1
    if batch > 1:
        names = [d.get("name") for d in model.inputs]
        for vi in graph.graph.input:
            dims = vi.type.tensor_type.shape.dim
            if vi.name in names and (not dims or dims[0].dim_value != 1):
                raise _Bad(f"batch {batch} needs graph input '{vi.name}' to have batch 1")
    return batch


class _Bad(Exception):
    pass


def numpy_dtype(elem_type: int) -> np.dtype:
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))
    except (KeyError, TypeError, ValueError):
        raise _Bad(f"unsupported tensor element type {elem_type}") from None


def _static_shape(vi: Any, what: str) -> tuple[int, ...]:
    t = vi.type.tensor_type
    if not t.HasField("shape"):
        raise _Bad(f"{what} has no shape")
    dims = []
    for d in t.shape.dim:
        if not d.HasField("dim_value") or d.dim_value <= 0:
            raise _Bad(f"{what} has a dynamic or empty dimension")
        dims.append(int(d.dim_value))
    if int(np.prod(dims, dtype=np.float64)) > MAX_ELEMENTS:
        raise _Bad(f"{what} has an implausible shape {dims}")
    return tuple(dims)


def _text(desc: dict, key: str, default: str | None = None) -> str:
    v = desc.get(key, default)
    if not isinstance(v, str) or not v:
        raise _Bad(f"input descriptor lacks a text '{key}'")
    return v


def _inputs(model: BinModel, graph: ModelProto, batch: int) -> list[InputDesc]:
    inits = {t.name for t in graph.graph.initializer}
    graph_inputs = {vi.name: vi for vi in graph.graph.input if vi.name not in inits}
    names = [d.get("name") for d in model.inputs]
    if sorted(map(str, names)) != sorted(graph_inputs) or len(set(map(str, names))) != len(names):
        raise _Bad(f"input descriptors {names} do not match the graph inputs {sorted(graph_inputs)}")
    out = []
    for desc in model.inputs:
        name = desc["name"]
        vi = graph_inputs[name]
        shape = _static_shape(vi, f"input '{name}'")
        if shape:  # a scalar input (a sample rate) has no batch axis; _batch allows it only at batch 1
            shape = (shape[0] * batch, *shape[1:])
        if int(np.prod(shape, dtype=np.float64)) > MAX_ELEMENTS:
            raise _Bad(f"input '{name}' has an implausible shape {list(shape)}")
        dtype = numpy_dtype(vi.type.tensor_type.elem_type)
        type_rt = _text(desc, "input_type_rt")
        if type_rt not in RT_TYPES:
            raise _Bad(f"input '{name}' has unknown input_type_rt {type_rt!r}")
        layout = _text(desc, "layout", "NCHW")
        if type_rt in IMAGE_RT_TYPES:
            _check_image(name, type_rt, layout, shape, dtype)
        out.append(InputDesc(name, type_rt, layout, shape, dtype,
                             str(desc.get("input_space_and_range") or "regular"),
                             str(desc.get("input_source") or "ddr"), dict(desc)))
    return out


def _check_image(name: str, type_rt: str, layout: str, shape: tuple[int, ...], dtype: np.dtype) -> None:
    if layout not in ("NCHW", "NHWC") or len(shape) != 4:
        raise _Bad(f"image input '{name}' needs a 4-D NCHW/NHWC tensor, has layout {layout!r} shape {list(shape)}")
    if dtype != np.int8:
        raise _Bad(f"image input '{name}' must be int8 in the graph, is {dtype}")
    channels = shape[layout.index("C")]
    if channels != (1 if type_rt == "gray" else 3):
        raise _Bad(f"{type_rt} input '{name}' cannot have {channels} channels")
    h, w = (shape[2], shape[3]) if layout == "NCHW" else (shape[1], shape[2])
    if type_rt == "nv12" and (h % 2 or w % 2):
        raise _Bad(f"nv12 input '{name}' needs an even height and width, has {h}x{w}")


def _outputs(model: BinModel, graph: ModelProto, batch: int) -> list[OutputDesc]:
    described = {d["name"]: d for d in model.outputs if isinstance(d.get("name"), str)}
    out = []
    for vi in graph.graph.output:
        t = vi.type.tensor_type
        if t.elem_type == TensorProto.UNDEFINED:
            raise _Bad(f"graph output '{vi.name}' has no element type")
        dims = tuple(d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim)
        if batch > 1:  # the items' outputs are joined along the first axis (a scalar becomes a vector)
            dims = (dims[0] * batch if dims[0] is not None else None, *dims[1:]) if dims else (batch,)
        desc = described.get(vi.name, {})
        scale = desc.get("scale")
        valid_scale = isinstance(scale, list) and scale and all(isinstance(s, (int, float)) for s in scale)
        out.append(OutputDesc(vi.name, dims, numpy_dtype(t.elem_type),
                              tuple(float(s) for s in scale) if valid_scale else None))
    if not out:
        raise _Bad("the graph has no outputs")
    produced = {o for n in graph.graph.node for o in n.output} | {vi.name for vi in graph.graph.input} | \
        {t.name for t in graph.graph.initializer}
    orphans = [o.name for o in out if o.name not in produced]
    if orphans:
        raise _Bad(f"graph output '{orphans[0]}' is produced by no node")
    return out
