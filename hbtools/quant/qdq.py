"""calibration_type 'load': take thresholds from a QDQ model (QAT export) and strip its Q/DQ pairs.

An activation pair ``QuantizeLinear -> DequantizeLinear`` on tensor T becomes plain T with
threshold ``scale * 127``; a weight ``DequantizeLinear(int8 constant)`` becomes the float
constant it stands for. Only symmetric (zero point 0) pairs are accepted.
"""

from __future__ import annotations

import numpy as np
from onnx import ModelProto, numpy_helper

from hbtools.errors import HbError
from hbtools.graph.graph import GraphView, remove_dead_nodes


def strip_qdq(model: ModelProto) -> dict[str, float]:
    """Remove Q/DQ nodes in place; return activation thresholds by float tensor name."""
    view = GraphView(model)
    thresholds: dict[str, float] = {}
    rename: dict[str, str] = {}
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
            thresholds[tensor] = float(np.max(scale)) * 127.0
            rename[node.output[0]] = tensor
            drop.update({node.name, q.name})
    if not drop:
        raise HbError("calibration_type load needs a QDQ model (QuantizeLinear/DequantizeLinear pairs); none found",
                      hint="use another calibration_type for a float model")
    kept = [n for n in model.graph.node if n.name not in drop]
    del model.graph.node[:]
    model.graph.node.extend(kept)
    model.graph.initializer.extend(new_inits)
    for node in model.graph.node:
        for k, i in enumerate(node.input):
            node.input[k] = rename.get(i, i)
    for out in model.graph.output:
        if out.name in rename:
            out.name = rename[out.name]
    remove_dead_nodes(model)
    return thresholds
