"""Float16 and float64 models computed in float32: the float model a quantizer starts from.

An export made for a GPU (``model.half()``, onnxconverter-common's float16 pass) keeps
its weights, its inputs and outputs, or only some casts in float16; a model traced from
float64 code (``torch.float64``, numpy defaults) keeps them in float64. Quantization
measures float32 statistics, the lowering's grids and tables are float32 and the BPU
computes in int8/int16, so the parse stage makes every float16 and float64 tensor
float32: the model means the same, with float32 rounding.
"""

from __future__ import annotations

import numpy as np
from onnx import AttributeProto, GraphProto, ModelProto, TensorProto, numpy_helper

# Attributes that name an element type (Cast, EyeLike, RandomNormal..., CastLike takes a tensor).
TYPE_ATTRIBUTES = ("to", "dtype")
OTHER_FLOATS = {TensorProto.FLOAT16: "float16", TensorProto.DOUBLE: "float64"}


def other_floats(model: ModelProto) -> list[str]:
    """The float types other than float32 that ``model`` uses (numpy names, e.g. ['float16'])."""
    return [name for t, name in OTHER_FLOATS.items() if _graph_uses(model.graph, t)]


def to_float32(model: ModelProto) -> ModelProto:
    """A copy of ``model`` with every float16 and float64 tensor, type and attribute made float32."""
    out = ModelProto()
    out.CopyFrom(model)
    _widen_graph(out.graph)
    return out


def _graph_uses(graph: GraphProto, kind: int) -> bool:
    infos = [*graph.input, *graph.output, *graph.value_info]
    if any(vi.type.tensor_type.elem_type == kind for vi in infos):
        return True
    if any(t.data_type == kind for t in graph.initializer):
        return True
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == AttributeProto.INT and attr.name in TYPE_ATTRIBUTES and attr.i == kind:
                return True
            if attr.type == AttributeProto.TENSOR and attr.t.data_type == kind:
                return True
            if any(_graph_uses(g, kind) for g in _subgraphs(attr)):
                return True
    return False


def _widen_graph(graph: GraphProto) -> None:
    for vi in [*graph.input, *graph.output, *graph.value_info]:
        if vi.type.tensor_type.elem_type in OTHER_FLOATS:
            vi.type.tensor_type.elem_type = TensorProto.FLOAT
    for k, t in enumerate(graph.initializer):
        if t.data_type in OTHER_FLOATS:
            graph.initializer[k].CopyFrom(_as_float32(t))
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == AttributeProto.INT and attr.name in TYPE_ATTRIBUTES and attr.i in OTHER_FLOATS:
                attr.i = TensorProto.FLOAT
            elif attr.type == AttributeProto.TENSOR and attr.t.data_type in OTHER_FLOATS:
                attr.t.CopyFrom(_as_float32(attr.t))
            for g in _subgraphs(attr):
                _widen_graph(g)


def _as_float32(tensor: TensorProto) -> TensorProto:
    return numpy_helper.from_array(numpy_helper.to_array(tensor).astype(np.float32), tensor.name)


def _subgraphs(attr: AttributeProto) -> list[GraphProto]:
    if attr.type == AttributeProto.GRAPH:
        return [attr.g]
    return list(attr.graphs) if attr.type == AttributeProto.GRAPHS else []
