"""calibration_type 'load': take thresholds from a QDQ model (QAT export) and strip its Q/DQ pairs.

An activation pair ``QuantizeLinear -> DequantizeLinear`` on tensor T becomes plain T with
threshold ``scale * 127``; a weight ``DequantizeLinear(integer constant)`` becomes the float
constant it stands for, ``(q - zero_point) * scale``. A pair on an asymmetric or unsigned grid (onnxruntime's
``quantize_static`` writes uint8 activations with a zero point; no zero point means uint8 too) has no symmetric
int8 form: its threshold is the larger end of the range the pair clips to (the step is at most twice the
pair's), and a Clip to that range takes its place, since the pair may do the work of an activation the
quantizer removed (a Relu before a uint8 pair with zero point 0).
"""

from __future__ import annotations

import logging

import numpy as np
from onnx import ModelProto, helper, numpy_helper

from hbtools.errors import HbError
from hbtools.graph.graph import GraphView, remove_dead_nodes, topological_sort

log = logging.getLogger("hbtools")


def activation_pairs(model: ModelProto) -> int:
    """How many QuantizeLinear -> DequantizeLinear pairs quantize a computed tensor: the form of a QDQ (QAT) export."""
    quantized = {n.output[0] for n in model.graph.node if n.op_type == "QuantizeLinear" and n.domain in ("", "ai.onnx")}
    return sum(n.op_type == "DequantizeLinear" and n.domain in ("", "ai.onnx") and n.input[0] in quantized
               for n in model.graph.node)


# onnxruntime's quantized operator format (quantize_static QOperator, quantize_dynamic): integer ops
# that take quantized tensors and their scales. They have no BPU form and no float meaning load could take.
INTEGER_OPS = frozenset({"ConvInteger", "MatMulInteger", "QLinearConv", "QLinearMatMul", "DynamicQuantizeLinear",
                         "DynamicQuantizeLSTM", "DynamicQuantizeMatMul", "MatMulIntegerToFloat", "QLinearAdd",
                         "QLinearMul", "QLinearSigmoid", "QLinearLeakyRelu", "QLinearGlobalAveragePool",
                         "QLinearAveragePool", "QLinearConcat", "QLinearSoftmax", "QLinearReduceMean", "QGemm",
                         "QAttention", "QEmbedLayerNormalization"})


def integer_ops(model: ModelProto) -> dict[str, int]:
    """How many nodes of each of onnxruntime's quantized operator types the model has (none: not such a model)."""
    counts: dict[str, int] = {}
    for node in model.graph.node:
        if node.op_type in INTEGER_OPS and node.domain in ("", "ai.onnx", "com.microsoft"):
            counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts


def _zero_point(view: GraphView, node) -> np.ndarray:
    """A Q/DQ node's zero point; ONNX's default is uint8 0."""
    if len(node.input) > 2 and node.input[2]:
        zero = view.const(node.input[2])
        if zero is None:
            raise HbError(f"calibration_type load: {node.op_type} {node.name} has a non-constant zero point")
        return zero
    return np.zeros((), np.uint8)


def _pair_grid(scale: np.ndarray, zero: np.ndarray) -> tuple[float, float, float]:
    """An activation pair's range ``[(qmin - z) * s, (qmax - z) * s]`` and its symmetric threshold: ``scale * 127``
    on a symmetric int8 grid, otherwise the larger end of the range."""
    info = np.iinfo(zero.dtype)
    s = np.broadcast_to(scale.astype(np.float64), np.broadcast_shapes(scale.shape, zero.shape))
    z = np.broadcast_to(zero.astype(np.int64), s.shape)
    low, high = float(np.min((info.min - z) * s)), float(np.max((info.max - z) * s))
    if zero.dtype == np.int8 and not np.any(z):
        return low, high, float(np.max(s)) * 127.0
    return low, high, max(-low, high)


def strip_qdq(model: ModelProto) -> dict[str, float]:
    """Remove Q/DQ nodes in place; return activation thresholds by float tensor name."""
    view = GraphView(model)
    thresholds: dict[str, float] = {}
    rename: dict[str, str] = {}  # a pair's output -> the tensor it quantized
    outputs = {o.name for o in model.graph.output}
    inputs = {i.name for i in model.graph.input}
    # A pair that ends in a model output: the tensor it quantized takes the output's name (outputs keep
    # their names, SPEC §6); a model input or another output cannot be renamed, so an Identity joins them.
    renamed_output: dict[str, str] = {}  # the tensor a pair quantized -> the model output it becomes
    joins = []
    drop: set[str] = set()
    new_inits = []
    widened = 0  # activation pairs on an asymmetric or unsigned grid
    for node in model.graph.node:
        if node.op_type != "DequantizeLinear":
            continue
        scale = view.const(node.input[1])
        if scale is None:
            raise HbError(f"calibration_type load: DequantizeLinear {node.name} has a non-constant scale")
        zero = _zero_point(view, node)
        source = node.input[0]
        q = view.producer.get(source)
        if view.is_const(source):  # weight: fold back to float
            axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
            w = view.const(source).astype(np.float32)
            s = scale.astype(np.float32)
            z = zero.astype(np.float32)
            if s.size > 1:
                shape = [1] * w.ndim
                shape[axis] = -1
                s = s.reshape(shape)
                z = z.reshape(shape) if z.size > 1 else z
            new_inits.append(numpy_helper.from_array((w - z) * s, node.output[0]))
            drop.add(node.name)
        elif q is not None and q.op_type == "QuantizeLinear":
            tensor = q.input[0]
            low, high, threshold = _pair_grid(scale, zero)
            out = node.output[0]
            if zero.dtype != np.int8 or np.any(zero != 0):
                widened += 1
            if low > -threshold * (1 - 1e-6) or high < threshold * (1 - 1e-6):
                # The pair clips one end of the range short of the threshold: onnxruntime's quantizer drops a
                # Relu (or Clip) before a uint8 pair with zero point 0, which then does its work. A Clip keeps it.
                bounds = [f"{node.name}_clip_min", f"{node.name}_clip_max"]
                new_inits += [numpy_helper.from_array(np.array(v, np.float32), b)
                              for v, b in zip((low, high), bounds, strict=True)]
                joins.append(helper.make_node("Clip", [tensor, *bounds], [out], name=f"{node.name}_clip"))
                thresholds[tensor] = thresholds[out] = threshold
            elif out not in outputs:
                thresholds[tensor] = threshold
                rename[out] = tensor
            elif tensor in inputs or tensor in outputs or tensor in renamed_output or view.is_const(tensor):
                thresholds[out] = threshold
                joins.append(helper.make_node("Identity", [tensor], [out], name=f"{node.name}_identity"))
            else:
                thresholds[out] = threshold
                renamed_output[tensor] = out
            drop.update({node.name, q.name})
    if not drop:
        raise HbError("calibration_type load needs a QDQ model (QuantizeLinear/DequantizeLinear pairs); none found",
                      hint="use another calibration_type for a float model")
    if widened:
        log.warning("calibration_type load: %d QuantizeLinear -> DequantizeLinear pair(s) quantize to an asymmetric "
                    "or unsigned grid (a zero point, or uint8 as onnxruntime's quantize_static writes); the BPU's "
                    "int8 grid is symmetric: each takes the threshold of the larger end of the range it clips to, "
                    "and a Clip to that range",
                    widened)
    kept = [n for n in model.graph.node if n.name not in drop]
    del model.graph.node[:]
    model.graph.node.extend([*kept, *joins])
    model.graph.initializer.extend(new_inits)

    def final(name: str) -> str:
        name = rename.get(name, name)
        return renamed_output.get(name, name)

    for node in model.graph.node:
        for k, i in enumerate(node.input):
            node.input[k] = final(i)
        for k, o in enumerate(node.output):
            node.output[k] = renamed_output.get(o, o)
    for vi in model.graph.value_info:
        vi.name = renamed_output.get(vi.name, vi.name)
    topological_sort(model)
    remove_dead_nodes(model)
    return thresholds
