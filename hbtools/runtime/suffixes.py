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
import onnx
from onnx import ModelProto, helper

from hbtools.graph.graph import infer_shapes, part_model, references
from hbtools.runtime.session import make_session


class Suffixes:
    """``model`` (nodes in topological order) cut before the nodes at ``cuts``.

    ``run`` gives ``outputs`` and the values every cut needs; ``rerun(start, ...)`` gives the
    same outputs for inputs that differ from that run only in what nodes at ``start`` or
    later read, running the suffix of the last cut at or before ``start``.
    """

    def __init__(self, model: ModelProto, outputs: Sequence[str], cuts: Sequence[int]) -> None:
        nodes = list(model.graph.node)
        self.outputs = list(outputs)
        made_at = {o: i for i, n in enumerate(nodes) for o in n.output if o}
        types = _element_types(model) if cuts else {}
        self.cuts: list[int] = []
        self.boundary: dict[int, list[str]] = {}
        for c in sorted({c for c in cuts if 0 < c < len(nodes)}):
            reads = dict.fromkeys(r for n in nodes[c:] for r in references(n))
            crossing = [t for t in reads if made_at.get(t, len(nodes)) < c]
            if all(t in types for t in crossing):  # a value of unknown type cannot be fetched
                self.cuts.append(c)
                self.boundary[c] = crossing
        whole = copy.deepcopy(model)
        present = {o.name for o in whole.graph.output}
        for t in dict.fromkeys(t for c in self.cuts for t in self.boundary[c]):
            if t not in present:
                whole.graph.output.append(helper.make_tensor_value_info(t, types[t], None))
        self._fetch = list(dict.fromkeys([*self.outputs, *(t for c in self.cuts for t in self.boundary[c])]))
        # The sessions take turns: idle threads of one spinning would slow the next one down.
        self._whole = make_session(whole, spinning=False)
        self._made_after = {c: [o for o in self.outputs if made_at.get(o, -1) >= c] for c in self.cuts}
        self._parts = {c: make_session(part_model(model, nodes[c:], self._made_after[c], {}, types, f"suffix{c}"),
                                       spinning=False) for c in self.cuts}
        self._inputs = {c: [i.name for i in self._parts[c].get_inputs()] for c in self.cuts}

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
        given = {**earlier, **feed}
        got = dict(zip(self._made_after[cut], self._parts[cut].run(self._made_after[cut],
                                                                   {i: given[i] for i in self._inputs[cut]}),
                       strict=True))
        return [got[o] if o in got else earlier[o] for o in self.outputs]


def _element_types(model: ModelProto) -> dict[str, int]:
    """Element type of every tensor onnx shape inference types (graph inputs and constants too),
    shaped or not."""
    types = {t.name: t.data_type for t in model.graph.initializer}
    for inferred in (onnx.shape_inference.infer_shapes(model, strict_mode=False), infer_shapes(copy.deepcopy(model))):
        graph = inferred.graph
        for vi in [*graph.input, *graph.value_info, *graph.output]:
            if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type:
                types.setdefault(vi.name, vi.type.tensor_type.elem_type)
    return types
