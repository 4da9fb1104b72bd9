"""MatMul and Einsum in the forms the BPU has: vectors as matrices, the weight second, products read in slices as one
per slice.
"""

from __future__ import annotations

import string
from collections.abc import Mapping

import numpy as np
import onnx
from onnx import ModelProto, NodeProto, helper, numpy_helper

from hbtools.graph.bpu_forms._common import _axes_node, _opset
from hbtools.graph.graph import GraphView, is_static, rewrite_nodes
from hbtools.march.profiles import MarchProfile


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


MAX_WEIGHT_BATCH = 64  # per-batch MatMuls a batched constant weight may become


def matmuls_of_batched_weights(model: ModelProto, profile: MarchProfile) -> int:
    """A MatMul of a float activation and a constant batched along one leading axis (a weight per attention
    head: relative-position terms ``q @ P[h]``, learned queries per head ``Q[h] @ k``) as one MatMul per
    batch index with that index's 2-D matrix as its weight, joined by a Concat along the axis: the BPU's
    MatMul takes a [K, N] weight, and the batched one ran on the CPU. The activation is split along the
    axis where it has the constant's size there, and read whole by every product where it has one. A
    constant first operand is written as ``(X^T @ A^T)^T`` as ``matmuls_with_the_weight_second`` does,
    where ``profile``'s BPU has that Transpose. At most ``MAX_WEIGHT_BATCH`` products, and only where
    ``profile``'s BPU takes the Split and the Concat (RDK X3: 4-D only). The count rewritten."""
    view = GraphView(model)
    return rewrite_nodes(model, lambda node: _per_batch(node, view, model, profile))


def _per_batch(node: NodeProto, view: GraphView, model: ModelProto, profile: MarchProfile) -> list[NodeProto] | None:
    found = _constant_operand(node, view)
    if found is None:
        return None
    k, weight, x = found
    shape = view.shapes.get(x)
    if weight.ndim < 3 or shape is None or len(shape) < weight.ndim or not is_static(shape) \
            or view.elem_types.get(x) != onnx.TensorProto.FLOAT or (k == 0 and not _swap_on_bpu(profile, len(shape))):
        return None
    rank = len(shape)
    batch = [1] * (rank - weight.ndim) + list(weight.shape[:-2])  # the weight's batch axes against x's
    axes = [a for a, d in enumerate(batch) if d != 1]
    if len(axes) != 1 or not 1 < batch[axes[0]] <= MAX_WEIGHT_BATCH or shape[axes[0]] not in (1, batch[axes[0]]):
        return None
    axis, count = axes[0], batch[axes[0]]
    if not _joins_on_bpu(profile, rank, axis, split=shape[axis] == count):
        return None  # the products would each cross to the CPU: one batched MatMul there is simpler
    matrices = weight.reshape(count, *weight.shape[-2:])
    opset = _opset(model)
    nodes = []
    perm = [*range(rank - 2), rank - 1, rank - 2]
    if k == 0:  # A @ X = (X^T @ A^T)^T
        xt = f"{node.output[0]}_{node.name}_xt"
        nodes.append(helper.make_node("Transpose", [x], [xt], name=f"{node.name}_xt", perm=perm))
        x, matrices = xt, np.ascontiguousarray(matrices.transpose(0, 2, 1))
    pieces = [x] * count
    if shape[axis] == count:
        pieces = [f"{x}_{node.name}_batch{g}" for g in range(count)]
        if opset >= 18:
            nodes.append(helper.make_node("Split", [x], pieces, name=f"{node.name}_batches", axis=axis,
                                          num_outputs=count))
        else:
            nodes.append(helper.make_node("Split", [x], pieces, name=f"{node.name}_batches", axis=axis))
    products = []
    for g, piece in enumerate(pieces):
        matrix = f"{node.input[k]}_{node.name}_matrix{g}"
        model.graph.initializer.append(numpy_helper.from_array(matrices[g], matrix))
        products.append(f"{node.output[0]}_{node.name}_product{g}")
        nodes.append(helper.make_node("MatMul", [piece, matrix], [products[-1]], name=f"{node.name}_batch{g}"))
    joined = f"{node.output[0]}_{node.name}_joined" if k == 0 else node.output[0]
    nodes.append(helper.make_node("Concat", products, [joined], name=node.name, axis=axis))
    if k == 0:
        nodes.append(helper.make_node("Transpose", [joined], [node.output[0]], name=f"{node.name}_yt", perm=perm))
    return nodes


def _constant_operand(node: NodeProto, view: GraphView) -> tuple[int, np.ndarray, str] | None:
    """For a standard MatMul of one constant and one computed operand: the constant's position (0: first), its
    value and the computed operand; None for any other node."""
    if node.op_type != "MatMul" or node.domain not in ("", "ai.onnx") or len(node.input) != 2:
        return None
    first, second = node.input
    k = 0 if view.is_const(first) and not view.is_const(second) else \
        1 if view.is_const(second) and not view.is_const(first) else None
    return None if k is None else (k, view.const(node.input[k]), node.input[1 - k])


def _swap_on_bpu(profile: MarchProfile, rank: int) -> bool:
    """Whether ``profile``'s BPU runs a Transpose of the last two axes of a rank-``rank`` tensor."""
    rule = profile.rule("Transpose")
    perm = (*range(rank - 2), rank - 1, rank - 2)
    return rule is not None and (rule.perms is None or perm in rule.perms)


def _joins_on_bpu(profile: MarchProfile, rank: int, axis: int, *, split: bool) -> bool:
    """Whether ``profile``'s BPU runs a Concat of rank-``rank`` tensors along ``axis`` (and, ``split``, the Split
    before the products)."""
    rules = [profile.rule("Concat"), *([profile.rule("Split")] if split else [])]
    return all(rule is not None and rule.ranks[0] <= rank <= rule.ranks[1]
               and (rule.axes is None or axis in rule.axes) for rule in rules)


def _weight_second(node: NodeProto, view: GraphView, model: ModelProto,
                   profile: MarchProfile) -> list[NodeProto] | None:
    found = _constant_operand(node, view)
    if found is None:
        return None
    k, weight, x = found
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


def einsums_as_matmuls(model: ModelProto) -> int:
    """A two-operand Einsum that is a batched matrix product (``torch.einsum`` in attention code:
    ``bhdn,bhdm->bhnm``, ``bnc,ck->bnk``) as Transpose, Reshape, MatMul, Reshape, Transpose: the BPU has a
    MatMul, no Einsum. Each letter must be a batch axis (in both operands and the output), a contracted
    one (in both operands only) or a free one (in one operand and the output), of static size; the
    others (a trace, a sum over one operand's axis) stay as they are; an ellipsis is
    spelled out in letters first. Returns how many."""
    view = GraphView(model)
    return rewrite_nodes(model, lambda node: _einsum_matmul(node, view, model)
                         if node.op_type == "Einsum" and len(node.input) == 2 else None)


def _ellipsis_spelled_out(equation: str, ranks: list[int]) -> str | None:
    """``equation`` with each ``...`` written as letters it does not use, as many as the axes it stands for in each
    operand of ``ranks`` (aligned from the right, as broadcasting aligns them); None where that does not work out."""
    ins, out = equation.split("->")
    terms = ins.split(",")
    if "..." not in equation:
        return None if "." in equation else equation
    if len(terms) != len(ranks) or "." in equation.replace("...", "") or "..." not in out:
        return None  # (an ellipsis summed away: onnxruntime refuses such an equation, so it stays as it is)
    counts = [rank - (len(t) - 3) if "..." in t else 0 for t, rank in zip(terms, ranks, strict=True)]
    spare = [c for c in string.ascii_letters if c not in equation]
    most = max(counts)
    if min(counts) < 0 or most > len(spare):
        return None
    letters = "".join(spare[:most])
    terms = [t.replace("...", letters[most - n:]) for t, n in zip(terms, counts, strict=True)]
    return ",".join(terms) + "->" + out.replace("...", letters)


def _einsum_matmul(node: NodeProto, view: GraphView, model: ModelProto) -> list[NodeProto] | None:
    equation = view.attrs(node).get("equation", b"")
    equation = (equation.decode() if isinstance(equation, bytes) else equation).replace(" ", "")
    shapes = [view.shapes.get(i) for i in node.input]
    if "->" not in equation or any(s is None for s in shapes):
        return None
    equation = _ellipsis_spelled_out(equation, [len(s) for s in shapes])
    if equation is None:
        return None
    ins, out = equation.split("->")
    terms = ins.split(",")
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


def gemms_with_the_first_input_transposed(model: ModelProto, profile: MarchProfile) -> int:
    """A Gemm with ``transA`` (torch's ``fc(f.view(c, hw).t())``, a per-pixel MLP; onnxruntime's fusion of a
    Transpose before a Gemm writes it too) as a Transpose of its first input before a plain Gemm, where
    ``profile``'s BPU has that Transpose: the BPU's Gemm reads its activation untransposed, so the Gemm ran in
    float on the CPU and split the BPU graph around it. The count rewritten."""
    if not _swap_on_bpu(profile, 2):
        return 0
    view = GraphView(model)

    def rewrite(node: NodeProto) -> list[NodeProto] | None:
        if node.op_type != "Gemm" or node.domain not in ("", "ai.onnx") or not view.attrs(node).get("transA", 0) \
                or view.is_const(node.input[0]):
            return None
        flipped = f"{node.input[0]}_{node.name}_transposed"
        gemm = helper.make_node("Gemm", [flipped, *node.input[1:]], list(node.output), name=node.name)
        gemm.attribute.extend(a for a in node.attribute if a.name != "transA")
        return [helper.make_node("Transpose", [node.input[0]], [flipped], name=f"{node.name}_transpose_a",
                                 perm=[1, 0]), gemm]

    return rewrite_nodes(model, rewrite)
