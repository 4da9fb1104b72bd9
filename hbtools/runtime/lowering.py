"""Replace every Horizon-domain node by the standard ONNX nodes of its op class."""

from __future__ import annotations

import copy
from collections.abc import Collection

import numpy as np
from onnx import AttributeProto, GraphProto, ModelProto, NodeProto, TensorProto, helper

from hbtools.graph.graph import GraphView, convert_opset, copy_fields, copy_model, large_constants
from hbtools.graph.model_io import default_opset, with_horizon_domain
from hbtools.ops import fused, quantized, registry, twins, uint8_kernels
from hbtools.ops.base import CONTRIB_DOMAIN, DOMAIN, LoweringContext
from hbtools.ops.names import recorded_cpu_nodes


def has_hz_ops(model: ModelProto) -> bool:
    return any(n.domain == DOMAIN for n in model.graph.node)


def lower_model(model: ModelProto, *, feed_calibration: bool = False, keep: Collection[str] = (),
                exact: bool = True) -> ModelProto:
    """A standard-ONNX copy of ``model`` that onnxruntime can run (``lowered_parts`` put together)."""
    lowered, constants = lowered_parts(model, feed_calibration=feed_calibration, keep=keep, exact=exact)
    lowered.graph.initializer.extend(constants)
    return lowered


def lowered_parts(model: ModelProto, *, feed_calibration: bool = False, keep: Collection[str] = (),
                  exact: bool = True) -> tuple[ModelProto, list[TensorProto]]:
    """The standard-ONNX form of ``model`` that onnxruntime can run, as a model without initializers and
    the initializers it reads (those of ``model`` itself, not copies, and those the lowering made).

    A session can be built from the two (``runtime.session.make_session``'s ``constants``) without
    a model that holds a copy of every weight while onnxruntime reads it.

    With ``feed_calibration`` every activation HzCalibration takes its grid from graph inputs
    named ``<node>_scale``, ``<node>_qmax`` (and with a zero point ``<node>_zero_point``,
    ``<node>_qmin``). Tensors
    the model computes but nothing reads are dropped, except its outputs and ``keep``
    (tensors a caller will fetch). ``exact=False`` keeps no float64 twins (a model switched
    piecewise, as the debugger's, has no integer chain to follow).
    """
    if not has_hz_ops(model):
        return copy_model(model, lambda _: False), list(model.graph.initializer)
    # Only read below (a converted copy, or the caller's model): the lowered model is made anew.
    source, model = model, _with_integer_clip(model)
    taken = {o for n in model.graph.node for o in n.output} | {i.name for i in model.graph.input}
    taken |= {t.name for t in model.graph.initializer} | {n.name for n in model.graph.node}
    view = GraphView(model)
    shapes, elem_types = view.shapes, view.elem_types
    ctx = LoweringContext(default_opset(model), taken, shapes, feed_calibration=feed_calibration)
    ctx.exact = exact
    ctx.constants = {t.name for t in model.graph.initializer}
    ctx.float_constants = {t.name for t in model.graph.initializer if t.data_type == TensorProto.FLOAT}
    ctx.constant_values = {t.name: t for t in model.graph.initializer}
    ctx.cpu_nodes = recorded_cpu_nodes(model)
    nodes = []
    keep = set(keep) | {o.name for o in model.graph.output}
    ctx.int8_tensors = {o for n in model.graph.node if n.domain == DOMAIN
                        for a in n.attribute if a.name == "out_type" and a.s == b"int8" for o in n.output[:1]}
    ctx.int8_tensors |= {i.name for i in model.graph.input if i.type.tensor_type.elem_type == TensorProto.INT8}
    fused_convs, absorbed = fused.fuse_calibrated_convs(model, ctx, keep)
    for node in model.graph.node:
        if node.name in absorbed:
            continue
        if node.name in fused_convs:
            nodes.extend(fused.lower(node, ctx))
            continue
        if node.domain == DOMAIN:
            nodes.extend(registry.get(node.op_type).lower(node, ctx))
            continue
        # In a calibrated model, integer-valued products run on their levels (hbtools.ops.twins).
        twin = twins.lower_standard(node, ctx)
        own = uint8_kernels.on_float_kernel(node, elem_types.get(node.input[0]) if node.input else None, ctx)
        nodes.extend(twin or [*(own or [node]), *uint8_kernels.mirror(node, ctx)])
    quantized.forget(model.graph.node)  # their decoded tables were for this lowering only
    nodes = _live(_pools_before_dequantization(nodes, ctx), keep)
    # Constants a lowering replaced (an int8 weight re-laid out for an integer kernel) would make
    # onnxruntime warn about unused initializers on the console.
    read = {i for n in nodes for i in n.input} | _subgraph_reads(nodes) | keep
    own = list(model.graph.initializer)
    if model is not source:
        # The converted model goes with this call: its weights are the source's as they were (hand those
        # on), and the other initializers copies of their own (one of its parts kept would keep it all).
        passed = {t.name: t for t in source.graph.initializer if t.name in large_constants(source)}
        own = [passed[t.name] if t.name in passed else copy.deepcopy(t) for t in own]
    # Only the constants some node reads become initializers: one a lowering made and then replaced (a
    # weight's float64 levels where its product runs on float32 levels) is never serialized.
    constants = [*own, *ctx.made_constants(read)]
    gone = {t.name for t in own if t.name not in read} | {n for n in ctx.made if n not in read}
    lowered = ModelProto()
    copy_fields(model, lowered, skip=("graph",))
    # no value_info: intermediate dtypes changed; let onnxruntime infer
    copy_fields(model.graph, lowered.graph, skip=("node", "initializer", "input", "value_info"))
    lowered.graph.node.extend(nodes)
    lowered.graph.input.extend(i for i in model.graph.input if i.name not in gone)  # old IR lists initializers too
    lowered.graph.input.extend(ctx.inputs)
    with_horizon_domain(lowered)
    if any(n.domain == CONTRIB_DOMAIN for n in lowered.graph.node) and \
            not any(op.domain == CONTRIB_DOMAIN for op in lowered.opset_import):
        lowered.opset_import.append(helper.make_opsetid(CONTRIB_DOMAIN, 1))
    return lowered, [t for t in constants if t.name not in gone]


def _pools_before_dequantization(nodes: list[NodeProto], ctx: LoweringContext) -> list[NodeProto]:
    """A float MaxPool of ``DequantizeLinear(8-bit x)`` as the DequantizeLinear of x's pool, on a fast kernel.

    onnxruntime's QDQ propagation moves such a DequantizeLinear after the MaxPool (the maximum commutes
    with a positive step), which leaves a MaxPool on 8-bit integers: its slow generic loop
    (``uint8_kernels.on_float_kernel``). Moved here first, the pool takes the fast kernel. Where the step
    is not a positive constant, the node stays as it is.
    """
    producer = {o: n for n in nodes for o in n.output}
    out: list[NodeProto] = []
    for node in nodes:
        dq = producer.get(node.input[0]) if node.op_type == "MaxPool" and node.domain in ("", "ai.onnx") \
            and len(node.output) == 1 and node.input else None
        if dq is None or dq.op_type != "DequantizeLinear" or len(dq.input) < 2:
            out.append(node)
            continue
        step = ctx.known(dq.input[1])
        zero = ctx.known(dq.input[2]) if len(dq.input) > 2 and dq.input[2] else np.zeros((), np.uint8)
        if step is None or zero is None or step.size != 1 or zero.size != 1 or not float(step.reshape(-1)[0]) > 0 \
                or zero.dtype not in (np.int8, np.uint8):
            out.append(node)
            continue
        elem = TensorProto.INT8 if zero.dtype == np.int8 else TensorProto.UINT8
        pooled = ctx.unique(f"{node.output[0]}_levels")
        pool = helper.make_node("MaxPool", [dq.input[0]], [pooled], name=ctx.unique(f"{node.name}_levels"))
        pool.attribute.extend(node.attribute)
        out.extend(uint8_kernels.on_float_kernel(pool, elem, ctx))
        out.append(helper.make_node("DequantizeLinear", [pooled, *dq.input[1:]], list(node.output),
                                    name=ctx.unique(f"{node.name}_dequantized")))
    return out


INTEGER_CLIP_OPSET = 12  # Clip, Max, Min and MaxPool take (u)int8 from here on


def _with_integer_clip(model: ModelProto) -> ModelProto:
    """``model`` at opset 12 if it is at 11 and onnx converts it (else as it is).

    Before opset 12 Clip is float only, so every clipped integer result would make a round
    trip through float; at 12 the lowering clips uint8 levels directly. From 11 to 12 no op
    changes its meaning (12 adds types and optional behaviour); older opsets are left alone.
    """
    if default_opset(model) != INTEGER_CLIP_OPSET - 1:
        return model
    try:
        return convert_opset(model, INTEGER_CLIP_OPSET)
    except Exception:  # an op without a converter: keep the opset, the float clip is exact too
        return model


def _live(nodes: list[NodeProto], keep: set[str]) -> list[NodeProto]:
    """``nodes`` without the helper nodes whose results nobody reads (twins the model did not need)."""
    while True:
        read = set(keep) | {i for n in nodes for i in n.input} | _subgraph_reads(nodes)
        kept = [n for n in nodes if any(o in read for o in n.output) or not n.output]
        if len(kept) == len(nodes):
            return kept
        nodes = kept


def _subgraph_reads(nodes: list[NodeProto]) -> set[str]:
    """Names the subgraphs (If / Loop / Scan bodies) of ``nodes`` read."""
    names: set[str] = set()
    for node in nodes:
        for attr in node.attribute:
            for graph in [attr.g, *attr.graphs] if attr.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS) else []:
                names.update(_names_read(graph))
    return names


def _names_read(graph: GraphProto) -> set[str]:
    names = set()
    for node in graph.node:
        names.update(node.input)
        for attr in node.attribute:
            if attr.type == AttributeProto.GRAPH:
                names.update(_names_read(attr.g))
            elif attr.type == AttributeProto.GRAPHS:
                for g in attr.graphs:
                    names.update(_names_read(g))
    return names
