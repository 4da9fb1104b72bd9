"""Partition of an optimized float graph into quantization units.

A unit is the group of float nodes that becomes one Horizon op: a Conv with its
fused Relu/Clip, a run of element-wise functions of one tensor (one lookup
table), an element-wise Add/Mul of two tensors, a pool, a data-movement op, or
a CPU node. Calibration, quantization, the checker and the compile stage all
read the same partition, so they always agree on placement.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
from onnx import AttributeProto, ModelProto, NodeProto, TensorProto, helper

from hbtools.config.model import Config, NodeInfo
from hbtools.graph.constant_terms import MOVES
from hbtools.graph.contrib import why_kept
from hbtools.graph.graph import GraphView, axis_through_reshape, elements, is_static, outer_references
from hbtools.graph.origins import Fusion, recorded_fusions, recorded_origins, written_as
from hbtools.graph.recurrent import RECURRENT_OPS, gates_fit
from hbtools.log import first_of
from hbtools.march.constraints import constant_operand_shape, shape_text, violation
from hbtools.march.profiles import FORMS, MarchProfile, OpRule
from hbtools.ops import custom, registry
from hbtools.ops.base import CONTRIB_DOMAIN, DOMAIN
from hbtools.ops.quantized import CONV_TRANSPOSE_MAX_TERMS
from hbtools.runtime.structure import components

log = logging.getLogger("hbtools")

# A BPU call (moving the inputs across, queueing the task, waiting, moving the outputs back) costs a board's
# CPU about the time it needs for this many float multiply-accumulates (about 0.1 ms on an ARM Cortex-A core).
SMALL_SUBGRAPH_MACS = 1 << 18

# Unit kinds the partition forms itself; any other profile form is an op class's (HzOp.unit_kind).
BUILTIN_KINDS = (*FORMS, "cpu")
# Kinds whose integer result is an int32 accumulator (dequantized directly when no BPU op reads it).
ACCUMULATOR_KINDS = ("conv", "matmul")
# Element types the BPU does not quantize: lengths, indices, sizes and masks are exact values, not feature maps.
NON_FLOAT_TYPES = (TensorProto.INT8, TensorProto.UINT8, TensorProto.INT16, TensorProto.UINT16, TensorProto.INT32,
                   TensorProto.UINT32, TensorProto.INT64, TensorProto.UINT64, TensorProto.BOOL)


@dataclass(eq=False)
class Unit:
    kind: str  # preprocess | conv | matmul | lut | eltwise | pool | passive | concat | cpu, or an op class's
    nodes: list[NodeProto]
    inputs: list[str]  # activation (non-constant) inputs
    outputs: list[str]
    on: str = "BPU"
    table_type: str = ""  # the type the node tables and hb_perf show for it
    reason: str = ""
    subgraph: int | None = None
    activation: NodeProto | None = None  # fused Relu/Clip of a conv unit
    output_join: bool = False  # a join of results into a model output, kept in float (``_join_outputs_in_float``)

    def __post_init__(self) -> None:
        # An omitted optional output ('' : an RNN's Y, a LayerNormalization's Mean) is no tensor: the node
        # tables, the calibration plan and the similarity report must not ask for one by that name.
        self.outputs = [t for t in self.outputs if t]

    @property
    def name(self) -> str:
        return self.nodes[0].name

    @property
    def main(self) -> NodeProto:
        return self.nodes[0]

    @property
    def is_accumulator(self) -> bool:
        return self.kind in ACCUMULATOR_KINDS

    @property
    def gives_indices(self) -> bool:
        """Whether its result is int64 indices (an ArgMax on the BPU): no grid to calibrate, no Dequantize."""
        op = registry.op_for_unit_kind(self.kind) if self.on == "BPU" and self.kind not in BUILTIN_KINDS else None
        return op is not None and op.index_output


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

    def grid_of(self, tensor: str) -> str:
        """The tensor whose grid ``tensor`` has: through BPU data movement (Reshape, Transpose, Split, ...),
        whose outputs keep their input's grid and get no calibration of their own."""
        seen = set()
        producer = self.producer.get(tensor)
        while producer is not None and producer.on == "BPU" and producer.kind == "passive" and producer.inputs \
                and tensor not in seen:
            seen.add(tensor)
            tensor = producer.inputs[0]
            producer = self.producer.get(tensor)
        return tensor

    def int16_blocker(self, tensor: str, profile: MarchProfile) -> Unit | None:
        """The BPU unit writing or reading ``tensor``'s grid that has no int16 form on ``profile``'s march (a
        ConvTranspose), which keeps the grid int8; None where every one has."""
        grid = self.grid_of(tensor)
        sharing, touching = [grid], [self.producer.get(grid)]
        for t in sharing:  # the grid and what BPU data movement (a Pad before a ConvTranspose) makes of it
            for unit in self.bpu_consumers(t):
                touching.append(unit)
                if unit.kind == "passive":
                    sharing.extend(o for o in unit.outputs if o not in sharing)
        for unit in touching:
            if unit is not None and unit.on == "BPU":
                rule = profile.rule(unit.main.op_type)
                if rule is not None and not rule.int16:
                    return unit
        return None

    def rows(self) -> list[tuple[str, str, str, str]]:
        """(node, ON, subgraph, type) for every node, in graph order."""
        out = []
        for u in self.units:
            sub = f"id({u.subgraph})" if u.subgraph is not None else "--"
            for n in u.nodes:
                out.append((n.name, u.on, sub, u.table_type if u.on == "BPU" else n.op_type))
        return out

    def detach(self) -> None:
        """Hold copies of the units' nodes instead of the model's own.

        protobuf frees a message's parts only with the whole: one node of a model kept alive keeps every
        weight of it. A partition that outlives its model (the quantize stage's, to the .bin) lets it go."""
        for u in self.units:
            copies = {id(n): copy.deepcopy(n) for n in [*u.nodes, u.activation] if n is not None}
            u.nodes = [copies[id(n)] for n in u.nodes]
            u.activation = copies[id(u.activation)] if u.activation is not None else None


def model_partition(model: ModelProto, profile: MarchProfile, config: Config, *, warn: bool = True) -> Partition:
    """``build_partition`` with the options of ``config`` that bear on placement."""
    return build_partition(model, profile, config.model.node_info, all_bpu=config.model.fast_perf,
                           integer_outputs=config.calibration.options.int_outputs, warn=warn)


def build_partition(model: ModelProto, profile: MarchProfile, node_info: dict[str, NodeInfo], *,
                    all_bpu: bool = False, integer_outputs: bool = False, warn: bool = True) -> Partition:
    """Group ``model``'s nodes into units and place each on the BPU or the CPU.

    ``all_bpu`` (fast-perf) keeps every BPU-able unit on the BPU, even where
    keeping it in float would cost nothing. ``integer_outputs`` (set_model_output_int8/16):
    the model's outputs leave the BPU as integers, so no join of them moves to the CPU.
    ``warn`` logs override problems; the quantize stage re-derives the partition silently
    so they are logged once.
    """
    view = GraphView(model)
    taken: set[str] = set()
    units: list[Unit] = []
    origins = recorded_origins(model)
    for node in model.graph.node:
        if node.name in taken:
            continue
        unit = _make_unit(node, view, profile, taken, origins.get(node.name))
        taken.update(n.name for n in unit.nodes)
        units.append(unit)
    part = Partition(units)
    part.index()
    forced = _apply_overrides(part, node_info, warn, written_as(model), recorded_fusions(model))
    if not all_bpu:
        _keep_index_ops_on_float_logits(part, profile, forced)
        if not integer_outputs:
            _join_outputs_in_float(part, view, forced)
        _keep_isolated_ops_in_float(part, view, forced)
        # Each may leave the other more to do (a bias Add whose SiLU went to float is then a subgraph alone);
        # both only ever move units to the CPU.
        while _keep_small_subgraphs_in_float(part, view, forced):
            _keep_isolated_ops_in_float(part, view, forced)
    _number_subgraphs(part)
    return part


def _activation_inputs(node: NodeProto, view: GraphView) -> list[str]:
    """What ``node`` reads at run time: its non-constant inputs, then what its sub-graphs read from this graph."""
    return [i for i in [*node.input, *outer_references(node)] if i and not view.is_const(i)]


def _scalar_consts(node: NodeProto, view: GraphView) -> bool:
    consts = [view.const(i) for i in node.input if i and view.is_const(i)]
    return all(c.size == 1 for c in consts)


def _const_shapes(node: NodeProto, view: GraphView) -> str:
    return ", ".join(str(list(view.const(i).shape)) for i in node.input if i and view.is_const(i))


def _body_note(node: NodeProto) -> str:
    """For an If, Loop or Scan: what its graphs hold, which runs in float on the CPU with it (hunt 48 D9)."""
    graphs = [a.g for a in node.attribute if a.type == AttributeProto.GRAPH] + \
        [g for a in node.attribute if a.type == AttributeProto.GRAPHS for g in a.graphs]
    inner = [n.op_type for g in graphs for n in g.node]
    if not inner:
        return ""
    convs = sum(op in ("Conv", "ConvTranspose", "Gemm", "MatMul") for op in inner)
    loop = "; a Loop of a constant trip count (at most 16 steps, condition true throughout, no scan outputs) is " \
        "written out step by step" if node.op_type == "Loop" else ""
    return f": its {len(inner)} inner nodes ({convs} Conv / Gemm / MatMul) run in float on the CPU with it{loop}"


# Reductions the optimize stage writes as pools or convs over 4-D maps where the BPU has no reduction (RDK X3): for
# the others (ReduceL2, ReduceProd, ...) the rank is not what keeps them off it (hunt 49 D4).
_REDUCTIONS_WITH_4D_FORMS = ("ReduceMean", "ReduceMax", "ReduceSum")


def _untaken_rank(node: NodeProto, acts: list[str], view: GraphView, profile: MarchProfile) -> str | None:
    """Where ``node`` reads a tensor of a rank the march's BPU takes for no op (a 5-D one on RDK X3), that as a
    reason."""
    for t in acts:
        shape = view.shapes.get(t)
        if shape is not None and not profile.takes_rank(len(shape)):
            lo, hi = profile.tensor_ranks
            allowed = f"{lo}-D" if lo == hi else f"{lo}-D to {hi}-D"
            return f"{node.op_type} on a {len(shape)}-D tensor {shape_text(shape)}: the BPU of {profile.label} " \
                   f"takes {allowed} tensors only"
    return None


def _make_unit(node: NodeProto, view: GraphView, profile: MarchProfile, taken: set[str], user: str | None) -> Unit:
    """``node``'s unit; ``user``: the user's node the optimize stage wrote it for, where it is another."""
    op = node.op_type
    acts = _activation_inputs(node, view)
    if node.domain == DOMAIN:
        if op == "HzPreprocess":
            return Unit("preprocess", [node], acts, list(node.output), table_type="HzPreprocess")
        float_op = registry.op_class(op)
        if float_op is None or not float_op.device_op:
            return _cpu(node, acts, f"custom op {op} is not a BPU op")
        op = float_op.device_op  # an op the optimize stage wrote (HzLayerNorm): placed as the ONNX op
    elif custom.custom_op_of(node) is not None:
        return _cpu(node, acts, f"custom op {custom.op_name(node)} (domain '{node.domain}') runs on the CPU")
    if node.domain == CONTRIB_DOMAIN:
        return _cpu(node, acts, why_kept(node, view.model))
    rule = profile.rule(op) if node.domain in ("", "ai.onnx", DOMAIN) else None
    if rule is None and op in RECURRENT_OPS and node.domain in ("", "ai.onnx"):
        if not gates_fit(profile):  # unrolling would not help: node_info ON: BPU is no advice here
            return _cpu(node, acts, f"{op} stays one node: unrolled over its time steps, the gates of each step "
                                    f"would be 2-D tensors, which the BPU of {profile.label} does not take")
        return _cpu(node, acts, f"{op} stays one node unless unrolled over its time steps (the log of the optimize "
                                "stage says why it was not; node_info ON: BPU unrolls a long one)")
    if rule is None:
        # an op the optimize stage wrote (a layer norm for an InstanceNormalization or a spelled-out pattern;
        # a Flatten after the pool it wrote for a ReduceMean): the user's model may have no such op
        written = f" (the optimize stage wrote {user or node.name} as one)" if node.domain == DOMAIN else \
            f" (the optimize stage wrote this {op} for {user})" if user else ""
        rank = _untaken_rank(node, acts, view, profile) if op in _REDUCTIONS_WITH_4D_FORMS else None
        if rank is not None:  # the optimize stage gives these reductions of 4-D maps BPU forms (pools, convs)
            return _cpu(node, acts, rank)
        if op == "Einsum" and node.domain in ("", "ai.onnx"):
            equation = view.attrs(node).get("equation", b"")
            equation = equation.decode() if isinstance(equation, bytes) else equation
            return _cpu(node, acts, f"Einsum '{equation}' has no BPU form: the optimize stage writes an Einsum of two "
                                    "tensors of static shapes as a MatMul where each letter is an axis of both and of "
                                    "the output, summed over in both, or of one and the output")
        return _cpu(node, acts, f"{op} is not supported on the BPU of {profile.label}{written}{_body_note(node)}")
    exact = next((t for t in acts if view.elem_types.get(t) in NON_FLOAT_TYPES), None)
    if exact is not None:
        kind = helper.tensor_dtype_to_np_dtype(view.elem_types[exact]).name
        if exact != node.input[0] and view.elem_types.get(node.input[0]) not in NON_FLOAT_TYPES:
            # a shape, size or index computed at run time, beside float data (a Resize's sizes from an input)
            return _cpu(node, acts, f"{op} takes its {kind} input '{exact}' at run time; the BPU needs it constant")
        return _cpu(node, acts, f"{op} computes on {kind} values ('{exact}'); the BPU takes float feature maps")
    if not rule.forms:
        return _cpu(node, acts, f"{op} runs on the BPU of {profile.label}, but hbtools has no integer kernel "
                                f"for it yet")
    forms = rule.forms
    constant_weight = len(node.input) > 1 and view.is_const(node.input[1])
    if "conv" in forms and not constant_weight and not ("matmul" in forms and len(acts) == 2):
        # Decided before the attribute limits: a kernel, stride or rank within them would not give it a BPU form,
        # so naming one of them (a tracker's 8x8 template kernel "exceeds 7") would send the user the wrong way.
        return _cpu(node, acts, f"{op} without a constant weight has no BPU form on {profile.label}")
    reason = violation(node, rule, view, profile)
    if reason:
        return _cpu(node, acts, reason)
    if "conv" in forms and constant_weight:
        return _conv_unit(node, acts, view, rule, taken)
    if "matmul" in forms and len(acts) == 2:
        return Unit("matmul", [node], acts, list(node.output), table_type=rule.table_type)
    if "eltwise" in forms and len(acts) == 2 and acts[0] != acts[1]:
        return Unit("eltwise", [node], acts, list(node.output), table_type=rule.table_type)
    for form in forms:  # a kind an op class quantizes by itself
        op_class = registry.op_for_unit_kind(form) if form not in BUILTIN_KINDS else None
        if op_class is None:
            continue
        refusal = op_class.refusal(node, view)
        if refusal:
            return _cpu(node, acts, refusal)
        if op_class.constant_operands:  # one activation and tensor constants
            # Scalar constants make an element-wise op a lookup table, where the op has one (a LayerNorm's
            # scale and bias of one element, GroupNorm(1, C)'s, have none).
            if len(acts) == 1 and (not _scalar_consts(node, view) or "lut" not in forms):
                reason = _constant_broadcast_violation(node, acts[0], view, rule, profile)
                if reason:
                    return _cpu(node, acts, reason)
                return Unit(form, [node], acts, list(node.output), table_type=rule.table_type)
        elif len(acts) == len([i for i in node.input if i]) and len(set(acts)) == len(acts):
            return Unit(form, [node], acts, list(node.output), table_type=rule.table_type)
    if "lut" in forms and len(set(acts)) == 1:
        if _scalar_consts(node, view):
            unit = _lut_unit(node, acts[0], view, profile, taken)
            if view.elem_types.get(unit.outputs[0], TensorProto.FLOAT) == TensorProto.FLOAT and \
                    view.elem_types.get(acts[0], TensorProto.FLOAT) == TensorProto.FLOAT:
                return unit
            return _cpu(node, acts, f"{op} gives no float values of its input here (a bool mask, or a cast): "
                                    "the BPU computes a comparison or cast only inside a function of one tensor "
                                    "that ends in a float value (a Where or Cast of the mask)")
        return _cpu(node, acts, f"{op} with a constant of shape {_const_shapes(node, view)}: only scalar "
                                f"constants fold into a BPU lookup table")
    if "lut" in forms and len(acts) > 1:
        # the optimize stage writes a Div of two tensors as a product with a reciprocal table, in int16
        why = f"it becomes a product with an int16 reciprocal table only where the march has int16, which " \
              f"{profile.label} does not" if op == "Div" and not profile.int16 else \
              "only functions of one tensor become lookup tables"
        return _cpu(node, acts, f"{op} of {len(set(acts))} tensors has no BPU form ({why})")
    if "pool" in forms and op in ("ReduceMean", "ReduceSum"):
        axes = view.reduced_axes(node)
        if axes is None:
            return _cpu(node, acts, f"{op} over axes computed at run time (or an unknown rank) has no BPU form")
        if not axes:  # noop_with_empty_axes: no reduction at all
            return _cpu(node, acts, f"{op} over no axis (noop_with_empty_axes) has no BPU form")
        if 0 in axes:
            # without axes (and noop_with_empty_axes=0) a reduction is over all axes; the optimize stage leaves
            # out a batch axis of one where the output shape allows
            what = "all axes, the batch axis among them," if len(axes) == len(view.shapes.get(node.input[0]) or []) \
                else "the batch axis"
            return _cpu(node, acts, f"{op} over {what} has no BPU form (the BPU's reductions keep the batch axis)")
        return Unit("pool", [node], acts, list(node.output), table_type=rule.table_type)
    if "pool" in forms:
        a = view.attrs(node)
        excluded_padding = any(a.get("pads", [])) and not a.get("count_include_pad", 0)
        if op == "AveragePool" and (a.get("ceil_mode", 0) or excluded_padding):
            return _cpu(node, acts, "AveragePool with ceil_mode or excluded padding has no BPU form in hbtools")
        if op == "AveragePool" and a.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET", b"VALID", "VALID"):
            # the optimize stage writes auto_pad as pads where onnxruntime's padding is such pads
            return _cpu(node, acts, "AveragePool with auto_pad SAME on a map of unknown size, dilated, or with a "
                                    "kernel smaller than the stride has no BPU form in hbtools (onnxruntime pads "
                                    "these unlike the ONNX spec); export it with explicit pads")
        return Unit("pool", [node], acts, list(node.output), table_type=rule.table_type)
    if "passive" in forms and op == "Pad" and view.attrs(node).get("mode", b"constant") in (b"constant", "constant"):
        return _cpu(node, acts, "Pad with a constant value has no BPU form here (edge and reflect Pads do; a zero "
                                "Pad that only Convs read becomes their padding)")
    if "passive" in forms and op == "MaxPool" and _indices_read(node, view):
        # The BPU pools the integer feature map as it is and gives no int64 indices (a SegNet-style
        # MaxUnpool reads them); the float pool on the CPU gives both outputs.
        return _cpu(node, acts, f"MaxPool whose Indices output ('{node.output[1]}') is read has no BPU form: "
                                "the BPU pools integers and gives no indices; kept in float")
    if "passive" in forms:
        if len(acts) == 1 and acts[0] == node.input[0]:
            return Unit("passive", [node], acts, list(node.output), table_type=rule.table_type or op)
        return _cpu(node, acts, f"{op} with parameters computed at run time has no BPU form")
    if "concat" in forms:
        consts = [view.const(i) for i in node.input if i and view.is_const(i)]
        if acts and all(c.dtype == np.float32 for c in consts):  # constants go onto the output grid (ViT's class token)
            return Unit("concat", [node], acts, list(node.output), table_type=rule.table_type)
        return _cpu(node, acts, f"{op} of constants only, or with a non-float constant, has no BPU form")
    return _cpu(node, acts, f"{op} with these inputs has no BPU form on {profile.label}")


def _indices_read(node: NodeProto, view: GraphView) -> bool:
    """Whether a MaxPool's second output (Indices) is read by a node or is a graph output."""
    return len(node.output) > 1 and view.is_read(node.output[1])


def _constant_broadcast_violation(node: NodeProto, act: str, view: GraphView, rule: OpRule,
                                  profile: MarchProfile) -> str:
    """Why a constant operand's shape has no BPU form against activation ``act`` ("" when it has one)."""
    shape = view.shapes.get(act)
    for i in node.input:
        if i and view.is_const(i):
            if view.const(i).dtype != np.float32:
                return f"{node.op_type} with a {view.const(i).dtype} constant has no BPU form"
            if constant_operand_shape(shape, list(view.const(i).shape), rule) is None:
                against = list(shape) if shape is not None else "an unknown shape"
                return (f"{node.op_type} with a constant of shape {list(view.const(i).shape)} against {against} "
                        f"has no BPU form on {profile.label}")
    return ""


def _per_column(bias: np.ndarray, weight: np.ndarray, attrs: dict) -> bool:
    """Whether Gemm bias C is one value per output column (shape [N], [1, N] or a scalar), as a conv's bias is."""
    columns = weight.shape[0] if attrs.get("transB", 0) else weight.shape[1]
    return bias.size in (1, columns) and (bias.ndim < 2 or bias.shape[0] == 1)


def _cpu(node: NodeProto, acts: list[str], reason: str) -> Unit:
    return Unit("cpu", [node], acts, list(node.output), on="CPU", table_type=node.op_type, reason=reason)


def _conv_unit(node: NodeProto, acts: list[str], view: GraphView, rule: OpRule, taken: set[str]) -> Unit:
    op = node.op_type
    weight = view.const(node.input[1])
    if len(acts) != 1 or acts[0] != node.input[0]:
        return _cpu(node, acts, f"{op} whose data input is a constant has no BPU form")
    if len(node.input) > 2 and node.input[2] and not view.is_const(node.input[2]):
        return _cpu(node, acts, f"{op} with a bias computed at run time has no BPU form")
    a = view.attrs(node)
    if op == "Gemm" and (a.get("transA", 0) or weight.ndim != 2):
        return _cpu(node, acts, "Gemm with transA has no BPU form")
    if op == "Gemm" and len(node.input) > 2 and node.input[2] and not _per_column(view.const(node.input[2]), weight, a):
        return _cpu(node, acts, f"Gemm with a bias C of shape {list(view.const(node.input[2]).shape)} that differs "
                                f"from row to row has no BPU form (the BPU adds one bias per output column)")
    if op == "MatMul" and weight.ndim != 2:
        return _cpu(node, acts, f"MatMul with a batched constant weight {list(weight.shape)} has no BPU form")
    # The optimize stage writes output_shape as pads where onnxruntime confirms them; the integer op reads
    # only pads, so one left over would give the natural output shape instead.
    if op == "ConvTranspose" and "output_shape" in a:
        return _cpu(node, acts, f"ConvTranspose with output_shape {list(a['output_shape'])} that no pads and "
                                f"output_padding express has no BPU form; kept in float")
    terms = weight.shape[0] // max(int(a.get("group", 1)), 1) * int(np.prod(weight.shape[2:]))  # per group
    # The lowering splits an ungrouped ConvTranspose along its input channels to stay exact; a grouped
    # one would need that within every group.
    if op == "ConvTranspose" and int(a.get("group", 1)) > 1 and terms > CONV_TRANSPOSE_MAX_TERMS:
        return _cpu(node, acts, f"grouped ConvTranspose summing {terms} terms per output is too large for exact "
                                f"integer accumulation in hbtools; kept in float")
    nodes = [node]
    activation = None
    consumers = view.consumers.get(node.output[0], [])
    if len(consumers) == 1 and node.output[0] not in view.graph_outputs:
        nxt = consumers[0]
        if nxt.op_type == "Relu" or (nxt.op_type == "Clip" and _scalar_consts(nxt, view)):
            if nxt.name not in taken:
                nodes.append(nxt)
                activation = nxt
    return Unit("conv", nodes, acts, list(nodes[-1].output), table_type=rule.table_type, activation=activation)


def _lut_unit(start: NodeProto, root: str, view: GraphView, profile: MarchProfile, taken: set[str]) -> Unit:
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
                if cand in cluster or cand.name in taken or not _lut_capable(cand, view, profile):
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
    cluster.sort(key=lambda n: view.position[id(n)])  # built once per view: per unit it was quadratic
    return Unit("lut", cluster, [root], outputs, table_type="HzLut")


def _lut_capable(node: NodeProto, view: GraphView, profile: MarchProfile) -> bool:
    rule = profile.rule(node.op_type) if node.domain in ("", "ai.onnx") else None
    return rule is not None and "lut" in rule.forms and violation(node, rule, view, profile) is None


def _external_outputs(nodes: list[NodeProto], view: GraphView) -> list[str]:
    names = {id(n) for n in nodes}
    out = []
    for n in nodes:
        for t in n.output:
            users = view.consumers.get(t, [])
            if t in view.graph_outputs or any(id(u) not in names for u in users):
                out.append(t)
    return out


def _placed(unit: Unit, name: str) -> str:
    """The reason of a unit the config put on the CPU by naming its node ``name``: the nodes fused with that one
    (a convolution and its activation run as one BPU op) go with it, and say whose placement moved them."""
    if len(unit.nodes) == 1:
        return "placed on the CPU by run_on_cpu / node_info"
    return f"placed on the CPU by run_on_cpu / node_info: {name}, and the nodes fused with it into one BPU op"


def _apply_overrides(part: Partition, node_info: dict[str, NodeInfo], warn: bool,
                     written_as: dict[str, list[str]], fusions: dict[str, Fusion]) -> set[int]:
    """run_on_cpu / run_on_bpu / node_info ON; returns the ids of units the user put on the BPU.

    A user's node the optimize stage wrote as other nodes (a HardSwish as a HardSigmoid and a Mul) is placed
    through them; one it fused into another (a LayerNorm pattern's Div into the one node computing it), through
    that node."""
    forced: set[int] = set()
    for given, info in node_info.items():
        if info.on is None:
            continue
        names = [n for n in [given, *written_as.get(given, [])] if n in part.unit_of_node]
        if not names and given in fusions:
            into = fusions[given].node
            names = [n for n in [into, *written_as.get(into, [])] if n in part.unit_of_node]
        if not names and warn:
            log.warning("node_info / run_on_%s names node %s, which is not in the optimized model (removed or "
                        "fused by optimization?); ignored", info.on.lower(), given)
        units = list({id(u): u for u in (part.unit_of_node[name] for name in names)}.values())
        for unit in units:  # reasons name the node as the user gave it
            _place(unit, given, info, warn, forced)
        staying = [u for u in units if info.on == "BPU" and u.on == "CPU"]
        if staying and warn:  # one line per name: an unrolled LSTM put on X3's BPU has hundreds of parts
            reasons = first_of(list(dict.fromkeys(u.reason for u in staying)), 2)
            if len(units) == 1:
                log.warning("node %s cannot run on the BPU (%s); it stays on the CPU", given, reasons)
            else:
                log.warning("node %s cannot run on the BPU in %d of the %d parts the optimize stage wrote for it "
                            "(%s); they stay on the CPU", given, len(staying), len(units), reasons)
    return forced


def _place(unit: Unit, name: str, info: NodeInfo, warn: bool, forced: set[int]) -> None:
    if info.on == "CPU" and unit.on == "BPU":
        if unit.kind == "preprocess":
            if warn:
                log.warning("node %s is the input preprocessing; it stays on the BPU", name)
            return
        unit.on, unit.reason = "CPU", _placed(unit, name)
    elif info.on == "CPU":
        # The placement is the reason given: a reason found without it can be wrong (a Div of two tensors the
        # optimize stage would have written in a BPU form, which it leaves alone where the user placed it).
        unit.reason = _placed(unit, name)
    elif info.on == "BPU" and unit.on == "BPU":  # one that cannot is said once per name (_apply_overrides)
        forced.add(id(unit))


def _join_outputs_in_float(part: Partition, view: GraphView, forced: set[int]) -> None:
    """A Concat that joins several results into a model output (directly or through layout moves) runs in
    float on the CPU, where each piece is dequantized on its own grid. On the BPU the pieces share the
    output's grid: a detector head joining box coordinates in pixels with class scores in 0..1 would
    give the scores the coordinates' step (0.01 on int16 at 320x320), and every score below half of it
    would read 0. The float join costs a copy of the output. What feeds it stays on the BPU (a decode's
    Sigmoid, Exp, grid Add and stride Mul), and its results leave the BPU as the outputs would
    (``plan``: at the output bit width)."""
    tail: set[int] = set()  # units whose results reach only model outputs, through layout moves and joins
    for u in reversed(part.units):
        if u.on != "BPU" or u.kind not in ("passive", "concat") or u.main.op_type not in MOVES:
            continue
        users = [c for t in u.outputs for c in part.consumers.get(t, [])]
        if all(id(c) in tail for c in users) and (users or any(t in view.graph_outputs for t in u.outputs)):
            tail.add(id(u))
    for u in part.units:
        if id(u) in tail and u.kind == "concat" and len(set(u.inputs)) > 1 and id(u) not in forced:
            u.on, u.output_join = "CPU", True
            u.reason = ("joins several results into a model output: in float each keeps its own scale, where on "
                        "the BPU all would share the output's (run_on_bpu moves it)")


def int8_logits(part: Partition, unit: Unit, profile: MarchProfile) -> str | None:
    """Why the BPU index op ``unit`` (an ArgMax) would compare int8 levels of logits that on the CPU it reads as
    a convolution's float output: the march has no int16, or a BPU node writing or reading them has no int16
    form. None where the logits can be int16 or reach the CPU as int8 anyway."""
    if unit.on != "BPU" or not unit.gives_indices or not unit.inputs:
        return None
    producer = part.producer.get(unit.inputs[0])
    if producer is None or producer.on != "BPU" or not producer.is_accumulator:
        return None
    if not profile.int16:
        return f"int16 is not available on {profile.label}"
    blocker = part.int16_blocker(unit.inputs[0], profile)
    if blocker is None:
        return None
    return f"{blocker.main.op_type} node {blocker.main.name} has no int16 form on {profile.label}"


def _keep_index_ops_on_float_logits(part: Partition, profile: MarchProfile, forced: set[int]) -> None:
    """An ArgMax whose logits would be int8 on the BPU (``int8_logits``) runs in float on the CPU, reading the
    convolution's float output: on int8 levels close logits tie and the first wins. Label pixels differing from
    the float model's over 64 pictures: RDK X3 segmenter head 153 of 4096 on the BPU, 46 on the CPU (kl: 146, 79);
    RDK X5 after a bilinear Resize (a ConvTranspose) 2040 and 1201 of 65536. run_on_bpu takes the speed instead."""
    for unit in part.units:
        why = None if id(unit) in forced else int8_logits(part, unit, profile)
        if why:
            logits = unit.inputs[0]
            unit.on, unit.reason = "CPU", (
                f"its logits {logits} would be int8 on the BPU ({why}), where close logits share a level; in float "
                f"it reads node {part.producer[logits].main.name}'s float output (run_on_bpu moves it, faster)")


def _keep_isolated_ops_in_float(part: Partition, view: GraphView, forced: set[int]) -> None:
    """Cheap ops wedged between CPU ops gain nothing from int8: keep them in float too (not one that
    reads several BPU results and feeds the CPU: that one saves the crossings of all but one)."""
    movable = ("lut", "eltwise", "constant_eltwise", "passive", "concat", "pool", "argmax")
    changed = True
    while changed:
        changed = False
        for u in part.units:
            if u.on != "BPU" or u.kind not in movable or id(u) in forced:
                continue
            producers = [part.producer.get(t) for t in u.inputs]
            inputs_cpu = bool(producers) and all(p is not None and p.on == "CPU" for p in producers)
            # Reading a CPU result that other BPU nodes read too (the Slices of one input fanned out to the pieces
            # of a long Conv), it shares that tensor's one crossing into the BPU: in float each would cross alone.
            inputs_cpu = inputs_cpu and not any(c is not u and c.on == "BPU"
                                                for t in u.inputs for c in part.consumers.get(t, []))
            users = [c for t in u.outputs for c in part.consumers.get(t, [])]
            is_output = any(t in view.graph_outputs for t in u.outputs)
            # A join of outputs in float is no reason to leave the BPU: what it joins is the model's result.
            outputs_cpu = bool(users) and not is_output and all(c.on == "CPU" and not c.output_join for c in users)
            # Reading two BPU results (a sum of Conv pieces, a concat of BPU maps), it crosses to the CPU as one
            # tensor on the BPU but as each of them in float: keeping it in float saves no round trip then.
            from_bpu = {t for t, p in zip(u.inputs, producers, strict=True) if p is not None and p.on == "BPU"}
            outputs_cpu = outputs_cpu and len(from_bpu) < 2
            # A max pool (or slice) of a BPU result hands the CPU fewer values, computed exactly on the integers:
            # it stays the BPU part's last node (a MaxPool before a CPU LRN crossed over at 4x the size; an
            # ArgMax hands over one index where the logits were C values).
            outputs_cpu = outputs_cpu and not (u.kind in ("passive", "argmax") and from_bpu and _shrinks(u, view))
            if inputs_cpu or outputs_cpu:
                side = "reads only CPU results" if inputs_cpu else "feeds only CPU nodes"
                u.on, u.reason = "CPU", f"{side}; kept in float next to them (run_on_bpu moves it)"
                changed = True


def _shrinks(unit: Unit, view: GraphView) -> bool:
    """Whether ``unit``'s first output has fewer values than its first input (static shapes)."""
    x, y = view.shapes.get(unit.inputs[0]), view.shapes.get(unit.outputs[0])
    return is_static(x) and is_static(y) and elements(y) < elements(x)


def _keep_small_subgraphs_in_float(part: Partition, view: GraphView, forced: set[int]) -> bool:
    """A BPU subgraph between CPU nodes, or one without a product after them at the model's output, with less
    work than a BPU call costs to set up runs in float (an unrolled recurrence's per-step products, where the
    state stays on the CPU, become one call each otherwise). The subgraph with the most work stays, so a model
    keeps its BPU part. Returns whether any unit moved."""
    # Judged on units linked by data: joined with another reader of the CPU result it reads, a small product
    # between CPU nodes would stay a BPU call of its own after all (its partner's stage differs further on).
    groups = _subgraph_units(part, join_readers=False)
    if len(groups) < 2:
        return False
    work = [sum(_unit_macs(u, view) for u in group) for group in groups]
    # Ties go to the group with the first node name: the quantize stage rebuilds the partition from a graph
    # whose nodes may come in another order, and it must keep the same group on the BPU.
    first_names = [min(n.name for u in group for n in u.nodes) for group in groups]
    largest = min(range(len(groups)), key=lambda k: (-work[k], first_names[k]))
    moved = False
    graph_outputs = set(view.graph_outputs)
    for k, group in enumerate(groups):
        if k == largest or any(id(u) in forced for u in group):
            continue
        members = {id(u) for u in group}
        inputs = [t for u in group for t in u.inputs if id(part.producer.get(t)) not in members]
        outputs = [t for u in group for t in u.outputs]
        # Its inputs are quantized and its outputs dequantized on the CPU: where that is as many values as
        # it has multiply-accumulates (a per-channel scale and shift between CPU nodes, one per value), the
        # float op costs the CPU no more than the crossing does (rapid-table's quantize_dynamic detector: each
        # bias Add between two CPU ConvIntegers was a BPU subgraph of its own, 127 of them).
        leaving = [t for t in outputs if t in graph_outputs or any(
            id(c) not in members for c in part.consumers.get(t, []))]
        crossing = _elements_of(dict.fromkeys(inputs + leaving), view)
        if work[k] > max(SMALL_SUBGRAPH_MACS, crossing):
            continue
        users = [c for t in outputs for c in part.consumers.get(t, []) if id(c) not in members]
        # A BPU result the CPU reads too is there in float already (CenterNet's heatmap, read by the CPU MaxPool of its
        # peak test and by the Mul keeping the peaks).
        from_cpu = all(t in part.producer and (part.producer[t].on == "CPU" or any(
            c.on == "CPU" for c in part.consumers.get(t, []))) for t in inputs)
        # A trailing one without a product (PESTO's final Softmax after its CPU Conv) is a BPU call for as little
        # work; a small trailing conv head stays where the user expects it.
        reaches_output = bool(graph_outputs.intersection(outputs))
        at_output = reaches_output and work[k] == 0
        to_cpu = all(c.on == "CPU" for c in users) and (at_output or (bool(users) and not reaches_output))
        if inputs and from_cpu and to_cpu:
            where = "after CPU nodes at the model's output" if at_output else "between CPU nodes"
            per_value = f" (no more than the {crossing:.0f} values the CPU would quantize and dequantize for it)" \
                if work[k] > SMALL_SUBGRAPH_MACS else ""
            for u in group:
                u.on, u.reason = "CPU", (f"a BPU subgraph of {work[k]:.0f} MACs {where}{per_value} costs more as "
                                         "a BPU call than in float; kept in float (run_on_bpu moves it)")
            moved = True
    return moved


def _elements_of(tensors: Iterable[str], view: GraphView) -> float:
    """The number of values of ``tensors`` together (0 where a shape is unknown: no saving is claimed for them)."""
    shapes = [view.shapes.get(t) for t in tensors]
    return float(sum(elements(s) for s in shapes if is_static(s)))


def _subgraph_units(part: Partition, join_readers: bool = True) -> list[list[Unit]]:
    """BPU units in subgraphs (``structure.components``). A model input no unit makes stands as a CPU node of its
    own, as its quantization is in the quantized model: the BPU units reading it start together (not with
    ``join_readers`` False: units linked by data alone)."""
    index = {id(u): k for k, u in enumerate(part.units)}
    inputs: dict[str, int] = {}
    preds = []
    for u in part.units:
        preds.append([index[id(part.producer[t])] if t in part.producer else
                      inputs.setdefault(t, len(part.units) + len(inputs))
                      for t in u.inputs if part.producer.get(t) is not u])
    on = [u.on for u in part.units] + ["CPU"] * len(inputs)
    groups = components(preds + [[] for _ in inputs], on, join_readers)
    return [[part.units[i] for i in members] for members in groups]


def _unit_macs(unit: Unit, view: GraphView) -> float:
    """Multiply-accumulates of a conv / matmul unit (infinite where a shape is unknown); 0 for other kinds."""
    if not unit.is_accumulator:
        return 0.0
    node = unit.main
    out = view.shapes.get(node.output[0])
    if out is None or any(d is None for d in out):
        return float("inf")
    if unit.kind == "matmul":  # two activations: each output sums over A's last axis
        a = view.shapes.get(node.input[0])
        return float("inf") if not a or a[-1] is None else float(elements(out)) * a[-1]
    weight = view.const(node.input[1])
    if node.op_type == "ConvTranspose":  # each input element spreads over weight.size / C_in outputs
        x = view.shapes.get(node.input[0])
        return float("inf") if x is None or None in x else float(elements(x)) * weight.size / weight.shape[0]
    columns = weight.shape[0] if node.op_type == "Conv" or view.attrs(node).get("transB", 0) else weight.shape[-1]
    return float(elements(out)) * weight.size / columns


def _number_subgraphs(part: Partition) -> None:
    """BPU subgraphs: connected BPU units, a new one wherever a path comes back from the CPU
    (``structure.components``, the same rule every .bin tool applies), numbered in graph order."""
    for u in part.units:
        u.subgraph = None
    for k, group in enumerate(_subgraph_units(part)):
        for u in group:
            u.subgraph = k


# Layout moves onnxruntime runs on int32 too: an accumulator's int32 result can pass through them unchanged.
INT32_MOVES = ("Transpose", "Reshape", "Flatten", "Squeeze", "Unsqueeze")


def int32_tails(part: Partition, view: GraphView, integer_outputs: bool) -> dict[str, str]:
    """Tensors that carry a BPU accumulator's int32 result to float model outputs through layout moves only
    (an exported detector head's ``permute(0, 2, 3, 1)`` after its last convs), each mapped to that
    accumulator's output. The BPU writes the accumulator in the moved layout, so nothing requantizes it: the
    outputs are dequantized exactly, per channel, as where the conv itself is the output. Chains of at least
    one move only; none where the outputs are asked as integers (set_model_output_int8/int16)."""
    if integer_outputs:
        return {}
    tails: dict[str, str] = {}
    for unit in part.units:
        if unit.on != "BPU" or not unit.is_accumulator or unit.activation is not None:
            continue
        axis = accumulator_axis(unit, view)
        chain = _int32_chain(part, view, unit.outputs[0], axis) if axis is not None else None
        if chain is not None and len(chain) > 1:
            tails.update(dict.fromkeys(chain, unit.outputs[0]))
    return tails


def accumulator_axis(unit: Unit, view: GraphView) -> int | None:
    """The output-channel axis of an accumulator unit's result (None where its rank is unknown)."""
    if unit.main.op_type in ("Conv", "ConvTranspose"):
        return 1
    shape = view.shapes.get(unit.outputs[0])
    return len(shape) - 1 if shape else None


def _int32_chain(part: Partition, view: GraphView, tensor: str, axis: int) -> list[str] | None:
    """``tensor`` and what BPU int32 moves make of it, if every end is a model output and the channel axis
    can be followed through every move; None otherwise."""
    chain, axes = [tensor], {tensor: axis}
    for t in chain:
        users = part.consumers.get(t, [])
        if not users and t not in view.graph_outputs:
            return None
        for u in users:
            if u.on != "BPU" or u.kind != "passive" or u.main.op_type not in INT32_MOVES or len(u.outputs) != 1 \
                    or u.inputs[:1] != [t]:
                return None
            moved = moved_axis(u.main, axes[t], view)
            if moved is None:
                return None
            axes[u.outputs[0]] = moved
            chain.append(u.outputs[0])
    return chain


def moved_axis(node: NodeProto, axis: int, view: GraphView) -> int | None:
    """Where a layout move (Transpose, or a reshape of any spelling) puts its input's ``axis``; None where a
    reshape splits or merges that axis, or a shape is unknown."""
    in_shape, out_shape = view.shapes.get(node.input[0]), view.shapes.get(node.output[0])
    if not in_shape or not out_shape or not is_static(in_shape) or not is_static(out_shape):
        return None
    if node.op_type == "Transpose":
        perm = list(view.attrs(node).get("perm") or reversed(range(len(in_shape))))
        return perm.index(axis)
    return axis_through_reshape(in_shape, out_shape, axis)
