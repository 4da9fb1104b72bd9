"""Float tails: everything downstream of a stage as one fused model.

A configuration whose last enabled switch sits in stage q computes nothing but float
arithmetic after q. Run stage by stage, that suffix pays at every boundary for
handing tensors over, layout reorders (NCHWc to NCHW and back) and fusions broken by
the cut (Conv+Clip, element-wise ops left in NCHW). Tail ``T_j`` instead holds the
float versions of the nodes of stages j and later that the observed tensors depend
on, optimized by onnxruntime as a whole. It takes what earlier stages produce as
inputs and yields the observed tensors made from stage j on; a run with its last
switch in stage q finishes with ``T_{q+1}``.

Each tail carries a copy of the weights it reads, in all about tails / 2 times the
model's. At most ``MAX_TAILS`` tails, evenly spread, are built, fewer when their
copies would exceed ``MAX_TAIL_BYTES``, none if even the last tail's are larger; a
run whose last switch is not followed by a tail goes on with float stages (one
session each) up to the next tail.
"""

from __future__ import annotations

from collections.abc import Sequence

from onnx import NodeProto, TensorProto

from hbtools.debug.switches import Switched, float_version
from hbtools.graph.graph import references

MAX_TAIL_BYTES = 200_000_000
# On PP-OCR rec, 24 stages with a tail after every second one ran as fast as with one
# after each (the missing tail costs one float stage and one more hand-over) and
# built in 25% less time.
MAX_TAILS = 12


def tail_nodes(nodes: Sequence[NodeProto], switched: Switched, stage_of: dict[str, int], j: int,
               outputs: Sequence[str]) -> list[NodeProto]:
    """Float versions of the nodes of stages ``j`` and later that ``outputs`` depend on, in graph order."""
    needed = set(outputs)
    kept: list[NodeProto] = []
    for n in reversed(nodes):  # stage_of grows along the node order
        if stage_of[n.name] < j:
            break
        if not needed.intersection(n.output):
            continue
        plain = float_version(n) if switched.is_switch(n) else [n]
        for m in reversed(plain):
            kept.append(m)
            needed.update(references(m))
    return kept[::-1]


def suffix_bytes(nodes: Sequence[NodeProto], switched: Switched, stage_of: dict[str, int],
                 inits: dict[str, TensorProto]) -> dict[int, int]:
    """Per stage j, the bytes of the constants the float versions of the nodes of stages j and later read."""
    read: set[str] = set()
    total = 0
    sizes: dict[int, int] = {}
    for n in reversed(nodes):  # stage_of grows along the node order
        for m in float_version(n) if switched.is_switch(n) else [n]:
            for r in references(m):
                if r in inits and r not in read:
                    read.add(r)
                    total += inits[r].ByteSize()
        sizes[stage_of[n.name]] = total
    return sizes


def choose(sizes: dict[int, int]) -> list[int]:
    """The tails to build among ``sizes`` (tail -> bytes of its constants).

    All of them if there are at most ``MAX_TAILS`` and their copies fit
    ``MAX_TAIL_BYTES``, else every second, third, ... counted from the last.
    """
    order = sorted(sizes, reverse=True)  # later tails are smaller: keep the last one
    for stride in range(1, len(order) + 1):
        kept = order[::stride]
        if len(kept) <= MAX_TAILS and sum(sizes[j] for j in kept) <= MAX_TAIL_BYTES:
            return sorted(kept)
    return []
