"""A small read-mostly view of an ONNX graph: producers, consumers, constants, shapes."""

from __future__ import annotations

import hashlib
import heapq
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from functools import cached_property

import numpy as np
import onnx
from google.protobuf.message import Message
from onnx import ModelProto, NodeProto, TensorProto, helper, numpy_helper, version_converter

from hbtools.graph.contrib_shapes import contrib_value_infos
from hbtools.ops import custom
from hbtools.ops.base import DOMAIN, attrs_of, reduced_axes
from hbtools.ops.registry import has_fact

# Shape inference results of the last few models indexed, by the bytes of their probe (``shape_probe``: every
# node, attribute, small constant and declared shape; large constants as their type and dims only).
_RECENT_INFERENCES: dict[bytes, ModelProto] = {}
_RECENT_KEPT = 2
_RECENT_LOCK = threading.Lock()


class GraphView:
    """Index of a model's graph. Rebuild it after editing the graph."""

    def __init__(self, model: ModelProto) -> None:
        self.model = model
        self.graph = model.graph

    @cached_property
    def producer(self) -> dict[str, NodeProto]:
        return {o: n for n in self.graph.node for o in n.output if o}

    @cached_property
    def consumers(self) -> dict[str, list[NodeProto]]:
        out: dict[str, list[NodeProto]] = {}
        for n in self.graph.node:
            for i in n.input:
                if i:
                    out.setdefault(i, []).append(n)
            for i in outer_references(n):  # a Loop / If / Scan body reads these from this graph
                out.setdefault(i, []).append(n)
        return out

    def is_read(self, tensor: str) -> bool:
        """Whether a node or the graph's outputs read ``tensor`` (an omitted optional output, "", is not)."""
        return bool(tensor) and (tensor in self.consumers or tensor in self.graph_outputs)

    @cached_property
    def initializers(self) -> Mapping[str, np.ndarray]:
        return _Constants(self.graph.initializer)

    @cached_property
    def initializer_protos(self) -> dict[str, TensorProto]:
        return {t.name: t for t in self.graph.initializer}

    @cached_property
    def graph_inputs(self) -> list[str]:
        inits = {t.name for t in self.graph.initializer}
        return [i.name for i in self.graph.input if i.name not in inits]

    @cached_property
    def graph_outputs(self) -> list[str]:
        return [o.name for o in self.graph.output]

    @cached_property
    def position(self) -> dict[int, int]:
        """Each node's place in the graph, by ``id`` (the nodes are held here, so their ids stay theirs)."""
        self._nodes = list(self.graph.node)
        return {id(n): k for k, n in enumerate(self._nodes)}

    @cached_property
    def node_by_name(self) -> dict[str, NodeProto]:
        return {n.name: n for n in self.graph.node}

    @cached_property
    def _inferred(self) -> ModelProto:
        # Without the weights: shapes and types are all it is read for.
        probe = shape_probe(self.model)
        # The optimize stage's passes each index the model afresh, most of them after a pass that changed
        # nothing: the same probe is inferred once (sequencer2d_s, 20,483 nodes: 29 inferences of ~4 s each).
        key = hashlib.blake2b(probe.SerializeToString(deterministic=True), digest_size=20).digest()
        with _RECENT_LOCK:
            inferred = _RECENT_INFERENCES.pop(key, None)
        if inferred is None:
            inferred = infer_shapes(probe, keep_declared=True)
        with _RECENT_LOCK:
            _RECENT_INFERENCES[key] = inferred  # the most recent last
            while len(_RECENT_INFERENCES) > _RECENT_KEPT:
                del _RECENT_INFERENCES[next(iter(_RECENT_INFERENCES))]
        return inferred

    @cached_property
    def elem_types(self) -> dict[str, int]:
        """Element types (TensorProto codes) of the tensors inference or the model declare."""
        inferred = self._inferred
        out = {vi.name: vi.type.tensor_type.elem_type
               for vi in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]
               if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type}
        out.update((t.name, t.data_type) for t in self.graph.initializer)
        return out

    @cached_property
    def shapes(self) -> dict[str, list[int | None]]:
        """Static shapes from onnx shape inference (None for unknown dims), through Hz and custom ops."""
        inferred = self._inferred
        out: dict[str, list[int | None]] = {}
        for vi in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]:
            if vi.type.HasField("tensor_type") and vi.type.tensor_type.HasField("shape"):
                out[vi.name] = [
                    d.dim_value if d.HasField("dim_value") else None for d in vi.type.tensor_type.shape.dim
                ]
        for t in self.graph.initializer:
            out[t.name] = list(t.dims)
        return out

    def const(self, name: str) -> np.ndarray | None:
        """The value of a tensor if it is an initializer (constants are folded by then)."""
        return self.initializers.get(name)

    def is_const(self, name: str) -> bool:
        return name in self.initializers

    def attrs(self, node: NodeProto) -> dict:
        return attrs_of(node)

    def reduced_axes(self, node: NodeProto) -> list[int] | None:
        """The axes (non-negative, sorted) a Reduce* node reduces: its attribute, or (opset 18) its
        constant input, or all axes when none are given; None where they are computed at run time
        or the input's rank is unknown."""
        shape = self.shapes.get(node.input[0])
        given = len(node.input) > 1 and bool(node.input[1])
        if shape is None or (given and not self.is_const(node.input[1])):
            return None
        return reduced_axes(self.attrs(node), self.const(node.input[1]) if given else None, len(shape))


class _Constants(Mapping[str, np.ndarray]):
    """The initializers as numpy arrays, each converted when first read: a view that only asks which
    tensors are constant, or reads a few, holds no numpy copy of every weight."""

    def __init__(self, tensors: Iterable[TensorProto]) -> None:
        self._tensors = {t.name: t for t in tensors}
        self._arrays: dict[str, np.ndarray] = {}

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self._arrays:
            self._arrays[name] = numpy_helper.to_array(self._tensors[name])
        return self._arrays[name]

    def __contains__(self, name: object) -> bool:
        return name in self._tensors

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)


def name_unnamed_nodes(model: ModelProto) -> None:
    """Give every node a unique name (tables, node_info and the debugger key on names)."""
    taken = {n.name for n in model.graph.node if n.name}
    counters: dict[str, int] = {}
    for node in model.graph.node:
        if node.name:
            continue
        i = counters.get(node.op_type, 0)
        while f"{node.op_type}_{i}" in taken:
            i += 1
        node.name = f"{node.op_type}_{i}"
        taken.add(node.name)
        counters[node.op_type] = i + 1


def remove_dead_nodes(model: ModelProto) -> None:
    """Drop nodes and initializers that do not contribute to a graph output."""
    g = model.graph
    needed = {o.name for o in g.output}
    keep: list[NodeProto] = []
    for node in reversed(list(g.node)):
        if any(o in needed for o in node.output):
            keep.append(node)
            needed.update(references(node))  # sub-graphs (If, Loop) read outer tensors too
    keep.reverse()
    if len(keep) < len(g.node):
        del g.node[:]
        g.node.extend(keep)
    inits = [t for t in g.initializer if t.name in needed]
    if len(inits) < len(g.initializer):  # rebuilt, the list holds every weight twice (see ``compact``)
        del g.initializer[:]
        g.initializer.extend(inits)


def rewrite_nodes(model: ModelProto, rewrite: Callable[[NodeProto], list[NodeProto] | None]) -> int:
    """Put the nodes ``rewrite`` returns in place of each node it rewrites (None: the node stays);
    returns how many it rewrote."""
    nodes: list[NodeProto] = []
    count = 0
    for node in model.graph.node:
        new = rewrite(node)
        if new is None:
            nodes.append(node)
            continue
        nodes.extend(new)
        count += 1
    if count:
        del model.graph.node[:]
        model.graph.node.extend(nodes)
    return count


def topological_sort(model: ModelProto) -> None:
    """Order the nodes so that each comes after what it reads; among the nodes ready at any point the
    earliest in the present order goes first (a sorted graph keeps its order). Linear in the nodes."""
    g = model.graph
    available = {i.name for i in g.input} | {t.name for t in g.initializer} | {""}
    nodes = list(g.node)
    written: set[str] = set()
    for n in nodes:  # a name written twice would order its readers after either writer (and loop walks upstream)
        twice = written.intersection(o for o in n.output if o)
        if twice:
            raise ValueError(f"graph is not in SSA form: '{twice.pop()}' is written by two nodes, {n.name} one")
        written.update(o for o in n.output if o)
    missing = [0] * len(nodes)
    waiting: dict[str, list[int]] = {}
    for k, n in enumerate(nodes):
        for r in set(references(n)) - available:
            missing[k] += 1
            waiting.setdefault(r, []).append(k)
    ready = [k for k, m in enumerate(missing) if m == 0]
    heapq.heapify(ready)
    ordered: list[NodeProto] = []
    while ready:
        k = heapq.heappop(ready)
        ordered.append(nodes[k])
        for o in nodes[k].output:
            for j in waiting.pop(o, []):
                missing[j] -= 1
                if missing[j] == 0:
                    heapq.heappush(ready, j)
    if len(ordered) < len(nodes):
        rest = [n for k, n in enumerate(nodes) if missing[k]]
        raise ValueError("graph has a cycle or a dangling input: " + ", ".join(n.name for n in rest[:5]))
    del g.node[:]
    g.node.extend(ordered)


def _float_shape_preserving(op_type: str) -> bool:
    """Hz ops of the float artefacts whose output has their first input's shape (and is float)."""
    return has_fact(op_type, "shape_preserving") and has_fact(op_type, "float_output")


def infer_shapes(model: ModelProto, *, keep_declared: bool = False, output_sizes: bool = False) -> ModelProto:
    """onnx shape inference that also passes shapes through HzPreprocess / HzCalibration.

    The float shape-preserving Hz nodes stand in as Casts to float while onnx infers,
    so one pass reaches through any number of them. ``keep_declared`` starts from the
    model's own value_info (integer Hz ops declare their outputs there). ``output_sizes``: the
    model outputs' unknown sizes become the ones inferred (onnx infers them, but only on its copy).
    """
    if not keep_declared:
        # onnx knows no shape of an op outside its domains: what was declared for one (``typed_by_running``)
        # stays, or every shape after it is lost again
        foreign = {o for n in model.graph.node if n.domain not in ("", "ai.onnx", DOMAIN) for o in n.output}
        declared = [vi for vi in model.graph.value_info if vi.name in foreign]
        del model.graph.value_info[:]
        model.graph.value_info.extend(declared)
    probe = shape_probe(model)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    flags = {i.name for i in model.graph.input}
    for k, node in enumerate(probe.graph.node):
        if _float_shape_preserving(node.op_type) and node.input and node.output:
            probe.graph.node[k].CopyFrom(onnx.helper.make_node("Cast", [node.input[0]], [node.output[0]],
                                                               name=node.name, to=onnx.TensorProto.FLOAT))
        elif (picked := _selected_source(node, flags)) is not None:
            # onnx infers an If's branches against the whole outer scope, once per If: quadratic in
            # a lowered model with a switch per calibration node. Both picks of a switch have one type.
            probe.graph.node[k].CopyFrom(onnx.helper.make_node("Identity", [picked], [node.output[0]], name=node.name))
        elif node.domain in ("", "ai.onnx") and opset is not None:
            _spell_out_defaults(probe.graph.node[k], opset)
    for _ in range(64):
        inferred = onnx.shape_inference.infer_shapes(probe, strict_mode=False)
        known = _known(inferred)
        shapes = {t.name: list(t.dims) for t in inferred.graph.initializer} | {n: _dims(v) for n, v in known.items()}
        added = _apply_value_infos(inferred, [*custom_value_infos(inferred, known),
                                              *contrib_value_infos(inferred, shapes)])
        probe = inferred
        if not added:
            break
    del model.graph.value_info[:]
    model.graph.value_info.extend(probe.graph.value_info)
    if output_sizes:
        _size_outputs(model, probe)
    _type_outputs(model, probe)
    typed = [vi for vi in model.graph.value_info if vi.type.tensor_type.HasField("shape")]
    del model.graph.value_info[:]
    model.graph.value_info.extend(typed)
    return model


# No output shape depends on the values of a constant this large (shapes, axes, pads and sizes
# are a few numbers), so inference needs only its type and dims.
LARGE_CONSTANT = 1024  # elements


def shape_probe(model: ModelProto) -> ModelProto:
    """A copy of ``model`` for shape inference: its large initializers are graph inputs of their type and
    shape instead, their values not copied.

    onnx's inference serializes the model to C++ and parses the result back: with a 60 MB model's
    weights in it, one inference took 300 MB more than the model at its peak. A full copy first
    (then the weights deleted) would still cost them once more: protobuf frees a message's parts
    only with the whole message."""
    large = large_constants(model)
    probe = copy_model(model, lambda t: t.name not in large)
    declared = _declared(model, large)  # once: per initializer it made the model's inputs a set again each time
    probe.graph.input.extend(reversed([onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                                       for t in model.graph.initializer if t.name in declared]))
    return probe


def large_constants(model: ModelProto) -> set[str]:
    """The initializers ``shape_probe`` and ``convert_opset`` pass over (their values unread)."""
    return {t.name for t in model.graph.initializer if is_large(t)}


def is_large(tensor: TensorProto) -> bool:
    """Whether ``tensor`` is a weight whose values no shape depends on (``LARGE_CONSTANT``)."""
    return elements(tensor.dims) >= LARGE_CONSTANT and tensor.data_type != onnx.TensorProto.INT64


def _declared(model: ModelProto, large: set[str]) -> set[str]:
    """Those of ``large`` a probe declares as inputs: not already inputs (as IR 3 lists initializers)."""
    return large - {i.name for i in model.graph.input}


def convert_opset(model: ModelProto, target: int) -> ModelProto:
    """``model`` at opset ``target`` (onnx's version converter), its large initializers not passed through it.

    The converter serializes the model to C++ and parses its result back: with the weights, VGG-19's
    550 MB three times over. No converter reads the values of a constant this large (``shape_probe``);
    they are put back in their place. Raises what the converter raises."""
    large = large_constants(model)
    converted = version_converter.convert_version(shape_probe(model), target)
    out = ModelProto()
    copy_fields(converted, out, skip=("graph",))
    copy_fields(converted.graph, out.graph, skip=("input", "initializer"))
    declared = _declared(model, large)
    out.graph.input.extend(i for i in converted.graph.input if i.name not in declared)
    made = {t.name: t for t in converted.graph.initializer}
    out.graph.initializer.extend(t if t.name in large else made.pop(t.name) for t in model.graph.initializer
                                 if t.name in large or t.name in made)
    out.graph.initializer.extend(made.values())  # added by the converter
    return out


def copy_model(model: ModelProto, keep: Callable[[TensorProto], bool]) -> ModelProto:
    """A copy of ``model`` with only the initializers ``keep`` accepts (in their order).

    Copying the whole model and deleting the others would cost their memory all the same (``compact``)."""
    out = ModelProto()
    copy_fields(model, out, skip=("graph",))
    copy_fields(model.graph, out.graph, skip=("initializer",))
    add_initializers(out.graph, (t for t in model.graph.initializer if keep(t)))
    return out


def add_initializers(graph: onnx.GraphProto, tensors: Iterable[TensorProto]) -> None:
    """Append copies of ``tensors`` to ``graph``'s initializers.

    Each is copied with CopyFrom: protobuf serializes a message given to extend or append, and refuses
    one over its 2 GiB limit (a single weight that large)."""
    for tensor in tensors:
        graph.initializer.add().CopyFrom(tensor)


def copy_fields(source: Message, target: Message, skip: Sequence[str] = ()) -> None:
    """Copy every field of ``source`` into ``target`` (of the same type) but those named in ``skip``."""
    for field_desc, value in source.ListFields():
        if field_desc.name in skip:
            continue
        repeated = field_desc.is_repeated if hasattr(field_desc, "is_repeated") else \
            field_desc.label == field_desc.LABEL_REPEATED  # protobuf before 5.28
        if repeated:
            getattr(target, field_desc.name).extend(value)
        elif field_desc.message_type is not None:
            getattr(target, field_desc.name).CopyFrom(value)
        else:
            setattr(target, field_desc.name, value)


def compact(model: ModelProto) -> ModelProto:
    """A copy of ``model``: the same message, in as much memory as it takes.

    protobuf (upb) keeps a message's parts in one arena that is freed only with the whole message:
    a model edited in place keeps every node and initializer it removed or replaced (one whose
    initializer list was rebuilt holds its weights twice). A copy takes only what the message holds."""
    fresh = ModelProto()
    fresh.CopyFrom(model)
    return fresh


def _selected_source(node: onnx.NodeProto, flags: set[str]) -> str | None:
    """The then-pick of a switch: an If on a graph input (one of ``flags``) whose branches each only
    hand on an outer tensor of the same type (the debugger's, ``debug.switches``); None for any other node."""
    if node.op_type != "If" or node.domain not in ("", "ai.onnx") or len(node.output) != 1 \
            or node.input[0] not in flags:
        return None
    picks = []
    for attr in node.attribute:
        g = attr.g
        if attr.type != onnx.AttributeProto.GRAPH or len(g.node) != 1 or g.node[0].op_type != "Identity" \
                or g.initializer or len(g.output) != 1 or g.node[0].output[0] != g.output[0].name:
            return None
        picks.append((g.node[0].input[0], g.output[0].type.tensor_type.elem_type))
    if len(picks) != 2 or picks[0][1] != picks[1][1]:
        return None
    return picks[0][0]


def _spell_out_defaults(node: onnx.NodeProto, opset: int) -> None:
    """Write the attributes a node leaves at their default, as the operator schema gives them.

    onnx's shape inference does not always apply a default (onnx 1.23 infers an STFT without
    ``onesided`` as two-sided, 400 bins where onnxruntime computes 201), and the model then
    failed to load with the shapes written back. Spelled out, the attribute means the same to
    onnxruntime and to inference.
    """
    try:
        schema = onnx.defs.get_schema(node.op_type, opset, "")
    except onnx.defs.SchemaError:
        return
    given = {a.name for a in node.attribute}
    for name, attr in schema.attributes.items():
        if name not in given and attr.default_value.type != onnx.AttributeProto.UNDEFINED:
            node.attribute.append(attr.default_value)


def _known(model: ModelProto) -> dict[str, onnx.ValueInfoProto]:
    graph = model.graph
    infos = [*graph.value_info, *graph.input, *graph.output]
    return {vi.name: vi for vi in infos if vi.type.tensor_type.HasField("shape")}


def custom_value_infos(model: ModelProto, known: dict[str, onnx.ValueInfoProto]) -> list[onnx.ValueInfoProto]:
    """Float outputs of registered custom CPU ops (onnx cannot infer them), shaped by their shape function."""
    out = []
    consts = {t.name: list(t.dims) for t in model.graph.initializer}
    for node in model.graph.node:
        if custom.custom_op_of(node) is None:
            continue
        shapes = [consts[i] if i in consts else (_dims(known[i]) if i in known else None) for i in node.input if i]
        dims = custom.output_shapes(node, shapes)
        if dims is None:
            continue
        for o, d in zip(node.output, dims, strict=True):
            if o and (o not in known or _dims(known[o]) != d):
                out.append(onnx.helper.make_tensor_value_info(o, onnx.TensorProto.FLOAT, d))
    return out


def _dims(vi: onnx.ValueInfoProto) -> list[int | None]:
    return [d.dim_value if d.HasField("dim_value") else None for d in vi.type.tensor_type.shape.dim]


def _apply_value_infos(model: ModelProto, infos: list[onnx.ValueInfoProto]) -> bool:
    """Record ``infos`` in the graph (graph outputs take the type directly); True if anything changed."""
    outputs = {o.name: o for o in model.graph.output}
    for vi in infos:
        if vi.name in outputs:
            outputs[vi.name].type.CopyFrom(vi.type)
            continue
        for old in [v for v in model.graph.value_info if v.name == vi.name]:
            model.graph.value_info.remove(old)
        model.graph.value_info.append(vi)
    return bool(infos)


def _size_outputs(model: ModelProto, inferred: ModelProto) -> None:
    """Each unknown size of ``model``'s outputs that ``inferred`` (the model as shape inference left it) knows."""
    known = {o.name: o.type.tensor_type.shape for o in inferred.graph.output if o.type.tensor_type.HasField("shape")}
    for out in model.graph.output:
        shape = known.get(out.name)
        own = out.type.tensor_type
        if shape is None or not own.HasField("shape") or len(own.shape.dim) != len(shape.dim):
            continue
        for mine, theirs in zip(own.shape.dim, shape.dim, strict=True):
            if not mine.HasField("dim_value") and not mine.HasField("dim_param") and \
                    (theirs.HasField("dim_value") or theirs.HasField("dim_param")):
                mine.CopyFrom(theirs)


def _type_outputs(model: ModelProto, inferred: ModelProto) -> None:
    """onnx never fills an output's missing shape; probe it through an Identity in ``inferred`` (the
    model as shape inference saw it) and copy it over."""
    missing = [o for o in model.graph.output if not o.type.tensor_type.HasField("shape")]
    if not missing:
        return
    probe = ModelProto()
    probe.CopyFrom(inferred)
    for o in missing:
        probe.graph.node.append(onnx.helper.make_node("Identity", [o.name], [f"{o.name}__shape_probe"]))
    inferred = onnx.shape_inference.infer_shapes(probe, strict_mode=False)
    known = {vi.name: vi for vi in inferred.graph.value_info if vi.type.tensor_type.HasField("shape")}
    for o in missing:
        vi = known.get(f"{o.name}__shape_probe")
        if vi is not None:
            o.type.CopyFrom(vi.type)


def outer_references(node: NodeProto) -> list[str]:
    """The tensors only ``node``'s sub-graphs read from the enclosing graph (not among its inputs), once each."""
    if not any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
        return []
    own = set(node.input)
    return [r for r in dict.fromkeys(references(node)) if r not in own]


def references(node: NodeProto) -> Iterable[str]:
    """Every tensor a node reads, including those its sub-graphs read from the outer scope."""
    yield from (i for i in node.input if i)
    for attr in node.attribute:
        for sub in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs):
            local = {o for n in sub.node for o in n.output} | {t.name for t in sub.initializer}
            local |= {i.name for i in sub.input}
            for inner in sub.node:
                yield from (r for r in references(inner) if r not in local)


def part_model(whole: ModelProto, nodes: Sequence[NodeProto], outputs: Sequence[str],
               shapes: dict[str, list[int | None]], types: dict[str, int], name: str) -> ModelProto:
    """``nodes`` of ``whole`` as a model; what they read from elsewhere becomes inputs, constants come along.

    An output none of ``nodes`` makes (a graph input of ``whole`` asked for as it is) is read from elsewhere
    too: the part hands its input on. Declared only as an output, onnxruntime refused the part ("Graph output
    (x) does not exist in the graph"): the debugger observing a calibration node on a model input, whose
    float model part held no reader of that input (hunt 24 D1).
    """
    inits = {t.name: t for t in whole.graph.initializer}
    made = {o for n in nodes for o in n.output}
    reads = list(dict.fromkeys(r for r in [*(r for n in nodes for r in references(n)), *outputs]
                               if r and r not in made))

    def info(t: str) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(t, types.get(t, TensorProto.FLOAT), shapes.get(t))

    graph = helper.make_graph(list(nodes), name, [info(r) for r in reads if r not in inits],
                              [helper.make_tensor_value_info(t, types.get(t, TensorProto.FLOAT), None)
                               for t in outputs],
                              [inits[r] for r in reads if r in inits])
    model = helper.make_model(graph, opset_imports=list(whole.opset_import))
    model.ir_version = whole.ir_version
    return model


def is_static(shape: Iterable | None) -> bool:
    """Whether ``shape`` is known in every dimension (a scalar's empty shape is)."""
    return shape is not None and all(isinstance(d, int) and d > 0 for d in shape)


def elements(dims: Iterable[int | None] | None) -> int:
    """Number of elements of a static shape (1 where it is unknown)."""
    if dims is None:
        return 1
    dims = list(dims)
    return int(np.prod(dims, dtype=np.int64)) if all(d is not None for d in dims) else 1


def axis_through_reshape(in_shape: list[int], out_shape: list[int], axis: int) -> int | None:
    """The axis of a reshape's output (static shapes) holding its input's ``axis`` unchanged; None where the
    reshape splits or merges that axis."""
    before = elements(in_shape[:axis])
    for j, size in enumerate(out_shape):
        if size == in_shape[axis] and elements(out_shape[:j]) == before:
            return j
    return None


def itemsize(elem_type: int) -> int:
    """Bytes of one element of an ONNX tensor type."""
    return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)).itemsize


def dtype_name(elem_type: int) -> str:
    """numpy's name of an ONNX tensor type ("float32", "int64", ...), as the .bin's descriptors give it."""
    return str(np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)))
