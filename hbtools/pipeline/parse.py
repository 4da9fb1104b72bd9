"""Parse stage: load and check the float model, fix input shapes, pick outputs, insert HzPreprocess."""

from __future__ import annotations

import copy
import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import numpy as np
import onnx
from onnx import ModelProto, TensorProto, helper, version_converter

from hbtools.config.inputs import check_even_size, check_input_channels, check_input_source
from hbtools.config.model import Config, InputSpec
from hbtools.config.values import closest_names
from hbtools.errors import HbError, last_line
from hbtools.graph import precision
from hbtools.graph.graph import GraphView, infer_shapes, name_unnamed_nodes, remove_dead_nodes, topological_sort
from hbtools.graph.model_io import (
    ORT_EARLY_OPS,
    check_source_model,
    default_opset,
    early_ops,
    load_model,
    stand_down,
    stand_in,
    with_horizon_domain,
)
from hbtools.ops.preprocess import featuremap_normalisation, make_preprocess_node
from hbtools.quant.qdq import activation_pairs, integer_ops, strip_qdq

log = logging.getLogger("hbtools")

MAX_OUTPUTS = 32
MIN_WORKING_OPSET = 11  # the lowering of Hz ops needs Clip with tensor bounds and Round


@dataclass
class ParseResult:
    model: ModelProto  # the original float model (HzPreprocess in front)
    source: ModelProto  # the user's model with the same shapes/outputs, without HzPreprocess
    inputs: list[InputSpec]  # name and shape resolved
    loaded_thresholds: dict[str, float] = dataclasses.field(default_factory=dict)  # calibration_type load


def preprocess_node_name(input_name: str) -> str:
    return f"HZ_PREPROCESS_FOR_{input_name}"


def run(config: Config, *, checking: bool = False) -> ParseResult:
    """``checking`` (hb_mapper checker): a QDQ model is parsed as calibration_type load would parse it."""
    model, path = load_source_model(config)
    _ordered_and_typed(model)
    check_source_model(model, path)
    others = precision.other_floats(model)
    if others:
        log.info("the model computes in %s; converting it to float32 (calibration measures float32 values)",
                 " and ".join(others))
        model = precision.to_float32(model)
    model = _working_opset(model)
    _initializers_not_inputs(model)
    _unique_node_names(model)
    name_unnamed_nodes(model)
    load = config.calibration.calibration_type == "load"
    if not load and _already_quantized(model, config, checking):
        load = checking  # the checker reports the placement load gives; makertbin does what the config says
    loaded = strip_qdq(model) if load else {}
    inputs = resolve_inputs(model, config.inputs)
    for spec in inputs:  # the config could only check the shapes it gives itself
        check_input_source(spec, config.compiler.input_source.get(spec.name),
                           f"the model's input shape {'x'.join(map(str, spec.shape))}")
    declared = {vi.name: _dims(vi) for vi in model.graph.input}
    _fix_input_shapes(model, inputs)
    if config.input_batch > 1:
        for spec in inputs:
            if spec.shape and spec.shape[0] != 1:
                raise HbError(f"input_batch {config.input_batch} needs inputs of batch 1, but input '{spec.name}' "
                              f"has shape {'x'.join(map(str, spec.shape))}",
                              hint="set input_batch: 1, or give input_shape with a first dimension of 1 if the "
                                   "model allows it")
    if config.model.output_nodes:
        _set_outputs(model, config.model.output_nodes)
    _tensor_outputs(model)
    if len(model.graph.output) > MAX_OUTPUTS:
        raise HbError(f"the model has {len(model.graph.output)} outputs; at most {MAX_OUTPUTS} are supported",
                      hint="use output_nodes to select the outputs you need")
    remove_dead_nodes(model)
    model = _infer(model)
    source = copy.deepcopy(model)
    if any(declared.get(s.name) != s.shape for s in inputs):  # input_shape overrides what the model says
        _dry_run(source, inputs, declared)
    _insert_preprocess(model, inputs)
    model = _infer(model)
    onnx.checker.check_model(model)
    return ParseResult(model, source, inputs, loaded)


def _ordered_and_typed(model: ModelProto) -> None:
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
    bare = [o for o in model.graph.output
            if o.type.HasField("tensor_type") and not o.type.tensor_type.HasField("shape")]
    if not bare:
        return
    try:
        typed = {o.name: o.type for o in infer_shapes(copy.deepcopy(model)).graph.output}
    except (onnx.shape_inference.InferenceError, ValueError):
        return  # the checker or onnxruntime says what is wrong
    for o in bare:
        if o.name in typed and typed[o.name].tensor_type.HasField("shape"):
            o.type.CopyFrom(typed[o.name])


def _unique_node_names(model: ModelProto) -> None:
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


def _already_quantized(model: ModelProto, config: Config, checking: bool) -> bool:
    """Whether a model not converted with calibration_type load is a QDQ model, which load is for; says so.

    Its QuantizeLinear / DequantizeLinear pairs have no BPU form, and a Conv whose weight comes out of a
    DequantizeLinear has none either: without load, the whole model ends up on the CPU."""
    pairs = activation_pairs(model)
    if not pairs:
        _integer_format(model)
        return False
    what = (f"the model is already quantized: it has {pairs} QuantizeLinear -> DequantizeLinear pair(s) (a QDQ "
            "model, e.g. a QAT export)")
    if checking:
        log.warning("%s; checked as makertbin converts it with calibration_type 'load' (the pairs removed, their "
                    "scales kept): set calibration_type: 'load' in calibration_parameters to convert it", what)
    else:
        log.warning("%s; with calibration_type '%s' the pairs and the convs and matmuls they feed run on the CPU: "
                    "set calibration_type: 'load' in calibration_parameters to convert it with its own scales",
                    what, config.calibration.calibration_type)
    return True


def _integer_format(model: ModelProto) -> None:
    """Says so when the model was quantized by onnxruntime into integer operators: those run on the CPU as
    they are (onnxruntime's kernels), and only the float model they were made from converts to the BPU."""
    counts = integer_ops(model)
    if counts:
        listed = ", ".join(f"{n} {op}" for op, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
        log.warning("the model is already quantized by onnxruntime (%s): these nodes have no BPU form and run on the "
                    "CPU with their own integer arithmetic, and so does most of what they feed; convert the float "
                    "model they were made from (before quantize_dynamic / quantize_static) to run it on the BPU",
                    listed)


def load_source_model(config: Config) -> tuple[ModelProto, Path]:
    """The user's float model as ONNX: read, or converted from Caffe (with the config's input shapes)."""
    m = config.model
    if m.model_type == "caffe":
        from hbtools.frontends.caffe import load_caffe

        log.info("Using caffe model files: %s, %s", m.prototxt, m.caffe_model)
        shapes = {s.name: s.shape for s in config.inputs if s.shape}
        return load_caffe(m.prototxt, m.caffe_model, shapes), m.caffe_model
    log.info("Using onnx model file: %s", m.onnx_model)
    return load_model(m.onnx_model), m.onnx_model


def _working_opset(model: ModelProto) -> ModelProto:
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
        converted = version_converter.convert_version(model, target)
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


def _initializers_not_inputs(model: ModelProto) -> None:
    """Weights listed among the graph inputs (IR 3 required it; Caffe2 and old exporters did it) are
    constants here: once a pass folds or drops one, its input entry would otherwise become a real
    input that nobody feeds (ONNX's own 'light' SqueezeNet, VGG and DenseNet stopped that way)."""
    # From IR 4 on, initializers need not be inputs: the constants later stages add (folded
    # Constant nodes, requantization factors) would otherwise be unfed inputs too.
    model.ir_version = max(model.ir_version, 4)
    inits = {t.name for t in model.graph.initializer}
    kept = [vi for vi in model.graph.input if vi.name not in inits]
    del model.graph.input[:]
    model.graph.input.extend(kept)


def _dims(vi) -> list[int | None]:
    return [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None
            for d in vi.type.tensor_type.shape.dim]


def resolve_inputs(model: ModelProto, specs: list[InputSpec]) -> list[InputSpec]:
    """Match config inputs to the model's inputs; fill names and shapes; check them."""
    view = GraphView(model)
    graph_inputs = {i.name: i for i in model.graph.input if i.name in view.graph_inputs}
    names = list(graph_inputs)
    if len(specs) != len(names):
        raise HbError(f"the config describes {len(specs)} input(s) but the model has {len(names)}: {names}",
                      hint="list every model input in input_name (and the per-input parameters)")
    resolved = []
    for k, spec in enumerate(specs):
        name = spec.name
        if name is None:
            if len(names) > 1:
                raise HbError("input_name is required for a model with several inputs", hint=f"model inputs: {names}")
            name = names[k]
        if name not in graph_inputs:
            raise HbError(f"input_name '{name}' is not an input of the model{closest_names(name, names)}; "
                          f"its inputs are {names}")
        model_shape = _dims(graph_inputs[name])
        shape = spec.shape or model_shape
        if spec.shape and len(spec.shape) != len(model_shape):
            raise HbError(f"input '{name}': input_shape {spec.shape} has rank {len(spec.shape)} "
                          f"but the model input has rank {len(model_shape)}")
        if spec.shape:
            _check_not_transposed(name, spec.shape, model_shape)
            for given, fixed in zip(spec.shape, model_shape, strict=True):
                if fixed is not None and given != fixed:
                    log.warning("input '%s': input_shape %s overrides the model's shape %s", name, spec.shape,
                                model_shape)
                    break
        if shape is None or any(d is None for d in shape):
            raise HbError(f"input '{name}' has a dynamic shape {['?' if d is None else d for d in model_shape]}",
                          hint="set input_shape in input_parameters (e.g. '1x3x224x224')")
        elem = graph_inputs[name].type.tensor_type.elem_type
        r = dataclasses.replace(spec, name=name, shape=[int(d) for d in shape],
                                model_dtype=np.dtype(helper.tensor_dtype_to_np_dtype(elem)).name)
        if r.type_train != "featuremap" and r.model_dtype != "float32":
            raise HbError(f"input '{name}' is {r.model_dtype} in the model; only float inputs can be images",
                          hint="use input_type_train/input_type_rt 'featuremap' for this input")
        if r.type_train != "featuremap":
            if len(r.shape) != 4:
                raise HbError(f"input '{name}' has rank {len(r.shape)}; only 4-D inputs can be images",
                              hint="use input_type_train/input_type_rt 'featuremap' for this input")
            check_input_channels(r, r.shape[1] if r.layout_train == "NCHW" else r.shape[3])
            check_even_size(r, f"the model's input shape {'x'.join(map(str, r.shape))}")
        resolved.append(r)
    return resolved


def _check_not_transposed(name: str, given: list[int], model_shape: list[int | None]) -> None:
    """An input_shape that is the model's own 4-D shape in the other layout is a layout mix-up, not an override
    (left alone it ends in an onnxruntime error deep inside the first convolution)."""
    if len(given) != 4 or None in model_shape or list(given) == list(model_shape):
        return
    text = "x".join(map(str, model_shape))
    for src, dst in (("NCHW", "NHWC"), ("NHWC", "NCHW")):
        if [model_shape[src.index(c)] for c in dst] == list(given):
            raise HbError(f"input '{name}': input_shape {'x'.join(map(str, given))} is the model's shape {text} "
                          f"in {dst} order, but the model takes {src}",
                          hint=f"input_shape is in the model's own layout: give {text}")


def _dry_run(model: ModelProto, inputs: list[InputSpec], declared: dict[str, list[int | None]]) -> None:
    """Run the model once on zeros, so an input_shape it cannot take stops here with its name (and the inputs
    whose fixed sizes in the model it changed, ``declared``)."""
    import numpy as np

    from hbtools.runtime.session import make_session

    inits = {t.name for t in model.graph.initializer}
    feeds = {}
    for vi in model.graph.input:
        if vi.name not in inits:
            dtype = helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)
            feeds[vi.name] = np.zeros([d.dim_value for d in vi.type.tensor_type.shape.dim], dtype=dtype)
    shapes = ", ".join(f"{s.name} {'x'.join(map(str, s.shape)) or 'scalar'}" for s in inputs)
    try:
        session = make_session(model)
    except HbError:
        raise
    except Exception as e:  # onnxruntime's exception types are not importable
        if _loads_with_declared_shapes(model, declared):
            raise HbError(f"onnxruntime takes the model only while the input sizes it leaves open stay open; with "
                          f"them fixed ({shapes}), as conversion needs, it refuses it: {last_line(e)}",
                          hint="the model changes its own structure with its input sizes (e.g. an If that "
                               "squeezes a dimension only when it is 1, from a scripted export); export it with "
                               "fixed input sizes (a traced export without dynamic axes) and convert that") from None
        _cannot_run(e, inputs, declared, shapes)
    try:
        session.run(None, feeds)
    except HbError:
        raise
    except Exception as e:
        _cannot_run(e, inputs, declared, shapes)


def _cannot_run(error: Exception, inputs: list[InputSpec], declared: dict[str, list[int | None]],
                shapes: str) -> NoReturn:
    changed = [f"'{s.name}' is {'x'.join('?' if d is None else str(d) for d in declared[s.name])}"
               for s in inputs if s.name in declared and any(
                   d is not None and d != g for d, g in zip(declared[s.name], s.shape, strict=False))]
    hint = "check input_shape (it is in the model's own layout and must fit its layers)"
    if changed:
        hint = (f"input_shape changes sizes the model fixes ({'; '.join(changed)} in the model): give those "
                f"shapes, and check that input_name lists the inputs in the order of the other input "
                f"parameters")
    raise HbError(f"the model cannot run with the input shapes {shapes}: {last_line(error)}", hint=hint) from None


def _loads_with_declared_shapes(model: ModelProto, declared: dict[str, list[int | None]]) -> bool:
    """Whether onnxruntime takes ``model`` once its inputs have the sizes the source model declared (open
    sizes named again), its inferred shapes forgotten."""
    from hbtools.runtime.session import make_session

    loose = copy.deepcopy(model)
    _forget_inferred(loose.graph)
    for vi in loose.graph.input:
        dims = declared.get(vi.name)
        if dims is None or len(dims) != len(vi.type.tensor_type.shape.dim):
            continue
        for k, (d, size) in enumerate(zip(vi.type.tensor_type.shape.dim, dims, strict=True)):
            d.Clear()
            if size is None:
                d.dim_param = f"{vi.name}_dim{k}"
            else:
                d.dim_value = size
    for out in loose.graph.output:
        for d in out.type.tensor_type.shape.dim:
            d.Clear()
    try:
        make_session(loose)
    except Exception:  # noqa: BLE001 - any failure: the fixed shapes are not the only problem
        return False
    return True


def _forget_inferred(graph: onnx.GraphProto) -> None:
    del graph.value_info[:]
    for node in graph.node:
        for attr in node.attribute:
            for sub in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs:
                _forget_inferred(sub)


def _fix_input_shapes(model: ModelProto, inputs: list[InputSpec]) -> None:
    shapes = {s.name: s.shape for s in inputs}
    for vi in model.graph.input:
        if vi.name in shapes:
            dims = vi.type.tensor_type.shape
            dims.ClearField("dim")
            for d in shapes[vi.name]:
                dims.dim.add().dim_value = d
    del model.graph.value_info[:]
    for out in model.graph.output:
        # Keep the rank (the checker needs a shape) but forget stale sizes.
        for d in out.type.tensor_type.shape.dim:
            d.Clear()


def _tensor_outputs(model: ModelProto) -> None:
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


def _set_outputs(model: ModelProto, output_nodes: list[str]) -> None:
    view = GraphView(model)
    outputs = []
    for name in output_nodes:
        node = view.node_by_name.get(name)
        if node is not None:
            outputs.extend(o for o in node.output if o)
        elif name in view.producer:
            outputs.append(name)
        else:
            raise HbError(f"output_nodes: '{name}' is neither a node nor a tensor of the model")
    del model.graph.output[:]
    model.graph.output.extend(helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs)


def _insert_preprocess(model: ModelProto, inputs: list[InputSpec]) -> None:
    nodes = []
    for spec in inputs:
        if spec.type_train == "featuremap":
            if spec.norm_type != "no_preprocess" and spec.shape is not None and len(spec.shape) == 4:
                _normalise_featuremap(model, spec, nodes)
            continue
        raw, normalised = spec.name, f"{spec.name}_hz_preprocessed"
        for node in model.graph.node:
            for k, i in enumerate(node.input):
                if i == raw:
                    node.input[k] = normalised
        if any(out.name == raw for out in model.graph.output):
            # The converted model takes an image input as int8 data (uint8 - 128) in the runtime colour
            # space; handed back as the output it would not be the float image the model returns.
            others = [out.name for out in model.graph.output if out.name != raw]
            raise HbError(f"input '{raw}' is also a model output, which an image input (input_type_rt "
                          f"{spec.type_rt}) cannot be: the converted model takes it as int8 image data, not the "
                          f"float tensor the model hands back",
                          hint=(f"leave it out of the outputs with output_nodes: '{'; '.join(others)}', or " if others
                                else "") + "give it input_type_train and input_type_rt featuremap")
        channels = spec.shape[1] if spec.layout_train == "NCHW" else spec.shape[3]
        nodes.append(make_preprocess_node(spec, raw, normalised, preprocess_node_name(raw), channels))
        for vi in model.graph.input:
            if vi.name == raw:
                vi.type.tensor_type.elem_type = TensorProto.INT8
    existing = list(model.graph.node)
    del model.graph.node[:]
    model.graph.node.extend([*nodes, *existing])
    with_horizon_domain(model)


def _normalise_featuremap(model: ModelProto, spec: InputSpec, nodes: list) -> None:
    """``(x - mean) * scale`` in front of a 4-D featuremap input whose norm_type asks for it (a float input
    takes no HzPreprocess; its normalisation is ordinary ops)."""
    raw, normalised = spec.name, f"{spec.name}_hz_normalised"
    for node in model.graph.node:
        for k, i in enumerate(node.input):
            if i == raw:
                node.input[k] = normalised
    for out in model.graph.output:  # an output that is the input itself stays the raw input
        if out.name == raw:
            raise HbError(f"input '{raw}' is also a model output; norm_type {spec.norm_type} would change what "
                          f"the model hands back", hint="set its norm_type to no_preprocess")
    channels = spec.shape[1] if spec.layout_train == "NCHW" else spec.shape[3]
    added, constants = featuremap_normalisation(spec, raw, normalised, channels)
    nodes.extend(added)
    model.graph.initializer.extend(constants)


def _infer(model: ModelProto) -> ModelProto:
    return infer_shapes(model)
