"""Where calibration nodes go, with how many bits, and how the calibrated model is built.

Every tensor the BPU holds as integers has one activation calibration node, shared
by all its BPU consumers (SPEC §7):
- the output of a BPU op that is not an accumulator (LUT, Add, pool, concat,
  preprocess): always materialised, so every consumer reads the calibrated value;
- the output of a Conv/MatMul, or a CPU/float tensor, read by a BPU op;
- data-movement ops (Reshape, MaxPool, …) keep their input's grid: no node.
Conv/MatMul outputs read only by the CPU or the user stay int32 (no node), also where
BPU layout moves (a detector head's output permute) carry them to float model outputs.

``calibration_parameters.per_channel`` gives a tensor one threshold per channel
when every reader is a BPU conv-like unit (its integer kernel folds the input
scales into the weights); ``optimization: asymmetric`` gives int8 tensors a zero
point (see ``hbtools.quant.grids``).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass, field, replace

import numpy as np
from onnx import ModelProto, NodeProto, TensorProto, helper, numpy_helper

from hbtools.config.model import Config, NodeInfo, OptimizationOptions
from hbtools.graph.constant_terms import Tails
from hbtools.graph.graph import GraphView, topological_sort
from hbtools.graph.masks import MASKED_LOGIT, logit_carriers
from hbtools.graph.model_io import default_opset, with_horizon_domain
from hbtools.graph.origins import Fusion, recorded_fusions, written_as
from hbtools.log import first_of
from hbtools.march.profiles import MarchProfile
from hbtools.ops import registry
from hbtools.ops.base import DOMAIN, attrs_of
from hbtools.ops.calibration import HzBiasCalibration, HzCalibration
from hbtools.ops.names import CALIBRATED_SUFFIX, SPLIT_DOC, calibration_node, record_cpu_nodes
from hbtools.ops.preprocess import HzPreprocess
from hbtools.ops.softmax import softmax_axis
from hbtools.quant.bounds import integer_valued, value_bounds
from hbtools.quant.grids import (
    Grid,
    activation_grid,
    fed_values,
    input_scale_array,
    output_channel_rows,
    output_scale_array,
    scales_for,
)
from hbtools.quant.statistics import ChannelStats, StatsCollector, TensorStats
from hbtools.quant.thresholds import int16_threshold
from hbtools.quant.units import Partition, Unit, accumulator_axis, int8_logits, int32_tails

log = logging.getLogger("hbtools")

# How far below the scores a masked position of a Softmax input saturates: its probability is then at most
# exp(-20) = 2e-9 of the row's largest.
MASK_MARGIN = 20.0
PROBABILITY_HEADROOM = 2.0  # a Softmax output's grid beyond the calibration max (``probability_threshold``)
TINY_TENSOR = 64  # values of a side input's tensor int16 costs nothing measurable for (``_tiny_side_paths``)


@dataclass
class ActivationPoint:
    tensor: str
    bits: int
    rewire: list[tuple[str, int]]  # (node name, input index) that read the calibrated value
    graph_output: bool = False
    axis: int | None = None  # channel axis of a per-channel tensor
    asymmetric: bool = False  # zero point wanted (applies to int8 grids)
    zero_point_ok: bool = False  # every integer reader takes a zero point (``_zero_point_ok``)
    low: float | np.ndarray | None = None  # observed minimum (per channel along axis), see observe
    high: float | np.ndarray | None = None
    whole: bool = False  # holds whole numbers only (``bounds.integer_valued``): a whole step

    @property
    def node_name(self) -> str:
        return calibration_node(self.tensor)

    def grid(self, threshold: float | np.ndarray, bits: int | None = None) -> Grid:
        return activation_grid(threshold, self.bits if bits is None else bits, asymmetric=self.asymmetric,
                               low=self.low, high=self.high, whole=self.whole)

    def fed(self, threshold: float, bits: int | None = None) -> dict[str, np.ndarray]:
        """Graph-input values setting this point's node in a ``feed_calibration`` session to ``threshold``."""
        bits = self.bits if bits is None else bits
        node_has_zero_points = self.grid(1.0).zero_points is not None  # as build_calibrated_model made it
        return fed_values(self.node_name, self.grid(threshold, bits), bits, node_has_zero_points)


@dataclass
class WeightPoint:
    tensor: str
    axis: int
    rewire: list[tuple[str, int]]
    groups: int = 1  # a grouped ConvTranspose's weight: output channels over two axes (``weight_groups``)

    @property
    def node_name(self) -> str:
        return calibration_node(self.tensor)


@dataclass
class CalibrationPlan:
    activations: list[ActivationPoint] = field(default_factory=list)
    weights: list[WeightPoint] = field(default_factory=list)
    rounding: dict[str, np.ndarray] = field(default_factory=dict)  # weight -> GPTQ offsets from nearest (int8)
    # tensor -> the calibrated tensor whose grid it carries (itself, or through data-movement ops)
    grid_source: dict[str, str] = field(default_factory=dict)
    # node -> the Hz op standing for it in the calibrated model (``HzOp.calibrated_op``)
    emulated: dict[str, str] = field(default_factory=dict)
    cpu_nodes: list[str] = field(default_factory=list)  # nodes the quantized model runs in float on the CPU
    # tensors a BPU node writing or reading them keeps int8 (a ConvTranspose: no int16 form on the march), or the
    # config does (set_{Op}_input_int8 / _output_int8, node_info int8): the int16 search leaves them int8
    int8_only: set[str] = field(default_factory=set)
    # reciprocal table output -> the numerator it multiplies: its statistics count only the elements where
    # that numerator is not zero (``_reciprocal_numerators``)
    counted_where: dict[str, str] = field(default_factory=dict)
    # tensor -> the largest magnitude its producer can give whatever its input (a Sigmoid's 1): an int16
    # grid covers it (``thresholds.int16_threshold``)
    bounds: dict[str, float] = field(default_factory=dict)
    # tensor -> the factor its int16 grid covers beyond the calibration max (``HEADROOM``)
    headroom: dict[str, float] = field(default_factory=dict)
    # Softmax outputs: their grids cover PROBABILITY_HEADROOM times the calibration max, up to 1
    # (``probability_threshold``)
    probabilities: set[str] = field(default_factory=set)
    # tensors on the way to a Softmax input, which attention masks add large negative values to
    # (``masks.logit_carriers``): their grids fit the scores (``logit_threshold``)
    logit_carriers: set[str] = field(default_factory=set)

    def int16_threshold(self, tensor: str, observed: float | np.ndarray) -> float | np.ndarray:
        """The threshold of ``tensor`` on an int16 grid, from its ``observed`` one: a bounded function's bound
        (``thresholds.int16_threshold``), a fast-growing tensor's ``HEADROOM``."""
        return int16_threshold(observed, self.bounds.get(tensor)) * self.headroom.get(tensor, 1.0)

    def probability_threshold(self, tensor: str, threshold: float | np.ndarray,
                              stats: TensorStats | ChannelStats) -> float | np.ndarray:
        """``threshold`` of a Softmax output: at least the calibration max (a method that clips gains resolution
        for the many small probabilities and loses the peaks, which carry the result) and ``PROBABILITY_HEADROOM``
        times it, up to 1. Another picture's attention peaks beyond the calibration pictures' (a MobileViT's
        0.153 became 0.436: held-out cosine 0.978 minimum, 0.998 with the headroom)."""
        if tensor not in self.probabilities or not isinstance(stats, TensorStats) or not stats.count:
            return threshold
        return min(1.0, max(float(threshold), float(stats.max_abs)) * PROBABILITY_HEADROOM)

    def logit_threshold(self, tensor: str, threshold: float | np.ndarray,
                        stats: TensorStats | ChannelStats) -> float | np.ndarray:
        """``threshold`` of a tensor whose statistics left masked positions out (``StatsCollector.masked``): the
        scores' range and ``MASK_MARGIN`` below it, where the masked positions saturate (their probability is
        then at most exp(-MASK_MARGIN)); a mask alone (zeros where it keeps) takes 0 and ``MASKED_LOGIT`` exactly.
        A grid over the fill itself (``finfo(float32).min``) put every score on one level: uniform attention."""
        if tensor not in self.logit_carriers or not isinstance(stats, TensorStats) or not stats.masked:
            return threshold  # (the collector keeps masked positions apart for per-tensor statistics only)
        return threshold + MASK_MARGIN if stats.max_abs > 0 else -MASKED_LOGIT

    def activation(self, tensor: str) -> ActivationPoint | None:
        return next((p for p in self.activations if p.tensor == tensor), None)

    def collector(self) -> StatsCollector:
        """Statistics for every point: per channel where the point is per channel."""
        axes = {p.tensor: p.axis for p in self.activations if p.axis is not None}
        return StatsCollector([p.tensor for p in self.activations], axes, self.counted_where, self.logit_carriers)

    def observed(self, collector: StatsCollector) -> CalibrationPlan:
        """A copy with the observed ranges recorded (asymmetric grids are fitted to them); it shares all but its
        activation points with this plan."""
        plan = copy.copy(self)
        plan.activations = [copy.copy(p) for p in self.activations]
        for p in plan.activations:
            stats = collector.stats.get(p.tensor)
            if stats is not None and stats.count:
                p.low, p.high = stats.min, stats.max
                if p.tensor in plan.probabilities:  # a zero-point grid keeps the headroom too
                    p.high = min(1.0, float(stats.max) * PROBABILITY_HEADROOM)
        return plan

    def with_bits(self, bits: dict[str, int]) -> CalibrationPlan:
        """A copy with some tensors' bit widths changed (mixed precision's choice)."""
        plan = copy.deepcopy(self)
        for p in plan.activations:
            p.bits = bits.get(p.tensor, p.bits)
        return plan

    def with_zero_points(self) -> CalibrationPlan | None:
        """A copy whose int8 tensors that may take a zero point do (None: none may, or they already do)."""
        if not any(p.zero_point_ok and not p.asymmetric and p.bits == 8 for p in self.activations):
            return None
        plan = copy.deepcopy(self)
        for p in plan.activations:
            p.asymmetric = p.asymmetric or p.zero_point_ok
        return plan

    def with_rounding(self, rounding: dict[str, np.ndarray]) -> CalibrationPlan:
        """A copy whose weights take GPTQ's offsets from nearest rounding."""
        plan = copy.deepcopy(self)
        plan.rounding = dict(rounding)
        return plan


def _warn_int8_not_applied(model: ModelProto, part: Partition, opts: OptimizationOptions) -> None:
    """Integer options that a node computing in float on the CPU cannot honour, one WARNING per output or
    option: set_model_output_int8/16 for an output a CPU node makes (an X3 classifier's final Softmax),
    set_{Op}_input_int8 / _output_int8 for nodes of that kind on the CPU. They were silently no-ops."""
    def where(unit: Unit) -> str:
        return f"node {unit.main.name} ({unit.main.op_type}) runs on the CPU" + \
            (f" ({unit.reason})" if unit.reason else "")

    if opts.output_bits is not None:
        for out in model.graph.output:
            producer = part.producer.get(out.name)
            if producer is None or producer.on == "BPU" or out.type.tensor_type.elem_type != TensorProto.FLOAT:
                continue  # an int64 result (indices, a length) is no float to turn into integers
            log.warning("set_model_output_int%d: output '%s' stays float32: %s and computes in float",
                        opts.output_bits, out.name, where(producer))
    for kinds, side in ((opts.int8_inputs, "input"), (opts.int8_outputs, "output")):
        for kind in sorted(kinds):
            cpu = [u for u in part.units if u.on != "BPU" and any(n.op_type == kind for n in u.nodes)]
            for unit in cpu[:3]:
                log.warning("set_%s_%s_int8: %s and computes in float; its %s stays float", kind, side, where(unit),
                            side)
            if len(cpu) > 3:
                log.warning("set_%s_%s_int8: %d more %s nodes run on the CPU in float", kind, side, len(cpu) - 3,
                            kind)


def _size(view: GraphView, tensor: str) -> int | None:
    """How many values ``tensor`` holds, where its shape is known and static."""
    shape = view.shapes.get(tensor)
    if shape is None or not all(isinstance(d, int) and d > 0 for d in shape):
        return None
    return int(np.prod(shape, dtype=np.int64))


def weight_axis(node: NodeProto, view: GraphView) -> int:
    """The output-channel axis of a conv-like node's weight."""
    if node.op_type == "ConvTranspose":
        return 1
    if node.op_type == "Gemm":
        return 0 if view.attrs(node).get("transB", 0) else 1
    if node.op_type == "MatMul":
        return 1
    return 0


def weight_groups(node: NodeProto, view: GraphView) -> int:
    """How many groups a conv-like node's weight lists its output channels in: a grouped ConvTranspose's
    ``[C, O/group, k...]`` holds ``O/group`` per group along axis 1 (``grids.output_scale_array``); 1
    where ``weight_axis`` lists them all."""
    return int(view.attrs(node).get("group", 1)) if node.op_type == "ConvTranspose" else 1


def make_plan(model: ModelProto, part: Partition, config: Config | None, profile: MarchProfile) -> CalibrationPlan:
    view = GraphView(model)
    bits_of, pinned = _requested_bits(part, config, profile, set(view.graph_outputs),
                                      Tails(model).grids(view.graph_outputs) if profile.int16 else [], view.const,
                                      written_as(model), recorded_fusions(model), lambda t: _size(view, t),
                                      list(view.graph_inputs))
    if config is not None:
        _warn_int8_not_applied(model, part, config.calibration.options)
    plan = CalibrationPlan()
    int_outputs = wants_int_outputs(config)
    integer_inputs = {i.name for i in model.graph.input
                      if i.type.tensor_type.elem_type in (TensorProto.INT8, TensorProto.UINT8)}
    tensors = [*view.graph_inputs, *(t for u in part.units for t in u.outputs)]
    int32_moved = int32_tails(part, view, int_outputs)
    for tensor in dict.fromkeys(tensors):
        if tensor in integer_inputs or tensor in int32_moved:
            continue
        producer = part.producer.get(tensor)
        bpu_users = part.bpu_consumers(tensor)
        if producer is not None and producer.on == "BPU" and producer.kind == "passive":
            continue
        materialised = producer is not None and producer.on == "BPU" and not producer.is_accumulator \
            and not producer.gives_indices
        if int_outputs and producer is not None and producer.on == "BPU" and producer.is_accumulator \
                and tensor in view.graph_outputs:
            materialised = True  # set_model_output_int8/int16: a conv output leaves as integers too
        if not materialised and not bpu_users:
            continue
        users = part.consumers.get(tensor, []) if materialised else bpu_users
        rewire = [(n.name, k) for u in users for n in u.nodes for k, i in enumerate(n.input) if i == tensor]
        is_output = materialised and tensor in view.graph_outputs
        plan.activations.append(ActivationPoint(tensor, bits_of.get(tensor, 8), rewire, is_output))
    _plan_weights(plan, part, view)
    for unit in part.units:
        op_class = registry.op_for_unit_kind(unit.kind) if unit.on == "BPU" else None
        if op_class is not None and op_class.calibrated_op:
            plan.emulated[unit.main.name] = op_class.calibrated_op
    plan.cpu_nodes = [n.name for unit in part.units if unit.on != "BPU" for n in unit.nodes]
    if profile.int16:
        plan.int8_only = {p.tensor for p in plan.activations
                          if p.tensor in pinned or part.int16_blocker(p.tensor, profile) is not None}
    calibrated = {p.tensor for p in plan.activations}
    plan.counted_where = _reciprocal_numerators(part, view, calibrated)
    plan.bounds = _bounded_outputs(part, calibrated, view)
    whole = integer_valued(view)
    for p in plan.activations:
        p.whole = p.tensor in whole
    plan.headroom = {t: f for t, f in _headroom(part, view.const).items() if t in calibrated}
    plan.logit_carriers = logit_carriers(model) & calibrated
    plan.probabilities = {n.output[0] for n in view.graph.node if n.op_type == "Softmax"} & calibrated
    plan.grid_source = {t: t for t in calibrated}
    for unit in part.units:
        if unit.on == "BPU" and unit.kind == "passive" and unit.inputs and unit.inputs[0] in plan.grid_source:
            for t in unit.outputs:
                plan.grid_source.setdefault(t, plan.grid_source[unit.inputs[0]])
    if per_channel_wanted(config):
        readers: dict[str, int] = {}
        for n in view.graph.node:
            for i in set(n.input):
                readers[i] = readers.get(i, 0) + 1
        for p in plan.activations:
            p.axis = _channel_axis(p.tensor, part, view, readers)
        log.info("per_channel: %d of %d calibrated tensors (those read only by convolutions) get per-channel "
                 "thresholds", sum(p.axis is not None for p in plan.activations), len(plan.activations))
    for p in plan.activations:
        p.zero_point_ok = _zero_point_ok(p.tensor, part, view, int_outputs)
    if asymmetric_wanted(config):
        for p in plan.activations:
            p.asymmetric = p.zero_point_ok
        log.info("asymmetric: %d of %d calibrated tensors may get a zero point (int8 ones)",
                 sum(p.asymmetric for p in plan.activations), len(plan.activations))
    return plan


def _bounded_outputs(part: Partition, calibrated: set[str], view: GraphView) -> dict[str, float]:
    """Calibrated tensors of BPU units with a bound on their magnitude that holds for any input
    (``bounds.value_bounds``)."""
    found = value_bounds(view)
    return {t: found[t] for unit in part.units if unit.on == "BPU" for t in unit.outputs
            if t in calibrated and t in found}


def _plan_weights(plan: CalibrationPlan, part: Partition, view: GraphView) -> None:
    for unit in part.units:
        if unit.on == "BPU" and unit.kind == "conv":
            node = unit.main
            w = node.input[1]
            existing = next((p for p in plan.weights if p.tensor == w), None)
            if existing:
                existing.rewire.append((node.name, 1))
            else:
                plan.weights.append(WeightPoint(w, weight_axis(node, view), [(node.name, 1)],
                                                weight_groups(node, view)))


def per_channel_wanted(config: Config | None) -> bool:
    """per_channel acts with the single-method calibration types (seed 001: not with default/mix)."""
    return bool(config and config.calibration.per_channel
                and config.calibration.calibration_type in ("max", "kl", "skip"))


def asymmetric_wanted(config: Config | None) -> bool:
    """optimization: asymmetric; a QAT model (load) brings its own grids."""
    return bool(config and config.calibration.options.asymmetric and config.calibration.calibration_type != "load")


def weight_input_axis(node: NodeProto, view: GraphView) -> int:
    """The input-channel axis of a conv-like node's weight."""
    if node.op_type in ("ConvTranspose", "MatMul"):
        return 0
    if node.op_type == "Gemm":
        return 1 if view.attrs(node).get("transB", 0) else 0
    return 1


def _data_axis(unit: Unit, view: GraphView) -> int | None:
    """Axis of a conv-like unit's input that its weight reduces over (the input channels)."""
    if unit.main.op_type in ("Conv", "ConvTranspose"):
        return 1
    shape = view.shapes.get(unit.main.input[0])
    return len(shape) - 1 if shape else None


def _channel_axis(tensor: str, part: Partition, view: GraphView, readers_of: dict[str, int]) -> int | None:
    """The per-channel axis of ``tensor``, or None when it must stay per tensor.

    Every reader must be a BPU conv-like unit (Conv, ConvTranspose, MatMul/Gemm with a
    constant weight) reading it as data, with a weight no other node reads, all
    reducing over the same axis; the producer must write per-channel scales: a model
    input or CPU tensor (HzQuantize), a conv-like unit with that output channel axis,
    or an NCHW preprocess.
    """
    readers = part.consumers.get(tensor, [])
    if not readers or tensor in view.graph_outputs:
        return None
    axes = set()
    for u in readers:
        if u.on != "BPU" or u.kind != "conv" or u.main.input[0] != tensor or readers_of[u.main.input[1]] != 1:
            return None
        axes.add(_data_axis(u, view))
    if len(axes) != 1 or None in axes:
        return None
    axis = axes.pop()
    producer = part.producer.get(tensor)
    if producer is None or producer.on == "CPU":
        return axis
    if producer.kind == "conv":
        return axis if accumulator_axis(producer, view) == axis else None
    if producer.kind == "preprocess" and attrs_of(producer.main).get("layout", "NCHW") == "NCHW":
        return axis if axis == 1 else None
    return None


def _zero_point_ok(tensor: str, part: Partition, view: GraphView, int_outputs: bool) -> bool:
    """Whether ``tensor`` may take an asymmetric grid.

    Every integer reader (through data-movement ops) must take a zero point: all Hz
    integer ops do, except a ConvTranspose (its float kernel is exact only for
    symmetric int8 sums). Integer model outputs (set_model_output_int8/16) stay
    symmetric since their descriptors carry a scale only. The preprocessed image
    stays symmetric too: it already lies on a 256-level pixel grid, and a 256-level
    grid holding 0 exactly is offset from it by half a level whenever the mean is a
    half-integer (e.g. 127.5), which puts every pixel on a rounding tie.
    """
    producer = part.producer.get(tensor)
    if producer is not None and producer.kind == "preprocess":
        return False
    pending, seen = [tensor], set()
    while pending:
        t = pending.pop()
        if t in seen:
            continue
        seen.add(t)
        if int_outputs and t in view.graph_outputs:
            return False
        for u in part.bpu_consumers(t):
            if u.kind == "conv" and u.main.op_type == "ConvTranspose":
                return False
            if u.kind == "passive":
                pending.extend(u.outputs)
    return True


def wants_int_outputs(config: Config | None) -> bool:
    """set_model_output_int8 / set_model_output_int16: BPU outputs stay integers."""
    return bool(config and config.calibration.options.int_outputs)


def _reciprocal_numerators(part: Partition, view: GraphView, calibrated: set[str]) -> dict[str, str]:
    """Per reciprocal table output that one Mul reads (a Div of two tensors, ``bpu_forms``), the other
    factor: the numerator.

    ``a / (b + eps)`` is often taken where ``a`` and ``b`` are both 0 (a normalization by a sum of ReLU'd
    features, a linear attention's denominator): the reciprocal is then ``1 / eps`` and the product 0. A
    grid fitted to those values (up to 1e15) leaves every other reciprocal on level 0 and the quotient
    all zeros; counted only where the numerator is not 0, the grid covers the reciprocals that reach
    the output."""
    found = {}
    for unit in part.units:
        if unit.on != "BPU" or unit.kind != "lut":
            continue
        for node in unit.nodes:
            if node.op_type != "Reciprocal" or node.output[0] not in calibrated:
                continue
            readers = view.consumers.get(node.output[0], [])
            if len(readers) == 1 and readers[0].op_type == "Mul" and len(readers[0].input) == 2 \
                    and node.output[0] not in view.graph_outputs:
                a, b = readers[0].input
                other = b if a == node.output[0] else a
                if other != node.output[0] and not view.is_const(other):
                    found[node.output[0]] = other
    return found


def _squares_and_their_sums(part: Partition, const: Callable[[str], np.ndarray | None]) -> list[str]:
    """Outputs of BPU squares (``_is_square``) and of the BPU reductions summing or averaging them."""
    squares = [u.outputs[0] for u in part.units if u.on == "BPU" and u.outputs and _is_square(u.main, const)]
    sums = [u.outputs[0] for u in part.units if u.on == "BPU" and u.outputs
            and u.main.op_type in ("ReduceSum", "ReduceMean") and any(part.grid_of(t) in squares for t in u.inputs)]
    return [*squares, *sums]


_PICKS = ("TopK", "ArgMax", "ArgMin")
# What the terms of the values a pick ranks go through: differences and products by constants, and for a pick
# of the smallest or nearest (TopK, ArgMin: a kNN, a codebook lookup) sums too, as a distance is written
# |a|^2 - 2ab + |b|^2 as often as with Subs. Not for an ArgMax over class logits, which a residual stream
# sums (a segmenter's logits summed with a skip branch pulled the whole stream into int16, and its labels came
# out worse).
_DIFFERENCES = ("Sub", "Neg", "Mul", "Div")
_SUMS = ("Add", "Sum")


def _ranked_values(part: Partition, const: Callable[[str], np.ndarray | None], int8_inputs: Collection[str],
                   kept8: Collection[str]) -> list[tuple[str, str]]:
    """(tensor, picking node) for the BPU tensors a TopK / ArgMax / ArgMin ranks, and, back through BPU
    differences (and products with constants; sums too for a TopK or ArgMin), the terms they are made of; none
    for a picker whose input the config keeps int8 (its op kind in ``int8_inputs``, its name in ``kept8``)."""
    found: dict[str, str] = {}
    for unit in part.units:
        if unit.main.op_type not in _PICKS or not unit.inputs or unit.main.op_type in int8_inputs \
                or unit.main.name in kept8:
            continue
        stack = [part.grid_of(unit.inputs[0])]
        while stack:
            t = stack.pop()
            producer = part.producer.get(t)
            if t in found or producer is None or producer.on != "BPU":
                continue
            found[t] = unit.main.name
            node = producer.main
            walked = _DIFFERENCES + (_SUMS if unit.main.op_type != "ArgMax" else ())
            if len(producer.nodes) == 1 and node.op_type in walked and (
                    node.op_type not in ("Mul", "Div") or any(const(i) is not None for i in node.input)):
                stack.extend(part.grid_of(i) for i in producer.inputs)
    return list(found.items())


# What an int16 grid of a tensor that grows fastest outside the calibration pictures' range covers beyond their max
# (2 of its 16 bits): a reciprocal grows without bound as its divisor shrinks (a darker picture, a face of lower
# quality, whose features are smaller: an embedding normalised to 0.52 instead of 1), a square four times for
# twice its input, and a divisor clipped at the calibration max scales every quotient (norms 1.1 for 1).
HEADROOM = 4.0


def _headroom(part: Partition, const: Callable[[str], np.ndarray | None]) -> dict[str, float]:
    """Tensors whose int16 grid gets ``HEADROOM`` times the calibration max: reciprocal tables' inputs (a divisor
    beyond the calibrated range is clipped, and every quotient with it) and outputs, squares and their sums."""
    tables = [u for u in part.units
              if u.on == "BPU" and u.kind == "lut" and any(n.op_type == "Reciprocal" for n in u.nodes)]
    reciprocals = [part.grid_of(t) for u in tables for t in [*u.inputs, *u.outputs]]
    return dict.fromkeys([*reciprocals, *_squares_and_their_sums(part, const)], HEADROOM)


def _is_square(node: NodeProto, const: Callable[[str], np.ndarray | None]) -> bool:
    """``x * x`` or ``x ** 2``."""
    if node.op_type == "Mul":
        return len(node.input) == 2 and node.input[0] == node.input[1]
    if node.op_type == "Pow" and len(node.input) == 2:
        exponent = const(node.input[1])
        return exponent is not None and exponent.size == 1 and float(exponent.reshape(-1)[0]) == 2.0
    return False


def _tiny_side_paths(part: Partition, inputs: list[str], sizes: Callable[[str], int | None]) -> list[str]:
    """The model inputs of at most ``TINY_TENSOR`` values, and what BPU units other than tables compute from them
    alone (their Concats, sums, products) with as few values: a side input's own arithmetic."""
    def tiny(t: str) -> bool:
        return 0 < (sizes(t) or 0) <= TINY_TENSOR

    side = {t for t in inputs if t not in part.producer and part.bpu_consumers(t) and tiny(t)}
    for unit in part.units:  # in graph order
        if unit.on == "BPU" and unit.kind not in ("lut", "passive") and unit.inputs and \
                all(part.grid_of(t) in side for t in unit.inputs) and all(tiny(t) for t in unit.outputs):
            side.update(unit.outputs)
    return [t for t in side if not (part.producer.get(t) and part.producer[t].gives_indices)]


def _requested_bits(part: Partition, config: Config | None, profile: MarchProfile,
                    graph_outputs: set[str], grids: list[str],
                    const: Callable[[str], np.ndarray | None], written: dict[str, list[str]],
                    fusions: dict[str, Fusion], sizes: Callable[[str], int | None],
                    model_inputs: list[str]) -> tuple[dict[str, int], set[str]]:
    """int16 requests (node_info, optimization, the rules below) per tensor; int8 where the march has no
    int16. Also returns the tensors the config pins to int8 (set_{Op}_input_int8 / _output_int8, node_info).
    ``grids``: tensors decoding positions around a constant grid (``Tails.grids``); ``written``: the user's
    nodes the optimize stage wrote as others (``origins.written_as``), which node_info may name;
    ``fusions``: those it fused into others (``origins.recorded_fusions``); ``sizes``: a tensor's number of
    values, where its shape is known; ``model_inputs``: the graph's inputs."""
    bits: dict[str, int] = {}
    opts = config.calibration.options if config else OptimizationOptions()
    output_bits = 8 if opts.output_bits == 8 else (16 if profile.int16 else 8)

    # Without int16 on the march, a request per node of a model-wide option (set_all_nodes_int16,
    # set_Conv_output_int16) would print a warning per tensor: one per option says it all.
    dropped: dict[str, list[str]] = {}

    grid_of = part.grid_of

    def request(tensor: str, what: str, option: str | None = None, asked: bool = True) -> None:
        """int16 for ``tensor``; ``asked``: by the config (a fallback to int8 is a WARNING), else by a rule of
        hbtools' own, which says nothing where the march cannot (the user asked nothing)."""
        say = log.warning if asked else log.debug
        tensor = grid_of(tensor)
        if not profile.int16:
            if option is None:
                say("%s: int16 is not available on %s; falling back to int8", what, profile.label)
            else:
                dropped.setdefault(option, []).append(what)
            return
        # An int16 tensor needs its producer and every BPU reader to take int16 (seed: the
        # request updates the op's context; unsupported combinations fall back to int8).
        blocker = part.int16_blocker(tensor, profile)
        if blocker is not None:
            say("%s: %s node %s has no int16 form on %s; falling back to int8", what, blocker.main.op_type,
                blocker.main.name, profile.label)
            return
        bits[tensor] = 16

    for unit in part.units:
        for t in unit.outputs:
            if unit.on == "BPU" and unit.kind != "passive" and not unit.gives_indices \
                    and (not unit.is_accumulator or wants_int_outputs(config)):
                if t in graph_outputs:
                    bits[t] = output_bits
            elif unit.on == "BPU" and unit.kind == "passive" and output_bits == 16 and t in graph_outputs:
                # a PixelShuffle (DepthToSpace) or Reshape writing the output carries its input's grid: the
                # request is for that tensor (an SR net's last conv); it was left int8 without a word
                source = part.producer.get(grid_of(t))
                if source is not None and source.on == "BPU" and not source.gives_indices:
                    request(t, f"set_model_output_int16 (output {t}, written by {unit.main.op_type} {unit.main.name})")
    # What a float join puts into a model output (``units._join_outputs_in_float``) leaves the BPU as the
    # output would have: a convolution's result as its accumulator, anything else at the output bit width.
    for t in {grid_of(t) for u in part.units if u.output_join for t in u.inputs}:
        producer = part.producer.get(t)
        if producer is not None and producer.on == "BPU" and producer.kind != "passive" and not producer.is_accumulator:
            bits[t] = output_bits
    if opts.output_bits == 16 and not profile.int16:
        log.warning("set_model_output_int16: int16 is not available on %s; falling back to int8", profile.label)
    for unit in part.units:
        _request_int16_input(part, unit, profile, request)
    # A reciprocal table (a Div of two tensors, ``bpu_forms.divisions_as_reciprocal_products``) maps a
    # divisor over orders of magnitude to its inverse: on int8 grids the small divisors share a few levels
    # and the large ones' inverses round to zero, so both sides are int16 where the march has it.
    for unit in part.units:
        if unit.on == "BPU" and unit.kind == "lut" and profile.int16 and \
                any(n.op_type == "Reciprocal" for n in unit.nodes):
            for t in [*unit.inputs, *unit.outputs]:
                request(t, f"node {unit.main.name} (a reciprocal table)", asked=False)
    # A square spans twice the decades of its input: on an int8 grid the small squares round to 0, and a sum
    # of them (an L2 norm, ``bpu_forms.norms_as_sums``; a variance) loses most of its value on pictures whose
    # features are small (an embedding normalised to 0.52 instead of 1). The cosine the searches score does
    # not see a per-sample scale, so the squares and what sums them are int16 where the march has it.
    for t in _squares_and_their_sums(part, const):
        request(t, f"node {part.producer[t].main.name} (a square, or a sum of squares)", asked=False)
    # A TopK / ArgMax picks by the order of close values (a kNN's smallest distances, the classes near the top):
    # an int8 grid puts them on one or two levels and the pick is near random, while the cosine the searches
    # score over the whole tensor hardly moves (a DGCNN distance matrix: 0.9999, half of the neighbours lost).
    # A difference of large terms (|x_i|^2 + |x_j|^2 - 2 x_i.x_j) carries every term's rounding, so the terms
    # are int16 too. Not where the config keeps the picker's input int8 (set_ArgMax_input_int8, node_info).
    node_info = config.model.node_info if config else {}
    kept8 = {name for name, info in node_info.items() if "int8" in info.input_types.values()}
    for t, picker in _ranked_values(part, const, opts.int8_inputs, kept8):
        request(t, f"tensor {t} (values node {picker} ranks)", asked=False)
    # Positions decoded around a grid of constants (anchor points, strides): an int8 grid spends its
    # levels on the positions and rounds what the model predicts to a few pixels (2.5 at 320x320). These
    # tensors are a head's few small ones, so int16 costs little, and with every calibration_type: a
    # cosine goal, even without the grid (``search.constant_terms``), lets a pixel or two through.
    decoded = [t for t in grids if t in part.producer and part.producer[t].on == "BPU"]
    for t in decoded:
        request(t, f"tensor {t} (positions around a constant grid)", asked=False)
    if decoded:
        log.info("%d tensors add a constant that differs over their elements (positions around a grid) and are "
                 "int16: %s", len(decoded),
                 first_of(decoded, 6))
    # The two halves of a split convolution (``weight_precision.split_weights``) each carry the input's
    # level times the rounding remainder of the weight, which cancel only in their sum: their range
    # follows the picture, not the layer's output, and an int8 grid fitted on the calibration set
    # clips or coarsens them on other pictures (PP-OCRv5 det held out: 0.965 searched, 0.993 int16).
    halves = [t for unit in part.units if unit.on == "BPU" for node in unit.nodes
              if node.doc_string == SPLIT_DOC for t in node.output if t in part.producer]
    for t in halves:
        request(t, f"tensor {t} (half of a split convolution)", asked=False)
    # A model input of a few values (a scale_factor or image-size input, a camera's intrinsics), and what is
    # computed from it alone, costs the BPU next to nothing at 16 bits, and each of its values counts: a
    # PaddleDetection scale_factor input of two values on an int8 grid put 1 % on every box coordinate, which
    # the output cosine the int16 search scores cannot see (0.99998). Not other small tensors: a
    # squeeze-and-excitation gate's table would take 65536 entries. Not with set_all_nodes_int8, which asks for
    # int8 wherever the config does not ask otherwise.
    if not opts.all_int8:
        for t in _tiny_side_paths(part, model_inputs, sizes):
            if t not in graph_outputs:  # an output keeps the output bits (set_model_output_int8)
                request(t, f"tensor {t} (a side input's, at most {TINY_TENSOR} values)", asked=False)
    all16 = opts.all_int16
    int8: set[str] = set()  # grids of set_{Op}_input_int8 / output_int8: applied after every int16 request
    per_node: set[str] = set()  # int16 asked of a node by name (node_info), which no op-kind option overrides
    for unit in part.units:
        for node in unit.nodes:
            info = node_info.get(node.name)
            kind = node.op_type
            asked16 = info is not None and info.output_type == "int16"  # by name: below, with its own messages
            if kind in opts.int16_outputs and unit.gives_indices and not asked16:
                log.warning("node %s (%s) gives int64 indices: an int16 output does not apply to it", node.name,
                            kind)
            elif (all16 or kind in opts.int16_outputs) and not asked16:
                for t in unit.outputs:
                    request(t, f"node {node.name} output",
                            "set_all_nodes_int16" if all16 else f"set_{kind}_output_int16")
            if all16 or kind in opts.int16_inputs:
                for t in unit.inputs:
                    request(t, f"node {node.name} input", "set_all_nodes_int16" if all16 else f"set_{kind}_input_int16")
            if kind in opts.int8_inputs:
                int8.update(grid_of(t) for t in unit.inputs)
            if kind in opts.int8_outputs:
                int8.update(grid_of(t) for t in unit.outputs)
    targets = _node_info_targets(part, node_info, written)
    _warn_types_on_cpu(part, targets, profile)
    for target in targets:
        info = target.info
        if not profile.int16 and _on_cpu(target):  # said once by _warn_types_on_cpu: no int16 to fall back from
            info = replace(info, output_type=info.output_type if info.output_type != "int16" else None,
                           input_types={k: v for k, v in info.input_types.items() if v != "int16"})
        if info.output_type == "int16":
            if target.gives_indices:
                log.warning("node %s (%s) gives int64 indices: an int16 output does not apply to it", target.name,
                            target.op_type)
            else:
                for t in target.outputs:
                    request(t, f"node {target.name} output")
                    per_node.add(grid_of(t))
        if info.output_type == "int8":  # as set_{Op}_output_int8, for this node
            int8.update(grid_of(t) for t in target.outputs)
        for idx, dtype in info.input_types.items():
            targets = target.inputs if idx is None else target.inputs[idx: idx + 1]
            if dtype == "int8":  # as set_{Op}_input_int8: over the op's own int16 reading
                int8.update(grid_of(t) for t in targets)
            elif dtype == "int16":
                for t in targets:
                    request(t, f"node {target.name} input {idx if idx is not None else 'all'}")
                    per_node.add(grid_of(t))
    # An op kind's int8 wins over the model-wide int16 options (set_all_nodes_int16;set_Conv_input_int8 keeps
    # every Conv's input int8, though it is also the input or output of the nodes around it).
    pinned = int8 - per_node
    for t in pinned:
        bits[t] = 8
    for option, whats in dropped.items():
        if option.startswith("set_all_nodes"):  # every tensor: a list would name hbtools' own nodes too
            log.warning("%s: int16 is not available on %s; every tensor stays int8", option, profile.label)
            continue
        log.warning("%s: int16 is not available on %s; falling back to int8 (%s)", option, profile.label,
                    first_of(whats))
    for name, info in node_info.items():
        # An ON request for a missing node is reported where placement is applied (units._apply_overrides).
        if info.on is None and (info.output_type or info.input_types) and name not in part.unit_of_node \
                and name not in written:
            into = fusions[name].node if name in fusions else None
            parts = [n for n in [into, *written.get(into, [])] if n in part.unit_of_node] if into else []
            if parts:
                log.warning("node_info names node %s, which the optimize stage fused into node %s (%s) and which "
                            "writes no tensor of its own there; its InputType / OutputType is ignored: name %s "
                            "to type that node", name, into, part.unit_of_node[parts[0]].main.op_type, into)
            else:
                log.warning("node_info names node %s, which is not in the optimized model (removed or fused by "
                            "optimization?); its InputType / OutputType is ignored", name)
    return bits, pinned


@dataclass
class _NodeInfoTarget:
    """What node_info's InputType / OutputType of one named node apply to."""

    name: str
    info: NodeInfo
    op_type: str
    inputs: list[str]
    outputs: list[str]
    gives_indices: bool
    units: list[Unit] = field(default_factory=list)  # where the node runs: one, or the parts it was written as


def _on_cpu(target: _NodeInfoTarget) -> bool:
    return bool(target.units) and not any(u.on == "BPU" for u in target.units)


def _warn_types_on_cpu(part: Partition, targets: list[_NodeInfoTarget], profile: MarchProfile) -> None:
    """node_info InputType / OutputType of a node that runs on the CPU, one WARNING per node: the node computes
    in float whatever the type, which only reaches the tensors it exchanges with BPU nodes (their side of the
    crossing; int8 on a march without int16). Without a word the user believed the node computed in int8 or
    int16."""
    for target in targets:
        if not _on_cpu(target):
            continue
        info = target.info
        options = [f"InputType{'' if idx is None else idx} {dtype}" for idx, dtype in info.input_types.items()]
        tensors = [t for idx in info.input_types
                   for t in (target.inputs if idx is None else target.inputs[idx:idx + 1])]
        if info.output_type and not target.gives_indices:  # indices: said where the int16 request is refused
            options.append(f"OutputType {info.output_type}")
            tensors += target.outputs
        if not options:
            continue
        crossing = [t for t in dict.fromkeys(tensors)
                    if getattr(part.producer.get(t), "on", None) == "BPU" or part.bpu_consumers(t)]
        unit = target.units[0]
        if unit.kind == "cpu":  # no BPU form: no placement changes where it runs
            how = "it cannot run on the BPU, so no setting makes it compute in integers"
        elif unit.reason.startswith("placed on the CPU"):
            how = "take it out of run_on_cpu / node_info ON: CPU to have it computed in integers on the BPU"
        else:
            how = "node_info ON: BPU (or run_on_bpu) puts it on the BPU, where it computes in integers"
        types = {*info.input_types.values(), *([info.output_type] if info.output_type else [])}
        if crossing and (profile.int16 or "int8" in types):
            applies = f"the type reaches only the tensors it exchanges with BPU nodes ({first_of(crossing, 3)})"
        elif crossing:
            applies = (f"the tensors it exchanges with BPU nodes ({first_of(crossing, 3)}) stay int8: int16 is not "
                       f"available on {profile.label}")
        else:
            applies = "the type does not apply"
        log.warning("node_info %s of node %s: the node runs on the CPU (%s) and computes in float; %s; %s",
                    " / ".join(options), target.name, unit.reason or "not on the BPU", applies, how)


def _node_info_targets(part: Partition, node_info: dict[str, NodeInfo],
                       written: dict[str, list[str]]) -> list[_NodeInfoTarget]:
    """The nodes node_info gives a type, in graph order: a node of the optimized model by its unit's inputs and
    outputs; a user's node the optimize stage wrote as others (a HardSwish as HardSigmoid + Mul) by what those
    read from outside them and what they write for the rest of the graph, the user's node's own tensors."""
    typed = {name: info for name, info in node_info.items() if info.output_type or info.input_types}
    targets = [_NodeInfoTarget(node.name, typed[node.name], node.op_type, unit.inputs, unit.outputs,
                               unit.gives_indices, [unit])
               for unit in part.units for node in unit.nodes if node.name in typed]
    for name, info in typed.items():
        parts = [part.unit_of_node[n] for n in written.get(name, []) if n in part.unit_of_node]
        if name in part.unit_of_node or not parts:
            continue
        nodes = [n for unit in dict.fromkeys(parts) for n in unit.nodes if n.name in written[name]]
        inputs, outputs = _tensors_from_outside(nodes, part)
        if not outputs:  # inside a unit (a BatchNorm folded into a conv that runs with its Relu): what it writes
            outputs = list(dict.fromkeys(t for unit in dict.fromkeys(parts) for t in unit.outputs))
        targets.append(_NodeInfoTarget(name, info, nodes[-1].op_type, inputs, outputs,
                                       any(part.producer[t].gives_indices for t in outputs),
                                       list(dict.fromkeys(parts))))
    return targets


def _tensors_from_outside(nodes: list[NodeProto], part: Partition) -> tuple[list[str], list[str]]:
    """The activations ``nodes`` read from other nodes or the model's inputs, and those they write that none of
    them reads (the others' inputs, the model's outputs), each with a grid."""
    made = {t for n in nodes for t in n.output}
    read = {t for n in nodes for t in n.input}
    inputs = [t for n in nodes for t in n.input if t not in made and t in part.consumers]
    outputs = [t for n in nodes for t in n.output if t not in read and t in part.producer]
    return list(dict.fromkeys(inputs)), list(dict.fromkeys(outputs))


def _request_int16_input(part: Partition, unit: Unit, profile: MarchProfile,
                         request: Callable[..., None]) -> None:
    """An integer Softmax, LayerNorm or ArgMax reads int16 where it can (``HzOp.int16_input``): on an int8 grid
    close logits share a level, and the largest one (an argmax, a decoded character) is lost; a residual
    stream's outliers leave the other values few levels (set_Softmax_input_int8 keeps int8). Where a node by
    the input has no int16 form, one line says that it reads int8."""
    kernel = registry.op_for_unit_kind(unit.kind) if unit.on == "BPU" else None
    if kernel is None or not kernel.int16_input:
        return
    node = unit.main
    why = int8_logits(part, unit, profile)
    if why:  # placed on the BPU by the user: the CPU would read the float logits (units.int8_logits)
        log.info("node %s (%s) compares int8 logits on the BPU (%s), where close logits share a level: "
                 "run_on_cpu: ['%s'] keeps it on node %s's float output", node.name, node.op_type, why, node.name,
                 part.producer[unit.inputs[0]].main.name)
        return
    if not profile.int16:
        return
    # A Concat puts its inputs on its output's grid: int16 for it alone would cost int16's time for int8 levels.
    wanted = [grid for t in unit.inputs for grid in _through_concats(part, t)]
    blocker = next((b for grid in wanted if (b := part.int16_blocker(grid, profile)) is not None), None)
    if blocker is not None:
        log.info("node %s reads its input as int8, not int16: %s node %s, next to it, has no int16 form on %s",
                 node.name, blocker.main.op_type, blocker.main.name, profile.label)
        return
    for grid in wanted:
        request(grid, f"node {node.name} input", asked=False)


def _through_concats(part: Partition, tensor: str) -> list[str]:
    """``tensor``'s grid and, where a BPU Concat writes it, the grids of what the Concat joins (recursively)."""
    grid = part.grid_of(tensor)
    producer = part.producer.get(grid)
    if producer is None or producer.on != "BPU" or producer.kind != "concat":
        return [grid]
    return [grid, *(g for t in producer.inputs for g in _through_concats(part, t))]


def weight_thresholds(model: ModelProto, plan: CalibrationPlan) -> dict[str, np.ndarray]:
    """Per weight, the per-channel thresholds: the largest magnitude, widened where that puts every
    weight of the channel exactly on the grid (``exact_grid_thresholds``)."""
    view = GraphView(model)
    out = {}
    for p in plan.weights:
        out[p.tensor] = exact_grid_thresholds(output_channel_rows(view.const(p.tensor), p.axis, p.groups))
    return out


EXACT_TOLERANCE = 1e-4  # in grid steps: float32 weights written as small fractions land this close
SCREEN_ROWS = 1024  # rows screened at once (16 x 127 float64 candidates each)


def exact_grid_thresholds(rows: np.ndarray) -> np.ndarray:
    """Per row (a channel's weights), ``max |w|``, or where every weight is a whole multiple of
    ``max |w| / n`` for some n <= 127, the threshold whose int8 step is ``max |w| / n'`` (n' the largest
    multiple of n up to 127): the weights are then represented exactly.

    Weights that are fixed fractions (the bilinear kernels an upsampling becomes, averaging or
    difference filters, weights already quantized by training) would otherwise be rounded on a
    grid of step ``max / 127`` (1 : 3 : 9 became 14 : 42 : 127).
    """
    # In float64, a row or a few columns at a time: a VGG fully-connected weight is 400 MB in float32.
    # max |w| without a copy of |w| (abs again: a row of zeros may hold -0.0 at its max).
    peak = np.abs(np.maximum(rows.max(axis=1), -rows.min(axis=1))).astype(np.float64)
    out = peak.copy()
    steps = np.arange(1, 128, dtype=np.float64)
    safe = np.where(peak > 0, peak, 1.0)
    head = rows[:, :16].astype(np.float64) / safe[:, None]  # screen on a few weights, then check the whole row
    fits = np.zeros((len(rows), steps.size), dtype=bool)  # [rows, 127]
    for start in range(0, len(rows), SCREEN_ROWS):  # a vocabulary-sized head has ~20000 rows
        levels = head[start:start + SCREEN_ROWS, :, None] * steps[None, None, :]
        fits[start:start + SCREEN_ROWS] = np.all(np.abs(levels - np.round(levels)) <= EXACT_TOLERANCE, axis=1)
    for r in np.flatnonzero((peak > 0) & fits.any(axis=1)):
        for n in steps[fits[r]]:
            q = rows[r].astype(np.float64) / peak[r] * n
            if np.all(np.abs(q - np.round(q)) <= EXACT_TOLERANCE):
                out[r] = peak[r] * 127.0 / (n * (127 // int(n)))
                break
    return out


def build_calibrated_model(model: ModelProto, plan: CalibrationPlan, thresholds: dict[str, float | np.ndarray],
                           weight_th: dict[str, np.ndarray], methods: dict[str, str]) -> ModelProto:
    """The optimized model with HzCalibration nodes inserted per the plan.

    ``thresholds`` holds one value per tensor, or an array for per-channel points.
    """
    model = copy.deepcopy(model)
    nodes = {n.name: n for n in model.graph.node}
    grids = {p.tensor: p.grid(thresholds[p.tensor]) for p in plan.activations}
    per_channel = {p.tensor for p in plan.activations if p.axis is not None}
    view = GraphView(model) if per_channel else None
    new_nodes: list[NodeProto] = []
    opset = default_opset(model)
    for node in model.graph.node:
        if node.name in plan.emulated:
            _emulated(node, plan.emulated[node.name], opset)
        if node.op_type == HzPreprocess.op_type and node.output[0] in grids:
            # The BPU runs the preprocessing as an integer conv: emulate its coefficients.
            node.attribute.append(helper.make_attribute("integer", 1))
    for p in plan.weights:
        out = f"{p.tensor}{CALIBRATED_SUFFIX}"
        reader = nodes[p.rewire[0][0]]
        if reader.input[0] in per_channel:
            new_nodes.append(_folded_weight_node(p, reader, view, grids[reader.input[0]].scales))
        else:
            th, raised = _with_bias_room(weight_th[p.tensor], [nodes[name] for name, _ in p.rewire], model, plan,
                                         grids)
            rounding = None
            if p.tensor in plan.rounding:
                rounding = f"{p.tensor}_rounding"
                offsets = plan.rounding[p.tensor].astype(np.int8)
                if raised.any():  # chosen for the old grid: nearest rounding on the new one
                    raised_at = output_scale_array(offsets.shape, raised, p.axis, p.groups) > 0
                    offsets = np.where(raised_at, 0, offsets).astype(np.int8)
                model.graph.initializer.append(numpy_helper.from_array(offsets, rounding))
            new_nodes.append(HzCalibration.build(p.tensor, out, kind="weight", thresholds=th, bits=8, axis=p.axis,
                                                 method="max", rounding=rounding, groups=p.groups))
        weight_node = new_nodes[-1]  # each reader's bias goes after it: new_nodes[-1] moves on
        for name, k in p.rewire:
            new_nodes.extend(_bias_nodes(model, nodes[name], weight_node, plan, grids))
            nodes[name].input[k] = out
    for p in plan.activations:
        src, out = p.tensor, f"{p.tensor}{CALIBRATED_SUFFIX}"
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
        grid = grids[p.tensor]
        node = HzCalibration.build(src, out, kind="activation", thresholds=grid.thresholds, bits=p.bits,
                                   axis=-1 if p.axis is None else p.axis, method=methods.get(p.tensor, "max"),
                                   scales=grid.scales, zero_points=grid.zero_points)
        node.name = p.node_name
        new_nodes.append(node)
        for name, k in p.rewire:
            nodes[name].input[k] = out
    model.graph.node.extend(new_nodes)
    topological_sort(model)
    with_horizon_domain(model)
    record_cpu_nodes(model, plan.cpu_nodes)
    return model


def _emulated(node: NodeProto, op_type: str, opset: int) -> None:
    """Turn ``node`` into the Hz op whose lowering follows its integer kernel (``HzOp.calibrated_op``)."""
    axis = softmax_axis(node, opset) if node.op_type in ("Softmax", "LogSoftmax") else None
    node.op_type, node.domain = op_type, DOMAIN
    if axis is not None:  # explicit: the default depends on the opset
        del node.attribute[:]
        node.attribute.append(helper.make_attribute("axis", axis))


BIAS_ROOM = 2.0**30  # largest |bias level| a weight grid leaves on the int32 accumulator (half: room for rounding)


def _with_bias_room(thresholds: np.ndarray, readers: list[NodeProto], model: ModelProto, plan: CalibrationPlan,
                    grids: dict[str, Grid]) -> tuple[np.ndarray, np.ndarray]:
    """Weight thresholds raised where a reader's bias would not fit the int32 accumulator.

    A (nearly) dead output channel has a tiny weight step, so its accumulator step
    ``s_x * s_w`` is tiny and its bias, in that step, beyond int32. Its weights do not
    matter next to the bias: a coarser weight grid keeps the bias. Returns the thresholds
    and which channels were raised.
    """
    th = np.asarray(thresholds, dtype=np.float64).copy()
    inits = {t.name: t for t in model.graph.initializer}
    for reader in readers:
        if len(reader.input) < 3 or reader.input[2] not in inits:
            continue
        source = plan.grid_source.get(reader.input[0])
        if source is None or grids[source].scales.size != 1:
            continue
        a = {x.name: helper.get_attribute_value(x) for x in reader.attribute}
        bias = np.abs(numpy_helper.to_array(inits[reader.input[2]]).astype(np.float64)).reshape(-1)
        gain = 1.0
        if reader.op_type == "Gemm":
            bias, gain = bias * abs(float(a.get("beta", 1.0))), abs(float(a.get("alpha", 1.0))) or 1.0
        if bias.size not in (1, th.size):
            continue
        s_x = float(grids[source].scales[0])
        th = np.maximum(th, 127.0 * bias / (s_x * gain * BIAS_ROOM))
    return th, th > np.asarray(thresholds, dtype=np.float64)


def _bias_nodes(model: ModelProto, reader: NodeProto, weight_node: NodeProto, plan: CalibrationPlan,
                grids: dict[str, Grid]) -> list[NodeProto]:
    """The bias of ``reader`` moved onto its int32 accumulator grid (SPEC §7: the calibrated
    model follows the integer rounding). Nothing for a reader without a bias or a
    calibrated input."""
    if len(reader.input) < 3 or not reader.input[2]:
        return []
    weight = attrs_of(weight_node)
    if "input_scales" in weight:  # the input's per-channel steps are folded into the weight
        input_scale, input_node = 1.0, ""
    else:
        source = plan.grid_source.get(reader.input[0])
        if source is None or grids[source].scales.size != 1:
            return []
        input_scale, input_node = float(grids[source].scales[0]), calibration_node(source)
    gain = 1.0
    if reader.op_type == "Gemm":
        a = {x.name: helper.get_attribute_value(x) for x in reader.attribute}
        beta = float(a.get("beta", 1.0))
        if beta == 0.0:
            return []
        gain = abs(float(a.get("alpha", 1.0))) / beta
    bias = reader.input[2]
    out = f"{bias}_{reader.name}{CALIBRATED_SUFFIX}"
    node = HzBiasCalibration.build(bias, out, f"{reader.name}_bias_HzCalibration",
                                   weight_scales=np.asarray(weight["scales"], dtype=np.float32),
                                   input_scale=input_scale, input_calibration=input_node, gain=gain)
    reader.input[2] = out
    return [node]


def folded_weights(calibrated: ModelProto) -> dict[str, np.ndarray]:
    """Fake-quantized values of the weights not simply rounded to nearest on their grid.

    Those whose calibration folds a per-channel input's scales, and those with GPTQ rounding.
    """
    view = GraphView(calibrated)
    out = {}
    for node in calibrated.graph.node:
        if node.op_type == HzCalibration.op_type and ("input_scales" in attrs_of(node) or len(node.input) > 1):
            values = [view.const(i) for i in node.input if i]
            out[node.input[0]] = HzCalibration.reference(node, values)[0]
    return out


def _folded_weight_node(p: WeightPoint, reader: NodeProto, view: GraphView, input_scales: np.ndarray) -> NodeProto:
    """Weight calibration of a conv whose input is per channel: per output channel of ``w * u``."""
    w = view.const(p.tensor).astype(np.float32)
    input_axis = weight_input_axis(reader, view)
    group = int(view.attrs(reader).get("group", 1)) if reader.op_type == "Conv" else 1
    u = input_scale_array(w.shape, input_scales, input_axis, group)
    folded = np.abs(w * u).astype(np.float64)
    thresholds = output_channel_rows(folded, p.axis, p.groups).max(axis=1)
    return HzCalibration.build(p.tensor, f"{p.tensor}{CALIBRATED_SUFFIX}", kind="weight", thresholds=thresholds, bits=8,
                               axis=p.axis, method="max", scales=scales_for(thresholds, 8),
                               input_scales=input_scales, input_axis=input_axis, group=group, groups=p.groups)
