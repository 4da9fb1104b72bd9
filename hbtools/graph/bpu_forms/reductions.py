"""Reductions in the forms the BPU has: L2 norms as sums, spatial means and maxima as global pools, reductions over the
first axis.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx
from onnx import ModelProto, NodeProto, helper, numpy_helper

from hbtools.graph.bpu_forms._common import _axes_node, _opset
from hbtools.graph.bpu_forms.rows import _UNARY
from hbtools.graph.graph import GraphView, references, rewrite_nodes
from hbtools.march.profiles import MarchProfile

_GLOBAL_POOL_OF = {"ReduceMean": "GlobalAveragePool", "ReduceMax": "GlobalMaxPool"}


def norms_as_sums(model: ModelProto, profile: MarchProfile) -> int:
    """ReduceL2 (``F.normalize``, ``torch.norm``: embedding heads, SwinV2's cosine attention) as the square
    root of a ReduceSum of ``x * x``, and ReduceSumSquare as that ReduceSum: the BPU has a product, an
    integer sum and a square-root table, and no L2 reduction. Only where ``profile``'s BPU sums (bernoulli2
    has no ReduceSum) over axes other than the batch; reductions whose axes are only known at run time
    stay. The count rewritten."""
    if profile.rule("ReduceSum") is None:
        return 0
    view = GraphView(model)
    opset = _opset(model)
    nodes = []
    count = 0
    for node in model.graph.node:
        axes = view.reduced_axes(node) if node.op_type in ("ReduceL2", "ReduceSumSquare") \
            and node.domain in ("", "ai.onnx") and view.elem_types.get(node.input[0]) == onnx.TensorProto.FLOAT \
            else None
        if not axes or 0 in axes:
            nodes.append(node)
            continue
        count += 1
        square, total = f"{node.output[0]}_squares", f"{node.output[0]}_sum_of_squares"
        keepdims = int(view.attrs(node).get("keepdims", 1))
        summed = node.output[0] if node.op_type == "ReduceSumSquare" else total
        nodes.append(helper.make_node("Mul", [node.input[0], node.input[0]], [square], name=f"{node.name}_square"))
        nodes.append(_axes_node(model, opset, "ReduceSum", square, summed, axes, f"{node.name}_sum", keepdims=keepdims))
        if node.op_type == "ReduceL2":
            nodes.append(helper.make_node("Sqrt", [total], [node.output[0]], name=node.name))
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return count


def spatial_reductions_as_global_pools(model: ModelProto) -> None:
    """A mean or max over the two spatial axes of a 4-D tensor (``x.mean((2, 3))``, the squeeze of
    squeeze-and-excitation blocks in PyTorch and Paddle exports) as GlobalAveragePool /
    GlobalMaxPool, the BPU's pooling ops; without ``keepdims`` a Flatten follows, which gives
    the same [N, C]. The other way round for a global pool of a 3-D or 5-D tensor, which the BPU
    takes as a reduction only."""
    view = GraphView(model)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
    nodes = []
    for node in model.graph.node:
        pool = _GLOBAL_POOL_OF.get(node.op_type) if node.domain in ("", "ai.onnx") else None
        if node.op_type in _REDUCTION_OF and node.domain in ("", "ai.onnx"):
            nodes.extend(_global_pool_as_reduction(node, view, opset, model))
            continue
        if pool is None:
            nodes.append(node)
            continue
        shape = view.shapes.get(node.input[0])
        if shape is None or len(shape) != 4 or view.reduced_axes(node) != [2, 3]:
            nodes.append(node)
            continue
        if view.attrs(node).get("keepdims", 1):
            nodes.append(helper.make_node(pool, [node.input[0]], [node.output[0]], name=node.name))
            continue
        # the pool keeps the name: the Flatten is a part written for the user's node, and said to be where it
        # stays on the CPU (it was the ReduceMean's name typed Flatten, an op the user's model does not have)
        pooled = f"{node.output[0]}_pooled"
        nodes.append(helper.make_node(pool, [node.input[0]], [pooled], name=node.name))
        nodes.append(helper.make_node("Flatten", [pooled], [node.output[0]], name=f"{node.name}_flatten", axis=1))
    del model.graph.node[:]
    model.graph.node.extend(nodes)


_AXIS_POOL_OF = {"ReduceMean": "AveragePool", "ReduceMax": "MaxPool"}
_FLOAT_TYPES = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE)  # those pools take


def axis_reductions_as_pools(model: ModelProto, profile: MarchProfile) -> int:
    """A mean or a max over one spatial axis of a 4-D map (a CRNN's height collapse, ``x.mean(2)``; PointPillars'
    max over the points of each pillar, ``x.max(3)``) as an AveragePool or MaxPool over whole columns (or rows),
    where the BPU pools but has no such reduction (RDK X3): it went to the CPU and split the model in two. Without
    ``keepdims`` a Squeeze of that axis follows. A pool larger than the march takes is cut in steps later
    (``large_average_pools_in_steps``, ``large_max_pools_in_steps``): the same values (the mean up to float
    rounding). The count."""
    kinds = {op: pool for op, pool in _AXIS_POOL_OF.items()
             if profile.rule(op) is None and profile.rule(pool) is not None}
    if not kinds:
        return 0
    view = GraphView(model)
    nodes = []
    count = 0
    for node in model.graph.node:
        shape = view.shapes.get(node.input[0]) if node.op_type in kinds and node.domain in ("", "ai.onnx") and \
            len(node.output) == 1 and view.elem_types.get(node.input[0]) in _FLOAT_TYPES else None
        axes = view.reduced_axes(node) if shape is not None and len(shape) == 4 else None
        if axes not in ([2], [3]) or not isinstance(shape[axes[0]], int) or shape[axes[0]] < 1:
            nodes.append(node)
            continue
        kernel = [shape[2], 1] if axes == [2] else [1, shape[3]]
        keep = view.attrs(node).get("keepdims", 1)
        pooled = node.output[0] if keep else f"{node.output[0]}_pooled"
        nodes.append(helper.make_node(kinds[node.op_type], [node.input[0]], [pooled], name=node.name,
                                      kernel_shape=kernel, strides=kernel))
        if not keep:
            nodes.append(_axes_node(model, _opset(model), "Squeeze", pooled, node.output[0], axes,
                                    f"{node.name or node.output[0]}_squeeze"))
        count += 1
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return count


_REDUCTION_OF = {pool: reduction for reduction, pool in _GLOBAL_POOL_OF.items()}
_BROADCASTS = ("Add", "Sub", "Mul", "Div")
# Element-wise ops of two inputs that broadcast: between values of one element, the result has one element too
_SCALAR_BINARY = ("Add", "Sub", "Mul", "Div", "Pow", "Max", "Min")


def scalar_reductions_kept_as_maps(model: ModelProto) -> int:
    """A reduction of a tensor over all its axes to a scalar, in the forms exporters write it, as the same
    reduction with ``keepdims=1`` over all but the batch axis where the batch is one: [1, 1, 1, 1] broadcasts as
    the scalar does, the batch of one needs no reducing, and the BPU's reductions keep the batch axis and take no
    0-D tensor, so the reduction and the division ran on the CPU. The forms: ``keepdims=0`` (TorchScript's
    ``f / torch.mean(f ** 2)``: LPRNet's global context) where only element-wise ops read the scalar against
    tensors of at least its input's rank; ``keepdims=1`` over all axes (``f.mean(dim=(0, 1, 2, 3), keepdim=True)``);
    and ``keepdims=1`` then a Squeeze to 0-D (the dynamo exporter's ``torch.mean``), whose Squeeze is left out
    where only such element-wise ops read it (``unit_squeezes_into_broadcasts``). Also any other reduction with
    ``keepdims=1`` over the batch axis of one and more axes (``x.mean((0, 2, 3), keepdim=True)``) is taken over
    the other axes alone. Every Reduce* op: a reduction over an axis of one element leaves each value as it is.
    Returns how many reductions it rewrote."""
    unit_squeezes_into_broadcasts(model)
    view = GraphView(model)
    count = 0
    for node in model.graph.node:
        shape = view.shapes.get(node.input[0]) if node.op_type.startswith("Reduce") and \
            node.domain in ("", "ai.onnx") and node.input else None
        axes = view.reduced_axes(node) if shape is not None and len(shape) >= 2 else None
        if not axes or 0 not in axes:
            continue
        kept = view.attrs(node).get("keepdims", 1)
        # a batch of more than one (or unknown) needs reducing; over a batch of one alone the reduction copies
        if kept and (shape[0] != 1 or len(axes) == 1):
            continue
        chain = None if kept or len(axes) < len(shape) else _broadcast_chain(node.output[0], len(shape), view)
        if not kept and chain is None:
            continue
        _forget_shapes(model, [node.output[0], *(chain or [])])
        for attr in node.attribute:
            if attr.name == "keepdims":
                attr.i = 1
        if shape[0] == 1:  # the batch of one needs no reducing, and the BPU's reductions keep the batch axis
            _set_axes(model, node, [a for a in axes if a])
        count += 1
    return count


def unit_squeezes_into_broadcasts(model: ModelProto) -> int:
    """Leave out each Squeeze of a tensor of one element ([1, 1, 1, 1] to the 0-D scalar: the dynamo exporter's
    ``torch.mean(x)`` is a ReduceMean with ``keepdims=1`` and this Squeeze) whose value reaches, through
    element-wise ops with other scalars (``+ eps``, a square root), only element-wise ops (Add, Sub, Mul, Div)
    against tensors of at least its input's rank (``_broadcast_chain``): they broadcast the unsqueezed value to
    the same shape and values, and the BPU takes no 0-D tensor. Not where the Squeeze or a tensor of the chain is
    a graph output. Returns how many it left out."""
    view = GraphView(model)
    dropped = []
    for node in model.graph.node:
        shape = view.shapes.get(node.input[0]) if node.op_type == "Squeeze" and node.domain in ("", "ai.onnx") \
            and node.input else None
        chain = None if not shape or any(d != 1 for d in shape) \
            else _broadcast_chain(node.output[0], len(shape), view)
        if chain is None:
            continue
        for reader in view.consumers[node.output[0]]:
            reader.input[:] = [node.input[0] if name == node.output[0] else name for name in reader.input]
        _forget_shapes(model, chain)
        dropped.append(node)
    for node in dropped:
        model.graph.node.remove(node)
    return len(dropped)


def _broadcast_chain(name: str, rank: int, view: GraphView) -> list[str] | None:
    """The tensors element-wise ops compute from ``name`` (a value of one element) with other values of one
    element and at most ``rank`` axes (``x.abs().mean() + 1e-6``, a square root of that), where every path ends
    in an Add, Sub, Mul or Div against a tensor of ``rank`` axes or more. Then a ``rank``-D ``name`` of one
    element makes each tensor of the chain ``rank``-D of one element, and the ops at the ends give the same
    output shapes and values. None where a path ends anywhere else: another op, a graph output, a sub-graph
    reading a tensor by name. An empty list: ``name`` is read by such ends alone."""
    outputs = set(view.graph_outputs)
    by_name = {t for n in view.model.graph.node if _has_subgraph(n) for t in references(n)}

    def one_element(t: str) -> bool:
        shape = view.shapes.get(t)
        return shape is not None and len(shape) <= rank and all(d == 1 for d in shape)

    chain: list[str] = []
    todo = [name]
    while todo:
        t = todo.pop()
        readers = view.consumers.get(t, [])
        if not readers or t in outputs or t in by_name:
            return None
        for r in readers:
            others = [i for i in r.input if i and i != t]
            if r.domain not in ("", "ai.onnx"):
                return None
            if r.op_type in _BROADCASTS and any(len(view.shapes.get(i) or []) >= rank for i in others):
                continue  # an end: the output has the other operand's shape either way
            if r.op_type not in (*_UNARY, *_SCALAR_BINARY) or not all(one_element(i) for i in others):
                return None
            fresh = [o for o in r.output if o and o not in chain]
            chain.extend(fresh)
            todo.extend(fresh)
    return chain


def _forget_shapes(model: ModelProto, names: list[str]) -> None:
    """Drop the declared shapes of tensors a rewrite gave more axes (the dynamo exporter declares every one):
    inference would otherwise start from the old ones."""
    stale = set(names)
    kept = [vi for vi in model.graph.value_info if vi.name not in stale]
    if len(kept) < len(model.graph.value_info):
        del model.graph.value_info[:]
        model.graph.value_info.extend(kept)


def _has_subgraph(node: NodeProto) -> bool:
    return any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute)


def _set_axes(model: ModelProto, node: NodeProto, axes: list[int]) -> None:
    """Set a Reduce* node's axes: its input from opset 18 (ReduceSum's from 13), its attribute before."""
    opset = _opset(model)
    if opset >= 18 or (node.op_type == "ReduceSum" and opset >= 13):  # axes as an input
        name = f"{node.name or node.output[0]}_all_but_batch"
        model.graph.initializer.append(numpy_helper.from_array(np.array(axes, np.int64), name))
        del node.input[1:]
        node.input.append(name)
    else:
        kept = [a for a in node.attribute if a.name != "axes"]
        del node.attribute[:]
        node.attribute.extend([*kept, helper.make_attribute("axes", axes)])


def reductions_over_the_first_axis(model: ModelProto) -> int:
    """A ReduceMean / ReduceSum whose axes include the first axis of a tensor that has more than one element
    along it (a model without a batch axis: madmom's TCN averages its [T, C] skip sums over the T frames for
    the tempo) behind an Unsqueeze that adds a batch of one, with the axes moved by one and a Squeeze of that
    batch after it: the same values, but the BPU's pools never reduce over the batch axis, so the reduction
    and everything before it that fed only it ran on the CPU. Returns how many it rewrote."""
    view = GraphView(model)
    return rewrite_nodes(model, lambda node: _first_axis_reduction(node, view, _opset(model), model))


def _first_axis_reduction(node: NodeProto, view: GraphView, opset: int, model: ModelProto) -> list[NodeProto] | None:
    shape = view.shapes.get(node.input[0]) if node.op_type in ("ReduceMean", "ReduceSum") \
        and node.domain in ("", "ai.onnx") else None
    axes = view.reduced_axes(node) if shape is not None else None
    if axes is None or 0 not in axes or not 1 <= len(shape) <= 4 or not isinstance(shape[0], int) or shape[0] <= 1:
        return None
    batched, reduced = f"{node.input[0]}_{node.name}_batched", f"{node.output[0]}_{node.name}_batched"
    moved = [a + 1 for a in axes]
    keepdims = int(view.attrs(node).get("keepdims", 1))
    nodes = [_axes_node(model, opset, "Unsqueeze", node.input[0], batched, [0], f"{node.name}_batch")]
    # ReduceSum takes its axes as an input from opset 13, ReduceMean from opset 18
    if opset >= (13 if node.op_type == "ReduceSum" else 18):
        axes_name = f"{node.name}_batched_axes"
        model.graph.initializer.append(numpy_helper.from_array(np.array(moved, np.int64), axes_name))
        nodes.append(helper.make_node(node.op_type, [batched, axes_name], [reduced], name=node.name,
                                      keepdims=keepdims))
    else:
        nodes.append(helper.make_node(node.op_type, [batched], [reduced], name=node.name, axes=moved,
                                      keepdims=keepdims))
    nodes.append(_axes_node(model, opset, "Squeeze", reduced, node.output[0], [0], f"{node.name}_unbatch"))
    return nodes


def _global_pool_as_reduction(node: NodeProto, view: GraphView, opset: int, model: ModelProto) -> list[NodeProto]:
    """A GlobalAveragePool / GlobalMaxPool of a 3-D [N, C, L] or 5-D tensor (PyTorch's AdaptiveAvgPool1d(1)
    and AdaptiveMaxPool1d(1) after Conv1d layers, Conv3d heads), which the BPU's pools take 4-D only, as
    the ReduceMean / ReduceMax over the same axes (keepdims) that it is; other nodes unchanged."""
    shape = view.shapes.get(node.input[0])
    if shape is None or len(shape) not in (3, 5):
        return [node]
    axes = list(range(2, len(shape)))
    reduction = _REDUCTION_OF[node.op_type]
    if opset < 18:
        return [helper.make_node(reduction, [node.input[0]], list(node.output), name=node.name, axes=axes, keepdims=1)]
    axes_name = f"{node.name}_axes"
    model.graph.initializer.append(numpy_helper.from_array(np.array(axes, dtype=np.int64), axes_name))
    return [helper.make_node(reduction, [node.input[0], axes_name], list(node.output), name=node.name, keepdims=1)]


def channel_reductions_as_convs(model: ModelProto, profile: MarchProfile,
                                placed: Mapping[str, str] | None = None) -> int:
    """A ReduceMean / ReduceSum over the channels of a 4-D map with keepdims (a stereo net's correlation
    ``(left * shifted_right).mean(1, keepdim=True)``) as the 1x1 Conv to one channel with the constant weight
    1/C (1 for a sum): the same sum, in an op the BPU has, where ``profile``'s BPU has no such reduction
    (bernoulli2) and its Conv takes the C channels. The weights are all one value, exact on their int8 grid.
    Without keepdims too where the one reader is an Unsqueeze or Reshape back to [N, 1, H, W]
    (``x.sum(1).unsqueeze(1)``): the Conv writes that reader's output, the same values in the same order.
    Not where node_info puts the reduction on the CPU. Returns how many it rewrote."""
    conv = profile.rule("Conv")
    kinds = [op for op in ("ReduceMean", "ReduceSum") if profile.rule(op) is None]
    if conv is None or not kinds or not conv.ranks[0] <= 4 <= conv.ranks[1]:
        return 0
    view = GraphView(model)
    named = placed or {}
    restored: dict[str, NodeProto] = {}  # a reduction's output -> the reader that gives its axis back
    dropped: set[str] = set()  # those readers' outputs

    def restoring_reader(node: NodeProto, shape: list[int | None]) -> NodeProto | None:
        """The Unsqueeze / Reshape that alone reads ``node``'s output and writes the keepdims shape."""
        readers = view.consumers.get(node.output[0], [])
        if len(readers) != 1 or node.output[0] in view.graph_outputs:
            return None
        reader = readers[0]
        kept = [shape[0], 1, *shape[2:]]
        if reader.op_type not in ("Unsqueeze", "Reshape") or reader.domain not in ("", "ai.onnx") or \
                reader.input[0] != node.output[0] or named.get(reader.name) == "CPU" or \
                view.shapes.get(reader.output[0]) != kept or not all(isinstance(d, int) for d in kept):
            return None
        return reader

    def reducible(node: NodeProto) -> list[int | None] | None:
        shape = view.shapes.get(node.input[0]) if node.op_type in kinds and node.domain in ("", "ai.onnx") \
            and named.get(node.name) != "CPU" and view.elem_types.get(node.input[0]) == onnx.TensorProto.FLOAT \
            else None
        if shape is None or len(shape) != 4 or not isinstance(shape[1], int) or view.reduced_axes(node) != [1] \
                or (conv.channels is not None and shape[1] > conv.channels):
            return None
        return shape

    for node in model.graph.node:
        shape = reducible(node)
        reader = restoring_reader(node, shape) if shape is not None and not view.attrs(node).get("keepdims", 1) \
            else None
        if reader is not None:
            restored[node.output[0]] = reader
            dropped.add(reader.output[0])

    def as_conv(node: NodeProto) -> list[NodeProto] | None:
        if node.output and node.output[0] in dropped:
            return []
        shape = reducible(node)
        if shape is None or not (view.attrs(node).get("keepdims", 1) or node.output[0] in restored):
            return None
        weight = f"{node.name}_channel_weights"
        value = 1 / shape[1] if node.op_type == "ReduceMean" else 1.0
        model.graph.initializer.append(numpy_helper.from_array(np.full((1, shape[1], 1, 1), value, np.float32),
                                                               weight))
        out = restored[node.output[0]].output[0] if node.output[0] in restored else node.output[0]
        return [helper.make_node("Conv", [node.input[0], weight], [out], name=node.name, kernel_shape=[1, 1])]

    return rewrite_nodes(model, as_conv) - len(dropped)


def lp_normalizations_as_divisions(model: ModelProto) -> int:
    """ONNX's ``LpNormalization`` of an embedding [N, C] (exporters other than torch write its normalisation so) as the
    division by the norm that ``F.normalize`` exports: ``x / max(sqrt(sum(x * x)), tiny)`` over its axis (``p=1``:
    ``sum(|x|)``), whose parts the BPU has; the op itself ran on the CPU. Where the norm is 0 (x is) the result is
    0, as onnxruntime's kernel gives. The count rewritten."""
    view = GraphView(model)
    opset = _opset(model)

    def rewrite(node: NodeProto) -> list[NodeProto] | None:
        shape = view.shapes.get(node.input[0])
        # an embedding [N, C] only: a per-pixel norm of a map reaches near-zero pixels, whose reciprocal no table
        # holds (held-out error 0.07 -> 0.91 on unit vectors, even all int16: hunt 50 D2), and stays in float
        if node.op_type != "LpNormalization" or node.domain not in ("", "ai.onnx") or shape is None or len(shape) != 2:
            return None
        a = view.attrs(node)
        p, axis = int(a.get("p", 2)), int(a.get("axis", -1)) % len(shape)
        if p not in (1, 2):
            return None
        x, name = node.input[0], node.name or node.output[0]
        tiny = f"{name}_tiny"
        model.graph.initializer.append(numpy_helper.from_array(np.array(np.finfo(np.float32).tiny, np.float32), tiny))
        nodes = [helper.make_node("Mul", [x, x], [f"{name}_squares"], name=f"{name}_squares") if p == 2 else
                 helper.make_node("Abs", [x], [f"{name}_squares"], name=f"{name}_abs"),
                 _axes_node(model, opset, "ReduceSum", f"{name}_squares", f"{name}_sum", [axis], f"{name}_sum",
                            keepdims=1)]
        total = f"{name}_sum"
        if p == 2:
            nodes.append(helper.make_node("Sqrt", [total], [f"{name}_norm"], name=f"{name}_sqrt"))
            total = f"{name}_norm"
        nodes += [helper.make_node("Max", [total, tiny], [f"{name}_norm_tiny"], name=f"{name}_tiny"),
                  helper.make_node("Div", [x, f"{name}_norm_tiny"], list(node.output), name=node.name)]
        return nodes

    return rewrite_nodes(model, rewrite)
