"""The hb_perf cost model: operations, DDR traffic and latency of a ``.bin``'s BPU part.

A static estimate from the graph and the march profile (peak int8 TOPS, DDR
bandwidth); docs/hb_perf.md explains every formula and constant. CPU nodes are
not estimated, as in the vendor tool: their cost depends on the board's CPU.
A ``.bin`` of ``input_batch`` N does N items' work and activation traffic per run
and reads its weights once.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np
from onnx import NodeProto, helper

from hbtools.march.profiles import MarchProfile
from hbtools.ops.base import DOMAIN, attrs_of
from hbtools.ops.registry import has_fact
from hbtools.runtime.binfile import BinFormatError
from hbtools.runtime.runtime_model import RuntimeModel
from hbtools.runtime.structure import TensorInfo, analyse, tensor_info

CHANNEL_BLOCK = 8  # channels the MAC array takes per step, on each of input and output side
DEPTHWISE_EFFICIENCY = 1 / 8  # depthwise convolutions use a fraction of the MAC array
VECTOR_SHARE = 1 / 32  # the vector unit's element rate relative to the MAC array's op rate
LAYER_OVERHEAD_MS = 0.001  # issuing and synchronising one layer, whatever its size


@dataclass
class LayerCost:
    name: str
    op_type: str
    macs: float
    ops: float
    weight_bytes: int
    loaded_bytes: int  # weights plus any subgraph input this layer reads
    stored_bytes: int  # subgraph outputs this layer writes
    compute_ms: float
    memory_ms: float

    @property
    def latency_ms(self) -> float:
        return max(self.compute_ms, self.memory_ms) + LAYER_OVERHEAD_MS

    @property
    def bound(self) -> str:
        return "compute" if self.compute_ms >= self.memory_ms else "memory"

    def as_dict(self) -> dict:
        return {**asdict(self), "latency_ms": self.latency_ms, "bound": self.bound}


@dataclass
class SubgraphCost:
    name: str
    layers: list[LayerCost]
    inputs: list[str]
    outputs: list[str]

    @property
    def ops(self) -> float:
        return sum(layer.ops for layer in self.layers)

    @property
    def loaded_bytes(self) -> int:
        return sum(layer.loaded_bytes for layer in self.layers)

    @property
    def stored_bytes(self) -> int:
        return sum(layer.stored_bytes for layer in self.layers)

    @property
    def ddr_mb(self) -> float:
        return (self.loaded_bytes + self.stored_bytes) / 2**20

    @property
    def latency_ms(self) -> float:
        return sum(layer.latency_ms for layer in self.layers)

    def summary(self) -> dict:
        return {"name": self.name, "ops_per_frame": self.ops, "loaded_bytes": self.loaded_bytes,
                "stored_bytes": self.stored_bytes, "ddr_mb_per_frame": self.ddr_mb,
                "latency_ms": self.latency_ms, "inputs": self.inputs, "outputs": self.outputs}


@dataclass
class ModelCost:
    name: str
    march: str
    peak_int8_tops: float
    ddr_gbps: float
    core_num: int
    subgraphs: list[SubgraphCost]
    cpu_nodes: list[tuple[str, str]] = field(default_factory=list)  # (name, op type)

    @property
    def latency_ms(self) -> float:
        return sum(s.latency_ms for s in self.subgraphs)

    @property
    def loaded_bytes(self) -> int:
        return sum(s.loaded_bytes for s in self.subgraphs)

    @property
    def stored_bytes(self) -> int:
        return sum(s.stored_bytes for s in self.subgraphs)

    @property
    def ddr_mb(self) -> float:
        return (self.loaded_bytes + self.stored_bytes) / 2**20


def _elements(info: TensorInfo | None) -> int:
    if info is None or info.shape is None or any(d is None or d < 0 for d in info.shape):
        return 0  # unknown shape: counted as nothing rather than guessed
    return int(np.prod(info.shape, dtype=np.float64))


def _bytes(info: TensorInfo | None) -> int:
    if info is None:
        return 0
    try:
        itemsize = np.dtype(helper.tensor_dtype_to_np_dtype(info.elem_type)).itemsize
    except (KeyError, TypeError, ValueError):
        itemsize = 4
    return _elements(info) * itemsize


def _aligned(channels: int) -> float:
    return channels / (math.ceil(channels / CHANNEL_BLOCK) * CHANNEL_BLOCK) if channels > 0 else 1.0


def _mac_work(node: NodeProto, info: dict[str, TensorInfo]) -> tuple[float, float]:
    """MACs of a Conv / MatMul node and the share of the MAC array it keeps busy."""
    a = attrs_of(node)
    out = _elements(info.get(node.output[0]))
    if node.op_type == "HzSQuantizedMatMul":
        a_shape = (info.get(node.input[0]) or TensorInfo(0, None)).shape or (0,)
        depth = a_shape[-1] or 0
        bits = a.get("a_bits", 8), a.get("b_bits", 8)
        return float(out) * depth, _precision(bits)
    w = info.get(node.input[1])
    w_shape = list(w.shape or []) if w else []
    if len(w_shape) < 2:
        return 0.0, 1.0
    precision = _precision((a.get("x_bits", 8), 8))
    if a.get("kind") == "MatMul":
        return float(out) * w_shape[0], precision * _aligned(w_shape[0]) * _aligned(w_shape[-1])
    group = a.get("group", 1) if isinstance(a.get("group", 1), int) and a.get("group", 1) > 0 else 1
    kernel = float(np.prod(w_shape[2:]))
    if a.get("kind") == "ConvTranspose":
        cin_g, cout_g = w_shape[0] // max(group, 1), w_shape[1]
        macs = _elements(info.get(node.input[0])) * cout_g * kernel
    else:
        cout_g, cin_g = w_shape[0] // max(group, 1), w_shape[1]
        macs = out * cin_g * kernel
    share = DEPTHWISE_EFFICIENCY if cin_g == 1 and cout_g == 1 else _aligned(cin_g) * _aligned(cout_g)
    return float(macs), precision * share


def _precision(bits: tuple[int, int]) -> float:
    # an int16 operand is two int8 passes through the array
    return 1.0 / ((2 if bits[0] == 16 else 1) * (2 if bits[1] == 16 else 1))


def _vector_ops(node: NodeProto, info: dict[str, TensorInfo]) -> float:
    """Element operations of a non-MAC layer: one per output element, per window element for pools."""
    out = float(sum(_elements(info.get(o)) for o in node.output if o))
    a = attrs_of(node)
    if node.op_type == "HzSQuantizedPool":
        return float(_elements(info.get(node.input[0]))) if a.get("kind") == "GlobalAveragePool" \
            else out * float(np.prod(a.get("kernel_shape") or [1]))
    if node.op_type == "MaxPool":
        return out * float(np.prod(a.get("kernel_shape") or [1]))
    return out


def estimate(rm: RuntimeModel, profile: MarchProfile) -> ModelCost:
    info = tensor_info(rm.graph)
    structure = analyse(rm.graph, rm.bin.partition, info)
    core_num = rm.config_group("compiler_parameters").get("core_num", 1)
    core_num = core_num if isinstance(core_num, int) and 1 <= core_num <= 8 else 1
    nodes = list(rm.graph.graph.node)
    constants = {t.name for t in rm.graph.graph.initializer}
    outputs = [o.name for o in rm.graph.graph.output]
    subgraphs = [
        _subgraph(structure.subgraph_name(rm.name, k), members, nodes, info, constants, profile, core_num, outputs,
                  rm.batch)
        for k, members in enumerate(structure.subgraphs)
    ]
    cpu = [(n.name, n.op_type) for n, where in zip(nodes, structure.on, strict=True) if where == "CPU"]
    return ModelCost(rm.name, profile.name, profile.peak_int8_tops, profile.ddr_gbps, core_num, subgraphs, cpu)


def _subgraph(name: str, indices: list[int], nodes: list[NodeProto], info: dict[str, TensorInfo],
              constants: set[str], profile: MarchProfile, core_num: int, graph_outputs: list[str],
              batch: int = 1) -> SubgraphCost:
    members = [nodes[i] for i in indices]
    inside = set(indices)
    produced = {o for n in members for o in n.output if o}
    used_outside = {t for i, n in enumerate(nodes) if i not in inside for t in n.input} | set(graph_outputs)
    inputs = list(dict.fromkeys(i for n in members for i in n.input
                                if i and i not in produced and i not in constants))
    outputs = [o for n in members for o in n.output if o in used_outside]
    peak_ops = profile.peak_int8_tops * 1e12 * core_num
    bandwidth = profile.ddr_gbps * 1e9
    read_already: set[str] = set()
    layers = []
    for node in members:
        try:
            if node.domain == DOMAIN and has_fact(node.op_type, "mac"):
                macs, share = _mac_work(node, info)
                ops, rate = 2.0 * macs, peak_ops * share
            else:
                macs, ops, rate = 0.0, _vector_ops(node, info), peak_ops * VECTOR_SHARE
        except (ArithmeticError, LookupError, TypeError, ValueError) as e:  # attributes come from the file
            raise BinFormatError(f"node '{node.name}' ({node.op_type}) has malformed attributes or shapes: "
                                 f"{type(e).__name__}: {e}") from None
        macs, ops = macs * batch, ops * batch
        weights = sum(_bytes(info.get(i)) for i in node.input if i in constants)
        fresh = [i for i in node.input if i in inputs and i not in read_already]
        read_already.update(fresh)
        loaded = weights + batch * sum(_bytes(info.get(i)) for i in fresh)
        stored = batch * sum(_bytes(info.get(o)) for o in node.output if o in outputs)
        layers.append(LayerCost(node.name, node.op_type, macs, ops, weights, loaded, stored,
                                1e3 * ops / rate if rate else 0.0, 1e3 * (loaded + stored) / bandwidth))
    return SubgraphCost(name, layers, inputs, outputs)
