"""Loading, checking and atomically saving ONNX models, and their JSON metadata entries: the one place
that does it."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from itertools import accumulate
from pathlib import Path
from typing import BinaryIO

import numpy as np
import onnx
import onnx.numpy_helper
from onnx import ModelProto

from hbtools.errors import HbError, os_error
from hbtools.ops.base import DOMAIN, DOMAIN_VERSION
from hbtools.outputs import replace_atomically
from hbtools.runs.transaction import warn_if_mid_commit

MIN_OPSET, MAX_OPSET = 1, 21  # below 11, the parse stage converts (onnx version converter)
MAX_IR_VERSION = 10
# The most bytes protobuf writes or reads as one message (onnx.checker.MAXIMUM_PROTOBUF): a model over it
# cannot be serialized whole, only with its weights kept apart (onnx's external data).
PROTOBUF_LIMIT = 2**31


def load_model(path: str | Path) -> ModelProto:
    """Load an ONNX file, turning every way it can be unreadable into an HbError."""
    path = Path(path)
    if not path.is_file():
        state = ("is a folder, not a model file" if path.is_dir() else
                 "is not a regular file (a device or pipe)" if path.exists() else "does not exist")
        raise HbError(f"model file '{path}' {state}", hint="check the model path")
    _refuse_bin(path)
    warn_if_mid_commit(path)
    try:
        model = onnx.load(str(path))
    except Exception as exc:  # protobuf raises several unrelated types
        missing = _missing_external_data(path)
        if missing:
            raise HbError(f"model '{path}' keeps its weights in {', '.join(missing[:3])}, which "
                          f"{'is' if len(missing) == 1 else 'are'} not next to it",
                          hint="copy the data file(s) saved with the model into the model's folder (an ONNX model "
                               "saved with external data names them relative to itself)") from exc
        raise HbError(f"'{path}' is not a readable ONNX model ({type(exc).__name__}: {exc})") from exc
    if not model.graph.node:
        caffe = path.suffix.lower() in (".caffemodel", ".prototxt")
        raise HbError(f"'{path}' is not a readable ONNX model (the graph has no nodes)",
                      hint="it is a Caffe file: give --model-type caffe, with the .prototxt as --proto and the "
                           ".caffemodel as --model" if caffe else None)
    dense_constants(model)
    return model


def dense_constants(model: ModelProto) -> None:
    """Weights stored sparse (``graph.sparse_initializer``, a ``Constant``'s ``sparse_value``: a pruned model) as the
    dense tensors they stand for, as onnxruntime makes them when it loads the model: the graph passes and the
    quantizer read dense initializers."""
    graph = model.graph
    graph.initializer.extend(_dense(sparse) for sparse in graph.sparse_initializer)
    del graph.sparse_initializer[:]
    for node in graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            for attr in node.attribute:
                if attr.name == "sparse_value":
                    attr.CopyFrom(onnx.helper.make_attribute("value", _dense(attr.sparse_tensor)))


def _dense(sparse: onnx.SparseTensorProto) -> onnx.TensorProto:
    values = onnx.numpy_helper.to_array(sparse.values)
    indices = onnx.numpy_helper.to_array(sparse.indices).astype(np.int64)
    dims = tuple(int(d) for d in sparse.dims)
    dense = np.zeros(int(np.prod(dims)), dtype=values.dtype)
    # indices: linear positions [NNZ], or coordinates [NNZ, rank]
    dense[indices if indices.ndim == 1 else np.ravel_multi_index(tuple(indices.T), dims)] = values
    return onnx.numpy_helper.from_array(dense.reshape(dims), sparse.values.name)


def _missing_external_data(path: Path) -> list[str]:
    """The external data files ``path`` names that are not beside it (none where it cannot be read so)."""
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception:  # noqa: BLE001 - not an ONNX file at all: the caller says so
        return []
    names = {e.value for t in model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL
             for e in t.external_data if e.key == "location"}
    return sorted(n for n in names if not (path.parent / n).is_file())


def _refuse_bin(path: Path) -> None:
    from hbtools.runtime.binfile import MAGIC

    try:
        with open(path, "rb") as fh:
            head = fh.read(len(MAGIC))
    except PermissionError as e:
        raise os_error(e, "cannot read model file") from None
    except OSError as e:
        raise HbError(f"cannot read model file '{path}': {e.strerror or e}") from None
    if head == MAGIC:
        raise HbError(f"'{path}' is an hbtools .bin runtime model; this command needs an ONNX model (the "
                      f"*_original_float/_optimized_float/_calibrated/_quantized_model.onnx artefacts of makertbin)",
                      hint="run a .bin with hrt_model_exec infer, or compare it with hb_verifier")


def default_opset(model: ModelProto) -> int:
    for op in model.opset_import:
        if op.domain in ("", "ai.onnx"):
            return op.version
    return 0


def check_source_model(model: ModelProto, path: str | Path) -> None:
    """Constraints on a user's float model (SPEC §3)."""
    opset = default_opset(model)
    if not MIN_OPSET <= opset <= MAX_OPSET:
        raise HbError(
            f"'{path}' uses opset {opset}; supported default-domain opsets are {MIN_OPSET}..{MAX_OPSET}",
            hint="re-export the model with a supported opset",
        )
    check_layers_supported(model)
    if model.ir_version > MAX_IR_VERSION:
        raise HbError(f"'{path}' has IR version {model.ir_version}; at most {MAX_IR_VERSION} is supported",
                      hint=f"newer onnx packages write IR {model.ir_version} by default: export with an onnx release "
                           f"that writes IR {MAX_IR_VERSION}, or, if the model uses no type newer than IR "
                           f"{MAX_IR_VERSION} knows, load it with onnx, set model.ir_version = {MAX_IR_VERSION} "
                           "and save it again")
    early = early_ops(model)
    stand_in(model, early)
    try:
        check_model(model)
    except onnx.checker.ValidationError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else "invalid model"
        bare = [vi.name for vi in [*model.graph.input, *model.graph.output]
                if vi.type.HasField("tensor_type") and not vi.type.tensor_type.HasField("shape")]
        if bare:  # the parse stage gives outputs the shapes inference finds: these have none it can find
            names = ", ".join(f"'{n}'" for n in bare) + (" is" if len(bare) == 1 else " are")
            rejected = _inference_rejection(model)
            if rejected:  # the missing shape follows from a node onnx rejects: that node is what to fix
                outs = ", ".join(f"'{n}'" for n in bare)
                raise HbError(f"'{path}': ONNX shape inference rejects {rejected}, so it cannot find the shape of "
                              f"{outs} (declared without one)",
                              hint="fix that node's inputs or attributes in the model, or re-export it") from exc
            raise HbError(f"'{path}' fails the ONNX checker: {names} declared without a shape, and shape "
                          "inference cannot find one", hint="declare their rank in the model (sizes may be "
                          "names, e.g. ['batch', 'boxes', 4]), or export it with its output shapes") from exc
        raise HbError(f"'{path}' fails the ONNX checker: {first}", hint=_checker_hint(model, first)) from exc
    finally:
        stand_down(model)


# Ops whose constant inputs are learned parameters: a NaN or an infinity there reaches every value they write.
_WEIGHTED = ("Conv", "ConvTranspose", "Gemm", "MatMul", "BatchNormalization", "InstanceNormalization",
             "LayerNormalization", "GroupNormalization", "PRelu", "LSTM", "GRU", "RNN")


def check_finite_weights(model: ModelProto, path: str | Path) -> None:
    """Refuse a float weight holding NaN or infinity (a checkpoint damaged in training or export): every
    calibration sample then gives NaN, and a calibration type without a search would write a model of NaN.
    Constants of other ops may hold an infinity on purpose (an attention mask's -inf)."""
    floats = {t.name: t for t in model.graph.initializer
              if t.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE)}
    for node in model.graph.node:
        if node.op_type not in _WEIGHTED or node.domain not in ("", "ai.onnx"):
            continue
        for name in node.input[1:]:
            if name not in floats:
                continue
            values = onnx.numpy_helper.to_array(floats[name])
            nan, inf = int(np.isnan(values).sum()), int(np.isinf(values).sum())
            if nan or inf:
                what = " and ".join(f"{n} {kind}" for n, kind in ((nan, "NaN"), (inf, "infinite")) if n)
                raise HbError(f"'{path}': the weight '{name}' of {node.op_type} node '{node.name}' holds {what} "
                              f"value(s) of {values.size}: every value the node writes would be NaN or infinite",
                              hint="export the model again from a checkpoint whose weights are finite numbers")
            del floats[name]  # checked once however many nodes read it


# QuantizeLinear/DequantizeLinear take an axis (per-channel scales) from opset 13 on.
PER_CHANNEL_QDQ_OPSET = 13


def _checker_hint(model: ModelProto, first: str) -> str | None:
    """How to fix a checker failure we can name the cause of."""
    qdq = ("QuantizeLinear", "DequantizeLinear")
    if default_opset(model) < PER_CHANNEL_QDQ_OPSET and "attribute: axis" in first and any(op in first for op in qdq):
        # onnxruntime's quantize_static(per_channel=True) writes an axis whatever opset the float model has
        return (f"per-channel QuantizeLinear/DequantizeLinear need opset {PER_CHANNEL_QDQ_OPSET}, the model is "
                f"opset {default_opset(model)}: convert the float model to opset {PER_CHANNEL_QDQ_OPSET} "
                f"(onnx.version_converter.convert_version(model, {PER_CHANNEL_QDQ_OPSET})) before quantize_static, "
                "or quantize it per tensor")
    return None


def _inference_rejection(model: ModelProto) -> str | None:
    """The first node onnx's strict shape inference rejects, as ``node 'name' (Op): why``, or None."""
    try:
        onnx.shape_inference.infer_shapes(model, strict_mode=True)
    except onnx.shape_inference.InferenceError as exc:
        # "(op_type:Gemm, node name: gemm): [ShapeInferenceError] Input 0 expected ... in node Gemm (gemm)."
        found = re.search(r"\(op_type:([^,]+), node name: ([^)]*)\): (?:\[\w+\] )?(.*?)(?: in node .*)?$",
                          str(exc), re.M)
        if found:
            op, name, why = found.groups()
            return f"node '{name}' ({op}): {why.rstrip('.')}"
    except Exception:  # noqa: BLE001 - only a better message is at stake; the checker's error stands
        return None
    return None


def over_protobuf_limit(model: ModelProto) -> bool:
    """Whether ``model`` is too large to serialize whole (``PROTOBUF_LIMIT``)."""
    return serialized_size(model) >= PROTOBUF_LIMIT


def serialized_size(model: ModelProto) -> int:
    """About the bytes ``model`` serializes to, counted without serializing it (protobuf's ByteSize does, and
    fails over its limit): its initializers' values at their types' sizes, and its nodes."""
    return sum(tensor_size(t) for t in model.graph.initializer) + sum(n.ByteSize() for n in model.graph.node)


def tensor_size(tensor: onnx.TensorProto) -> int:
    """About the bytes ``tensor`` serializes to (``serialized_size``)."""
    from hbtools.graph.graph import elements, itemsize

    if tensor.data_type in (onnx.TensorProto.STRING, onnx.TensorProto.UNDEFINED):
        return tensor.ByteSize()
    return elements(tensor.dims) * itemsize(tensor.data_type)


def check_model(model: ModelProto) -> None:
    """onnx's checker on ``model``; one over ``PROTOBUF_LIMIT`` is checked without its large weights' values.

    The checker serializes the model it is given, which protobuf refuses over its limit; what it checks
    of a weight beyond its name, type and shape (which the copy keeps) is its stored bytes."""
    from hbtools.graph.graph import shape_probe

    onnx.checker.check_model(shape_probe(model) if over_protobuf_limit(model) else model)


def with_horizon_domain(model: ModelProto) -> ModelProto:
    """Declare the custom domain (needed by onnx.checker) and drop unused imported domains."""
    used = {n.domain for n in model.graph.node}
    keep = [op for op in model.opset_import if op.domain in ("", "ai.onnx") or op.domain in used]
    if DOMAIN in used and not any(op.domain == DOMAIN for op in keep):
        keep.append(onnx.helper.make_opsetid(DOMAIN, DOMAIN_VERSION))
    del model.opset_import[:]
    model.opset_import.extend(keep)
    return model


def save_model(model: ModelProto, path: str | Path) -> Path:
    """Check and write a model atomically: a temp file in the same folder, then rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with_horizon_domain(model)
    check_model(model)
    if over_protobuf_limit(model):
        _save_with_external_data(model, path)
    else:
        replace_atomically(path, [model.SerializeToString()])
    return path


def _save_with_external_data(model: ModelProto, path: Path) -> None:
    """Write ``model`` as onnx writes one over protobuf's limit: its large weights in ``<file name>.data``
    beside it, which onnx.load and onnxruntime read them from. ``model`` itself is not changed."""
    from hbtools.graph.graph import copy_model, is_large

    data = path.with_name(f"{path.name}.data")
    moved = [t for t in model.graph.initializer if is_large(t) and t.HasField("raw_data")]
    lengths: list[int] = []

    def write_values(fh: BinaryIO) -> None:  # one weight's bytes at a time
        for tensor in moved:
            lengths.append(fh.write(tensor.raw_data))

    replace_atomically(data, write_values)  # first: the model names it
    offsets = [0, *accumulate(lengths)]
    references = [external_reference(t, data.name, offsets[k], lengths[k]) for k, t in enumerate(moved)]
    names = {t.name for t in moved}
    replace_atomically(path, [serialized(copy_model(model, lambda t: t.name not in names), references)])


def external_reference(tensor: onnx.TensorProto, location: str, offset: int, length: int) -> onnx.TensorProto:
    """``tensor``'s name, type and shape, its values ``length`` bytes at ``offset`` of the file ``location``."""
    reference = onnx.TensorProto(name=tensor.name, data_type=tensor.data_type, dims=tensor.dims,
                                 data_location=onnx.TensorProto.EXTERNAL)
    for key, value in (("location", location), ("offset", offset), ("length", length)):
        reference.external_data.add(key=key, value=str(value))
    return reference


_GRAPH = ModelProto.DESCRIPTOR.fields_by_name["graph"].number
_INITIALIZER = onnx.GraphProto.DESCRIPTOR.fields_by_name["initializer"].number
_LENGTH_DELIMITED = 2  # protobuf's wire type of messages and bytes


def serialized(model: ModelProto, constants: Sequence[onnx.TensorProto] = ()) -> bytes:
    """The bytes of ``model`` with ``constants`` appended to its graph's initializers, made without a model
    that holds both (a session's model and its weights kept apart; a model and its external data references).

    onnxruntime copies the bytes twice (parsed, then as tensors) while it builds a session; a lowered
    model holding a copy of every weight meanwhile made that four copies (VGG-19: 2.2 GB). protobuf reads
    a message field given twice as one message (the second's repeated fields appended to the first's):
    the graph is given again, holding only the constants, each serialized from where it is.
    """
    head = model.SerializeToString()
    if not constants:
        return head
    pieces = []
    for t in constants:
        data = t.SerializeToString()
        pieces += [_key(_INITIALIZER), _varint(len(data)), data]
    return b"".join([head, _key(_GRAPH), _varint(sum(len(p) for p in pieces)), *pieces])


def _key(field_number: int) -> bytes:
    return _varint(field_number << 3 | _LENGTH_DELIMITED)


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


# Domains whose ops onnxruntime's CPU provider runs besides the standard ones (its contrib ops).
_CPU_DOMAINS = ("com.microsoft",)
# Ops onnxruntime registers in the ONNX domain below the opset that defines them, with the opset whose
# op means the same: its own LayerNormalization, which its optimizer writes into opset-13 transformer
# models (the parse stage raises such a model to that opset).
ORT_EARLY_OPS = {"LayerNormalization": 17}
STAND_IN_DOMAIN = "hbtools.opset_stand_in"  # where such ops wait while onnx's checker and converter look


def early_ops(model: ModelProto) -> list[onnx.NodeProto]:
    """The nodes of ``model`` that are ``ORT_EARLY_OPS`` below the opset that defines them."""
    opset = default_opset(model)
    return [n for n in model.graph.node
            if n.domain in ("", "ai.onnx") and n.op_type in ORT_EARLY_OPS and not onnx.defs.has(n.op_type, opset, "")]


def stand_in(model: ModelProto, nodes: list[onnx.NodeProto]) -> None:
    """Move ``nodes`` (``early_ops``) to the stand-in domain, which onnx's checker and converter pass over."""
    for node in nodes:
        node.domain = STAND_IN_DOMAIN
    if nodes and not any(o.domain == STAND_IN_DOMAIN for o in model.opset_import):
        model.opset_import.append(onnx.helper.make_opsetid(STAND_IN_DOMAIN, 1))


def stand_down(model: ModelProto) -> None:
    """Undo ``stand_in`` on every node of ``model``."""
    for node in model.graph.node:
        if node.domain == STAND_IN_DOMAIN:
            node.domain = ""
    kept = [o for o in model.opset_import if o.domain != STAND_IN_DOMAIN]
    del model.opset_import[:]
    model.opset_import.extend(kept)
ML_DOMAIN = "ai.onnx.ml"


def check_layers_supported(model: ModelProto) -> None:
    """Every node must run somewhere: a standard op of the model's opset, a Horizon op, or an
    onnxruntime contrib op. Anything else cannot go on the BPU or the CPU (seed message form)."""
    from hbtools.ops import custom, registry

    opset = default_opset(model)
    ml_opset = next((o.version for o in model.opset_import if o.domain == ML_DOMAIN), 1)
    local_functions = {(f.domain, f.name) for f in model.functions}  # onnxruntime inlines these
    for node in model.graph.node:
        domain = node.domain or ""
        if (domain, node.op_type) in local_functions:
            continue
        if domain in ("", "ai.onnx"):
            known = onnx.defs.has(node.op_type, opset, "") or node.op_type in ORT_EARLY_OPS
        elif domain == ML_DOMAIN:  # onnxruntime runs the ONNX-ML ops (scikit-learn exports' Normalizer, ...)
            known = onnx.defs.has(node.op_type, ml_opset, ML_DOMAIN)
        elif domain == DOMAIN:
            try:
                registry.get(node.op_type)
                known = True
            except KeyError:
                known = False
        else:
            known = domain in _CPU_DOMAINS or custom.custom_op_of(node) is not None
        if not known and domain == "com.microsoft.nchwc":
            raise HbError(f"Not support layer name={node.name or '?'} type={node.op_type} (domain '{domain}'): "
                          f"onnxruntime writes its blocked-layout (NCHWc) ops when a model is saved after "
                          f"ORT_ENABLE_ALL optimizations, for the CPU it ran on",
                          hint="give the original model, or save it with ORT_ENABLE_EXTENDED (hbtools reads the "
                               "fused ops of that level)")
        if not known:
            where = f" (domain '{domain}')" if domain else f" (not an ONNX op at opset {opset})"
            # One line: what is unknown, then how a custom CPU op is made known.
            own_domain = "" if domain else "give it a domain of its own (e.g. 'horizon.custom'), "
            raise HbError(f"Not support layer name={node.name or '?'} type={node.op_type}{where}; if it is a "
                          f"custom CPU op, {own_domain}{custom.REGISTER_HINT}")


def write_json_metadata(model: ModelProto, key: str, value: object) -> None:
    """Set ``model``'s metadata entry ``key`` to ``value`` as JSON (replacing an earlier one)."""
    for prop in [p for p in model.metadata_props if p.key == key]:
        model.metadata_props.remove(prop)
    model.metadata_props.add(key=key, value=json.dumps(value))


def read_json_metadata(model: ModelProto, key: str) -> object | None:
    """The value ``write_json_metadata`` stored under ``key``, or None."""
    return next((json.loads(p.value) for p in model.metadata_props if p.key == key), None)
