"""Fetching many tensors of a model without holding them all at once.

A statistics pass reads every activation of every sample. Fetched from one session, a sample's
activations all live until the run returns: an 800x800 table detector's 4.2 GB of them took
makertbin to 7.1 GB. ``Segments`` cuts the model into consecutive parts, each fetching at most
``budget`` bytes of the wanted tensors, and runs them one after the other on the values that
cross the cuts: the same computation once, with one part's tensors alive at a time.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
from onnx import ModelProto

from hbtools.graph.graph import GraphView, elements, itemsize, part_model, references
from hbtools.runtime.session import fetching_session

SEGMENT_BYTES = 1 << 30  # wanted tensors one part may fetch; every corpus model stays in one part
T = TypeVar("T")


def byte_groups(items: Sequence[T], sizes: Sequence[int], budget: int) -> list[list[T]]:
    """``items`` in order, cut into runs whose ``sizes`` add up to at most ``budget`` (an item larger than
    the budget makes a run of its own)."""
    groups: list[list[T]] = [[]]
    held = 0
    for item, size in zip(items, sizes, strict=True):
        if groups[-1] and held + size > budget:
            groups.append([])
            held = 0
        groups[-1].append(item)
        held += size
    return [g for g in groups if g]


@dataclass
class _Part:
    session: object
    inputs: list[str]  # what it reads from the feeds or from earlier parts
    wanted: list[str]  # the wanted tensors it makes
    fetched: list[str]  # wanted, then what later parts read


class Segments:
    """Runs of ``model`` (nodes in topological order) giving the ``wanted`` tensors part by part."""

    def __init__(self, model: ModelProto, wanted: Sequence[str], budget: int | None = None) -> None:
        budget = SEGMENT_BYTES if budget is None else budget
        wanted = list(dict.fromkeys(wanted))
        view = GraphView(model)
        size = {t: elements(view.shapes.get(t)) * itemsize(view.elem_types.get(t) or 1) for t in wanted}
        nodes = list(model.graph.node)
        made_by = {o: i for i, n in enumerate(nodes) for o in n.output if o}
        made_here = [0] * len(nodes)  # bytes of the wanted tensors each node makes
        for t in wanted:
            if t in made_by:
                made_here[made_by[t]] += size[t]
        groups = byte_groups(range(len(nodes)), made_here, budget)
        self.single = len(groups) <= 1
        if self.single:
            self._whole = fetching_session(model, wanted)
            self._wanted = wanted
            return
        last_read: dict[str, int] = {}
        for k, group in enumerate(groups):
            for i in group:
                for r in references(nodes[i]):
                    last_read[r] = k
        self._parts: list[_Part] = []
        for k, group in enumerate(groups):
            part_nodes = [nodes[i] for i in group]
            made = [o for n in part_nodes for o in n.output if o]
            mine = [t for t in wanted if made_by.get(t, -1) in group]
            crossing = [t for t in made if last_read.get(t, -1) > k]
            outputs = list(dict.fromkeys([*mine, *crossing]))
            part = part_model(model, part_nodes, outputs, view.shapes, view.elem_types, f"segment_{k}")
            self._parts.append(_Part(fetching_session(part, outputs), [i.name for i in part.graph.input],
                                     mine, outputs))
        self._last_read = last_read
        self._from_feed = [t for t in wanted if t not in made_by]  # graph inputs: given, not computed

    def run(self, feed: dict[str, np.ndarray]) -> Iterator[dict[str, np.ndarray]]:
        """The wanted tensors for one feed, a part's worth at a time (all of them at once for one part)."""
        if self.single:
            yield dict(zip(self._wanted, self._whole.run(self._wanted, feed), strict=True))
            return
        carried = dict(feed)
        for k, part in enumerate(self._parts):
            values = dict(zip(part.fetched, part.session.run(part.fetched, {i: carried[i] for i in part.inputs}),
                              strict=True))
            carried.update(values)
            given = {t: feed[t] for t in self._from_feed if t in feed} if k == 0 else {}
            yield {**given, **{t: values[t] for t in part.wanted}}
            del values
            # What no later part reads goes now: one part's tensors (and the crossings) are alive at a time.
            for name in [t for t in carried if self._last_read.get(t, -1) <= k]:
                del carried[name]
