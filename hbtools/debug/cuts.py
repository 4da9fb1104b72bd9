"""Where to cut a switchable model into stages (see ``stages``).

A configuration pays for every stage from the one holding its first enabled switch
to the end, that stage in its slower switchable form, plus a small hand-over cost
at each stage boundary it crosses. Cuts are chosen by dynamic programming to
minimize that cost summed over the calibration nodes, each enabled on its own,
with compute estimated from tensor shapes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import onnx
from onnx import NodeProto, TensorProto, helper

from hbtools.debug.switches import Switched, float_version

# Costs are in multiply-adds of a convolution. Element-wise work is memory-bound: one
# element costs about as much as ELEMENT_COST multiply-adds on a CPU.
ELEMENT_COST = 8.0
FAKE_QUANT_OPS = 5  # Div, Round, Clip, Mul and the switch's own copy
NCHW_PENALTY = 0.5  # a switched convolution runs in plain NCHW: about 1.5x its fused cost
BOUNDARY_COPIES = 2.0  # a crossing tensor is reordered / copied about twice
STAGE_OVERHEAD = 0.002  # fixed cost of running one more stage, as a share of the whole model


def stage_starts(switched: Switched, shapes: dict[str, list[int | None]], types: dict[str, int],
                 max_stages: int) -> list[int]:
    """Indices of the main-graph nodes that begin a stage; the first is 0."""
    nodes = list(switched.model.graph.node)
    index = {n.name: i for i, n in enumerate(nodes)}
    positions = sorted(min(index[h] for h in holders) for holders in switched.holders.values())
    cost = np.array([node_cost(n, switched, shapes) for n in nodes], dtype=np.float64)
    extra = np.array([_switch_cost(n, switched, shapes) for n in nodes], dtype=np.float64)
    crossing = ELEMENT_COST * np.concatenate([[0.0], _crossing_elements(nodes, shapes, types)])
    return _best_starts(_prefix(cost), _prefix(extra), crossing, np.array(positions), max_stages)


def _prefix(values: np.ndarray) -> np.ndarray:
    return np.concatenate([[0.0], np.cumsum(values)])


def _best_starts(cumulative: np.ndarray, switched_extra: np.ndarray, crossing: np.ndarray, positions: np.ndarray,
                 max_stages: int) -> list[int]:
    """cumulative[i]: float cost of nodes before i; switched_extra likewise for the switches' extra cost."""
    n = len(cumulative) - 1
    total = cumulative[-1]
    cand = np.unique(np.concatenate([[0], positions[positions > 0]]))
    ends = np.concatenate([cand, [n]])
    before = np.searchsorted(positions, ends, side="left")  # configurations starting before each candidate
    start_cost = cumulative[cand]

    def stage_cost(i: np.ndarray, j: int) -> np.ndarray:
        """Cost of the configurations in a stage from cand[i] to ends[j]."""
        count = before[j] - before[i]
        extra = switched_extra[ends[j]] - switched_extra[cand[i]]
        return count * (total - start_cost[i] + extra)

    boundary = (BOUNDARY_COPIES * crossing[ends] + STAGE_OVERHEAD * total) * before
    m = len(cand)
    best = np.full((max_stages, m), np.inf)
    came = np.zeros((max_stages, m), dtype=np.int64)
    best[0, 0] = 0.0
    for t in range(1, max_stages):
        for j in range(1, m):
            i = np.arange(j)
            vals = best[t - 1, :j] + stage_cost(i, j) + boundary[j]
            k = int(np.argmin(vals))
            best[t, j], came[t, j] = vals[k], k
    final = best + np.stack([stage_cost(np.arange(m), m) for _ in range(max_stages)])
    t, j = np.unravel_index(int(np.argmin(final)), final.shape)
    starts = []
    while t >= 0:
        starts.append(int(cand[j]))
        j = came[t, j]
        t -= 1
        if not starts[-1]:
            break
    return sorted(set(starts))


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


def elements(dims: Iterable[int | None] | None) -> int:
    if dims is None:
        return 1
    dims = list(dims)
    return int(np.prod(dims, dtype=np.int64)) if all(d is not None for d in dims) else 1


def references(node: NodeProto) -> Iterable[str]:
    """Every tensor a node reads, including those its sub-graphs read from the outer scope."""
    yield from (i for i in node.input if i)
    for attr in node.attribute:
        for sub in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs):
            local = {o for n in sub.node for o in n.output} | {t.name for t in sub.initializer}
            local |= {i.name for i in sub.input}
            for inner in sub.node:
                yield from (r for r in references(inner) if r not in local)


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
            size = elements(shapes.get(t)) * _itemsize(types.get(t, TensorProto.FLOAT)) / 4
            delta[born[t]] += size
            delta[end] -= size
    return np.cumsum(delta)[:-1]


def _itemsize(elem_type: int) -> int:
    return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)).itemsize
