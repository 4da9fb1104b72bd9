"""A classifier head's flatten moved after its Gemm, on a BPU that cannot flatten (the optimize stage's rewrite).

A pooled map [N, C, 1, 1] is flattened to [N, C] (Flatten, Reshape or Squeeze) and read by a Gemm,
perhaps through activations. On a march whose BPU has no form for the flatten (bernoulli2 takes
4-D tensors only) the flatten goes to the CPU, and with it everything between the last conv and
the head: the pool, the residual sum, its ReLU. A Gemm over [N, C] is a 1x1 Conv over [N, C, 1, 1],
an element-wise activation of scalar constants does not care about the shape, and a Concat of flattened
maps along their columns is the Concat of the maps along their channels, so the flatten moves past them
to the end of the head: the same values, and the head on the BPU.
"""

from __future__ import annotations

import numpy as np
from onnx import ModelProto, NodeProto, helper, numpy_helper

from hbtools.graph.graph import GraphView
from hbtools.march.profiles import MarchProfile

FLATTENS = ("Flatten", "Reshape", "Squeeze")
# Functions of one tensor whose other inputs, if any, are scalar constants: any shape will do.
_SHAPELESS = ("Relu", "Sigmoid", "Tanh", "HardSigmoid", "HardSwish", "LeakyRelu", "Elu", "Selu", "Clip",
              "Gelu", "Mish", "Softplus", "Abs", "Neg", "Exp", "Erf")
# Ops of two tensors that do not care about the shape when the second is one number (a GELU's Div by sqrt(2)).
_SCALAR_OPERAND = ("Add", "Sub", "Mul", "Div", "Pow", "Max", "Min")
_ROUNDS = 64  # a head of more layers than this keeps the rest of its flatten where it is
_TWO_TENSOR_OPS = ("Add", "Sub", "Mul", "Max", "Min")
_REGION_DEPTH = 16  # nodes followed back from an element-wise op to the flatten it waits for
_SHAPE_ONLY = ("Unsqueeze", "Reshape", "Squeeze", "Flatten", "Identity")
_CHAIN_LIMIT = 8  # shape-only nodes followed from a flatten to the one giving its map back


def _flat_of_pooled(node: NodeProto, view: GraphView) -> bool:
    """Whether ``node`` takes a static [N, C, 1, 1] to [N, C]."""
    src, out = view.shapes.get(node.input[0]), view.shapes.get(node.output[0])
    if src is None or out is None or len(src) != 4 or any(not isinstance(d, int) for d in src):
        return False
    if node.op_type == "Flatten" and view.attrs(node).get("axis", 1) != 1:
        return False
    return src[2:] == [1, 1] and list(out) == src[:2]


def _gemm_as_conv(gemm: NodeProto, x: str, out: str, view: GraphView, model: ModelProto,
                  window: tuple[int, int] = (1, 1), channels_last: bool = False) -> NodeProto | None:
    """The Conv over ``x`` [N, C, H, W] = [N, C, *window] that computes ``gemm`` (a Gemm or MatMul: constant
    weight and bias, A not transposed) of ``x`` flattened, in (C, H, W) order or, ``channels_last``, (H, W, C)."""
    a = view.attrs(gemm)
    b = view.const(gemm.input[1]) if len(gemm.input) > 1 else None
    if a.get("transA", 0) or b is None or b.ndim != 2:
        return None
    weight = (b if a.get("transB", 0) else b.T) * np.float32(a.get("alpha", 1.0))  # [K, C]
    h, w = window
    if weight.shape[1] % (h * w):
        return None
    cin = weight.shape[1] // (h * w)
    kernel = weight.reshape(-1, h, w, cin).transpose(0, 3, 1, 2) if channels_last else weight.reshape(-1, cin, h, w)
    inputs = [x, f"{gemm.name}_conv_weight"]
    if len(gemm.input) > 2 and gemm.input[2]:
        c = view.const(gemm.input[2])
        if c is None or c.size not in (1, weight.shape[0]) or (c.ndim == 2 and c.shape[0] != 1):
            return None  # a bias per row of the batch is not a conv's
        bias = np.broadcast_to(c.reshape(-1), weight.shape[:1]) * np.float32(a.get("beta", 1.0))
        model.graph.initializer.append(numpy_helper.from_array(bias.astype(b.dtype), f"{gemm.name}_conv_bias"))
        inputs.append(f"{gemm.name}_conv_bias")
    model.graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(kernel).astype(b.dtype), inputs[1]))
    return helper.make_node("Conv", inputs, [out], name=gemm.name, kernel_shape=[h, w])


def _past(reader: NodeProto, x: str, out: str, view: GraphView, model: ModelProto,
          siblings: dict[str, str] | None = None) -> NodeProto | None:
    """``reader`` of the flattened tensor rewritten to read the map ``x`` and write the map ``out``. ``siblings``: the
    flattened tensor and what the other readers of its flatten write (moved with it) -> the maps read instead, so
    that an element-wise op of two of them (a hard-swish or swish after a dense layer, ``h * hardsigmoid(h)``,
    either operand first) combines the maps as it did the columns."""
    if reader.domain not in ("", "ai.onnx"):
        return None
    if reader.op_type in ("Gemm", "MatMul"):  # MatMul: a Gemm of defaults, no bias
        return _gemm_as_conv(reader, x, out, view, model)
    if reader.op_type == "Concat":
        return _concat_of_maps(reader, out, view)
    constant = _scalar_operand(reader, view)
    if constant is not None:  # either operand (``0.5 * h``, ``1 - h``)
        return _moved(reader, [i if i == constant else x for i in reader.input], out)
    siblings = siblings or {}
    if reader.op_type in _TWO_TENSOR_OPS and len(reader.input) == 2 and all(i in siblings for i in reader.input):
        return _moved(reader, [siblings[i] for i in reader.input], out)
    others = [i for i in reader.input[1:] if i]
    second = _per_channel_map_constant(reader, x, view, model) or _other_flattened_map(reader, x, view)
    if second is None and (reader.op_type not in _SHAPELESS or
                           any(not view.is_const(i) or view.const(i).size != 1 for i in others)):
        return None
    return _moved(reader, [x, *([second] if second is not None else reader.input[1:])], out)


def _scalar_operand(reader: NodeProto, view: GraphView) -> str | None:
    """The one-number constant operand of ``reader`` (an op of ``_SCALAR_OPERAND`` of it and one tensor), else None."""
    if reader.op_type not in _SCALAR_OPERAND or len(reader.input) != 2 or reader.domain not in ("", "ai.onnx"):
        return None
    constants = [i for i in reader.input if view.is_const(i) and view.const(i).size == 1 and view.const(i).ndim <= 2]
    return constants[0] if len(constants) == 1 else None


def _moved(reader: NodeProto, inputs: list[str], out: str) -> NodeProto:
    moved = NodeProto()
    moved.CopyFrom(reader)
    del moved.input[:], moved.output[:]
    moved.input.extend(inputs)
    moved.output.append(out)
    return moved


def _per_channel_map_constant(reader: NodeProto, x: str, view: GraphView, model: ModelProto) -> str | None:
    """A [C, 1, 1] copy of the constant of ``reader`` (a Mul, Add or Sub by a constant, or a PRelu; a BatchNorm1d
    after an activation, say) when it holds one value per channel of ``x`` [N, C, 1, 1] as [C] or [1, C]: on the
    map it scales, shifts or slopes each channel as it did each column of the flattened tensor. None otherwise."""
    if reader.op_type not in ("Mul", "Add", "Sub", "PRelu") or len(reader.input) != 2:
        return None
    c = view.const(reader.input[1])
    shape = view.shapes.get(x)
    if c is None or shape is None or len(shape) != 4 or shape[2:] != [1, 1] or c.ndim not in (1, 2) or \
            list(c.shape) not in ([shape[1]], [1, shape[1]]) or shape[1] == 1:
        return None
    name = f"{reader.name}_map_constant"
    model.graph.initializer.append(numpy_helper.from_array(c.reshape(-1, 1, 1), name))
    return name


def _other_flattened_map(reader: NodeProto, x: str, view: GraphView) -> str | None:
    """The map of the same shape as ``x`` whose flatten is the second operand of ``reader``, an element-wise op of
    two tensors (CBAM's gate: the sum of one MLP over the average- and the max-pooled map): on the maps it
    combines them as it did their flattened columns. None otherwise."""
    if reader.op_type not in _TWO_TENSOR_OPS or len(reader.input) != 2:
        return None
    flatten = view.producer.get(reader.input[1])
    if flatten is None or flatten.op_type not in FLATTENS or flatten.domain not in ("", "ai.onnx") or \
            not _flat_of_pooled(flatten, view) or view.shapes.get(flatten.input[0]) != view.shapes.get(x):
        return None
    return flatten.input[0]


def _concat_of_maps(concat: NodeProto, out: str, view: GraphView) -> NodeProto | None:
    """``concat`` of flattened pooled maps along their columns (PFLD's multi-scale head: each scale's global pool
    flattened, joined, into one dense layer) as the Concat of the maps along their channels: the same columns in
    the same order. None where an input is no such flatten (a constant, a wider map) or the axis is another."""
    if view.attrs(concat).get("axis") not in (1, -1):
        return None
    maps = []
    for name in concat.input:
        flatten = view.producer.get(name)
        if flatten is None or flatten.op_type not in FLATTENS or flatten.domain not in ("", "ai.onnx") or \
                not _flat_of_pooled(flatten, view):
            return None
        maps.append(flatten.input[0])
    return helper.make_node("Concat", maps, [out], name=concat.name, axis=1)


def _restoring_chain(flatten: NodeProto, view: GraphView) -> list[NodeProto]:
    """The shape-only nodes after ``flatten``, each the only reader of the one before, up to the first that gives
    back the map ``flatten`` flattened ([N, C, 1, 1]): a BatchNorm1d's Unsqueeze, a squeeze-excitation gate
    restored as ``y[:, :, None, None]`` (two Unsqueezes) or ``view(b, c, 1, 1)``. They reorder no value, so the
    map itself is what the last one writes. [] where no such chain follows."""
    target = view.shapes.get(flatten.input[0])
    chain: list[NodeProto] = []
    tensor = flatten.output[0]
    for _ in range(_CHAIN_LIMIT):
        readers = view.consumers.get(tensor, [])
        # the flatten's own output may be a graph output: the flatten then stays for it (``flattens_after_heads``)
        if len(readers) != 1 or (tensor != flatten.output[0] and tensor in view.graph_outputs):
            return []
        reader = readers[0]
        if reader.op_type not in _SHAPE_ONLY or reader.domain not in ("", "ai.onnx") or \
                reader.input[0] != tensor or tensor in reader.input[1:]:
            return []
        chain.append(reader)
        tensor = reader.output[0]
        if view.shapes.get(tensor) == target:
            return [] if tensor in view.graph_outputs else chain
    return []


def flattens_after_heads(model: ModelProto, profile: MarchProfile) -> int:
    """Move each flatten of a pooled map that ``profile``'s BPU cannot run past the Gemms and activations
    that read it (see the module docstring). The count of nodes moved past."""
    moved = 0
    for _ in range(_ROUNDS):
        view = GraphView(model)
        changes: dict[str, list[NodeProto]] = {}  # node name -> what replaces it ([] removes it)
        renamed: dict[str, str] = {}  # tensor -> the tensor read in its place
        handled = 0  # flattens moved or removed this round
        for node in model.graph.node:
            if node.op_type not in FLATTENS or node.domain not in ("", "ai.onnx") or \
                    profile.rule(node.op_type) is not None or not _flat_of_pooled(node, view):
                continue
            readers = view.consumers.get(node.output[0], [])
            if not readers or any(r.name in changes for r in readers):
                continue
            # A flattened vector asked for as a graph output (an MTCNN feature tapped by ``output_nodes``) keeps its
            # flatten, a branch to that output; the layers reading it still move onto the map, or the flatten would
            # stay on the main path and take them to the CPU.
            kept = node.output[0] in view.graph_outputs
            restoring = _restoring_chain(node, view)
            if restoring and not any(n.name in changes for n in restoring):  # the flatten undone: all of it goes
                renamed[restoring[-1].output[0]] = node.input[0]
                for gone in restoring if kept else (node, *restoring):
                    changes[gone.name] = []
                handled += 1
                continue
            # the flattened tensor must be each reader's first input (a Gemm's A, an activation's X), or any of a
            # Concat's; several readers (MTCNN's box, landmark and score heads) each get a flatten of their own
            siblings = {node.output[0]: node.input[0], **{r.output[0]: f"{r.output[0]}_map" for r in readers}}
            new = [_past(r, node.input[0], f"{r.output[0]}_map", view, model, siblings) if r.op_type == "Concat" or
                   (r.input[0] == node.output[0] and node.output[0] not in r.input[1:]) or
                   _scalar_operand(r, view) is not None or
                   (r.op_type in _TWO_TENSOR_OPS and all(i in siblings for i in r.input)) else None for r in readers]
            if any(n is None for n in new):
                # Readers that combine the flattened tensor with a chain computed from it (a GELU's product) follow
                # once that chain has moved: the others move now, and the flatten stays for those until then.
                if all(n is None for n in new) or not all(
                        _waits_for(r, node, view) for r, n in zip(readers, new, strict=True) if n is None):
                    continue
                kept = True
            if not kept:
                changes[node.name] = []
            handled += 1
            for r, moved_reader in zip(readers, new, strict=True):
                if moved_reader is None:
                    continue
                name = node.name if len(readers) == 1 and not kept else f"{node.name}_{r.name}"
                changes[r.name] = [moved_reader, helper.make_node("Flatten", [f"{r.output[0]}_map"], [r.output[0]],
                                                                  name=name, axis=1)]
        if not changes:
            break
        nodes = [n for node in model.graph.node for n in changes.get(node.name, [node])]
        for n in nodes:
            for k, name in enumerate(n.input):
                n.input[k] = renamed.get(name, name)
        del model.graph.node[:]
        model.graph.node.extend(nodes)
        moved += handled
    return moved


def _waits_for(reader: NodeProto, flatten: NodeProto, view: GraphView) -> bool:
    """Whether ``reader``, an element-wise op of the tensor ``flatten`` writes and another, gets that other from the
    same map through element-wise ops and flattens of pooled maps only: once those have moved onto the map, it
    combines two flattened maps and moves too (``_other_flattened_map``)."""
    if reader.op_type not in _TWO_TENSOR_OPS or len(reader.input) != 2 or reader.domain not in ("", "ai.onnx"):
        return False
    sources = {flatten.output[0], flatten.input[0]}
    pending, seen = [i for i in reader.input if i != flatten.output[0]], set()
    while pending:
        tensor = pending.pop()
        if tensor in sources or tensor in seen or view.is_const(tensor):
            continue
        seen.add(tensor)
        node = view.producer.get(tensor)
        if len(seen) > _REGION_DEPTH or node is None or node.domain not in ("", "ai.onnx") or \
                node.op_type not in (*_SHAPELESS, *_SCALAR_OPERAND, *FLATTENS):
            return False
        if node.op_type in FLATTENS and not _flat_of_pooled(node, view):
            return False
        pending.extend(i for i in node.input[:1 if node.op_type in FLATTENS else None] if i)
    return True


def _flattened_map(flatten: NodeProto, view: GraphView) -> tuple[str, list[int], bool] | None:
    """(map, its [N, C, H, W], channels_last) when ``flatten`` takes a static 4-D map to [N, C*H*W], directly
    or through a Transpose to NHWC (a Keras Flatten exported by tf2onnx); None otherwise."""
    if flatten.op_type not in ("Flatten", "Reshape") or flatten.domain not in ("", "ai.onnx") or \
            (flatten.op_type == "Flatten" and view.attrs(flatten).get("axis", 1) != 1):
        return None
    src, out = view.shapes.get(flatten.input[0]), view.shapes.get(flatten.output[0])
    if src is None or out is None or len(src) != 4 or any(not isinstance(d, int) for d in src) or \
            list(out) != [src[0], int(np.prod(src[1:]))]:
        return None
    t = view.producer.get(flatten.input[0])
    if t is not None and t.op_type == "Transpose" and t.domain in ("", "ai.onnx") and \
            list(view.attrs(t).get("perm", [])) == [0, 2, 3, 1]:
        n, h, w, c = src
        return t.input[0], [n, c, h, w], True
    return flatten.input[0], list(src), False


def wide_flattens_as_convs(model: ModelProto, profile: MarchProfile) -> int:
    """A Gemm (or MatMul) that reads a flattened [N, C, H, W] map with more inputs C*H*W than the BPU's
    channel limit (VGG's 7x7x512 = 25088 into its first dense layer) runs on the CPU, and with it the rest of
    the head. The same sums are a Conv with an H x W kernel over the map: C input channels, one output pixel;
    a Flatten after it gives the Gemm's [N, M] (moved further by ``flattens_after_heads`` where the BPU has
    none). The same where the BPU has no flatten at all (bernoulli2: MTCNN's 3x3x128 map into its dense layer).
    Only where the Gemm is over the limit or the flatten off the BPU, and the Conv fits: other heads keep their
    Gemm. The count."""
    gemm_rule, conv_rule = profile.rule("Gemm"), profile.rule("Conv")
    if gemm_rule is None or conv_rule is None or gemm_rule.channels is None:
        return 0
    view = GraphView(model)
    changes: dict[str, list[NodeProto]] = {}
    for node in model.graph.node:
        if node.op_type not in ("Gemm", "MatMul") or node.domain not in ("", "ai.onnx") or len(node.input) < 2:
            continue
        flatten = view.producer.get(node.input[0])
        b = view.const(node.input[1])
        if flatten is None or b is None or b.ndim != 2:
            continue
        # a flattened map that is also a graph output or read by other layers keeps its flatten for them
        shared = node.input[0] in view.graph_outputs or len(view.consumers.get(node.input[0], [])) != 1
        k = b.shape[0] if not view.attrs(node).get("transB", 0) else b.shape[1]
        found = _flattened_map(flatten, view)
        # also where the BPU cannot flatten (bernoulli2): the flatten would take the head to the CPU
        if found is None or (k <= gemm_rule.channels and profile.rule(flatten.op_type) is not None):
            continue
        x, (_, c, h, w), channels_last = found
        if c > (conv_rule.channels or c) or max(h, w) > (conv_rule.kernel or max(h, w)) or h * w == 1:
            continue
        conv = _gemm_as_conv(node, x, f"{node.output[0]}_map", view, model, (h, w), channels_last)
        if conv is None:
            continue
        if not shared:
            changes[flatten.name] = []
        # An activation reading the dense layer alone moves before the new Flatten, onto the map, where it fuses
        # into the Conv (VGG's Relu after its first dense layer was a lookup table of its own).
        readers = view.consumers.get(node.output[0], [])
        act = readers[0] if len(readers) == 1 and node.output[0] not in view.graph_outputs else None
        moved = _past(act, conv.output[0], f"{act.output[0]}_map", view, model) \
            if act is not None and act.op_type in _SHAPELESS and act.name not in changes else None
        on_map = [conv] if moved is None else [conv, moved]
        if moved is not None:
            changes[act.name] = []
        flat_out = node.output[0] if moved is None else act.output[0]
        changes[node.name] = [*on_map, helper.make_node("Flatten", [on_map[-1].output[0]], [flat_out],
                                                        name=f"{node.name}_flatten", axis=1)]
    if changes:
        nodes = [n for node in model.graph.node for n in changes.get(node.name, [node])]
        del model.graph.node[:]
        model.graph.node.extend(nodes)
    return sum(1 for name, nodes in changes.items() if nodes)  # each rewritten dense layer
