"""Quantize stage: calibrated model -> fixed-point model of Hz integer ops.

Reads everything from the calibrated model file itself (thresholds live in its
HzCalibration nodes), re-derives the same BPU/CPU partition, and emits one Hz op
per BPU unit. CPU nodes stay float behind HzDequantize / HzQuantize.

A per-channel input of a conv-like unit has its channel scales folded into the
integer weight (the weight's calibration node says how: ``input_scales``); an
asymmetric tensor's zero point goes to the ops that read and write it.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass, field

import numpy as np
from onnx import ModelProto, NodeProto, TensorProto, helper, numpy_helper

from hbtools.config.model import Config
from hbtools.graph.graph import GraphView
from hbtools.graph.model_io import with_horizon_domain
from hbtools.march.layout import permutation, quantized_layout, to_layout
from hbtools.march.profiles import MarchProfile
from hbtools.ops.base import DOMAIN, attrs_of
from hbtools.ops.calibration import grid_bounds, qmax_for, quantize_weight
from hbtools.ops.preprocess import affine
from hbtools.quant.plan import wants_int_outputs, weight_axis
from hbtools.quant.units import Partition, Unit, build_partition
from hbtools.runtime.session import make_session

log = logging.getLogger("hbtools")


@dataclass
class QTensor:
    name: str
    dtype: str  # int8 | int16 | int32
    scale: np.ndarray  # one value, or one per channel along axis
    axis: int = 1
    zero_point: int = 0  # value = (q - zero_point) * scale

    def to_float(self, q: np.ndarray) -> np.ndarray:
        """Integer values of this tensor as float64 values."""
        scale = self.scale.reshape([-1 if k == self.axis % q.ndim else 1 for k in range(q.ndim)]) \
            if self.scale.size > 1 else self.scale[0]
        return (np.asarray(q).astype(np.float64) - self.zero_point) * scale


@dataclass
class ActGrid:
    """An activation calibration node's grid, as the quantized model uses it."""

    threshold: float  # largest threshold (the node table shows it)
    bits: int
    scales: np.ndarray | None = None  # None: symmetric per tensor, step threshold / qmax
    zero_point: int = 0
    asymmetric: bool = False  # the whole integer range (-128..127), zero point may be 0
    axis: int | None = None  # channel axis of per-channel scales


@dataclass
class QuantizedResult:
    model: ModelProto
    partition: Partition
    tensors: dict[str, QTensor] = field(default_factory=dict)  # float tensor name -> its integer form
    thresholds: dict[str, float] = field(default_factory=dict)


def strip_calibration(calibrated: ModelProto) -> tuple[ModelProto, dict, dict]:
    """Undo the calibrate stage: the float graph, activation grids and weight calibration attributes."""
    model = ModelProto()
    model.CopyFrom(calibrated)
    acts: dict[str, ActGrid] = {}
    weights: dict[str, dict] = {}
    rename: dict[str, str] = {}
    keep = []
    inits = {t.name: t for t in model.graph.initializer}
    roundings = set()
    for node in model.graph.node:
        if node.domain == DOMAIN and node.op_type == "HzCalibration":
            a = attrs_of(node)
            tensor = node.name[: -len("_HzCalibration")] if node.name.endswith("_HzCalibration") else node.input[0]
            if a["kind"] == "weight":
                weights[tensor] = a
                if len(node.input) > 1 and node.input[1]:  # GPTQ rounding offsets
                    a["rounding"] = numpy_helper.to_array(inits[node.input[1]])
                    roundings.add(node.input[1])
            else:
                acts[tensor] = _act_grid(a, node.name)
            rename[node.output[0]] = tensor
            rename[node.input[0]] = tensor
        else:
            keep.append(node)
    del model.graph.node[:]
    model.graph.node.extend(keep)
    kept_inits = [t for t in model.graph.initializer if t.name not in roundings]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept_inits)
    for node in model.graph.node:
        for k, i in enumerate(node.input):
            node.input[k] = rename.get(i, i)
        for k, o in enumerate(node.output):
            node.output[k] = rename.get(o, o)
    return model, acts, weights


def _act_grid(a: dict, name: str) -> ActGrid:
    threshold, bits = float(max(a["thresholds"])), int(a["bits"])
    axis = int(a.get("axis", -1))
    if axis < 0 and "zero_points" not in a:
        return ActGrid(threshold, bits)  # the symmetric per-tensor grid, exactly as before
    zero_points = set(a.get("zero_points", [0]))
    if len(zero_points) != 1:
        raise ValueError(f"{name}: per-channel zero points must be equal (integer kernels take one)")
    return ActGrid(threshold, bits, np.asarray(a["scales"], dtype=np.float64), int(zero_points.pop()),
                   "zero_points" in a, None if axis < 0 else axis)


def run(calibrated: ModelProto, config: Config, profile: MarchProfile) -> QuantizedResult:
    float_model, acts, weights = strip_calibration(calibrated)
    part = build_partition(float_model, profile, config.model.node_info, all_bpu=config.model.fast_perf, warn=False)
    builder = _Builder(float_model, part, acts, weights, config, profile)
    model = builder.build()
    return QuantizedResult(model, part, builder.q, {t: g.threshold for t, g in acts.items()})


def _ratio(num: np.ndarray, den: np.ndarray) -> list[float]:
    """Requantization multipliers: one scale over another, per channel where either is."""
    return [float(v) for v in np.asarray(num, dtype=np.float64) / np.asarray(den, dtype=np.float64)]


def _levels_span(qt: QTensor) -> int:
    """Largest |q - zero_point| of an integer tensor."""
    qmax = qmax_for(int(qt.dtype[3:]))
    return qmax + 1 + abs(qt.zero_point) if qt.zero_point else qmax


def _per_tensor(qt: QTensor, what: str) -> QTensor:
    if qt.scale.size > 1:
        raise RuntimeError(f"{what} reads per-channel tensor {qt.name}; only conv-like units take one")
    return qt


class _Builder:
    def __init__(self, model: ModelProto, part: Partition, acts: dict, weights: dict, config: Config,
                 profile: MarchProfile) -> None:
        self.src = model
        self.view = GraphView(model)
        self.part = part
        self.acts = acts
        self.weights = weights
        self.config = config
        self.profile = profile
        self.nodes: list[NodeProto] = []
        self.inits: list[TensorProto] = []
        self.q: dict[str, QTensor] = {}
        self.floats: set[str] = set(self.view.graph_inputs) | set(self.view.initializers)
        self.value_info: list = []
        self.inputs = [copy.deepcopy(i) for i in model.graph.input]

    # ---- tensors -------------------------------------------------------------------------
    def _init(self, name: str, value: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def _record(self, tensor: str, qt: QTensor) -> QTensor:
        self.q[tensor] = qt
        shape = self.view.shapes.get(tensor)
        elem = {"int8": TensorProto.INT8, "int16": TensorProto.INT16, "int32": TensorProto.INT32}[qt.dtype]
        self.value_info.append(helper.make_tensor_value_info(qt.name, elem, shape))
        return qt

    def _grid(self, tensor: str) -> tuple[QTensor, int, int]:
        """The integer form of calibrated ``tensor`` and its clip range."""
        g = self.acts[tensor]
        if g.scales is None:
            scale = np.array([(g.threshold if g.threshold > 0 else 1.0) / qmax_for(g.bits)])
        else:
            scale = g.scales
        qt = QTensor(f"{tensor}_quantized", f"int{g.bits}", scale, 1 if g.axis is None else g.axis, g.zero_point)
        return (qt, *grid_bounds(g.bits, g.asymmetric))

    def need_q(self, tensor: str) -> QTensor:
        if tensor in self.q and self.q[tensor].dtype != "int32":
            return self.q[tensor]
        if tensor not in self.acts:
            raise RuntimeError(f"tensor {tensor} reaches the BPU without calibration")
        qt, qmin, qmax = self._grid(tensor)
        src = self.need_float(tensor)
        if qt.scale.size > 1:
            # A CPU result's rank may be unknown to the lowering: count the axis from the end.
            rank = len(self.view.shapes.get(tensor) or [])
            scale_attrs = {"scales": [float(s) for s in qt.scale], "axis": qt.axis - rank if rank else qt.axis}
        else:
            scale_attrs = {"scale": float(qt.scale[0])}
        if qt.zero_point:
            scale_attrs["zero_point"] = qt.zero_point
        self.nodes.append(helper.make_node("HzQuantize", [src], [qt.name], name=f"{tensor}_HzQuantize",
                                           domain=DOMAIN, out_type=qt.dtype, out_min=float(qmin),
                                           out_max=float(qmax), **scale_attrs))
        return self._record(tensor, qt)

    def need_float(self, tensor: str) -> str:
        if tensor in self.floats:
            return tensor
        qt = self.q[tensor]
        extra = {"zero_point": qt.zero_point} if qt.zero_point else {}
        self.nodes.append(helper.make_node("HzDequantize", [qt.name], [tensor], name=f"{tensor}_HzDequantize",
                                           domain=DOMAIN, scales=[float(s) for s in qt.scale.reshape(-1)],
                                           axis=qt.axis, **extra))
        self.floats.add(tensor)
        return tensor

    def _cpu_needs(self, tensor: str) -> bool:
        users = self.part.consumers.get(tensor, [])
        float_output = tensor in self.view.graph_outputs and not wants_int_outputs(self.config)
        return float_output or any(u.on == "CPU" for u in users)

    def _out_attrs(self, tensor: str, lo: float | None = None, hi: float | None = None) -> tuple[QTensor, dict]:
        """Output tensor at its calibrated scale, with activation bounds folded into the clip.

        Per-channel bounds that differ between channels keep the loosest (the clip never
        cuts a value the calibrated model keeps).
        """
        qt, qmin, qmax = self._grid(tensor)
        scale, z = qt.scale, qt.zero_point
        out_min = qmin if lo is None else max(qmin, z + int(np.ceil(lo / scale - 1e-9).min()))
        out_max = qmax if hi is None else min(qmax, z + int(np.floor(hi / scale + 1e-9).max()))
        attrs = {"out_type": qt.dtype, "out_min": float(out_min), "out_max": float(out_max)}
        if z:
            attrs["zero_point"] = z
        return qt, attrs

    # ---- build ---------------------------------------------------------------------------
    def build(self) -> ModelProto:
        for unit in self.part.units:
            handler = getattr(self, f"_unit_{unit.kind}") if unit.on == "BPU" else self._unit_cpu
            handler(unit)
        outputs = []
        int_outputs = "set_model_output_int8" in self.config.calibration.optimization or \
            "set_model_output_int16" in self.config.calibration.optimization
        for out in self.src.graph.output:
            if out.name not in self.floats and int_outputs and out.name in self.q and self.q[out.name].dtype != "int32":
                qt = self.q[out.name]
                self.nodes.append(helper.make_node("Identity", [qt.name], [out.name], name=f"{out.name}_output"))
                elem = TensorProto.INT8 if qt.dtype == "int8" else TensorProto.INT16
                outputs.append(helper.make_tensor_value_info(out.name, elem, self.view.shapes.get(out.name)))
                continue
            self.need_float(out.name)
            outputs.append(helper.make_tensor_value_info(out.name, TensorProto.FLOAT, self.view.shapes.get(out.name)))
        used = {i for n in self.nodes for i in n.input}
        float_inits = [t for t in self.src.graph.initializer if t.name in used]
        graph = helper.make_graph(self.nodes, self.src.graph.name or "quantized", self.inputs, outputs,
                                  [*float_inits, *self.inits], value_info=self.value_info)
        model = helper.make_model(graph, opset_imports=list(self.src.opset_import))
        model.ir_version = self.src.ir_version
        model.producer_name = "hbtools"
        with_horizon_domain(model)
        return model

    def _unit_cpu(self, unit: Unit) -> None:
        for t in unit.inputs:
            self.need_float(t)
        for node in unit.nodes:
            self.nodes.append(node)
            self.floats.update(node.output)

    def _unit_preprocess(self, unit: Unit) -> None:
        node = unit.main
        m, b = affine(node)
        w_scale = np.abs(m).max(axis=1) / 127.0
        w_scale = np.where(w_scale > 0, w_scale, 1.0)
        w_q = np.clip(np.round(m / w_scale[:, None]), -127, 127).astype(np.int8)
        bias = np.round(b / w_scale).astype(np.int32)
        out = unit.outputs[0]
        qt, oa = self._out_attrs(out)
        x = node.input[0]
        layout = attrs_of(node).get("layout", "NCHW")
        x = self._input_in_rt_layout(x, layout)
        if layout == "NHWC":
            x = self._transpose(x, [0, 3, 1, 2], f"{x}_nchw")
        conv_out = qt.name if layout == "NCHW" else f"{out}_nchw_quantized"
        w = self._init(f"{node.name}_weight_quantized", w_q.reshape(*w_q.shape, 1, 1))
        bn = self._init(f"{node.name}_bias_quantized", bias)
        mult = _ratio(w_scale, qt.scale)
        self.nodes.append(helper.make_node("HzSQuantizedConv", [x, w, bn], [conv_out], name=node.name, domain=DOMAIN,
                                           kind="Conv", x_bits=8, kernel_shape=[1, 1], axis=1, multiplier=mult, **oa))
        if layout == "NHWC":
            shape = self.view.shapes.get(out)
            nchw = [shape[0], shape[3], shape[1], shape[2]] if shape else None
            self.value_info.append(helper.make_tensor_value_info(conv_out, TensorProto.INT8, nchw))
            self._transpose(conv_out, [0, 2, 3, 1], qt.name)
        self._record(out, qt)

    def _input_in_rt_layout(self, x: str, train_layout: str) -> str:
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
        return self._transpose(x, permutation(rt, train_layout), f"{x}_{train_layout.lower()}")

    def _transpose(self, x: str, perm: list[int], out: str) -> str:
        self.nodes.append(helper.make_node("Transpose", [x], [out], name=f"{out}_Transpose", perm=perm))
        return out

    def _unit_conv(self, unit: Unit) -> None:
        node = unit.main
        a = self.view.attrs(node)
        xq = self.need_q(unit.inputs[0])
        bias = self.view.const(node.input[2]).astype(np.float64) if len(node.input) > 2 and node.input[2] else None
        kind = node.op_type
        if kind == "Gemm" and bias is not None:
            bias = (bias * a.get("beta", 1.0)).reshape(-1)
        w_attrs = self.weights[node.input[1]]
        if "input_scales" in w_attrs:
            w_q, acc_scale = self._folded_weight(node, w_attrs, xq)
        else:
            w_q, acc_scale = self._weight(node, w_attrs, xq)
        if kind == "Gemm":
            kind = "MatMul"
        axis_w = 1 if kind == "MatMul" else weight_axis(node, self.view)
        out_axis = -1 if kind == "MatMul" else 1
        inputs = [xq.name, self._init(f"{node.name}_weight_quantized", w_q)]
        if bias is not None:
            b_q = np.clip(np.round(bias / acc_scale), -(2**31), 2**31 - 1).astype(np.int32)
            inputs.append(self._init(f"{node.name}_bias_quantized", b_q))
        conv_attrs = {k: a[k] for k in ("kernel_shape", "strides", "pads", "dilations", "group", "output_padding",
                                        "auto_pad") if k in a}
        if "kernel_shape" not in conv_attrs and kind != "MatMul":
            conv_attrs["kernel_shape"] = list(w_q.shape[2:])
        common = {"kind": kind, "x_bits": int(xq.dtype[3:]), "axis": out_axis, **conv_attrs}
        if xq.zero_point:
            common["x_zero_point"] = xq.zero_point
        # Largest |accumulator| any input can produce, per output channel.
        reduce = tuple(k for k in range(w_q.ndim) if k != axis_w)
        bound = _levels_span(xq) * float(np.abs(w_q.astype(np.int64)).sum(axis=reduce).max())
        if bias is not None:
            bound += float(np.abs(b_q.astype(np.int64)).max())
        self._emit_accumulator(unit, "HzSQuantizedConv", inputs, acc_scale, out_axis, common, bound)

    def _weight(self, node: NodeProto, w_attrs: dict, xq: QTensor) -> tuple[np.ndarray, np.ndarray]:
        """int8 weight (Gemm as MatMul [K, N]) and the accumulator scale, per output channel."""
        a = self.view.attrs(node)
        w = self.view.const(node.input[1]).astype(np.float64)
        axis_w = weight_axis(node, self.view)
        w_th = np.asarray(w_attrs["thresholds"], dtype=np.float64)
        if node.op_type == "Gemm":
            w = w * a.get("alpha", 1.0)
            w_th = w_th * abs(a.get("alpha", 1.0))
            if a.get("transB", 0):
                w = w.T
            axis_w = 1
        w_scale = np.where(w_th > 0, w_th, 1.0) / 127.0
        shape = [1] * w.ndim
        shape[axis_w] = -1
        levels = np.round(w / w_scale.reshape(shape))
        if "rounding" in w_attrs:  # offsets of the weight as stored (a Gemm's may be transposed above)
            offsets = w_attrs["rounding"]
            levels = levels + (offsets.T if node.op_type == "Gemm" and a.get("transB", 0) else offsets)
        w_q = np.clip(levels, -127, 127).astype(np.int8)
        return w_q, xq.scale[0] * w_scale

    def _folded_weight(self, node: NodeProto, w_attrs: dict, xq: QTensor) -> tuple[np.ndarray, np.ndarray]:
        """The weight with the per-channel input scales folded in, as its calibration node quantizes it.

        ``x[c] = q[c] * s_c`` and ``w[o, c] * s_c = wq[o, c] * s_o``, so the accumulator's
        step is the folded weight's step ``s_o`` alone.
        """
        if not np.allclose(np.asarray(w_attrs["input_scales"], dtype=np.float32), xq.scale.astype(np.float32),
                           rtol=0, atol=0):
            raise RuntimeError(f"{node.name}: weight calibration was folded with other input scales than "
                               f"{node.input[0]}'s")
        levels, _ = quantize_weight(self.view.const(node.input[1]), w_attrs, w_attrs.get("rounding"))
        w_scale = np.asarray(w_attrs["scales"], dtype=np.float64)
        if node.op_type == "Gemm":
            alpha = self.view.attrs(node).get("alpha", 1.0)
            levels, w_scale = levels * np.sign(alpha), w_scale * abs(alpha)
            if self.view.attrs(node).get("transB", 0):
                levels = levels.T
        return levels.astype(np.int8), w_scale

    def _unit_matmul(self, unit: Unit) -> None:
        qa, qb = (_per_tensor(self.need_q(t), unit.main.name) for t in unit.main.input[:2])
        acc_scale = np.array([qa.scale[0] * qb.scale[0]])
        common = {"a_bits": int(qa.dtype[3:]), "b_bits": int(qb.dtype[3:]), "axis": -1}
        for key, q in (("a_zero_point", qa), ("b_zero_point", qb)):
            if q.zero_point:
                common[key] = q.zero_point
        depth = (self.view.shapes.get(unit.main.input[0]) or [None])[-1]
        bound = None if not depth else float(_levels_span(qa) * _levels_span(qb) * depth)
        self._emit_accumulator(unit, "HzSQuantizedMatMul", [qa.name, qb.name], acc_scale, -1, common, bound)

    def _emit_accumulator(self, unit: Unit, op: str, inputs: list[str], acc_scale: np.ndarray, axis: int,
                          common: dict, bound: float | None = None) -> None:
        out = unit.outputs[0]
        lo, hi = self._activation_bounds(unit)
        calibrated = out in self.acts
        cpu = self._cpu_needs(out) or not calibrated
        name = unit.main.name
        if calibrated and not cpu:
            qt, oa = self._out_attrs(out, lo, hi)
            mult = _ratio(acc_scale, qt.scale)
            self.nodes.append(helper.make_node(op, inputs, [qt.name], name=name, domain=DOMAIN,
                                               multiplier=mult, **oa, **common))
            self._record(out, qt)
            return
        # int32 accumulator: dequantized exactly for CPU users / outputs, requantized for BPU users.
        # With int16 operands the sum can exceed int32: drop low bits (a power-of-two multiplier) so
        # it never saturates; the result keeps ~31 significant bits.
        shift = 0
        if bound is not None and bound > 2**31 - 1:
            shift = int(np.ceil(np.log2(bound / (2**31 - 1))))
        acc_scale = acc_scale * 2.0**shift
        acc_tensor = unit.activation.input[0] if unit.activation is not None else out
        acc = QTensor(f"{acc_tensor}_int32", "int32", acc_scale, axis)
        self.nodes.append(helper.make_node(op, inputs, [acc.name], name=name, domain=DOMAIN, multiplier=[2.0**-shift],
                                           out_type="int32", out_min=float(-(2**31)), out_max=float(2**31 - 1),
                                           **common))
        self._record(acc_tensor, acc)
        self.need_float(acc_tensor)
        if unit.activation is not None:
            self.nodes.append(unit.activation)
            self.floats.update(unit.activation.output)
        if calibrated:
            qt, oa = self._out_attrs(out, lo, hi)
            mult = _ratio(acc_scale, qt.scale)
            self.nodes.append(helper.make_node("HzRequantize", [acc.name], [qt.name], name=f"{name}_HzRequantize",
                                               domain=DOMAIN, multiplier=mult, axis=axis, **oa))
            self._record(out, qt)

    def _activation_bounds(self, unit: Unit) -> tuple[float | None, float | None]:
        act = unit.activation
        if act is None:
            return None, None
        if act.op_type == "Relu":
            return 0.0, None
        vals = [self.view.const(i) for i in act.input[1:3]]
        a = self.view.attrs(act)
        lo = float(vals[0]) if len(vals) > 0 and vals[0] is not None else a.get("min")
        hi = float(vals[1]) if len(vals) > 1 and vals[1] is not None else a.get("max")
        return lo, hi

    def _unit_lut(self, unit: Unit) -> None:
        xq = _per_tensor(self.need_q(unit.inputs[0]), unit.main.name)
        out = unit.outputs[0]
        qt, oa = self._out_attrs(out)
        in_bits = int(xq.dtype[3:])
        levels = np.arange(-(1 << (in_bits - 1)), 1 << (in_bits - 1), dtype=np.float64)
        y = self._evaluate_cluster(unit, ((levels - xq.zero_point) * xq.scale[0]).astype(np.float32))
        rounded = np.round(y.astype(np.float64) / qt.scale[0]) + qt.zero_point
        # inf saturates in the clip; NaN (a function undefined at some input level) has no grid value: 0
        table = np.clip(np.where(np.isnan(rounded), qt.zero_point, rounded), oa["out_min"], oa["out_max"])
        self.nodes.append(helper.make_node("HzLut", [xq.name], [qt.name], name=unit.main.name, domain=DOMAIN,
                                           table=[int(v) for v in table], in_min=int(levels[0]),
                                           out_type=qt.dtype))  # zero points live in the table
        self._record(out, qt)

    def _evaluate_cluster(self, unit: Unit, x: np.ndarray) -> np.ndarray:
        """Run the float nodes of a LUT unit on every input level (onnxruntime does the maths)."""
        root, out = unit.inputs[0], unit.outputs[0]
        used = {i for n in unit.nodes for i in n.input}
        inits = [t for t in self.src.graph.initializer if t.name in used]
        graph = helper.make_graph(unit.nodes, "lut", [helper.make_tensor_value_info(root, TensorProto.FLOAT, [None])],
                                  [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)], inits)
        model = helper.make_model(graph, opset_imports=[o for o in self.src.opset_import if o.domain in ("", "ai.onnx")])
        model.ir_version = self.src.ir_version
        return make_session(model).run([out], {root: x})[0].reshape(-1)

    def _unit_eltwise(self, unit: Unit) -> None:
        node = unit.main
        qa, qb = (_per_tensor(self.need_q(t), node.name) for t in node.input[:2])
        out = unit.outputs[0]
        qt, oa = self._out_attrs(out)
        sy = qt.scale[0]
        for key, q in (("a_zero_point", qa), ("b_zero_point", qb)):
            if q.zero_point:
                oa[key] = q.zero_point
        if node.op_type == "Mul":
            attrs = {"mode": "mul", "multiplier": [float(qa.scale[0] * qb.scale[0] / sy)]}
        else:
            sign = -1.0 if node.op_type == "Sub" else 1.0
            attrs = {"mode": "add", "a_multiplier": float(qa.scale[0] / sy),
                     "b_multiplier": float(sign * qb.scale[0] / sy), "multiplier": [1.0]}
        self.nodes.append(helper.make_node("HzSQuantizedEltwise", [qa.name, qb.name], [qt.name], name=node.name,
                                           domain=DOMAIN, **attrs, **oa))
        self._record(out, qt)

    def _unit_pool(self, unit: Unit) -> None:
        node = unit.main
        xq = _per_tensor(self.need_q(unit.inputs[0]), node.name)
        out = unit.outputs[0]
        qt, oa = self._out_attrs(out)
        if xq.zero_point:
            oa["x_zero_point"] = xq.zero_point
        shape = self.view.shapes.get(node.input[0])
        a = self.view.attrs(node)
        if node.op_type == "GlobalAveragePool":
            window = int(np.prod(shape[2:]))
            extra = {"kind": "GlobalAveragePool"}
        else:
            window = int(np.prod(a["kernel_shape"]))
            extra = {"kind": "AveragePool", "channels": int(shape[1]), "x_bits": int(xq.dtype[3:]),
                     **{k: a[k] for k in ("kernel_shape", "strides", "pads") if k in a}}
        mult = [float(xq.scale[0] / (qt.scale[0] * window))]
        self.nodes.append(helper.make_node("HzSQuantizedPool", [xq.name], [qt.name], name=node.name, domain=DOMAIN,
                                           multiplier=mult, **extra, **oa))
        self._record(out, qt)

    def _unit_passive(self, unit: Unit) -> None:
        node = unit.main
        xq = self.need_q(unit.inputs[0])
        outs = [f"{o}_quantized" for o in node.output]
        copy = helper.make_node(node.op_type, [xq.name, *node.input[1:]], outs, name=node.name)
        copy.attribute.extend(node.attribute)
        opset = next((o.version for o in self.src.opset_import if o.domain in ("", "ai.onnx")), 0)
        if node.op_type == "GlobalMaxPool" or (node.op_type in ("MaxPool", "Resize") and
                                                 (xq.dtype == "int16" or opset < 13)):
            # No int16 (or, before opset 12/13, int8; GlobalMaxPool: no integer) kernels for these in
            # onnxruntime; integers survive a float32 round trip.
            xf = f"{xq.name}_as_float"
            if xf not in self.floats:  # one Cast however many passive nodes read the tensor
                self.nodes.append(helper.make_node("Cast", [xq.name], [xf], name=f"{xf}_Cast", to=TensorProto.FLOAT))
                self.floats.add(xf)
            copy.input[0] = xf
            copy.output[0] = f"{node.output[0]}_float_int16"
            self.nodes.append(copy)
            self.nodes.append(helper.make_node("Cast", [copy.output[0]], [outs[0]], name=f"{outs[0]}_Cast",
                                               to=TensorProto.INT16 if xq.dtype == "int16" else TensorProto.INT8))
        else:
            self.nodes.append(copy)
        for o, qo in zip(node.output, outs, strict=True):
            self._record(o, QTensor(qo, xq.dtype, xq.scale, xq.axis, xq.zero_point))

    def _unit_concat(self, unit: Unit) -> None:
        node = unit.main
        qs = [_per_tensor(self.need_q(t), node.name) for t in node.input]
        out = unit.outputs[0]
        qt, oa = self._out_attrs(out)
        mult = [float(q.scale[0] / qt.scale[0]) for q in qs]
        if any(q.zero_point for q in qs):
            oa["zero_points"] = [q.zero_point for q in qs]
        self.nodes.append(helper.make_node("HzSQuantizedConcat", [q.name for q in qs], [qt.name], name=node.name,
                                           domain=DOMAIN, multipliers=mult, in_types=[q.dtype for q in qs],
                                           concat_axis=self.view.attrs(node).get("axis", 1), **oa))
        self._record(out, qt)
