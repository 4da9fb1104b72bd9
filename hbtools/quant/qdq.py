"""calibration_type 'load': take thresholds from a QDQ model (QAT export) and strip its Q/DQ pairs.

An activation pair ``QuantizeLinear -> DequantizeLinear`` on tensor T becomes plain T with
threshold ``scale * 127``; a weight ``DequantizeLinear(integer constant)`` becomes the float
constant it stands for, ``(q - zero_point) * scale``. A pair on an asymmetric or unsigned grid (onnxruntime's
``quantize_static`` writes uint8 activations with a zero point; no zero point means uint8 too) has no symmetric
int8 form: its threshold is the larger end of the range the pair clips to (the step is at most twice the
pair's), and a Clip to that range takes its place, since the pair may do the work of an activation the
quantizer removed (a Relu before a uint8 pair with zero point 0).
"""

from __future__ import annotations

import logging

import numpy as np
from onnx import ModelProto, NodeProto, TensorProto, helper, numpy_helper

from hbtools.errors import HbError
from hbtools.graph.graph import GraphView, remove_dead_nodes, topological_sort
from hbtools.ops.base import attrs_of
from hbtools.runtime.session import ort_session

log = logging.getLogger("hbtools")


# onnxruntime writes Q/DQ in its own domain with UseQDQContribOps (and for 16-bit grids before opset 21)
QDQ_DOMAINS = ("", "ai.onnx", "com.microsoft")


def _is_q(node: NodeProto) -> bool:
    return node.op_type == "QuantizeLinear" and node.domain in QDQ_DOMAINS


def _is_dq(node: NodeProto) -> bool:
    return node.op_type == "DequantizeLinear" and node.domain in QDQ_DOMAINS


def activation_pairs(model: ModelProto) -> int:
    """How many QuantizeLinear -> DequantizeLinear pairs quantize a computed tensor: the form of a QDQ (QAT) export."""
    quantized = {n.output[0] for n in model.graph.node if _is_q(n)}
    return sum(_is_dq(n) and n.input[0] in quantized for n in model.graph.node)


def quantized_weights(model: ModelProto) -> int:
    """How many DequantizeLinear nodes read an integer constant (a weight stored quantized)."""
    view = GraphView(model)
    return sum(_is_dq(n) and view.is_const(n.input[0]) for n in model.graph.node)


# ops whose output a constant input does not determine
_NOT_FOLDED = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
                         "Bernoulli"})


def fold_quantization_parameters(model: ModelProto) -> int:
    """Make the scales, zero points and integer weights of the Q/DQ nodes initializers where nodes compute them
    from constants: ``torch.onnx.export`` writes them as ``Constant`` nodes, shares one through an ``Identity``,
    and computes a weight's scale from the weight (``Abs``, ``ReduceMax``, ``Div``). onnxruntime evaluates those
    nodes once; the Q/DQ nodes themselves are not folded (load reads them). Returns how many were folded."""
    graph = model.graph
    constant = {t.name for t in graph.initializer}
    computed: dict[str, NodeProto] = {}
    for node in graph.node:  # in order: the model is sorted at parse
        ins = [i for i in node.input if i]
        if _is_q(node) or _is_dq(node) or node.op_type in _NOT_FOLDED or node.domain not in ("", "ai.onnx") \
                or not all(i in constant for i in ins) or (not ins and node.op_type != "Constant"):
            continue
        constant.update(node.output)
        computed.update({o: node for o in node.output})
    wanted = list(dict.fromkeys(t for n in graph.node if _is_q(n) or _is_dq(n) for t in n.input if t in computed))
    if not wanted:
        return 0
    producers = list({id(computed[t]): computed[t] for t in wanted}.values())
    outputs = list(dict.fromkeys(o for n in producers for o in n.output if o))
    probe = ModelProto()
    probe.CopyFrom(model)
    del probe.graph.input[:], probe.graph.output[:], probe.graph.value_info[:]
    probe.graph.output.extend(helper.make_empty_tensor_value_info(o) for o in outputs)
    remove_dead_nodes(probe)
    session = ort_session(probe)
    types = {o.name: o.type for o in session.get_outputs()}
    values = session.run(outputs, {})
    drop = {id(n) for n in producers}
    kept = [n for n in graph.node if id(n) not in drop]
    del graph.node[:]
    graph.node.extend(kept)
    graph.initializer.extend(_initializer(o, np.asarray(v), types[o]) for o, v in zip(outputs, values, strict=True))
    remove_dead_nodes(model)
    return len(wanted)


def _initializer(name: str, value: np.ndarray, ort_type: str) -> TensorProto:
    """``value`` as an initializer of the type onnxruntime gave it: a float8 or 4-bit tensor arrives as the bytes
    of another numpy type (a float8 zero point as uint8), which its own type must keep."""
    kind = ort_type.removeprefix("tensor(").removesuffix(")").upper()
    elem = getattr(TensorProto, kind, None)
    if elem is None or elem == helper.np_dtype_to_tensor_dtype(value.dtype):
        return numpy_helper.from_array(value, name)
    return helper.make_tensor(name, elem, value.shape, value.tobytes(), raw=True)


# onnxruntime's quantized operator format (quantize_static QOperator, quantize_dynamic): integer ops
# that take quantized tensors and their scales. They have no BPU form and no float meaning load could take.
INTEGER_OPS = frozenset({"ConvInteger", "MatMulInteger", "QLinearConv", "QLinearMatMul", "DynamicQuantizeLinear",
                         "DynamicQuantizeLSTM", "DynamicQuantizeMatMul", "MatMulIntegerToFloat", "QLinearAdd",
                         "QLinearMul", "QLinearSigmoid", "QLinearLeakyRelu", "QLinearGlobalAveragePool",
                         "QLinearAveragePool", "QLinearConcat", "QLinearSoftmax", "QLinearReduceMean", "QGemm",
                         "QAttention", "QEmbedLayerNormalization"})


def integer_ops(model: ModelProto) -> dict[str, int]:
    """How many nodes of each of onnxruntime's quantized operator types the model has (none: not such a model)."""
    counts: dict[str, int] = {}
    for node in model.graph.node:
        if node.op_type in INTEGER_OPS and node.domain in ("", "ai.onnx", "com.microsoft"):
            counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts


def _zero_point(view: GraphView, node) -> np.ndarray:
    """A Q/DQ node's zero point; ONNX's default is uint8 0."""
    if len(node.input) > 2 and node.input[2]:
        zero = view.const(node.input[2])
        if zero is None:
            raise HbError(f"calibration_type load: {node.op_type} {node.name} has a non-constant zero point")
        return zero
    return np.zeros((), np.uint8)


# the largest magnitudes of the 8-bit float grids (onnx's float8 types, as numpy's ml_dtypes names them) and the
# ranges of the 4-bit integer ones, which np.iinfo does not know
_OTHER_LEVELS = {"float8_e4m3fn": (-448.0, 448.0), "float8_e4m3fnuz": (-240.0, 240.0),
                 "float8_e5m2": (-57344.0, 57344.0), "float8_e5m2fnuz": (-57344.0, 57344.0),
                 "int4": (-8, 7), "uint4": (0, 15)}


def _levels(dtype: np.dtype, node: NodeProto) -> tuple[float, float]:
    """The smallest and largest value of a Q/DQ node's quantized type."""
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return info.min, info.max
    if dtype.name in _OTHER_LEVELS:
        return _OTHER_LEVELS[dtype.name]
    raise HbError(f"calibration_type load: {node.op_type} {node.name} quantizes to {dtype.name}, which hbtools does "
                  f"not read", hint="convert the float model the QDQ model was made from")


def _pair_grid(scale: np.ndarray, zero: np.ndarray, node: NodeProto) -> tuple[float, float, float]:
    """An activation pair's range ``[(qmin - z) * s, (qmax - z) * s]`` and its symmetric threshold: ``scale * 127``
    on a symmetric int8 grid (``scale * 32767`` on an int16 one), otherwise the larger end of the range (float8
    grids: their largest value times the scale)."""
    qmin, qmax = _levels(zero.dtype, node)
    s = np.broadcast_to(scale.astype(np.float64), np.broadcast_shapes(scale.shape, zero.shape))
    z = np.broadcast_to(zero.astype(np.float64), s.shape)
    if _symmetric(zero):
        threshold = float(np.max(s)) * qmax
        return -threshold, threshold, threshold
    low, high = float(np.min((qmin - z) * s)), float(np.max((qmax - z) * s))
    return low, high, max(-low, high)


def _symmetric(zero: np.ndarray) -> bool:
    """A signed 8- or 16-bit grid with zero point 0: the BPU's own (its most negative level, -128 or -32768,
    aside: the BPU clips to -127 and -32767)."""
    return zero.dtype in (np.int8, np.int16) and not np.any(zero)


def _per_axis(values: np.ndarray, node: NodeProto, w: np.ndarray) -> np.ndarray:
    """A DequantizeLinear's scale or zero point laid out to broadcast over its integer weight ``w``: per axis,
    or per block of ``block_size`` along the axis (opset 21: onnxruntime's block-wise weight quantizers)."""
    if values.size <= 1:
        return values
    attrs = attrs_of(node)
    axis = int(attrs.get("axis", 1)) % w.ndim
    block = int(attrs.get("block_size", 0))
    if block > 0:
        return np.repeat(values, block, axis=axis).take(range(w.shape[axis]), axis=axis)
    shape = [1] * w.ndim
    shape[axis] = -1
    return values.reshape(shape)


def strip_qdq(model: ModelProto, int16: set[str] | None = None) -> dict[str, float]:
    """Remove Q/DQ nodes in place; return activation thresholds by float tensor name, and add to ``int16`` the
    tensors of 16-bit pairs (signed or not, with or without a zero point)."""
    view = GraphView(model)
    thresholds: dict[str, float] = {}
    rename: dict[str, str] = {}  # a pair's output -> the tensor it quantized
    outputs = {o.name for o in model.graph.output}
    inputs = {i.name for i in model.graph.input}
    # A pair that ends in a model output: the tensor it quantized takes the output's name (outputs keep
    # their names, SPEC §6); a model input or another output cannot be renamed, so an Identity joins them.
    renamed_output: dict[str, str] = {}  # the tensor a pair quantized -> the model output it becomes
    joins = []
    drop: set[str] = set()
    new_inits = []
    widened = 0  # activation pairs on an asymmetric or unsigned grid
    eight_bit_floats = 0  # ... on a float8 grid
    for node in model.graph.node:
        if not _is_dq(node):
            continue
        scale = view.const(node.input[1])
        if scale is None:
            raise HbError(f"calibration_type load: DequantizeLinear {node.name} has a non-constant scale")
        zero = _zero_point(view, node)
        source = node.input[0]
        q = view.producer.get(source)
        if view.is_const(source):  # weight: fold back to float
            integers = view.const(source)
            w = integers.astype(np.float32)
            s = _per_axis(scale.astype(np.float32), node, integers)
            z = _per_axis(zero.astype(np.float32), node, integers)
            new_inits.append(numpy_helper.from_array((w - z) * s, node.output[0]))
            drop.add(node.name)
        elif q is not None and _is_q(q):
            tensor = q.input[0]
            if not np.all(np.isfinite(scale)) or np.any(scale <= 0):
                bad = next(float(v) for v in scale.reshape(-1) if not np.isfinite(v) or v <= 0)
                raise HbError(f"calibration_type load: the QuantizeLinear -> DequantizeLinear pair on '{tensor}' "
                              f"({node.name}) has scale {bad:g}; an activation's scale must be a positive, finite "
                              "number", hint="quantize the float model again (the tool that wrote the QDQ model "
                              "calibrates the scale), or convert it with another calibration_type")
            low, high, threshold = _pair_grid(scale, zero, node)
            out = node.output[0]
            if zero.dtype.name.startswith("float8"):
                eight_bit_floats += 1
            else:
                widened += not _symmetric(zero)
                if zero.dtype in (np.int16, np.uint16) and int16 is not None:
                    # a 16-bit pair asks for an int16 grid whatever its zero point (onnxruntime's QInt16 and
                    # QUInt16 activations are asymmetric by default): an int8 one would lose 8 of its bits
                    int16.update({tensor, out})
            if low > -threshold * (1 - 1e-6) or high < threshold * (1 - 1e-6):
                # The pair clips one end of the range short of the threshold: onnxruntime's quantizer drops a
                # Relu (or Clip) before a uint8 pair with zero point 0, which then does its work. A Clip keeps it.
                bounds = [f"{node.name}_clip_min", f"{node.name}_clip_max"]
                new_inits += [numpy_helper.from_array(np.array(v, np.float32), b)
                              for v, b in zip((low, high), bounds, strict=True)]
                joins.append(helper.make_node("Clip", [tensor, *bounds], [out], name=f"{node.name}_clip"))
                thresholds[tensor] = thresholds[out] = threshold
            elif out not in outputs:
                thresholds[tensor] = threshold
                rename[out] = tensor
            elif tensor in inputs or tensor in outputs or tensor in renamed_output or view.is_const(tensor):
                thresholds[out] = threshold
                joins.append(helper.make_node("Identity", [tensor], [out], name=f"{node.name}_identity"))
            else:
                thresholds[out] = threshold
                renamed_output[tensor] = out
            drop.update({node.name, q.name})
    if not drop:
        counts = integer_ops(model)
        if counts:  # onnxruntime's quantize_dynamic or QOperator format: integer operators, no pairs to read
            listed = ", ".join(f"{n} {op}" for op, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
            raise HbError(f"calibration_type load reads QDQ models (QuantizeLinear/DequantizeLinear pairs); this one "
                          f"was quantized into onnxruntime's integer operators instead ({listed})",
                          hint="convert the float model it was made from (before quantize_dynamic / quantize_static) "
                               "with calibration_type default; another calibration_type converts this one with those "
                               "operators on the CPU")
        raise HbError("calibration_type load needs a QDQ model (QuantizeLinear/DequantizeLinear pairs); none found",
                      hint="use another calibration_type for a float model")
    if widened:
        log.warning("calibration_type load: %d QuantizeLinear -> DequantizeLinear pair(s) quantize to an asymmetric "
                    "or unsigned grid (a zero point, or uint8 as onnxruntime's quantize_static writes); the BPU's "
                    "int8 and int16 grids are symmetric: each takes the threshold of the larger end of the range it "
                    "clips to, and a Clip to that range (up to twice the pair's step); where the float model the QDQ "
                    "model was made from is at hand, converting it (calibration_type default) fits the BPU's grids "
                    "instead",
                    widened)
    if eight_bit_floats:
        log.warning("calibration_type load: %d QuantizeLinear -> DequantizeLinear pair(s) quantize to a float8 grid, "
                    "which the BPU does not have: each tensor takes its pair's range (the grid's largest value times "
                    "its scale) on an int8 or int16 grid", eight_bit_floats)
    kept = [n for n in model.graph.node if n.name not in drop]
    del model.graph.node[:]
    model.graph.node.extend([*kept, *joins])
    model.graph.initializer.extend(new_inits)

    def final(name: str) -> str:
        name = rename.get(name, name)
        return renamed_output.get(name, name)

    for node in model.graph.node:
        for k, i in enumerate(node.input):
            node.input[k] = final(i)
        for k, o in enumerate(node.output):
            node.output[k] = renamed_output.get(o, o)
    for vi in model.graph.value_info:
        vi.name = renamed_output.get(vi.name, vi.name)
    topological_sort(model)
    remove_dead_nodes(model)
    return thresholds
