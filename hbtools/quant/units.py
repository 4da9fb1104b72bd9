"""Partition of an optimized float graph into quantization units.

A unit is the group of float nodes that becomes one Horizon op: a Conv with its
fused Relu/Clip, a run of element-wise functions of one tensor (one lookup
table), an element-wise Add/Mul of two tensors, a pool, a data-movement op, or
a CPU node. Calibration, quantization, the checker and the compile stage all
read the same partition, so they always agree on placement.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
from onnx import ModelProto, NodeProto

from hbtools.config.model import NodeInfo
from hbtools.graph.graph import GraphView
from hbtools.march.profiles import (
    CONV_OPS,
    ELTWISE_OPS,
    PASSIVE_OPS,
    POOL_OPS,
    UNARY_OPS,
    MarchProfile,
)
from hbtools.ops.base import DOMAIN

log = logging.getLogger("hbtools")

# Kinds whose integer result is an int32 accumulator (dequantized directly when no BPU op reads it).
ACCUMULATOR_KINDS = ("conv", "matmul")
# A ConvTranspose is lowered with a float32 kernel on integer values; exact while sums stay < 2**24.
CONV_TRANSPOSE_MAX_TERMS = 1000


@dataclass(eq=False)
class Unit:
    kind: str  # preprocess | conv | matmul | lut | eltwise | pool | passive | concat | cpu
    nodes: list[NodeProto]
    inputs: list[str]  # activation (non-constant) inputs
    outputs: list[str]
    on: str = "BPU"
    hz_type: str = ""
    reason: str = ""
    subgraph: int | None = None
    activation: NodeProto | None = None  # fused Relu/Clip of a conv unit

    @property
    def name(self) -> str:
        return self.nodes[0].name

    @property
    def main(self) -> NodeProto:
        return self.nodes[0]

    @property
    def is_accumulator(self) -> bool:
        return self.kind in ACCUMULATOR_KINDS


@dataclass
class Partition:
    units: list[Unit]
    unit_of_node: dict[str, Unit] = field(default_factory=dict)
    producer: dict[str, Unit] = field(default_factory=dict)
    consumers: dict[str, list[Unit]] = field(default_factory=dict)

    def index(self) -> None:
        self.unit_of_node = {n.name: u for u in self.units for n in u.nodes}
        self.producer = {t: u for u in self.units for t in u.outputs}
        self.consumers = {}
        for u in self.units:
            for t in dict.fromkeys(u.inputs):
                self.consumers.setdefault(t, []).append(u)

    def bpu_consumers(self, tensor: str) -> list[Unit]:
        return [u for u in self.consumers.get(tensor, []) if u.on == "BPU"]

    def rows(self) -> list[tuple[str, str, str, str]]:
        """(node, ON, subgraph, type) for every node, in graph order."""
        out = []
        for u in self.units:
            sub = f"id({u.subgraph})" if u.subgraph is not None else "--"
            for n in u.nodes:
                out.append((n.name, u.on, sub, u.hz_type if u.on == "BPU" else n.op_type))
        return out


def build_partition(model: ModelProto, profile: MarchProfile, node_info: dict[str, NodeInfo]) -> Partition:
    view = GraphView(model)
    taken: set[str] = set()
    units: list[Unit] = []
    for node in model.graph.node:
        if node.name in taken:
            continue
        unit = _make_unit(node, view, profile, taken)
        taken.update(n.name for n in unit.nodes)
        units.append(unit)
    part = Partition(units)
    part.index()
    _apply_overrides(part, node_info)
    _keep_isolated_ops_in_float(part, view)
    _number_subgraphs(part)
    return part


def _activation_inputs(node: NodeProto, view: GraphView) -> list[str]:
    return [i for i in node.input if i and not view.is_const(i)]


def _scalar_consts(node: NodeProto, view: GraphView) -> bool:
    consts = [view.const(i) for i in node.input if i and view.is_const(i)]
    return all(c.size == 1 for c in consts)


def _make_unit(node: NodeProto, view: GraphView, profile: MarchProfile, taken: set[str]) -> Unit:
    op = node.op_type
    acts = _activation_inputs(node, view)
    if node.domain == DOMAIN:
        if op == "HzPreprocess":
            return Unit("preprocess", [node], acts, list(node.output), hz_type="HzPreprocess")
        return _cpu(node, acts, f"custom op {op} is not a BPU op")
    if op not in profile.bpu_ops:
        return _cpu(node, acts, f"{op} is not supported on the BPU of {profile.name}")
    if op in CONV_OPS:
        return _conv_unit(node, acts, view, profile, taken)
    if op in ELTWISE_OPS and len(acts) == 2 and acts[0] != acts[1]:
        return Unit("eltwise", [node], acts, list(node.output), hz_type=ELTWISE_OPS[op])
    if op in UNARY_OPS and len(set(acts)) == 1 and _scalar_consts(node, view):
        return _lut_unit(node, acts[0], view, taken)
    if op in POOL_OPS:
        a = view.attrs(node)
        if op == "AveragePool" and (a.get("ceil_mode", 0) or (any(a.get("pads", [])) and not a.get("count_include_pad", 0))):
            return _cpu(node, acts, "AveragePool with ceil_mode or excluded padding runs on the CPU")
        return Unit("pool", [node], acts, list(node.output), hz_type=POOL_OPS[op])
    if op in PASSIVE_OPS and len(acts) == 1 and acts[0] == node.input[0]:
        if op == "Resize" and view.attrs(node).get("mode", "nearest") != "nearest":
            return _cpu(node, acts, "Resize with linear/cubic interpolation runs on the CPU")
        return Unit("passive", [node], acts, list(node.output), hz_type=op)
    if op == "Concat" and len(acts) == len([i for i in node.input if i]):
        return Unit("concat", [node], acts, list(node.output), hz_type="HzSQuantizedConcat")
    return _cpu(node, acts, f"{op} with these inputs is not supported on the BPU")


def _cpu(node: NodeProto, acts: list[str], reason: str) -> Unit:
    return Unit("cpu", [node], acts, list(node.output), on="CPU", hz_type=node.op_type, reason=reason)


def _conv_unit(node: NodeProto, acts: list[str], view: GraphView, profile: MarchProfile, taken: set[str]) -> Unit:
    op = node.op_type
    weight = view.const(node.input[1]) if len(node.input) > 1 else None
    if op == "MatMul" and len(acts) == 2:
        return Unit("matmul", [node], acts, list(node.output), hz_type="HzSQuantizedMatMul")
    if weight is None or len(acts) != 1 or acts[0] != node.input[0]:
        return _cpu(node, acts, f"{op} without a constant weight is not supported on the BPU")
    if len(node.input) > 2 and node.input[2] and not view.is_const(node.input[2]):
        return _cpu(node, acts, f"{op} with a non-constant bias is not supported on the BPU")
    a = view.attrs(node)
    if op == "Gemm" and (a.get("transA", 0) or weight.ndim != 2):
        return _cpu(node, acts, "Gemm with transA is not supported on the BPU")
    if op == "MatMul" and weight.ndim != 2:
        return _cpu(node, acts, "MatMul with a batched constant weight is not supported on the BPU")
    if op in ("Conv", "ConvTranspose"):
        kernel = list(weight.shape[2:])
        if any(k > profile.max_kernel for k in kernel):
            return _cpu(node, acts, f"kernel {kernel} exceeds the BPU limit {profile.max_kernel} of {profile.name}")
        if any(s > profile.max_stride for s in a.get("strides", [])):
            return _cpu(node, acts, f"stride {a['strides']} exceeds the BPU limit {profile.max_stride}")
        if max(weight.shape[:2]) > profile.max_channels:
            return _cpu(node, acts, f"channels {list(weight.shape[:2])} exceed the BPU limit {profile.max_channels}")
    if op == "ConvTranspose" and weight.shape[0] * int(np.prod(weight.shape[2:])) > CONV_TRANSPOSE_MAX_TERMS:
        return _cpu(node, acts, "ConvTranspose too large for exact integer accumulation; kept in float")
    nodes = [node]
    activation = None
    consumers = view.consumers.get(node.output[0], [])
    if len(consumers) == 1 and node.output[0] not in view.graph_outputs:
        nxt = consumers[0]
        if nxt.op_type == "Relu" or (nxt.op_type == "Clip" and _scalar_consts(nxt, view)):
            if nxt.name not in taken:
                nodes.append(nxt)
                activation = nxt
    return Unit("conv", nodes, acts, list(nodes[-1].output), hz_type=CONV_OPS[op], activation=activation)


def _lut_unit(start: NodeProto, root: str, view: GraphView, taken: set[str]) -> Unit:
    """Grow a run of element-wise nodes that are all functions of ``root`` alone."""
    cluster = [start]
    inside = set(start.output)
    grew = True
    while grew:
        grew = False
        for tensor in list(inside):
            if tensor in view.graph_outputs:
                continue
            for cand in view.consumers.get(tensor, []):
                if cand in cluster or cand.name in taken or cand.op_type not in UNARY_OPS:
                    continue
                acts = _activation_inputs(cand, view)
                if not all(a == root or a in inside for a in acts) or not _scalar_consts(cand, view):
                    continue
                trial = [*cluster, cand]
                if len(_external_outputs(trial, view)) != 1:
                    continue
                cluster.append(cand)
                inside.update(cand.output)
                grew = True
    outputs = _external_outputs(cluster, view)
    if len(outputs) != 1:  # cannot happen for a single node; keep the start node alone
        cluster, outputs = [start], list(start.output)
    order = {id(n): k for k, n in enumerate(view.graph.node)}
    cluster.sort(key=lambda n: order[id(n)])
    return Unit("lut", cluster, [root], outputs, hz_type="HzLut")


def _external_outputs(nodes: list[NodeProto], view: GraphView) -> list[str]:
    names = {id(n) for n in nodes}
    out = []
    for n in nodes:
        for t in n.output:
            users = view.consumers.get(t, [])
            if t in view.graph_outputs or any(id(u) not in names for u in users):
                out.append(t)
    return out


def _apply_overrides(part: Partition, node_info: dict[str, NodeInfo]) -> None:
    for name, info in node_info.items():
        unit = part.unit_of_node.get(name)
        if unit is None or info.on is None:
            continue
        if info.on == "CPU" and unit.on == "BPU" and unit.kind != "preprocess":
            unit.on, unit.reason = "CPU", "placed on the CPU by run_on_cpu / node_info"
        elif info.on == "BPU" and unit.on == "CPU":
            log.warning("node %s cannot run on the BPU (%s); it stays on the CPU", name, unit.reason)


def _keep_isolated_ops_in_float(part: Partition, view: GraphView) -> None:
    """Cheap ops wedged between CPU ops gain nothing from int8: keep them in float too."""
    movable = ("lut", "eltwise", "passive", "concat", "pool")
    changed = True
    while changed:
        changed = False
        for u in part.units:
            if u.on != "BPU" or u.kind not in movable:
                continue
            producers = [part.producer.get(t) for t in u.inputs]
            inputs_cpu = bool(producers) and all(p is not None and p.on == "CPU" for p in producers)
            users = [c for t in u.outputs for c in part.consumers.get(t, [])]
            is_output = any(t in view.graph_outputs for t in u.outputs)
            outputs_cpu = bool(users) and not is_output and all(c.on == "CPU" for c in users)
            if inputs_cpu or outputs_cpu:
                u.on, u.reason = "CPU", "isolated between CPU ops; kept in float"
                changed = True


def _number_subgraphs(part: Partition) -> None:
    """Connected BPU units form one subgraph, numbered in graph order."""
    parent: dict[int, int] = {}

    def find(k: int) -> int:
        while parent.setdefault(k, k) != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k

    ids = {id(u): k for k, u in enumerate(part.units)}
    for u in part.units:
        if u.on != "BPU":
            continue
        find(ids[id(u)])
        for t in u.inputs:
            p = part.producer.get(t)
            if p is not None and p.on == "BPU":
                parent[find(ids[id(u)])] = find(ids[id(p)])
    numbering: dict[int, int] = {}
    for u in part.units:
        if u.on == "BPU":
            root = find(ids[id(u)])
            u.subgraph = numbering.setdefault(root, len(numbering))
        else:
            u.subgraph = None
