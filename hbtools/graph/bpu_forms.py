"""Exporter patterns in forms the BPU takes (the optimize stage's rewrites).

Each function rewrites a model in place. The new nodes compute the same values as the
pattern (float results agree to float32 rounding): sums in another order, the same data
moved another way. docs/checker.md lists them with the exports they come from.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping

import numpy as np
import onnx
from onnx import ModelProto, NodeProto, helper, numpy_helper

from hbtools.graph.graph import GraphView, is_static, remove_dead_nodes, rewrite_nodes
from hbtools.graph.model_io import default_opset
from hbtools.march.profiles import MarchProfile
from hbtools.ops import int_kernels
from hbtools.runtime.session import ort_session

_GLOBAL_POOL_OF = {"ReduceMean": "GlobalAveragePool", "ReduceMax": "GlobalMaxPool"}
PAD_BLOCK_ELEMENTS = 1 << 22  # a constant block a Pad may become (16 MB of float32)


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
        pooled = f"{node.output[0]}_pooled"
        nodes.append(helper.make_node(pool, [node.input[0]], [pooled], name=f"{node.name}_pool"))
        nodes.append(helper.make_node("Flatten", [pooled], [node.output[0]], name=node.name, axis=1))
    del model.graph.node[:]
    model.graph.node.extend(nodes)


_REDUCTION_OF = {pool: reduction for reduction, pool in _GLOBAL_POOL_OF.items()}


def _axes_node(model: ModelProto, opset: int, op_type: str, src: str, dst: str, axes: list[int],
               name: str, **attrs: object) -> NodeProto:
    """An Unsqueeze / Squeeze / ReduceSum of ``axes``: an attribute before opset 13, an input (a constant added
    to ``model``) from it."""
    if opset < 13:
        return helper.make_node(op_type, [src], [dst], name=name, axes=axes, **attrs)
    model.graph.initializer.append(numpy_helper.from_array(np.array(axes, np.int64), f"{name}_axes"))
    return helper.make_node(op_type, [src, f"{name}_axes"], [dst], name=name, **attrs)


def _opset(model: ModelProto) -> int:
    return default_opset(model) or 13


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


def matmuls_of_vectors(model: ModelProto) -> int:
    """A MatMul with a 1-D operand (a [C] mean over the frames of a batchless model times a [C, N] weight,
    a [K, N] matrix times a [K] vector) as the MatMul of its 2-D form between an Unsqueeze and a Squeeze,
    as ONNX defines it: a 1-D first input becomes [1, K], a 1-D second input [K, 1], and that axis of one
    leaves the product again. The BPU takes 2-D to 5-D tensors only, so the 1-D form put the MatMul, and
    what fed only it, on the CPU. The Squeeze of a batch of one that a following element-wise chain and the
    next vector's Unsqueeze bracket goes in batch_squeezes_around_elementwise. A constant vector is stored
    in its 2-D form. Returns how many it rewrote."""
    view = GraphView(model)
    return rewrite_nodes(model, lambda node: _matmul_of_vectors(node, view, _opset(model), model))


def matmuls_with_the_weight_second(model: ModelProto, profile: MarchProfile) -> int:
    """A MatMul of a constant and a float activation in forms the BPU's MatMul with a [K, N] weight takes:
    a constant with leading axes of one (``nn.Parameter(torch.zeros(1, n, c))``, learned queries) as its
    2-D matrix, where the activation has at least its rank (the product's rank stays); a constant first
    operand (``q @ k.T`` of learned queries: DETR, attention pooling, Q-Former) as
    ``(X^T @ A^T)^T`` with Transposes of the activation's last two axes, where ``profile``'s BPU has that
    Transpose (bernoulli2's converts between NCHW and NHWC only: there the Transposes would split the BPU
    graph around the MatMul). The count rewritten."""
    view = GraphView(model)
    return rewrite_nodes(model, lambda node: _weight_second(node, view, model, profile))


def _swap_on_bpu(profile: MarchProfile, rank: int) -> bool:
    """Whether ``profile``'s BPU runs a Transpose of the last two axes of a rank-``rank`` tensor."""
    rule = profile.rule("Transpose")
    perm = (*range(rank - 2), rank - 1, rank - 2)
    return rule is not None and (rule.perms is None or perm in rule.perms)


def _weight_second(node: NodeProto, view: GraphView, model: ModelProto,
                   profile: MarchProfile) -> list[NodeProto] | None:
    if node.op_type != "MatMul" or node.domain not in ("", "ai.onnx") or len(node.input) != 2:
        return None
    first, second = node.input
    k = 0 if view.is_const(first) and not view.is_const(second) else \
        1 if view.is_const(second) and not view.is_const(first) else None
    if k is None:
        return None
    weight, x = view.const(node.input[k]), node.input[1 - k]
    shape = view.shapes.get(x)
    if weight.ndim < 2 or shape is None or len(shape) < max(weight.ndim, 2) or any(d != 1 for d in weight.shape[:-2]) \
            or view.elem_types.get(x) != onnx.TensorProto.FLOAT or (k == 1 and weight.ndim == 2) \
            or (k == 0 and not _swap_on_bpu(profile, len(shape))):
        return None
    matrix = weight.reshape(weight.shape[-2:])
    name = f"{node.input[k]}_{node.name}_matrix"
    model.graph.initializer.append(numpy_helper.from_array(matrix if k == 1 else np.ascontiguousarray(matrix.T), name))
    if k == 1:
        return [helper.make_node("MatMul", [x, name], [node.output[0]], name=node.name)]
    perm = [*range(len(shape) - 2), len(shape) - 1, len(shape) - 2]
    xt, yt = f"{node.output[0]}_{node.name}_xt", f"{node.output[0]}_{node.name}_yt"
    return [helper.make_node("Transpose", [x], [xt], name=f"{node.name}_xt", perm=perm),
            helper.make_node("MatMul", [xt, name], [yt], name=node.name),
            helper.make_node("Transpose", [yt], [node.output[0]], name=f"{node.name}_yt", perm=perm)]


def _matmul_of_vectors(node: NodeProto, view: GraphView, opset: int, model: ModelProto) -> list[NodeProto] | None:
    shapes = [view.shapes.get(i) for i in node.input] if node.op_type == "MatMul" \
        and node.domain in ("", "ai.onnx") else []
    if len(shapes) != 2 or any(s is None for s in shapes) or not any(len(s) == 1 for s in shapes) \
            or not all(1 <= len(s) <= 5 for s in shapes):
        return None
    nodes = []
    inputs = list(node.input)
    for k, (tensor, shape) in enumerate(zip(node.input, shapes, strict=True)):
        if len(shape) != 1:
            continue
        side = "row" if k == 0 else "column"
        matrix = f"{tensor}_{node.name}_{side}"
        if view.is_const(tensor):
            c = view.const(tensor)
            model.graph.initializer.append(numpy_helper.from_array(c[None] if k == 0 else c[:, None], matrix))
        else:
            nodes.append(_axes_node(model, opset, "Unsqueeze", tensor, matrix, [k], f"{node.name}_{side}"))
        inputs[k] = matrix
    # the product's rank: the longer operand's, the vector's axis of one kept
    rank = max(max(len(s) for s in shapes), 2)
    squeezed = ([rank - 2] if len(shapes[0]) == 1 else []) + ([rank - 1] if len(shapes[1]) == 1 else [])
    product = f"{node.output[0]}_{node.name}_2d"
    nodes.append(helper.make_node("MatMul", inputs, [product], name=node.name))
    nodes.append(_axes_node(model, opset, "Squeeze", product, node.output[0], squeezed, f"{node.name}_vector"))
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


def pools_over_one_axis_as_2d(model: ModelProto) -> int:
    """A MaxPool / AveragePool over the one axis of a 3-D [N, C, L] tensor (PyTorch's MaxPool1d after Conv1d
    layers: atspm-detector's traffic-signal net) as the same pool over [N, C, 1, L] between an Unsqueeze and
    a Squeeze of that axis: kernel, stride, dilation and pads of the length axis, one row on the other. The
    BPU's pools take 4-D tensors only, so the pool, and the activation before it that fed only it, ran on the
    CPU. Returns how many it rewrote."""
    view = GraphView(model)
    return rewrite_nodes(model, lambda node: _pool_as_2d(node, view, _opset(model), model))


def _pool_as_2d(node: NodeProto, view: GraphView, opset: int, model: ModelProto) -> list[NodeProto] | None:
    shape = view.shapes.get(node.input[0]) if node.op_type in ("MaxPool", "AveragePool") \
        and node.domain in ("", "ai.onnx") else None
    if shape is None or len(shape) != 3 or len([o for o in node.output if o]) != 1:
        return None
    a = view.attrs(node)
    attrs = {"kernel_shape": [1, *a["kernel_shape"]]}
    for key, one in (("strides", 1), ("dilations", 1)):
        if key in a:
            attrs[key] = [one, *a[key]]
    if "pads" in a:
        attrs["pads"] = [0, a["pads"][0], 0, a["pads"][1]]
    others = [x for x in node.attribute if x.name not in attrs]
    wide, pooled = f"{node.input[0]}_{node.name}_2d", f"{node.output[0]}_{node.name}_2d"
    pool = helper.make_node(node.op_type, [wide], [pooled], name=node.name, **attrs)
    pool.attribute.extend(others)
    return [_axes_node(model, opset, "Unsqueeze", node.input[0], wide, [2], f"{node.name}_to_2d"), pool,
            _axes_node(model, opset, "Squeeze", pooled, node.output[0], [2], f"{node.name}_from_2d")]


_AUTO_PAD_OPS = ("Conv", "AveragePool", "MaxPool", "LpPool")


def auto_pads_as_pads(model: ModelProto) -> int:
    """``auto_pad`` SAME_UPPER / SAME_LOWER / VALID (TensorFlow exports) of a Conv or pool over a map of
    static size as the explicit ``pads`` it stands for, so the rewrites and integer kernels after
    this, which read ``pads``, see the node's real padding. The count of nodes rewritten.

    A pool under SAME ignores ``ceil_mode`` (its output is ceil(size / stride) either way), so that
    goes too; under VALID it keeps it. A dilated SAME pool keeps its auto_pad: onnxruntime pads it for
    the undilated kernel, the spec for the dilated one, and either choice would change a model that
    runs as exported; so does a SAME pool that onnxruntime crops (``_pool_crops``)."""
    view = GraphView(model)
    count = 0
    for node in model.graph.node:
        if node.op_type not in _AUTO_PAD_OPS or node.domain not in ("", "ai.onnx"):
            continue
        a = view.attrs(node)
        auto = a.get("auto_pad", b"NOTSET")
        auto = auto.decode() if isinstance(auto, bytes) else auto
        shape = view.shapes.get(node.input[0])
        w = view.const(node.input[1]) if node.op_type == "Conv" and len(node.input) > 1 else None
        kernel = list(a["kernel_shape"]) if "kernel_shape" in a else list(w.shape[2:]) if w is not None else None
        if auto in ("", "NOTSET") or shape is None or kernel is None or len(shape) != len(kernel) + 2 \
                or any(not isinstance(d, int) or d <= 0 for d in shape[2:]):
            continue
        spatial = len(kernel)
        dilations = list(a.get("dilations") or [1] * spatial)
        strides = list(a.get("strides") or [1] * spatial)
        if node.op_type != "Conv" and auto != "VALID" and (any(d != 1 for d in dilations)
                                                            or _pool_crops(auto, shape[2:], kernel, strides)):
            continue
        begin, end = int_kernels.resolve_pads(auto, list(shape[2:]), kernel, strides, dilations, None)
        gone = ("auto_pad", "pads") if auto == "VALID" else ("auto_pad", "pads", "ceil_mode")
        kept = [x for x in node.attribute if x.name not in gone]
        del node.attribute[:]
        node.attribute.extend([*kept, helper.make_attribute("pads", [*begin, *end])])
        count += 1
    return count


def conv_transpose_output_shapes_as_pads(model: ModelProto) -> int:
    """A ConvTranspose's ``output_shape`` (tf2onnx writes it for Keras' Conv2DTranspose) as the explicit
    ``pads`` (and ``output_padding``) that give the same output, so the quantized op, which reads those,
    computes what the float model computes. The count of nodes rewritten.

    onnxruntime and the ONNX text disagree on which side takes an odd padding: the candidates are
    checked against onnxruntime on the node's own weight, and a node none of them matches stays as it is.
    """
    view = GraphView(model)
    count = 0
    for node in model.graph.node:
        if node.op_type != "ConvTranspose" or node.domain not in ("", "ai.onnx"):
            continue
        a = view.attrs(node)
        w = view.const(node.input[1]) if len(node.input) > 1 else None
        shape = view.shapes.get(node.input[0])
        if "output_shape" not in a or w is None or shape is None or len(shape) != w.ndim \
                or any(not isinstance(d, int) or d <= 0 for d in shape):
            continue
        spatial = w.ndim - 2
        kernel = list(a.get("kernel_shape") or w.shape[2:])
        strides = list(a.get("strides") or [1] * spatial)
        dilations = list(a.get("dilations") or [1] * spatial)
        extra = list(a.get("output_padding") or [0] * spatial)
        wanted = list(a["output_shape"])[-spatial:]
        total = [s * (n - 1) + e + (k - 1) * d + 1 - o
                 for n, s, e, k, d, o in zip(shape[2:], strides, extra, kernel, dilations, wanted, strict=True)]
        if any(t < 0 for t in total):
            continue
        kept = [x for x in node.attribute if x.name not in ("output_shape", "pads", "auto_pad")]
        for first in (lambda t: t // 2, lambda t: t - t // 2):
            pads = [*(first(t) for t in total), *(t - first(t) for t in total)]
            candidate = [*kept, helper.make_attribute("pads", pads)]
            if _same_conv_transpose(node, candidate, shape, w, view.const(node.input[2]) if len(node.input) > 2
                                    and node.input[2] else None):
                del node.attribute[:]
                node.attribute.extend(candidate)
                count += 1
                break
    return count


def _same_conv_transpose(node: NodeProto, attributes: list, shape: list[int], weight: np.ndarray,
                         bias: np.ndarray | None) -> bool:
    """Whether ConvTranspose ``node`` with ``attributes`` instead of its own gives, in onnxruntime, its output."""
    inputs = [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, shape)]
    inits = [numpy_helper.from_array(weight.astype(np.float32), "w")]
    names = ["x", "w"]
    if bias is not None:
        inits.append(numpy_helper.from_array(bias.astype(np.float32), "b"))
        names.append("b")
    nodes = [helper.make_node("ConvTranspose", names, ["own"]), helper.make_node("ConvTranspose", names, ["new"])]
    nodes[0].attribute.extend(node.attribute)
    nodes[1].attribute.extend(attributes)
    outputs = [helper.make_tensor_value_info(k, onnx.TensorProto.FLOAT, None) for k in ("own", "new")]
    probe = helper.make_model(helper.make_graph(nodes, "probe", inputs, outputs, inits),
                              opset_imports=[helper.make_opsetid("", 13)])
    probe.ir_version = 8
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    try:
        own, new = ort_session(probe).run(None, {"x": x})
    except Exception:  # noqa: BLE001 - a candidate onnxruntime refuses is not the node's form
        return False
    return own.shape == new.shape and bool(np.allclose(own, new, rtol=1e-5, atol=1e-6 * float(np.abs(own).max() + 1)))


def _pool_crops(auto_pad: str, sizes: list[int], kernel: list[int], strides: list[int]) -> bool:
    """A SAME pool whose kernel is smaller than its stride: onnxruntime does not clamp the padding it needs
    at zero, and a negative begin padding skips the map's first rows, which no ``pads`` express."""
    for size, k, s in zip(sizes, kernel, strides, strict=True):
        needed = (-(-size // s) - 1) * s + k - size
        halved = needed if auto_pad == "SAME_UPPER" else needed + 1
        if int(halved / 2) < 0:  # C++ division, towards zero
            return True
    return False


def channel_shuffles_as_gathers(model: ModelProto, placed: Mapping[str, str] | None = None) -> int:
    """A Reshape -> Transpose -> Reshape chain that gives back its 4-D input's shape with only the channels
    reordered (ShuffleNet's channel shuffle through [N, g, C/g, H, W], Caffe's ShuffleChannel) becomes one
    Gather of channels with constant indices, named as the Transpose. The BPU of bernoulli2 (RDK X3) takes
    4-D tensors only: the chain put every shuffle on the CPU there, one BPU subgraph between each two;
    a Gather of channels stays on the BPU, and one that only Convs read folds into their weights
    (``channel_gathers_into_convs``). The chain is probed on the element indices, so any axis split that
    permutes channels alone qualifies. Chains that ``placed`` (node_info) names are left as they are.
    The count of chains rewritten."""
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
                or len(shape) != 4 or list(out_shape) != list(shape) or shape[1] < 2:
            return None
        for inner in (first.output[0], transpose.output[0]):
            if inner in outputs or len(view.consumers.get(inner, [])) != 1:
                return None
        perm = list(view.attrs(transpose).get("perm", range(len(split) - 1, -1, -1)))
        probe = np.arange(math.prod(shape), dtype=np.int64).reshape(shape)
        moved = probe.reshape(split).transpose(perm).reshape(shape)
        plane = shape[2] * shape[3]
        index = moved[0, :, 0, 0] // plane % shape[1]
        if not np.array_equal(moved, probe[:, index]):
            return None
        name = f"{transpose.name}_channels"
        model.graph.initializer.append(numpy_helper.from_array(index.astype(np.int64), name))
        gone.update((first.output[0], transpose.output[0]))
        return [helper.make_node("Gather", [first.input[0], name], [node.output[0]], name=transpose.name, axis=1)]

    count = rewrite_nodes(model, rewrite)
    if count:
        kept = [n for n in model.graph.node if not set(n.output) & gone]
        del model.graph.node[:]
        model.graph.node.extend(kept)
    return count


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


def zero_pads_into_convs(model: ModelProto) -> None:
    """A zero Pad of the spatial axes read only by Convs (TensorFlow's SAME padding written out,
    PyTorch's ZeroPad2d / F.pad) becomes those Convs' own padding: the same sums, and no Pad op,
    which has no BPU form here."""
    view = GraphView(model)
    outputs = set(view.graph_outputs)
    gone = set()
    for node in model.graph.node:
        spatial = _zero_spatial_pads(node, view)
        users = view.consumers.get(node.output[0], []) if spatial is not None else []
        if not users or node.output[0] in outputs or any(
                u.op_type != "Conv" or u.input[0] != node.output[0] or
                view.attrs(u).get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET") for u in users):
            continue
        for conv in users:
            own = list(view.attrs(conv).get("pads", [0] * len(spatial)))
            pads = [a + b for a, b in zip(own, spatial, strict=True)]
            kept = [a for a in conv.attribute if a.name != "pads"]
            del conv.attribute[:]
            conv.attribute.extend([*kept, helper.make_attribute("pads", pads)])
            conv.input[0] = node.input[0]
        gone.add(node.name)
    keep = [n for n in model.graph.node if n.name not in gone]
    del model.graph.node[:]
    model.graph.node.extend(keep)


def _zero_spatial_pads(node: NodeProto, view: GraphView) -> list[int] | None:
    """The [begin..., end...] pads of the spatial axes of a Pad that adds zeros to them only (None: not one)."""
    spec = _constant_pad(node, view)
    if spec is None:
        return None
    shape, pads, value = spec
    rank = len(shape)
    if len(shape) < 3 or value != 0 or any(pads[:2]) or any(pads[rank:rank + 2]):  # batch or channels padded
        return None
    return [*pads[2:rank], *pads[rank + 2:]]


def crops_as_slices(model: ModelProto) -> int:
    """A constant Pad with negative amounts (a crop: ``F.pad`` with negative values) as the Slice it is, then
    a Pad of what the amounts still add: the BPU has Slice, and no form of a Pad that crops. The count
    rewritten."""
    view = GraphView(model)
    opset = default_opset(model)

    def rewrite(node: NodeProto) -> list[NodeProto] | None:
        spec = _constant_pad(node, view, crops=True)
        if spec is None or opset < 11 or view.elem_types.get(node.input[0]) != onnx.TensorProto.FLOAT:
            return None
        shape, pads, value = spec
        rank = len(shape)
        if min(pads) >= 0 or any(not isinstance(d, int) for d in shape):
            return None
        axes = [k for k in range(rank) if pads[k] < 0 or pads[rank + k] < 0]
        starts = [-min(pads[k], 0) for k in axes]
        ends = [shape[k] + min(pads[rank + k], 0) for k in axes]
        cropped = f"{node.output[0]}_cropped"
        names = []
        for what, values in (("starts", starts), ("ends", ends), ("axes", axes)):
            names.append(f"{node.name}_crop_{what}")
            model.graph.initializer.append(numpy_helper.from_array(np.array(values, np.int64), names[-1]))
        rest = [max(v, 0) for v in pads]
        if not any(rest):
            return [helper.make_node("Slice", [node.input[0], *names], [node.output[0]], name=node.name)]
        amounts, fill = f"{node.name}_rest_pads", f"{node.name}_rest_value"
        model.graph.initializer.append(numpy_helper.from_array(np.array(rest, np.int64), amounts))
        model.graph.initializer.append(numpy_helper.from_array(np.array(value, np.float32), fill))
        return [helper.make_node("Slice", [node.input[0], *names], [cropped], name=f"{node.name}_crop"),
                helper.make_node("Pad", [cropped, amounts, fill], [node.output[0]], name=node.name, mode="constant")]

    return rewrite_nodes(model, rewrite)


def _constant_pad(node: NodeProto, view: GraphView, crops: bool = False) -> tuple[list, list[int], float] | None:
    """(input shape, [begin..., end...] pads, value) of a constant-mode Pad whose pads and value are constants,
    none negative (a crop, unless ``crops``), over a tensor of known rank (None: not one)."""
    if node.op_type != "Pad" or node.domain not in ("", "ai.onnx"):
        return None
    a = view.attrs(node)
    if a.get("mode", b"constant") not in (b"constant", "constant"):
        return None
    shape = view.shapes.get(node.input[0])
    if len(node.input) > 1 and node.input[1]:  # opset 11: pads (and value, axes) are inputs
        pads = view.const(node.input[1])
        value = view.const(node.input[2]) if len(node.input) > 2 and node.input[2] else np.zeros(1)
        axes = view.const(node.input[3]) if len(node.input) > 3 and node.input[3] else None
        if pads is None or value is None or value.size != 1 or (axes is None and len(node.input) > 3
                                                                 and node.input[3]):
            return None
        pads = [int(v) for v in pads.reshape(-1)]
        if axes is not None:  # opset 18: pads of the listed axes only; the others take none
            axes = [int(v) for v in axes.reshape(-1)]
            if shape is None or len(pads) != 2 * len(axes):
                return None
            rank = len(shape)
            full = [0] * (2 * rank)
            for k, axis in enumerate(axes):
                axis %= rank
                full[axis], full[rank + axis] = pads[k], pads[len(axes) + k]
            pads = full
    else:
        pads, value = list(a.get("pads", [])), np.array(a.get("value", 0.0))
    if shape is None or len(pads) != 2 * len(shape) or (min(pads) < 0 and not crops):
        return None
    return list(shape), pads, float(np.asarray(value).reshape(-1)[0])


def constant_pads_as_concats(model: ModelProto) -> int:
    """A constant Pad left after ``zero_pads_into_convs`` (a value other than zero, as EfficientViT's
    linear attention appends a row of ones; or zeros no Conv absorbs) as Concats of constant blocks, one
    per padded axis: the same values, and Concat takes constants onto its output grid on the BPU.

    Only float32 tensors of a known shape, pads given as constants and none negative (a crop), and
    blocks of at most ``PAD_BLOCK_ELEMENTS`` values (a padded batch of a large map stays a Pad). Returns
    how many Pads it rewrote."""
    view = GraphView(model)
    nodes = []
    count = 0
    for node in model.graph.node:
        spec = _constant_pad(node, view)
        if spec is None or not any(spec[1]) or not _fits_blocks(spec[0], spec[1]) or \
                view.elem_types.get(node.input[0]) != onnx.TensorProto.FLOAT:
            nodes.append(node)
            continue
        count += 1
        shape, pads, value = spec
        rank = len(shape)
        begin, end = pads[:rank], pads[rank:]
        x, axes = node.input[0], [k for k in range(rank) if begin[k] or end[k]]
        for n, axis in enumerate(axes):
            parts = []
            for where, width in (("before", begin[axis]), ("after", end[axis])):
                if width:
                    block = np.full([*shape[:axis], width, *shape[axis + 1:]], value, dtype=np.float32)
                    const = f"{node.name}_axis{axis}_{where}"
                    model.graph.initializer.append(numpy_helper.from_array(block, const))
                    parts.append(const)
            parts.insert(1 if begin[axis] else 0, x)
            last = n == len(axes) - 1
            out = node.output[0] if last else f"{node.output[0]}_axis{axis}"
            nodes.append(helper.make_node("Concat", parts, [out], name=node.name if last else f"{node.name}_axis{axis}",
                                          axis=axis))
            shape = [*shape[:axis], shape[axis] + begin[axis] + end[axis], *shape[axis + 1:]]
            x = out
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return count


def _fits_blocks(shape: list, pads: list[int]) -> bool:
    """Whether a map of static ``shape`` padded by ``pads`` takes constant blocks of at most
    ``PAD_BLOCK_ELEMENTS`` values (each axis's blocks are as large as the map padded so far)."""
    if any(not isinstance(d, int) or d <= 0 for d in shape):
        return False
    rank = len(shape)
    grown = list(shape)
    for axis in range(rank):
        if max(pads[axis], pads[rank + axis]) * int(np.prod(grown)) // grown[axis] > PAD_BLOCK_ELEMENTS:
            return False
        grown[axis] += pads[axis] + pads[rank + axis]
    return True


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


def upsampling_by_whole_factors(model: ModelProto, profile: MarchProfile | None = None) -> None:
    """A Resize of one pixel as a Tile (a nearest Resize on a BPU without Tile, such as RDK X3's), and a
    bilinear Resize by an even whole factor s (2, 4, 6) of
    H and W with half-pixel coordinates (PyTorch's ``interpolate(..., mode='bilinear')``,
    segmentation decoders) as an edge Pad of one pixel and a depthwise ConvTranspose (stride s,
    kernel 2s, the bilinear weights ``1 - |t - s + 0.5| / s`` per axis, pads 1.5 s): the same
    weighted sums, with BPU forms, where the Resize has none. Without the Pad, the borders would
    blend with zeros instead of repeating the edge."""
    view = GraphView(model)
    nodes = []
    for node in model.graph.node:
        if _resize_of_one_pixel(node, view):  # every mode repeats the one value (ASPP's image pooling branch)
            nodes.append(_repeat_of_one_pixel(node, view.shapes[node.output[0]], model, profile))
            continue
        factor = _bilinear_factor(node, view)
        if factor is None:
            nodes.append(node)
            continue
        channels = view.shapes[node.input[0]][1]
        taps = 1.0 - np.abs(np.arange(2 * factor) - factor + 0.5) / factor
        weight = np.broadcast_to(np.outer(taps, taps), (channels, 1, 2 * factor, 2 * factor)).astype(np.float32)
        padded, w, pads = f"{node.output[0]}_edges", f"{node.name}_bilinear_w", f"{node.name}_edge_pads"
        model.graph.initializer.extend([numpy_helper.from_array(np.ascontiguousarray(weight), w),
                                        numpy_helper.from_array(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64), pads)])
        nodes.append(helper.make_node("Pad", [node.input[0], pads], [padded], name=f"{node.name}_edges", mode="edge"))
        nodes.append(helper.make_node("ConvTranspose", [padded, w], [node.output[0]], name=node.name, group=channels,
                                      kernel_shape=[2 * factor] * 2, strides=[factor] * 2,
                                      pads=[3 * factor // 2] * 4))
    del model.graph.node[:]
    model.graph.node.extend(nodes)


def interpolations_as_matmuls(model: ModelProto) -> None:
    """Any other linear or cubic Resize of H and W of a 4-D map (align_corners, a factor of 8, a size that
    is not a multiple) as what it is, a linear map per axis: ``MatMul`` by the interpolation matrix along W,
    then along H between two Transposes. The matrices are onnxruntime's own Resize of one-hot rows, so
    every coordinate mode and rounding is the Resize's.

    The Transposes turn the axes (C, H, W -> W, C, H and back) rather than swap H and W: the BPU of RDK X3
    moves data only between NCHW and NHWC, which these two are, and a swap ran on its CPU between three
    BPU subgraphs."""
    view = GraphView(model)
    nodes = []
    for node in model.graph.node:
        matrices = _interpolation_matrices(node, view) if node.op_type == "Resize" else None
        if matrices is None:
            nodes.append(node)
            continue
        x = node.input[0]
        for axis, matrix in zip((3, 2), matrices, strict=True):
            if matrix is None:
                continue
            w = f"{node.name}_interpolation_{'hw'[axis - 2]}"
            model.graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(matrix.T), w))
            if axis == 3:
                out = f"{node.output[0]}_along_w"
                nodes.append(helper.make_node("MatMul", [x, w], [out], name=f"{node.name}_along_w"))
            else:
                moved, done = f"{node.output[0]}_hw_swapped", f"{node.output[0]}_along_h"
                out = f"{node.output[0]}_h_back"
                nodes += [helper.make_node("Transpose", [x], [moved], name=f"{node.name}_swap", perm=[0, 3, 1, 2]),
                          helper.make_node("MatMul", [moved, w], [done], name=f"{node.name}_along_h"),
                          helper.make_node("Transpose", [done], [out], name=f"{node.name}_swap_back",
                                           perm=[0, 2, 3, 1])]
            x = out
        nodes[-1].output[0] = node.output[0]
    del model.graph.node[:]
    model.graph.node.extend(nodes)


def _interpolation_matrices(node: NodeProto, view: GraphView) -> tuple[np.ndarray | None,
                                                                      np.ndarray | None] | None:
    """(W, H) interpolation matrices [out, in] of a linear / cubic Resize of a 4-D map's H and W (None for an
    axis it does not resize); None where it is not such a Resize."""
    a = view.attrs(node)
    mode = a.get("mode", "nearest")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    shape, out_shape = view.shapes.get(node.input[0]), view.shapes.get(node.output[0])
    coords = a.get("coordinate_transformation_mode", "half_pixel")
    coords = coords.decode() if isinstance(coords, bytes) else coords
    if mode not in ("linear", "cubic") or coords == "tf_crop_and_resize" or shape is None or out_shape is None \
            or len(shape) != 4 or any(not isinstance(d, int) for d in [*shape, *out_shape]) \
            or shape[:2] != out_shape[:2] or shape[2:] == out_shape[2:] or a.get("antialias", 0) \
            or any(i and not view.is_const(i) for i in node.input[1:]):
        return None
    scales = view.const(node.input[2]) if len(node.input) > 2 and node.input[2] else None
    matrices = []
    for axis in (3, 2):
        if shape[axis] == out_shape[axis]:
            matrices.append(None)
            continue
        # one-hot rows along ``axis`` as a batch; the probe resizes that axis alone, as the node does
        probe_out = [shape[axis], 1, out_shape[axis], 1]
        eye = np.eye(shape[axis], dtype=np.float32).reshape(shape[axis], 1, shape[axis], 1)
        attrs = {k: v for k, v in a.items() if k != "axes"}
        if scales is not None and scales.size == 4:
            inputs = {"scales": np.array([1, 1, float(scales[axis]), 1], np.float32)}
        else:
            inputs = {"sizes": np.array(probe_out, np.int64)}
        out = _resize_probe(eye, attrs, inputs, probe_out, view)
        if out is None:
            return None
        matrices.append(out.reshape(shape[axis], out_shape[axis]).T.astype(np.float32))
    return matrices[0], matrices[1]


def _resize_probe(x: np.ndarray, attrs: dict, inputs: dict, out_shape: list[int], view: GraphView) -> np.ndarray | None:
    """onnxruntime's Resize of ``x`` with ``attrs`` and a ``scales`` or ``sizes`` input, at the model's opset
    (None if it fails or gives another shape)."""
    opset = next((o.version for o in view.model.opset_import if o.domain in ("", "ai.onnx")), 13)
    empty = np.array([], np.float32)
    consts = {"roi": empty, "scales": inputs.get("scales", empty), **({"sizes": inputs["sizes"]} if "sizes" in
                                                                      inputs else {})}
    node = helper.make_node("Resize", ["x", *consts], ["y"], **attrs)
    graph = helper.make_graph([node], "probe", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, x.shape)],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(v, k) for k, v in consts.items()])
    probe = helper.make_model(graph, opset_imports=[helper.make_opsetid("", max(opset, 11))])
    probe.ir_version = 8
    try:
        y = ort_session(probe).run(None, {"x": x})[0]
    except Exception:  # noqa: BLE001 - an attribute combination onnxruntime refuses: keep the Resize
        return None
    return y if list(y.shape) == list(out_shape) else None


def large_patch_convs_as_space_to_depth(model: ModelProto, profile: MarchProfile) -> None:
    """A patch embedding (Conv with kernel = stride, no padding: ViT's 16x16/16, DINOv2's 14x14/14) whose kernel
    or stride exceeds what the BPU takes as SpaceToDepth by the kernel and a 1x1 Conv over the k*k*C channels:
    the same sums, in forms the BPU has. Only where the map divides into whole patches (else the Conv would drop
    its edge)."""
    rule = profile.rule("Conv")
    limits = [v for v in (rule.kernel, rule.stride) if v is not None] if rule is not None else []
    if not limits:
        return
    limit = min(limits)
    view = GraphView(model)
    nodes = []
    for node in model.graph.node:
        w = view.const(node.input[1]) if node.op_type == "Conv" and len(node.input) > 1 else None
        if w is None:
            nodes.append(node)
            continue
        shape = view.shapes.get(node.input[0])
        a = view.attrs(node)
        k = list(w.shape[2:]) if w.ndim == 4 else []
        if not k or k[0] != k[1] or k[0] <= limit or shape is None or len(shape) != 4 \
                or list(a.get("strides", [1, 1])) != k or any(a.get("pads", [0])) or int(a.get("group", 1)) != 1 \
                or any(d != 1 for d in a.get("dilations", [1, 1])) or a.get("auto_pad", "NOTSET") not in \
                ("NOTSET", b"NOTSET", "VALID", b"VALID") or any(not isinstance(d, int) or d % k[0] for d in shape[2:]):
            nodes.append(node)
            continue
        b = k[0]
        # SpaceToDepth puts input channel c of patch offset (i, j) at (i * b + j) * C + c
        weight = w.transpose(0, 2, 3, 1).reshape(w.shape[0], -1, 1, 1)
        name = f"{node.input[1]}_patches"
        model.graph.initializer.append(numpy_helper.from_array(weight.astype(w.dtype), name))
        moved = f"{node.input[0]}_{node.name}_space_to_depth"
        nodes.append(helper.make_node("SpaceToDepth", [node.input[0]], [moved], name=f"{node.name}_space_to_depth",
                                      blocksize=b))
        nodes.append(helper.make_node("Conv", [moved, name, *node.input[2:]], list(node.output), name=node.name,
                                      kernel_shape=[1, 1]))
    del model.graph.node[:]
    model.graph.node.extend(nodes)


def convs_without_dead_taps(model: ModelProto, profile: MarchProfile | None = None) -> int:
    """A Conv whose kernel taps on some rows or columns read only padding at every output position (DeepLab's
    ASPP, dilation 12 to 36, on a map smaller than the dilation: every tap but the centre falls outside) as
    the same Conv over the taps that read the map: a smaller kernel, the padding moved by the dropped taps,
    dilation 1 for a single tap. The dropped taps only ever multiply zeros; the output keeps its size.

    With a ``profile``, only Convs whose kernel or dilation exceeds what its BPU takes: the values are the
    same, but float sums in another order round differently, and a Conv the BPU takes as it is gains nothing
    worth changing the calibration it would get (PP-OCRv2 rec's 5x5 on a 1-row map). Returns how many Convs
    it rewrote."""
    rule = profile.rule("Conv") if profile is not None else None
    view = GraphView(model)
    count = 0
    for node in model.graph.node:
        live = _live_taps(node, view)
        if live is None:
            continue
        a = view.attrs(node)
        w = view.const(node.input[1])
        spatial = w.ndim - 2
        dilations = list(a.get("dilations") or [1] * spatial)
        if profile is not None and (rule is None or (max(w.shape[2:]) <= (rule.kernel or max(w.shape[2:]))
                                                     and max(dilations) <= (rule.dilation or max(dilations)))):
            continue
        strides = list(a.get("strides") or [1] * spatial)
        shape = view.shapes[node.input[0]][2:]
        pads = list(a.get("pads") or [0] * (2 * spatial))
        begin, end, kept = [], [], []
        for k in range(spatial):
            first, last = live[k]
            out = (shape[k] + pads[k] + pads[k + spatial] - (w.shape[k + 2] - 1) * dilations[k] - 1) // strides[k] + 1
            begin.append(pads[k] - first * dilations[k])
            end.append((out - 1) * strides[k] + (last - first) * dilations[k] + 1 - shape[k] - begin[k])
            kept.append(slice(first, last + 1))
        if min(begin + end) < 0:
            continue  # the live taps skip rows of the map at its edge: no padding expresses that
        weight = f"{node.input[1]}_{node.name}_live_taps"
        model.graph.initializer.append(numpy_helper.from_array(
            np.ascontiguousarray(w[(slice(None), slice(None), *kept)]), weight))
        node.input[1] = weight
        dilated = [d if last > first else 1 for d, (first, last) in zip(dilations, live, strict=True)]
        attrs = {"kernel_shape": [last - first + 1 for first, last in live], "pads": begin + end,
                 "dilations": dilated}
        others = [x for x in node.attribute if x.name not in (*attrs, "auto_pad")]
        del node.attribute[:]
        node.attribute.extend([*others, *(helper.make_attribute(k, v) for k, v in attrs.items())])
        count += 1
    return count


def _live_taps(node: NodeProto, view: GraphView) -> list[tuple[int, int]] | None:
    """Per spatial axis of a Conv with a constant weight, static map and explicit pads, the first and last
    kernel tap that reads the map at some output position; None where every tap does (or not such a Conv)."""
    if node.op_type != "Conv" or node.domain not in ("", "ai.onnx") or len(node.input) < 2:
        return None
    w = view.const(node.input[1])
    shape = view.shapes.get(node.input[0])
    a = view.attrs(node)
    if w is None or shape is None or len(shape) != w.ndim or w.ndim < 3 \
            or any(not isinstance(d, int) or d <= 0 for d in shape[2:]) \
            or a.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
        return None
    spatial = w.ndim - 2
    dilations = list(a.get("dilations") or [1] * spatial)
    strides = list(a.get("strides") or [1] * spatial)
    pads = list(a.get("pads") or [0] * (2 * spatial))
    live = []
    for k in range(spatial):
        kernel = w.shape[k + 2]
        out = (shape[k + 2] + pads[k] + pads[k + spatial] - (kernel - 1) * dilations[k] - 1) // strides[k] + 1
        if out <= 0:
            return None
        rows = (np.arange(out) * strides[k] - pads[k])[:, None] + np.arange(kernel)[None, :] * dilations[k]
        reads = np.flatnonzero(((rows >= 0) & (rows < shape[k + 2])).any(axis=0))
        if reads.size == 0:
            return None
        live.append((int(reads[0]), int(reads[-1])))
    if all(last - first + 1 == w.shape[k + 2] for k, (first, last) in enumerate(live)):
        return None
    return live


def dilated_convs_by_phases(model: ModelProto, profile: MarchProfile, placed: Mapping[str, str] | None = None) -> int:
    """A stride-1 Conv dilated beyond what the BPU takes (DeepLab's ASPP at 18, 24, 36) as the same
    Conv with dilation ``d / f`` on each of the ``f x f`` phases of the map: SpaceToDepth by ``f``
    (phase (i, j) of channel c at (i * f + j) * C + c), one Conv with ``f²`` times the groups and
    the weight repeated per phase, then DepthToSpace back. Output pixel ``f·a + r`` reads only input
    pixels ``f·b + r``, so each phase is a Conv of its own phase: the same sums. Only where the map,
    the output and the pads divide by ``f``; not where node_info puts the Conv on the CPU. Returns how
    many Convs it rewrote."""
    rule = profile.rule("Conv")
    limit = rule.dilation if rule is not None else None
    if limit is None:
        return 0
    view = GraphView(model)
    nodes = []
    count = 0
    for node in model.graph.node:
        phases = _phase_factor(node, view, limit) if (placed or {}).get(node.name) != "CPU" else None
        if phases is None:
            nodes.append(node)
            continue
        count += 1
        f, a = phases, view.attrs(node)
        w = view.const(node.input[1])
        weight = f"{node.input[1]}_{node.name}_phases"
        model.graph.initializer.append(numpy_helper.from_array(np.tile(w, (f * f, 1, 1, 1)), weight))
        inputs = [f"{node.input[0]}_{node.name}_phases", weight]
        if len(node.input) > 2 and node.input[2]:
            bias = f"{node.input[2]}_{node.name}_phases"
            model.graph.initializer.append(numpy_helper.from_array(np.tile(view.const(node.input[2]), f * f), bias))
            inputs.append(bias)
        out = f"{node.output[0]}_phases"
        nodes += [helper.make_node("SpaceToDepth", [node.input[0]], [inputs[0]], name=f"{node.name}_to_phases",
                                   blocksize=f),
                  helper.make_node("Conv", inputs, [out], name=node.name, kernel_shape=list(w.shape[2:]),
                                   dilations=[d // f if k > 1 else 1
                                              for d, k in zip(a["dilations"], w.shape[2:], strict=True)],
                                   pads=[p // f for p in a["pads"]],
                                   group=int(a.get("group", 1)) * f * f),
                  helper.make_node("DepthToSpace", [out], list(node.output), name=f"{node.name}_from_phases",
                                   blocksize=f, mode="DCR")]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return count


def _phase_factor(node: NodeProto, view: GraphView, limit: int) -> int | None:
    """The smallest ``f`` that brings a 2-D Conv's dilations within ``limit`` and divides them, its map, its
    output and its pads (None: not such a Conv, or none does)."""
    if node.op_type != "Conv" or node.domain not in ("", "ai.onnx") or len(node.input) < 2:
        return None
    w, b = view.const(node.input[1]), view.const(node.input[2]) if len(node.input) > 2 and node.input[2] else None
    shape, out = view.shapes.get(node.input[0]), view.shapes.get(node.output[0])
    a = view.attrs(node)
    if w is None or w.ndim != 4:
        return None
    # a single tap along an axis has no spacing: its dilation means nothing
    spread = [d for d, k in zip(a.get("dilations", [1, 1]), w.shape[2:], strict=True) if k > 1]
    if (len(node.input) > 2 and node.input[2] and b is None) or max(spread, default=1) <= limit \
            or shape is None or out is None or len(shape) != 4 or len(out) != 4 \
            or any(not isinstance(d, int) for d in [*shape, *out]) or any(s != 1 for s in a.get("strides", [1, 1])) \
            or a.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET") or "pads" not in a:
        return None
    for f in range(2, max(spread) + 1):
        if all(d % f == 0 for d in spread) and max(spread) // f <= limit:
            sizes = [*shape[2:], *out[2:], *a["pads"]]
            return f if all(v % f == 0 for v in sizes) else None
    return None


def convs_in_kernel_pieces(model: ModelProto, profile: MarchProfile, placed: Mapping[str, str] | None = None) -> int:
    """A Conv whose kernel is longer than the BPU takes along an axis (an FSMN memory block's 20 taps over
    time, a conv over 96 frequency bins) or dilated beyond its limit where the phases do not apply (a TCN's
    dilation 32..256 on a map of odd length and width 1) as the sum of Convs over pieces of the kernel: each
    piece keeps at most ``kernel`` taps (one tap where the dilation is too large: a single tap has no
    spacing), reads the map shifted by its first tap (a Slice where that removes rows, padding where it
    adds them) and has the same output size; the bias goes to the first piece. The same sums, grouped
    differently. Not where node_info puts the Conv on the CPU. Returns how many Convs it rewrote."""
    rule = profile.rule("Conv")
    if rule is None or (rule.kernel is None and rule.dilation is None):
        return 0
    opset = _opset(model)
    view = GraphView(model)

    def in_pieces(node: NodeProto) -> list[NodeProto] | None:
        plan = _kernel_pieces(node, view, rule.kernel, rule.dilation, rule.stride) \
            if (placed or {}).get(node.name) != "CPU" else None
        return None if plan is None else _conv_pieces(node, view, plan, opset, model)

    return rewrite_nodes(model, in_pieces)


def strided_convs_over_phases(model: ModelProto, profile: MarchProfile,
                              placed: Mapping[str, str] | None = None) -> int:
    """A 1-D Conv whose stride is larger than the BPU takes (an STFT written as a Conv: openwakeword's
    melspectrogram reads 512 samples every 160) as a stride-1 Conv over the stride's phases: the signal, padded
    with zeros (or cut after the last sample the Conv reads) to whole frames of ``s`` samples, is reshaped to
    [N, C, F, s], transposed to [N, C, s, F] and read as [N, C*s, F]; weight tap ``j*s + p`` of channel ``c``
    becomes tap ``j`` of channel ``c*s + p`` (zero past the kernel). The same sums; the new kernel has
    ceil(k / s) taps (a longer one is then cut into pieces). A 2-D Conv over a single row or column, with
    kernel, stride and dilation 1 and no padding across it, is such a 1-D Conv (tf2onnx writes Keras'
    Conv1D as one over [N, C, 1, L]): the same, the row or column kept. Not where node_info puts the Conv on
    the CPU, nor where the march takes no Conv of its rank or the C*s channels. Returns how many Convs it
    rewrote."""
    rule = profile.rule("Conv")
    if rule is None or rule.stride is None:
        return 0
    opset = _opset(model)
    view = GraphView(model)
    # Convs reading the same input over the same frames (an STFT's real and imaginary parts) share one chain.
    chains: dict[tuple[str, int, int, int, int], str] = {}

    def over_phases(node: NodeProto) -> list[NodeProto] | None:
        if node.op_type != "Conv" or node.domain not in ("", "ai.onnx") or len(node.input) < 2 \
                or (placed or {}).get(node.name) == "CPU":
            return None
        w = view.const(node.input[1])
        b = view.const(node.input[2]) if len(node.input) > 2 and node.input[2] else None
        shape, out = view.shapes.get(node.input[0]), view.shapes.get(node.output[0])
        a = view.attrs(node)
        if w is None or w.ndim not in (3, 4) or (len(node.input) > 2 and node.input[2] and b is None) \
                or shape is None or out is None or len(shape) != w.ndim or len(out) != w.ndim \
                or not rule.ranks[0] <= w.ndim <= rule.ranks[1] \
                or any(not isinstance(d, int) or d <= 0 for d in [*shape, *out]) \
                or a.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET") or int(a.get("group", 1)) != 1:
            return None
        spatial = w.ndim - 2
        strides = list(a.get("strides") or [1] * spatial)
        dilations = list(a.get("dilations") or [1] * spatial)
        pads = list(a.get("pads") or [0] * 2 * spatial)
        axis = _signal_axis(shape, w.shape, strides, dilations, pads)
        if axis is None or dilations[axis - 2] != 1:
            return None
        s = int(strides[axis - 2])
        c = shape[1]
        if s <= rule.stride or (rule.channels is not None and c * s > rule.channels):
            return None
        taps = -(-w.shape[axis] // s)
        frames = out[axis] - 1 + taps
        begin = int(pads[axis - 2])
        tag = f"{node.name}_phases"
        nodes: list[NodeProto] = []
        key = (node.input[0], axis, s, frames, begin)
        if key not in chains:
            chains[key] = _phase_chain(model, opset, node.input[0], list(shape), axis, s, frames, begin, tag, nodes)
        x = chains[key]
        row = w.reshape(w.shape[0], c, w.shape[axis])  # the other spatial axis, if any, has one tap
        padded_w = np.zeros((w.shape[0], c, taps * s), w.dtype)
        padded_w[:, :, :row.shape[2]] = row
        # [O, C, taps, s] -> [O, C, s, taps] -> [O, C*s, taps]: channel c*s + p, tap j reads sample j*s + p
        kernel = [1] * spatial
        kernel[axis - 2] = taps
        weight = padded_w.reshape(w.shape[0], c, taps, s).transpose(0, 1, 3, 2).reshape(w.shape[0], c * s, *kernel)
        model.graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(weight), f"{node.input[1]}_{tag}"))
        nodes.append(helper.make_node("Conv", [x, f"{node.input[1]}_{tag}", *node.input[2:]],
                                      list(node.output), name=node.name, kernel_shape=kernel))
        return nodes

    return rewrite_nodes(model, over_phases)


def _signal_axis(shape: list[int], kernel: tuple[int, ...], strides: list[int], dilations: list[int],
                 pads: list[int]) -> int | None:
    """The axis of ``shape`` a Conv slides along as a 1-D Conv (``strided_convs_over_phases``): the only
    spatial one, or of two the one whose other is a single row or column read by one tap, with stride and
    dilation 1 and no padding (None otherwise)."""
    spatial = len(shape) - 2
    if spatial == 1:
        return 2
    for axis, other in ((3, 2), (2, 3)):
        k = other - 2
        if shape[other] == 1 and kernel[other] == 1 and strides[k] == 1 and dilations[k] == 1 \
                and pads[k] == 0 and pads[k + spatial] == 0:
            return axis
    return None


def _phase_chain(model: ModelProto, opset: int, x: str, shape: list[int], axis: int, s: int, frames: int, begin: int,
                 tag: str, nodes: list[NodeProto]) -> str:
    """``x`` (``shape``: [N, C, L], or [N, C, 1, L] / [N, C, L, 1] with the signal on ``axis``) as
    [N, C*s, frames] (the single row or column kept) over the stride's phases (``strided_convs_over_phases``):
    ``begin`` zeros in front, zeros after it up to ``frames * s`` samples (or the signal cut there), reshaped
    to [N, C, frames, s], transposed and read as channels. Appends the nodes to ``nodes``; returns the output."""
    n, c, length = shape[0], shape[1], shape[axis]
    tail = frames * s - begin - length
    if tail < 0:
        cut = f"{x}_{tag}_cut"
        if opset >= 10:
            consts = []
            for what, values in (("starts", [0]), ("ends", [length + tail]), ("axes", [axis])):
                name = f"{tag}_slice_{what}"
                model.graph.initializer.append(numpy_helper.from_array(np.array(values, np.int64), name))
                consts.append(name)
            nodes.append(helper.make_node("Slice", [x, *consts], [cut], name=f"{tag}_cut"))
        else:
            nodes.append(helper.make_node("Slice", [x], [cut], name=f"{tag}_cut", starts=[0],
                                          ends=[length + tail], axes=[axis]))
        x = cut
    blocks = [(f"{tag}_front", begin), (f"{tag}_back", max(tail, 0))]
    if any(size for _, size in blocks):
        for name, size in blocks:
            if size:
                zeros = list(shape)
                zeros[axis] = size
                model.graph.initializer.append(numpy_helper.from_array(np.zeros(zeros, np.float32), name))
        padded = f"{x}_{tag}_padded"
        parts = [blocks[0][0]] * bool(begin) + [x] + [blocks[1][0]] * bool(tail > 0)
        nodes.append(helper.make_node("Concat", parts, [padded], name=f"{tag}_pad", axis=axis))
        x = padded
    channels = [n, c * s, *[frames if k == axis else 1 for k in range(2, len(shape))]]
    for what, dims in (("frames", [n, c, frames, s]), ("channels", channels)):
        model.graph.initializer.append(numpy_helper.from_array(np.array(dims, np.int64), f"{tag}_{what}"))
    nodes.append(helper.make_node("Reshape", [x, f"{tag}_frames"], [f"{x}_{tag}_frames"], name=f"{tag}_frames"))
    nodes.append(helper.make_node("Transpose", [f"{x}_{tag}_frames"], [f"{x}_{tag}_phases"],
                                  name=f"{tag}_transpose", perm=[0, 1, 3, 2]))
    nodes.append(helper.make_node("Reshape", [f"{x}_{tag}_phases", f"{tag}_channels"], [f"{x}_{tag}"],
                                  name=f"{tag}_channels"))
    return f"{x}_{tag}"


def _kernel_pieces(node: NodeProto, view: GraphView, kernel_limit: int | None, dilation_limit: int | None,
                   stride_limit: int | None) -> list[list[tuple[int, int]]] | None:
    """Per spatial axis of a Conv that breaks the kernel or dilation limit only, the tap ranges
    ``[first, last)`` of its pieces (None: not such a Conv, or pieces would not help)."""
    if node.op_type != "Conv" or node.domain not in ("", "ai.onnx") or len(node.input) < 2:
        return None
    w = view.const(node.input[1])
    b = view.const(node.input[2]) if len(node.input) > 2 and node.input[2] else None
    shape, out = view.shapes.get(node.input[0]), view.shapes.get(node.output[0])
    a = view.attrs(node)
    if w is None or w.ndim < 3 or (len(node.input) > 2 and node.input[2] and b is None) or shape is None \
            or out is None or len(shape) != w.ndim or len(out) != w.ndim \
            or any(not isinstance(d, int) or d <= 0 for d in [*shape[2:], *out[2:]]) \
            or a.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
        return None
    spatial = w.ndim - 2
    strides = list(a.get("strides") or [1] * spatial)
    dilations = list(a.get("dilations") or [1] * spatial)
    if stride_limit is not None and max(strides) > stride_limit:
        return None  # pieces keep the stride: they would break the same limit
    pieces, split = [], False
    for k in range(spatial):
        taps, d = w.shape[k + 2], dilations[k]
        # a single tap along an axis has no spacing: its dilation means nothing
        step = 1 if taps > 1 and dilation_limit is not None and d > dilation_limit else (kernel_limit or taps)
        if step < taps:
            split = True
        pieces.append([(t, min(t + step, taps)) for t in range(0, taps, step)])
    if not split or int(np.prod([len(p) for p in pieces])) > 64:
        return None  # nothing to split, or so many pieces that the CPU is the better place
    return pieces


def _conv_pieces(node: NodeProto, view: GraphView, plan: list[list[tuple[int, int]]], opset: int,
                 model: ModelProto) -> list[NodeProto]:
    w = view.const(node.input[1])
    shape, out = view.shapes[node.input[0]], view.shapes[node.output[0]]
    a = view.attrs(node)
    spatial = w.ndim - 2
    strides = list(a.get("strides") or [1] * spatial)
    dilations = list(a.get("dilations") or [1] * spatial)
    pads = list(a.get("pads") or [0] * (2 * spatial))
    others = [x for x in node.attribute if x.name not in ("kernel_shape", "pads", "dilations", "auto_pad")]
    nodes, sums = [], []
    for j, ranges in enumerate(itertools.product(*plan)):
        tag = f"{node.name}_piece{j}"
        begin, end, crop_start, crop_end, dil = [], [], [], [], []
        for k, (first, last) in enumerate(ranges):
            # output row o of the piece reads rows o*s - pads[k] + (first + t)*d, t < last - first
            lo = pads[k] - first * dilations[k]
            hi = (out[k + 2] - 1) * strides[k] + (last - first - 1) * dilations[k] + 1 - shape[k + 2] - lo
            begin.append(max(lo, 0))
            end.append(max(hi, 0))
            crop_start.append(max(-lo, 0))
            crop_end.append(shape[k + 2] - max(-hi, 0))
            dil.append(dilations[k] if last - first > 1 else 1)
        x = node.input[0]
        axes = [k + 2 for k in range(spatial) if crop_start[k] or crop_end[k] != shape[k + 2]]
        if axes:
            starts = [crop_start[k - 2] for k in axes]
            ends = [crop_end[k - 2] for k in axes]
            cropped = f"{x}_{tag}_cropped"
            if opset >= 10:
                consts = []
                for what, values in (("starts", starts), ("ends", ends), ("axes", axes)):
                    cname = f"{tag}_slice_{what}"
                    model.graph.initializer.append(numpy_helper.from_array(np.array(values, np.int64), cname))
                    consts.append(cname)
                nodes.append(helper.make_node("Slice", [x, *consts], [cropped], name=f"{tag}_slice"))
            else:
                nodes.append(helper.make_node("Slice", [x], [cropped], name=f"{tag}_slice", starts=starts,
                                              ends=ends, axes=axes))
            x = cropped
        weight = f"{node.input[1]}_{tag}"
        taps = tuple(slice(first, last) for first, last in ranges)
        model.graph.initializer.append(numpy_helper.from_array(
            np.ascontiguousarray(w[(slice(None), slice(None), *taps)]), weight))
        inputs = [x, weight, *([node.input[2]] if j == 0 and len(node.input) > 2 and node.input[2] else [])]
        y = f"{node.output[0]}_{tag}"
        nodes.append(helper.make_node("Conv", inputs, [y], name=tag if j else node.name,
                                      kernel_shape=[last - first for first, last in ranges],
                                      pads=begin + end, dilations=dil))
        nodes[-1].attribute.extend(others)
        sums.append(y)
    total = sums[0]
    for j, y in enumerate(sums[1:], 1):
        target = node.output[0] if j == len(sums) - 1 else f"{node.output[0]}_{node.name}_sum{j}"
        nodes.append(helper.make_node("Add", [total, y], [target], name=f"{node.name}_sum{j}"))
        total = target
    return nodes


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
    kept = [n for n in model.graph.node if id(n) not in dropped]
    for node in kept:
        for k, name in enumerate(node.input):
            while name in renames:
                name = renames[name]
            node.input[k] = name
    del model.graph.node[:]
    model.graph.node.extend(kept)
    stale = [v for v in model.graph.value_info if v.name in restored]
    for v in stale:
        model.graph.value_info.remove(v)
    return count


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


def large_average_pools_in_steps(model: ModelProto, profile: MarchProfile,
                                 placed: Mapping[str, str] | None = None) -> int:
    """An AveragePool over whole non-overlapping windows (kernel = stride, no padding, windows that tile the
    map) larger than the march's kernel or stride limit: over the whole map a GlobalAveragePool, otherwise
    the same mean taken in steps, each a pool over whole windows within the limits (a 30x30 one as 6x6 then
    5x5). A mean of equal-sized means is the mean: the same values up to float rounding, and one more grid
    between the steps once quantized. PSPNet's AdaptiveAvgPool2d of a 60x60 map and MobileOne's
    squeeze-and-excitation (avg_pool2d over the whole map) export such pools, which went to the CPU.
    Pools that ``placed`` (node_info) names stay. The count of pools rewritten."""
    rule = profile.rule("AveragePool")
    limit = min(v for v in (rule.kernel, rule.stride) if v is not None) if rule is not None else None
    if limit is None or profile.rule("GlobalAveragePool") is None:
        return 0
    view = GraphView(model)
    named = set(placed or ())

    def rewrite(node: NodeProto) -> list[NodeProto] | None:
        if node.op_type != "AveragePool" or node.domain not in ("", "ai.onnx") or node.name in named:
            return None
        shape = view.shapes.get(node.input[0])
        a = view.attrs(node)
        kernel = list(a.get("kernel_shape", []))
        plain = list(a.get("strides", [1, 1])) == kernel and not any(a.get("pads", [0] * 4)) \
            and list(a.get("dilations", [1, 1])) == [1, 1] and a.get("auto_pad", "NOTSET") in ("NOTSET", b"NOTSET")
        if not plain or shape is None or len(shape) != 4 or len(kernel) != 2 \
                or any(not isinstance(d, int) for d in shape[2:]) or max(kernel) <= limit \
                or any(size % k for size, k in zip(shape[2:], kernel, strict=True)):
            return None
        if kernel == list(shape[2:]):
            return [helper.make_node("GlobalAveragePool", [node.input[0]], [node.output[0]], name=node.name)]
        steps = [_factors(k, limit) for k in kernel]
        if any(f is None for f in steps):
            return None
        count = max(len(f) for f in steps)
        steps = [f + [1] * (count - len(f)) for f in steps]
        nodes, x = [], node.input[0]
        for i in range(count):
            k = [steps[0][i], steps[1][i]]
            last = i == count - 1
            out = node.output[0] if last else f"{node.output[0]}_step{i}"
            nodes.append(helper.make_node("AveragePool", [x], [out], name=node.name if last else f"{node.name}_step{i}",
                                          kernel_shape=k, strides=k))
            x = out
        return nodes

    return rewrite_nodes(model, rewrite)


def _factors(n: int, limit: int) -> list[int] | None:
    """``n`` as a product of whole factors of at most ``limit``, largest first (None: a prime factor is larger)."""
    out = []
    while n > 1:
        f = next((d for d in range(min(n, limit), 1, -1) if n % d == 0), None)
        if f is None:
            return None
        out.append(f)
        n //= f
    return out or [1]


def average_pools_over_whole_windows(model: ModelProto) -> None:
    """An AveragePool whose divisor varies with the position (``count_include_pad=0`` with padding, the
    ONNX default that TensorFlow exports use; or ``ceil_mode`` windows hanging over the end) as the
    same pool over whole windows of k*k values (dilated ones too), padding counted, times a constant map
    of k*k / count: the sums are the same, and both ops have BPU forms. A ceil_mode pool whose windows
    all fit stays."""
    view = GraphView(model)
    nodes = []
    for node in model.graph.node:
        shape = view.shapes.get(node.input[0]) if node.op_type == "AveragePool" else None
        a = view.attrs(node)
        if shape is None or len(shape) != 4 or any(not isinstance(d, int) for d in shape[2:]) \
                or a.get("auto_pad", "NOTSET") not in ("NOTSET", b"NOTSET"):
            nodes.append(node)
            continue
        kernel = list(a["kernel_shape"])
        strides = list(a.get("strides", [1, 1]))
        dilations = list(a.get("dilations", [1, 1]))
        pads = list(a.get("pads", [0, 0, 0, 0]))
        ends, counts = [], []
        for k, size in enumerate(shape[2:]):
            padded = size + pads[k] + pads[k + 2]
            extent = (kernel[k] - 1) * dilations[k] + 1  # the window's span; its taps are dilations apart
            out = -(-(padded - extent) // strides[k]) + 1 if a.get("ceil_mode", 0) else \
                (padded - extent) // strides[k] + 1
            if a.get("ceil_mode", 0) and (out - 1) * strides[k] >= size + pads[k]:
                out -= 1  # onnxruntime drops a last window that would start in the end padding
            end = (out - 1) * strides[k] + extent - size - pads[k]  # end padding whole windows need
            ends.append(max(end, pads[k + 2]))
            lo, hi = (0, size) if not a.get("count_include_pad", 0) else (-pads[k], size + pads[k + 2])
            taps = (np.arange(out) * strides[k] - pads[k])[:, None] + np.arange(kernel[k])[None, :] * dilations[k]
            counts.append(((taps >= lo) & (taps < hi)).sum(axis=1))
        if any(e >= k for e, k in zip(ends, kernel, strict=True)):
            nodes.append(node)  # onnxruntime takes no pad as large as the kernel, which a dilated window may need
            continue
        count = counts[0][:, None] * counts[1][None, :]
        window = kernel[0] * kernel[1]
        if np.all(count == window) and ends == pads[2:]:
            # every window is whole: the floor-mode pool counting its padding is the same
            kept = [x for x in node.attribute if x.name not in ("ceil_mode", "count_include_pad")]
            del node.attribute[:]
            node.attribute.extend([*kept, helper.make_attribute("count_include_pad", 1)])
            nodes.append(node)
            continue
        whole = f"{node.output[0]}_whole_windows"
        dilated = {"dilations": dilations} if any(d != 1 for d in dilations) else {}
        nodes.append(helper.make_node("AveragePool", [node.input[0]], [whole], name=f"{node.name}_whole_windows",
                                      kernel_shape=kernel, strides=strides, pads=[*pads[:2], *ends],
                                      count_include_pad=1, **dilated))
        factor = f"{node.name}_window_counts"
        model.graph.initializer.append(numpy_helper.from_array(
            (window / count).astype(np.float32).reshape(1, 1, *count.shape), factor))
        nodes.append(helper.make_node("Mul", [whole, factor], list(node.output), name=node.name))
    del model.graph.node[:]
    model.graph.node.extend(nodes)


def _resize_of_one_pixel(node: NodeProto, view: GraphView) -> bool:
    """A Resize of a [N, C, 1, 1] tensor to [N, C, H, W] (static shapes)."""
    if node.op_type not in ("Resize", "Upsample") or node.domain not in ("", "ai.onnx"):
        return False
    shape_in, shape_out = view.shapes.get(node.input[0]), view.shapes.get(node.output[0])
    return (shape_in is not None and shape_out is not None and len(shape_in) == len(shape_out) == 4
            and is_static([*shape_in, *shape_out])
            and shape_in[2:] == [1, 1] and shape_out[:2] == shape_in[:2])


def _repeat_of_one_pixel(node: NodeProto, shape: list[int], model: ModelProto,
                         profile: MarchProfile | None) -> NodeProto:
    """What repeats a [N, C, 1, 1] tensor to ``shape``: a Tile, or a nearest Resize where the march's BPU has
    no Tile but has that Resize."""
    opset = default_opset(model)
    if profile is None or profile.rule("Tile") is not None or profile.rule("Resize") is None or opset < 10:
        reps = f"{node.name}_repeats"
        model.graph.initializer.append(numpy_helper.from_array(np.array([1, 1, *shape[2:]], np.int64), reps))
        return helper.make_node("Tile", [node.input[0], reps], [node.output[0]], name=node.name)
    scales = f"{node.name}_scales"
    model.graph.initializer.append(numpy_helper.from_array(np.array([1, 1, *shape[2:]], np.float32), scales))
    if opset == 10:
        return helper.make_node("Resize", [node.input[0], scales], [node.output[0]], name=node.name, mode="nearest")
    roi = f"{node.name}_roi"  # empty: the whole tensor (an input until opset 13)
    model.graph.initializer.append(numpy_helper.from_array(np.zeros(0, np.float32), roi))
    return helper.make_node("Resize", [node.input[0], roi, scales], [node.output[0]], name=node.name,
                            mode="nearest", coordinate_transformation_mode="asymmetric", nearest_mode="floor")


def _bilinear_factor(node: NodeProto, view: GraphView) -> int | None:
    """The factor s of a Resize that ``upsampling_by_whole_factors`` rewrites (None: not one)."""
    if node.op_type != "Resize" or node.domain not in ("", "ai.onnx") or len(node.input) < 3:
        return None
    a = view.attrs(node)
    text = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in a.items()}
    if text.get("mode") != "linear" or text.get("coordinate_transformation_mode", "half_pixel") not in (
            "half_pixel", "pytorch_half_pixel") or a.get("antialias", 0) or a.get("axes") \
            or a.get("keep_aspect_ratio_policy", b"stretch") not in (b"stretch", "stretch"):
        return None
    shape_in, shape_out = view.shapes.get(node.input[0]), view.shapes.get(node.output[0])
    if shape_in is None or shape_out is None or len(shape_in) != 4 or len(shape_out) != 4 \
            or not is_static([*shape_in, *shape_out]):
        return None
    if shape_out[:2] != shape_in[:2] or shape_out[2] % shape_in[2] or shape_out[3] % shape_in[3]:
        return None
    factor = shape_out[2] // shape_in[2]
    if factor != shape_out[3] // shape_in[3] or factor not in (2, 4, 6):
        return None
    scales = view.const(node.input[2]) if node.input[2] else None  # sizes given: the output shape says it
    if scales is not None and scales.size and not np.allclose(scales.reshape(-1), [1, 1, factor, factor]):
        return None  # scales not whole: half-pixel coordinates use the scale, not the size ratio
    return factor


def einsums_as_matmuls(model: ModelProto) -> int:
    """A two-operand Einsum that is a batched matrix product (``torch.einsum`` in attention code:
    ``bhdn,bhdm->bhnm``, ``bnc,ck->bnk``) as Transpose, Reshape, MatMul, Reshape, Transpose: the BPU has a
    MatMul, no Einsum. Each letter must be a batch axis (in both operands and the output), a contracted
    one (in both operands only) or a free one (in one operand and the output), of static size; the
    others (a trace, a sum over one operand's axis, an ellipsis) stay as they are. Returns how many."""
    view = GraphView(model)
    return rewrite_nodes(model, lambda node: _einsum_matmul(node, view, model)
                         if node.op_type == "Einsum" and len(node.input) == 2 else None)


def _einsum_matmul(node: NodeProto, view: GraphView, model: ModelProto) -> list[NodeProto] | None:
    equation = view.attrs(node).get("equation", b"")
    equation = (equation.decode() if isinstance(equation, bytes) else equation).replace(" ", "")
    if "->" not in equation or "." in equation:
        return None
    ins, out = equation.split("->")
    terms = ins.split(",")
    shapes = [view.shapes.get(i) for i in node.input]
    if len(terms) != 2 or any(s is None or len(s) != len(t) or any(not isinstance(d, int) or d <= 0 for d in s)
                              for s, t in zip(shapes, terms, strict=True)):
        return None
    a, b = terms
    if any(len(set(t)) != len(t) for t in (a, b, out)) or not set(out) <= set(a) | set(b):
        return None
    size = {c: d for t, s in zip(terms, shapes, strict=True) for c, d in zip(t, s, strict=True)}
    if any(size[c] != d for t, s in zip(terms, shapes, strict=True) for c, d in zip(t, s, strict=True)):
        return None  # a broadcast size-1 axis: left to onnxruntime
    batch = [c for c in out if c in a and c in b]
    free_a = [c for c in out if c in a and c not in b]
    free_b = [c for c in out if c in b and c not in a]
    inner = [c for c in a if c in b and c not in out]
    if len(batch) + len(free_a) + len(inner) != len(a) or len(batch) + len(free_b) + len(inner) != len(b):
        return None  # a letter summed over one operand only

    new: list[NodeProto] = []
    hint = node.name or node.output[0]

    def const(value: list[int], tag: str) -> str:
        name = f"{hint}_{tag}"
        model.graph.initializer.append(numpy_helper.from_array(np.array(value, dtype=np.int64), name))
        return name

    def op(op_type: str, inputs: list[str], tag: str, **attrs: object) -> str:
        out_name = f"{hint}_{tag}"
        new.append(helper.make_node(op_type, inputs, [out_name], name=f"{hint}/{tag}", **attrs))
        return out_name

    def prod(letters: list[str]) -> int:
        return int(np.prod([size[c] for c in letters], dtype=np.int64))

    def arrange(x: str, term: str, order: list[str], rows: list[str], cols: list[str], tag: str) -> str:
        perm = [term.index(c) for c in order]
        shape = [size[c] for c in batch] + [prod(rows), prod(cols)]
        if view.is_const(x):  # a weight: moved and shaped here, whether or not constants get folded later
            name = f"{hint}_{tag}_w"
            model.graph.initializer.append(numpy_helper.from_array(view.const(x).transpose(perm).reshape(shape), name))
            return name
        if perm != list(range(len(perm))):
            x = op("Transpose", [x], f"{tag}_t", perm=perm)
        return op("Reshape", [x, const(shape, f"{tag}_s")], f"{tag}_r")

    left = arrange(node.input[0], a, batch + free_a + inner, free_a, inner, "a")
    right = arrange(node.input[1], b, batch + inner + free_b, inner, free_b, "b")
    product = op("MatMul", [left, right], "mm")
    natural = batch + free_a + free_b
    perm = [natural.index(c) for c in out]
    if perm == list(range(len(perm))):
        new.append(helper.make_node("Reshape", [product, const([size[c] for c in natural], "o_s")], [node.output[0]],
                                    name=node.name))
    else:
        shaped = op("Reshape", [product, const([size[c] for c in natural], "o_s")], "o_r")
        new.append(helper.make_node("Transpose", [shaped], [node.output[0]], name=node.name, perm=perm))
    return new


def matmuls_read_in_slices(model: ModelProto, placed: Mapping[str, str] | None = None) -> int:
    """A MatMul of two activations whose result is read only by Slices along its rows or its columns becomes
    one MatMul per Slice, of the rows (or columns) that Slice keeps: the same products, and each piece on its
    own grid. EfficientViT's linear attention computes its numerators and their denominator as rows of one
    product, ``(vk @ q)[..., :-1, :] / (vk @ q)[..., -1:, :]``: on one grid, spanning the numerators' range,
    the small denominators rounded to 0 (held-out cosine 0.81). MatMuls that ``placed`` (node_info) names
    stay. The count of MatMuls rewritten."""
    view = GraphView(model)
    outputs = set(view.graph_outputs)
    named = set(placed or ())
    rewritten: set[str] = set()  # outputs of the MatMuls rewritten
    product_of: dict[int, NodeProto] = {}  # a Slice reading one of them (its id) -> the MatMul
    for node in model.graph.node:
        if node.op_type != "MatMul" or node.domain not in ("", "ai.onnx") or node.name in named \
                or any(view.is_const(i) for i in node.input) or node.output[0] in outputs:
            continue
        readers = view.consumers.get(node.output[0], [])
        shapes = [view.shapes.get(i) for i in node.input]
        if not readers or any(s is None or len(s) < 2 for s in shapes) \
                or any(_row_or_column_slice(r, view, len(view.shapes.get(node.output[0]) or [])) is None
                       for r in readers):
            continue
        rewritten.add(node.output[0])
        product_of.update((id(r), node) for r in readers)

    def rewrite(node: NodeProto) -> list[NodeProto] | None:
        if node.op_type == "MatMul" and node.output[0] in rewritten:
            return []  # each Slice reading it computes its own part
        matmul = product_of.get(id(node))
        if matmul is None:
            return None
        rank = len(view.shapes[matmul.output[0]])
        side = 0 if _row_or_column_slice(node, view, rank) == rank - 2 else 1  # rows: first operand's
        operand, axes = f"{node.output[0]}_operand", f"{node.name}_operand_axes"
        model.graph.initializer.append(numpy_helper.from_array(np.array([-2 if side == 0 else -1], np.int64), axes))
        inputs = list(matmul.input)
        inputs[side] = operand
        return [helper.make_node("Slice", [matmul.input[side], node.input[1], node.input[2], axes], [operand],
                                 name=f"{node.name}_operand"),
                helper.make_node("MatMul", inputs, [node.output[0]], name=f"{matmul.name}_{node.name}")]

    rewrite_nodes(model, rewrite)
    return len(rewritten)


def _row_or_column_slice(node: NodeProto, view: GraphView, rank: int) -> int | None:
    """The axis (``rank`` - 2 or - 1) a Slice with constant bounds and unit steps keeps a range of; else None."""
    if node.op_type != "Slice" or node.domain not in ("", "ai.onnx") or len(node.input) < 4 or rank < 2:
        return None
    axes = view.const(node.input[3])
    steps = view.const(node.input[4]) if len(node.input) > 4 and node.input[4] else None
    if axes is None or axes.size != 1 or view.const(node.input[1]) is None or view.const(node.input[2]) is None \
            or (steps is not None and np.any(steps != 1)) or node.input[0] == "":
        return None
    axis = int(axes.reshape(-1)[0]) % rank
    return axis if axis >= rank - 2 else None


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
