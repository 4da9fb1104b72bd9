"""Layer normalization on the BPU: exact integer statistics, float64 normalization.

The optimize stage writes every layer normalization of a model (the ONNX
LayerNormalization op, or the ReduceMean / Sub / Pow / ReduceMean / Add / Sqrt / Div
pattern older exports spell out, over the last axes or over channels) as one
``HzLayerNorm`` node: ``x`` normalized over its ``axes`` (counted from the end), times
``scale``, plus ``bias`` (float32 constants broadcast against ``x``).

``HzSQuantizedLayerNorm`` (quantized model) computes it from integer input ``x`` over
the ``n`` values of each normalized group, with no rounding before the square root:

    D  = n * x - sum(x)                     int64, exact (the zero point cancels)
    S  = sum(D * D)                         int64, exact while n (n - 1)**2 (2**bits - 1)**2 < 2**63
    y  = D / sqrt(S / n + c) * scale + bias float64; c = n**2 * epsilon / x_scale**2
    q  = clip(round(y / out_scale) + zero_point, out_min, out_max)

That bound is n <= 1290 for int16 inputs (``MAX_GROUP_INT16``). A larger group (GroupNorm over a
feature map, LayerNorm over 1536 or 4096 channels) takes ``S / n`` around an integer mean instead,
so no integer grows with n**3:

    m  = round(sum(x) / n)                  float64 division, round half to even, back to int64
    e  = x - m                              int64, |e| <= 2**bits - 1 (m lies between min and max of x)
    t  = sum(e),  Q = sum(e * e)            int64, exact while n (2**bits - 1)**2 < 2**63 (n < 2**31 for int16)
    D  = n * e - t                          the same integer D as above
    y  = D / sqrt((Q * n - t * t) + c) * scale + bias   float64, in that order

(``Q * n - t * t`` is ``S / n``; its only roundings are float64 ones, and ``t * t`` is below
n**2, so nothing cancels.) The choice between the two forms depends on n alone, so a model's
kernel never changes with its inputs' values.

(``D / sqrt(S / n + c)`` is ``(x - mean) / sqrt(var + epsilon)`` in levels.) A linear
int8/int16 grid for the variance would lose the small variances next to large ones;
here only the input and the output are on grids. The numpy reference and the ONNX
lowering run the same IEEE operations on the same integers, so they agree bit for
bit, and the calibrated model's ``HzLayerNorm`` computes the same from its input's
float64 twin levels (``hbtools.ops.twins``). Without twins (the float models, a CPU
node, a debugger's piecewise model) ``HzLayerNorm`` is the float computation.
"""

from __future__ import annotations

import numpy as np
from onnx import NodeProto, TensorProto, helper

from hbtools.ops import twins
from hbtools.ops.base import REQUIRED, HzOp, LoweringContext, add_node, reduce_keepdims
from hbtools.ops.quantized import NUMPY_INT, OUTPUT_ATTRS, output_levels
from hbtools.ops.registry import register
from hbtools.quant import grids

INT64_LIMIT = 2**63


def max_group(bits: int) -> int:
    """The largest group ``n`` whose integer statistics stay exact in int64 for ``bits``-bit inputs."""
    span = 2**bits - 1
    n = 1
    while (n + 1) * n**2 * span**2 < INT64_LIMIT:
        n += 1
    return n


MAX_GROUP_INT16 = max_group(16)  # 1290: the kernel may read int16; beyond it, the form around an integer mean
MAX_GROUP_CENTERED = (INT64_LIMIT - 1) // (2**16 - 1) ** 2  # sum((x - m)**2) exact in int64 for int16 inputs


def group_size(shape: list | None, axes: list[int]) -> int | None:
    """How many values one normalization covers (None where the shape is not known)."""
    if shape is None or not shape:
        return None
    dims = [shape[a % len(shape)] for a in axes]
    if any(not isinstance(d, int) or d <= 0 for d in dims):
        return None
    return int(np.prod(dims))


def _axes(rank: int, axes: list[int]) -> list[int]:
    return sorted(int(a) % rank for a in axes)


def normalized_levels(ctx: LoweringContext, levels: str, scale: str, bias: str, rank: int, a: dict, x_step: str,
                      hint: str, nodes: list[NodeProto]) -> str:
    """float64 ``D / sqrt(S / n + c) * scale + bias`` of integer ``levels`` (any integer or whole float type);
    ``x_step`` is the float64 step of the levels (a constant, or fed to a search's session)."""
    axes = _axes(rank, a["axes"])
    n = int(a["group"])
    x = add_node(ctx, "Cast", [levels], hint, nodes, to=TensorProto.INT64)
    total = reduce_keepdims(ctx, "ReduceSum", x, axes, hint, nodes)
    if n <= MAX_GROUP_INT16:
        nx = add_node(ctx, "Mul", [x, ctx.constant(f"{hint}_n", np.array(n, dtype=np.int64))], hint, nodes)
        d = add_node(ctx, "Sub", [nx, total], hint, nodes)
        s = reduce_keepdims(ctx, "ReduceSum", add_node(ctx, "Mul", [d, d], hint, nodes), axes, hint, nodes)
        s = add_node(ctx, "Cast", [s], hint, nodes, to=TensorProto.DOUBLE)
        var = add_node(ctx, "Div", [s, ctx.constant(f"{hint}_n_f64", np.array(float(n)))], hint, nodes)
    else:  # around the integer mean m (module docstring)
        n_i64 = ctx.constant(f"{hint}_n", np.array(n, dtype=np.int64))
        n_f64 = ctx.constant(f"{hint}_n_f64", np.array(float(n)))
        mean = add_node(ctx, "Div", [add_node(ctx, "Cast", [total], hint, nodes, to=TensorProto.DOUBLE), n_f64],
                        hint, nodes)
        m = add_node(ctx, "Cast", [add_node(ctx, "Round", [mean], hint, nodes)], hint, nodes, to=TensorProto.INT64)
        e = add_node(ctx, "Sub", [x, m], hint, nodes)
        t = reduce_keepdims(ctx, "ReduceSum", e, axes, hint, nodes)
        q = reduce_keepdims(ctx, "ReduceSum", add_node(ctx, "Mul", [e, e], hint, nodes), axes, hint, nodes)
        d = add_node(ctx, "Sub", [add_node(ctx, "Mul", [e, n_i64], hint, nodes), t], hint, nodes)
        t = add_node(ctx, "Cast", [t], hint, nodes, to=TensorProto.DOUBLE)
        q = add_node(ctx, "Mul", [add_node(ctx, "Cast", [q], hint, nodes, to=TensorProto.DOUBLE), n_f64], hint, nodes)
        var = add_node(ctx, "Sub", [q, add_node(ctx, "Mul", [t, t], hint, nodes)], hint, nodes)
    c = add_node(ctx, "Div", [ctx.constant(f"{hint}_n2eps", np.array(_n2eps(a))),
                           add_node(ctx, "Mul", [x_step, x_step], hint, nodes)], hint, nodes)
    var = add_node(ctx, "Add", [var, c], hint, nodes)
    y = add_node(ctx, "Div", [add_node(ctx, "Cast", [d], hint, nodes, to=TensorProto.DOUBLE),
                           add_node(ctx, "Sqrt", [var], hint, nodes)], hint, nodes)
    y = add_node(ctx, "Mul", [y, twins.to_double(ctx, scale, f"{hint}_scale", nodes)], hint, nodes)
    return add_node(ctx, "Add", [y, twins.to_double(ctx, bias, f"{hint}_bias", nodes)], hint, nodes)


def _n2eps(a: dict) -> float:
    """``n**2 * epsilon`` in float64 (``c`` is this over the squared input step)."""
    n = float(a["group"])
    return n * n * float(np.float32(a["epsilon"]))


def _np_normalized(x: np.ndarray, scale: np.ndarray, bias: np.ndarray, a: dict, x_scale: float) -> np.ndarray:
    axes = tuple(_axes(x.ndim, a["axes"]))
    n = int(a["group"])
    x = x.astype(np.int64)
    total = x.sum(axis=axes, keepdims=True)
    if n <= MAX_GROUP_INT16:
        d = np.int64(n) * x - total
        var = (d * d).sum(axis=axes, keepdims=True).astype(np.float64) / np.float64(n)
    else:  # around the integer mean (module docstring)
        e = x - np.round(total.astype(np.float64) / np.float64(n)).astype(np.int64)
        t = e.sum(axis=axes, keepdims=True)
        d = e * np.int64(n) - t
        t = t.astype(np.float64)
        var = (e * e).sum(axis=axes, keepdims=True).astype(np.float64) * np.float64(n) - t * t
    step = np.float64(x_scale)
    c = np.float64(_n2eps(a)) / (step * step)
    y = d.astype(np.float64) / np.sqrt(var + c)
    return y * scale.astype(np.float64) + bias.astype(np.float64)


@register
class HzLayerNorm(HzOp):
    """Layer normalization of ``x`` over ``axes`` (negative: from the end): inputs x, scale, bias (float32
    constants that broadcast against x)."""

    op_type = "HzLayerNorm"
    attributes = {"axes": REQUIRED, "epsilon": REQUIRED}
    shape_preserving = True
    float_output = True
    device_op = "LayerNormalization"

    @classmethod
    def lower(cls, node: NodeProto, ctx: LoweringContext) -> list[NodeProto]:
        x, scale, bias = node.input[:3]
        src = ctx.twins.get(x)
        rank = ctx.rank(x)
        a = cls.read(node)
        exact = ctx.exact and node.name not in ctx.cpu_nodes and src is not None and src.levels is not None \
            and src.scalar_step and src.bounds is None and rank is not None
        n = group_size(ctx.shapes.get(x), a["axes"]) if exact else None
        if n is None:
            return cls.float_nodes(node, ctx)
        nodes: list[NodeProto] = []
        # The kernel reads the input's integer levels (whole numbers already on every grid: a no-op pass
        # that keeps the table's index integral whatever hands the levels on).
        levels = add_node(ctx, "Round", [src.levels], node.name, nodes)
        y = normalized_levels(ctx, levels, scale, bias, rank, {**a, "group": n}, src.step, node.name, nodes)
        twins.to_float(ctx, y, node.output[0], nodes)
        ctx.twins[node.output[0]] = twins.Twin(y)
        return nodes

    @classmethod
    def float_nodes(cls, node: NodeProto, ctx: LoweringContext) -> list[NodeProto]:
        """The float32 computation in standard ONNX: LayerNormalization over the last axes from opset 17,
        else spelled out."""
        a = cls.read(node)
        x, scale, bias = node.input[:3]
        last = sorted(int(v) for v in a["axes"])
        rank = ctx.rank(x)
        if ctx.opset >= 17 and last == list(range(-len(last), 0)) and rank is not None and len(last) <= rank:
            # LayerNormalization's scale and bias span the normalized axes; a constant with leading axes of
            # length 1 (the [1, 1] scale of an exported GroupNorm(1) over [N, 1, C*H*W]) is the same values.
            operands = [_over_last_axes(ctx, t, len(last), rank, f"{node.name}_{part}")
                        for t, part in ((scale, "scale"), (bias, "bias"))]
            if None not in operands:
                return [helper.make_node("LayerNormalization", [x, *operands], [node.output[0]], name=node.name,
                                         axis=last[0], epsilon=float(a["epsilon"]))]
        rank = ctx.rank(x)
        if rank is None:
            raise ValueError(f"HzLayerNorm {node.name}: the rank of {x} is unknown")
        axes, hint, nodes = _axes(rank, a["axes"]), node.name, []
        d = add_node(ctx, "Sub", [x, reduce_keepdims(ctx, "ReduceMean", x, axes, hint, nodes)], hint, nodes)
        var = reduce_keepdims(ctx, "ReduceMean", add_node(ctx, "Mul", [d, d], hint, nodes), axes, hint, nodes)
        eps = ctx.constant(f"{hint}_epsilon", np.array(a["epsilon"], dtype=np.float32))
        deviation = add_node(ctx, "Sqrt", [add_node(ctx, "Add", [var, eps], hint, nodes)], hint, nodes)
        y = add_node(ctx, "Div", [d, deviation], hint, nodes)
        y = add_node(ctx, "Mul", [y, scale], hint, nodes)
        nodes.append(helper.make_node("Add", [y, bias], [node.output[0]], name=ctx.unique(f"{hint}_out")))
        return nodes

    @classmethod
    def reference(cls, node: NodeProto, inputs: list[np.ndarray]) -> list[np.ndarray]:
        a = cls.read(node)
        x = inputs[0].astype(np.float32)
        axes = tuple(_axes(x.ndim, a["axes"]))
        d = x - x.mean(axis=axes, keepdims=True)
        var = (d * d).mean(axis=axes, keepdims=True)
        y = d / np.sqrt(var + np.float32(a["epsilon"])) * inputs[1] + inputs[2]
        return [y.astype(np.float32)]


def _over_last_axes(ctx: LoweringContext, tensor: str, count: int, rank: int, hint: str) -> str | None:
    """``tensor``, a constant broadcast against a rank-``rank`` input, as one over its last ``count`` axes:
    itself where it has no more axes, a reshaped copy where the extra leading ones have length 1, else None
    (it varies along an axis LayerNormalization does not normalize, or its value is not known)."""
    value = ctx.known(tensor)
    if value is None or value.ndim > rank:
        return None
    if value.ndim <= count:
        return tensor
    if any(d != 1 for d in value.shape[: value.ndim - count]):
        return None
    return ctx.constant(hint, value.reshape(value.shape[value.ndim - count:]))


def _statistics_only(node: NodeProto, view) -> bool:  # noqa: ANN001 - GraphView lives above ops/
    """Whether nothing reads ``node``'s Y and something reads its Mean or InvStdDev."""
    return not view.is_read(node.output[0]) and any(view.is_read(o) for o in node.output[1:])


@register
class HzSQuantizedLayerNorm(HzOp):
    op_type = "HzSQuantizedLayerNorm"
    attributes = {"axes": REQUIRED, "epsilon": REQUIRED, "group": REQUIRED, "x_scale": REQUIRED,
                  "out_scale": REQUIRED, **OUTPUT_ATTRS}
    double_attributes = ("x_scale", "out_scale")
    shape_preserving = True
    unit_kind = "layernorm"
    onnx_ops = ("HzLayerNorm",)
    constant_operands = True
    int16_input = True

    @classmethod
    def refusal(cls, node: NodeProto, view) -> str:  # noqa: ANN001 - GraphView lives above ops/
        if node.op_type != HzLayerNorm.op_type:  # the optimize stage left it
            if not all(view.is_const(i) for i in node.input[1:] if i):
                return f"{node.op_type} with a scale or bias computed at run time has no BPU form in hbtools"
            if view.shapes.get(node.input[0]) is None:  # after an op shape inference does not know
                return f"{node.op_type} of a tensor of unknown shape has no BPU form in hbtools"
            if _statistics_only(node, view):  # the copy the optimize stage keeps beside the HzLayerNorm
                return (f"{node.op_type} giving its Mean / InvStdDev outputs has no BPU form (the BPU kernel gives "
                        f"Y only); they are computed in float, beside the BPU's normalization of Y where it has one")
            return f"{node.op_type} over these axes, or with a scale or bias of this shape, has no BPU form in hbtools"
        a = HzLayerNorm.read(node)
        n = group_size(view.shapes.get(node.input[0]), a["axes"])
        if n is None:
            return "LayerNormalization of a tensor of unknown shape has no BPU form in hbtools"
        if n > MAX_GROUP_CENTERED:
            return (f"LayerNormalization over {n} values has no exact integer form in hbtools (at most "
                    f"{MAX_GROUP_CENTERED}); kept in float")
        return ""

    @classmethod
    def emit(cls, state, unit) -> None:  # noqa: ANN001 - EmitState and Unit live above ops/
        from hbtools.quant.emitters.state import per_tensor

        node = unit.main
        a = HzLayerNorm.read(node)
        xq = per_tensor(state.need_q(unit.inputs[0]), node.name)
        qt, out = state.out_attrs(unit.outputs[0])
        n = group_size(state.view.shapes.get(node.input[0]), a["axes"])
        state.nodes.append(cls.make_node([xq.name, *node.input[1:3]], [qt.name], node.name, axes=list(a["axes"]),
                                         epsilon=float(a["epsilon"]), group=n, x_scale=[float(xq.scale[0])],
                                         out_scale=[float(qt.scale[0])], **out))
        state.record(unit.outputs[0], qt)

    @classmethod
    def lower(cls, node: NodeProto, ctx: LoweringContext) -> list[NodeProto]:
        a = cls.read(node)
        rank = ctx.rank(node.input[0])
        if rank is None:
            raise ValueError(f"{node.name}: the rank of {node.input[0]} is unknown")
        nodes: list[NodeProto] = []
        hint = node.name
        step = ctx.constant(f"{hint}_x_scale", np.array(a["x_scale"][0], dtype=np.float64))
        y = normalized_levels(ctx, node.input[0], node.input[1], node.input[2], rank, a, step, hint, nodes)
        out_scale = ctx.constant(f"{hint}_out_scale", np.array(a["out_scale"][0], dtype=np.float64))
        q = add_node(ctx, "Round", [add_node(ctx, "Div", [y, out_scale], hint, nodes)], hint, nodes)
        output_levels(ctx, q, a, node.output[0], hint, nodes)
        return nodes

    @classmethod
    def reference(cls, node: NodeProto, inputs: list[np.ndarray]) -> list[np.ndarray]:
        a = cls.read(node)
        y = _np_normalized(inputs[0], inputs[1], inputs[2], a, a["x_scale"][0])
        q = grids.requantize(y / np.float64(a["out_scale"][0]), 1.0, a["out_min"], a["out_max"],
                             int(a["zero_point"]))
        return [q.astype(NUMPY_INT[a["out_type"]])]
