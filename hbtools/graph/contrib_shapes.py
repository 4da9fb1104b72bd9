"""Output shapes of the onnxruntime contrib ops that stay in a model (onnx's shape inference knows none).

``hbtools.graph.contrib`` writes most of them as standard ops; one it keeps (an attention with a padding
mask, a rotary embedding with positions given at run time) left everything after it without shapes, and
the rewrites that need a rank passed over it: a LayerNormalization after such an attention went to the CPU
("a scale or bias computed at run time"). These rules give the outputs the shapes onnxruntime gives them.
"""

from __future__ import annotations

from collections.abc import Callable

import onnx
from onnx import ModelProto, NodeProto

from hbtools.ops.base import CONTRIB_DOMAIN, attrs_of

Dims = list[int | None]
# Ops whose first output has the shape of their first input.
_SAME_SHAPE = frozenset({"RotaryEmbedding", "SkipLayerNormalization", "SkipSimplifiedLayerNormalization",
                         "SimplifiedLayerNormalization", "Gelu", "BiasGelu", "FastGelu", "QuickGelu", "BiasAdd"})


def _attention(node: NodeProto, shapes: list[Dims | None]) -> Dims | None:
    x, weights = shapes[0], shapes[1] if len(shapes) > 1 else None
    if x is None or len(x) != 3 or weights is None or len(weights) != 2 or weights[1] is None:
        return None
    sizes = list(attrs_of(node).get("qkv_hidden_sizes", []))
    return [x[0], x[1], sizes[2] if len(sizes) == 3 else weights[1] // 3]


def _multi_head_attention(node: NodeProto, shapes: list[Dims | None]) -> Dims | None:
    query = shapes[0]
    value = shapes[2] if len(shapes) > 2 else None
    if query is None or len(query) != 3 or value is None:
        return None
    if len(value) == 3:
        return [query[0], query[1], value[2]]
    if len(value) == 4 and None not in value[1:]:  # [batch, heads, length, size]
        return [query[0], query[1], value[1] * value[3]]
    return None


_RULES: dict[str, Callable[[NodeProto, list[Dims | None]], Dims | None]] = {
    "Attention": _attention, "MultiHeadAttention": _multi_head_attention}


def contrib_value_infos(model: ModelProto, known: dict[str, Dims]) -> list[onnx.ValueInfoProto]:
    """Float first outputs of ``model``'s contrib nodes whose shape ``known`` (tensor -> dims) lacks."""
    out = []
    for node in model.graph.node:
        if node.domain != CONTRIB_DOMAIN or not node.output or not node.output[0] or node.output[0] in known:
            continue
        shapes = [known.get(i) if i else None for i in node.input]
        rule = _RULES.get(node.op_type)
        dims = rule(node, shapes) if rule else (shapes[0] if node.op_type in _SAME_SHAPE and shapes else None)
        if dims is not None:
            out.append(onnx.helper.make_tensor_value_info(node.output[0], onnx.TensorProto.FLOAT, dims))
    return out
