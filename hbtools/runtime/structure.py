"""What runs where in a ``.bin`` graph: tensor types, BPU/CPU nodes, BPU subgraphs.

The quantized graph mixes integer Hz ops, standard ops on integers (Reshape,
MaxPool, Resize ... that only move int8 values) and float CPU ops behind
HzDequantize / HzQuantize. A node runs on the BPU when the compile stage's
partition says so, or, for nodes it does not list (helpers the quantizer added),
when it is an integer Hz op or touches an integer tensor. Quantize and Dequantize
are CPU nodes, as in the vendor's structure pictures. Connected BPU nodes form
one subgraph, split where a path goes through the CPU and comes back; the ids are
the ones the compile stage stored, computed once on the partition's units.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx
from onnx import ModelProto, NodeProto, TensorProto, helper

from hbtools.graph.graph import references
from hbtools.ops import custom
from hbtools.ops.base import DOMAIN, attrs_of
from hbtools.ops.registry import has_fact
from hbtools.runtime.binfile import BinFormatError

_INT_TYPES = {TensorProto.INT8, TensorProto.INT16, TensorProto.INT32, TensorProto.UINT8, TensorProto.UINT16}
_OUT_TYPES = {"int8": TensorProto.INT8, "int16": TensorProto.INT16, "int32": TensorProto.INT32}


@dataclass(frozen=True)
class TensorInfo:
    elem_type: int
    shape: tuple[int | None, ...] | None  # None: rank unknown

    @property
    def is_integer(self) -> bool:
        return self.elem_type in _INT_TYPES


def hz_output_type(node: NodeProto) -> int:
    """Element type of a Hz node's outputs, from its attributes alone."""
    if has_fact(node.op_type, "float_output"):
        return TensorProto.FLOAT
    if has_fact(node.op_type, "index_output"):
        return TensorProto.INT64
    out_type = attrs_of(node).get("out_type")
    if not isinstance(out_type, str) or out_type not in _OUT_TYPES:
        raise BinFormatError(f"node '{node.name}' ({node.op_type}) has no valid out_type")
    return _OUT_TYPES[out_type]


def _info_of(vi: onnx.ValueInfoProto) -> TensorInfo | None:
    if not vi.type.HasField("tensor_type") or vi.type.tensor_type.elem_type == TensorProto.UNDEFINED:
        return None
    t = vi.type.tensor_type
    shape = None
    if t.HasField("shape"):
        shape = tuple(d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim)
    return TensorInfo(t.elem_type, shape)


def tensor_info(graph: ModelProto) -> dict[str, TensorInfo]:
    """Type (and shape where known) of every tensor: Hz outputs from attributes, the rest by onnx inference.

    Element-wise Hz ops pass their input's shape on; onnx inference is rerun until
    that stops adding shapes, so float regions behind a Dequantize get shapes too.
    """
    known: dict[str, TensorInfo] = {}
    for _ in range(_MAX_ROUNDS):
        found = _inference_round(graph, known)
        if len(found) == len(known) and all(known[k].shape == v.shape for k, v in found.items()):
            break
        known = found
    for t in graph.graph.initializer:
        known[t.name] = TensorInfo(t.data_type, tuple(t.dims))
    return known


_MAX_ROUNDS = 8


def _inference_round(graph: ModelProto, known: dict[str, TensorInfo]) -> dict[str, TensorInfo]:
    probe = ModelProto()
    probe.CopyFrom(graph)
    declared = {vi.name for vi in [*probe.graph.value_info, *probe.graph.input, *probe.graph.output]}
    for node in probe.graph.node:
        if custom.is_foreign_domain(node.domain):  # custom CPU ops compute in float
            shapes = custom.output_shapes(node, [_shape_of(known.get(i)) for i in node.input if i])
            probe.graph.value_info.extend(
                helper.make_tensor_value_info(o, TensorProto.FLOAT, s)
                for o, s in zip(node.output, shapes or [None] * len(node.output), strict=True)
                if o and o not in declared)
            continue
        if node.domain != DOMAIN:
            continue
        elem = hz_output_type(node)
        source = known.get(node.input[0]) if node.input and has_fact(node.op_type, "shape_preserving") else None
        shape = list(source.shape) if source is not None and source.shape is not None else None
        probe.graph.value_info.extend(
            helper.make_tensor_value_info(o, elem, shape) for o in node.output if o and o not in declared
        )
    try:
        inferred = onnx.shape_inference.infer_shapes(probe, strict_mode=False)
    except Exception as e:  # onnx raises several types on malformed graphs
        raise BinFormatError(f"graph cannot be type-checked: {type(e).__name__}: {e}") from None
    out: dict[str, TensorInfo] = {}
    for vi in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]:
        info = _info_of(vi)
        if info is not None and (vi.name not in out or out[vi.name].shape is None):
            out[vi.name] = info
    return out


def _shape_of(info: TensorInfo | None) -> list[int | None] | None:
    return None if info is None or info.shape is None else list(info.shape)


@dataclass
class Structure:
    """Per node (by position in the graph): where it runs and its BPU subgraph."""

    on: list[str]  # "BPU" | "CPU"
    subgraph_of: dict[int, int]  # node index -> subgraph number, BPU nodes only
    subgraphs: list[list[int]]  # node indices per subgraph, in graph order

    def subgraph_name(self, model_name: str, k: int) -> str:
        return f"{model_name}_subgraph_{k}"


def _partition_names(partition: dict) -> tuple[set[str], set[str]]:
    bpu, cpu = set(), set()
    subgraphs, cpu_nodes = partition.get("subgraphs"), partition.get("cpu_nodes")
    for sub in subgraphs if isinstance(subgraphs, list) else []:
        if isinstance(sub, dict) and isinstance(sub.get("nodes"), list):
            bpu.update(n for n in sub["nodes"] if isinstance(n, str))
    for node in cpu_nodes if isinstance(cpu_nodes, list) else []:
        if isinstance(node, dict) and isinstance(node.get("name"), str):
            cpu.add(node["name"])
    return bpu, cpu


def analyse(graph: ModelProto, partition: dict, info: dict[str, TensorInfo]) -> Structure:
    """Where each node runs and its subgraph; the subgraph numbers are the ones the compile stage
    stored in the partition (the makertbin/checker table's ids), so every tool shows the same."""
    partition = partition if isinstance(partition, dict) else {}
    bpu_names, cpu_names = _partition_names(partition)
    nodes = list(graph.graph.node)
    on = []
    for node in nodes:
        if node.domain == DOMAIN:
            on.append("CPU" if has_fact(node.op_type, "boundary") else "BPU")
        elif node.name in cpu_names:
            on.append("CPU")
        elif node.name in bpu_names:
            on.append("BPU")
        else:
            touched = [info.get(t) for t in [*node.input, *node.output] if t]
            on.append("BPU" if any(i is not None and i.is_integer for i in touched) else "CPU")
    computed = components(_preds(nodes), on)
    stored = _stored_ids(partition)
    subgraphs = _with_stored_ids(computed, [stored.get(n.name) for n in nodes]) if stored else computed
    subgraph_of = {i: k for k, members in enumerate(subgraphs) for i in members}
    return Structure(on, subgraph_of, subgraphs)


def _stored_ids(partition: dict) -> dict[str, int]:
    out: dict[str, int] = {}
    subgraphs = partition.get("subgraphs")
    for sub in subgraphs if isinstance(subgraphs, list) else []:
        if isinstance(sub, dict) and type(sub.get("id")) is int and isinstance(sub.get("nodes"), list):
            out.update((n, sub["id"]) for n in sub["nodes"] if isinstance(n, str))
    return out


def _with_stored_ids(computed: list[list[int]], stored: list[int | None]) -> list[list[int]]:
    """Group the computed components by the id the partition stored for their nodes.

    A component's nodes the partition does not list (Requantize helpers the quantizer
    added) go with their component; a component that lists none stays on its own.
    Groups are numbered by stored id, so a .bin whose nodes were deleted keeps its order.
    """
    keyed: dict[tuple[int, int], list[int]] = {}
    for k, members in enumerate(computed):
        ids = sorted({stored[i] for i in members if stored[i] is not None})
        if not ids:
            keyed[(1, k)] = list(members)
            continue
        for i in members:  # a stored id per node wins over the computed component
            sid = stored[i] if stored[i] is not None else ids[0]
            keyed.setdefault((0, sid), []).append(i)
    return [sorted(keyed[key]) for key in sorted(keyed)]


def _preds(nodes: list[NodeProto]) -> list[list[int]]:
    producer = {o: i for i, n in enumerate(nodes) for o in n.output if o}
    return [[producer[t] for t in references(n) if t in producer and producer[t] != i] for i, n in enumerate(nodes)]


def components(preds: list[list[int]], on: list[str], join_readers: bool = True) -> list[list[int]]:
    """BPU subgraphs of a graph given as predecessor lists: linked BPU nodes, split wherever a path
    leaves through the CPU and comes back; numbered by first member (graph order is topological).

    A node's stage counts the CPU-to-BPU crossings on the longest path reaching it (a BPU node only BPU
    nodes read: the earliest of their stages); BPU nodes join a subgraph only with linked BPU nodes of the
    same stage, so each
    subgraph can start once its inputs exist (the subgraph graph has no cycles). BPU nodes
    reading the same CPU node's result are linked too (at the same stage, so the same holds),
    unless ``join_readers`` is False.
    The checker, makertbin (on units) and the .bin tools (on nodes) all use this.
    """
    stage = [0] * len(preds)
    order = _topological(preds)
    for i in order:
        crossings = [stage[j] + (on[j] == "CPU" and on[i] == "BPU") for j in preds[i]]
        stage[i] = max(crossings, default=0)
    # A BPU node whose results only BPU nodes read runs at the latest stage that still serves them all: a side
    # input's few ops (a scale factor's reciprocal) then join the subgraph that reads them after a CPU node,
    # where they made a BPU call of their own.
    users: list[list[int]] = [[] for _ in preds]
    for i, p in enumerate(preds):
        for j in set(p):
            users[j].append(i)
    for i in reversed(order):
        if on[i] == "BPU" and users[i] and all(on[u] == "BPU" for u in users[i]):
            stage[i] = max(stage[i], min(stage[u] for u in users[i]))
    parent = list(range(len(preds)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i in range(len(preds)):
        for j in preds[i]:
            if on[i] == on[j] == "BPU" and stage[i] == stage[j]:
                parent[root(i)] = root(j)
    # BPU nodes reading the same CPU result (a featuremap input's quantization, a CPU op feeding two
    # branches) start together: one call takes that input once.
    readers: dict[int, int] = {}
    for i in range(len(preds) if join_readers else 0):
        for j in set(preds[i]):
            if on[j] == "CPU" and on[i] == "BPU":
                first = readers.setdefault(j * len(preds) + stage[i], i)
                parent[root(i)] = root(first)
    groups: dict[int, list[int]] = {}
    for i in range(len(preds)):
        if on[i] == "BPU":
            groups.setdefault(root(i), []).append(i)
    return sorted(groups.values(), key=lambda members: members[0])


def _topological(preds: list[list[int]]) -> list[int]:
    """Node indices, predecessors first; nodes on a cycle (a corrupted graph) come last, unordered."""
    pending = [len(set(p)) for p in preds]
    users: list[list[int]] = [[] for _ in preds]
    for i, p in enumerate(preds):
        for j in set(p):
            users[j].append(i)
    order = [i for i, c in enumerate(pending) if c == 0]
    for i in order:  # the list grows while it is walked
        for u in users[i]:
            pending[u] -= 1
            if pending[u] == 0:
                order.append(u)
    seen = set(order)
    return order + [i for i in range(len(preds)) if i not in seen]
