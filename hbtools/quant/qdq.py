"""calibration_type 'load': take thresholds from a QDQ model (QAT export) and strip its Q/DQ pairs.

An activation pair ``QuantizeLinear -> DequantizeLinear`` on tensor T becomes plain T with
threshold ``scale * 127``; a weight ``DequantizeLinear(int8 constant)`` becomes the float
constant it stands for. Only symmetric (zero point 0) pairs are accepted.
"""

from __future__ import annotations

import numpy as np
from onnx import ModelProto, helper, numpy_helper

from hbtools.errors import HbError
from hbtools.graph.graph import GraphView, remove_dead_nodes, topological_sort


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
    for node in model.graph.node:
        if node.op_type != "DequantizeLinear":
            continue
        scale = view.const(node.input[1])
        zero = view.const(node.input[2]) if len(node.input) > 2 and node.input[2] else None
        if scale is None:
            raise HbError(f"calibration_type load: DequantizeLinear {node.name} has a non-constant scale")
        if zero is not None and np.any(zero != 0):
            raise HbError(f"calibration_type load: {node.name} is asymmetric (zero point ≠ 0); "
                          "export the QAT model with symmetric quantization")
        source = node.input[0]
        q = view.producer.get(source)
        if view.is_const(source):  # weight: fold back to float
            axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
            w = view.const(source).astype(np.float32)
            s = scale.astype(np.float32)
            if s.size > 1:
                shape = [1] * w.ndim
                shape[axis] = -1
                s = s.reshape(shape)
            new_inits.append(numpy_helper.from_array(w * s, node.output[0]))
            drop.add(node.name)
        elif q is not None and q.op_type == "QuantizeLinear":
            tensor = q.input[0]
            threshold = float(np.max(scale)) * 127.0
            out = node.output[0]
            if out not in outputs:
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
