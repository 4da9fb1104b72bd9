"""onnxruntime's fused contrib ops written as the standard ops they stand for.

A model saved after onnxruntime's extended optimizations (``ORT_ENABLE_EXTENDED`` with
``optimized_model_filepath``, or ``onnxruntime.transformers.optimizer``) has its convolutions
and activations fused into ``com.microsoft`` ops: ``FusedConv`` (Conv + activation, + a
residual), ``FusedGemm``, ``FusedMatMul`` (MatMul with transposes and a scale), and the GELU
family (``Gelu``, ``BiasGelu``, ``FastGelu``, ``QuickGelu``, which is also what SiLU becomes), and
a transformer's residual and layer norm into ``SkipLayerNormalization``.
onnx's shape inference knows none of them, and the BPU profile has no kernels for them: a
YOLOv8 saved that way ran its every SiLU on the CPU. Written back as standard ops, each has its
shape, its BPU form, and its place in the rewrites that follow (activation tables, layer norms).
The numbers are the same up to float32 rounding.
"""

from __future__ import annotations

import numpy as np
from onnx import ModelProto, NodeProto, helper, numpy_helper

from hbtools.graph.graph import GraphView, rewrite_nodes
from hbtools.ops.base import CONTRIB_DOMAIN

_CONV_ATTRS = ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")


class _Writer:
    """Emits the standard nodes that replace one contrib node; the last writes the node's output."""

    def __init__(self, model: ModelProto, node: NodeProto) -> None:
        self.model, self.node, self.nodes, self.count = model, node, [], 0

    def const(self, value: float | np.ndarray) -> str:
        name = f"{self.node.name}_c{self.count}"
        self.count += 1
        value = np.asarray(value)
        value = value if value.dtype == np.int64 else value.astype(np.float32)
        self.model.graph.initializer.append(numpy_helper.from_array(value, name))
        return name

    def op(self, op_type: str, inputs: list[str], out: str | None = None, **attrs: object) -> str:
        out = out or f"{self.node.name}_{op_type.lower()}{len(self.nodes)}"
        name = f"{self.node.name}/{op_type}_{len(self.nodes)}"
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=name, **attrs))
        return out


def _activation(w: _Writer, x: str, name: str, params: list[float], out: str) -> str | None:
    """``x`` through the activation FusedConv / FusedGemm name (None: one this module does not know)."""
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


def _fused_conv(w: _Writer, a: dict) -> bool:
    node = w.node
    ins = list(node.input[:3])
    while ins and not ins[-1]:  # an empty name for an absent bias
        ins.pop()
    conv = w.op("Conv", ins, **{k: a[k] for k in _CONV_ATTRS if k in a})
    if len(node.input) > 3 and node.input[3]:  # Z: added before the activation (a residual)
        conv = w.op("Add", [conv, node.input[3]])
    return _activation(w, conv, _text(a.get("activation", b"")), list(a.get("activation_params", [])),
                       node.output[0]) is not None


def _fused_gemm(w: _Writer, a: dict) -> bool:
    gemm = {k: a[k] for k in ("alpha", "beta", "transA", "transB") if k in a}
    y = w.op("Gemm", list(w.node.input), **gemm)
    params = [a[k] for k in ("activation_alpha", "activation_beta") if k in a]
    if _text(a.get("activation", b"")) == "LeakyRelu" and "leaky_relu_alpha" in a:
        params = [a["leaky_relu_alpha"]]
    return _activation(w, y, _text(a.get("activation", b"")), params, w.node.output[0]) is not None


def _fused_matmul(w: _Writer, a: dict, view: GraphView) -> bool:
    if a.get("transBatchA", 0) or a.get("transBatchB", 0):
        return False
    operands = []
    for x, flag in zip(w.node.input[:2], ("transA", "transB"), strict=True):
        if a.get(flag, 0):
            shape = view.shapes.get(x)
            if shape is None or len(shape) < 2:
                return False
            perm = [*range(len(shape) - 2), len(shape) - 1, len(shape) - 2]
            x = w.op("Transpose", [x], perm=perm)
        operands.append(x)
    alpha = float(a.get("alpha", 1.0))
    if alpha == 1.0:
        w.op("MatMul", operands, w.node.output[0])
    else:
        w.op("Mul", [w.op("MatMul", operands), w.const(alpha)], w.node.output[0])
    return True


def _gelu(w: _Writer, x: str, out: str, approximate: bool) -> None:
    """0.5 x (1 + erf(x / sqrt 2)), or with ``approximate`` the tanh form FastGelu computes."""
    if approximate:
        cube = w.op("Mul", [w.op("Mul", [x, x]), x])
        inner = w.op("Add", [x, w.op("Mul", [cube, w.const(0.044715)])])
        core = w.op("Tanh", [w.op("Mul", [inner, w.const(np.sqrt(2.0 / np.pi))])])
    else:
        core = w.op("Erf", [w.op("Mul", [x, w.const(1.0 / np.sqrt(2.0))])])
    w.op("Mul", [w.op("Mul", [x, w.const(0.5)]), w.op("Add", [core, w.const(1.0)])], out)


def _skip_layer_norm(w: _Writer, a: dict, opset: int) -> None:
    """input + skip (+ bias), its sum as the fourth output, then the layer norm over the last axis in the
    spelled-out form ``hbtools.graph.layer_norm`` makes one HzLayerNorm of."""
    node = w.node
    ins = list(node.input) + [""] * (5 - len(node.input))
    total = node.output[3] if len(node.output) > 3 and node.output[3] else None
    s = w.op("Add", ins[:2], None if ins[4] else total)
    if ins[4]:
        s = w.op("Add", [s, ins[4]], total)

    def mean(t: str) -> str:
        if opset >= 18:
            return w.op("ReduceMean", [t, w.const(np.array([-1], np.int64))])
        return w.op("ReduceMean", [t], axes=[-1])

    d = w.op("Sub", [s, mean(s)])
    var = mean(w.op("Mul", [d, d]))
    y = w.op("Div", [d, w.op("Sqrt", [w.op("Add", [var, w.const(float(a.get("epsilon", 1e-12)))])])])
    if ins[3]:
        w.op("Add", [w.op("Mul", [y, ins[2]]), ins[3]], node.output[0])
    else:
        w.op("Mul", [y, ins[2]], node.output[0])


def _expand(node: NodeProto, model: ModelProto, view: GraphView) -> list[NodeProto] | None:
    a = _attrs(node)
    w = _Writer(model, node)
    out = node.output[0]
    if node.op_type == "FusedConv":
        done = _fused_conv(w, a)
    elif node.op_type == "FusedGemm":
        done = _fused_gemm(w, a)
    elif node.op_type == "FusedMatMul":
        done = _fused_matmul(w, a, view)
    elif node.op_type in ("Gelu", "BiasGelu", "FastGelu"):
        x = node.input[0]
        if len(node.input) > 1 and node.input[1]:  # BiasGelu's and FastGelu's bias
            x = w.op("Add", [x, node.input[1]])
        _gelu(w, x, out, approximate=node.op_type == "FastGelu")
        done = True
    elif node.op_type == "SkipLayerNormalization":
        opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
        _skip_layer_norm(w, a, opset)
        done = True
    elif node.op_type == "QuickGelu":
        alpha = float(a.get("alpha", 1.702))
        x = node.input[0]
        scaled = x if alpha == 1.0 else w.op("Mul", [x, w.const(alpha)])
        w.op("Mul", [x, w.op("Sigmoid", [scaled])], out)
        done = True
    else:
        return None
    return w.nodes if done else None


def expand_contrib_ops(model: ModelProto) -> int:
    """Replace ``model``'s fused com.microsoft ops by standard ones; returns how many were replaced.

    A node with a second output in use, or an activation this module does not know, is kept."""
    view = GraphView(model)

    def expand(node: NodeProto) -> list[NodeProto] | None:
        skip_sum = node.op_type == "SkipLayerNormalization"  # its fourth output, the residual sum, is written
        extra = [o for k, o in enumerate(node.output) if k and not (k == 3 and skip_sum)]
        used_extra = any(o and (o in view.consumers or o in view.graph_outputs) for o in extra)
        return _expand(node, model, view) if node.domain == CONTRIB_DOMAIN and not used_extra else None

    return rewrite_nodes(model, expand)
