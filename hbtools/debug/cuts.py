"""Where to cut a switchable model into stages (see ``stages``).

A configuration runs the stages from the one holding its first enabled switch to
the one holding its last in their slower switchable form, then one fused float
tail for everything downstream. At each stage boundary it crosses it pays for
handing tensors over (layout reorders, broken fusions), and each stage it runs
costs a small fixed amount (a session run). Cuts are chosen by dynamic programming
to minimize that cost summed over typical configurations, with compute estimated
from tensor shapes. Without tails (``tails=False``) the stages after the last
switch run one by one too, so every configuration starting before a boundary
crosses it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from onnx import NodeProto, TensorProto

from hbtools.debug.switches import Switched, float_version
from hbtools.graph.graph import elements, itemsize, references

# Costs are in multiply-adds of a convolution. Element-wise work is memory-bound: one
# element costs about as much as ELEMENT_COST multiply-adds on a CPU.
ELEMENT_COST = 8.0
FAKE_QUANT_OPS = 5  # Div, Round, Clip, Mul and the switch's own copy
NCHW_PENALTY = 0.5  # a switched convolution runs in plain NCHW: about 1.5x its fused cost
BOUNDARY_COPIES = 2.0  # a crossing tensor is reordered / copied about twice
STAGE_OVERHEAD = 0.002  # fixed cost of running one more stage, as a share of the whole model


def stage_starts(switched: Switched, shapes: dict[str, list[int | None]], types: dict[str, int],
                 max_stages: int, spans: Sequence[tuple[int, int]], tails: bool = True) -> list[int]:
    """Indices of the main-graph nodes that begin a stage; the first is 0.

    ``spans`` are typical configurations as (first, last) indices of the nodes holding
    their switches.
    """
    nodes = list(switched.model.graph.node)
    cost = np.array([node_cost(n, switched, shapes) for n in nodes], dtype=np.float64)
    extra = np.array([_switch_cost(n, switched, shapes) for n in nodes], dtype=np.float64)
    crossing = ELEMENT_COST * np.concatenate([[0.0], _crossing_elements(nodes, shapes, types)])
    firsts = np.sort(np.array([a for a, _ in spans], dtype=np.int64))
    lasts = np.sort(np.array([b for _, b in spans], dtype=np.int64))
    return _best_starts(_prefix(cost), _prefix(extra), crossing, firsts, lasts, max_stages, tails)


def _prefix(values: np.ndarray) -> np.ndarray:
    return np.concatenate([[0.0], np.cumsum(values)])


def _best_starts(cumulative: np.ndarray, switched_extra: np.ndarray, crossing: np.ndarray, firsts: np.ndarray,
                 lasts: np.ndarray, max_stages: int, tails: bool) -> list[int]:
    """cumulative[i]: float cost of nodes before i; switched_extra likewise for the switches' extra cost.

    ``firsts`` / ``lasts``: sorted first / last holder indices of the configurations.
    """
    n = len(cumulative) - 1
    total = cumulative[-1]
    points = np.unique(np.concatenate([[0], firsts[firsts > 0], [n]]))  # possible stage starts, and the end
    starting = np.searchsorted(firsts, points, side="left")  # configurations starting before each point
    ended = np.searchsorted(lasts, points, side="left")  # configurations whose last switch is before it
    crossed = BOUNDARY_COPIES * crossing[points]
    overhead = STAGE_OVERHEAD * total

    def stage_cost(i: np.ndarray, j: int) -> np.ndarray:
        """Cost of a stage from points[i] to points[j], summed over the configurations."""
        begin = starting[j] - starting[i]  # start in the stage: the float work from its start on
        active = starting[j] - ended[i]  # hold a switch in it or straddle it: its switchable form
        extra = switched_extra[points[j]] - switched_extra[points[i]]
        if not tails:  # every configuration starting before the end runs the stage
            return begin * (total - cumulative[points[i]] + extra) + (crossed[j] + overhead) * starting[j]
        return begin * (total - cumulative[points[i]]) + active * (extra + crossed[i] + crossed[j] + overhead)

    m = len(points) - 1
    costs = np.full((m + 1, m + 1), np.inf)  # [i, j]: a stage from points[i] to points[j]; inf unless i < j
    for j in range(1, m + 1):
        costs[:j, j] = stage_cost(np.arange(j), j)
    best = np.full((max_stages + 1, m + 1), np.inf)
    came = np.zeros((max_stages + 1, m + 1), dtype=np.int64)
    best[0, 0] = 0.0
    columns = np.arange(1, m + 1)
    for t in range(1, max_stages + 1):
        vals = best[t - 1][:, None] + costs[:, 1:]  # the first i of the lowest wins, as argmin over i < j did
        k = np.argmin(vals, axis=0)
        best[t, 1:], came[t, 1:] = vals[k, columns - 1], k
    t, j = int(np.argmin(best[:, m])), m
    starts = []
    while t > 0:
        j = int(came[t, j])
        starts.append(int(points[j]))
        t -= 1
    return sorted(starts)


def node_cost(node: NodeProto, switched: Switched, shapes: dict[str, list[int | None]]) -> float:
    """Rough cost of a node in its float form (multiply-add units)."""
    if switched.is_switch(node):
        return sum(node_cost(n, switched, shapes) for n in float_version(node))
    if node.op_type == "Identity":
        return 0.0
    out = sum(elements(shapes.get(o)) for o in node.output)
    if node.op_type in ("Conv", "ConvTranspose") and len(node.input) > 1:
        w = shapes.get(node.input[1])
        return float(out * (elements(w[1:]) if w else 1))
    if node.op_type in ("Gemm", "MatMul"):
        a = shapes.get(node.input[0])
        return float(out * (a[-1] if a and a[-1] else 1))
    return ELEMENT_COST * max(out, 1)


def _switch_cost(node: NodeProto, switched: Switched, shapes: dict[str, list[int | None]]) -> float:
    """What a switch adds when its stage runs in switchable form (even with the switch off)."""
    if not switched.is_switch(node):
        return 0.0
    inner = float_version(node)
    if len(inner) == 1 and inner[0].op_type == "Identity":  # an activation switch
        return FAKE_QUANT_OPS * ELEMENT_COST * sum(elements(shapes.get(o)) for o in node.output)
    return NCHW_PENALTY * sum(node_cost(n, switched, shapes) for n in inner)


def _crossing_elements(nodes: Sequence[NodeProto], shapes: dict[str, list[int | None]],
                       types: dict[str, int]) -> np.ndarray:
    """Elements (4-byte units) of the tensors alive between node i and node i + 1."""
    born = {o: i for i, n in enumerate(nodes) for o in n.output if o}
    last: dict[str, int] = {}
    for i, n in enumerate(nodes):
        for ref in references(n):
            if ref in born:
                last[ref] = i
    delta = np.zeros(len(nodes) + 1)
    for t, end in last.items():
        if end > born[t]:
            size = elements(shapes.get(t)) * itemsize(types.get(t, TensorProto.FLOAT)) / 4
            delta[born[t]] += size
            delta[end] -= size
    return np.cumsum(delta)[:-1]
