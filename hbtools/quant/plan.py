"""Where calibration nodes go, with how many bits, and how the calibrated model is built.

Every tensor the BPU holds as integers has one activation calibration node, shared
by all its BPU consumers (SPEC §7):
- the output of a BPU op that is not an accumulator (LUT, Add, pool, concat,
  preprocess): always materialised, so every consumer reads the calibrated value;
- the output of a Conv/MatMul, or a CPU/float tensor, read by a BPU op;
- data-movement ops (Reshape, MaxPool, …) keep their input's grid: no node.
Conv/MatMul outputs read only by the CPU or the user stay int32 (no node).
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass, field

import numpy as np
from onnx import ModelProto, NodeProto, TensorProto

from hbtools.config.model import Config
from hbtools.graph.graph import GraphView, topological_sort
from hbtools.march.profiles import MarchProfile
from hbtools.ops.calibration import HzCalibration
from hbtools.quant.units import Partition, Unit

log = logging.getLogger("hbtools")


@dataclass
class ActivationPoint:
    tensor: str
    bits: int
    rewire: list[tuple[str, int]]  # (node name, input index) that read the calibrated value
    graph_output: bool = False

    @property
    def node_name(self) -> str:
        return f"{self.tensor}_HzCalibration"


@dataclass
class WeightPoint:
    tensor: str
    axis: int
    rewire: list[tuple[str, int]]

    @property
    def node_name(self) -> str:
        return f"{self.tensor}_HzCalibration"


@dataclass
class CalibrationPlan:
    activations: list[ActivationPoint] = field(default_factory=list)
    weights: list[WeightPoint] = field(default_factory=list)

    def activation(self, tensor: str) -> ActivationPoint | None:
        return next((p for p in self.activations if p.tensor == tensor), None)


def weight_axis(node: NodeProto, view: GraphView) -> int:
    """The output-channel axis of a conv-like node's weight."""
    if node.op_type == "ConvTranspose":
        return 1
    if node.op_type == "Gemm":
        return 0 if view.attrs(node).get("transB", 0) else 1
    if node.op_type == "MatMul":
        return 1
    return 0


def make_plan(model: ModelProto, part: Partition, config: Config | None, profile: MarchProfile) -> CalibrationPlan:
    view = GraphView(model)
    bits_of = _requested_bits(part, config, profile, set(view.graph_outputs))
    plan = CalibrationPlan()
    int_outputs = wants_int_outputs(config)
    integer_inputs = {i.name for i in model.graph.input
                      if i.type.tensor_type.elem_type in (TensorProto.INT8, TensorProto.UINT8)}
    tensors = [*view.graph_inputs, *(t for u in part.units for t in u.outputs)]
    for tensor in dict.fromkeys(tensors):
        if tensor in integer_inputs:
            continue
        producer = part.producer.get(tensor)
        bpu_users = part.bpu_consumers(tensor)
        if producer is not None and producer.on == "BPU" and producer.kind == "passive":
            continue
        materialised = producer is not None and producer.on == "BPU" and not producer.is_accumulator
        if int_outputs and producer is not None and producer.on == "BPU" and producer.is_accumulator \
                and tensor in view.graph_outputs:
            materialised = True  # set_model_output_int8/int16: a conv output leaves as integers too
        if not materialised and not bpu_users:
            continue
        users = part.consumers.get(tensor, []) if materialised else bpu_users
        rewire = [(n.name, k) for u in users for n in u.nodes for k, i in enumerate(n.input) if i == tensor]
        is_output = materialised and tensor in view.graph_outputs
        plan.activations.append(ActivationPoint(tensor, bits_of.get(tensor, 8), rewire, is_output))
    for unit in part.units:
        if unit.on == "BPU" and unit.kind == "conv":
            node = unit.main
            w = node.input[1]
            existing = next((p for p in plan.weights if p.tensor == w), None)
            if existing:
                existing.rewire.append((node.name, 1))
            else:
                plan.weights.append(WeightPoint(w, weight_axis(node, view), [(node.name, 1)]))
    return plan


def wants_int_outputs(config: Config | None) -> bool:
    """set_model_output_int8 / set_model_output_int16: BPU outputs stay integers."""
    opts = config.calibration.optimization if config else []
    return "set_model_output_int8" in opts or "set_model_output_int16" in opts


def _requested_bits(part: Partition, config: Config | None, profile: MarchProfile,
                    graph_outputs: set[str]) -> dict[str, int]:
    """int16 requests (node_info, optimization) per tensor; int8 where the march has no int16."""
    bits: dict[str, int] = {}
    opts = config.calibration.optimization if config else []
    output_bits = 8 if "set_model_output_int8" in opts else (16 if profile.int16 else 8)

    def request(tensor: str, what: str) -> None:
        if not profile.int16:
            log.warning("%s: int16 is not available on %s; falling back to int8", what, profile.label)
            return
        # An int16 tensor needs its producer and every BPU reader to take int16 (seed: the
        # request updates the op's context; unsupported combinations fall back to int8).
        producer = part.producer.get(tensor)
        touching = [u for u in [producer, *part.bpu_consumers(tensor)] if u is not None and u.on == "BPU"]
        for unit in touching:
            rule = profile.rule(unit.main.op_type)
            if rule is not None and not rule.int16:
                log.warning("%s: %s node %s has no int16 form on %s; falling back to int8", what,
                            unit.main.op_type, unit.main.name, profile.label)
                return
        bits[tensor] = 16

    for unit in part.units:
        for t in unit.outputs:
            if unit.on == "BPU" and unit.kind != "passive" and (not unit.is_accumulator or wants_int_outputs(config)):
                if t in graph_outputs:
                    bits[t] = output_bits
    if "set_model_output_int16" in opts and not profile.int16:
        log.warning("set_model_output_int16: int16 is not available on %s; falling back to int8", profile.label)
    node_info = config.model.node_info if config else {}
    all16 = "set_all_nodes_int16" in opts
    for unit in part.units:
        for node in unit.nodes:
            info = node_info.get(node.name)
            kind = node.op_type
            if all16 or (info and info.output_type == "int16") or f"set_{kind}_output_int16" in opts:
                for t in unit.outputs:
                    request(t, f"node {node.name} output")
            if all16 or f"set_{kind}_input_int16" in opts:
                for t in unit.inputs:
                    request(t, f"node {node.name} input")
            if info:
                for idx, dtype in info.input_types.items():
                    if dtype != "int16":
                        continue
                    targets = unit.inputs if idx is None else unit.inputs[idx: idx + 1]
                    for t in targets:
                        request(t, f"node {node.name} input {idx if idx is not None else 'all'}")
            if f"set_{kind}_input_int8" in opts:
                for t in unit.inputs:
                    bits[t] = 8
            if f"set_{kind}_output_int8" in opts:
                for t in unit.outputs:
                    bits[t] = 8
    return bits


def weight_thresholds(model: ModelProto, plan: CalibrationPlan) -> dict[str, np.ndarray]:
    view = GraphView(model)
    out = {}
    for p in plan.weights:
        w = view.const(p.tensor).astype(np.float64)
        axes = tuple(k for k in range(w.ndim) if k != p.axis)
        out[p.tensor] = np.max(np.abs(w), axis=axes)
    return out


def build_calibrated_model(model: ModelProto, plan: CalibrationPlan, thresholds: dict[str, float],
                           weight_th: dict[str, np.ndarray], methods: dict[str, str]) -> ModelProto:
    """The optimized model with HzCalibration nodes inserted per the plan."""
    model = copy.deepcopy(model)
    nodes = {n.name: n for n in model.graph.node}
    new_nodes: list[NodeProto] = []
    for p in plan.weights:
        out = f"{p.tensor}_calibrated"
        new_nodes.append(HzCalibration.build(p.tensor, out, kind="weight", thresholds=weight_th[p.tensor],
                                             bits=8, axis=p.axis, method="max"))
        for name, k in p.rewire:
            nodes[name].input[k] = out
    for p in plan.activations:
        src, out = p.tensor, f"{p.tensor}_calibrated"
        if p.graph_output:
            # Keep the user's output name on the calibrated value.
            src, out = f"{p.tensor}_float", p.tensor
            for n in model.graph.node:
                for k, o in enumerate(n.output):
                    if o == p.tensor:
                        n.output[k] = src
                for k, i in enumerate(n.input):
                    if i == p.tensor:
                        n.input[k] = src
        node = HzCalibration.build(src, out, kind="activation", thresholds=np.array([thresholds[p.tensor]]),
                                   bits=p.bits, axis=-1, method=methods.get(p.tensor, "max"))
        node.name = p.node_name
        new_nodes.append(node)
        for name, k in p.rewire:
            nodes[name].input[k] = out
    model.graph.node.extend(new_nodes)
    topological_sort(model)
    return model


def unit_output_threshold(unit: Unit, plan: CalibrationPlan, thresholds: dict[str, float]) -> float | None:
    for t in unit.outputs:
        if t in thresholds and plan.activation(t):
            return thresholds[t]
    return None
