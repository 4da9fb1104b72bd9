"""Cut a switchable model into stages that a run can skip or run float-only.

Most analyses quantize a few nodes at a time, so everything upstream of the first
quantized node equals the float model and everything downstream of the last stage
holding an enabled switch is float arithmetic on changed inputs. Each stage is an
``If`` on ``__stage<k>_run``; a skipped stage hands on the float values of the
tensors it exports (fed back from one float pass per sample). A running stage with
switches is a second ``If`` on ``__stage<k>_quant``: without enabled switches it runs
its plain float nodes, which onnxruntime fuses as in the float model.

Where the cuts go is decided in ``cuts``.
"""

from __future__ import annotations

import copy
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import ModelProto, NodeProto, TensorProto, helper

from hbtools.debug.cuts import references, stage_starts
from hbtools.debug.precompile import optimized_body
from hbtools.debug.switches import Switched, branch, float_version
from hbtools.graph.graph import infer_shapes

MAX_STAGES = 16
MIN_NODES_PER_STAGE = 4


@dataclass
class Stages:
    exports: list[list[str]]  # per stage, the tensors it hands on (and the observed ones it makes)
    stage_of: dict[str, int]  # main-graph node name -> stage
    types: dict[str, int]
    last_reader: dict[str, int] = field(default_factory=dict)  # exported tensor -> last stage reading it

    @property
    def count(self) -> int:
        return len(self.exports)

    def producer(self, tensor: str) -> int:
        return next((k for k, ex in enumerate(self.exports) if tensor in ex), 0)


def tensor_info(switched: Switched, original: ModelProto) -> tuple[dict[str, list[int | None]], dict[str, int]]:
    """Shapes and element types of the main-graph tensors."""
    shapes: dict[str, list[int | None]] = {}
    types: dict[str, int] = {}
    for model in (infer_shapes(copy.deepcopy(original)), onnx.shape_inference.infer_shapes(switched.model)):
        g = model.graph
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


def plan(switched: Switched, shapes: dict[str, list[int | None]], types: dict[str, int],
         observe: Sequence[str], max_stages: int = MAX_STAGES) -> Stages | None:
    nodes = list(switched.model.graph.node)
    count = min(max_stages, len(nodes) // MIN_NODES_PER_STAGE)
    if count < 2 or not switched.holders:
        return None
    starts = stage_starts(switched, shapes, types, count)
    if len(starts) < 2:
        return None
    stage_of = {n.name: int(np.searchsorted(starts, i, side="right")) - 1 for i, n in enumerate(nodes)}
    produced = {o: stage_of[n.name] for n in nodes for o in n.output if o}
    last_reader: dict[str, int] = {}
    for n in nodes:
        for ref in references(n):
            if ref in produced and produced[ref] != stage_of[n.name]:
                last_reader[ref] = max(last_reader.get(ref, -1), stage_of[n.name])
    handed = set(last_reader) | set(observe) | {o.name for o in switched.model.graph.output}
    exports: list[list[str]] = [[] for _ in starts]
    for t, k in produced.items():
        if t in handed:
            exports[k].append(t)
    if any(t not in types for ex in exports for t in ex):
        return None  # a hand-over of unknown type cannot be declared: run unstaged
    return Stages(exports, stage_of, types, last_reader)


def wrap(switched: Switched, stages: Stages, shapes: dict[str, list[int | None]]) -> ModelProto:
    model = copy.deepcopy(switched.model)
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    by_stage: list[list[NodeProto]] = [[] for _ in stages.exports]
    for n in graph.node:
        by_stage[stages.stage_of[n.name]].append(n)
    with tempfile.TemporaryDirectory() as scratch:
        build = _BodyBuilder(model, inits, shapes, stages.types, Path(scratch))
        wrapped = [_stage_node(k, nodes, exports, switched, stages, build, graph)
                   for k, (nodes, exports) in enumerate(zip(by_stage, stages.exports, strict=True))]
    del graph.node[:]
    graph.node.extend(wrapped)
    del graph.initializer[:]  # each body carries the constants it reads
    declared = {op.domain for op in model.opset_import}
    for op in build.opsets:  # the optimized bodies use onnxruntime's own op domains
        if op.domain not in declared:
            model.opset_import.append(op)
            declared.add(op.domain)
    return model


def _stage_node(k: int, nodes: list[NodeProto], exports: list[str], switched: Switched, stages: Stages,
                build: _BodyBuilder, graph: onnx.GraphProto) -> NodeProto:
    """``If(run) {If(quant) {switchable body} else {float body}} else {hand on the fed float values}``."""
    plain = [m for n in nodes for m in (float_version(n) if switched.is_switch(n) else [copy.deepcopy(n)])]
    compute = build(plain, exports, f"f{k}")
    if any(switched.is_switch(n) for n in nodes):
        graph.input.append(helper.make_tensor_value_info(f"__stage{k}_quant", TensorProto.BOOL, []))
        inner = [f"{t}__s{k}" for t in exports]
        choose = helper.make_node("If", [f"__stage{k}_quant"], inner, name=f"__stage{k}_choose",
                                  then_branch=build([copy.deepcopy(n) for n in nodes], exports, f"q{k}"),
                                  else_branch=compute)
        compute = branch([choose], inner, f"__stage{k}_run_branch",
                         {i: stages.types[t] for i, t in zip(inner, exports, strict=True)})
    skipped = {f"{t}__skipped": stages.types[t] for t in exports}
    skip = branch([helper.make_node("Identity", [f"{t}__cache"], [f"{t}__skipped"]) for t in exports],
                  list(skipped), f"__stage{k}_skip", skipped)
    graph.input.append(helper.make_tensor_value_info(f"__stage{k}_run", TensorProto.BOOL, []))
    graph.input.extend(helper.make_tensor_value_info(f"{t}__cache", stages.types[t], None) for t in exports)
    return helper.make_node("If", [f"__stage{k}_run"], exports, name=f"__stage{k}", then_branch=compute,
                            else_branch=skip)


class _BodyBuilder:
    """Stage bodies as optimized ``If`` branches; exported names made private inside."""

    def __init__(self, model: ModelProto, inits: dict[str, TensorProto], shapes: dict[str, list[int | None]],
                 types: dict[str, int], scratch: Path) -> None:
        self.model = model
        self.scratch = scratch
        self.inits = inits
        self.shapes = shapes
        self.types = types
        self.opsets: list[onnx.OperatorSetIdProto] = []

    def __call__(self, nodes: list[NodeProto], exports: list[str], tag: str) -> onnx.GraphProto:
        # The stage's If defines the exported names in the main graph; inside they get private names.
        private = {t: f"{t}__{tag}" for t in exports}
        for n in nodes:
            _rename(n, private)
        made = {o for n in nodes for o in n.output}
        reads = list(dict.fromkeys(r for n in nodes for r in references(n) if r not in made))
        imports = [self._info(r, r) for r in reads if r not in self.inits]
        outputs = [self._info(t, private[t]) for t in exports]
        body, opsets = optimized_body(nodes, imports, outputs, [self.inits[r] for r in reads if r in self.inits],
                                      self.model.opset_import, self.model.ir_version, f"__stage_{tag}", self.scratch)
        self.opsets.extend(opsets)
        return body

    def _info(self, tensor: str, name: str) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, self.types.get(tensor, TensorProto.FLOAT), self.shapes.get(tensor))


def _rename(node: NodeProto, mapping: dict[str, str]) -> None:
    node.input[:] = [mapping.get(i, i) for i in node.input]
    node.output[:] = [mapping.get(o, o) for o in node.output]
    for attr in node.attribute:
        for sub in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs):
            for inner in sub.node:
                _rename(inner, mapping)
