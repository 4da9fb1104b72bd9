"""Rerunning only the part of a model after a change.

A search that scores many configurations, each differing from one reference run in what a
single node reads (a switch turned off), recomputes the same prefix every time. ``Suffixes``
cuts a lowered model before a few nodes and builds one session per suffix, once: a run that
changes nothing before a cut starts there, from the values the reference run left at the cut.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence

import numpy as np
import onnxruntime as ort
from onnx import ModelProto, helper

from hbtools.graph.graph import elements, infer_shapes, itemsize, part_model, references, shape_probe
from hbtools.runtime.custom_session import CustomOpSession
from hbtools.runtime.session import make_session

KEPT_BYTES = 96 << 20  # values a run keeps for the cuts (per sample held by the caller)
# Weights the sessions built here may hold in all (onnxruntime keeps a few copies of each while it builds a
# session and after): every suffix holds what its nodes read, and with any cut the whole model is one more
# session. VGG-19's fully connected weights (480 MB) are in every suffix: its int16 search held 10.8 GB.
WEIGHT_BYTES = 256 << 20


class Suffixes:
    """``model`` (nodes in topological order) cut before the nodes at ``cuts``.

    ``run`` gives ``outputs`` and the values every cut needs; ``rerun(start, ...)`` gives the
    same outputs for inputs that differ from that run only in what nodes at ``start`` or
    later read, running the suffix of the last cut at or before ``start``.
    """

    def __init__(self, model: ModelProto, outputs: Sequence[str], cuts: Sequence[int],
                 budget: int = KEPT_BYTES, whole: ort.InferenceSession | CustomOpSession | None = None,
                 threads: int = 0, weight_budget: int = WEIGHT_BYTES) -> None:
        """``budget``: bytes a ``run`` may keep for the cuts; cuts whose crossing values would pass
        it (the smallest crossings go first) or whose size is unknown are left out. ``weight_budget``:
        bytes of weights the sessions built here may hold in all (the latest cuts, whose suffixes read
        the fewest, go first). ``whole``: a session over ``model`` as it is, used when no cut is kept.
        ``threads``: onnxruntime threads of the sessions built here (0: its default)."""
        nodes = list(model.graph.node)
        self.outputs = list(outputs)
        made_at = {o: i for i, n in enumerate(nodes) for o in n.output if o}
        cuts = _within_weights(model, nodes, cuts, weight_budget)
        types, sizes = _types_and_sizes(model) if cuts else ({}, {})
        crossings: dict[int, list[str]] = {}
        for c in sorted({c for c in cuts if 0 < c < len(nodes)}):
            reads = dict.fromkeys(r for n in nodes[c:] for r in references(n))
            crossing = [t for t in reads if made_at.get(t, len(nodes)) < c]
            if all(t in sizes for t in crossing):  # a value of unknown size is not kept
                crossings[c] = crossing
        kept: dict[str, int] = {}
        for c in sorted(crossings, key=lambda c: sum(sizes[t] for t in crossings[c])):
            more = {t: sizes[t] for t in crossings[c] if t not in kept}
            if sum(kept.values()) + sum(more.values()) <= budget:
                kept.update(more)
            else:
                del crossings[c]
        self.cuts = sorted(crossings)
        self._fetch = list(dict.fromkeys([*self.outputs, *kept]))
        # The sessions take turns: idle threads of one spinning would slow the next one down, and
        # each would hold a block of its intermediates between runs.
        if whole is None or kept:
            extended = copy.deepcopy(model)
            present = {o.name for o in extended.graph.output}
            extended.graph.output.extend(helper.make_tensor_value_info(t, types[t], None) for t in kept
                                         if t not in present)
            whole = make_session(extended, spinning=False, memory_pattern=False, threads=threads)
        self._whole = whole
        self._made_after = {c: [o for o in self.outputs if made_at.get(o, -1) >= c] for c in self.cuts}
        # A cut after every output changes none of them (a tensor read only after a pick a model's scored outputs
        # come before): a rerun from there hands back the earlier run's values, with no session.
        self._parts = {c: make_session(part_model(model, nodes[c:], self._made_after[c], {}, types, f"suffix{c}"),
                                       spinning=False, memory_pattern=False, threads=threads)
                       for c in self.cuts if self._made_after[c]}
        self._inputs = {c: [i.name for i in part.get_inputs()] for c, part in self._parts.items()}

    def run(self, feed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The whole model: ``outputs`` and every cut's crossing values, by name."""
        return dict(zip(self._fetch, self._whole.run(self._fetch, dict(feed)), strict=True))

    def rerun(self, start: int, feed: Mapping[str, np.ndarray], earlier: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """``outputs`` for ``feed``, which changes only what nodes at index ``start`` or later read
        against the ``run`` that gave ``earlier``."""
        cut = max((c for c in self.cuts if c <= start), default=None)
        if cut is None:
            values = self.run(feed)
            return [values[o] for o in self.outputs]
        if cut not in self._parts:
            return [earlier[o] for o in self.outputs]
        given = {**earlier, **feed}
        got = dict(zip(self._made_after[cut], self._parts[cut].run(self._made_after[cut],
                                                                   {i: given[i] for i in self._inputs[cut]}),
                       strict=True))
        return [got[o] if o in got else earlier[o] for o in self.outputs]

    def session_of(self, start: int) -> ort.InferenceSession | CustomOpSession:
        """The session a ``rerun`` from ``start`` runs on."""
        cut = max((c for c in self.cuts if c <= start), default=None)
        return self._parts.get(cut, self._whole)


def _within_weights(model: ModelProto, nodes: list, cuts: Sequence[int], budget: int) -> list[int]:
    """The cuts whose sessions hold at most ``budget`` bytes of weights in all, with the whole model's
    (a session of its own once any cut is kept); the latest cuts first."""
    weight = {t.name: elements(t.dims) * itemsize(t.data_type) for t in model.graph.initializer}
    read_after: dict[int, int] = {}
    seen: set[str] = set()
    total = 0
    for i in range(len(nodes) - 1, 0, -1):  # the weights of the suffix from each node on, built backwards
        for r in references(nodes[i]):
            if r in weight and r not in seen:
                seen.add(r)
                total += weight[r]
        read_after[i] = total
    spent = sum(weight.values())
    kept = []
    for c in sorted({c for c in cuts if 0 < c < len(nodes)}, reverse=True):
        if spent + read_after[c] > budget:
            break
        spent += read_after[c]
        kept.append(c)
    return sorted(kept)


def _types_and_sizes(model: ModelProto) -> tuple[dict[str, int], dict[str, int]]:
    """Element type and bytes of every tensor shape inference gives a static shape."""
    types: dict[str, int] = {}
    sizes: dict[str, int] = {}
    graph = infer_shapes(shape_probe(model)).graph  # a copy without the weights' values
    for vi in [*graph.input, *graph.value_info, *graph.output]:
        tensor = vi.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim]
        if tensor.elem_type and tensor.HasField("shape") and None not in dims:
            types[vi.name] = tensor.elem_type
            sizes[vi.name] = elements(dims) * itemsize(tensor.elem_type)
    return types, sizes
