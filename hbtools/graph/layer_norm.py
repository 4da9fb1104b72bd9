"""Layer normalizations as one node (``HzLayerNorm``), however the exporter wrote them.

PyTorch writes ``LayerNormalization`` from opset 17 (and ``InstanceNormalization``, the
same over the spatial axes with a scale per channel); older exports and Paddle write it
out: ``m = ReduceMean(x)``, ``d = x - m``, ``Pow(d, 2)`` (or ``d * d``), ``ReduceMean``,
``Add`` epsilon, ``Sqrt``, ``Div`` (or ``Mul`` by a ``Reciprocal``), then an optional
``Mul`` by the scale and ``Add`` of the bias. The axes may be the last ones or the
channels of an NCHW map (ConvNeXt's LayerNorm2d); some Paddle exports transpose ``d``
between the mean and the variance. ONNX's GroupNormalization (opset 21), which onnxruntime
expands into its function body, takes the variance as ``ReduceMean(x * x) - m * m`` instead.
tf2onnx (tf.nn.moments + tf.nn.batch_normalization, Keras) scales by ``g = gamma / Sqrt(var + eps)``
and adds ``beta - m * g`` to ``x * g``; flax / jax2tf take the means as ``ReduceSum(.) * (1/N)`` (maybe
without keepdims, then a Reshape back), clamp the variance with ``Max(., 0)`` and write the inverse root
as ``Reciprocal(Sqrt)``, ``Pow(., -0.5)`` or ``1 / Sqrt``; these are matched around the epsilon's Add.
As one node the normalization has one BPU kernel (``hbtools.ops.layer_norm``) that keeps the
variance exact, where the pieces would each round onto a grid.
"""

from __future__ import annotations

import numpy as np
from onnx import ModelProto, NodeProto, helper, numpy_helper

from hbtools.graph.graph import GraphView
from hbtools.graph.model_io import with_horizon_domain
from hbtools.ops.layer_norm import HzLayerNorm


def fuse_layer_norms(model: ModelProto) -> int:
    """Rewrite ``model``'s layer normalizations as HzLayerNorm nodes; returns how many."""
    view = GraphView(model)
    replaced: dict[str, list[NodeProto]] = {}  # name of the node the new ones stand in for -> new nodes
    removed: set[str] = set()
    for node in model.graph.node:
        if node.domain not in ("", "ai.onnx") or node.name in removed:
            continue
        found = _standard(node, view, model) if node.op_type == "LayerNormalization" else \
            _instance(node, view, model) if node.op_type == "InstanceNormalization" else \
            _spelled_out(node, view, model) if node.op_type in ("Pow", "Mul") else None
        if found is None and node.op_type == "Mul":
            found = _moments(node, view, model)
        if found is None and node.op_type == "Add":
            found = _around_epsilon(node, view, model)
        if found is None:
            continue
        old, new = found
        if any(n.name in removed for n in old):
            continue
        removed.update(n.name for n in old)
        replaced[old[-1].name] = new
    if not replaced:
        return 0
    nodes = []
    for node in model.graph.node:
        if node.name in replaced:
            nodes.extend(replaced[node.name])
        elif node.name not in removed:
            nodes.append(node)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    with_horizon_domain(model)
    return len(replaced)


def _standard(node: NodeProto, view: GraphView, model: ModelProto) -> tuple[list[NodeProto], list[NodeProto]] | None:
    """A LayerNormalization op with constant scale (and bias). Where its Mean / InvStdDev outputs are read
    (training-style exports, ONNX's own test cases), a copy of the op computes them in float beside the
    HzLayerNorm, whose kernel gives Y only; the copy's Y goes to a tensor nobody reads."""
    if len(node.input) < 2 or not all(view.is_const(i) for i in node.input[1:] if i) \
            or not view.is_read(node.output[0]):
        return None
    a = view.attrs(node)
    shape = view.shapes.get(node.input[0])
    if shape is None:
        return None
    axis = int(a.get("axis", -1)) % len(shape)
    scale = view.const(node.input[1])
    bias = view.const(node.input[2]) if len(node.input) > 2 and node.input[2] else None
    params = _params(scale, bias, shape[axis:])
    if params is None:
        return None
    names = _constants(model, node.name, *params)
    new = HzLayerNorm.make_node([node.input[0], *names], [node.output[0]], node.name,
                                axes=list(range(axis - len(shape), 0)), epsilon=float(a.get("epsilon", 1e-5)))
    statistics = [o for o in node.output[1:] if view.is_read(o)]
    if not statistics:
        return [node], [new]
    # Every output of the copy is named: a CPU node's omitted ("") output has no type to compare it by.
    outputs = [o if o in statistics else f"{node.output[0]}_{node.name}_unread{k}" for k, o in enumerate(node.output)]
    copy = helper.make_node(node.op_type, list(node.input), outputs, name=f"{node.name}_statistics")
    copy.attribute.extend(node.attribute)
    return [node], [new, copy]

def _instance(node: NodeProto, view: GraphView, model: ModelProto) -> tuple[list[NodeProto], list[NodeProto]] | None:
    """InstanceNormalization: a normalization over the spatial axes, with a scale and bias per channel."""
    shape = view.shapes.get(node.input[0])
    if shape is None or len(shape) < 3 or not all(view.is_const(i) for i in node.input[1:3]):
        return None
    per_channel = [-1] + [1] * (len(shape) - 2)
    scale, bias = (view.const(i).astype(np.float32).reshape(per_channel) for i in node.input[1:3])
    names = _constants(model, node.name, scale, bias)
    eps = float(view.attrs(node).get("epsilon", 1e-5))
    return [node], [HzLayerNorm.make_node([node.input[0], *names], [node.output[0]], node.name,
                                          axes=list(range(2 - len(shape), 0)), epsilon=eps)]


def _spelled_out(square: NodeProto, view: GraphView, model: ModelProto) -> tuple[list[NodeProto],
                                                                                   list[NodeProto]] | None:
    """The written-out pattern around its squaring node ``square`` (Pow by 2 or Mul of d by d)."""
    d = square.input[0]
    if square.op_type == "Pow":
        exponent = view.const(square.input[1]) if len(square.input) > 1 else None
        if exponent is None or exponent.size != 1 or float(exponent.reshape(-1)[0]) != 2.0:
            return None
    elif len(square.input) != 2 or square.input[1] != d:
        return None
    shape = view.shapes.get(d)
    variance = _only_user(view, square.output[0], "ReduceMean")
    if shape is None or variance is None or not view.attrs(variance).get("keepdims", 1):
        return None
    axes = view.reduced_axes(variance)
    if not axes or axes[0] == 0:  # over the last axes, or over channels (ConvNeXt's LayerNorm2d); not the batch
        return None
    param_shape = [shape[k] if k in axes else 1 for k in range(axes[0], len(shape))]
    shifted = _only_user(view, variance.output[0], "Add")
    eps = _scalar_operand(shifted, variance.output[0], view) if shifted is not None else None
    root = _only_user(view, shifted.output[0], "Sqrt") if eps is not None else None
    if root is None:
        return None
    division = _division(view, d, root)
    if division is None:
        return None
    chain = [variance, shifted, root, *division]
    normalized = division[-1]
    if {id(n) for n in view.consumers.get(d, [])} != {id(square), id(normalized)}:
        return None
    head = _centring(d, axes, view)
    if head is None:
        return None
    x, moved, centring = head
    tail, scale, bias = _affine(normalized, view, param_shape)
    params = _params(scale, bias, param_shape)
    old = [*centring, square, *chain, *tail]
    if params is None or any(o in view.graph_outputs for n in old[:-1] for o in n.output):
        return None
    name = centring[0].name
    names = _constants(model, name, *params)
    new = []
    if moved is not None:  # the transpose moves x instead of x - mean
        new.append(helper.make_node("Transpose", [x], [f"{x}_{name}_moved"], name=moved.name,
                                    perm=view.attrs(moved)["perm"]))
        x = new[-1].output[0]
    new.append(HzLayerNorm.make_node([x, *names], [old[-1].output[0]], name, axes=[k - len(shape) for k in axes],
                                     epsilon=eps))
    return old, new


def _division(view: GraphView, d: str, root: NodeProto) -> list[NodeProto] | None:
    """``d / root``: a Div, or a Reciprocal of root and a Mul by it (its nodes, the normalized output last)."""
    users = view.consumers.get(root.output[0], [])
    if len(users) != 1:
        return None
    if users[0].op_type == "Div" and list(users[0].input) == [d, root.output[0]]:
        return [users[0]]
    if users[0].op_type == "Reciprocal":
        normalized = _only_user(view, users[0].output[0], "Mul")
        if normalized is not None and set(normalized.input) == {d, users[0].output[0]}:
            return [users[0], normalized]
    return None


def _moments(square: NodeProto, view: GraphView, model: ModelProto) -> tuple[list[NodeProto],
                                                                             list[NodeProto]] | None:
    """The normalization with the variance as E[x*x] - E[x]**2 (ONNX's own function body of
    GroupNormalization, which onnxruntime expands), around its squaring node ``square`` (Mul of x by x):
    ``(x - m) / Sqrt(ReduceMean(x*x) - m*m + eps)``, ``m = ReduceMean(x)``. As one node the variance
    is not the difference of two rounded terms either."""
    if len(square.input) != 2 or square.input[0] != square.input[1]:
        return None
    x = square.input[0]
    shape = view.shapes.get(x)
    mean_of_square = _only_user(view, square.output[0], "ReduceMean")
    if shape is None or mean_of_square is None or not view.attrs(mean_of_square).get("keepdims", 1):
        return None
    axes = view.reduced_axes(mean_of_square)
    variance = _only_user(view, mean_of_square.output[0], "Sub")
    if not axes or axes[0] == 0 or variance is None or variance.input[0] != mean_of_square.output[0]:
        return None
    square_of_mean = view.producer.get(variance.input[1])
    if square_of_mean is None or square_of_mean.op_type != "Mul" or len(set(square_of_mean.input)) != 1 \
            or len(view.consumers.get(square_of_mean.output[0], [])) != 1:
        return None
    m = square_of_mean.input[0]
    mean = view.producer.get(m)
    if mean is None or mean.op_type != "ReduceMean" or mean.input[0] != x or not view.attrs(mean).get("keepdims", 1) \
            or view.reduced_axes(mean) != axes:
        return None
    centring = [u for u in view.consumers.get(m, []) if u is not square_of_mean]
    if len(centring) != 1 or centring[0].op_type != "Sub" or list(centring[0].input) != [x, m]:
        return None
    d = centring[0].output[0]
    shifted = _only_user(view, variance.output[0], "Add")
    eps = _scalar_operand(shifted, variance.output[0], view) if shifted is not None else None
    root = _only_user(view, shifted.output[0], "Sqrt") if eps is not None else None
    division = _division(view, d, root) if root is not None else None
    if division is None or len(view.consumers.get(d, [])) != 1:
        return None
    param_shape = [shape[k] if k in axes else 1 for k in range(axes[0], len(shape))]
    tail, scale, bias = _affine(division[-1], view, param_shape)
    params = _params(scale, bias, param_shape)
    old = [square, mean_of_square, mean, square_of_mean, variance, centring[0], shifted, root, *division, *tail]
    if params is None or any(o in view.graph_outputs for n in old[:-1] for o in n.output):
        return None
    names = _constants(model, mean.name, *params)
    return old, [HzLayerNorm.make_node([x, *names], [old[-1].output[0]], mean.name,
                                       axes=[k - len(shape) for k in axes], epsilon=eps)]


def _centring(d: str, axes: list[int], view: GraphView) -> tuple[str, NodeProto | None, list[NodeProto]] | None:
    """``d = x - ReduceMean(x)`` over ``axes`` of d, maybe transposed after the Sub: (x, the Transpose, nodes)."""
    producer = view.producer.get(d)
    moved = None
    if producer is not None and producer.op_type == "Transpose":
        moved, perm = producer, view.attrs(producer).get("perm")
        producer = view.producer.get(producer.input[0])
        if perm is None or producer is None or len(view.consumers.get(producer.output[0], [])) != 1:
            return None
        axes = sorted(int(perm[k]) for k in axes)
    if producer is None or producer.op_type != "Sub":
        return None
    x, m = producer.input[:2]
    mean = view.producer.get(m)
    if mean is None or mean.op_type != "ReduceMean" or mean.input[0] != x or len(view.consumers.get(m, [])) != 1 \
            or not view.attrs(mean).get("keepdims", 1) or view.reduced_axes(mean) != axes:
        return None
    return x, moved, [mean, producer, *([moved] if moved is not None else [])]


def _affine(normalized: NodeProto, view: GraphView, param_shape: list) -> tuple[list[NodeProto], np.ndarray | None,
                                                                                np.ndarray | None]:
    """The Mul by a constant scale and the Add of a constant bias that follow the normalization, where their
    constants vary only along the normalized axes (either may be missing): (their nodes, scale, bias)."""
    tail: list[NodeProto] = []
    found: dict[str, np.ndarray] = {}
    last = normalized
    for op in ("Mul", "Add"):
        user = _only_user(view, last.output[0], op)
        value = _tensor_operand(user, last.output[0], view) if user is not None else None
        if value is None or _params(value, None, param_shape) is None:
            continue
        tail.append(user)
        found[op] = value
        last = user
    return tail, found.get("Mul"), found.get("Add")


def _params(scale: np.ndarray | None, bias: np.ndarray | None, param_shape: list) -> tuple[np.ndarray,
                                                                                        np.ndarray] | None:
    """scale and bias as float32 arrays of ``param_shape`` (x's shape from the first normalized axis on, 1 along
    the others), None where they vary along another axis."""
    if any(not isinstance(v, int) or v <= 0 for v in param_shape):
        return None
    out = []
    for value, default in ((scale, 1.0), (bias, 0.0)):
        if value is None:
            out.append(np.full(param_shape, default, dtype=np.float32))
            continue
        trimmed = value.reshape(value.shape[next((k for k, v in enumerate(value.shape) if v != 1),
                                                 len(value.shape)):])
        if len(trimmed.shape) > len(param_shape):
            return None
        try:
            out.append(np.broadcast_to(trimmed, param_shape).astype(np.float32))
        except ValueError:
            return None
    return out[0], out[1]


def _constants(model: ModelProto, name: str, scale: np.ndarray, bias: np.ndarray) -> list[str]:
    taken = {t.name for t in model.graph.initializer}
    names = []
    for what, value in (("scale", scale), ("bias", bias)):
        new = f"{name}_{what}"
        while new in taken:
            new += "_"
        model.graph.initializer.append(numpy_helper.from_array(value, new))
        names.append(new)
    return names


def _only_user(view: GraphView, tensor: str, op: str) -> NodeProto | None:
    users = view.consumers.get(tensor, [])
    if len(users) != 1 or users[0].op_type != op or tensor in view.graph_outputs:
        return None
    return users[0]


def _tensor_operand(node: NodeProto, x: str, view: GraphView) -> np.ndarray | None:
    """The float constant ``node`` combines with ``x`` (its other input), else None."""
    if len(node.input) != 2 or x not in node.input:
        return None
    other = node.input[1] if node.input[0] == x else node.input[0]
    value = view.const(other)
    return value if value is not None and value.dtype == np.float32 else None


def _scalar_operand(node: NodeProto, x: str, view: GraphView) -> float | None:
    value = _tensor_operand(node, x, view)
    return float(value.reshape(-1)[0]) if value is not None and value.size == 1 else None


def _around_epsilon(shifted: NodeProto, view: GraphView, model: ModelProto) -> tuple[list[NodeProto],
                                                                                   list[NodeProto]] | None:
    """The forms of tf2onnx (Keras) and flax / jax2tf, around the Add of epsilon to the variance: the variance
    as the mean of ``(x - m)**2`` or as ``mean(x * x) - m * m`` (maybe clamped by ``Max(., 0)``), means as
    ReduceMean or ReduceSum times 1/N, the inverse root as Reciprocal(Sqrt), Pow -0.5 or 1 / Sqrt, times an
    optional constant scale, then applied as ``(x - m) * g`` or as ``x * g + (beta - m * g)``."""
    if len(shifted.input) != 2:
        return None
    var = next((i for i in shifted.input if not view.is_const(i)), None)
    eps = _scalar_operand(shifted, var, view) if var is not None else None
    found = _variance(var, view) if eps is not None and eps >= 0 else None
    if found is None:
        return None
    x, axes, nodes = found
    shape = view.shapes.get(x)
    if shape is None or not axes or axes[0] == 0 or view.shapes.get(shifted.output[0]) != \
            [1 if k in axes else v for k, v in enumerate(shape)]:
        return None
    param_shape = [shape[k] if k in axes else 1 for k in range(axes[0], len(shape))]
    inverse = _inverse_root(shifted.output[0], view)
    if inverse is None:
        return None
    g, chain, scale = inverse
    user = _only_user(view, g, "Mul")
    value = _tensor_operand(user, g, view) if user is not None else None
    if value is not None:
        scale, g, chain = value if scale is None else value * scale, user.output[0], [*chain, user]

    def mean_of_x(t: str) -> list[NodeProto] | None:  # t as x's mean with the reduced axes kept
        mean = _mean(t, view)
        kept = view.shapes.get(t) == [1 if k in axes else v for k, v in enumerate(shape)]
        return mean[2] if kept and mean is not None and mean[:2] == (x, axes) else None

    applied = _applied(x, mean_of_x, g, view, param_shape)
    if applied is None:
        return None
    tail, bias, means = applied
    more, extra_scale, extra_bias = _affine(tail[-1], view, param_shape)
    if extra_scale is not None or (bias is not None and extra_bias is not None):
        more = []  # a second scale (or bias) stays a node of its own
    elif extra_bias is not None:
        bias = extra_bias
    params = _params(scale, bias, param_shape)
    old = list({id(n): n for n in [*nodes, *means, shifted, *chain, *tail, *more]}.values())
    inside = {id(n) for n in old}
    if params is None or any(o in view.graph_outputs or any(id(u) not in inside for u in view.consumers.get(o, []))
                             for n in old[:-1] for o in n.output):
        return None
    first = next(n for n in model.graph.node if id(n) in inside)
    names = _constants(model, first.name, *params)
    return old, [HzLayerNorm.make_node([x, *names], [old[-1].output[0]], first.name,
                                       axes=[k - len(shape) for k in axes], epsilon=eps)]


def _mean(t: str, view: GraphView) -> tuple[str, list[int], list[NodeProto]] | None:
    """``t`` as the mean of a tensor over some of its axes, with the reduced axes kept or dropped: ReduceMean, or
    ReduceSum times 1/N (or divided by N), maybe reshaped between: (tensor, axes, nodes)."""
    nodes: list[NodeProto] = []
    factor = 1.0
    node = view.producer.get(t)
    while node is not None and node.op_type in ("Reshape", "Unsqueeze", "Squeeze", "Mul", "Div"):
        if node.op_type in ("Mul", "Div"):
            operand = [i for i in node.input if not view.is_const(i)]
            if len(operand) != 1 or (node.op_type == "Div" and node.input[0] != operand[0]):
                return None
            value = _scalar_operand(node, operand[0], view)
            if value is None or value == 0:
                return None
            factor *= value if node.op_type == "Mul" else 1.0 / value
        elif not all(view.is_const(i) for i in node.input[1:] if i):
            return None
        nodes.append(node)
        node = view.producer.get(node.input[0] if node.op_type not in ("Mul", "Div") else operand[0])
    if node is None or node.op_type not in ("ReduceMean", "ReduceSum"):
        return None
    x = node.input[0]
    shape, axes = view.shapes.get(x), view.reduced_axes(node)
    if not axes or shape is None or any(not isinstance(shape[k], int) for k in axes) or view.shapes.get(t) not in (
            [1 if k in axes else v for k, v in enumerate(shape)], [v for k, v in enumerate(shape) if k not in axes]):
        return None
    count = int(np.prod([shape[k] for k in axes]))
    if node.op_type == "ReduceSum":
        factor *= count
    if abs(factor - 1.0) > 1e-6:
        return None
    return x, axes, [node, *reversed(nodes)]


def _square_of(t: str, view: GraphView) -> tuple[str, NodeProto] | None:
    """``t`` as ``a * a`` or ``Pow(a, 2)``: (a, the node)."""
    node = view.producer.get(t)
    if node is None or len(node.input) != 2:
        return None
    if node.op_type == "Mul" and node.input[0] == node.input[1]:
        return node.input[0], node
    exponent = view.const(node.input[1]) if node.op_type == "Pow" else None
    if exponent is not None and exponent.size == 1 and float(exponent.reshape(-1)[0]) == 2.0:
        return node.input[0], node
    return None


def _variance(t: str, view: GraphView) -> tuple[str, list[int], list[NodeProto]] | None:
    """``t`` as the variance of some x over some axes: mean((x - m)**2), or mean(x * x) - m * m maybe clamped by
    Max(., 0), with m the mean of x over the same axes, maybe reshaped (keepdims=0 reductions): (x, axes, nodes)."""
    nodes: list[NodeProto] = []
    node = view.producer.get(t)
    while node is not None and (node.op_type in ("Reshape", "Unsqueeze", "Squeeze") and all(
            view.is_const(i) for i in node.input[1:] if i) or node.op_type == "Max" and len(node.input) == 2
            and not any(n.op_type == "Max" for n in nodes)):
        if node.op_type == "Max":
            operand = next((i for i in node.input if not view.is_const(i)), None)
            if operand is None or _scalar_operand(node, operand, view) != 0.0:
                return None
            t = operand
        else:
            t = node.input[0]
        nodes.insert(0, node)
        node = view.producer.get(t)
    variance = _mean(t, view)
    if variance is None:
        difference = view.producer.get(t)
        if difference is None or difference.op_type != "Sub" or len({str(view.shapes.get(i)) for i in
                                                                      [*difference.input, t]}) != 1:
            return None
        mean_square, square_mean = (_mean(difference.input[0], view), _square_of(difference.input[1], view))
        if mean_square is None or square_mean is None:
            return None
        squared = _square_of(mean_square[0], view)
        mean = _mean(square_mean[0], view)
        if squared is None or mean is None or mean[0] != squared[0] or mean[1] != mean_square[1]:
            return None
        return squared[0], mean[1], [*mean[2], squared[1], *mean_square[2], square_mean[1], difference, *nodes]
    squared = _square_of(variance[0], view)
    centring = view.producer.get(squared[0]) if squared is not None else None
    if centring is None or centring.op_type != "Sub" or view.shapes.get(centring.input[0]) != \
            view.shapes.get(centring.output[0]):
        return None
    x, m = centring.input[:2]
    mean = _mean(m, view)
    if mean is None or mean[0] != x or mean[1] != variance[1] or len(view.shapes.get(m) or []) != len(
            view.shapes.get(x) or []):
        return None
    return x, variance[1], [*mean[2], centring, squared[1], *variance[2], *nodes]


def _inverse_root(t: str, view: GraphView) -> tuple[str, list[NodeProto], np.ndarray | None] | None:
    """``1 / Sqrt(t)`` as Reciprocal(Sqrt), Pow(t, -0.5) or Div(c, Sqrt) by a constant c (onnxruntime folds
    ``1 / Sqrt(t) * gamma`` into ``gamma / Sqrt(t)``): (its tensor, nodes, c unless it is 1)."""
    users = view.consumers.get(t, [])
    if len(users) != 1 or t in view.graph_outputs:
        return None
    node = users[0]
    if node.op_type == "Pow" and len(node.input) == 2 and node.input[0] == t:
        exponent = view.const(node.input[1])
        ok = exponent is not None and exponent.size == 1 and float(exponent.reshape(-1)[0]) == -0.5
        return (node.output[0], [node], None) if ok else None
    if node.op_type != "Sqrt":
        return None
    inverse = view.consumers.get(node.output[0], [])
    if len(inverse) != 1 or node.output[0] in view.graph_outputs:
        return None
    if inverse[0].op_type == "Reciprocal":
        return inverse[0].output[0], [node, inverse[0]], None
    scale = view.const(inverse[0].input[0]) if inverse[0].op_type == "Div" else None
    if scale is None or scale.dtype != np.float32 or inverse[0].input[1] != node.output[0]:
        return None
    return inverse[0].output[0], [node, inverse[0]], None if scale.size == 1 and float(scale.reshape(-1)[0]) == 1 \
        else scale


def _applied(x: str, mean_of_x, g: str, view: GraphView, param_shape: list) -> tuple[
        list[NodeProto], np.ndarray | None, list[NodeProto]] | None:
    """How ``g`` (the inverse deviation, maybe times the scale) is applied, with m a tensor ``mean_of_x`` takes for
    x's mean: ``(x - m) * g``, ``x * g - m * g``, ``x * g + (beta - m * g)`` or ``x * g + (-m * g + beta)``:
    (nodes, the output last; beta or None; the nodes of the mean)."""
    users = view.consumers.get(g, [])
    if len(users) == 1 and users[0].op_type == "Mul":
        centring = view.producer.get(next((i for i in users[0].input if i != g), ""))
        means = mean_of_x(centring.input[1]) if centring is not None and centring.op_type == "Sub" \
            and centring.input[0] == x else None
        return ([centring, users[0]], None, means) if means is not None else None
    if len(users) != 2:
        return None
    scaled = next((u for u in users if u.op_type == "Mul" and set(u.input) == {x, g}), None)
    shift = next((u for u in users if u is not scaled), None)
    m = next((i for i in shift.input if i != g), "") if shift is not None and shift.op_type == "Mul" else ""
    negated = view.producer.get(m)
    if negated is not None and negated.op_type != "Neg":
        negated = None
    means = mean_of_x(negated.input[0] if negated is not None else m)
    if scaled is None or means is None:
        return None
    joined = view.consumers.get(scaled.output[0], [])
    if len(joined) != 1:
        return None
    joined = joined[0]
    if joined.op_type == "Sub" and list(joined.input) == [scaled.output[0], shift.output[0]] and negated is None \
            or negated is not None and joined.op_type == "Add" and set(joined.input) == {scaled.output[0],
                                                                                         shift.output[0]}:
        return [*([negated] if negated is not None else []), scaled, shift, joined], None, means
    if joined.op_type != "Add" or scaled.output[0] not in joined.input:
        return None
    offset = view.producer.get(next((i for i in joined.input if i != scaled.output[0]), ""))
    if offset is None or len(offset.input) != 2 or shift.output[0] not in offset.input:
        return None
    beta = _tensor_operand(offset, shift.output[0], view)
    if beta is None or _params(beta, None, param_shape) is None:
        return None
    if offset.op_type == "Sub" and negated is None and offset.input[1] == shift.output[0] \
            or offset.op_type == "Add" and negated is not None:
        return [*([negated] if negated is not None else []), scaled, shift, offset, joined], beta, means
    return None
