"""Which node of the user's model each node of a rewritten graph stands for.

The optimize stage writes many nodes in place of, or around, a user's node (a bilinear Resize becomes
``/Resize_edges`` and a ConvTranspose; onnxruntime wraps a Gemm over a 3-D tensor in
``gemm_input_reshape`` / ``gemm_output_reshape``). The user knows only their own names: run_on_cpu,
node_info and the debugger's tables speak in them. ``OriginTrace`` follows a graph through its
rewrites and finds, for each new node, the user's node it came from; the artefacts carry the result
as metadata (``record_origins``), only for the nodes whose name is not their user node's.

A new node takes the origin of, in this order: the node of the same name before the rewrite; the
node whose name its name extends (``/Resize`` for ``/Resize_edges``, as the rewrites name their
pieces); for a Transpose writing the old output of a node still there, the Transpose before that node
(onnxruntime moved it down past the node); the node that wrote the tensor it now writes (a rewrite
keeps its node's output names); the node that reads its output (an adapter inserted before a node),
else the node it reads from.

A user's node with no node left after a rewrite was fused into another (a BatchNormalization into its
Conv, a LayerNorm pattern's Div into the one node that computes it): ``fused_into`` names the user's node
that node stands for, and whether it writes the user node's own output (the pattern's last node) or only
computes it inside.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from onnx import ModelProto

from hbtools.graph.model_io import read_json_metadata, write_json_metadata

ORIGINS_KEY = "hbtools.node_origins"
FUSED_KEY = "hbtools.fused_nodes"
_FUSION_REACH = 32  # gone nodes followed forward to the tensor a fused node now writes
_NAME_SEPARATORS = "_/.:"  # what a rewrite puts between its node's name and the piece's


class OriginTrace:
    """The user's node behind every node of a graph being rewritten; ``follow`` after each rewrite."""

    def __init__(self, model: ModelProto) -> None:
        self.origins: dict[str, str] = {n.name: n.name for n in model.graph.node if n.name}
        self._users = set(self.origins)  # a node taken out for a while (the input preprocessing) keeps its name
        self.fused_into: dict[str, Fusion] = {}
        self._seen(model)

    def _seen(self, model: ModelProto) -> None:
        self._producers = _producers(model)
        self._readers = _readers(model)
        self._nodes = {n.name: n for n in model.graph.node if n.name}

    def follow(self, model: ModelProto) -> None:
        """Take ``model``, a rewrite of the graph last seen, as the graph now traced."""
        fused = self._fused(model)
        found: dict[str, str] = {}
        now = {n.name for n in model.graph.node}
        for node in (n for n in model.graph.node if n.name):  # the unnamed are named before the next step
            writers = [fused.get(p, p) for o in node.output if (p := self._producers.get(o)) in self.origins]
            origin = self._by_name(node.name)
            if origin is None and node.op_type == "Transpose" and writers and writers[0] in now:
                origin = self._transpose_before(writers[0])
            if origin is None:
                origin = next((self.origins[w] for w in writers if w in self.origins), None)
            if origin is not None:
                found[node.name] = origin
        _from_neighbours(model, found)
        self._follow_fusions(model, found)
        self.origins = found
        self._seen(model)

    def _follow_fusions(self, model: ModelProto, found: dict[str, str]) -> None:
        """Update ``fused_into`` for the user's nodes that have no node left in ``model`` (``found``: the origins
        of its nodes). A user's node goes into the user's node the absorbing node stands for (a Linear's bias
        Add into its MatMul, whose Gemm onnxruntime wraps in reshapes: all its parts, not the last reshape)."""
        users_left = set(found.values())
        fused: dict[str, Fusion] = {user: f for user, f in self.fused_into.items() if user not in users_left}
        for gone, fusion in self._gone_into(model, {n.name for n in model.graph.node}).items():
            user = self.origins.get(gone)
            if user is None or user in users_left:
                continue
            into = Fusion(found.get(fusion.node, fusion.node), fusion.at_output)
            if user not in fused or (into.at_output and not fused[user].at_output):
                fused[user] = into
        for user in list(fused):  # one fused into a node fused in turn goes where that one went
            fusion, hops = fused[user], 0
            while fusion.node in fused and fusion.node != user and hops < len(fused):
                step = fused[fusion.node]
                fusion, hops = Fusion(step.node, fusion.at_output and step.at_output), hops + 1
            fused[user] = fusion
        self.fused_into = fused

    def _gone_into(self, model: ModelProto, now: set[str]) -> dict[str, Fusion]:
        """Nodes gone from ``model`` -> the node now writing a tensor they wrote, or failing that, a tensor that
        gone nodes after them wrote: the pattern's output. A node removed outright (an Identity, a folded
        constant) leads to no such tensor."""
        writers = _producers(model)
        out: dict[str, Fusion] = {}
        for name in self._nodes:
            if name in now:
                continue
            queue, seen = [name], {name}
            while queue and len(seen) <= _FUSION_REACH:
                node = self._nodes[queue.pop(0)]
                written = [writers[t] for t in node.output if t in writers]
                if written:
                    out[name] = Fusion(written[0], node.name == name)
                    break
                for reader in (r for t in node.output for r in self._readers.get(t, [])):
                    if reader not in now and reader in self._nodes and reader not in seen:
                        seen.add(reader)
                        queue.append(reader)
        return out

    def _transpose_before(self, name: str, reach: int = 8) -> str | None:
        """The origin of the Transpose nearest before node ``name`` (within ``reach`` nodes) in the graph last seen.

        A new Transpose writing the old output of a node that is still there was moved down past that node:
        onnxruntime's transpose optimizer pushes a Transpose through the nodes after it (a LayerNorm's Sub)."""
        queue, seen = [name], {name}
        while queue and len(seen) <= reach:
            node = self._nodes.get(queue.pop(0))
            if node is None:
                continue
            if node.name != name and node.op_type == "Transpose":
                return self.origins.get(node.name)
            for p in (self._producers.get(i) for i in node.input):
                if p is not None and p not in seen:
                    seen.add(p)
                    queue.append(p)
        return None

    def _fused(self, model: ModelProto) -> dict[str, str]:
        """Nodes gone from ``model`` -> the node they went into: the one node they read from that is still there
        but of another op (onnxruntime's Gemm in place of a MatMul and the Add after it). A node writing a gone
        node's output then belongs to the fused node."""
        now = {n.name: n.op_type for n in model.graph.node if n.name}
        out = {}
        for name, node in self._nodes.items():
            if name in now:
                continue
            into = {p for i in node.input if (p := self._producers.get(i)) in now and now[p] != self._nodes[p].op_type}
            if len(into) == 1:
                out[name] = into.pop()
        return out

    def _by_name(self, name: str) -> str | None:
        if name in self.origins:
            return self.origins[name]
        if name in self._users:
            return name
        for end in range(len(name) - 1, 0, -1):  # the longest stem: user names hold separators themselves
            if name[end] in _NAME_SEPARATORS and name[:end] in self.origins:
                return self.origins[name[:end]]
        return None

    def differing(self) -> dict[str, str]:
        """node -> user node, for the nodes not named as their user node."""
        return {name: origin for name, origin in self.origins.items() if name != origin}


@dataclass(frozen=True)
class Fusion:
    """The user's node a user's node went into (the node of a graph it went into stands for it); ``at_output``:
    it writes the user node's output."""

    node: str
    at_output: bool


def _producers(model: ModelProto) -> dict[str, str]:
    return {o: n.name for n in model.graph.node for o in n.output if o}


def _readers(model: ModelProto) -> dict[str, list[str]]:
    readers: dict[str, list[str]] = {}
    for n in model.graph.node:
        for i in n.input:
            readers.setdefault(i, []).append(n.name)
    return readers


def _from_neighbours(model: ModelProto, found: dict[str, str]) -> None:
    """Give the nodes no rule placed the origin of their reader, else of their producer (repeated, so that a
    chain of new nodes between two user nodes takes it)."""
    readers = _readers(model)
    producers = _producers(model)
    open_nodes = [n for n in model.graph.node if n.name and n.name not in found]
    while open_nodes:
        placed = []
        for n in open_nodes:
            after = [found[r] for o in n.output for r in readers.get(o, []) if r in found]
            before = [found[p] for i in n.input if (p := producers.get(i)) in found]
            if after or before:
                found[n.name] = (after or before)[0]
                placed.append(n)
        if not placed:
            return
        open_nodes = [n for n in open_nodes if n.name not in found]


def record_origins(model: ModelProto, origins: Mapping[str, str]) -> None:
    """Record in ``model``'s metadata the user's node of each node ``origins`` names."""
    write_json_metadata(model, ORIGINS_KEY, dict(origins))


def recorded_origins(model: ModelProto) -> dict[str, str]:
    """node -> user node as ``record_origins`` recorded it (none for a model without the record)."""
    return dict(read_json_metadata(model, ORIGINS_KEY) or {})


def user_node(origins: Mapping[str, str], name: str) -> str:
    """The user's node that node ``name`` stands for (itself where no rewrite renamed it)."""
    return origins.get(name, name)


def record_fusions(model: ModelProto, fused_into: Mapping[str, Fusion]) -> None:
    """Record in ``model``'s metadata the user's node each fused user's node went into."""
    write_json_metadata(model, FUSED_KEY, {user: [f.node, f.at_output] for user, f in fused_into.items()})


def recorded_fusions(model: ModelProto) -> dict[str, Fusion]:
    """user's node -> the user's node it was fused into, as ``record_fusions`` recorded it."""
    return {user: Fusion(node, bool(at_output))
            for user, (node, at_output) in (read_json_metadata(model, FUSED_KEY) or {}).items()}


def written_as(model: ModelProto) -> dict[str, list[str]]:
    """user's node -> the nodes of ``model`` written for it under other names, in graph order; a user's node
    fused into another that writes its output (a LayerNorm pattern's last Add) is written as that node."""
    written: dict[str, list[str]] = {}
    for node, user in recorded_origins(model).items():
        written.setdefault(user, []).append(node)
    for user, fusion in recorded_fusions(model).items():
        if fusion.at_output and user not in written:
            written[user] = [fusion.node, *written.get(fusion.node, [])]
    return written
