"""A calibrated model with every calibration node switchable by a boolean graph input.

Each calibration node becomes an ``If`` on ``<node>_enable``: enabled, it
fake-quantizes exactly as ``HzCalibration`` lowers; disabled, it passes the float
value on. A weight calibration node on a constant weight does not switch the weight
tensor but wraps its reader (the Conv/Gemm) in the ``If``, so both branches keep a
constant weight: onnxruntime pre-packs constant weights, and a computed weight makes
every convolution several times slower.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import onnx
from onnx import ModelProto, NodeProto, TensorProto, helper, numpy_helper

from hbtools.debug.model import CalibratedModel
from hbtools.graph.model_io import default_opset
from hbtools.ops.base import LoweringContext
from hbtools.ops.calibration import HzBiasCalibration, HzCalibration
from hbtools.ops.names import enable_input
from hbtools.ops.preprocess import HzPreprocess
from hbtools.quant.calibrated import float_bias_input
from hbtools.runtime.lowering import lower_model


@dataclass
class Switched:
    model: ModelProto  # standard ONNX
    holders: dict[str, list[str]]  # calibration node -> names of the If nodes it switches

    def is_switch(self, node: NodeProto) -> bool:
        return node.op_type == "If" and node.name in self._switch_names

    def __post_init__(self) -> None:
        self._switch_names = {n for names in self.holders.values() for n in names}


def switchable_model(cm: CalibratedModel) -> Switched:
    model = copy.deepcopy(cm.model)
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    taken = {o for n in graph.node for o in n.output} | {n.name for n in graph.node} | set(inits)
    taken |= {i.name for i in graph.input}
    ctx = LoweringContext(default_opset(model), taken, cm.shapes)
    ctx.exact = False  # switched piecewise: no float64 twins across the If branches (but see ``_switched_fake_quant``)
    wrapped = _wrappable_weights(cm, set(inits))
    quantized_weight: dict[str, tuple[str, str, str]] = {}  # calibrated name -> (switch, quantized, float)
    holders: dict[str, list[str]] = {}
    nodes: list[NodeProto] = []
    for node in graph.node:
        if node.op_type == HzCalibration.op_type:
            graph.input.append(helper.make_tensor_value_info(enable_input(node.name), TensorProto.BOOL, []))
        if node.name in wrapped:
            values = [numpy_helper.to_array(inits[i]) for i in node.input if i]  # the weight, its rounding
            q = ctx.constant(f"{node.name}_quantized", HzCalibration.reference(node, values)[0])
            quantized_weight[node.output[0]] = (node.name, q, node.input[0])
        elif node.op_type == HzCalibration.op_type:
            nodes.append(_switched_fake_quant(node, ctx, cm.integer_preprocess.get(node.input[0])))
            holders[node.name] = [node.name]
        elif any(i in quantized_weight for i in node.input):
            switch = next(quantized_weight[i][0] for i in node.input if i in quantized_weight)
            nodes.append(_switched_reader(node, quantized_weight, _rounded_bias(cm, node, inits, ctx), ctx))
            holders.setdefault(switch, []).append(nodes[-1].name)
        else:
            nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)
    graph.initializer.extend(ctx.initializers)
    return Switched(lower_model(model, exact=False), holders)


def float_version(node: NodeProto) -> list[NodeProto]:
    """A switch's disabled branch as plain nodes producing the switch's outputs."""
    branch = next(a.g for a in node.attribute if a.name == "else_branch")
    rename = {o.name: final for o, final in zip(branch.output, node.output, strict=True)}
    out = []
    for inner in branch.node:
        inner = copy.deepcopy(inner)
        inner.output[:] = [rename.get(o, o) for o in inner.output]
        out.append(inner)
    return out


def _wrappable_weights(cm: CalibratedModel, constants: set[str]) -> set[str]:
    """Weight calibration nodes on constants whose readers can be switched as a whole.

    A reader taking two such weights, or a calibrated weight that is a model output,
    keeps the plain switch on the weight tensor instead.
    """
    candidates = {c.name for c in cm.calibration.values() if c.kind == "weight" and c.input in constants}

    def wrappable(name: str) -> bool:
        c = cm.calibration[name]
        return (bool(c.consumers) and c.output not in cm.outputs
                and all(len(set(cm.feeding[r]) & candidates) == 1 for r in c.consumers))

    return {n for n in candidates if wrappable(n)}


def _switched_fake_quant(node: NodeProto, ctx: LoweringContext, preprocess: NodeProto | None = None) -> NodeProto:
    """If(enable) then fake-quant (the op's own lowering) else the float input.

    ``preprocess``: the integer HzPreprocess making the input in the calibrated model. Enabled, the fake
    quant reads what it computes, the BPU's integer affine map, exactly as the calibrated model does;
    disabled, the input is the float preprocessing's. With the float one under the fake quant, PP-OCR
    cls (mean 127.5: most pixels on a rounding tie) had 10 % of its input levels one off the calibrated
    model's, and a class flipped between the debugger's all-quantized model and the user's."""
    x, y = node.input[0], node.output[0]
    inner = copy.deepcopy(node)
    inner.output[0] = ctx.unique(f"{y}__quantized")
    if preprocess is not None:
        integer = copy.deepcopy(preprocess)
        integer.name = ctx.unique(f"{preprocess.name}__integer")
        integer.output[0] = inner.input[0] = ctx.unique(f"{x}__integer")
        if x in ctx.shapes:  # a per-channel fake quant (per_channel: True) needs its input's rank
            ctx.shapes[inner.input[0]] = ctx.shapes[x]
        ctx.exact = True  # the calibrated model's float64 twins, kept inside this one switch
        try:
            quantized = [*HzPreprocess.lower(integer, ctx), *HzCalibration.lower(inner, ctx)]
        finally:
            ctx.exact = False
    else:
        quantized = HzCalibration.lower(inner, ctx)
    then = branch(quantized, [inner.output[0]], f"{node.name}_on")
    passed = ctx.unique(f"{y}__float")
    other = branch([helper.make_node("Identity", [x], [passed])], [passed], f"{node.name}_off")
    return helper.make_node("If", [enable_input(node.name)], [y], name=node.name, then_branch=then,
                            else_branch=other)


def _rounded_bias(cm: CalibratedModel, reader: NodeProto, inits: dict[str, TensorProto],
                  ctx: LoweringContext) -> tuple[str, str] | None:
    """(float bias, the calibrated model's rounded bias as a constant) of ``reader``, where it has one."""
    bias = cm.rounded_bias.get(reader.name)
    if bias is None or bias.input[0] not in inits:
        return None
    rounded = HzBiasCalibration.reference(bias, [numpy_helper.to_array(inits[bias.input[0]])])[0]
    return float_bias_input(bias), ctx.constant(f"{bias.name}_rounded", rounded)


def _switched_reader(node: NodeProto, weights: dict[str, tuple[str, str, str]], bias: tuple[str, str] | None,
                     ctx: LoweringContext) -> NodeProto:
    """If(enable) then the node on the quantized weight (and its rounded bias, ``bias``: float and rounded)
    else the node on the float weight and bias."""
    calibrated = next(i for i in node.input if i in weights)
    switch, quantized, original = weights[calibrated]

    def variant(weight: str, tag: str) -> onnx.GraphProto:
        inner = copy.deepcopy(node)
        inner.name = ctx.unique(f"{node.name}__{tag}")
        inner.input[:] = [weight if i == calibrated else i for i in node.input]
        if bias is not None and weight == quantized:
            inner.input[:] = [bias[1] if i == bias[0] else i for i in inner.input]
        inner.output[:] = [ctx.unique(f"{o}__{tag}") for o in node.output]
        return branch([inner], list(inner.output), inner.name)

    return helper.make_node("If", [enable_input(switch)], list(node.output), name=ctx.unique(f"{node.name}__switch"),
                            then_branch=variant(quantized, "quantized"), else_branch=variant(original, "float"))


def branch(nodes: list[NodeProto], outputs: list[str], name: str,
           types: dict[str, int] | None = None) -> onnx.GraphProto:
    """A sub-graph for an ``If`` branch (outputs untyped in shape, float unless told)."""
    vis = [helper.make_tensor_value_info(o, (types or {}).get(o, TensorProto.FLOAT), None) for o in outputs]
    return helper.make_graph(nodes, name, [], vis)
