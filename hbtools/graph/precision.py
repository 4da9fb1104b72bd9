"""Float16 models computed in float32: the float model a quantizer starts from.

An export made for a GPU (``model.half()``, onnxconverter-common's float16 pass) keeps
its weights, its inputs and outputs, or only some casts in float16. Quantization
measures float32 statistics and the BPU computes in int8/int16, so the parse stage
widens every float16 tensor to float32: the model means the same, with float32
rounding instead of float16's.
"""

from __future__ import annotations

import numpy as np
from onnx import AttributeProto, GraphProto, ModelProto, TensorProto, numpy_helper

# Attributes that name an element type (Cast, EyeLike, RandomNormal..., CastLike takes a tensor).
TYPE_ATTRIBUTES = ("to", "dtype")


def uses_float16(model: ModelProto) -> bool:
    return _graph_uses(model.graph)


def to_float32(model: ModelProto) -> ModelProto:
    """A copy of ``model`` with every float16 tensor, type and attribute made float32."""
    out = ModelProto()
    out.CopyFrom(model)
    _widen_graph(out.graph)
    return out


def _graph_uses(graph: GraphProto) -> bool:
    infos = [*graph.input, *graph.output, *graph.value_info]
    if any(vi.type.tensor_type.elem_type == TensorProto.FLOAT16 for vi in infos):
        return True
    if any(t.data_type == TensorProto.FLOAT16 for t in graph.initializer):
        return True
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == AttributeProto.INT and attr.name in TYPE_ATTRIBUTES and attr.i == TensorProto.FLOAT16:
                return True
            if attr.type == AttributeProto.TENSOR and attr.t.data_type == TensorProto.FLOAT16:
                return True
            if any(_graph_uses(g) for g in _subgraphs(attr)):
                return True
    return False


def _widen_graph(graph: GraphProto) -> None:
    for vi in [*graph.input, *graph.output, *graph.value_info]:
        if vi.type.tensor_type.elem_type == TensorProto.FLOAT16:
            vi.type.tensor_type.elem_type = TensorProto.FLOAT
    for k, t in enumerate(graph.initializer):
        if t.data_type == TensorProto.FLOAT16:
            graph.initializer[k].CopyFrom(_widened(t))
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == AttributeProto.INT and attr.name in TYPE_ATTRIBUTES and attr.i == TensorProto.FLOAT16:
                attr.i = TensorProto.FLOAT
            elif attr.type == AttributeProto.TENSOR and attr.t.data_type == TensorProto.FLOAT16:
                attr.t.CopyFrom(_widened(attr.t))
            for g in _subgraphs(attr):
                _widen_graph(g)


def _widened(tensor: TensorProto) -> TensorProto:
    return numpy_helper.from_array(numpy_helper.to_array(tensor).astype(np.float32), tensor.name)


def _subgraphs(attr: AttributeProto) -> list[GraphProto]:
    if attr.type == AttributeProto.GRAPH:
        return [attr.g]
    return list(attr.graphs) if attr.type == AttributeProto.GRAPHS else []
