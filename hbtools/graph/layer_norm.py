"""Layer normalizations as one node (``HzLayerNorm``), however the exporter wrote them.

PyTorch writes ``LayerNormalization`` from opset 17 (and ``InstanceNormalization``, the
same over the spatial axes with a scale per channel); older exports and Paddle write it
out: ``m = ReduceMean(x)``, ``d = x - m``, ``Pow(d, 2)`` (or ``d * d``), ``ReduceMean``,
``Add`` epsilon, ``Sqrt``, ``Div`` (or ``Mul`` by a ``Reciprocal``), then an optional
``Mul`` by the scale and ``Add`` of the bias. The axes may be the last ones or the
channels of an NCHW map (ConvNeXt's LayerNorm2d); some Paddle exports transpose ``d``
between the mean and the variance. ONNX's GroupNormalization (opset 21), which onnxruntime
expands into its function body, takes the variance as ``ReduceMean(x * x) - m * m`` instead.
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
    """A LayerNormalization op with constant scale (and bias) whose mean / inverse deviation nobody reads."""
    if any(o for o in node.output[1:]) or len(node.input) < 2 or not all(view.is_const(i) for i in node.input[1:] if i):
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
    return [node], [new]


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
