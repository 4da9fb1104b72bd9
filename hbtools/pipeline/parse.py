"""Parse stage: load and check the float model, fix input shapes, pick outputs, insert HzPreprocess."""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from onnx import ModelProto, TensorProto, ValueInfoProto, helper

from hbtools.config.inputs import (
    FEATUREMAP_NORM_REFUSED,
    check_even_size,
    check_input_channels,
    check_input_source,
    check_layout_fits,
    featuremap_norm_refused,
)
from hbtools.config.model import Config, InputSpec
from hbtools.config.values import closest_names
from hbtools.errors import HbError
from hbtools.graph import precision, shape_trial, source_repairs
from hbtools.graph.contrib import expand_contrib_ops
from hbtools.graph.graph import GraphView, compact, infer_shapes, name_unnamed_nodes, remove_dead_nodes
from hbtools.graph.model_io import (
    check_finite_weights,
    check_model,
    check_source_model,
    load_model,
    with_horizon_domain,
)
from hbtools.ops.base import DOMAIN, fresh_name
from hbtools.ops.preprocess import featuremap_normalisation, make_preprocess_node
from hbtools.quant.qdq import (
    activation_pairs,
    fold_quantization_parameters,
    integer_ops,
    quantized_weights,
    strip_qdq,
)

log = logging.getLogger("hbtools")

MAX_OUTPUTS = 32


@dataclass
class ParseResult:
    model: ModelProto  # the original float model (HzPreprocess in front)
    inputs: list[InputSpec]  # name and shape resolved
    loaded_thresholds: dict[str, float] = dataclasses.field(default_factory=dict)  # calibration_type load
    loaded_int16: set[str] = dataclasses.field(default_factory=set)  # ... the tensors of its 16-bit pairs

    def take_model(self) -> ModelProto:
        """The model, no longer held here: a caller done with the original lets its weights go."""
        model, self.model = self.model, None
        return model


# The nodes only makertbin writes, and which of its artefacts holds them.
_ARTEFACT_KINDS = (({"HzCalibration", "HzBiasCalibration"}, "calibrated model (*_calibrated_model.onnx)"),
                   ({"HzQuantize", "HzDequantize", "HzRequantize", "HzLut"},
                    "quantized model (*_quantized_model.onnx)"),
                   ({"HzPreprocess"}, "float model with its input preprocessing in it (*_original_float_model.onnx or "
                                      "*_optimized_float_model.onnx)"))


def _refuse_artefacts(model: ModelProto, path: Path) -> None:
    """A model makertbin wrote, given back as the model to convert: its inputs are already preprocessed or
    integers, and what the later stages said of it (an int8 input, nothing computed at run time) sent the
    user the wrong way."""
    ops = {n.op_type for n in model.graph.node if n.domain == DOMAIN}
    for marks, kind in _ARTEFACT_KINDS:
        found = sorted(ops & marks) or (sorted(o for o in ops if o.startswith("HzSQuantized")) if "quantized" in kind
                                        else [])
        if found:
            raise HbError(f"'{path}' is a {kind} that makertbin wrote (it holds {found[0]} nodes), not a float model "
                          "to convert", hint="give the float model it was made from as onnx_model (--model for "
                                             "the checker)")


def preprocess_node_name(input_name: str) -> str:
    return f"HZ_PREPROCESS_FOR_{input_name}"


def run(config: Config, *, checking: bool = False) -> ParseResult:
    """``checking`` (hb_mapper checker): a QDQ model is parsed as calibration_type load would parse it."""
    model, path = load_source_model(config)
    _refuse_artefacts(model, path)
    source_repairs.ordered_and_typed(model)
    # onnx's checker refuses onnxruntime's ops in the ONNX domain (its SimplifiedLayerNormalization)
    expand_contrib_ops(model, onnx_domain_only=True)
    source_repairs.deprecated_ops(model)
    source_repairs.experimental_ops(model)
    source_repairs.per_activation_batch_norms(model)
    source_repairs.shape_inputs(model, {s.name: s.shape for s in config.inputs if s.name and s.shape})
    check_source_model(model, path)
    check_finite_weights(model, path)
    others = precision.other_floats(model)
    if others:
        log.info("the model computes in %s; converting it to float32 (calibration measures float32 values)",
                 " and ".join(others))
        model = precision.to_float32(model)
    model = source_repairs.working_opset(model)
    source_repairs.initializers_not_inputs(model)
    source_repairs.unique_node_names(model)
    name_unnamed_nodes(model)
    load = config.calibration.calibration_type == "load"
    fold_quantization_parameters(model)  # a QAT export's Constant-node scales, as load reads initializers
    if not load and _already_quantized(model, config, checking):
        load = checking  # the checker reports the placement load gives; makertbin does what the config says
    loaded, loaded_int16 = {}, set()
    if load:
        loaded = strip_qdq(model, loaded_int16)
    elif stored := quantized_weights(model):
        # Weights stored as integers behind a DequantizeLinear, activations float (weight-only quantization):
        # the weights are the constants they stand for, and the model a float model to calibrate.
        log.info("%d weights are stored as integers (DequantizeLinear of a constant): converted as the float "
                 "weights they stand for", stored)
        strip_qdq(model)
    inputs = resolve_inputs(model, config.inputs)
    for spec in inputs:  # the config could only check the shapes it gives itself
        check_input_source(spec, config.compiler.input_source.get(spec.name),
                           f"the model's input shape {'x'.join(map(str, spec.shape))}")
    declared = {vi.name: _dims(vi) for vi in model.graph.input}
    # Where input_shape changes nothing, the model's own output sizes stand for those inference cannot tell.
    stated = {o.name: [copy.deepcopy(d) for d in o.type.tensor_type.shape.dim] for o in model.graph.output} \
        if all(declared.get(s.name) == s.shape for s in inputs) else {}
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
        source_repairs.shaped_outputs(model)
    source_repairs.tensor_outputs(model)
    source_repairs.reserved_names(model)
    if len(model.graph.output) > MAX_OUTPUTS:
        raise HbError(f"the model has {len(model.graph.output)} outputs; at most {MAX_OUTPUTS} are supported",
                      hint="use output_nodes to select the outputs you need")
    remove_dead_nodes(model)
    source_repairs.typed_by_running(model)  # behind an op onnx cannot shape: what onnxruntime gives
    model = _infer(model)
    if any(declared.get(s.name) != s.shape for s in inputs):  # input_shape overrides what the model says
        shape_trial.dry_run(model, inputs, declared)
    _insert_preprocess(model, inputs)
    model = infer_shapes(model, output_sizes=True)
    _restore_output_sizes(model, stated)
    check_model(model)
    # The repairs above edit the model in place; every stage after this one holds it or a copy of it.
    return ParseResult(compact(model), inputs, loaded, loaded_int16)


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


def load_source_model(config: Config, *, purpose: str = "Using") -> tuple[ModelProto, Path]:
    """The user's float model as ONNX: read, or converted from Caffe (with the config's input shapes).

    ``purpose`` starts the log line naming the files: hb_mapper infer reads the model only for its input
    names and shapes, and runs another file."""
    m = config.model
    if m.model_type == "caffe":
        from hbtools.frontends.caffe import load_caffe

        log.info("%s caffe model files: %s, %s", purpose, m.prototxt, m.caffe_model)
        shapes = {s.name: s.shape for s in config.inputs if s.shape}
        return load_caffe(m.prototxt, m.caffe_model, shapes), m.caffe_model
    log.info("%s onnx model file: %s", purpose, m.onnx_model)
    return load_model(m.onnx_model), m.onnx_model


def _dims(vi) -> list[int | None]:
    return [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None
            for d in vi.type.tensor_type.shape.dim]


def shape_example(dims: list[int | None]) -> str:
    """A static shape to suggest for a model input with dynamic ``dims``, in the model's own layout:
    its static dims kept, a dynamic batch 1, other dynamic dims ``<size>`` (``?x24x24x3`` -> ``1x24x24x3``)."""
    return "x".join(str(d) if d is not None else ("1" if k == 0 else "<size>") for k, d in enumerate(dims))


def _input_shape_hint(specs: list[InputSpec], graph_inputs: dict[str, ValueInfoProto], k: int) -> str:
    """How to set input_shape for input ``k``: with several inputs the whole value, one shape per input in
    input_name order (the given ones kept), since a single shape goes to the first input."""
    def example(spec: InputSpec) -> str:
        vi = graph_inputs.get(spec.name or "")
        return shape_example(_dims(vi)) if vi is not None else "<shape>"

    own = example(specs[k])
    if len(specs) == 1:
        return f"set input_shape in input_parameters, in the model's own layout: input_shape: '{own}'"
    shapes = ["x".join(map(str, s.shape)) if s.shape else example(s) for s in specs]
    shapes[k] = own
    return (f"set input_shape in input_parameters, one shape per input in input_name order, each in the model's "
            f"own layout: input_shape: '{';'.join(shapes)}'")


def fit_scalar(shape: list[int], model_shape: list[int | None]) -> list[int]:
    """A shape given for a 0-D model input (a scalar such as a sample rate): '1' is the scalar.

    The config has no way to write an empty shape between two others but leaving the piece
    out; one element is what a user writes for "a single number"."""
    if not model_shape and len(shape) == 1 and shape[0] == 1:
        return []
    return shape


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
        if graph_inputs[name].type.tensor_type.elem_type == TensorProto.STRING:
            raise HbError(f"input '{name}' is a string tensor; hbtools converts models that compute on numbers (the "
                          "BPU and the .bin take numeric tensors only)",
                          hint="keep the string handling (tokenizing, lookups) outside the model and give it the "
                               "numbers it computes on")
        model_shape = _dims(graph_inputs[name])
        if spec.shape:
            spec = dataclasses.replace(spec, shape=fit_scalar(spec.shape, model_shape))
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
                          hint=_input_shape_hint(specs, graph_inputs, k))
        elem = graph_inputs[name].type.tensor_type.elem_type
        r = dataclasses.replace(spec, name=name, shape=[int(d) for d in shape],
                                model_dtype=np.dtype(helper.tensor_dtype_to_np_dtype(elem)).name)
        if featuremap_norm_refused(r):  # the config could check only a shape it gives itself
            raise HbError(f"input '{name}' (shape {'x'.join(map(str, r.shape))} in the model): "
                          f"{FEATUREMAP_NORM_REFUSED}")
        if r.type_train != "featuremap" and r.model_dtype != "float32":
            raise HbError(f"input '{name}' is {r.model_dtype} in the model; only float inputs can be images",
                          hint="use input_type_train/input_type_rt 'featuremap' for this input")
        if r.type_train != "featuremap":
            if len(r.shape) != 4:
                raise HbError(f"input '{name}' has rank {len(r.shape)}; only 4-D inputs can be images",
                              hint="use input_type_train/input_type_rt 'featuremap' for this input")
            model_shape_text = f"the model's input shape {'x'.join(map(str, r.shape))}"
            check_layout_fits(r, model_shape_text)
            check_input_channels(r, r.shape[1] if r.layout_train == "NCHW" else r.shape[3])
            check_even_size(r, model_shape_text)
        resolved.append(r)
    return resolved


def _check_not_transposed(name: str, given: list[int], model_shape: list[int | None]) -> None:
    """An input_shape that is the model's own 4-D shape in the other layout is a layout mix-up, not an override
    (left alone it ends in an onnxruntime error deep inside the first convolution)."""
    def fits(shape: list[int]) -> bool:
        return all(m is None or m == g for m, g in zip(model_shape, shape, strict=True))

    if len(given) != 4 or fits(given):
        return
    text = "x".join("?" if d is None else str(d) for d in model_shape)
    for src, dst in (("NCHW", "NHWC"), ("NHWC", "NCHW")):
        # The model's open sizes (a height and width left dynamic) may take any value; its fixed ones
        # (the channels) tell the layout.
        back = [given[dst.index(c)] for c in src]
        if fits(back):
            raise HbError(f"input '{name}': input_shape {'x'.join(map(str, given))} is the model's shape {text} "
                          f"in {dst} order, but the model takes {src}",
                          hint=f"input_shape is in the model's own layout: give {'x'.join(map(str, back))}")


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
        # Keep the rank (the checker needs a shape) but forget sizes the new input shapes may change:
        # the last shape inference of ``run`` writes them again.
        for d in out.type.tensor_type.shape.dim:
            d.Clear()


def _restore_output_sizes(model: ModelProto, stated: dict[str, list]) -> None:
    """The output sizes shape inference left unknown, as the source model ``stated`` them."""
    for out in model.graph.output:
        dims = out.type.tensor_type.shape.dim
        source = stated.get(out.name)
        if source is None or len(source) != len(dims):
            continue
        for mine, theirs in zip(dims, source, strict=True):
            if not mine.HasField("dim_value") and not mine.HasField("dim_param"):
                mine.CopyFrom(theirs)


def _set_outputs(model: ModelProto, output_nodes: list[str]) -> None:
    view = GraphView(model)
    aliases = _blob_aliases(model)
    outputs = []
    for name in output_nodes:
        node = view.node_by_name.get(name)
        if node is not None:
            outputs.extend(o for o in node.output if o)
        elif name in view.producer:
            outputs.append(name)
        elif name in aliases:  # a Caffe blob an Identity layer (Dropout, Split) wrote: a copy under its name
            copy_name = fresh_name(f"{name}_output", set(view.node_by_name))
            model.graph.node.append(helper.make_node("Identity", [aliases[name]], [name], name=copy_name))
            outputs.append(name)
        elif name in view.graph_inputs:
            raise HbError(f"output_nodes: '{name}' is an input of the model, which no node computes; name the nodes "
                          "(or the tensors they write) whose results the model should also output")
        else:
            known = [*view.node_by_name, *view.producer, *aliases]  # node names first: what users usually give
            raise HbError(f"output_nodes: '{name}' is neither a node nor a tensor of the model"
                          f"{closest_names(name, dict.fromkeys(known))}")
    repeated = [o for o in dict.fromkeys(outputs) if outputs.count(o) > 1]
    if repeated:  # ONNX outputs need distinct names; a .bin with two of one name gave one of them
        log.warning("output_nodes: %s named more than once (a node's name and the tensor it writes, or a name "
                    "that is both a layer and another layer's blob); each is output once",
                    ", ".join(f"tensor '{o}' is" for o in repeated))
    del model.graph.output[:]
    model.graph.output.extend(helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in dict.fromkeys(outputs))


def _blob_aliases(model: ModelProto) -> dict[str, str]:
    """The Caffe reader's blobs that have no tensor of their own name (``BLOB_ALIASES``): blob -> tensor."""
    from hbtools.frontends.caffe.builder import BLOB_ALIASES

    prop = next((p.value for p in model.metadata_props if p.key == BLOB_ALIASES), None)
    return json.loads(prop) if prop else {}


def _insert_preprocess(model: ModelProto, inputs: list[InputSpec]) -> None:
    nodes = []
    # The names given below must be new: a model may already use one (an artefact cut and converted again).
    taken = {t for n in model.graph.node for t in (*n.input, *n.output, n.name)} | \
        {v.name for v in (*model.graph.input, *model.graph.output, *model.graph.initializer)}

    def fresh(name: str) -> str:
        return fresh_name(name, taken)

    for spec in inputs:
        if spec.type_train == "featuremap":
            if spec.norm_type != "no_preprocess" and spec.shape is not None and len(spec.shape) == 4:
                _normalise_featuremap(model, spec, nodes, fresh(f"{spec.name}_hz_normalised"))
            continue
        raw, normalised = spec.name, fresh(f"{spec.name}_hz_preprocessed")
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
        nodes.append(make_preprocess_node(spec, raw, normalised, fresh(preprocess_node_name(raw)), channels))
        for vi in model.graph.input:
            if vi.name == raw:
                vi.type.tensor_type.elem_type = TensorProto.INT8
    existing = list(model.graph.node)
    del model.graph.node[:]
    model.graph.node.extend([*nodes, *existing])
    with_horizon_domain(model)


def _normalise_featuremap(model: ModelProto, spec: InputSpec, nodes: list, normalised: str) -> None:
    """``(x - mean) * scale`` in front of a 4-D featuremap input whose norm_type asks for it (a float input
    takes no HzPreprocess; its normalisation is ordinary ops), into tensor ``normalised``."""
    raw = spec.name
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
