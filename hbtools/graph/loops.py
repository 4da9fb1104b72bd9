"""Loops of a constant trip count written out step by step, so that the convolutions in their bodies reach the BPU."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from onnx import AttributeProto, GraphProto, ModelProto, NodeProto, helper, numpy_helper

from hbtools.graph.graph import GraphView, rewrite_nodes

MAX_STEPS = 16  # steps a Loop is written out over; a longer one stays a Loop on the CPU


def constant_loops_unrolled(model: ModelProto) -> int:
    """A ``Loop`` with a constant trip count of at most ``MAX_STEPS``, a condition that stays true (none, or a
    constant true, passed on unchanged by the body) and no scan outputs, as its body's nodes once per step: each
    step reads the values the step before made, and its iteration number as a constant. TorchScript writes ``for i
    in range(3): f = f + relu(conv(f))`` so; as a Loop it ran in float on the CPU, convolutions and all. A body
    holding graphs of its own stays. Returns how many Loops it wrote out."""
    view = GraphView(model)
    folded = {n.output[0]: numpy_helper.to_array(a.t) for n in model.graph.node if n.op_type == "Constant"
              for a in n.attribute if a.name == "value" and a.type == AttributeProto.TENSOR}

    def constant(name: str) -> np.ndarray | None:  # an initializer, or a Constant node's value (not folded yet)
        value = view.const(name)
        return folded.get(name) if value is None else value

    return rewrite_nodes(model, lambda node: _written_out(node, constant, model)
                         if node.op_type == "Loop" and node.domain in ("", "ai.onnx") else None)


def _written_out(node: NodeProto, constant: Callable[[str], np.ndarray | None],
                 model: ModelProto) -> list[NodeProto] | None:
    body = next((a.g for a in node.attribute if a.name == "body" and a.type == AttributeProto.GRAPH), None)
    trip = constant(node.input[0]) if node.input and node.input[0] else None
    if body is None or trip is None or trip.size != 1 or not 0 < int(trip.reshape(-1)[0]) <= MAX_STEPS:
        return None
    carried = len(node.input) - 2
    if len(body.output) != 1 + carried or len(node.output) != carried or not _stays_true(node, body, constant) \
            or any(a.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS) for n in body.node for a in n.attribute):
        return None
    cond_in = body.input[1].name
    if any(vi.name == cond_in for vi in body.output[1:]):  # a carried value that is the condition itself
        return None
    steps = int(trip.reshape(-1)[0])
    name = node.name or node.output[0]
    values = list(node.input[2:])
    made = {o for n in body.node for o in n.output}
    constants = {t.name: f"{t.name}_{name}_body" for t in body.initializer}
    for t in body.initializer:
        model.graph.initializer.append(numpy_helper.from_array(numpy_helper.to_array(t), constants[t.name]))
    true = f"{name}_condition"
    model.graph.initializer.append(numpy_helper.from_array(np.array(True), true))
    out: list[NodeProto] = []
    for step in range(steps):
        number = f"{name}_step{step}_iteration"
        model.graph.initializer.append(numpy_helper.from_array(np.array(step, np.int64), number))
        names = {**constants, body.input[0].name: number, cond_in: true}
        names.update({vi.name: v for vi, v in zip(body.input[2:], values, strict=True)})
        names.update({t: f"{t}_{name}_step{step}" for t in made})
        for inner in body.node:
            copy = NodeProto()
            copy.CopyFrom(inner)
            copy.name = f"{inner.name or inner.output[0]}_{name}_step{step}"
            copy.input[:] = [names.get(t, t) if t else t for t in inner.input]
            copy.output[:] = [names.get(t, t) for t in inner.output]
            out.append(copy)
        values = [names.get(vi.name, vi.name) for vi in body.output[1:]]
    for final, result in zip(values, node.output, strict=True):
        out.append(helper.make_node("Identity", [final], [result], name=f"{name}_{result}"))
    return out


def _stays_true(node: NodeProto, body: GraphProto, constant: Callable[[str], np.ndarray | None]) -> bool:
    """Whether the Loop's condition is true throughout: none or a constant true given, and the body hands its
    condition input on (directly or through an Identity), or gives a constant true (its own, or the model's)."""
    def true(name: str) -> bool:
        value = constant(name)
        return value is not None and bool(np.all(value))

    given = node.input[1] if len(node.input) > 1 else ""
    if given and not true(given):
        return False
    cond_in, cond_out = body.input[1].name, body.output[0].name
    if cond_out == cond_in or true(cond_out):
        return True
    made = next((n for n in body.node if cond_out in n.output), None)
    if made is not None and made.op_type == "Identity" and (made.input[0] == cond_in or true(made.input[0])):
        return True
    constant = next((t for t in body.initializer if t.name == cond_out), None)
    if constant is None and made is not None and made.op_type == "Constant":
        value = next((a.t for a in made.attribute if a.name == "value"), None)
        return value is not None and bool(np.all(numpy_helper.to_array(value)))
    return constant is not None and bool(np.all(numpy_helper.to_array(constant)))
