"""Activations written out by exporters with a branch that changes nothing in float32.

torch's default (dynamo) exporter writes ``F.softplus(x, beta, threshold)`` as
``Where(x * beta > threshold, x, Softplus(x * beta) / beta)`` (without the Mul and the Div for ``beta`` 1):
above the threshold torch returns ``x`` itself. The BPU has no Greater nor Where, so the two ran on the CPU
and cut the BPU graph around every softplus, while the Softplus alone is a lookup table on the BPU.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from onnx import ModelProto, NodeProto, helper

from hbtools.graph.graph import GraphView

# What float32 rounding of a value already moves it by, relative to the value (the unit roundoff, half of eps).
_FLOAT32_ROUNDING = float(np.finfo(np.float32).eps) / 2
# Comparisons true where the compared value is above the constant, by which input the value is.
_ABOVE = {"Greater": 0, "GreaterOrEqual": 0, "Less": 1, "LessOrEqual": 1}
_BELOW = {"Less": 0, "LessOrEqual": 0, "Greater": 1, "GreaterOrEqual": 1}


def neutral_softplus_threshold(threshold: np.ndarray) -> bool:
    """Whether returning ``s`` in place of ``softplus(s)`` for every ``s`` above ``threshold`` changes no value by
    more than float32 rounding does. There ``softplus(s) - s = log1p(exp(-s))``, which shrinks as ``s`` grows while
    the rounding of ``s`` (``s`` times the unit roundoff) grows: the bound holds above the threshold when it holds
    at it. torch's default threshold 20 gives 2e-9 against 1.2e-6; the bound holds from about 14 up."""
    t = np.asarray(threshold, dtype=np.float64)
    if t.size == 0 or not np.all(np.isfinite(t)) or not np.all(t > 0):
        return False
    return bool(np.all(np.log1p(np.exp(-t)) <= t * _FLOAT32_ROUNDING))


def softplus_thresholds_dropped(model: ModelProto, placed: Mapping[str, str] | None = None) -> int:
    """Each ``Where(s > t, x, Softplus(s) / beta)`` with ``s = x * beta`` (or ``s = x`` and no division), ``t`` a
    constant for which the branch is numerically neutral (``neutral_softplus_threshold``), becomes the softplus
    branch alone: the Where and its comparison go (so does one that ``placed``, the config's node_info, puts on the
    CPU stay). The comparison may be written either way round (``t < s``; ``s <= t`` with the branches swapped).
    Returns how many softplus thresholds it dropped."""
    view = GraphView(model)
    gone: set[int] = set()
    renamed: dict[str, str] = {}
    count = 0
    for node in model.graph.node:
        found = _softplus_branch(node, view, placed or {})
        if found is None:
            continue
        branch, compare = found
        writer = view.producer[branch]
        if len(view.consumers.get(branch, [])) == 1 and branch not in view.graph_outputs:
            writer.output[0] = node.output[0]  # the branch's last node writes what the Where wrote
        else:
            renamed[node.output[0]] = branch
        gone.add(id(node))
        if len(view.consumers.get(compare.output[0], [])) == 1 and compare.output[0] not in view.graph_outputs:
            gone.add(id(compare))
        count += 1
    if not count:
        return 0
    kept: list[NodeProto] = []
    for node in model.graph.node:
        if id(node) in gone:
            continue
        for k, name in enumerate(node.input):
            node.input[k] = renamed.get(name, name)
        kept.append(node)
    for out in (o for o in model.graph.output if o.name in renamed):  # the Where wrote a model output
        kept.append(helper.make_node("Identity", [renamed[out.name]], [out.name], name=f"{out.name}_softplus"))
    del model.graph.node[:]
    model.graph.node.extend(kept)
    return count


def _softplus_branch(node: NodeProto, view: GraphView, placed: Mapping[str, str]) -> tuple[str, NodeProto] | None:
    """For a Where of the thresholded softplus pattern whose threshold is neutral: (the tensor of its softplus
    branch, the comparison node). None for any other node."""
    if node.op_type != "Where" or node.domain not in ("", "ai.onnx") or len(node.input) != 3:
        return None
    compare = view.producer.get(node.input[0])
    if compare is None or compare.domain not in ("", "ai.onnx") or compare.op_type not in _ABOVE or \
            len(compare.input) != 2 or sum(view.is_const(i) for i in compare.input) != 1:
        return None
    if any(placed.get(n.name) == "CPU" for n in (node, compare)):
        return None
    const_at = 0 if view.is_const(compare.input[0]) else 1
    s, threshold = compare.input[1 - const_at], view.const(compare.input[const_at])
    # the branch the Where takes above the threshold is the identity, the other the softplus
    if _ABOVE[compare.op_type] == 1 - const_at:
        identity, branch = node.input[1], node.input[2]
    elif _BELOW[compare.op_type] == 1 - const_at:
        identity, branch = node.input[2], node.input[1]
    else:
        return None
    if not _broadcasts_within(threshold, view.shapes.get(s)) or not neutral_softplus_threshold(threshold):
        return None
    softplus, back = _softplus_and_scale(branch, view)
    if softplus is None or softplus.input[0] != s or placed.get(softplus.name) == "CPU":
        return None
    beta = _scale_of(s, identity, view)
    if beta is None or not np.isclose(beta * back, 1.0, rtol=0, atol=4 * _FLOAT32_ROUNDING):
        return None  # the softplus branch is not on the identity's scale: the Where chooses between two functions
    return branch, compare


def _broadcasts_within(threshold: np.ndarray, shape: list | None) -> bool:
    """Whether a threshold of this shape leaves the compared tensor's shape as it is (the Where's output too)."""
    if threshold.size == 1:
        return True
    if shape is None or None in shape:
        return False
    try:
        return list(np.broadcast_shapes(threshold.shape, tuple(shape))) == list(shape)
    except ValueError:
        return False


def _softplus_and_scale(branch: str, view: GraphView) -> tuple[NodeProto | None, float]:
    """The Softplus node behind ``branch`` and the factor its output is multiplied by on the way (``1 / beta`` of a
    ``Div`` by ``beta``, or a ``Mul`` by a constant): (None, 0) where ``branch`` is no such thing."""
    node = view.producer.get(branch)
    if node is None or node.domain not in ("", "ai.onnx"):
        return None, 0.0
    if node.op_type == "Softplus":
        return node, 1.0
    if node.op_type not in ("Mul", "Div") or len(node.input) != 2:
        return None, 0.0
    const_at = [k for k, i in enumerate(node.input) if view.is_const(i)]
    if len(const_at) != 1 or (node.op_type == "Div" and const_at[0] != 1):
        return None, 0.0
    value = view.const(node.input[const_at[0]])
    inner = view.producer.get(node.input[1 - const_at[0]])
    if value.size != 1 or not np.isfinite(value).all() or float(value.ravel()[0]) == 0 or inner is None or \
            inner.op_type != "Softplus" or inner.domain not in ("", "ai.onnx") or \
            len(view.consumers.get(inner.output[0], [])) != 1:
        return None, 0.0
    factor = float(value.ravel()[0])
    return inner, 1.0 / factor if node.op_type == "Div" else factor


def _scale_of(s: str, x: str, view: GraphView) -> float | None:
    """``beta`` where ``s`` is ``x * beta`` (a Mul by a one-value constant), 1 where ``s`` is ``x``; else None."""
    if s == x:
        return 1.0
    node = view.producer.get(s)
    if node is None or node.op_type != "Mul" or node.domain not in ("", "ai.onnx") or len(node.input) != 2 or \
            x not in node.input:
        return None
    other = node.input[1] if node.input[0] == x else node.input[0]
    value = view.const(other)
    if value is None or value.size != 1 or not np.isfinite(value).all():
        return None
    return float(value.ravel()[0])
