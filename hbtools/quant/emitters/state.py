"""What the quantize stage's emitters share: the integer form of every tensor so far.

Each emitter turns one partition unit into Hz integer ops (``hbtools.ops``) and
records the integer tensors it wrote; ``need_q`` / ``need_float`` insert the
HzQuantize / HzDequantize pairs at BPU/CPU boundaries on demand.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from onnx import ModelProto, NodeProto, TensorProto, helper, numpy_helper

from hbtools.config.model import Config
from hbtools.graph.graph import GraphView
from hbtools.graph.origins import recorded_origins
from hbtools.march.layout import permutation, quantized_layout, to_layout
from hbtools.march.profiles import MarchProfile
from hbtools.ops.base import content_key
from hbtools.ops.names import quantized_tensor
from hbtools.ops.quantized import HzDequantize, HzQuantize
from hbtools.quant import grids
from hbtools.quant.calibrated import ActGrid, CalibratedGraph
from hbtools.quant.units import Partition, int32_tails

ELEM_TYPES = {"int8": TensorProto.INT8, "int16": TensorProto.INT16, "int32": TensorProto.INT32}


@dataclass
class QTensor:
    name: str
    dtype: str  # int8 | int16 | int32
    scale: np.ndarray  # one value, or one per channel along axis
    axis: int = 1
    zero_point: int = 0  # value = (q - zero_point) * scale

    @property
    def bits(self) -> int:
        return int(self.dtype[3:])

    def to_float(self, q: np.ndarray) -> np.ndarray:
        """Integer values of this tensor as float64 values."""
        q = np.asarray(q)
        scale = grids.along_axis(self.scale, self.axis % q.ndim if self.scale.size > 1 else None, q.ndim,
                                 np.float64)
        return grids.dequantize(q, scale, self.zero_point)

    def levels_span(self) -> int:
        """Largest |q - zero_point| of this tensor."""
        qmax = grids.qmax_for(self.bits)
        return qmax + 1 + abs(self.zero_point) if self.zero_point else qmax


@dataclass
class QuantizedResult:
    model: ModelProto
    partition: Partition
    tensors: dict[str, QTensor] = field(default_factory=dict)  # float tensor name -> its integer form
    thresholds: dict[str, float] = field(default_factory=dict)
    origins: dict[str, str] = field(default_factory=dict)  # node -> the user's node it was written for


class EmitState:
    """The quantized graph under construction."""

    def __init__(self, calibrated: CalibratedGraph, part: Partition, config: Config, profile: MarchProfile) -> None:
        self.src = calibrated.float_model
        self.view = GraphView(self.src)
        self.part = part
        self.acts: dict[str, ActGrid] = calibrated.activations
        self.weights: dict[str, dict] = calibrated.weights
        self.config = config
        self.profile = profile
        self.nodes: list[NodeProto] = []
        self.inits: list[TensorProto] = []
        self._stored: dict[tuple, str] = {}  # (dtype, shape, digest of the bytes) -> initializer name
        self.function_sessions: dict[bytes, object] = {}  # lookup tables' functions, by content (``emitters.lut``)
        self.q: dict[str, QTensor] = {}
        self.floats: set[str] = set(self.view.graph_inputs) | set(self.view.initializers)
        self.value_info: list = []
        self.inputs = [copy.deepcopy(i) for i in self.src.graph.input]
        self.int32_tails = int32_tails(part, self.view, config.calibration.options.int_outputs)
        self._dequantized_as = _vendor_dequantize_names(self.int32_tails, set(self.view.graph_outputs),
                                                        self._users_moves(),
                                                        lambda t: self.view.producer[t].input[0])

    def _users_moves(self) -> set[str]:
        """The int32 chain tensors a node of the user's model moves: not one the optimize stage or onnxruntime
        wrote for another node (the Reshapes wrapped around a Linear over 3-D, ``gemm_output_reshape``)."""
        written_for = recorded_origins(self.src)
        return {t for t, accumulator in self.int32_tails.items() if t != accumulator
                and (p := self.view.producer.get(t)) is not None and written_for.get(p.name, p.name) == p.name}

    # ---- tensors -------------------------------------------------------------------------
    def init(self, name: str, value: np.ndarray) -> str:
        """A constant of the quantized graph: ``name``, or the name of an equal one stored before."""
        value = np.asarray(value)
        key = content_key(value)
        if key is not None:
            if key in self._stored:
                return self._stored[key]
            self._stored[key] = name
        self.inits.append(numpy_helper.from_array(value, name))
        return name

    def record(self, tensor: str, qt: QTensor, shape: list | None = None) -> QTensor:
        self.q[tensor] = qt
        shape = self.view.shapes.get(tensor) if shape is None else shape
        self.value_info.append(helper.make_tensor_value_info(qt.name, ELEM_TYPES[qt.dtype], shape))
        return qt

    def grid(self, tensor: str) -> tuple[QTensor, int, int]:
        """The integer form of calibrated ``tensor`` (its stored float32 steps) and its clip range."""
        g = self.acts[tensor]
        qt = QTensor(quantized_tensor(tensor), f"int{g.bits}", g.scales.astype(np.float64),
                     1 if g.axis is None else g.axis, g.zero_point)
        return (qt, *grids.grid_bounds(g.bits, g.asymmetric))

    def need_q(self, tensor: str) -> QTensor:
        """``tensor`` as integers, quantizing a float (CPU or input) tensor where needed."""
        if tensor in self.q and self.q[tensor].dtype != "int32":
            return self.q[tensor]
        if tensor not in self.acts:
            raise RuntimeError(f"tensor {tensor} reaches the BPU without calibration")
        qt, qmin, qmax = self.grid(tensor)
        src = self.need_float(tensor)
        scale: dict = {"scale": float(qt.scale[0])}
        if qt.scale.size > 1:
            # A CPU result's rank may be unknown to the lowering: count the axis from the end.
            rank = len(self.view.shapes.get(tensor) or [])
            scale = {"scales": [float(s) for s in qt.scale], "axis": qt.axis - rank if rank else qt.axis}
        self.nodes.append(HzQuantize.make_node([src], [qt.name], f"{tensor}_HzQuantize", out_type=qt.dtype,
                                               out_min=float(qmin), out_max=float(qmax),
                                               zero_point=qt.zero_point or None, **scale))
        return self.record(tensor, qt)

    def need_float(self, tensor: str) -> str:
        """``tensor`` as float, dequantizing an integer tensor where needed."""
        if tensor in self.floats:
            return tensor
        qt = self.q[tensor]
        name = f"{self._dequantized_as.get(tensor, tensor)}_HzDequantize"
        self.nodes.append(HzDequantize.make_node([qt.name], [tensor], name,
                                                 scales=[float(s) for s in qt.scale.reshape(-1)], axis=qt.axis,
                                                 zero_point=qt.zero_point or None))
        self.floats.add(tensor)
        return tensor

    def int32_read_as_float(self, tensor: str) -> None:
        """Dequantize int32 ``tensor`` unless BPU layout moves carry it on as int32 (``int32_tails``); of
        those, the model outputs only."""
        if tensor not in self.int32_tails or tensor in self.view.graph_outputs:
            self.need_float(tensor)

    def cpu_needs(self, tensor: str) -> bool:
        """Whether a CPU node or the user (a float model output) reads ``tensor``."""
        users = self.part.consumers.get(tensor, [])
        float_output = tensor in self.view.graph_outputs and not self.config.calibration.options.int_outputs
        return float_output or any(u.on == "CPU" for u in users)

    def out_attrs(self, tensor: str, lo: float | None = None, hi: float | None = None) -> tuple[QTensor, dict]:
        """Output tensor at its calibrated step, with activation bounds folded into the clip.

        Per-channel bounds that differ between channels keep the loosest (the clip never
        cuts a value the calibrated model keeps).
        """
        qt, qmin, qmax = self.grid(tensor)
        scale, z = qt.scale, qt.zero_point
        # The calibrated model clips the value, then rounds it onto the grid: a bound lands on round(bound / s).
        out_min = qmin if lo is None else max(qmin, z + int(np.round(lo / scale).min()))
        out_max = qmax if hi is None else min(qmax, z + int(np.round(hi / scale).max()))
        attrs = {"out_type": qt.dtype, "out_min": float(out_min), "out_max": float(out_max),
                 "zero_point": z or None}
        return qt, attrs

    # ---- layout --------------------------------------------------------------------------
    def transpose(self, x: str, perm: list[int], out: str) -> str:
        self.nodes.append(helper.make_node("Transpose", [x], [out], name=f"{out}_Transpose", perm=perm))
        return out

    def input_in_rt_layout(self, x: str, train_layout: str) -> str:
        """Make graph input ``x`` arrive in the runtime layout; return the tensor in train layout."""
        spec = next((s for s in self.config.inputs if s.name == x), None)
        if spec is None:
            return x
        rt = quantized_layout(spec, self.profile)
        if rt == train_layout:
            return x
        for vi in self.inputs:
            if vi.name == x:
                dims = vi.type.tensor_type.shape
                shape = to_layout([d.dim_value for d in dims.dim], train_layout, rt)
                dims.ClearField("dim")
                for d in shape:
                    dims.dim.add().dim_value = d
        return self.transpose(x, permutation(rt, train_layout), f"{x}_{train_layout.lower()}")


def _vendor_dequantize_names(tails: dict[str, str], graph_outputs: set[str], users_moves: set[str],
                             moved_from: Callable[[str], str]) -> dict[str, str]:
    """The model output of each int32 chain with one, mapped to the tensor the vendor names its Dequantize
    after: its toolchain folds the user's moves into the conv and names the output Dequantize after the conv's
    tensor (``/model.23/cv2.0/cv2.0.2/Conv_output_0_HzDequantize``), the name D-Robotics' hb_model_modifier
    commands remove. Back from the output through the user's moves (``users_moves``; ``moved_from``: what a move
    reads): a Linear over 3-D ends in onnxruntime's reshape, which writes the Linear's own output tensor
    (``/fc/Add_output_0``), not the Gemm's helper tensor."""
    ends: dict[str, list[tuple[str, str]]] = {}
    for tensor, accumulator in tails.items():
        if tensor not in graph_outputs:
            continue
        source = tensor
        while source in users_moves:
            source = moved_from(source)
        if source != tensor:
            ends.setdefault(accumulator, []).append((tensor, source))
    return {out: source for pairs in ends.values() if len(pairs) == 1 for out, source in pairs}


def per_tensor(qt: QTensor, what: str) -> QTensor:
    """``qt``, which must have one step (only conv-like units read per-channel tensors)."""
    if qt.scale.size > 1:
        raise RuntimeError(f"{what} reads per-channel tensor {qt.name}; only conv-like units take one")
    return qt
