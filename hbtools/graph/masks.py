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

Masks computed at run time (a padding mask from an ``attention_mask`` input) and additive ones reach the
Softmax input through sums and selections (``logit_carriers``): their constants of ``MASKED_LOGIT`` and
below become ``MASKED_LOGIT`` (``masked_logits_clamped``), and calibration leaves the masked positions out of
those tensors' statistics (``quant.statistics``, ``quant.plan.logit_threshold``).
"""

from __future__ import annotations

import numpy as np
from onnx import ModelProto, NodeProto, TensorProto, helper, numpy_helper

from hbtools.graph.graph import GraphView, rewrite_nodes

MASKED_LOGIT = -1e4  # onnxruntime's mask_filter_value: exp(-1e4 + s) is 0 in float32 for any score s below 9e3
# A Softmax input at or below this is a masked position (what a mask adds, whatever the scores), not a score.
MASKED_BELOW = MASKED_LOGIT / 2
# Ops that carry a mask to a Softmax input unchanged in meaning: sums, selections, data movement.
_CARRIERS = ("Add", "Sub", "Where", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Expand", "Tile", "Cast",
             "Identity", "Concat", "Slice", "Mul", "Div")


def logit_carriers(model: ModelProto) -> set[str]:
    """Tensors read only on the way to Softmax inputs (through sums, selections, data movement and products
    with positive constants): the scores and the attention masks added to them. Their values at or below
    ``MASKED_BELOW`` (a mask's ``finfo(float32).min``, -inf, -1e4) mean "masked", not a magnitude."""
    view = GraphView(model)
    found: set[str] = set()
    memo: dict[str, bool] = {}
    stack = [n.input[0] for n in model.graph.node if n.op_type in ("Softmax", "LogSoftmax") and n.input]
    while stack:
        name = stack.pop()
        if name in found or view.is_const(name) or not _leads_to_softmax(name, view, memo):
            continue
        found.add(name)
        node = view.producer.get(name)
        if node is not None and node.domain in ("", "ai.onnx") and node.op_type in _CARRIERS:
            stack.extend(i for i in _data_inputs(node) if i)
    return found


def _data_inputs(node: NodeProto) -> list[str]:
    """The inputs of a carrier that carry values (not a Where's condition, nor shapes, indices or axes)."""
    if node.op_type == "Where":
        return list(node.input[1:3])
    if node.op_type in ("Add", "Sub", "Mul", "Div", "Concat"):
        return list(node.input)
    return list(node.input[:1])


def _carries(node: NodeProto, name: str, view: GraphView) -> bool:
    if node.domain not in ("", "ai.onnx") or node.op_type not in _CARRIERS or name not in _data_inputs(node):
        return False
    if node.op_type in ("Mul", "Div"):  # a scale: a positive constant, the other factor
        other = [i for i in node.input if i != name]
        value = view.const(other[0]) if len(other) == 1 else None
        return value is not None and bool(np.all(value > 0)) and (node.op_type == "Mul" or node.input[0] == name)
    return node.op_type != "Sub" or node.input[0] == name


def _leads_to_softmax(name: str, view: GraphView, memo: dict[str, bool]) -> bool:
    """Whether every reader of ``name`` carries it on to a Softmax input (or is one)."""
    if name not in memo:
        memo[name] = False  # a cycle through a Loop body, or the answer while it is found
        readers = view.consumers.get(name, [])
        memo[name] = bool(readers) and name not in view.graph_outputs and all(
            r.op_type in ("Softmax", "LogSoftmax") or (_carries(r, name, view) and all(
                _leads_to_softmax(o, view, memo) for o in r.output if o)) for r in readers)
    return memo[name]


def masked_logits_clamped(model: ModelProto) -> int:
    """Constants that mask positions of a Softmax input (an additive causal mask of -inf or
    ``finfo(float32).min``, the fill of a ``masked_fill`` over a computed mask, the factor of
    ``(1 - mask) * finfo.min``) with values at or below ``MASKED_LOGIT`` set to ``MASKED_LOGIT``: exact before
    the Softmax (exp underflows either way), and finite values an integer grid can hold. Returns how many."""
    view = GraphView(model)
    carriers = logit_carriers(model)
    changed = 0
    for node in model.graph.node:
        if node.domain not in ("", "ai.onnx") or node.op_type not in ("Add", "Sub", "Where", "Mul") or \
                not any(o in carriers for o in node.output):
            continue
        slots = [1, 2] if node.op_type == "Where" else [0, 1]
        for k in slots:
            value = view.const(node.input[k]) if k < len(node.input) else None
            if value is None or value.dtype.kind != "f" or not np.any(value <= MASKED_LOGIT) or \
                    (node.op_type == "Sub" and k == 1) or (node.op_type == "Mul" and not np.all(value <= MASKED_LOGIT)):
                continue
            name = f"{node.name or node.output[0]}_masked_{k}"
            model.graph.initializer.append(numpy_helper.from_array(
                np.where(value <= MASKED_LOGIT, np.float32(MASKED_LOGIT), value).astype(value.dtype), name))
            node.input[k] = name
            changed += 1
    return changed


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
