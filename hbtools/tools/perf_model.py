"""The hb_perf cost model: operations, DDR traffic and latency of a ``.bin``'s BPU part.

A static estimate from the graph, the march profile (peak int8 TOPS, DDR
bandwidth) and a few constants fitted to public compile logs (``COSTS``,
benchmarks/perf_calibration.py); docs/hb_perf.md explains every formula and
constant and gives the calibration table. CPU nodes are
not estimated, as in the vendor tool: their cost depends on the board's CPU.
A ``.bin`` of ``input_batch`` N does N items' work and activation traffic per run
and reads its weights once.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace

import numpy as np
from onnx import NodeProto, TensorProto, helper

from hbtools.march.profiles import MarchProfile
from hbtools.ops.base import DOMAIN, attrs_of
from hbtools.ops.registry import has_fact
from hbtools.runtime.binfile import BinFormatError
from hbtools.runtime.runtime_model import RuntimeModel
from hbtools.runtime.structure import TensorInfo, analyse, tensor_info

CHANNEL_BLOCK = 8  # channels the MAC array takes per step, on each of input and output side
DEPTHWISE_EFFICIENCY = 1 / 8  # depthwise convolutions use a fraction of the MAC array
_WIDE = (TensorProto.INT16, TensorProto.UINT16)  # int16 activations; the all-int8 view counts them as int8


@dataclass(frozen=True)
class CostConstants:
    """The fitted part of the model (benchmarks/perf_calibration.py fits them to public compile logs)."""

    mac_efficiency: float  # share of the peak MAC rate a channel-aligned int8 convolution sustains
    vector_share: float  # the vector unit's int8 element rate relative to the MAC array's peak op rate
    layer_overhead_ms: float  # issuing and synchronising one layer, whatever its size
    on_chip_bytes: int  # a feature map larger than this goes through DDR (stored, then loaded back)


# bayes-e (RDK X5) is fitted to the public compile logs of docs/hb_perf.md. bernoulli2 (RDK X3) takes them
# with both compute rates x 0.3, from the X3 / X5 board throughput of one network (PP-OCRv3 det). No public
# figure was found for the other marches: they share bayes-e's constants with their own peak TOPS and bandwidth.
_BAYES_E = CostConstants(mac_efficiency=0.32, vector_share=1 / 128, layer_overhead_ms=0.003, on_chip_bytes=1 << 20)
COSTS = {"bayes-e": _BAYES_E,
         "bernoulli2": replace(_BAYES_E, mac_efficiency=0.32 * 0.3, vector_share=0.3 / 128)}


def constants_for(march: str) -> CostConstants:
    return COSTS.get(march, COSTS["bayes-e"])


@dataclass
class LayerCost:
    name: str
    op_type: str
    macs: float
    ops: float
    weight_bytes: int
    loaded_bytes: int  # weights plus any subgraph input or spilled feature map this layer reads
    stored_bytes: int  # subgraph outputs and spilled feature maps this layer writes
    compute_ms: float
    memory_ms: float
    overhead_ms: float
    output_shape: list[int] | None = None  # of the first output, as the model declares it
    start_ms: float = 0.0  # when the layer starts within its subgraph (the layers run one after another)

    @property
    def aligned_shape(self) -> list[int] | None:
        """The output shape as the MAC array holds it: channels (axis 1) padded to ``CHANNEL_BLOCK``."""
        if not self.output_shape or len(self.output_shape) < 2 or self.output_shape[1] is None:
            return self.output_shape
        return [self.output_shape[0], -(-self.output_shape[1] // CHANNEL_BLOCK) * CHANNEL_BLOCK,
                *self.output_shape[2:]]

    @property
    def latency_ms(self) -> float:
        return max(self.compute_ms, self.memory_ms) + self.overhead_ms

    @property
    def bound(self) -> str:
        return "compute" if self.compute_ms >= self.memory_ms else "memory"

    def as_dict(self) -> dict:
        return {**asdict(self), "aligned_shape": self.aligned_shape, "latency_ms": self.latency_ms,
                "bound": self.bound}


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


def _bytes(info: TensorInfo | None, as_int8: bool = False) -> int:
    if info is None:
        return 0
    if as_int8 and info.elem_type in _WIDE:
        return _elements(info)
    try:
        itemsize = np.dtype(helper.tensor_dtype_to_np_dtype(info.elem_type)).itemsize
    except (KeyError, TypeError, ValueError):
        itemsize = 4
    return _elements(info) * itemsize


def _aligned(channels: int) -> float:
    return channels / (math.ceil(channels / CHANNEL_BLOCK) * CHANNEL_BLOCK) if channels > 0 else 1.0


def _mac_work(node: NodeProto, info: dict[str, TensorInfo], as_int8: bool = False) -> tuple[float, float]:
    """MACs of a Conv / MatMul node and the share of the MAC array it keeps busy."""
    a = attrs_of(node)
    out = _elements(info.get(node.output[0]))
    if node.op_type == "HzSQuantizedMatMul":
        a_shape = (info.get(node.input[0]) or TensorInfo(0, None)).shape or (0,)
        depth = a_shape[-1] or 0
        bits = (8, 8) if as_int8 else (a.get("a_bits", 8), a.get("b_bits", 8))
        return float(out) * depth, _precision(bits)
    w = info.get(node.input[1])
    w_shape = list(w.shape or []) if w else []
    if len(w_shape) < 2:
        return 0.0, 1.0
    precision = _precision((8 if as_int8 else a.get("x_bits", 8), 8))
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
    """Element operations of a non-MAC layer: one per output element, per window element for pools,
    per input element for a reduction (an ArgMax compares every value)."""
    out = float(sum(_elements(info.get(o)) for o in node.output if o))
    a = attrs_of(node)
    if has_fact(node.op_type, "reduction"):
        return float(_elements(info.get(node.input[0])))
    if node.op_type == "HzSQuantizedPool":
        return float(_elements(info.get(node.input[0]))) if a.get("kind") == "GlobalAveragePool" \
            else out * float(np.prod(a.get("kernel_shape") or [1]))
    if node.op_type == "MaxPool":
        return out * float(np.prod(a.get("kernel_shape") or [1]))
    return out


def _vector_width(node: NodeProto, info: dict[str, TensorInfo], as_int8: bool) -> int:
    """1, or 2 when the layer reads or writes int16: the vector unit takes half as many 16-bit lanes."""
    tensors = [info.get(t) for t in (*node.input, *node.output) if t]
    return 1 if as_int8 or not any(t is not None and t.elem_type in _WIDE for t in tensors) else 2


def estimate(rm: RuntimeModel, profile: MarchProfile, *, as_int8: bool = False,
             constants: CostConstants | None = None) -> ModelCost:
    """The cost of ``rm`` on ``profile``; ``as_int8``: as if every int16 activation were int8
    (what the model would cost without mixed precision); ``constants``: override the fitted ones."""
    info = tensor_info(rm.graph)
    structure = analyse(rm.graph, rm.bin.partition, info)
    core_num = rm.config_group("compiler_parameters").get("core_num", 1)
    core_num = core_num if isinstance(core_num, int) and 1 <= core_num <= 8 else 1
    nodes = list(rm.graph.graph.node)
    graph = _Graph(nodes, info, {t.name for t in rm.graph.graph.initializer}, [o.name for o in rm.graph.graph.output])
    machine = _Machine(profile, constants or constants_for(profile.name), core_num, rm.batch, as_int8)
    subgraphs = [_subgraph(structure.subgraph_name(rm.name, k), members, graph, machine)
                 for k, members in enumerate(structure.subgraphs)]
    cpu = [(n.name, n.op_type) for n, where in zip(nodes, structure.on, strict=True) if where == "CPU"]
    return ModelCost(rm.name, profile.name, profile.peak_int8_tops, profile.ddr_gbps, core_num, subgraphs, cpu)


@dataclass
class _Graph:
    nodes: list[NodeProto]
    info: dict[str, TensorInfo]
    constants: set[str]
    outputs: list[str]


@dataclass
class _Machine:
    profile: MarchProfile
    k: CostConstants
    core_num: int
    batch: int
    as_int8: bool

    @property
    def peak_ops(self) -> float:
        return self.profile.peak_int8_tops * 1e12 * self.core_num

    def compute_ms(self, node: NodeProto, info: dict[str, TensorInfo]) -> tuple[float, float, float]:
        """(MACs, OPs, compute ms) of one layer for the whole batch."""
        if node.domain == DOMAIN and has_fact(node.op_type, "mac"):
            macs, share = _mac_work(node, info, self.as_int8)
            ops, rate = 2.0 * macs, self.peak_ops * self.k.mac_efficiency * share
        else:
            macs, ops = 0.0, _vector_ops(node, info)
            rate = self.peak_ops * self.k.vector_share / _vector_width(node, info, self.as_int8)
        macs, ops = macs * self.batch, ops * self.batch
        return macs, ops, 1e3 * ops / rate if rate else 0.0


def _subgraph(name: str, indices: list[int], graph: _Graph, machine: _Machine) -> SubgraphCost:
    nodes, info = graph.nodes, graph.info
    members = [nodes[i] for i in indices]
    inside = set(indices)
    produced = {o for n in members for o in n.output if o}
    used_outside = {t for i, n in enumerate(nodes) if i not in inside for t in n.input} | set(graph.outputs)
    inputs = list(dict.fromkeys(i for n in members for i in n.input
                                if i and i not in produced and i not in graph.constants))
    outputs = [o for n in members for o in n.output if o in used_outside]
    # the part of a feature map that does not fit on chip: stored by its writer, loaded back by its first reader
    spill = {o: b - machine.k.on_chip_bytes for o in produced - set(outputs)
             if (b := _bytes(info.get(o), machine.as_int8)) > machine.k.on_chip_bytes}
    bandwidth = machine.profile.ddr_gbps * 1e9
    read_already: set[str] = set()
    layers = []
    for node in members:
        try:
            macs, ops, compute_ms = machine.compute_ms(node, info)
        except (ArithmeticError, LookupError, TypeError, ValueError) as e:  # attributes come from the file
            raise BinFormatError(f"node '{node.name}' ({node.op_type}) has malformed attributes or shapes: "
                                 f"{type(e).__name__}: {e}") from None
        weights = sum(_bytes(info.get(i)) for i in node.input if i in graph.constants)
        fresh = [i for i in node.input if (i in inputs or i in spill) and i not in read_already]
        read_already.update(fresh)
        loaded = weights + machine.batch * sum(spill[i] if i in spill else _bytes(info.get(i), machine.as_int8)
                                               for i in fresh)
        stored = machine.batch * sum(_bytes(info.get(o), machine.as_int8) if o in outputs else spill[o]
                                     for o in node.output if o in outputs or o in spill)
        out = info.get(node.output[0]) if node.output else None
        shape = list(out.shape) if out is not None and out.shape is not None else None
        start = layers[-1].start_ms + layers[-1].latency_ms if layers else 0.0
        layers.append(LayerCost(node.name, node.op_type, macs, ops, weights, loaded, stored, compute_ms,
                                1e3 * (loaded + stored) / bandwidth, machine.k.layer_overhead_ms, shape, start))
    return SubgraphCost(name, layers, inputs, outputs)
