"""Element-wise work: divisions as reciprocal products, Expand as Tile or left to broadcasting, batch axes squeezed
around element-wise chains.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx
from onnx import ModelProto, NodeProto, helper, numpy_helper

from hbtools.graph.graph import GraphView, is_static, rewrite_nodes
from hbtools.march.profiles import MarchProfile, OpRule


def divisions_as_reciprocal_products(model: ModelProto, placed: Mapping[str, str] | None = None) -> int:
    """``a / b`` of two computed float tensors (the normalization of a linear attention) as
    ``a * Reciprocal(b)``: a lookup table and a product of two tensors, both BPU forms, where a
    division of two tensors has none. The Mul keeps the Div's name; a Div that ``placed`` (the
    config's node_info) puts on the CPU stays. Returns how many Divs it rewrote."""
    view = GraphView(model)
    nodes = []
    count = 0
    for node in model.graph.node:
        if node.op_type != "Div" or node.domain not in ("", "ai.onnx") or len(node.input) != 2 or \
                (placed or {}).get(node.name) == "CPU" or \
                any(view.is_const(i) for i in node.input) or \
                any(view.elem_types.get(i) != onnx.TensorProto.FLOAT for i in node.input):
            nodes.append(node)
            continue
        count += 1
        reciprocal = f"{node.output[0]}_reciprocal"
        nodes += [helper.make_node("Reciprocal", [node.input[1]], [reciprocal], name=f"{node.name}_reciprocal"),
                  helper.make_node("Mul", [node.input[0], reciprocal], [node.output[0]], name=node.name)]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return count


def expands_as_tiles(model: ModelProto) -> int:
    """An Expand of a float tensor to a constant shape (``x.expand(...)`` / ``expand_as`` of an activation in
    PyTorch exports: RivaGAN's watermark bits over the frame, masks, gates) as the Tile it is, after a
    Reshape that adds the leading axes it broadcasts over: the BPU moves data with Tile and has no Expand.
    The count of Expands rewritten."""
    view = GraphView(model)

    def rewrite(node: NodeProto) -> list[NodeProto] | None:
        if node.op_type != "Expand" or node.domain not in ("", "ai.onnx") or not view.is_const(node.input[1]) \
                or view.elem_types.get(node.input[0]) != onnx.TensorProto.FLOAT:
            return None
        shape = view.shapes.get(node.input[0])
        if shape is None or any(not isinstance(d, int) or d <= 0 for d in shape):
            return None
        target = [int(d) for d in np.ravel(view.const(node.input[1]))]
        rank = max(len(shape), len(target))
        source = [1] * (rank - len(shape)) + list(shape)
        target = [1] * (rank - len(target)) + target
        if any(t != s and s != 1 and t != 1 for s, t in zip(source, target, strict=True)):
            return None
        repeats = [t if s == 1 else 1 for s, t in zip(source, target, strict=True)]
        x, nodes = node.input[0], []
        if rank > len(shape):
            x, new_shape = f"{node.output[0]}_ranked", f"{node.name}_rank_shape"
            model.graph.initializer.append(numpy_helper.from_array(np.array(source, np.int64), new_shape))
            nodes.append(helper.make_node("Reshape", [node.input[0], new_shape], [x], name=f"{node.name}_rank"))
        reps = f"{node.name}_repeats"
        model.graph.initializer.append(numpy_helper.from_array(np.array(repeats, np.int64), reps))
        return [*nodes, helper.make_node("Tile", [x, reps], [node.output[0]], name=node.name)]

    return rewrite_nodes(model, rewrite)


_BROADCASTING = ("Add", "Sub", "Mul", "Div", "Max", "Min")  # those with a BPU form of two tensors qualify


def expands_into_broadcasts(model: ModelProto, profile: MarchProfile) -> int:
    """An Expand read only by element-wise ops of two tensors whose other operand has the expanded shape already
    (CBAM's ``gate.unsqueeze(2).unsqueeze(3).expand_as(x) * x``) is left to their broadcasting, where ``profile``'s
    BPU has no Tile to write the Expand with (RDK X3) and broadcasts the Expand's input for each of them itself:
    they read that input, the same values, and the Expand no longer holds them on the CPU. The count removed."""
    if profile.rule("Tile") is not None:
        return 0  # the Expand becomes a Tile on the BPU (``expands_as_tiles``)
    view = GraphView(model)
    kept: list[NodeProto] = []
    count = 0
    for node in model.graph.node:
        readers = view.consumers.get(node.output[0], []) if node.op_type == "Expand" and \
            node.domain in ("", "ai.onnx") and node.output[0] not in view.graph_outputs else []
        if not readers or not all(_broadcasts_itself(r, node, view, profile) for r in readers):
            kept.append(node)
            continue
        for reader in readers:
            for k, name in enumerate(reader.input):
                if name == node.output[0]:
                    reader.input[k] = node.input[0]
        count += 1
    if count:
        del model.graph.node[:]
        model.graph.node.extend(kept)
    return count


def _broadcasts_itself(reader: NodeProto, expand: NodeProto, view: GraphView, profile: MarchProfile) -> bool:
    """Whether ``reader`` of ``expand``'s output is an element-wise op of two tensors whose other operand has that
    output's shape, and which the BPU runs on two tensors with the Expand's input broadcast against it (a division
    of two tensors it does not run: F.normalize's Expand stays, named in the reasons)."""
    if reader.op_type not in _BROADCASTING or reader.domain not in ("", "ai.onnx") or len(reader.input) != 2 or \
            list(reader.input).count(expand.output[0]) != 1:
        return False
    from hbtools.march.constraints import classify_broadcast  # it imports bpu_forms: a cycle at import time

    other = reader.input[1] if reader.input[0] == expand.output[0] else reader.input[0]
    shape, source = view.shapes.get(expand.output[0]), view.shapes.get(expand.input[0])
    rule = profile.rule(reader.op_type)
    return is_static(shape) and is_static(source) and view.shapes.get(other) == shape and rule is not None and \
        "eltwise" in rule.forms and (classify_broadcast(shape, source) in rule.broadcast or
                                     (not view.is_const(other) and _copies_over_channels(shape, source, rule, profile)))


def _copies_over_channels(big: list[int], small: list[int], rule: OpRule, profile: MarchProfile) -> bool:
    """Whether ``channel_broadcasts_as_convs`` writes the broadcast of ``small`` [N, 1, H, W] to ``big``
    [N, C, H, W] as a 1x1 Conv that copies the channel, for an op of ``rule``."""
    conv = profile.rule("Conv")
    return conv is not None and conv.ranks[0] <= 4 <= conv.ranks[1] and "same" in rule.broadcast and \
        len(big) == len(small) == 4 and small[1] == 1 and big[1] > 1 and \
        (conv.channels is None or big[1] <= conv.channels) and [small[0], *small[2:]] == [big[0], *big[2:]]


def channel_broadcasts_as_convs(model: ModelProto, profile: MarchProfile,
                                placed: Mapping[str, str] | None = None) -> int:
    """An element-wise op of a map [N, C, H, W] and a computed [N, 1, H, W] (CBAM's spatial attention
    ``x * sigmoid(conv(x.mean(1, keepdim=True)))``) with the one channel first copied to the C channels by a 1x1
    Conv of weight 1, where ``profile``'s BPU runs the op on equal shapes but does not broadcast over the channels
    (bernoulli2): the same values, and the op no longer goes to the CPU with the whole map. The copy is exact in
    float and on the int8 grid (a weight of 1, no bias); readers broadcasting the same tensor to the same channels
    share one. Not where node_info puts the op on the CPU. The count of ops that read a copy."""
    conv = profile.rule("Conv")
    if conv is None or not conv.ranks[0] <= 4 <= conv.ranks[1]:
        return 0
    from hbtools.march.constraints import classify_broadcast  # it imports bpu_forms: a cycle at import time

    view = GraphView(model)
    copies: dict[tuple[str, int], str] = {}

    def rewrite(node: NodeProto) -> list[NodeProto] | None:
        rule = profile.rule(node.op_type) if node.domain in ("", "ai.onnx") else None
        if rule is None or "eltwise" not in rule.forms or "same" not in rule.broadcast or \
                "general" in rule.broadcast or len(node.input) != 2 or node.input[0] == node.input[1] or \
                (placed or {}).get(node.name) == "CPU" or any(view.is_const(i) for i in node.input) or \
                any(view.elem_types.get(i) != onnx.TensorProto.FLOAT for i in node.input):
            return None
        shapes = [view.shapes.get(i) for i in node.input]
        if not all(is_static(s) and len(s) == 4 for s in shapes) or classify_broadcast(*shapes) != "general":
            return None
        small = next((k for k in (0, 1) if _copies_over_channels(shapes[1 - k], shapes[k], rule, profile)), None)
        if small is None:
            return None
        channels = shapes[1 - small][1]
        key = (node.input[small], channels)
        nodes = []
        if key not in copies:
            copies[key] = f"{node.input[small]}_over_{channels}_channels"
            weight = f"{copies[key]}_ones"
            model.graph.initializer.append(numpy_helper.from_array(np.ones((channels, 1, 1, 1), np.float32), weight))
            nodes.append(helper.make_node("Conv", [node.input[small], weight], [copies[key]],
                                          name=f"{node.name}_channel_copy", kernel_shape=[1, 1]))
        node.input[small] = copies[key]
        return [*nodes, node]

    return rewrite_nodes(model, rewrite)


_BATCHLESS_UNARY = ("Relu", "Elu", "Selu", "Sigmoid", "Tanh", "LeakyRelu", "HardSigmoid", "HardSwish", "Softplus",
                    "Exp", "Log", "Abs", "Neg", "Sqrt", "Erf", "Identity", "Clip")


_BATCHLESS_BINARY = ("Mul", "Add", "Sub", "Div", "Pow", "Max", "Min")


def _keeps_rank(node: NodeProto, view: GraphView, rank: int) -> bool:
    """Whether ``node``'s constants have at most ``rank`` axes: one with more would broadcast the squeezed
    tensor back to another rank."""
    return all(view.const(i).ndim <= rank for i in node.input if i and view.is_const(i))


def batch_squeezes_around_elementwise(model: ModelProto) -> int:
    """``Squeeze(axis 0)`` of a batch of one, element-wise ops with constant operands, ``Unsqueeze(axis 0)``
    (madmom's converter wraps every layer so: Conv, squeeze the batch, BatchNorm as Mul and Add over [C, 1, 1],
    Relu, unsqueeze for the next Conv) as the same ops on the 4-D tensor, the constants given the batch axis
    where they have the squeezed rank. The element-wise chain then sits right after the Conv, so its affine
    part folds into the weights and its activation fuses, instead of a quantized Mul, Add and lookup table
    each rounding to int8. A Squeeze followed by the Unsqueeze alone goes too. Returns how many pairs."""
    view = GraphView(model)

    def axes_zero(node: NodeProto) -> bool:
        a = view.attrs(node)
        given = list(a["axes"]) if "axes" in a else list(view.const(node.input[1])) \
            if len(node.input) > 1 and node.input[1] and view.is_const(node.input[1]) else None
        return given == [0]

    def single_use(tensor: str) -> NodeProto | None:
        users = view.consumers.get(tensor, [])
        return users[0] if len(users) == 1 and tensor not in view.graph_outputs else None

    count = 0
    renames: dict[str, str] = {}
    dropped: set[int] = set()
    restored: set[str] = set()  # tensors that get their batch axis back: their recorded shapes are stale
    for squeeze in model.graph.node:
        if squeeze.op_type != "Squeeze" or squeeze.domain not in ("", "ai.onnx") or not axes_zero(squeeze):
            continue
        shape = view.shapes.get(squeeze.input[0])
        if shape is None or not shape or shape[0] != 1 or len(shape) > 5:
            continue
        chain: list[NodeProto] = []
        tensor = squeeze.output[0]
        node = single_use(tensor)
        rank = len(shape) - 1
        while node is not None and node.domain in ("", "ai.onnx") and _keeps_rank(node, view, rank) and (
                (node.op_type in _BATCHLESS_UNARY and all(view.is_const(i) for i in node.input[1:] if i))
                or (node.op_type in _BATCHLESS_BINARY and len(node.input) == 2
                    and sum(view.is_const(i) for i in node.input) == 1)):
            chain.append(node)
            tensor = node.output[0]
            node = single_use(tensor)
        if node is None or node.op_type != "Unsqueeze" or node.domain not in ("", "ai.onnx") or not axes_zero(node):
            continue
        unsqueeze = node
        if not chain and unsqueeze.output[0] in view.graph_outputs:
            continue
        count += 1
        dropped.update((id(squeeze), id(unsqueeze)))
        for op in chain:
            restored.update(op.output)
            for k, name in enumerate(op.input):
                c = view.const(name) if op.op_type in _BATCHLESS_BINARY and name and view.is_const(name) else None
                if c is not None and c.ndim == rank:
                    batched = f"{name}_{op.name}_batched"
                    model.graph.initializer.append(numpy_helper.from_array(c[None], batched))
                    op.input[k] = batched
        if chain:
            chain[0].input[list(chain[0].input).index(squeeze.output[0])] = squeeze.input[0]
            chain[-1].output[0] = unsqueeze.output[0]
        else:
            renames[unsqueeze.output[0]] = squeeze.input[0]
    if not count:
        return 0
    _without(model, dropped, renames)
    stale = [v for v in model.graph.value_info if v.name in restored]
    for v in stale:
        model.graph.value_info.remove(v)
    return count


def squeeze_unsqueeze_pairs(model: ModelProto) -> int:
    """An Unsqueeze of the axes a Squeeze took away hands the Squeeze's input on unchanged: its readers read that
    input, and the Squeeze goes too where nothing else reads it (a max over the points of a pillar without keepdims,
    unsqueezed again: on RDK X3 the pair held the pool between two BPU subgraphs on the CPU). Returns how many
    Unsqueezes went."""
    view = GraphView(model)

    def axes(node: NodeProto, shape: list) -> list[int] | None:
        a = view.attrs(node)
        given = a["axes"] if "axes" in a else view.const(node.input[1]) \
            if len(node.input) > 1 and node.input[1] and view.is_const(node.input[1]) else None
        if given is None and node.op_type == "Squeeze" and len(node.input) < 2:  # every axis of one
            return [k for k, d in enumerate(shape) if d == 1] if is_static(shape) else None
        return None if given is None else sorted(int(k) % len(shape) for k in np.atleast_1d(given))

    renames: dict[str, str] = {}
    dropped: set[int] = set()
    squeezes: list[NodeProto] = []
    for unsqueeze in model.graph.node:
        squeeze = view.producer.get(unsqueeze.input[0]) if unsqueeze.op_type == "Unsqueeze" and \
            unsqueeze.domain in ("", "ai.onnx") and unsqueeze.output[0] not in view.graph_outputs else None
        if squeeze is None or squeeze.op_type != "Squeeze" or squeeze.domain not in ("", "ai.onnx"):
            continue
        shape = view.shapes.get(squeeze.input[0])
        taken = axes(squeeze, shape) if shape is not None else None
        if not taken or taken != axes(unsqueeze, shape):
            continue
        dropped.add(id(unsqueeze))
        renames[unsqueeze.output[0]] = squeeze.input[0]
        squeezes.append(squeeze)
    if not renames:
        return 0
    for squeeze in squeezes:  # read by nothing left
        if squeeze.output[0] not in view.graph_outputs and \
                all(id(n) in dropped for n in view.consumers.get(squeeze.output[0], [])):
            dropped.add(id(squeeze))
    _without(model, dropped, renames)
    return len(renames)


def _without(model: ModelProto, dropped: set[int], renames: dict[str, str]) -> None:
    """``model`` without the nodes ``dropped`` (their ids), its other nodes reading ``renames``' targets (followed
    through chains) for the tensors those nodes made."""
    kept = [n for n in model.graph.node if id(n) not in dropped]
    for node in kept:
        for k, name in enumerate(node.input):
            while name in renames:
                name = renames[name]
            node.input[k] = name
    del model.graph.node[:]
    model.graph.node.extend(kept)


_UNIFORM_READERS = ("Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Where", "Equal", "Greater", "Less",
                    "GreaterOrEqual", "LessOrEqual")


def uniform_constants_as_scalars(model: ModelProto) -> int:
    """A constant whose elements are all equal, read by an element-wise op whose other inputs make the output's
    shape alone, as the scalar it is (``torch.where(x > t, x, torch.zeros_like(x))``: the exporter folds
    ``zeros_like`` / ``full_like`` to a constant of the map's whole shape). The scalar form is a function of one
    tensor, one lookup table on the BPU; the full one ran on the CPU. The count of inputs rewritten."""
    view = GraphView(model)
    scalars: dict[str, str] = {}
    count = 0
    for node in model.graph.node:
        if node.op_type not in _UNIFORM_READERS or node.domain not in ("", "ai.onnx"):
            continue
        out = view.shapes.get(node.output[0])
        for k, name in enumerate(node.input):
            value = view.const(name)
            if value is None or value.size < 2 or not np.all(value == value.flat[0]):
                continue
            others = [view.shapes.get(n) for i, n in enumerate(node.input) if i != k]
            if out is None or not is_static(out) or not others or any(s is None or not is_static(s) for s in others):
                continue
            try:
                if list(np.broadcast_shapes(*[tuple(s) for s in others])) != list(out):
                    continue
            except ValueError:
                continue
            if name not in scalars:
                scalars[name] = f"{name}_scalar"
                model.graph.initializer.append(numpy_helper.from_array(value.flat[0:1].reshape(()), scalars[name]))
            node.input[k] = scalars[name]
            count += 1
    return count


def constant_scatters_as_masks(model: ModelProto) -> int:
    """A ScatterND of zeros at constant indices into a float map (``f[:, :, 0, :] = 0``: a border zeroed in place,
    which torch exports as a ScatterND) as ``f * mask``, the mask 0 where the zeros go and 1 elsewhere. The BPU
    multiplies by constants and has no scatter: the ScatterND ran on the CPU between two BPU subgraphs. Other values
    written stay a ScatterND (an Add of them would stretch the map's grid to reach them). The count."""
    view = GraphView(model)

    def rewrite(node: NodeProto) -> list[NodeProto] | None:
        if node.op_type != "ScatterND" or node.domain not in ("", "ai.onnx") or len(node.input) != 3 \
                or view.attrs(node).get("reduction", "none") not in ("none", b"none"):
            return None
        shape = view.shapes.get(node.input[0])
        indices, updates = view.const(node.input[1]), view.const(node.input[2])
        if shape is None or not is_static(shape) or indices is None or updates is None or view.is_const(node.input[0]) \
                or view.elem_types.get(node.input[0]) != onnx.TensorProto.FLOAT:
            return None
        if np.any(updates):  # values written into the map widen its grid to reach them (hunt 50 D3): stays
            return None
        mask = np.ones(shape, np.float32)
        try:
            mask[tuple(np.moveaxis(indices.astype(np.int64), -1, 0))] = 0
        except (IndexError, ValueError):
            return None
        name = node.name or node.output[0]
        model.graph.initializer.append(numpy_helper.from_array(mask, f"{name}_mask"))
        return [helper.make_node("Mul", [node.input[0], f"{name}_mask"], list(node.output), name=node.name)]

    return rewrite_nodes(model, rewrite)
