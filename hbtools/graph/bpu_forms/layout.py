"""Data movement: channel shuffles and gathers, Transposes over fewer axes, Splits that undo Concats."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
from onnx import ModelProto, NodeProto, helper, numpy_helper

from hbtools.graph.bpu_forms._common import _axes_node, _opset
from hbtools.graph.bpu_forms.convs import _slice
from hbtools.graph.graph import GraphView, is_static, remove_dead_nodes, rewrite_nodes


def channel_shuffles_as_gathers(model: ModelProto, placed: Mapping[str, str] | None = None) -> int:
    """A Reshape -> Transpose -> Reshape chain that gives back its 4-D input's shape with only the channels
    reordered (ShuffleNet's channel shuffle through [N, g, C/g, H, W], Caffe's ShuffleChannel) becomes one
    Gather of channels with constant indices, named as the Transpose. The BPU of bernoulli2 (RDK X3) takes
    4-D tensors only: the chain put every shuffle on the CPU there, one BPU subgraph between each two;
    a Gather of channels stays on the BPU, and one that only Convs read folds into their weights
    (``channel_gathers_into_convs``). The chain is probed on the element indices, so any axis split that
    permutes channels alone qualifies. Chains that ``placed`` (node_info) names are left as they are.
    The count of chains rewritten."""

    def as_gather(chain: _MovingChain, model: ModelProto) -> list[NodeProto] | None:
        shape = list(chain.source.shape)
        if list(chain.moved.shape) != shape or shape[1] < 2:
            return None
        plane = shape[2] * shape[3]
        index = chain.moved[0, :, 0, 0] // plane % shape[1]
        if not np.array_equal(chain.moved, chain.source[:, index]):
            return None
        return [_channel_gather(model, chain.first.input[0], chain.out, index, chain.name)]

    return _rewrite_moving_chains(model, placed, as_gather)


def pixel_unshuffles_as_space_to_depth(model: ModelProto, placed: Mapping[str, str] | None = None) -> int:
    """A Reshape -> Transpose -> Reshape chain that takes [N, C, H, W] to [N, C*b*b, H/b, W/b] as a SpaceToDepth
    by ``b`` does, up to the order of the channels (torch's ``F.pixel_unshuffle``, Real-ESRGAN's input, puts
    channel c's offset (i, j) at c*b*b + i*b + j, SpaceToDepth at (i*b + j)*C + c), becomes SpaceToDepth, named
    as the Transpose, and a Gather of its channels (none where the order is SpaceToDepth's), which Convs reading
    it take into their weights (``channel_gathers_into_convs``). The same values: both only move them. The
    chain's 5-D Transpose put it on the CPU of bernoulli2 (RDK X3), between the input and the first conv.
    Chains that ``placed`` (node_info) names are left as they are. The count of chains rewritten."""

    def as_space_to_depth(chain: _MovingChain, model: ModelProto) -> list[NodeProto] | None:
        n, c, h, w = chain.source.shape
        out = chain.moved.shape
        block = math.isqrt(out[1] // c) if out[1] % c == 0 else 0
        if block < 2 or block * block * c != out[1] or list(out) != [n, out[1], h // block, w // block] \
                or h % block or w % block:
            return None
        blocks = chain.source.reshape(n, c, h // block, block, w // block, block).transpose(0, 3, 5, 1, 2, 4)
        blocks = blocks.reshape(out)  # SpaceToDepth's order
        channel_of = {int(v): k for k, v in enumerate(blocks[0, :, 0, 0])}
        index = np.array([channel_of.get(int(v), -1) for v in chain.moved[0, :, 0, 0]], np.int64)
        if (index < 0).any() or not np.array_equal(chain.moved, blocks[:, index]):
            return None
        if np.array_equal(index, np.arange(out[1])):
            return [helper.make_node("SpaceToDepth", [chain.first.input[0]], [chain.out], name=chain.name,
                                     blocksize=block)]
        moved = f"{chain.out}_space_to_depth"
        return [helper.make_node("SpaceToDepth", [chain.first.input[0]], [moved], name=chain.name, blocksize=block),
                _channel_gather(model, moved, chain.out, index, f"{chain.name}_channels")]

    return _rewrite_moving_chains(model, placed, as_space_to_depth)


@dataclass
class _MovingChain:
    """A Reshape -> Transpose -> Reshape chain between static 4-D tensors: ``source`` numbers the input's elements,
    ``moved`` holds in each output element the number of the input element it takes."""

    first: NodeProto
    name: str  # the Transpose's: the node the rewrite is named as
    out: str
    source: np.ndarray
    moved: np.ndarray


def _rewrite_moving_chains(model: ModelProto, placed: Mapping[str, str] | None,
                           form: Callable[[_MovingChain, ModelProto], list[NodeProto] | None]) -> int:
    """Put ``form``'s nodes in place of each Reshape -> Transpose -> Reshape chain it writes in other terms
    (None: the chain stays); chains ``placed`` names, or whose inner tensors others read, stay too."""
    view = GraphView(model)
    outputs = set(view.graph_outputs)
    named = set(placed or ())
    gone: set[str] = set()  # the outputs of the chains' first two nodes

    def rewrite(node: NodeProto) -> list[NodeProto] | None:
        if node.op_type != "Reshape" or node.domain not in ("", "ai.onnx"):
            return None
        transpose = view.producer.get(node.input[0])
        first = view.producer.get(transpose.input[0]) if transpose is not None and transpose.op_type == "Transpose" \
            else None
        if first is None or first.op_type != "Reshape" or first.domain not in ("", "ai.onnx") \
                or {first.name, transpose.name, node.name} & named:
            return None
        shape, split, out_shape = (view.shapes.get(t) for t in (first.input[0], first.output[0], node.output[0]))
        if any(s is None or any(not isinstance(d, int) or d <= 0 for d in s) for s in (shape, split, out_shape)) \
                or len(shape) != 4 or len(out_shape) != 4:
            return None
        for inner in (first.output[0], transpose.output[0]):
            if inner in outputs or len(view.consumers.get(inner, [])) != 1:
                return None
        perm = list(view.attrs(transpose).get("perm", range(len(split) - 1, -1, -1)))
        source = np.arange(math.prod(shape), dtype=np.int64).reshape(shape)
        moved = source.reshape(split).transpose(perm).reshape(out_shape)
        new = form(_MovingChain(first, transpose.name, node.output[0], source, moved), model)
        if new is not None:
            gone.update((first.output[0], transpose.output[0]))
        return new

    count = rewrite_nodes(model, rewrite)
    if count:
        kept = [n for n in model.graph.node if not set(n.output) & gone]
        del model.graph.node[:]
        model.graph.node.extend(kept)
    return count


def _channel_gather(model: ModelProto, x: str, out: str, index: np.ndarray, name: str) -> NodeProto:
    """A Gather of ``x``'s channels by the constant ``index``, named ``name``."""
    indices = f"{name}_indices"
    model.graph.initializer.append(numpy_helper.from_array(index.astype(np.int64), indices))
    return helper.make_node("Gather", [x, indices], [out], name=name, axis=1)


def channel_gathers_into_convs(model: ModelProto) -> int:
    """A Gather of channels with constant indices (onnxruntime writes YOLOv5's Focus slices as SpaceToDepth
    and such a reordering Gather) read only by Convs becomes part of their weights: the Convs read the
    Gather's input, each weight's input channel ``i`` summing the columns the indices send it. The same
    sums and no Gather: no data moved, and no Gather at the model's first layer, at full resolution, that
    has no BPU form on bernoulli2 (RDK X3) where it reads the input. The count of Gathers removed."""
    view = GraphView(model)
    outputs = set(view.graph_outputs)
    gone = set()
    for node in model.graph.node:
        if node.op_type != "Gather" or node.domain not in ("", "ai.onnx") or node.output[0] in outputs:
            continue
        shape, indices = view.shapes.get(node.input[0]), view.const(node.input[1])
        axis = int(view.attrs(node).get("axis", 0))
        if shape is None or len(shape) != 4 or indices is None or indices.ndim != 1 or axis % 4 != 1 \
                or not isinstance(shape[1], int):
            continue
        channels = int(shape[1])
        users = view.consumers.get(node.output[0], [])
        if not users or any(u.op_type != "Conv" or u.input[0] != node.output[0] or list(u.input).count(node.output[0])
                            != 1 or view.const(u.input[1]) is None or int(view.attrs(u).get("group", 1)) != 1
                            for u in users):
            continue
        index = [int(i) % channels for i in indices]
        for user in users:
            w = view.const(user.input[1])
            folded = np.zeros((w.shape[0], channels, *w.shape[2:]), dtype=w.dtype)
            np.add.at(folded, (slice(None), index), w)  # a channel the indices repeat sums its columns
            name = f"{user.input[1]}_{user.name}_gathered"
            model.graph.initializer.append(numpy_helper.from_array(folded, name))
            user.input[0], user.input[1] = node.input[0], name
        gone.add(node.name)
    if gone:
        kept = [n for n in model.graph.node if n.name not in gone]
        del model.graph.node[:]
        model.graph.node.extend(kept)
    return len(gone)


def transposes_in_fewer_axes(model: ModelProto) -> None:
    """A Transpose of more than 4 axes between two Reshapes (MobileViT's unfolding into patches goes through
    [1, C, h, 2, w, 2]) moves the same elements with its size-1 axes dropped and with the axes that stay
    side by side merged; the Reshapes around it only need the element order, so the first one makes the
    smaller shape and the Transpose takes the shorter perm. The BPU takes at most 5 axes (4 on bernoulli2)."""
    view = GraphView(model)
    for node in model.graph.node:
        shape = view.shapes.get(node.input[0]) if node.op_type == "Transpose" else None
        if shape is None or len(shape) <= 4 or any(not isinstance(d, int) or d <= 0 for d in shape):
            continue
        before = view.producer.get(node.input[0])
        after = view.consumers.get(node.output[0], [])
        reshapes = [before, *after]
        if before is None or not after or node.output[0] in view.graph_outputs \
                or len(view.consumers.get(node.input[0], [])) != 1 or node.input[0] in view.graph_outputs \
                or any(r.op_type != "Reshape" or not view.is_const(r.input[1]) for r in reshapes) \
                or any(0 in view.const(r.input[1]).tolist() for r in after):
            continue
        perm = list(view.attrs(node).get("perm", range(len(shape) - 1, -1, -1)))
        dims, new_perm = _fewer_axes(shape, perm)
        if not dims or len(dims) >= len(shape):  # a tensor of ones keeps its transpose
            continue
        target = f"{before.input[1]}_{node.name}_fewer_axes"
        model.graph.initializer.append(numpy_helper.from_array(np.array(dims, dtype=np.int64), target))
        before.input[1] = target
        del node.attribute[:]
        node.attribute.append(helper.make_attribute("perm", new_perm))


_MAX_WINDOW_TAPS = 64  # Slices an unfold may take (k_h * k_w): a 7x7 window, T2T-ViT's largest


@dataclass(frozen=True)
class _Windows:
    """Constant windows along one axis: window ``i``, position ``l`` reads ``start + i * dilation + l * stride``."""

    start: int
    dilation: int
    stride: int
    count: int  # k, the taps of a window
    length: int  # L, the windows along the axis

    def taps(self) -> list[int]:
        return [self.start + i * self.dilation for i in range(self.count)]


def _windows(index: np.ndarray | None, extent: int) -> _Windows | None:
    """The windows a Gather's constant [k, L] indices into an axis of ``extent`` pick (torch's unfold export
    computes ``arange(k)[:, None] * dilation + arange(L)[None, :] * stride``); None for other indices."""
    if index is None or index.ndim != 2 or index.size == 0 or not np.issubdtype(index.dtype, np.integer):
        return None
    count, length = index.shape
    start = int(index[0, 0])
    dilation = int(index[1, 0]) - start if count > 1 else 1
    stride = int(index[0, 1]) - start if length > 1 else 1
    expected = start + dilation * np.arange(count)[:, None] + stride * np.arange(length)[None, :]
    if dilation < 1 or stride < 1 or start < 0 or int(expected.max()) >= extent or not np.array_equal(index, expected):
        return None
    return _Windows(start, dilation, stride, count, length)


@dataclass(frozen=True)
class _Unfold:
    """An unfold's nodes (the Gathers, the Reshapes reading its Transpose), its windows along H and W, and the
    Transpose's order of the channel and tap axes (labels "c", "hk", "wk")."""

    first: NodeProto
    second: NodeProto
    reshapes: list[NodeProto]
    rows: _Windows
    cols: _Windows
    order: list[str]


def unfolds_as_slices(model: ModelProto, placed: Mapping[str, str] | None = None) -> int:
    """An unfold (im2col) of a 4-D map as torch exports ``F.unfold`` / ``nn.Unfold``: a Gather of constant
    windows [k, L] along H, one along W (giving [N, C, k_h, L_h, k_w, L_w]), a Transpose to [N, C, k_h, k_w,
    L_h, L_w] and Reshapes (to [N, C*k_h*k_w, L]). Every window element is a constant shift of the map, so
    it becomes one Slice of the map per tap (starts at the tap, steps of the stride; named
    ``<Gather>_window_<i>_<j>``), a Concat of them along the channels (named as the second Gather) and a
    Gather of channels into the order the Transpose gives (named as the Transpose; none where the order is
    already the taps' own); the Reshapes read that [N, C*k_h*k_w, L_h, L_w] map, which holds the elements in
    the same order. The BPU takes no 6-D tensor (4-D on bernoulli2); the moves keep the values and their
    grid. Only with static shapes, up to 64 taps, a Transpose keeping the windows' positions last and batch
    first, and where ``placed`` (node_info) names none of the nodes. The count of unfolds rewritten."""
    opset = _opset(model)
    if opset < 10:  # Slice steps
        return 0
    view = GraphView(model)
    replaced: dict[str, list[NodeProto]] = {}
    dropped: set[str] = set()
    for node in model.graph.node:
        found = _unfold(view, node, placed or {})
        if found is None:
            continue
        first, second, rows, cols = found.first, found.second, found.rows, found.cols
        source = first.input[0]
        channels = view.shapes[source][1]
        if rows.count * cols.count > _MAX_WINDOW_TAPS:
            continue
        pieces, nodes = [], []
        for i, row in enumerate(rows.taps()):
            for j, col in enumerate(cols.taps()):
                pieces.append(f"{second.output[0]}_window_{i}_{j}")
                ends = [row + (rows.length - 1) * rows.stride + 1, col + (cols.length - 1) * cols.stride + 1]
                nodes.append(_slice(model, opset, source, pieces[-1], [row, col], ends, [2, 3],
                                    f"{second.name}_window_{i}_{j}", steps=[rows.stride, cols.stride]))
        joined = f"{second.output[0]}_windows"
        nodes.append(helper.make_node("Concat", pieces, [joined], name=second.name, axis=1))
        # the Concat's channel (i * k_w + j) * C + c; the Transpose's order of (c, i, j) picks from it
        order = np.arange(len(pieces) * channels).reshape(rows.count, cols.count, channels)
        index = order.transpose([("hk", "wk", "c").index(label) for label in found.order]).reshape(-1)
        unfolded = joined
        if not np.array_equal(index, np.arange(index.size)):
            unfolded = f"{node.output[0]}_as_map"
            nodes.append(_channel_gather(model, joined, unfolded, index, node.name))
        for reshape in found.reshapes:
            reshape.input[0] = unfolded
        replaced[node.name] = nodes
        dropped.update((first.name, second.name))
    rewrite_nodes(model, lambda n: replaced.get(n.name, [] if n.name in dropped else None))
    return len(replaced)


def _unfold(view: GraphView, transpose: NodeProto, placed: Mapping[str, str]) \
        -> _Unfold | None:
    """The unfold whose Transpose ``transpose`` is; None where it is no such unfold's (see
    ``unfolds_as_slices``)."""
    if transpose.op_type != "Transpose" or transpose.domain not in ("", "ai.onnx"):
        return None
    second = view.producer.get(transpose.input[0])
    first = view.producer.get(second.input[0]) if second is not None else None
    chain = [n for n in (first, second, transpose) if n is not None]
    if len(chain) != 3 or any(n.op_type != op or n.domain not in ("", "ai.onnx") or n.name in placed
                              for n, op in zip(chain, ("Gather", "Gather", "Transpose"), strict=True)):
        return None
    for made, reader in ((first, second), (second, transpose)):
        if made.output[0] in view.graph_outputs or view.consumers.get(made.output[0], []) != [reader] \
                or reader.input[0] != made.output[0]:
            return None
    reshapes = view.consumers.get(transpose.output[0], [])
    if not reshapes or transpose.output[0] in view.graph_outputs or any(
            r.op_type != "Reshape" or r.input[0] != transpose.output[0] or view.const(r.input[1]) is None
            or 0 in view.const(r.input[1]).tolist() for r in reshapes):
        return None  # a 0 in a Reshape's shape copies a dim of the 6-D tensor
    shape = view.shapes.get(first.input[0])
    if view.is_const(first.input[0]) or not is_static(shape) or len(shape) != 4:
        return None
    labels = ["n", "c", "h", "w"]
    windows: dict[str, _Windows] = {}
    for gather in (first, second):
        axis = int(view.attrs(gather).get("axis", 0)) % len(labels)
        label = labels[axis]
        found = _windows(view.const(gather.input[1]), shape[2 if label == "h" else 3]) \
            if label in ("h", "w") else None
        if found is None:
            return None
        windows[label] = found
        labels[axis:axis + 1] = [f"{label}k", f"{label}l"]
    if len(labels) != 6:
        return None
    perm = list(view.attrs(transpose).get("perm", range(5, -1, -1)))
    target = [labels[p] for p in perm]
    if target[0] != "n" or target[4:] != ["hl", "wl"]:
        return None
    return _Unfold(first, second, reshapes, windows["h"], windows["w"], target[1:4])


def _fewer_axes(shape: list[int], perm: list[int]) -> tuple[list[int], list[int]]:
    """The input dims and perm of the same transpose without size-1 axes, adjacent moved axes merged."""
    kept = [a for a in range(len(shape)) if shape[a] != 1]
    index = {a: k for k, a in enumerate(kept)}
    order = [index[a] for a in perm if a in index]  # output order of the kept input axes
    groups: list[list[int]] = []  # runs of input axes that stay adjacent, in output order
    for a in order:
        if groups and groups[-1][-1] + 1 == a:
            groups[-1].append(a)
        else:
            groups.append([a])
    by_input = sorted(range(len(groups)), key=lambda g: groups[g][0])
    dims = [int(np.prod([shape[kept[a]] for a in groups[g]])) for g in by_input]
    position = {g: k for k, g in enumerate(by_input)}
    return dims, [position[g] for g in range(len(groups))]


def _joined(view: GraphView, tensor: str) -> tuple[NodeProto, list[list[int]], int, list[int] | None] | None:
    """The Concat that makes ``tensor``, directly or behind a Reshape of the axes after the joined one: the
    Concat, the static shapes it joins, the joined axis and the Reshape's shape (None without one)."""
    made = view.producer.get(tensor)
    reshape = made if made is not None and made.op_type == "Reshape" else None
    concat = view.producer.get(reshape.input[0]) if reshape is not None else made
    if concat is None or concat.op_type != "Concat" or concat.domain not in ("", "ai.onnx"):
        return None
    pieces = [view.shapes.get(i) for i in concat.input]
    if not all(s and is_static(s) for s in pieces):
        return None
    axis = view.attrs(concat)["axis"] % len(pieces[0])
    shape = None  # a Reshape may merge or split the axes after the joined one
    if reshape is not None:
        shape = view.shapes.get(reshape.output[0])
        if not (shape and is_static(shape)) or shape[:axis] != pieces[0][:axis] \
                or shape[axis] != sum(s[axis] for s in pieces):
            return None
    return concat, pieces, axis, shape


def splits_undoing_concats(model: ModelProto) -> int:
    """A Split that cuts what a Concat joined (behind a Reshape of the axes after the joined one, a
    Transpose, both or neither) at the Concat's own seams gives back the tensors joined: each Split
    output becomes its piece, reshaped and moved the same way. Also where that Concat joins, along
    another axis, Concats that all have those seams (a detection head's levels, each joining its boxes
    and scores): each Split output becomes the join of the levels' pieces. The Concats go where nothing
    else reads them. Returns how many Splits were rewritten.

    Ultralytics' end-to-end heads (YOLOv10, YOLO26) join the boxes in pixels and the class scores,
    lay them out anchor-major and split them again for the top-k. Joined, both share one quantization
    grid, whose step the pixels set: every score of a 1280x1280 YOLO26 was 0 in int8."""
    view = GraphView(model)
    outputs = set(view.graph_outputs)
    kept = outputs | {i.name for i in model.graph.input} | {t.name for t in model.graph.initializer}

    def rewrite(node: NodeProto) -> list[NodeProto] | None:
        if node.op_type != "Split" or node.domain not in ("", "ai.onnx"):
            return None
        moved = view.producer.get(node.input[0])
        transpose = moved if moved is not None and moved.op_type == "Transpose" else None
        top = _joined(view, transpose.input[0] if transpose is not None else node.input[0])
        if top is None:
            return None
        concat, pieces, axis, shape = top
        rank = len(shape or pieces[0])
        perm = list(view.attrs(transpose).get("perm", range(rank - 1, -1, -1))) if transpose is not None else None
        split_axis = view.attrs(node).get("axis", 0) % rank
        along = perm[split_axis] if perm else split_axis
        if along == axis:
            levels = [(concat, pieces, axis, shape)]
            outer = None
        elif shape is None:  # the Concat joins levels along another axis; each level must join at the seams
            levels = [_joined(view, i) for i in concat.input]
            if any(lv is None or lv[2] != along or len(lv[3] or lv[1][0]) != rank for lv in levels):
                return None
            sizes_of = [[s[along] for s in lv[1]] for lv in levels]
            if any(s != sizes_of[0] for s in sizes_of):
                return None
            outer = axis
        else:
            return None
        seams = list(itertools.accumulate(s[along] for s in levels[0][1]))
        total = seams[-1]
        given = len(node.input) > 1 and node.input[1]
        sizes = view.const(node.input[1]) if given else view.attrs(node).get("split")
        if given and sizes is None:  # computed at run time
            return None
        if sizes is None:
            if total % len(node.output):
                return None
            sizes = [total // len(node.output)] * len(node.output)
        cuts = list(itertools.accumulate(int(v) for v in sizes))
        if cuts[-1] != total or not set(cuts) <= set(seams):
            return None
        if outer is None and shape is None and perm is None:
            # a graph output that is one piece takes the piece's name, which nothing else may hold
            for out, first, end in zip(node.output, [0, *cuts[:-1]], cuts, strict=True):
                piece = [x for x, seam in zip(concat.input, seams, strict=True) if first < seam <= end]
                if out in outputs and len(piece) == 1 and (piece[0] in kept or list(concat.input).count(piece[0]) > 1):
                    return None
        new: list[NodeProto] = []
        start = 0
        for k, (out, end) in enumerate(zip(node.output, cuts, strict=True)):
            first, start = start, end
            if not out:
                continue
            steps: list[NodeProto] = []
            parts = []
            for j, (joining, _, joined_axis, reshaped) in enumerate(levels):
                tag = f"{node.name}_piece{k}" + (f"_level{j}" if outer is not None else "")
                inputs = [i for i, seam in zip(joining.input, seams, strict=True) if first < seam <= end]
                part = inputs[0]
                if len(inputs) > 1:
                    part = f"{out}_joined" + (f"{j}" if outer is not None else "")
                    steps.append(helper.make_node("Concat", inputs, [part], name=f"{tag}_concat", axis=joined_axis))
                if reshaped is not None:
                    dims = f"{tag}_shape"
                    model.graph.initializer.append(numpy_helper.from_array(
                        np.array([*reshaped[:joined_axis], end - first, *reshaped[joined_axis + 1:]], np.int64), dims))
                    steps.append(helper.make_node("Reshape", [part, dims], [f"{tag}_reshaped"], name=f"{tag}_reshape"))
                    part = steps[-1].output[0]
                parts.append(part)
            if outer is not None:
                steps.append(helper.make_node("Concat", parts, [f"{out}_levels"], name=f"{node.name}_piece{k}_levels",
                                              axis=outer))
            if perm is not None:
                steps.append(helper.make_node("Transpose", [steps[-1].output[0] if steps else parts[0]], [out],
                                              name=f"{node.name}_piece{k}", perm=perm))
            if steps:
                steps[-1].output[0] = out
            elif out in outputs:  # the piece itself, under the output's name (``_no_ops_removed`` renames it)
                steps.append(helper.make_node("Identity", [parts[0]], [out], name=f"{node.name}_piece{k}"))
            else:  # the piece itself: its readers read it
                for reader in model.graph.node:
                    reader.input[:] = [parts[0] if name == out else name for name in reader.input]
            new.extend(steps)
        return new

    count = rewrite_nodes(model, rewrite)
    if count:
        remove_dead_nodes(model)  # the Concats nothing reads now: an Identity's input then has it as only reader
    return count


def sequences_as_concats(model: ModelProto) -> int:
    """Sequences whose tensors are known when the model is built, as those tensors: a ``SequenceConstruct`` or
    ``SequenceEmpty``, a ``SplitToSequence`` with constant sizes (or none: pieces of one), and what a
    ``SequenceInsert`` / ``SequenceErase`` at a constant position makes of them; a ``SequenceAt`` of a constant
    position is that tensor, a ``SequenceLength`` a constant, and a ``ConcatFromSequence`` the ``Concat`` of the
    tensors (with ``new_axis``: of each with that axis added, as ``torch.stack``). TorchScript writes
    ``torch.split`` / ``unbind`` and list edits so, and ``torch.cat`` of a list in some exports. onnx's shape
    inference follows no sequence, so every shape after one was lost, and the BPU has no sequence op: it ran on the
    CPU between two BPU subgraphs. Sequences read by anything else stay as they are. The count of nodes rewritten."""
    view = GraphView(model)
    opset = _opset(model)
    known: dict[str, list[str]] = {}  # a sequence -> the tensors it holds
    nodes: list[NodeProto] = []
    count = 0

    def position(name: str, length: int, default: int) -> int | None:
        if not name:
            return default
        value = view.const(name)
        if value is None or value.size != 1:
            return None
        k = int(value.reshape(-1)[0])
        return k + length if k < 0 else k

    def constant(name: str, value: np.ndarray) -> str:
        model.graph.initializer.append(numpy_helper.from_array(value, name))
        return name

    for node in model.graph.node:
        nodes.append(node)
        if node.domain not in ("", "ai.onnx"):
            continue
        op, ins = node.op_type, list(node.input)
        if op == "SequenceConstruct":
            known[node.output[0]] = ins
        elif op == "SequenceEmpty":
            known[node.output[0]] = []
        elif op == "SequenceInsert" and ins[0] in known:
            held = list(known[ins[0]])
            k = position(ins[2] if len(ins) > 2 else "", len(held), len(held))
            if k is not None and 0 <= k <= len(held):
                known[node.output[0]] = [*held[:k], ins[1], *held[k:]]
        elif op == "SequenceErase" and ins[0] in known:
            held = list(known[ins[0]])
            k = position(ins[1] if len(ins) > 1 else "", len(held), len(held) - 1)
            if k is not None and 0 <= k < len(held):
                known[node.output[0]] = held[:k] + held[k + 1:]
        elif op == "SplitToSequence":
            pieces = _split_pieces(node, view, model, opset)
            if pieces is not None:
                split_nodes, names = pieces
                nodes[-1:] = [*split_nodes, node]  # the sequence node stays for any other reader
                known[node.output[0]] = names
        elif op == "SequenceAt" and ins[0] in known:
            held = known[ins[0]]
            k = position(ins[1], len(held), 0)
            if k is not None and 0 <= k < len(held):
                nodes[-1] = helper.make_node("Identity", [held[k]], list(node.output), name=node.name)
                count += 1
        elif op == "SequenceLength" and ins[0] in known:
            value = constant(f"{node.output[0]}_{node.name}_length", np.array(len(known[ins[0]]), np.int64))
            nodes[-1] = helper.make_node("Identity", [value], list(node.output), name=node.name)
            count += 1
        elif op == "ConcatFromSequence" and known.get(ins[0]):
            nodes[-1:] = _concat_of(node, known[ins[0]], view, model, opset)
            count += 1
    if count:
        del model.graph.node[:]
        model.graph.node.extend(nodes)
        remove_dead_nodes(model)  # the sequence nodes nothing reads now
    return count


def _split_pieces(node: NodeProto, view: GraphView, model: ModelProto,
                  opset: int) -> tuple[list[NodeProto], list[str]] | None:
    """A ``SplitToSequence`` of constant sizes as a ``Split`` (then a ``Squeeze`` of each piece where ``keepdims`` is
    0 and no sizes are given): its nodes and the pieces; None where the pieces are known only at run time."""
    a = view.attrs(node)
    shape = view.shapes.get(node.input[0])
    if shape is None:
        return None
    axis = int(a.get("axis", 0)) % len(shape)
    length = shape[axis]
    given = node.input[1] if len(node.input) > 1 and node.input[1] else ""
    sizes = view.const(given) if given else None
    if given and sizes is None:
        return None
    if sizes is None or sizes.ndim == 0:
        if not isinstance(length, int):
            return None
        chunk = 1 if sizes is None else int(sizes)
        sizes = np.array([chunk] * (length // chunk) + ([length % chunk] if length % chunk else []), np.int64)
    sizes = sizes.astype(np.int64).reshape(-1)
    name = node.name or node.output[0]
    pieces = [f"{node.output[0]}_{name}_piece{k}" for k in range(len(sizes))]
    if opset >= 13:
        split_sizes = f"{name}_split_sizes"
        model.graph.initializer.append(numpy_helper.from_array(sizes, split_sizes))
        split = helper.make_node("Split", [node.input[0], split_sizes], pieces, name=f"{name}_split", axis=axis)
    else:
        split = helper.make_node("Split", [node.input[0]], pieces, name=f"{name}_split", axis=axis,
                                 split=sizes.tolist())
    squeeze = not given and not int(a.get("keepdims", 1))
    if not squeeze:
        return [split], pieces
    nodes, names = [split], []
    for k, piece in enumerate(pieces):
        names.append(f"{piece}_squeezed")
        nodes.append(_axes_node(model, opset, "Squeeze", piece, names[-1], [axis], f"{name}_squeeze{k}"))
    return nodes, names


def _concat_of(node: NodeProto, parts: list[str], view: GraphView, model: ModelProto, opset: int) -> list[NodeProto]:
    """A ``ConcatFromSequence`` of a sequence holding ``parts`` as a ``Concat`` (``new_axis``: of each with it)."""
    a = view.attrs(node)
    axis, new_axis = int(a.get("axis", 0)), int(a.get("new_axis", 0))
    nodes = []
    if new_axis:  # stack: each part with the new axis first
        rank = next((len(view.shapes[t]) for t in parts if view.shapes.get(t) is not None), None)
        if rank is None and axis < 0:
            return [node]
        where = axis if axis >= 0 else axis + rank + 1
        stacked = []
        for k, t in enumerate(parts):
            stacked.append(f"{t}_{node.name}_unsqueezed{k}")
            nodes.append(_axes_node(model, opset, "Unsqueeze", t, stacked[-1], [where], f"{node.name}_unsqueeze{k}"))
        parts, axis = stacked, where
    return [*nodes, helper.make_node("Concat", parts, [node.output[0]], name=node.name, axis=axis)]
