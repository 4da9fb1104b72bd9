"""The calibrated model as the debugger sees it: calibration nodes and ordinary nodes.

A calibrated model holds ``HzCalibration`` nodes of two kinds: ``weight`` nodes
(fake-quantize a constant weight) and ``activation`` nodes (fake-quantize a tensor
computed at run time). Every other node is an *ordinary* node. An ordinary node is
quantized when all calibration nodes feeding it are enabled, so its sensitivity is
measured by enabling exactly those.

The optimize stage may have written one node of the user's model as several (a bilinear Resize as a Pad
and a ConvTranspose, a Gemm over a 3-D tensor with a Reshape on each side); the model records whose
each is (``hbtools.graph.origins``). The debugger ranks and takes the user's names: a user node stands
for all of its nodes, quantized together.
"""

from __future__ import annotations

import copy
import difflib
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import onnx
from onnx import ModelProto, NodeProto, numpy_helper

from hbtools.errors import HbError
from hbtools.graph.graph import GraphView, infer_shapes, name_unnamed_nodes
from hbtools.graph.model_io import check_model, load_model
from hbtools.graph.origins import recorded_origins, user_node
from hbtools.ops.base import attrs_of
from hbtools.ops.calibration import HzBiasCalibration
from hbtools.ops.preprocess import HzPreprocess
from hbtools.quant.calibrated import without_integer_emulation
from hbtools.quant.grids import grid_bounds

CALIBRATION_OP = "HzCalibration"
KINDS = ("weight", "activation")
PREVIEW = 8  # names shown when an error lists the valid choices


@dataclass(frozen=True)
class CalibrationNode:
    name: str
    kind: str  # "weight" | "activation"
    input: str
    output: str
    thresholds: tuple[float, ...]
    bits: int
    axis: int
    consumers: tuple[str, ...]  # ordinary nodes that read the calibrated value
    groups: int = 1  # a grouped ConvTranspose weight: output channels spread over axes 0 and 1
    scales: tuple[float, ...] = ()
    zero_points: tuple[int, ...] = ()  # an asymmetric grid's (one per scale); none on a symmetric one

    @property
    def threshold(self) -> float:
        """The largest threshold (weights have one per channel)."""
        return max(self.thresholds) if self.thresholds else 0.0

    def value_range(self) -> tuple[float, float]:
        """The lowest and highest value the grid holds (over its channels): ``±threshold`` on a symmetric grid,
        from the zero point's offset on an asymmetric one (int8 zero point -128: ``0..threshold``)."""
        if not self.scales:
            return -self.threshold, self.threshold
        lo, hi = grid_bounds(self.bits, bool(self.zero_points))
        scales = np.asarray(self.scales, np.float64)
        zeros = np.asarray(self.zero_points or [0], np.float64)
        return float(np.min((lo - zeros) * scales)), float(np.max((hi - zeros) * scales))


@dataclass(frozen=True)
class GraphInput:
    name: str
    dtype: np.dtype
    shape: tuple[int | None, ...]


class CalibratedModel:
    """Index of a calibrated model; read-only.

    The debugger works on the model's switchable parts: the bias and preprocessing
    emulation, which belong to no calibration node, is taken out (with every node
    disabled the model is the float model).
    """

    def __init__(self, model: ModelProto, source: str) -> None:
        _check_whole(model, source)
        # Taken out below, but plot_distribution shows what each does to its bias.
        self.bias_nodes: dict[str, NodeProto] = {n.name: n for n in model.graph.node
                                                 if n.op_type == HzBiasCalibration.op_type and n.name}
        # The integer emulation taken out, for the switches to put back where they quantize: per reader of a
        # rounded bias, the bias's HzBiasCalibration (its weight's switch rounds it); per output of an integer
        # preprocessing, that HzPreprocess (its fake quant computes on its integer affine map).
        bias_of = {n.output[0]: n for n in model.graph.node if n.op_type == HzBiasCalibration.op_type}
        self.rounded_bias: dict[str, NodeProto] = {r.name: bias_of[i] for r in model.graph.node for i in r.input
                                                   if i in bias_of and r.name}
        self.integer_preprocess: dict[str, NodeProto] = {
            n.output[0]: n for n in model.graph.node
            if n.op_type == HzPreprocess.op_type and attrs_of(n).get("integer", 0)}
        model = without_integer_emulation(model)
        if any(not n.name for n in model.graph.node):
            name_unnamed_nodes(model)  # tables and arguments refer to nodes by name
        self.model = model
        self.source = source
        graph = model.graph
        readers: dict[str, list[NodeProto]] = {}
        for n in graph.node:
            for i in n.input:
                readers.setdefault(i, []).append(n)
        producers = {o: n for n in graph.node for o in n.output}
        self.nodes: dict[str, NodeProto] = {n.name: n for n in graph.node if n.op_type != CALIBRATION_OP}
        self.calibration: dict[str, CalibrationNode] = {}
        for n in graph.node:
            if n.op_type != CALIBRATION_OP:
                continue
            a = attrs_of(n)
            self.calibration[n.name] = CalibrationNode(
                name=n.name, kind=a.get("kind", "activation"), input=n.input[0], output=n.output[0],
                thresholds=tuple(float(t) for t in a.get("thresholds", [])), bits=int(a.get("bits", 8)),
                axis=int(a.get("axis", -1)),
                consumers=tuple(dict.fromkeys(r.name for r in readers.get(n.output[0], [])
                                              if r.op_type != CALIBRATION_OP)),
                groups=int(a.get("groups") or 1),
                scales=tuple(float(x) for x in a.get("scales", [])),
                zero_points=tuple(int(z) for z in a.get("zero_points") or []),
            )
        if not self.calibration:
            raise HbError(f"{source} has no HzCalibration nodes, so it is not a calibrated model; pass the "
                          "*_calibrated_model.onnx that hb_mapper makertbin writes to working_dir")
        by_output = {c.output: c.name for c in self.calibration.values()}
        # Calibration nodes feeding each ordinary node, in input order.
        self.feeding: dict[str, tuple[str, ...]] = {
            name: tuple(dict.fromkeys(by_output[i] for i in n.input if i in by_output))
            for name, n in self.nodes.items()
        }
        self.producers = producers
        self.origins = recorded_origins(model)
        # user node -> its nodes in graph order; a node no rewrite renamed is its own user node
        self.members: dict[str, list[str]] = {}
        for name in self.nodes:
            self.members.setdefault(self.user_node(name), []).append(name)
        inits = {t.name for t in graph.initializer}
        self.inputs = [_graph_input(vi) for vi in graph.input if vi.name not in inits]
        # What the analyses compare; an output the optimizer folded to a constant (a length the input
        # shape fixes) is the same in every configuration and no part of the model makes it.
        self.outputs = [o.name for o in graph.output if o.name not in inits]

    @cached_property
    def shapes(self) -> dict[str, list[int | None]]:
        """Static shapes of the tensors (None for unknown dimensions)."""
        return GraphView(self.model).shapes

    @cached_property
    def tensor_types(self) -> dict[str, int]:
        """Element type of every tensor whose type shape inference finds."""
        model = infer_shapes(copy.deepcopy(self.model))
        g = model.graph
        out = {t.name: t.data_type for t in g.initializer}
        for vi in [*g.input, *g.value_info, *g.output]:
            if vi.type.tensor_type.elem_type:
                out[vi.name] = vi.type.tensor_type.elem_type
        return out

    @cached_property
    def constants(self) -> dict[str, np.ndarray]:
        return {t.name: numpy_helper.to_array(t) for t in self.model.graph.initializer}

    def calibration_proto(self, name: str) -> NodeProto:
        return next(n for n in self.model.graph.node if n.name == name)

    # ------------------------------------------------------------------ node sets

    def user_node(self, name: str) -> str:
        """The user's node that ordinary node ``name`` is (part of)."""
        return user_node(self.origins, name)

    def standing_for(self, name: str) -> str:
        """The node whose output is the output of ordinary node ``name`` (a user's node or one of ours):
        the last of a user node's nodes."""
        return self.members[name][-1] if name in self.members else name

    @cached_property
    def quantizable(self) -> list[str]:
        """User nodes of which at least one calibration node feeds a part, in graph order."""
        return [user for user, parts in self.members.items() if any(self.feeding[p] for p in parts)]

    def of_kind(self, kind: str) -> list[str]:
        return [c.name for c in self.calibration.values() if c.kind == kind]

    def kind_of(self, name: str) -> str:
        """'weight', 'activation' or 'node'."""
        return self.calibration[name].kind if name in self.calibration else "node"

    def switches_of(self, name: str) -> set[str]:
        """The calibration nodes that quantize ``name`` (itself for a calibration node)."""
        if name in self.calibration:
            return {name}
        parts = self.members.get(name, [name])
        return {c for part in parts for c in self.feeding[part]}

    def switches_of_group(self, item: str) -> set[str]:
        """Like ``switches_of`` but also 'weight' / 'activation' for all nodes of that kind."""
        if item in KINDS:
            return set(self.of_kind(item))
        return self.switches_of(item)

    # ------------------------------------------------------------------ argument checks

    def check(self, names: list[str], param: str, *, allowed: tuple[str, ...] = ("node", *KINDS),
              quantizable_only: bool = True) -> list[str]:
        """Validate user-given node names; the error names the valid choices."""
        valid = self._valid(allowed, quantizable_only)
        for name in names:
            if not isinstance(name, str):
                raise HbError(f"{param}: expected node names, got {name!r} ({type(name).__name__})")
            if name in valid or ("node" in allowed and self._optimizers(name, quantizable_only)):
                continue
            raise HbError(self._unknown(name, param, allowed, quantizable_only, valid))
        return list(names)

    def _valid(self, allowed: tuple[str, ...], quantizable_only: bool) -> list[str]:
        out: list[str] = []
        if "node" in allowed:
            out += self.quantizable if quantizable_only else list(self.members)
        for kind in KINDS:
            if kind in allowed:
                out += self.of_kind(kind)
        return out

    def _optimizers(self, name: str, quantizable_only: bool) -> bool:
        """Whether ``name`` is a node the optimize stage wrote for a user's node (older tables named them): taken
        as that node alone, though no longer offered."""
        return name in self.nodes and name not in self.members and (bool(self.feeding[name]) or not quantizable_only)

    def _unknown(self, name: str, param: str, allowed: tuple[str, ...], quantizable_only: bool,
                 valid: list[str]) -> str:
        what = _describe(allowed, quantizable_only)
        if name in self.bias_nodes:
            problem = (f"'{name}' is a bias calibration node (a bias on its int32 accumulator grid, which "
                       f"belongs to no switch), but {param} takes {what}")
        elif name in self.calibration or name in self.nodes or name in self.members:
            kind = self.kind_of(name)
            problem = (f"'{name}' is an ordinary node that no calibration node feeds, so it has nothing to quantize"
                       if kind == "node" and "node" in allowed else
                       f"'{name}' is {_article(kind)} {_kind_label(kind)}, but {param} takes {what}")
        else:
            problem = f"no node named '{name}' in {self.source}"
            close = difflib.get_close_matches(name, valid, n=3, cutoff=0.6)
            if close:
                problem += f" (did you mean {', '.join(close)}?)"
        preview = ", ".join(valid[:PREVIEW]) + (", ..." if len(valid) > PREVIEW else "")
        return f"{param}: {problem}; valid choices are the {len(valid)} {what} of the model: {preview}"


def load_calibrated(model_or_file: str | Path | ModelProto | None) -> CalibratedModel:
    """A path or ``onnx.ModelProto`` of a calibrated model."""
    if model_or_file is None:
        raise HbError("model_or_file is required: the path or onnx.ModelProto of a *_calibrated_model.onnx")
    if isinstance(model_or_file, ModelProto):
        return CalibratedModel(model_or_file, "the given model")
    if isinstance(model_or_file, str | Path):
        return CalibratedModel(load_model(model_or_file), f"'{model_or_file}'")
    raise HbError(f"model_or_file must be a file path or an onnx.ModelProto, not {type(model_or_file).__name__}")


def _check_whole(model: ModelProto, source: str) -> None:
    """onnx's checker on the model, as the other tools check theirs: an edited model (a node deleted by hand) is
    refused here, not found out by a lookup half-way through an analysis."""
    try:
        check_model(model)
    except onnx.checker.ValidationError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else "invalid model"
        raise HbError(f"{source} fails the ONNX checker: {first}",
                      hint="give the debugger the *_calibrated_model.onnx makertbin wrote, as it was written "
                           "(run makertbin again for a changed model)") from exc


def _graph_input(vi: onnx.ValueInfoProto) -> GraphInput:
    t = vi.type.tensor_type
    dims = tuple(d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim)
    return GraphInput(vi.name, np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.elem_type)), dims)


def _kind_label(kind: str) -> str:
    return "ordinary node" if kind == "node" else f"{kind} calibration node"


def _article(kind: str) -> str:
    return "an" if _kind_label(kind)[0] in "aeiou" else "a"


def _describe(allowed: tuple[str, ...], quantizable_only: bool = True) -> str:
    labels = {"node": "quantizable ordinary nodes" if quantizable_only else "ordinary nodes",
              "weight": "weight calibration nodes", "activation": "activation calibration nodes"}
    parts = [labels[k] for k in allowed]
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
