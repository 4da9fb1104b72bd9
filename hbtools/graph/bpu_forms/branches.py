"""Parallel convolution branches summed into one tensor (RepVGG, MobileOne, RepViT, FastViT in training form).

Such a block reads one tensor through several Convs (k x k and 1 x 1, each with its BatchNorm folded in by then)
and often the tensor itself or a BatchNormalization of it, and adds the results. Convolution is linear in its
kernel: when the branches share stride, groups (or finer groups) and output channels, and their paddings put
every kernel at the same place over the map, the sum is one Conv whose kernel is the sum of the kernels
zero-padded to the largest, and whose bias is the sum of the biases (the models' own "reparameterisation").
Left apart, every branch output and every partial sum would be rounded to the integer grid on the BPU.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from onnx import ModelProto, NodeProto, helper, numpy_helper

from hbtools.graph.graph import GraphView


@dataclass
class _Branch:
    """One term of the sum as a convolution of ``source``; ``nodes`` compute it (none: the tensor itself)."""

    source: str
    weight: np.ndarray  # [C_out, C_in / groups, k...], float64
    bias: np.ndarray  # [C_out]
    groups: int
    strides: list[int]
    pads: list[int]  # begins then ends, as ONNX
    dilations: list[int]
    nodes: list[NodeProto]
    conv: NodeProto | None = None


def parallel_convs_merged(model: ModelProto, placed: Mapping[str, str] | None = None) -> int:
    """Sums (Adds, chains of Adds) of Convs reading the same tensor, and of that tensor itself or of a per-channel
    affine map of it (BatchNormalization, Mul / Add by a per-channel constant), become one Conv where the kernels
    line up over the map. The number of sums so written. A sum with a node ``placed`` by node_info (node name ->
    "BPU" / "CPU", as node_info puts them) stays as it is: the user wants that node apart."""
    merged = 0
    while True:
        step = _merge_once(model, placed or {})
        if not step:
            return merged
        merged += step


def _merge_once(model: ModelProto, placed: Mapping[str, str]) -> int:
    view = GraphView(model)
    removed: set[int] = set()  # id() of the nodes taken out
    added: list[tuple[NodeProto, list[NodeProto]]] = []  # (node placed before, new nodes)
    merged = 0
    for root in model.graph.node:
        if not _is_sum(root, view) or id(root) in removed or _inner_sum(root, view) is not None:
            continue
        adds, leaves = [], []
        _collect(root, view, adds, leaves)
        if len(leaves) < 2:
            continue
        terms = [_branch(leaf, view) for leaf in leaves]
        groups: dict[str, list[int]] = {}
        for k, term in enumerate(terms):
            if term is not None and term.conv is not None:
                groups.setdefault(term.source, []).append(k)
        for source, members in groups.items():
            for k, leaf in enumerate(leaves):  # the tensor or its affine map joins the convs of that tensor
                term = terms[k]
                if k not in members and term is not None and term.conv is None and term.source == source:
                    members.append(k)
                elif term is None and leaf == source:
                    members.append(k)
                    terms[k] = _identity(source, view)
            members[:] = [k for k in members if terms[k] is not None]
            chosen = _compatible([terms[k] for k in members], view)
            # a residual around one conv (x + conv(x)) is in its deploy form already: a unit tap in the kernel
            # would only widen each channel's int8 weight range
            if chosen is None or sum(bool(t.nodes) for t in chosen) < 2 or not any(t.conv is not None for t in chosen):
                continue
            left = [leaf for k, leaf in enumerate(leaves) if not any(terms[k] is t for t in chosen)]
            norm = None if left else _batchnorm_after(root, view)
            taken = [*adds, *(n for t in chosen for n in t.nodes), *(norm[3] if norm is not None else [])]
            # A node node_info places (with InputType / OutputType, say) is the user's to keep as written.
            if any(n.name in placed for n in taken):
                continue
            conv = _merged_conv(model, chosen, view, norm)
            new_nodes = [conv] + _sum_chain(norm[3][0] if norm is not None else root, conv, left)
            added.append((root, new_nodes))
            removed.update(id(n) for n in taken)
            merged += 1
            break  # the other tensors of this sum wait for the next pass, over the rewritten graph
    if not added:
        return 0
    before = {id(root): new for root, new in added}
    nodes = []
    for node in model.graph.node:
        if id(node) in before:
            nodes.extend(before[id(node)])
        if id(node) not in removed:
            nodes.append(node)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return merged


def _is_sum(node: NodeProto, view: GraphView) -> bool:
    """An Add of two activations of the shape of its result (no broadcasting, so the terms are whole maps)."""
    if node.op_type != "Add" or node.domain not in ("", "ai.onnx") or len(node.input) != 2:
        return False
    if any(not i or view.is_const(i) for i in node.input):
        return False
    out = view.shapes.get(node.output[0])
    return out is not None and len(out) >= 3 and all(isinstance(d, int) for d in out) \
        and all(view.shapes.get(i) == out for i in node.input)


def _only_reader(tensor: str, view: GraphView) -> NodeProto | None:
    readers = view.consumers.get(tensor, [])
    return readers[0] if len(readers) == 1 and tensor not in view.graph_outputs else None


def _inner_sum(node: NodeProto, view: GraphView) -> NodeProto | None:
    """The Add this sum is a term of, if it is one."""
    reader = _only_reader(node.output[0], view)
    return reader if reader is not None and _is_sum(reader, view) else None


def _collect(add: NodeProto, view: GraphView, adds: list[NodeProto], leaves: list[str]) -> None:
    adds.append(add)
    for i in add.input:
        producer = view.producer.get(i)
        if producer is not None and _is_sum(producer, view) and _only_reader(i, view) is add:
            _collect(producer, view, adds, leaves)
        else:
            leaves.append(i)


def _branch(tensor: str, view: GraphView) -> _Branch | None:
    """The term ``tensor`` as a convolution of another tensor: a Conv with constant weights, or a per-channel
    affine map; only where nothing else reads it."""
    node = view.producer.get(tensor)
    if node is None or _only_reader(tensor, view) is None or node.domain not in ("", "ai.onnx"):
        return None
    if node.op_type == "Conv":
        return _conv_branch(node, view)
    affine = _affine(tensor, view)
    if affine is None:
        return None
    source, scale, shift, nodes = affine
    branch = _identity(source, view)
    if branch is None:
        return None
    branch.weight = branch.weight * scale.reshape((-1,) + (1,) * (branch.weight.ndim - 1))
    branch.bias, branch.nodes = shift, nodes
    return branch


def _conv_branch(node: NodeProto, view: GraphView) -> _Branch | None:
    weight = view.const(node.input[1]) if len(node.input) > 1 else None
    has_bias = len(node.input) > 2 and bool(node.input[2])
    if weight is None or weight.dtype != np.float32 or weight.ndim < 3 or len(node.output) != 1 \
            or (has_bias and not view.is_const(node.input[2])):
        return None
    a = view.attrs(node)
    if a.get("auto_pad", "NOTSET") not in ("NOTSET", b"NOTSET"):
        return None
    spatial = weight.ndim - 2
    if list(a.get("kernel_shape", weight.shape[2:])) != list(weight.shape[2:]):
        return None
    bias = view.const(node.input[2]).astype(np.float64) if has_bias else np.zeros(weight.shape[0])
    return _Branch(node.input[0], weight.astype(np.float64), bias.reshape(-1), int(a.get("group", 1)),
                   list(a.get("strides", [1] * spatial)), list(a.get("pads", [0] * 2 * spatial)),
                   list(a.get("dilations", [1] * spatial)), [node], node)


def _affine(tensor: str, view: GraphView) -> tuple[str, np.ndarray, np.ndarray, list[NodeProto]] | None:
    """``tensor`` as ``scale * x + shift`` per channel of x: a BatchNormalization, a Mul by a per-channel constant,
    an Add / Sub of one (after such a Mul or not). (x, scale, shift, the nodes)."""
    node = view.producer[tensor]
    shape = view.shapes.get(tensor)
    if shape is None or len(shape) < 3 or not isinstance(shape[1], int):
        return None
    channels = shape[1]
    if node.op_type == "BatchNormalization":
        params = [view.const(i) for i in node.input[1:5]]
        if len(node.output) != 1 or any(p is None for p in params):
            return None
        gamma, beta, mean, var = (p.astype(np.float64).reshape(-1) for p in params)
        scale = gamma / np.sqrt(var + view.attrs(node).get("epsilon", 1e-5))
        return node.input[0], scale, beta - mean * scale, [node]
    if node.op_type not in ("Mul", "Add", "Sub") or len(node.input) != 2:
        return None
    const = [i for i in node.input if view.is_const(i)]
    if len(const) != 1 or (node.op_type == "Sub" and node.input[1] != const[0]):
        return None  # c - x is no map of x's scale
    value = _per_channel(view.const(const[0]), channels, len(shape))
    x = next(i for i in node.input if i != const[0])
    if value is None or view.shapes.get(x) != shape:
        return None
    if node.op_type == "Mul":
        return x, value, np.zeros(channels), [node]
    shift = value if node.op_type == "Add" else -value
    before = view.producer.get(x)
    if before is not None and before.op_type == "Mul" and _only_reader(x, view) is node:
        inner = _affine(x, view)
        if inner is not None:
            return inner[0], inner[1], shift, [*inner[3], node]
    return x, np.ones(channels), shift, [node]


def _per_channel(value: np.ndarray, channels: int, rank: int) -> np.ndarray | None:
    """A constant that broadcasts over a rank-``rank`` tensor as one value per channel (axis 1), as [C]."""
    if value.dtype.kind != "f" or value.ndim > rank:
        return None
    if value.size == 1:
        return np.full(channels, float(value.reshape(-1)[0]))
    full = (1,) * (rank - value.ndim) + value.shape
    if full != (1, channels) + (1,) * (rank - 2):
        return None
    return value.astype(np.float64).reshape(-1)


def _identity(source: str, view: GraphView) -> _Branch | None:
    """The tensor itself as a 1 x 1 depthwise convolution (a weight of one per channel)."""
    shape = view.shapes.get(source)
    if shape is None or len(shape) < 3 or not isinstance(shape[1], int):
        return None
    spatial, channels = len(shape) - 2, shape[1]
    return _Branch(source, np.ones((channels, 1) + (1,) * spatial), np.zeros(channels), channels, [1] * spatial,
                   [0] * 2 * spatial, [1] * spatial, [])


def _compatible(terms: list[_Branch], view: GraphView) -> list[_Branch] | None:
    """The terms one Conv can compute: the convs must agree on stride, output channels and kernel placement;
    the tensor and its affine maps join where the convs keep its size and channels (stride 1, C_in = C_out)."""
    convs = [t for t in terms if t.conv is not None]
    shape = view.shapes.get(convs[0].source) if convs else None
    if shape is None or not isinstance(shape[1], int):
        return None
    out_channels = convs[0].weight.shape[0]
    spatial = convs[0].weight.ndim - 2
    if any(t.weight.ndim - 2 != spatial or t.weight.shape[0] != out_channels or t.strides != convs[0].strides
           or shape[1] % t.groups or out_channels % t.groups or t.weight.shape[1] * t.groups != shape[1]
           for t in convs):
        return None
    chosen = list(convs)
    if out_channels == shape[1] and all(s == 1 for s in convs[0].strides):
        chosen += [t for t in terms if t.conv is None and t.weight.ndim - 2 == spatial]
    groups = min(t.groups for t in chosen)
    if any(t.groups % groups for t in chosen):
        return None
    if _placement(chosen) is None:
        return None
    return chosen


def _placement(terms: list[_Branch]) -> tuple[list[int], list[list[int]], list[int]] | None:
    """Where each kernel sits in the merged one: (kernel size, per-term offsets, pads), per spatial axis; None
    where the kernels do not nest in the largest over the map (taps between a dilated kernel's, outside it)."""
    spatial = terms[0].weight.ndim - 2
    size, pads, offsets = [], [0] * 2 * spatial, [[0] * spatial for _ in terms]
    for axis in range(spatial):
        # a kernel of one tap reads no other tap, whatever its dilation
        dilations = {t.dilations[axis] for t in terms if t.weight.shape[2 + axis] > 1} or {1}
        if len(dilations) != 1:
            return None
        d = dilations.pop()
        begin = max(t.pads[axis] for t in terms)
        span = None  # begin + end - d * (k - 1): the same for all, or the output lengths differ
        extent = 0
        for k, t in enumerate(terms):
            taps = t.weight.shape[2 + axis]
            shift = begin - t.pads[axis]
            if shift % d:
                return None
            offsets[k][axis] = shift // d
            extent = max(extent, offsets[k][axis] + taps)
            here = t.pads[axis] + t.pads[spatial + axis] - d * (taps - 1)
            if span is not None and here != span:
                return None
            span = here
        end = span - begin + d * (extent - 1)
        # the smaller kernels sit inside the largest: a merged kernel larger than every branch's would cost taps
        if end < 0 or extent != max(t.weight.shape[2 + axis] for t in terms):
            return None
        size.append(extent)
        pads[axis], pads[spatial + axis] = begin, end
    return size, offsets, pads


def _batchnorm_after(root: NodeProto, view: GraphView) -> tuple[str, np.ndarray, np.ndarray, list[NodeProto]] | None:
    """The BatchNormalization that alone reads the sum (RepViT's ``bn(conv(x) + conv1(x) + x)``): onnxruntime
    folded the BatchNorms after Convs before the sum was one, so this one goes into the merged Conv here."""
    reader = _only_reader(root.output[0], view)
    if reader is None or reader.op_type != "BatchNormalization" or reader.domain not in ("", "ai.onnx"):
        return None
    return _affine(reader.output[0], view)


def _merged_conv(model: ModelProto, terms: list[_Branch], view: GraphView,
                 norm: tuple[str, np.ndarray, np.ndarray, list[NodeProto]] | None) -> NodeProto:
    size, offsets, pads = _placement(terms)
    groups = min(t.groups for t in terms)
    out_channels = terms[0].weight.shape[0]
    in_channels = view.shapes[terms[0].source][1]
    per_group_in, per_group_out = in_channels // groups, out_channels // groups
    weight = np.zeros((out_channels, per_group_in, *size))
    bias = np.zeros(out_channels)
    for term, offset in zip(terms, offsets, strict=True):
        # a term of finer groups: output channel o reads its group's inputs, which sit inside o's coarser group
        fine_in, fine_out = in_channels // term.groups, out_channels // term.groups
        window = tuple(slice(o, o + k) for o, k in zip(offset, term.weight.shape[2:], strict=True))
        for o in range(out_channels):
            start = (o // fine_out) * fine_in - (o // per_group_out) * per_group_in
            weight[(o, slice(start, start + fine_in), *window)] += term.weight[o]
        bias += term.bias
    if norm is not None:
        weight *= norm[1].reshape((-1,) + (1,) * (weight.ndim - 1))
        bias = bias * norm[1] + norm[2]
    largest = max((t for t in terms if t.conv is not None), key=lambda t: int(np.prod(t.weight.shape[2:])))
    name = largest.conv.name
    held = {t.name for t in model.graph.initializer}
    w_name, b_name = (_unused(f"{name}_{what}_merged", held) for what in ("weight", "bias"))
    model.graph.initializer.extend([numpy_helper.from_array(weight.astype(np.float32), w_name),
                                    numpy_helper.from_array(bias.astype(np.float32), b_name)])
    spatial = len(size)
    dilations = [next((t.dilations[a] for t in terms if t.weight.shape[2 + a] > 1), 1) for a in range(spatial)]
    out = _unused(f"{name}_merged", {o for n in model.graph.node for o in n.output})
    return helper.make_node("Conv", [terms[0].source, w_name, b_name], [out], name=name,
                            group=groups, kernel_shape=size, strides=largest.strides, pads=pads, dilations=dilations)


def _unused(name: str, held: set[str]) -> str:
    k, out = 0, name
    while out in held:
        k, out = k + 1, f"{name}{k + 1}"
    return out


def _sum_chain(root: NodeProto, conv: NodeProto, left: list[str]) -> list[NodeProto]:
    """The merged conv plus the terms it did not take, summed into the sum's output (the last Add keeps the
    sum's name); with no term left, the conv writes that output itself."""
    if not left:
        conv.output[0] = root.output[0]
        return []
    nodes, acc = [], conv.output[0]
    for k, term in enumerate(left):
        last = k == len(left) - 1
        out = root.output[0] if last else f"{root.output[0]}_part{k}"
        nodes.append(helper.make_node("Add", [acc, term], [out], name=root.name if last else f"{root.name}_part{k}"))
        acc = out
    return nodes
