"""A session over a model with custom CPU ops: onnxruntime for the graph, numpy for the custom nodes.

onnxruntime cannot execute Python ops by itself, so the graph is cut at the custom
nodes. Every standard node gets a *level*: the number of custom nodes on the
longest path leading to it. The standard nodes of one level form one onnxruntime
session; the custom nodes of level L+1 run (their registered ``compute``) between
the sessions of levels L and L+1. That is the fewest sessions any cut can give,
and each session still sees whole regions of the graph to optimise.

``CustomOpSession`` offers what hbtools uses of ``onnxruntime.InferenceSession``:
``run(output_names, feeds)``, ``get_inputs()`` and ``get_outputs()``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnxruntime as ort
from onnx import (
    AttributeProto,
    ModelProto,
    NodeProto,
    TensorProto,
    ValueInfoProto,
    helper,
    numpy_helper,
)

from hbtools.errors import HbError
from hbtools.ops import custom

# onnxruntime's names of tensor element types ('tensor(float)' ...), and back.
_ORT_NAMES = {
    TensorProto.FLOAT: "float", TensorProto.UINT8: "uint8", TensorProto.INT8: "int8",
    TensorProto.UINT16: "uint16", TensorProto.INT16: "int16", TensorProto.INT32: "int32",
    TensorProto.INT64: "int64", TensorProto.STRING: "string", TensorProto.BOOL: "bool",
    TensorProto.FLOAT16: "float16", TensorProto.DOUBLE: "double", TensorProto.UINT32: "uint32",
    TensorProto.UINT64: "uint64",
}
_ELEM_OF_ORT = {f"tensor({v})": k for k, v in _ORT_NAMES.items()}


@dataclass(frozen=True)
class TensorArg:
    """Like onnxruntime's NodeArg: a graph input or output."""

    name: str
    type: str  # onnxruntime's spelling, e.g. 'tensor(float)'
    shape: list = field(default_factory=list)


@dataclass
class _Step:
    inputs: list[str]
    outputs: list[str]
    session: ort.InferenceSession | None = None  # a run of standard nodes
    node: NodeProto | None = None  # or one custom node


def _arg(vi: ValueInfoProto) -> TensorArg:
    t = vi.type.tensor_type
    dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in t.shape.dim]
    return TensorArg(vi.name, f"tensor({_ORT_NAMES.get(t.elem_type, 'undefined')})", dims)


def _reads(node: NodeProto) -> list[str]:
    """Tensors a node reads, including outer-scope names used inside its subgraphs (If, Loop, Scan)."""
    names = [i for i in node.input if i]
    for a in node.attribute:
        graphs = [a.g] if a.type == AttributeProto.GRAPH else list(a.graphs)
        for g in graphs:
            for n in g.node:
                names.extend(_reads(n))
    return names


def levels(nodes: Sequence[NodeProto], is_custom: Sequence[bool]) -> list[int]:
    """Per node: custom nodes count one more than their deepest producer, standard nodes equal it."""
    producer = {o: k for k, n in enumerate(nodes) for o in n.output if o}
    level = [0] * len(nodes)
    for k, n in enumerate(nodes):  # graph order is topological (ONNX requires it)
        deepest = max((level[producer[t]] for t in _reads(n) if producer.get(t, k) < k), default=0)
        level[k] = deepest + 1 if is_custom[k] else deepest
    return level


class CustomOpSession:
    """Runs ``model`` (standard ops plus registered custom ops) as onnxruntime segments and numpy calls."""

    def __init__(self, model: ModelProto, *, threads: int = 0) -> None:
        from hbtools.runtime.session import ort_session

        graph = model.graph
        inits = {t.name: t for t in graph.initializer}
        self._inputs = [_arg(vi) for vi in graph.input if vi.name not in inits]
        self._outputs = [_arg(vi) for vi in graph.output]
        nodes = list(graph.node)
        flags = [custom.custom_op_of(n) is not None for n in nodes]
        level = levels(nodes, flags)
        order: list[list[int]] = []
        for lv in range(max(level, default=0) + 1):
            if lv:
                order.extend([k] for k, n in enumerate(nodes) if flags[k] and level[k] == lv)
            run = [k for k in range(len(nodes)) if not flags[k] and level[k] == lv]
            if run:
                order.append(run)
        # Tensors each step must hand on: read by a later step or a model output.
        later = {o.name for o in graph.output}
        needed: list[set[str]] = []
        for group in reversed(order):
            needed.append(set(later))
            for k in group:
                later.update(_reads(nodes[k]))
        needed.reverse()
        types = {vi.name: vi.type.tensor_type.elem_type for vi in [*graph.input, *graph.value_info]}
        types.update({t.name: t.data_type for t in graph.initializer})
        opsets = [o for o in model.opset_import if not custom.is_foreign_domain(o.domain)]
        self._constants: dict[str, np.ndarray] = {}
        self._steps: list[_Step] = []
        for group, keep in zip(order, needed, strict=True):
            members = [nodes[k] for k in group]
            produced = {o for n in members for o in n.output if o}
            reads = list(dict.fromkeys(t for n in members for t in _reads(n)))
            outputs = [o for n in members for o in n.output if o and o in keep]
            if flags[group[0]]:
                node = members[0]
                for t in node.input:
                    if t in inits and t not in self._constants:
                        self._constants[t] = numpy_helper.to_array(inits[t])
                self._steps.append(_Step([t for t in node.input if t], list(node.output), node=node))
                types.update({o: TensorProto.FLOAT for o in node.output if o})
                continue
            if not outputs:
                continue  # nothing downstream reads this region
            outer = [t for t in reads if t not in produced and t not in inits and t in types]
            seg = helper.make_graph(
                members, "segment",
                [helper.make_tensor_value_info(t, types[t], None) for t in outer],
                [helper.make_empty_tensor_value_info(t) for t in outputs],
                [inits[t] for t in reads if t in inits],
            )
            seg_model = helper.make_model(seg, opset_imports=opsets)
            seg_model.ir_version = model.ir_version
            session = ort_session(seg_model, threads=threads)
            for arg in session.get_outputs():
                types[arg.name] = _ELEM_OF_ORT.get(arg.type, TensorProto.FLOAT)
            self._steps.append(_Step([i.name for i in session.get_inputs()], outputs, session=session))

    def get_inputs(self) -> list[TensorArg]:
        return list(self._inputs)

    def get_outputs(self) -> list[TensorArg]:
        return list(self._outputs)

    def run(self, output_names: Sequence[str] | None, input_feed: Mapping[str, np.ndarray],
            run_options: object = None) -> list[np.ndarray]:
        del run_options  # accepted for onnxruntime compatibility
        env: dict[str, np.ndarray] = {**self._constants, **input_feed}
        for step in self._steps:
            missing = [t for t in step.inputs if t not in env]
            if missing:
                raise HbError(f"no value for model input '{missing[0]}'; the model's inputs are "
                              f"{[i.name for i in self._inputs]}")
            if step.session is not None:
                values = step.session.run(step.outputs, {t: env[t] for t in step.inputs})
            else:
                values = custom.compute(step.node, [env[t] if t else None for t in step.node.input])
            env.update(zip(step.outputs, values, strict=True))
        names = list(output_names) if output_names else [o.name for o in self._outputs]
        unknown = [n for n in names if n not in env]
        if unknown:
            raise HbError(f"'{unknown[0]}' is not an output of the model; its outputs are "
                          f"{[o.name for o in self._outputs]}")
        return [env[n] for n in names]
