"""Repairs the parse stage makes to a user's model before anything else reads it.

Encodings that onnxruntime runs but onnx's checker or the later stages refuse are made
valid here, each the same model in a form the rest of the pipeline takes: nodes out of
order, outputs without a shape, duplicate node names, weights listed as inputs, opsets
older than the passes work at (with what old Resize / Upsample meant), ops whose version
onnx has since deprecated, and outputs that are not tensors (refused with the tensors to
end at instead).
"""

from __future__ import annotations

import copy
import logging

import numpy as np
import onnx
from onnx import ModelProto, helper

from hbtools.errors import HbError
from hbtools.graph.graph import GraphView, convert_opset, infer_shapes, topological_sort
from hbtools.graph.model_io import ORT_EARLY_OPS, default_opset, early_ops, stand_down, stand_in
from hbtools.ops.base import fresh_name
from hbtools.ops.names import RESERVED_SUFFIXES
from hbtools.runtime.session import ort_session

log = logging.getLogger("hbtools")

MIN_WORKING_OPSET = 11  # the lowering of Hz ops needs Clip with tensor bounds and Round
ONNX_DOMAINS = ("", "ai.onnx", "ai.onnx.ml")  # ops onnx's shape inference knows


def ordered_and_typed(model: ModelProto) -> None:
    """Encodings onnxruntime runs but onnx's checker refuses, made valid: nodes listed out of order
    (hand-edited or merged graphs) are sorted, a graph output declared without a shape (what
    onnx-graphsurgeon or ``make_tensor_value_info(name, type, None)`` write for an added output) gets
    the shape inference gives it, and an IR-3 model with initializers that are not graph inputs (an
    old export saved again by onnxruntime's optimizer, which adds folded weights) is IR 4, as the
    later stages make every model."""
    inputs = {i.name for i in model.graph.input}
    if model.ir_version < 4 and any(t.name not in inputs for t in model.graph.initializer):
        model.ir_version = 4
    try:
        topological_sort(model)
    except ValueError:
        return  # a cycle or a dangling input: the checker names it
    shaped_outputs(model)


def shapeless_inputs(model: ModelProto) -> list[str]:
    """Graph inputs (not initializers) declared with an element type only, no shape at all (some converters and
    hand-edited graphs write them): onnxruntime runs such a model for whatever shape it is fed."""
    inits = {t.name for t in model.graph.initializer}
    return [vi.name for vi in model.graph.input if vi.name not in inits and vi.type.HasField("tensor_type")
            and not vi.type.tensor_type.HasField("shape")]


def shape_inputs(model: ModelProto, given: dict[str, list[int]]) -> None:
    """``shapeless_inputs`` take the shape the config gives them (input_shape, --input-shape)."""
    declared = {vi.name: vi for vi in model.graph.input}
    for name in shapeless_inputs(model):
        if given.get(name):
            dims = declared[name].type.tensor_type.shape.dim
            for size in given[name]:
                dims.add().dim_value = size


def shaped_outputs(model: ModelProto) -> None:
    """Graph outputs declared without a shape or a type (an added output, output_nodes, an
    ``onnx.ValueInfoProto(name=...)``) get the type and shape inference gives them, or the rank one onnxruntime
    run gives them: onnx's checker refuses an output without."""
    bare = [o for o in model.graph.output if o.type.WhichOneof("value") is None or
            (o.type.HasField("tensor_type") and not o.type.tensor_type.HasField("shape"))]
    if not bare:
        return
    try:
        typed = {o.name: o.type for o in infer_shapes(copy.deepcopy(model)).graph.output}
    except (onnx.shape_inference.InferenceError, ValueError):
        return  # the checker or onnxruntime says what is wrong
    for o in bare:
        if o.name in typed and typed[o.name].tensor_type.HasField("shape"):
            o.type.CopyFrom(typed[o.name])
    still = [o for o in bare if o.type.HasField("tensor_type") and not o.type.tensor_type.HasField("shape")]
    ranks = _ranks_by_running(model, [o.name for o in still]) if still else {}
    for o in still:
        if o.name in ranks:  # sizes stay names: the run used stand-in sizes for any free input dimension
            o.type.tensor_type.shape.dim.extend(onnx.TensorShapeProto.Dimension(dim_param=f"{o.name}_{k}")
                                                for k in range(ranks[o.name]))


def typed_by_running(model: ModelProto) -> int:
    """Element types and shapes, as value_info, of the tensors shape inference leaves untyped behind ops it
    does not know (an onnxruntime contrib op kept as it is): without them it loses every shape after such an
    op, and the stages after this one need them (a per-channel scale laid along the channel axis, a layer
    norm's axis, the simulator's sessions). Taken from two onnxruntime runs, on zeros and on random values: a
    size they disagree on (one the data decides) stays a name. On a parsed model, before any Hz op, whose input
    shapes are static; nothing where onnxruntime cannot run it (a custom op). The count typed."""
    if all(n.domain in ONNX_DOMAINS for n in model.graph.node):
        return 0
    typed = {vi.name for vi in infer_shapes(copy.deepcopy(model)).graph.value_info}
    typed |= {o.name for o in model.graph.output} | {i.name for i in model.graph.input}
    untyped = [o for n in model.graph.node for o in n.output if o and o not in typed]
    if not untyped:
        return 0
    probe = copy.deepcopy(model)
    probe.graph.output.extend(helper.make_empty_tensor_value_info(o) for o in untyped)
    runs = [_run_on(probe, untyped, fill) for fill in ("zeros", "random")]
    if any(r is None for r in runs):
        return 0
    count = 0
    for name, a, b in zip(untyped, *runs, strict=True):
        if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)) or a.ndim != b.ndim or a.dtype != b.dtype:
            continue
        dims = [int(x) if x == y else f"{name}_{k}" for k, (x, y) in enumerate(zip(a.shape, b.shape, strict=True))]
        model.graph.value_info.append(helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(a.dtype),
                                                                    dims))
        count += 1
    return count


def _feeds(model: ModelProto, fill: str) -> dict[str, np.ndarray] | None:
    """Zeros (or standard normal values) for every input, free sizes taken as 1; None where an input has no
    shape."""
    inits = {t.name for t in model.graph.initializer}
    rng = np.random.default_rng(0)
    feeds = {}
    for i in model.graph.input:
        if i.name in inits:
            continue
        t = i.type.tensor_type
        if not t.HasField("shape"):
            return None
        dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else 1 for d in t.shape.dim]
        dtype = helper.tensor_dtype_to_np_dtype(t.elem_type)
        feeds[i.name] = rng.standard_normal(dims).astype(dtype) if fill == "random" else np.zeros(dims, dtype=dtype)
    return feeds


def _run_on(model: ModelProto, outputs: list[str], fill: str) -> list | None:
    """``outputs`` of one onnxruntime run on ``_feeds``; None where the model does not run so."""
    feeds = _feeds(model, fill)
    if feeds is None:
        return None
    try:
        return ort_session(model).run(outputs, feeds)
    except Exception:  # noqa: BLE001 - the checker then says what is missing
        return None


def _ranks_by_running(model: ModelProto, outputs: list[str]) -> dict[str, int]:
    """The ranks of ``outputs`` from one onnxruntime run on zeros (free input sizes taken as 1): shape
    inference cannot follow a Reshape whose target the graph computes (Shape, Gather, Concat), which
    onnxruntime runs. Nothing where the model does not run so."""
    values = _run_on(model, outputs, "zeros")
    return {} if values is None else {name: np.ndim(v) for name, v in zip(outputs, values, strict=True)}


def unique_node_names(model: ModelProto) -> None:
    """Nodes that share a name (graphs merged or edited by hand) get unique ones: onnxruntime refuses the
    model otherwise, and node_info, the node table and the debugger key on names. The first keeps it."""
    taken = {n.name for n in model.graph.node if n.name}
    seen: set[str] = set()
    renamed: dict[str, list[str]] = {}
    for node in model.graph.node:
        if not node.name:
            continue
        if node.name not in seen:
            seen.add(node.name)
            continue
        k = 1
        while f"{node.name}_{k}" in taken:
            k += 1
        renamed.setdefault(node.name, []).append(f"{node.name}_{k}")
        node.name = f"{node.name}_{k}"
        taken.add(node.name)
    for name, new in renamed.items():
        log.warning("%d nodes are named '%s'; the others are renamed %s (node_info and the debugger take these "
                    "names)", len(new) + 1, name, ", ".join(new))


def deprecated_ops(model: ModelProto) -> None:
    """Ops of a version onnx's checker now refuses as deprecated, though onnxruntime runs them, written
    with the ops that replace them.

    GroupNormalization of opsets 18 to 20 (torch.onnx's dynamo exports at opset 18) scales and shifts
    per group; opset 21 made that per channel and deprecated the old form. It is the same as an
    InstanceNormalization over the input seen as [N, groups, -1], with the group scales and shifts,
    reshaped back.
    """
    opset = default_opset(model)
    if not 18 <= opset < 21:
        return
    taken = {o for n in model.graph.node for o in n.output} | {n.name for n in model.graph.node}
    taken |= {i.name for i in model.graph.initializer} | {i.name for i in model.graph.input}

    def fresh(base: str) -> str:
        return fresh_name(base, taken)

    nodes: list[onnx.NodeProto] = []
    for node in model.graph.node:
        if node.op_type != "GroupNormalization" or node.domain not in ("", "ai.onnx"):
            nodes.append(node)
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        base = node.name or node.output[0]
        x, scale, bias = node.input[:3]
        grouped_shape = fresh(f"{base}_grouped_shape")
        model.graph.initializer.append(onnx.numpy_helper.from_array(
            np.array([0, int(attrs["num_groups"]), -1], np.int64), grouped_shape))
        shape, grouped, normalized = fresh(f"{base}_shape"), fresh(f"{base}_grouped"), fresh(f"{base}_normalized")
        nodes += [helper.make_node("Shape", [x], [shape], name=fresh(f"{base}_Shape")),
                  helper.make_node("Reshape", [x, grouped_shape], [grouped], name=fresh(f"{base}_Reshape")),
                  helper.make_node("InstanceNormalization", [grouped, scale, bias], [normalized],
                                   name=fresh(f"{base}_InstanceNormalization"),
                                   epsilon=float(attrs.get("epsilon", 1e-5))),
                  helper.make_node("Reshape", [normalized, shape], [node.output[0]], name=node.name or None)]
        log.info("GroupNormalization '%s' (opset %d, deprecated since opset 21) is written as Reshape -> "
                 "InstanceNormalization -> Reshape", base, opset)
    del model.graph.node[:]
    model.graph.node.extend(nodes)


def per_activation_batch_norms(model: ModelProto) -> None:
    """BatchNormalization with ``spatial=0`` (opsets 7 and 8: statistics per activation, not per channel), which
    opset 9 dropped and onnx's version converter refuses. With per-channel parameters it computes what
    ``spatial=1`` does; with per-activation ones it is ``x * a + b`` with constants of the parameters' shape."""
    if default_opset(model) >= 9:
        return
    consts = {t.name: t for t in model.graph.initializer}
    nodes: list[onnx.NodeProto] = []
    for node in model.graph.node:
        nodes.append(node)
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if node.op_type != "BatchNormalization" or attrs.get("spatial", 1) != 0:
            continue
        label = node.name or node.output[0]
        if any(name not in consts for name in node.input[1:5]):
            raise HbError(f"BatchNormalization '{label}' has spatial=0 and parameters computed in the model; "
                          "opset 9 and later cannot express that", hint="export it with spatial=1 (per-channel "
                                                                        "statistics)")
        scale, bias, mean, var = (onnx.numpy_helper.to_array(consts[n]).astype(np.float64) for n in node.input[1:5])
        if all(p.ndim == 1 for p in (scale, bias, mean, var)):
            next(a for a in node.attribute if a.name == "spatial").i = 1  # per-channel parameters: the same
            continue
        a = scale / np.sqrt(var + float(attrs.get("epsilon", 1e-5)))
        multiplier, shift, scaled = (f"{node.output[0]}_bn_{k}" for k in ("multiplier", "shift", "scaled"))
        model.graph.initializer.extend([onnx.numpy_helper.from_array(a.astype(np.float32), multiplier),
                                        onnx.numpy_helper.from_array((bias - mean * a).astype(np.float32), shift)])
        model.ir_version = max(model.ir_version, 4)  # IR 3 wants every initializer among the inputs
        nodes[-1] = helper.make_node("Mul", [node.input[0], multiplier], [scaled], name=node.name or None)
        nodes.append(helper.make_node("Add", [scaled, shift], [node.output[0]], name=f"{label}_shift"))
        log.info("BatchNormalization '%s' with spatial=0 and per-activation statistics is written as Mul -> Add",
                 label)
    del model.graph.node[:]
    model.graph.node.extend(nodes)


# ONNX 1.x experimental ops, dropped from the standard later, that onnxruntime still runs (the ONNX model zoo's
# tiny-YOLOv2 scales its input with ImageScaler; CoreML and Keras converters wrote the others)
EXPERIMENTAL_OPS = ("ImageScaler", "Scale", "Affine", "ScaledTanh", "ParametricSoftplus", "Crop")


def experimental_ops(model: ModelProto) -> int:
    """The experimental ops of ``EXPERIMENTAL_OPS`` written as the standard ops they are: a scale and a per-channel
    bias (ImageScaler), ``alpha * x + beta`` (Affine), ``alpha * f(beta * x)`` (ScaledTanh, ParametricSoftplus), a
    Slice of the spatial axes (Crop). onnx's checker refuses them ('not an ONNX op'). The count written."""
    opset = default_opset(model)
    taken = {o for n in model.graph.node for o in n.output} | {n.name for n in model.graph.node}
    taken |= {i.name for i in model.graph.initializer} | {i.name for i in model.graph.input}
    nodes: list[onnx.NodeProto] = []
    count = 0

    def const(base: str, value: np.ndarray) -> str:
        name = fresh_name(base, taken)
        model.graph.initializer.append(onnx.numpy_helper.from_array(value, name))
        return name

    def op(kind: str, inputs: list[str], base: str, out: str | None = None, **attrs: object) -> str:
        out = out or fresh_name(f"{base}_{kind}", taken)
        nodes.append(helper.make_node(kind, inputs, [out], name=fresh_name(f"{base}_{kind}", taken), **attrs))
        return out

    for node in model.graph.node:
        if node.op_type not in EXPERIMENTAL_OPS or node.domain not in ("", "ai.onnx"):
            nodes.append(node)
            continue
        a = {x.name: helper.get_attribute_value(x) for x in node.attribute}
        x, y, base = node.input[0], node.output[0], node.name or node.output[0]
        f32 = np.float32
        if node.op_type == "ImageScaler":
            bias = list(a.get("bias", []))
            scaled = op("Mul", [x, const(f"{base}_scale", f32(a.get("scale", 1.0)))], base, None if bias else y)
            if bias:
                op("Add", [scaled, const(f"{base}_bias", np.array(bias, f32).reshape(1, -1, 1, 1))], base, y)
        elif node.op_type == "Scale":
            op("Mul", [x, const(f"{base}_scale", f32(a.get("scale", 1.0)))], base, y)
        elif node.op_type == "Affine":
            scaled = op("Mul", [x, const(f"{base}_alpha", f32(a.get("alpha", 1.0)))], base)
            op("Add", [scaled, const(f"{base}_beta", f32(a.get("beta", 0.0)))], base, y)
        elif node.op_type in ("ScaledTanh", "ParametricSoftplus"):
            inner = op("Mul", [x, const(f"{base}_beta", f32(a.get("beta", 1.0)))], base)
            f = op("Tanh" if node.op_type == "ScaledTanh" else "Softplus", [inner], base)
            op("Mul", [f, const(f"{base}_alpha", f32(a.get("alpha", 1.0)))], base, y)
        else:  # Crop: border (left, top, right, bottom), or a (height, width) from (left, top)
            left, top, right, bottom = (list(a.get("border", [])) + [0, 0, 0, 0])[:4]
            size = list(a.get("scale", []))
            end = np.iinfo(np.int64).max
            ends = [top + size[0], left + size[1]] if len(size) == 2 else [-bottom if bottom else end,
                                                                             -right if right else end]
            if opset < 10:
                op("Slice", [x], base, y, starts=[top, left], ends=ends, axes=[2, 3])
            else:
                op("Slice", [x, const(f"{base}_starts", np.array([top, left], np.int64)),
                             const(f"{base}_ends", np.array(ends, np.int64)),
                             const(f"{base}_axes", np.array([2, 3], np.int64))], base, y)
        count += 1
        log.info("%s '%s' (an experimental op of ONNX 1.x) is written as standard ops", node.op_type, base)
    if count:
        del model.graph.node[:]
        model.graph.node.extend(nodes)
        model.ir_version = max(model.ir_version, 4)  # IR 3 would want the new constants among the inputs
    return count


def reserved_names(model: ModelProto) -> None:
    """Tensors named as the artefacts name what they add next to a tensor ``T`` (``names.RESERVED_SUFFIXES``:
    ``T_quantized``, its integer form; ``T_calibrated``, its fake-quantized value) are renamed ``..._source``.

    onnxruntime's quantize_dynamic writes ``T_quantized`` next to ``T`` (DynamicQuantizeLinear): the quantized
    model then held two tensors of that name, and saving it was an internal error after minutes of work. The
    graph's inputs and outputs keep their names (the user feeds and reads them); where one of those is
    ``T_quantized``, ``T`` is renamed instead.
    """
    graph = model.graph
    kept = {vi.name for vi in [*graph.input, *graph.output]}
    names = {o for n in graph.node for o in n.output if o} | {t.name for t in graph.initializer} | kept
    clashing = {n for n in names if n.endswith(RESERVED_SUFFIXES) and n not in kept}
    for name in kept:
        for suffix in RESERVED_SUFFIXES:
            stem = name[:-len(suffix)]
            if name.endswith(suffix) and stem in names and stem not in kept:
                clashing.add(stem)
    if not clashing:
        return
    taken = set(names)
    mapping = {old: fresh_name(f"{old}_source", taken) for old in sorted(clashing)}
    _rename_tensors(graph, mapping, top=True)
    log.info("%d tensor(s) renamed, as the quantized and calibrated models name what they add next to a tensor: %s",
             len(mapping), ", ".join(f"'{a}' -> '{b}'" for a, b in list(mapping.items())[:5]))


def _rename_tensors(graph: onnx.GraphProto, mapping: dict[str, str], *, top: bool) -> None:
    """Rename ``mapping``'s tensors where ``graph`` reads them (and makes them, at the ``top`` level), in the
    sub-graphs that read them from outside too."""
    local = {o for n in graph.node for o in n.output} | {t.name for t in graph.initializer} | \
        {i.name for i in graph.input}
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name in mapping and (top or name not in local):
                node.input[i] = mapping[name]
        if top:
            for i, name in enumerate(node.output):
                node.output[i] = mapping.get(name, name)
        for attr in node.attribute:
            for sub in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs):
                _rename_tensors(sub, {k: v for k, v in mapping.items() if top or k not in local}, top=False)
    if top:
        for t in graph.initializer:
            t.name = mapping.get(t.name, t.name)
        for vi in graph.value_info:
            vi.name = mapping.get(vi.name, vi.name)


def working_opset(model: ModelProto) -> ModelProto:
    """The model at an opset every pass works at: 11 at least, and the opset that defines each op
    onnxruntime ran before it (``ORT_EARLY_OPS``: its LayerNormalization in an opset-13 model is the
    opset-17 op; the ONNX checker and the artefacts need the opset that has it)."""
    opset = default_opset(model)
    early = early_ops(model)
    target = max([MIN_WORKING_OPSET, *(ORT_EARLY_OPS[n.op_type] for n in early)])
    if opset >= target:
        return model
    log.info("converting the model from opset %d to %d", opset, target)
    resizes = _old_resizes(model)
    stand_in(model, early)  # the converter has no schema for them at the model's opset: they pass as they are
    try:
        converted = convert_opset(model, target)
    except Exception as exc:  # the converter raises plain RuntimeErrors
        raise HbError(f"cannot convert the model from opset {opset} to {target}: {exc}") from exc
    finally:
        stand_down(model)
    stand_down(converted)
    _keep_old_resize_meaning(converted, resizes)
    return converted


def _old_resizes(model: ModelProto) -> list[tuple[str, np.ndarray | None]]:
    """(mode, constant scales or None) of every Resize / Upsample of an opset-10-or-older model, in order."""
    view = GraphView(model)
    constants = {n.output[0]: onnx.numpy_helper.to_array(n.attribute[0].t) for n in model.graph.node
                 if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value"}
    found = []
    for node in model.graph.node:
        if node.op_type not in ("Resize", "Upsample"):
            continue
        attrs = view.attrs(node)
        scales = attrs.get("scales")  # Upsample before opset 9 has them as an attribute
        if scales is None and len(node.input) > 1:
            scales = view.const(node.input[1]) if view.is_const(node.input[1]) else constants.get(node.input[1])
        mode = attrs.get("mode", b"nearest")
        found.append((mode.decode() if isinstance(mode, bytes) else mode,
                      None if scales is None else np.asarray(scales, dtype=np.float64)))
    return found


def _keep_old_resize_meaning(model: ModelProto, resizes: list[tuple[str, np.ndarray | None]]) -> None:
    """Spell out what a Resize / Upsample meant before opset 11, which onnx's converter leaves to the new
    defaults (half_pixel): source pixels at ``x / scale``, the nearest one found as onnxruntime does (the
    one below when enlarging, above when shrinking). Bilinear upsampling of opset-10 exports otherwise
    moved by half a pixel (output cosine 0.87 against the source model)."""
    converted = [n for n in model.graph.node if n.op_type == "Resize"]
    if len(converted) != len(resizes):  # the converter keeps the nodes in order (it renames some outputs)
        log.warning("%d Resize / Upsample nodes became %d after the opset conversion; their coordinate mode "
                    "is left as converted", len(resizes), len(converted))
        return
    for node, (mode, scales) in zip(converted, resizes, strict=True):
        kept = [a for a in node.attribute if a.name not in ("coordinate_transformation_mode", "nearest_mode")]
        extra = {"coordinate_transformation_mode": "asymmetric"}
        if mode == "nearest":
            shrinks = scales is not None and bool(np.all(scales <= 1.0)) and bool(np.any(scales < 1.0))
            extra["nearest_mode"] = "ceil" if shrinks else "floor"
        del node.attribute[:]
        node.attribute.extend(kept)
        node.attribute.extend(helper.make_attribute(k, v) for k, v in extra.items())


def check_inputs_to_feed(model: ModelProto) -> None:
    """A model whose every graph input has a default value (an initializer of its name) has none to feed,
    as onnxruntime sees it: refused, saying so (it used to be a count of inputs, or a config error)."""
    inits = {t.name for t in model.graph.initializer}
    if not model.graph.input or any(vi.name not in inits for vi in model.graph.input):
        return
    names = [f"'{vi.name}'" for vi in model.graph.input]
    what = "has an initializer" if len(names) == 1 else "have initializers"
    raise HbError(f"the model has no input to feed: {', '.join(names)} also {what} of the same name (a default "
                  "value), which onnxruntime takes as a constant",
                  hint="remove those initializers from the model (keep the graph inputs), or re-export it")


def initializers_not_inputs(model: ModelProto) -> None:
    """Weights listed among the graph inputs (IR 3 required it; Caffe2 and old exporters did it) are
    constants here: once a pass folds or drops one, its input entry would otherwise become a real
    input that nobody feeds (ONNX's own 'light' SqueezeNet, VGG and DenseNet stopped that way)."""
    # From IR 4 on, initializers need not be inputs: the constants later stages add (folded
    # Constant nodes, requantization factors) would otherwise be unfed inputs too.
    model.ir_version = max(model.ir_version, 4)
    inits = {t.name for t in model.graph.initializer}
    kept = [vi for vi in model.graph.input if vi.name not in inits]
    check_inputs_to_feed(model)
    del model.graph.input[:]
    model.graph.input.extend(kept)


def tensor_outputs(model: ModelProto) -> None:
    """A runtime model hands back tensors: an output that is a sequence or a map (scikit-learn exports'
    ZipMap of class probabilities) is refused here, with the tensors to end the model at instead, not
    after calibration when the .bin is written."""
    view = GraphView(model)
    for out in model.graph.output:
        if out.type.HasField("tensor_type"):
            continue
        kind = (out.type.WhichOneof("value") or "untyped").replace("_type", "")
        maker = view.producer.get(out.name)
        made = f" (made by {maker.op_type} '{maker.name}')" if maker is not None else ""
        instead = [o.name for o in model.graph.output if o.type.HasField("tensor_type")]
        instead += [i for i in (maker.input if maker is not None else []) if i and not view.is_const(i)]
        hint = (f"end the model at tensors with output_nodes in model_parameters, e.g. output_nodes: "
                f"'{';'.join(dict.fromkeys(instead))}'") if instead else "export the model with tensor outputs"
        raise HbError(f"output '{out.name}' is a {kind}, not a tensor{made}; a runtime model's outputs are tensors",
                      hint=hint)
