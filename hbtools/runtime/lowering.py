"""Replace every Horizon-domain node by the standard ONNX nodes of its op class."""

from __future__ import annotations

import copy

from onnx import ModelProto, TensorProto

from hbtools.graph.graph import GraphView
from hbtools.graph.model_io import default_opset, with_horizon_domain
from hbtools.ops import registry, twins
from hbtools.ops.base import DOMAIN, LoweringContext


def has_hz_ops(model: ModelProto) -> bool:
    return any(n.domain == DOMAIN for n in model.graph.node)


def lower_model(model: ModelProto, *, feed_calibration: bool = False) -> ModelProto:
    """A standard-ONNX copy of ``model`` that onnxruntime can run.

    With ``feed_calibration`` every activation HzCalibration takes its scale and an
    enable flag from graph inputs named ``<node>_scale`` / ``<node>_enable``.
    """
    model = copy.deepcopy(model)
    if not has_hz_ops(model):
        return model
    taken = {o for n in model.graph.node for o in n.output} | {i.name for i in model.graph.input}
    taken |= {t.name for t in model.graph.initializer} | {n.name for n in model.graph.node}
    shapes = GraphView(model).shapes
    ctx = LoweringContext(default_opset(model), taken, shapes, feed_calibration=feed_calibration)
    ctx.constants = {t.name for t in model.graph.initializer}
    ctx.float_constants = {t.name for t in model.graph.initializer if t.data_type == TensorProto.FLOAT}
    nodes = []
    for node in model.graph.node:
        if node.domain == DOMAIN:
            nodes.extend(registry.get(node.op_type).lower(node, ctx))
            continue
        # In a calibrated model, integer-valued products run on their levels (hbtools.ops.twins).
        twin = twins.lower_standard(node, ctx)
        nodes.extend(twin or [node])
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    model.graph.initializer.extend(ctx.initializers)
    model.graph.input.extend(ctx.inputs)
    del model.graph.value_info[:]  # intermediate dtypes changed; let onnxruntime infer
    with_horizon_domain(model)
    return model
