"""``Where`` over a constant condition (PyTorch's ``masked_fill`` with a constant mask) in BPU forms.

A causal attention exports ``scores.masked_fill(mask, -inf or a large negative)`` as ``Where(mask, fill,
scores)``, the mask folded to a constant. The BPU has no Where: it ran on the CPU, and the fill (-1e9,
``finfo(float32).min``) set the range the Softmax input was quantized over, so the scores all fell on one
or two grid steps (a probe's output cosine 0.66).

It becomes ``x * keep + fill_where_masked``, two constant tensors: exact in float for a finite fill.
Before a Softmax over it, a fill of ``MASKED_LOGIT`` or below (-1e9, -inf) is ``MASKED_LOGIT``: its
exponential is 0 in float32 next to any score within 9e3 of it, as the larger fill's was, and the
Softmax input is quantized over a range a 16-bit grid resolves scores in. Elsewhere a fill of +-inf
stays a Where on the CPU: ``inf`` has no place on an integer grid.
"""

from __future__ import annotations

import numpy as np
from onnx import ModelProto, NodeProto, TensorProto, helper, numpy_helper

from hbtools.graph.graph import GraphView, rewrite_nodes

MASKED_LOGIT = -1e4  # onnxruntime's mask_filter_value: exp(-1e4 + s) is 0 in float32 for any score s below 9e3


def constant_masks(model: ModelProto) -> int:
    """Rewrite ``model``'s Wheres over a constant condition; returns how many."""
    view = GraphView(model)

    def rewrite(node: NodeProto) -> list[NodeProto] | None:
        if node.op_type != "Where" or node.domain not in ("", "ai.onnx") or not view.is_const(node.input[0]):
            return None
        return _where(node, view, model)

    return rewrite_nodes(model, rewrite)


def _where(node: NodeProto, view: GraphView, model: ModelProto) -> list[NodeProto] | None:
    cond = view.const(node.input[0]).astype(bool)
    a, b = node.input[1], node.input[2]
    if view.is_const(a) == view.is_const(b):  # both constant: folded already; both computed: no mask
        return None
    # ``x`` where ``keep``, the constant ``fill`` elsewhere
    x, fill, keep = (b, view.const(a), ~cond) if view.is_const(a) else (a, view.const(b), cond)
    out_shape = view.shapes.get(node.output[0])
    if view.elem_types.get(x) != TensorProto.FLOAT or out_shape is None or None in out_shape:
        return None  # an integer Where is index arithmetic, for the CPU
    keep = np.broadcast_to(keep, out_shape)
    fill = np.where(keep, np.float32(0), np.broadcast_to(fill, out_shape).astype(np.float32))
    if _before_softmax(node, view) and (fill[~keep] <= MASKED_LOGIT).all():
        fill[~keep] = MASKED_LOGIT
    if not np.isfinite(fill).all():
        return None
    names = [f"{node.name}_keep", f"{node.name}_fill"]
    model.graph.initializer.extend(numpy_helper.from_array(v.astype(np.float32), n)
                                   for v, n in zip((keep, fill), names, strict=True))
    kept = f"{node.name}_kept"
    return [helper.make_node("Mul", [x, names[0]], [kept], name=f"{node.name}/Mul"),
            helper.make_node("Add", [kept, names[1]], [node.output[0]], name=node.name)]


def _before_softmax(node: NodeProto, view: GraphView) -> bool:
    """Whether ``node``'s output is read only by Softmax nodes (the masked positions are logits)."""
    readers = view.consumers.get(node.output[0], [])
    return bool(readers) and node.output[0] not in view.graph_outputs and \
        all(r.op_type == "Softmax" for r in readers)
