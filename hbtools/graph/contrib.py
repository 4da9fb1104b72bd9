"""onnxruntime's fused contrib ops written as the standard ops they stand for.

A model saved after onnxruntime's extended optimizations (``ORT_ENABLE_EXTENDED`` with
``optimized_model_filepath``, or ``onnxruntime.transformers.optimizer``) has its convolutions
and activations fused into ``com.microsoft`` ops: ``FusedConv`` (Conv + activation, + a
residual), ``FusedGemm``, ``FusedMatMul`` (MatMul with transposes and a scale), and the GELU
family (``Gelu``, ``BiasGelu``, ``FastGelu``, ``QuickGelu``, which is also what SiLU becomes), and
a transformer's residual and layer norm into ``SkipLayerNormalization`` (RMS norms:
``SimplifiedLayerNormalization``, which onnxruntime registers in the ONNX domain, and
``SkipSimplifiedLayerNormalization``); a model saved for GPUs has ``BiasAdd`` and ``BiasSplitGelu``,
which onnxruntime's CPU provider cannot run. The attention ops are in ``contrib_attention``.
onnx's shape inference knows none of them, and the BPU profile has no kernels for them: a
YOLOv8 saved that way ran its every SiLU on the CPU. Written back as standard ops, each has its
shape, its BPU form, and its place in the rewrites that follow (activation tables, layer norms).
The numbers are the same up to float32 rounding.
"""

from __future__ import annotations

import functools

import numpy as np
from onnx import ModelProto, NodeProto, TensorProto, helper, numpy_helper

from hbtools.graph.graph import GraphView, rewrite_nodes
from hbtools.ops.base import CONTRIB_DOMAIN

# Ops onnxruntime registers in the ONNX domain that no ONNX opset defines (its RMS norm).
ORT_ONNX_DOMAIN_OPS = frozenset({"SimplifiedLayerNormalization"})
_CONV_ATTRS = ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")


class Writer:
    """Emits the standard nodes that replace one contrib node; the last writes the node's output."""

    def __init__(self, model: ModelProto, node: NodeProto) -> None:
        self.model, self.node, self.nodes, self.count = model, node, [], 0
        self.prefix = node.name or f"{node.op_type}_{node.output[0]}"  # the parse stage has not named nodes yet
        self.initializers: list[TensorProto] = []  # added to the model only when the whole rewrite is written
        self.opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)

    def const(self, value: float | np.ndarray) -> str:
        name = f"{self.prefix}_c{self.count}"
        self.count += 1
        value = np.asarray(value)
        value = value if value.dtype.kind in "biu" else value.astype(np.float32)
        self.initializers.append(numpy_helper.from_array(value, name))
        return name

    def op(self, op_type: str, inputs: list[str], out: str | None = None, **attrs: object) -> str:
        out = out or f"{self.prefix}_{op_type.lower()}{len(self.nodes)}"
        name = f"{self.prefix}/{op_type}_{len(self.nodes)}"
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=name, **attrs))
        return out

    def mean(self, x: str) -> str:
        """ReduceMean over the last axis, kept (its axes an input from opset 18)."""
        if self.opset >= 18:
            return self.op("ReduceMean", [x, self.const(np.array([-1], np.int64))])
        return self.op("ReduceMean", [x], axes=[-1])


def _activation(w: Writer, x: str, name: str, params: list[float], out: str) -> str | None:
    """``x`` through the activation FusedConv / FusedGemm name (None: one this module does not know)."""
    if name == "":  # no activation attribute: onnxruntime's fused op is then the conv or Gemm alone
        return w.op("Identity", [x], out)
    if name == "Relu":
        return w.op("Relu", [x], out)
    if name in ("Sigmoid", "Tanh"):
        return w.op(name, [x], out)
    if name == "LeakyRelu":
        return w.op("LeakyRelu", [x], out, alpha=params[0] if params else 0.01)
    if name == "HardSigmoid":
        alpha, beta = (params + [0.2, 0.5][len(params):])[:2]
        return w.op("HardSigmoid", [x], out, alpha=alpha, beta=beta)
    if name == "Clip" and len(params) == 2:
        return w.op("Clip", [x, w.const(params[0]), w.const(params[1])], out)
    return None


def _attrs(node: NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _fused_conv(w: Writer, a: dict) -> bool:
    node = w.node
    ins = list(node.input[:3])
    while ins and not ins[-1]:  # an empty name for an absent bias
        ins.pop()
    conv = w.op("Conv", ins, **{k: a[k] for k in _CONV_ATTRS if k in a})
    if len(node.input) > 3 and node.input[3]:  # Z: added before the activation (a residual)
        conv = w.op("Add", [conv, node.input[3]])
    return _activation(w, conv, _text(a.get("activation", b"")), list(a.get("activation_params", [])),
                       node.output[0]) is not None


def _fused_gemm(w: Writer, a: dict) -> bool:
    gemm = {k: a[k] for k in ("alpha", "beta", "transA", "transB") if k in a}
    y = w.op("Gemm", list(w.node.input), **gemm)
    params = [a[k] for k in ("activation_alpha", "activation_beta") if k in a]
    if _text(a.get("activation", b"")) == "LeakyRelu" and "leaky_relu_alpha" in a:
        params = [a["leaky_relu_alpha"]]
    return _activation(w, y, _text(a.get("activation", b"")), params, w.node.output[0]) is not None


def _fused_matmul(w: Writer, a: dict, view: GraphView) -> bool:
    """``alpha * op(A) @ op(B)``: ``transBatch`` moves an operand's first axis in front of its last two (the
    batch axes first: what onnxruntime's MatMul-Transpose fusion folds in), then ``trans`` swaps those two."""
    operands = []
    for x, flag in zip(w.node.input[:2], ("A", "B"), strict=True):
        batch, last = a.get(f"transBatch{flag}", 0), a.get(f"trans{flag}", 0)
        if batch or last:
            shape = view.shapes.get(x)
            if shape is None or len(shape) < 2 or (batch and len(shape) < 3):
                return False
            rank = len(shape)
            perm = [*range(1, rank - 1), 0, rank - 1] if batch else list(range(rank))
            if last:
                perm[-2:] = perm[-1], perm[-2]
            x = w.op("Transpose", [x], perm=perm)
        operands.append(x)
    alpha = float(a.get("alpha", 1.0))
    if alpha == 1.0:
        w.op("MatMul", operands, w.node.output[0])
    else:
        w.op("Mul", [w.op("MatMul", operands), w.const(alpha)], w.node.output[0])
    return True


def _gelu(w: Writer, x: str, out: str, approximate: bool) -> None:
    """0.5 x (1 + erf(x / sqrt 2)), or with ``approximate`` the tanh form FastGelu computes."""
    if approximate:
        cube = w.op("Mul", [w.op("Mul", [x, x]), x])
        inner = w.op("Add", [x, w.op("Mul", [cube, w.const(0.044715)])])
        core = w.op("Tanh", [w.op("Mul", [inner, w.const(np.sqrt(2.0 / np.pi))])])
    else:
        core = w.op("Erf", [w.op("Mul", [x, w.const(1.0 / np.sqrt(2.0))])])
    w.op("Mul", [w.op("Mul", [x, w.const(0.5)]), w.op("Add", [core, w.const(1.0)])], out)


def layer_norm(w: Writer, x: str, gamma: str, beta: str, epsilon: float, out: str) -> None:
    """The layer norm of ``x`` over its last axis in the spelled-out form ``hbtools.graph.layer_norm`` makes
    one HzLayerNorm of (``beta`` may be empty)."""
    d = w.op("Sub", [x, w.mean(x)])
    var = w.mean(w.op("Mul", [d, d]))
    y = w.op("Div", [d, w.op("Sqrt", [w.op("Add", [var, w.const(epsilon)])])])
    if beta:
        w.op("Add", [w.op("Mul", [y, gamma]), beta], out)
    else:
        w.op("Mul", [y, gamma], out)


def _skip_sum(w: Writer, ins: list[str], total: str | None) -> str:
    """input + skip (+ bias), written to ``total`` (the residual sum output) when that is used."""
    s = w.op("Add", ins[:2], None if len(ins) > 2 and ins[2] else total)
    return w.op("Add", [s, ins[2]], total) if len(ins) > 2 and ins[2] else s


def _skip_layer_norm(w: Writer, a: dict) -> None:
    """input + skip (+ bias), its sum as the fourth output, then the layer norm over the last axis."""
    node = w.node
    ins = list(node.input) + [""] * (5 - len(node.input))
    total = node.output[3] if len(node.output) > 3 and node.output[3] else None
    s = _skip_sum(w, [ins[0], ins[1], ins[4]], total)
    layer_norm(w, s, ins[2], ins[3], float(a.get("epsilon", 1e-12)), node.output[0])


def _rms_norm(w: Writer, x: str, gamma: str, epsilon: float, out: str) -> None:
    """``x`` / sqrt(mean(x^2) + epsilon) * gamma over the last axis (T5's and LLaMA's RMSNorm)."""
    root = w.op("Sqrt", [w.op("Add", [w.mean(w.op("Mul", [x, x])), w.const(epsilon)])])
    w.op("Mul", [w.op("Div", [x, root]), gamma], out)


def _last_axis(axis: int, x: str, view: GraphView) -> bool:
    shape = view.shapes.get(x)
    return axis == -1 or (shape is not None and axis == len(shape) - 1)


# The outputs each rewrite writes besides the first (any other output in use keeps the node).
_EXTRA_OUTPUTS = {"SkipLayerNormalization": {3}, "SkipSimplifiedLayerNormalization": {3},
                  "EmbedLayerNormalization": {1, 2}}


def _norms(w: Writer, a: dict, view: GraphView) -> str | None:
    node, out = w.node, w.node.output[0]
    if node.op_type == "SkipLayerNormalization":
        _skip_layer_norm(w, a)
        return None
    if node.op_type == "SimplifiedLayerNormalization":
        if not _last_axis(int(a.get("axis", -1)), node.input[0], view):
            return "it normalizes over an axis other than the last"
        _rms_norm(w, node.input[0], node.input[1], float(a.get("epsilon", 1e-5)), out)
        return None
    ins = list(node.input) + [""] * (4 - len(node.input))  # SkipSimplifiedLayerNormalization
    total = node.output[3] if len(node.output) > 3 and node.output[3] else None
    _rms_norm(w, _skip_sum(w, [ins[0], ins[1], ins[3]], total), ins[2], float(a.get("epsilon", 1e-5)), out)
    return None


def _activations(w: Writer, a: dict) -> str | None:
    node, out = w.node, w.node.output[0]
    x = node.input[0]
    if node.op_type == "QuickGelu":
        alpha = float(a.get("alpha", 1.702))
        scaled = x if alpha == 1.0 else w.op("Mul", [x, w.const(alpha)])
        w.op("Mul", [x, w.op("Sigmoid", [scaled])], out)
        return None
    if len(node.input) > 1 and node.input[1]:  # BiasGelu's, FastGelu's and BiasSplitGelu's bias
        x = w.op("Add", [x, node.input[1]])
    if node.op_type == "BiasSplitGelu":  # the first half of the last axis times the GELU of the second half
        half, gate, gelu = f"{w.prefix}_half", f"{w.prefix}_gate", f"{w.prefix}_gelu"
        w.nodes.append(helper.make_node("Split", [x], [half, gate], name=f"{w.prefix}/Split", axis=-1,
                                        **({"num_outputs": 2} if w.opset >= 18 else {})))
        _gelu(w, gate, gelu, approximate=False)
        w.op("Mul", [half, gelu], out)
        return None
    _gelu(w, x, out, approximate=node.op_type == "FastGelu")
    return None


def _expand(node: NodeProto, w: Writer, view: GraphView) -> str | None:
    """Write ``node`` as standard ops into ``w``; the reason it cannot be, or None when written."""
    from hbtools.graph import contrib_attention

    a = _attrs(node)
    op = node.op_type
    if op == "FusedConv":
        return None if _fused_conv(w, a) else f"its activation {_text(a.get('activation', b''))} is not known"
    if op == "FusedGemm":
        return None if _fused_gemm(w, a) else f"its activation {_text(a.get('activation', b''))} is not known"
    if op == "FusedMatMul":
        return None if _fused_matmul(w, a, view) else "it transposes an operand of unknown rank"
    if op in ("Gelu", "BiasGelu", "FastGelu", "QuickGelu", "BiasSplitGelu"):
        return _activations(w, a)
    if op in ("SkipLayerNormalization", "SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization"):
        return _norms(w, a, view)
    if op == "BiasAdd":  # input + bias + skip (diffusion UNets; onnxruntime runs it on GPUs only)
        w.op("Add", [w.op("Add", list(node.input[:2])), node.input[2]], node.output[0])
        return None
    if op in contrib_attention.WRITERS:
        return contrib_attention.WRITERS[op](w, a, view)
    return "hbtools does not write it as standard ops"


def _attempt(node: NodeProto, model: ModelProto, view: GraphView) -> tuple[Writer, str | None]:
    w = Writer(model, node)
    written = {0} | _EXTRA_OUTPUTS.get(node.op_type, set())
    used = [o for k, o in enumerate(node.output)
            if k not in written and o and (o in view.consumers or o in view.graph_outputs)]
    if used:
        return w, f"its output '{used[0]}' is in use, which its standard form does not compute"
    return w, _expand(node, w, view)


def is_ort_op(node: NodeProto) -> bool:
    """An onnxruntime op: the contrib domain's, or one onnxruntime registers in the ONNX domain."""
    return node.domain == CONTRIB_DOMAIN or (node.domain in ("", "ai.onnx") and node.op_type in ORT_ONNX_DOMAIN_OPS)


def why_kept(node: NodeProto, model: ModelProto) -> str:
    """Why the contrib node ``node`` of ``model`` was not written as standard ops (for the CPU node table)."""
    _, reason = _attempt(node, model, GraphView(model))
    return f"com.microsoft {node.op_type} is kept as onnxruntime's op: {reason or 'not rewritten'}"


def expand_contrib_ops(model: ModelProto, *, onnx_domain_only: bool = False) -> int:
    """Replace ``model``'s fused com.microsoft ops by standard ones; returns how many were replaced.

    A node with an output in use that its standard form does not compute, or an attribute or input this
    module does not write, is kept (``why_kept`` says why). Passes repeat while they write nodes: a rewrite
    gives the shapes the next contrib node's rewrite may need (an attention after an attention).
    ``onnx_domain_only``: only onnxruntime's ops in the ONNX domain (``ORT_ONNX_DOMAIN_OPS``), which onnx's
    checker refuses, so the parse stage writes them before it checks the model."""
    total = 0
    while count := rewrite_nodes(model, functools.partial(_expand_one, model=model, view=GraphView(model),
                                                          onnx_domain_only=onnx_domain_only)):
        total += count
    return total


def _expand_one(node: NodeProto, model: ModelProto, view: GraphView, onnx_domain_only: bool) -> \
        list[NodeProto] | None:
    if not is_ort_op(node) or (onnx_domain_only and node.domain == CONTRIB_DOMAIN):
        return None
    w, reason = _attempt(node, model, view)
    if reason is not None:
        return None
    model.graph.initializer.extend(w.initializers)
    return w.nodes
