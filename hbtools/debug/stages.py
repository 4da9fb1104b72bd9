"""Cut a switchable model into stages, each a model of its own, plus float tails.

Most analyses quantize a few nodes at a time, so everything upstream of the first
quantized node equals the float model and everything downstream of the last stage
holding an enabled switch is float arithmetic on changed inputs. A run therefore
computes, in their switchable form, only the stages from its first to its last
enabled switch, fed the float values earlier stages hand on (kept from one float
pass per sample), and then everything downstream in one fused float tail
(``tails``). Where the cuts go is decided in ``cuts``.

Each stage and tail is a separate model (the switchboard gives each its own session)
rather than a branch of an ``If`` in one model: onnxruntime optimizes (NCHWc
layout, fused activations) only a main graph, so branches had to be pre-optimized
one by one, and with the tails as branches the one session took about 4x longer to
build on PP-OCR rec, and every run paid ~0.5 ms (3% of a float inference) for
passing over the stages and tails it skipped.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import ModelProto

from hbtools.debug import tails as tailing
from hbtools.debug.cuts import stage_starts
from hbtools.debug.model import CalibratedModel
from hbtools.debug.switches import Switched, float_version
from hbtools.graph.graph import part_model, references

MAX_STAGES = 24  # measured on PP-OCR rec: 16 ran ~5% slower, 32 and 48 no faster and built longer
MIN_NODES_PER_STAGE = 4


@dataclass
class Stages:
    exports: list[list[str]]  # per stage, the tensors it hands on (and the observed ones it makes)
    stage_of: dict[str, int]  # main-graph node name -> stage
    observe: list[str]
    tails: list[int] = field(default_factory=list)  # the stages j with a float tail T_j (see ``tails``)

    @property
    def count(self) -> int:
        return len(self.exports)

    @property
    def last(self) -> int:
        """The last stage making an observed tensor: no run goes further."""
        return max(self.producer(t) for t in self.observe)

    def producer(self, tensor: str) -> int:
        return next((k for k, ex in enumerate(self.exports) if tensor in ex), 0)

    def made_from(self, j: int) -> list[str]:
        """The observed tensors produced in stage ``j`` or later (what tail ``j`` yields)."""
        return [t for t in self.observe if self.producer(t) >= j]


def tensor_info(switched: Switched, cm: CalibratedModel) -> tuple[dict[str, list[int | None]], dict[str, int]]:
    """Shapes and element types of the main-graph tensors: the calibrated model's, then the switchable one's."""
    shapes = dict(cm.shapes)
    types = dict(cm.tensor_types)
    g = onnx.shape_inference.infer_shapes(switched.model).graph
    for t in g.initializer:
        shapes.setdefault(t.name, list(t.dims))
        types.setdefault(t.name, t.data_type)
    for vi in [*g.input, *g.value_info, *g.output]:
        tt = vi.type.tensor_type
        if tt.elem_type:
            types.setdefault(vi.name, tt.elem_type)
        if tt.HasField("shape") and vi.name not in shapes:
            shapes[vi.name] = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
    return shapes, types


def single(switched: Switched, observe: Sequence[str]) -> Stages:
    """The whole model as one stage (no cuts, no tails)."""
    return Stages([list(observe)], {n.name: 0 for n in switched.model.graph.node}, list(observe))


def plan(switched: Switched, shapes: dict[str, list[int | None]], types: dict[str, int],
         observe: Sequence[str], max_stages: int = MAX_STAGES,
         configs: Sequence[Collection[str]] | None = None) -> Stages | None:
    """Where to cut, what each stage hands on, which tails to build (None: do not cut).

    ``configs`` are typical sets of enabled calibration nodes (each node alone by default).
    """
    nodes = list(switched.model.graph.node)
    count = min(max_stages, len(nodes) // MIN_NODES_PER_STAGE)
    if count < 2 or not switched.holders:
        return None
    index = {n.name: i for i, n in enumerate(nodes)}
    spans = []
    for config in configs or [[c] for c in switched.holders]:
        held = [index[h] for c in config for h in switched.holders.get(c, [])]
        if held:
            spans.append((min(held), max(held)))
    stages = _cut(switched, shapes, types, observe, count, spans, with_tails=True)
    if stages is not None and not stages.tails:  # too large for tails: cut for running all later stages
        stages = _cut(switched, shapes, types, observe, count, spans, with_tails=False)
    return stages


def _cut(switched: Switched, shapes: dict[str, list[int | None]], types: dict[str, int], observe: Sequence[str],
         count: int, spans: list[tuple[int, int]], with_tails: bool) -> Stages | None:
    nodes = list(switched.model.graph.node)
    starts = stage_starts(switched, shapes, types, count, spans, with_tails)
    if len(starts) < 2:
        return None
    stage_of = {n.name: int(np.searchsorted(starts, i, side="right")) - 1 for i, n in enumerate(nodes)}
    produced = {o: stage_of[n.name] for n in nodes for o in n.output if o}
    handed = set(observe) | {o.name for o in switched.model.graph.output}
    for n in nodes:
        handed.update(r for r in references(n) if r in produced and produced[r] != stage_of[n.name])
    exports: list[list[str]] = [[] for _ in starts]
    for t, k in produced.items():
        if t in handed:
            exports[k].append(t)
    if any(t not in types for ex in exports for t in ex):
        return None  # a hand-over of unknown type cannot be declared: do not cut
    stages = Stages(exports, stage_of, list(observe))
    if with_tails:
        inits = {t.name: t for t in switched.model.graph.initializer}
        ending = {stage_of[h] for holders in switched.holders.values() for h in holders}  # where a run can end
        sizes = tailing.suffix_bytes(nodes, switched, stage_of, inits)
        stages.tails = tailing.choose({j: sizes[j] for j in range(1, stages.last + 1) if j - 1 in ending})
    return stages


def stage_model(switched: Switched, stages: Stages, k: int, shapes: dict[str, list[int | None]],
                types: dict[str, int], *, floating: bool = False) -> ModelProto:
    """Stage ``k`` as a model: the values it reads as inputs (enable flags too), its exports as outputs.

    ``floating``: the float versions of its switches instead (no enable inputs).
    """
    nodes = [n for n in switched.model.graph.node if stages.stage_of[n.name] == k]
    if floating:
        nodes = [m for n in nodes for m in (float_version(n) if switched.is_switch(n) else [n])]
    return part_model(switched.model, nodes, stages.exports[k], shapes, types, f"stage{k}")


def tail_model(switched: Switched, stages: Stages, j: int, shapes: dict[str, list[int | None]],
               types: dict[str, int], outputs: Sequence[str] | None = None) -> ModelProto:
    """Tail ``j`` (``tails``) as a model; ``outputs`` instead of the observed tensors it makes."""
    made = stages.made_from(j) if outputs is None else list(outputs)
    nodes = tailing.tail_nodes(list(switched.model.graph.node), switched, stages.stage_of, j, made)
    return part_model(switched.model, nodes, made, shapes, types, f"tail{j}")
