"""Softmax on the BPU: an exp lookup table, an integer sum, a float64 division.

``HzSQuantizedSoftmax`` (quantized model), along ``axis`` of integer input ``x``:

    d = x - max(x)                          integers in [-(n - 1), 0] (the zero point cancels)
    e = table[max(d + n - 1, 0)]            table[k] = round(exp((k - n + 1) * x_scale) * 2**15)
    S = sum(e)                              exact integer sum
    y = clip(round((e / S) / out_scale) + zero_point, out_min, out_max)

``n`` is the table length: the input type's level count, less the leading entries
equal to ``table[0]`` (exp rounds to 0 long before the end of an int16 range), which
the clamp at 0 stands for; older files hold all of them. The two divisions are
float64, round half to even. The numpy reference and the ONNX lowering compute the
same IEEE operations on the same integers, so they agree bit for bit.

The table is computed by onnxruntime from the ops ``exp_levels`` builds (Mul by the
step, Exp, Mul by 2**15, Round, all float64). The calibrated model emulates the kernel
with ``HzSoftmax``: in place of a Softmax the BPU runs, its lowering builds the same
table with the same ops over the same differences and reads it at the input's float64
twin levels (``hbtools.ops.twins``), then ``e / S``; the output's fake quant divides that
by the step, as the kernel does. Where the twin levels are not whole numbers of a grid
the ops apply per element instead. Without twins (a debugger's piecewise model) it is the
float Softmax.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from onnx import NodeProto, TensorProto, helper

from hbtools.ops import twins, uint8_kernels
from hbtools.ops.base import REQUIRED, HzOp, LoweringContext, add_node, fresh_name, reduce_keepdims
from hbtools.ops.quantized import (
    NUMPY_INT,
    OUTPUT_ATTRS,
    output_levels,
    packed_table,
    remembered,
    table_of,
    varying_part,
)
from hbtools.ops.registry import register
from hbtools.quant import grids

EXP_ONE = 2.0**15  # exp(0) in table levels


def exp_levels(d: str, step: str, hint: str, unique, nodes: list[NodeProto]) -> str:  # noqa: ANN001 - a name maker
    """float64 ``round(exp(d * step) * 2**15)`` of float64 tensors ``d`` and ``step``: the table's formula."""
    names = []
    for op, inputs in (("Mul", [d, step]), ("Exp", [None]), ("Mul", [None, "one"]), ("Round", [None])):
        out = unique(f"{hint}_exp_{op.lower()}")
        ins = [names[-1] if i is None else i for i in inputs]
        if "one" in ins:
            ins[ins.index("one")] = unique(f"{hint}_exp_one")
            nodes.append(helper.make_node("Constant", [], [ins[-1]], name=ins[-1],
                                          value=helper.make_tensor("v", TensorProto.DOUBLE, [], [EXP_ONE])))
        nodes.append(helper.make_node(op, ins, [out], name=out))
        names.append(out)
    return names[-1]


def exp_table(step: float, bits: int) -> list[int]:
    """``table[k]`` for ``d = k - n + 1`` over the differences of two ``bits``-bit levels where it varies."""
    from hbtools.runtime.session import make_session

    n = 2**bits
    taken: set[str] = set()
    nodes: list[NodeProto] = []
    out = exp_levels("d", "step", "t", lambda hint: fresh_name(hint, taken), nodes)
    graph = helper.make_graph(nodes, "exp_table", [helper.make_tensor_value_info("d", TensorProto.DOUBLE, [n]),
                                                   helper.make_tensor_value_info("step", TensorProto.DOUBLE, [])],
                              [helper.make_tensor_value_info(out, TensorProto.DOUBLE, [n])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    d = np.arange(-(n - 1), 1, dtype=np.float64)
    levels = make_session(model).run([out], {"d": d, "step": np.array(float(np.float32(step)))})[0]
    start, _ = varying_part(levels)
    return [int(v) for v in levels[start:]]


def softmax_axis(node: NodeProto, opset: int) -> int:
    """A Softmax or LogSoftmax node's axis (its default changed at opset 13)."""
    a = {x.name: helper.get_attribute_value(x) for x in node.attribute}
    return int(a.get("axis", -1 if opset >= 13 else 1))


def _double(ctx: LoweringContext, hint: str, key: str, value: float) -> str:
    return ctx.constant(f"{hint}_{key}", np.array(value, dtype=np.float64))


def _table_exp(ctx: LoweringContext, x: str, table: np.ndarray, axis: int, hint: str,
               nodes: list[NodeProto]) -> tuple[Callable[[], str], str]:
    """The integer kernels' ``d = x - max(x)`` along ``axis`` (a thunk giving it as float64) and
    ``table[max(d + n - 1, 0)]`` (float64), as Softmax and LogSoftmax share them.

    The index is ``max(x - (max(x) - n + 1), 0)`` in int32 (from opset 12, where onnxruntime has an int32
    Max): two passes over the tensor, where the float64 chain took five."""
    n = table.size
    lookup_table = ctx.constant(f"{hint}_table", table)
    e = ctx.unique(f"{hint}_exp")
    if ctx.opset >= 12:
        x32 = add_node(ctx, "Cast", [x], hint, nodes, to=TensorProto.INT32)
        peak = reduce_keepdims(ctx, "ReduceMax", x32, [axis], hint, nodes)
        first = add_node(ctx, "Sub", [peak, ctx.constant(f"{hint}_offset", np.array(n - 1, np.int32))], hint, nodes)
        # the table may start where exp varies: differences below it take its first entry
        index = add_node(ctx, "Max", [add_node(ctx, "Sub", [x32, first], hint, nodes),
                                      ctx.constant(f"{hint}_first", np.array(0, np.int32))], hint, nodes)
        uint8_kernels.lookup(ctx, lookup_table, index, e, nodes)
        return (lambda: add_node(ctx, "Cast", [add_node(ctx, "Sub", [x32, peak], hint, nodes)], hint, nodes,
                                 to=TensorProto.DOUBLE)), e
    x = twins.to_double(ctx, x, hint, nodes)
    d = add_node(ctx, "Sub", [x, reduce_keepdims(ctx, "ReduceMax", x, [axis], hint, nodes)], hint, nodes)
    idx = add_node(ctx, "Add", [d, _double(ctx, hint, "offset", n - 1.0)], hint, nodes)
    idx = add_node(ctx, "Max", [idx, _double(ctx, hint, "first", 0.0)], hint, nodes)
    uint8_kernels.lookup(ctx, lookup_table, add_node(ctx, "Cast", [idx], hint, nodes, to=TensorProto.INT64), e, nodes)
    return (lambda: d), e


def _np_table_exp(x: np.ndarray, table: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """``_table_exp`` in numpy: (d, table[d])."""
    x = x.astype(np.int64)
    d = x - x.max(axis=axis, keepdims=True)
    return d, table[np.maximum(d + table.size - 1, 0)]


def _twin_exp(ctx: LoweringContext, src, x: str, axis: int, hint: str,  # noqa: ANN001
              nodes: list[NodeProto]) -> tuple[Callable[[], str], str]:
    """On the calibrated model's float64 twin levels ``src`` of ``x``: the differences ``d = levels - max``
    (a thunk: the table path makes them only if asked) and their exp levels.

    Where the levels are whole numbers of an 8- or 16-bit grid, the exp levels come from the kernel's
    table, built by the same ops over the same differences as ``exp_table`` builds it and read at
    ``d + n - 1``: the same bits by
    construction, and one exp per table entry instead of one per element. A constant step makes the
    table a constant (onnxruntime folds it); a fed step (threshold searches: any grid up to 16 bits) builds
    it at run time, where the tensor has more elements than the table. Elsewhere: the formula per element."""
    peak = reduce_keepdims(ctx, "ReduceMax", src.levels, [axis], hint, nodes)
    bits = 16 if ctx.feed_calibration else src.bits
    whole = src.bits in (8, 16)
    elements = ctx.elements(x)
    fed = ctx.known(src.step) is None
    if not whole or (fed and elements <= 2**bits):
        d = add_node(ctx, "Sub", [src.levels, peak], hint, nodes)
        return (lambda: d), exp_levels(d, src.step, hint, ctx.unique, nodes)
    n = 2**bits
    differences = ctx.constant(f"{hint}_differences", np.arange(-(n - 1), 1, dtype=np.float64))
    table = exp_levels(differences, src.step, f"{hint}_table", ctx.unique, nodes)
    # The index d + n - 1 as levels - (max - (n - 1)): one pass over the tensor. Levels of an int8 or int16
    # grid differ by less than n, so it never needs the kernel's clamp at 0.
    first = add_node(ctx, "Sub", [peak, _double(ctx, hint, "offset", n - 1.0)], hint, nodes)
    index = add_node(ctx, "Cast", [add_node(ctx, "Sub", [src.levels, first], hint, nodes)], hint, nodes,
                     to=TensorProto.INT64)
    e = ctx.unique(f"{hint}_exp")
    uint8_kernels.lookup(ctx, table, index, e, nodes)
    return (lambda: add_node(ctx, "Sub", [src.levels, peak], hint, nodes)), e


@register
class HzSQuantizedSoftmax(HzOp):
    op_type = "HzSQuantizedSoftmax"
    attributes = {"axis": REQUIRED, "table": REQUIRED, "out_scale": REQUIRED, **OUTPUT_ATTRS}
    double_attributes = ("out_scale",)
    shape_preserving = True
    unit_kind = "softmax"
    onnx_ops = ("Softmax",)
    calibrated_op = "HzSoftmax"
    int16_input = True

    @classmethod
    def refusal(cls, node: NodeProto, view) -> str:  # noqa: ANN001 - GraphView lives above ops/
        from hbtools.graph.model_io import default_opset

        opset = default_opset(view.model)
        shape = view.shapes.get(node.input[0])
        if shape is None:
            return f"{node.op_type} of a tensor of unknown rank has no BPU form in hbtools"
        axis = softmax_axis(node, opset) % len(shape)
        # Before opset 13 the axes from ``axis`` on are flattened into one: over trailing axes of size 1
        # (a classifier's [N, C, 1, 1] after a global pool) that is the softmax over ``axis`` alone.
        if opset < 13 and any(d != 1 for d in shape[axis + 1:]):
            return f"{node.op_type} before opset 13 over more than its last axis has no BPU form in hbtools"
        return ""

    @classmethod
    def emit(cls, state, unit) -> None:  # noqa: ANN001 - EmitState and Unit live above ops/
        from hbtools.graph.model_io import default_opset
        from hbtools.quant.emitters.state import per_tensor

        node = unit.main
        xq = per_tensor(state.need_q(unit.inputs[0]), node.name)
        qt, out = state.out_attrs(unit.outputs[0])
        axis = softmax_axis(node, default_opset(state.src))
        state.nodes.append(cls.make_node([xq.name], [qt.name], node.name, axis=axis,
                                         table=packed_table(exp_table(float(xq.scale[0]), xq.bits)),
                                         out_scale=[float(qt.scale[0])], **out))
        state.record(unit.outputs[0], qt)

    @classmethod
    def lower(cls, node: NodeProto, ctx: LoweringContext) -> list[NodeProto]:
        a = cls.read(node)
        nodes: list[NodeProto] = []
        hint, axis = node.name, int(a["axis"])
        table = table_of(node).astype(np.float64)

        _, e = _table_exp(ctx, node.input[0], table, axis, hint, nodes)
        p = add_node(ctx, "Div", [e, reduce_keepdims(ctx, "ReduceSum", e, [axis], hint, nodes)], hint, nodes)
        q = add_node(ctx, "Div", [p, _double(ctx, hint, "out_scale", a["out_scale"][0])], hint, nodes)
        q = add_node(ctx, "Round", [q], hint, nodes)
        output_levels(ctx, q, a, node.output[0], hint, nodes)
        return nodes

    @classmethod
    def _decoded(cls, node: NodeProto) -> tuple[dict, np.ndarray]:
        return cls.read(node), table_of(node).astype(np.float64)

    @classmethod
    def reference(cls, node: NodeProto, inputs: list[np.ndarray]) -> list[np.ndarray]:
        a, table = remembered(node, cls._decoded)
        _, e = _np_table_exp(inputs[0], table, a["axis"])
        p = e / e.sum(axis=a["axis"], keepdims=True)
        q = grids.requantize(p / np.float64(a["out_scale"][0]), 1.0, a["out_min"], a["out_max"], int(a["zero_point"]))
        return [q.astype(NUMPY_INT[a["out_type"]])]


@register
class HzSoftmax(HzOp):
    """The calibrated model's Softmax where the BPU runs it: the integer kernel's numerics on float64 twins."""

    op_type = "HzSoftmax"
    attributes = {"axis": REQUIRED}
    shape_preserving = True
    float_output = True
    float_op = "Softmax"

    @classmethod
    def lower(cls, node: NodeProto, ctx: LoweringContext) -> list[NodeProto]:
        axis = int(cls.read(node)["axis"])
        x, y = node.input[0], node.output[0]
        src = ctx.twins.get(x)
        if not ctx.exact or src is None or src.levels is None or not src.scalar_step:
            return [helper.make_node("Softmax", [x], [y], name=ctx.unique(node.name), axis=axis)]
        nodes: list[NodeProto] = []
        hint = node.name
        _, e = _twin_exp(ctx, src, x, axis, hint, nodes)
        p = add_node(ctx, "Div", [e, reduce_keepdims(ctx, "ReduceSum", e, [axis], hint, nodes)], hint, nodes)
        twins.to_float(ctx, p, y, nodes)
        ctx.twins[y] = twins.Twin(p)
        return nodes

    @classmethod
    def reference(cls, node: NodeProto, inputs: list[np.ndarray]) -> list[np.ndarray]:
        x = inputs[0].astype(np.float64)
        axis = int(cls.read(node)["axis"])
        e = np.exp(x - x.max(axis=axis, keepdims=True))
        return [(e / e.sum(axis=axis, keepdims=True)).astype(np.float32)]


# LogSoftmax: log(S / 2**15) without a transcendental function at run time (numpy's and onnxruntime's
# float64 Log differ in the last bit on a quarter of the values), from a table of log(1 + i / 1024).
LOG_STEPS = 1024
LN2 = 0.6931471805599453  # the float64 nearest ln 2
_POWERS = 2.0 ** np.arange(16, 53)  # S = 2**(15 + k) r with r in [1, 2): k counts the powers S reaches


def log_table() -> np.ndarray:
    """``log(1 + i / 1024)`` for i = 0..1024 (float64), stored in the kernel's ``log_table``."""
    return np.log1p(np.arange(LOG_STEPS + 1, dtype=np.float64) / LOG_STEPS)


def _np_log_sum(s: np.ndarray, table: np.ndarray) -> np.ndarray:
    """``log(s / 2**15)`` of float64 integer sums ``s >= 2**15``, as ``log_sum`` lowers it."""
    k = np.float64(_POWERS.size) - (s[None] < _POWERS.reshape((-1,) + (1,) * s.ndim)).astype(np.float64).sum(0)
    r = s * (2.0 ** -(15 + k))
    f = (r - 1.0) * np.float64(LOG_STEPS)
    i = np.floor(f)
    lo = table[i.astype(np.int64)]
    return (k * np.float64(LN2) + lo) + (f - i) * (table[i.astype(np.int64) + 1] - lo)


def log_sum(ctx: LoweringContext, s: str, rank: int, table: str, hint: str, nodes: list[NodeProto]) -> str:
    """float64 ``log(s / 2**15)`` of a tensor ``s`` of integer sums ``>= 2**15`` (below 2**53): ``s`` is
    ``2**(15 + k) r`` with r in [1, 2) (k counted by comparisons, the scaling exact), and ``log r`` is
    ``table`` (``log_table``) interpolated linearly: ``(k ln 2 + T[i]) + (f - i) (T[i + 1] - T[i])`` with
    ``f = (r - 1) 1024``, ``i = floor(f)``. Only +, -, *, Floor and lookups: every IEEE result is fixed,
    so onnxruntime and numpy agree bit for bit; within 2e-7 of ``log``. ``rank``: that of ``s``."""
    powers = ctx.constant(f"{hint}_powers", _POWERS.reshape((-1,) + (1,) * rank))
    below = add_node(ctx, "Cast", [add_node(ctx, "Less", [s, powers], hint, nodes)], hint, nodes,
                     to=TensorProto.DOUBLE)
    below = add_node(ctx, "Reshape", [reduce_keepdims(ctx, "ReduceSum", below, [0], hint, nodes),
                                      add_node(ctx, "Shape", [s], hint, nodes)], hint, nodes)
    k = add_node(ctx, "Sub", [ctx.constant(f"{hint}_npowers", np.array(float(_POWERS.size))), below], hint, nodes)
    scales = ctx.constant(f"{hint}_scales", 2.0 ** -(15 + np.arange(_POWERS.size + 1, dtype=np.float64)))
    scale = ctx.unique(f"{hint}_scale")
    uint8_kernels.lookup(ctx, scales, add_node(ctx, "Cast", [k], hint, nodes, to=TensorProto.INT64), scale, nodes)
    r = add_node(ctx, "Mul", [s, scale], hint, nodes)
    f = add_node(ctx, "Mul", [add_node(ctx, "Sub", [r, ctx.constant(f"{hint}_one", np.array(1.0))], hint, nodes),
                              ctx.constant(f"{hint}_steps", np.array(float(LOG_STEPS)))], hint, nodes)
    i = add_node(ctx, "Floor", [f], hint, nodes)
    index = add_node(ctx, "Cast", [i], hint, nodes, to=TensorProto.INT64)
    lo, hi = ctx.unique(f"{hint}_log_lo"), ctx.unique(f"{hint}_log_hi")
    uint8_kernels.lookup(ctx, table, index, lo, nodes)
    next_index = add_node(ctx, "Add", [index, ctx.constant(f"{hint}_next", np.array(1, dtype=np.int64))], hint, nodes)
    uint8_kernels.lookup(ctx, table, next_index, hi, nodes)
    base = add_node(ctx, "Add", [add_node(ctx, "Mul", [k, ctx.constant(f"{hint}_ln2", np.array(LN2))], hint, nodes),
                                 lo], hint, nodes)
    slope = add_node(ctx, "Sub", [hi, lo], hint, nodes)
    return add_node(ctx, "Add", [base, add_node(ctx, "Mul", [add_node(ctx, "Sub", [f, i], hint, nodes), slope],
                                                hint, nodes)], hint, nodes)


@register
class HzSQuantizedLogSoftmax(HzOp):
    """LogSoftmax on the BPU, along ``axis`` of integer input ``x``: Softmax's exp table and exact sum, then

        y = d * x_scale - log(S / 2**15)       d = x - max(x), S = sum(table[d]) as in HzSQuantizedSoftmax
        q = clip(round(y / out_scale) + zero_point, out_min, out_max)

    with ``log(S / 2**15)`` from ``log_table`` by ``log_sum`` (no transcendental function at run time), so
    the numpy reference and the ONNX lowering agree bit for bit. ``d * x_scale`` is exact knowledge of the
    input; only the sum goes through the exp table (2**-15 resolution), so the largest log-probabilities
    (greedy CTC decoding reads their argmax) keep the order of the input."""

    op_type = "HzSQuantizedLogSoftmax"
    attributes = {"axis": REQUIRED, "table": REQUIRED, "log_table": REQUIRED, "x_scale": REQUIRED,
                  "out_scale": REQUIRED, **OUTPUT_ATTRS}
    double_attributes = ("x_scale", "out_scale", "log_table")
    shape_preserving = True
    unit_kind = "logsoftmax"
    onnx_ops = ("LogSoftmax",)
    calibrated_op = "HzLogSoftmax"
    int16_input = True

    @classmethod
    def refusal(cls, node: NodeProto, view) -> str:  # noqa: ANN001 - GraphView lives above ops/
        return HzSQuantizedSoftmax.refusal(node, view)

    @classmethod
    def emit(cls, state, unit) -> None:  # noqa: ANN001 - EmitState and Unit live above ops/
        from hbtools.graph.model_io import default_opset
        from hbtools.quant.emitters.state import per_tensor

        node = unit.main
        xq = per_tensor(state.need_q(unit.inputs[0]), node.name)
        qt, out = state.out_attrs(unit.outputs[0])
        axis = softmax_axis(node, default_opset(state.src))
        step = float(np.float32(xq.scale[0]))  # the exp table's step
        state.nodes.append(cls.make_node([xq.name], [qt.name], node.name, axis=axis,
                                         table=packed_table(exp_table(step, xq.bits)), log_table=log_table(),
                                         x_scale=[step], out_scale=[float(qt.scale[0])], **out))
        state.record(unit.outputs[0], qt)

    @classmethod
    def lower(cls, node: NodeProto, ctx: LoweringContext) -> list[NodeProto]:
        a = cls.read(node)
        nodes: list[NodeProto] = []
        hint, axis = node.name, int(a["axis"])
        table = table_of(node).astype(np.float64)

        differences, e = _table_exp(ctx, node.input[0], table, axis, hint, nodes)
        s = reduce_keepdims(ctx, "ReduceSum", e, [axis], hint, nodes)
        logs = ctx.constant(f"{hint}_log_table", np.asarray(a["log_table"], dtype=np.float64))
        scaled = add_node(ctx, "Mul", [differences(), _double(ctx, hint, "x_scale", a["x_scale"][0])], hint, nodes)
        y = add_node(ctx, "Sub", [scaled, log_sum(ctx, s, ctx.rank(node.input[0]), logs, hint, nodes)], hint, nodes)
        q = add_node(ctx, "Round", [add_node(ctx, "Div", [y, _double(ctx, hint, "out_scale", a["out_scale"][0])],
                                             hint, nodes)], hint, nodes)
        output_levels(ctx, q, a, node.output[0], hint, nodes)
        return nodes

    @classmethod
    def _decoded(cls, node: NodeProto) -> tuple[dict, np.ndarray]:
        return cls.read(node), table_of(node).astype(np.float64)

    @classmethod
    def reference(cls, node: NodeProto, inputs: list[np.ndarray]) -> list[np.ndarray]:
        a, table = remembered(node, cls._decoded)
        d, e = _np_table_exp(inputs[0], table, a["axis"])
        s = e.sum(axis=a["axis"], keepdims=True)
        logs = np.asarray(a["log_table"], dtype=np.float64)
        y = d.astype(np.float64) * np.float64(a["x_scale"][0]) - _np_log_sum(s, logs)
        q = grids.requantize(y / np.float64(a["out_scale"][0]), 1.0, a["out_min"], a["out_max"], int(a["zero_point"]))
        return [q.astype(NUMPY_INT[a["out_type"]])]


@register
class HzLogSoftmax(HzOp):
    """The calibrated model's LogSoftmax where the BPU runs it: the integer kernel's numerics on float64 twins."""

    op_type = "HzLogSoftmax"
    attributes = {"axis": REQUIRED}
    shape_preserving = True
    float_output = True
    float_op = "LogSoftmax"

    @classmethod
    def lower(cls, node: NodeProto, ctx: LoweringContext) -> list[NodeProto]:
        axis = int(cls.read(node)["axis"])
        x, y = node.input[0], node.output[0]
        src = ctx.twins.get(x)
        if not ctx.exact or src is None or src.levels is None or not src.scalar_step:
            return [helper.make_node("LogSoftmax", [x], [y], name=ctx.unique(node.name), axis=axis)]
        nodes: list[NodeProto] = []
        hint = node.name
        differences, e = _twin_exp(ctx, src, x, axis, hint, nodes)
        s = reduce_keepdims(ctx, "ReduceSum", e, [axis], hint, nodes)
        logs = ctx.constant(f"{hint}_log_table", log_table())
        out = add_node(ctx, "Sub", [add_node(ctx, "Mul", [differences(), src.step], hint, nodes),
                                    log_sum(ctx, s, ctx.rank(x), logs, hint, nodes)], hint, nodes)
        twins.to_float(ctx, out, y, nodes)
        ctx.twins[y] = twins.Twin(out)
        return nodes

    @classmethod
    def reference(cls, node: NodeProto, inputs: list[np.ndarray]) -> list[np.ndarray]:
        x = inputs[0].astype(np.float64)
        axis = int(cls.read(node)["axis"])
        d = x - x.max(axis=axis, keepdims=True)
        return [(d - np.log(np.exp(d).sum(axis=axis, keepdims=True))).astype(np.float32)]
