"""Reading a calibrated model back: its float graph and the grids its calibration nodes hold.

The quantize stage and the layer dump start from the calibrated model file alone.
Undoing the calibrate stage removes every calibration node (activation, weight and
bias) and reconnects its readers to the float tensor it calibrated.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from onnx import ModelProto, NodeProto, numpy_helper

from hbtools.graph.graph import copy_model
from hbtools.ops import registry
from hbtools.ops.base import DOMAIN
from hbtools.ops.calibration import HzBiasCalibration, HzCalibration
from hbtools.ops.names import calibrated_tensor
from hbtools.ops.preprocess import HzPreprocess


@dataclass
class ActGrid:
    """An activation calibration node's grid, as the quantized model uses it."""

    threshold: float  # largest threshold (the node table shows it)
    bits: int
    scales: np.ndarray  # float32 steps as stored: one, or one per channel along ``axis``
    zero_point: int = 0
    asymmetric: bool = False  # the whole integer range (-128..127), zero point may be 0
    axis: int | None = None  # channel axis of per-channel scales


@dataclass
class CalibratedGraph:
    float_model: ModelProto  # the optimized graph, calibration removed
    activations: dict[str, ActGrid]  # float tensor -> its grid
    weights: dict[str, dict]  # weight tensor -> its calibration node's attributes (+ "rounding")


def read_calibrated(calibrated: ModelProto) -> CalibratedGraph:
    """Undo the calibrate stage: the float graph, activation grids and weight calibration attributes."""
    inits = {t.name: t for t in calibrated.graph.initializer}
    roundings = {n.input[1] for n in calibrated.graph.node  # GPTQ rounding offsets: read here, not kept
                 if n.domain == DOMAIN and n.op_type == HzCalibration.op_type and len(n.input) > 1 and n.input[1]
                 and HzCalibration.read(n)["kind"] == "weight"}
    model = copy_model(calibrated, lambda t: t.name not in roundings)
    acts: dict[str, ActGrid] = {}
    weights: dict[str, dict] = {}
    rename: dict[str, str] = {}
    keep = []
    for node in model.graph.node:
        if node.domain == DOMAIN and node.op_type == HzCalibration.op_type:
            a = HzCalibration.read(node)
            tensor = calibrated_tensor(node)
            if a["kind"] == "weight":
                weights[tensor] = a
                if len(node.input) > 1 and node.input[1]:  # GPTQ rounding offsets
                    a["rounding"] = numpy_helper.to_array(inits[node.input[1]])
            else:
                acts[tensor] = _act_grid(a, node.name)
            rename[node.output[0]] = tensor
            rename[node.input[0]] = tensor
        elif node.domain == DOMAIN and node.op_type == HzBiasCalibration.op_type:
            rename[node.output[0]] = node.input[0]  # the quantize stage rounds the float bias itself
        else:
            _as_float_op(node)
            keep.append(node)
    del model.graph.node[:]
    model.graph.node.extend(keep)
    for node in model.graph.node:
        for k, i in enumerate(node.input):
            node.input[k] = rename.get(i, i)
        for k, o in enumerate(node.output):
            node.output[k] = rename.get(o, o)
    return CalibratedGraph(model, acts, weights)


def _as_float_op(node: NodeProto) -> None:
    """An integer kernel's emulation (``HzOp.float_op``, e.g. HzSoftmax) becomes its float op again."""
    op = registry.op_class(node.op_type) if node.domain == DOMAIN else None
    if op is not None and op.float_op:
        node.op_type, node.domain = op.float_op, ""


def _act_grid(a: dict, name: str) -> ActGrid:
    threshold, bits = float(max(a["thresholds"])), int(a["bits"])
    axis = int(a.get("axis", -1))
    scales = np.asarray(a["scales"], dtype=np.float32)
    zero_points = set(a.get("zero_points", [0]))
    if len(zero_points) != 1:
        raise ValueError(f"{name}: per-channel zero points must be equal (integer kernels take one)")
    return ActGrid(threshold, bits, scales, int(zero_points.pop()), "zero_points" in a, None if axis < 0 else axis)


def without_integer_emulation(calibrated: ModelProto) -> ModelProto:
    """A copy of ``calibrated`` whose biases and preprocessing are the float ones.

    The debugger switches calibration nodes on and off one by one; with every switch
    off it must be the float model, so the bias rounding (HzBiasCalibration) and the
    integer preprocessing coefficients, which belong to no switch, are taken out. A bias
    that bias correction changed is read as it was before (``float_bias_input``).
    """
    model = ModelProto()
    model.CopyFrom(calibrated)
    shapes = {t.name: tuple(t.dims) for t in model.graph.initializer}
    rename = {}
    keep = []
    for node in model.graph.node:
        if node.domain == DOMAIN and node.op_type == HzBiasCalibration.op_type:
            rename[node.output[0]] = float_bias_input(node)
            before = HzBiasCalibration.read(node).get("float_bias")
            if before is not None and node.input[0] in shapes:
                value = np.asarray(before, dtype=np.float32).reshape(shapes[node.input[0]])
                model.graph.initializer.append(numpy_helper.from_array(value, rename[node.output[0]]))
            continue
        if node.domain == DOMAIN and node.op_type == HzPreprocess.op_type:
            kept = [a for a in node.attribute if a.name != "integer"]
            del node.attribute[:]
            node.attribute.extend(kept)
        _as_float_op(node)
        keep.append(node)
    for node in keep:
        for k, i in enumerate(node.input):
            node.input[k] = rename.get(i, i)
    del model.graph.node[:]
    model.graph.node.extend(keep)
    return model


def float_bias_input(bias_node: NodeProto) -> str:
    """The tensor holding a HzBiasCalibration's float bias in ``without_integer_emulation``'s model: its
    input, or where bias correction changed it, a tensor of the bias before (``float_bias``)."""
    if any(a.name == "float_bias" for a in bias_node.attribute):
        return f"{bias_node.output[0]}_float"
    return bias_node.input[0]
