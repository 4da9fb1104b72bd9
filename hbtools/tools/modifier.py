"""hb_model_modifier logic: delete nodes at a model's inputs and outputs.

Deletable (seed 001 §6.2.8): on the input side Quantize, Transpose, Cast and
Reshape nodes that are the only reader of a model input; on the output side
Transpose, Dequantize, Cast, Reshape and Softmax nodes whose output is a model
output that nothing else reads. Deleting one makes its neighbour the new model
input or output, so deletions happen one at a time, each on the updated graph.
The model input or output keeps its name (board code looks tensors up by name):
the neighbour's tensor is renamed to it. Every deletion is recorded in the model
(``deleted_nodes``) with the node as it was; a deleted Quantize/Dequantize also
leaves its scale(s), axis and zero point on the descriptor of the input/output,
where ``hrt_model_exec model_info`` prints them as ``scale data``/``quantizeAxis``.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, replace

from onnx import ModelProto, NodeProto, helper

from hbtools.config.values import closest_names
from hbtools.errors import HbError
from hbtools.graph.graph import axis_through_reshape, dtype_name, references
from hbtools.ops.base import DOMAIN, attrs_of
from hbtools.runtime.binfile import BinFormatError, BinModel
from hbtools.runtime.runtime_model import load
from hbtools.runtime.structure import TensorInfo, tensor_info

INPUT_SIDE = ("Quantize", "Transpose", "Cast", "Reshape")
OUTPUT_SIDE = ("Transpose", "Dequantize", "Cast", "Reshape", "Softmax")
# deleted_nodes_info.txt records these (seed 001 §6.2.8)
INFO_TYPES = ("Quantize", "Dequantize", "Transpose")


def display_type(node: NodeProto) -> str:
    """The vendor's name for a node type: HzQuantize shows as Quantize."""
    if node.domain == DOMAIN and node.op_type in ("HzQuantize", "HzDequantize"):
        return node.op_type[2:]
    if node.op_type == "Flatten":  # a reshape (on RDK X3 the classifier's flatten ends the model: a CPU node)
        return "Reshape"
    return node.op_type


@dataclass(frozen=True)
class Candidate:
    name: str
    type: str
    side: str  # input | output


def candidates(graph: ModelProto) -> list[Candidate]:
    """Nodes that can be deleted now, in graph order. A node whose other side has no static shape (the indices
    ``NonZero`` or ``NonMaxSuppression`` find: as many as the data gives) is none: the tensor would become a model
    input or output, and those have fixed shapes (``unsized``)."""
    found = _at_the_edges(graph)
    if not found:
        return found
    unsized = set(_unsized(graph, found))
    return [c for c in found if c.name not in unsized]


def unsized(graph: ModelProto) -> dict[str, str]:
    """Nodes at a model input or output that cannot be deleted because the tensor on their other side has no
    static shape: node name -> that tensor."""
    return _unsized(graph, _at_the_edges(graph))


def _unsized(graph: ModelProto, found: list[Candidate]) -> dict[str, str]:
    if not found:
        return {}
    info = tensor_info(graph)
    nodes = {n.name: n for n in graph.graph.node if n.name}
    ends = {c.name: nodes[c.name].output[0] if c.side == "input" else nodes[c.name].input[0] for c in found}
    return {name: end for name, end in ends.items() if not _static(info.get(end))}


def _static(info: TensorInfo | None) -> bool:
    return info is not None and info.shape is not None and all(isinstance(d, int) for d in info.shape)


def _at_the_edges(graph: ModelProto) -> list[Candidate]:
    g = graph.graph
    inits = {t.name for t in g.initializer}
    inputs = {vi.name for vi in g.input if vi.name not in inits}
    outputs = {vi.name for vi in g.output}
    readers: dict[str, int] = {}
    for n in g.node:
        for t in n.input:
            readers[t] = readers.get(t, 0) + 1
    names = [n.name for n in g.node]
    out = []
    for n in g.node:
        kind = display_type(n)
        if not n.name or names.count(n.name) > 1 or not n.input or len(n.output) != 1:
            continue
        if kind in INPUT_SIDE and n.input[0] in inputs and readers.get(n.input[0]) == 1 \
                and n.output[0] not in outputs:
            out.append(Candidate(n.name, kind, "input"))
        elif kind in OUTPUT_SIDE and n.output[0] in outputs and not readers.get(n.output[0]) \
                and n.input[0] not in inputs and n.input[0] not in outputs and n.input[0] not in inits:
            out.append(Candidate(n.name, kind, "output"))
    return out


def unsized_reason(tensor: str) -> str:
    return (f"the tensor '{tensor}' on its other side has no fixed shape (its size depends on the data, as NonZero's "
            f"or NonMaxSuppression's indices do), and a model input or output needs one")


DEQUANTIZE_SUFFIX = "_HzDequantize"


def node_named(graph: ModelProto, name: str) -> NodeProto | None:
    """Node ``name`` of ``graph``, or the Dequantize writing model output ``X`` for ``X_HzDequantize``.

    An output Dequantize fed by a conv's int32 accumulators through layout moves is named after the conv's
    tensor, as the vendor's is; the output's name (hbtools' earlier name for it, and the vendor's where it
    keeps the moves, as rdk_model_zoo's YOLO-seg list has it) reaches it too."""
    for n in graph.graph.node:
        if n.name == name:
            return n
    output = _aliased_output(name)
    if output is None or output not in {o.name for o in graph.graph.output}:
        return None
    return next((n for n in graph.graph.node if n.op_type == "HzDequantize" and list(n.output) == [output]), None)


def _aliased_output(name: str) -> str | None:
    """The model output ``X`` a name ``X_HzDequantize`` may stand for the Dequantize of (None: no such name)."""
    return name[:-len(DEQUANTIZE_SUFFIX)] if name.endswith(DEQUANTIZE_SUFFIX) else None


def find(graph: ModelProto, name: str, deleted: Sequence[dict] = ()) -> NodeProto:
    """Node ``name`` of ``graph`` (``node_named``); ``deleted``: the model's deleted-node records (named in the
    error)."""
    node = node_named(graph, name)
    if node is not None:
        return node
    if _deleted_before(name, deleted):
        raise HbError(f"node '{name}' was already deleted from this model", hint="hb_model_info lists deleted nodes")
    # The deletable nodes first: those are the names a user means to type.
    names = [c.name for c in candidates(graph)] + [n.name for n in graph.graph.node if n.name]
    raise HbError(f"node '{name}' is not in the model{closest_names(name, dict.fromkeys(names))}",
                  hint="run hb_model_modifier MODEL.bin to list deletable nodes")


def _deleted_before(name: str, deleted: Sequence[dict]) -> bool:
    output = _aliased_output(name)
    return any(record.get("name") == name or (output is not None and record.get("type") == "Dequantize"
                                              and record.get("outputs") == [output]) for record in deleted)


def refusal(graph: ModelProto, name: str, deleted: Sequence[dict], deletable: Sequence[str]) -> str | None:
    """Why node ``name`` cannot be deleted from ``graph`` now (None: it can), in words; ``deleted``: the model's
    deleted-node records, ``deletable``: the names to offer as closest for a name the model does not have."""
    node = node_named(graph, name)
    if node is None:
        if _deleted_before(name, deleted):
            return f"node '{name}' was already deleted from this model (hb_model_info lists deleted nodes)"
        return f"node '{name}' is not in the model{closest_names(name, dict.fromkeys(deletable))}"
    if any(c.name == node.name for c in candidates(graph)):
        return None
    if node.name in (sizeless := unsized(graph)):
        return f"node '{name}' cannot be deleted: {unsized_reason(sizeless[node.name])}"
    return (f"node '{name}' ({display_type(node)}) cannot be deleted: it is not a Quantize/Transpose/Cast/Reshape "
            f"right after a model input nor a Transpose/Dequantize/Cast/Reshape/Softmax right before a model output")


def delete(model: BinModel, name: str) -> BinModel:
    """A copy of ``model`` without node ``name``, which must be a current candidate."""
    graph = model.load_graph()
    node = find(graph, name, model.deleted_nodes)
    cand = next((c for c in candidates(graph) if c.name == node.name), None)
    if cand is None:
        listing = [c.name for c in candidates(graph)]
        raise HbError(f"node '{name}' ({display_type(node)}) cannot be deleted: only Quantize/Transpose/Cast/"
                      f"Reshape right after a model input or Transpose/Dequantize/Cast/Reshape/Softmax right "
                      f"before a model output can be; deletable now: {listing}")
    info = tensor_info(graph)
    record = _record(node, cand)
    if cand.side == "input":
        inputs = _delete_input_side(graph, node, info, model.inputs)
        outputs = copy.deepcopy(model.outputs)
    else:
        inputs = copy.deepcopy(model.inputs)
        outputs = _delete_output_side(graph, node, info, model.outputs)
    kept, dropped = (node.input[0], node.output[0]) if cand.side == "input" else (node.output[0], node.input[0])
    graph.graph.node.remove(node)
    _rename(graph, dropped, kept)
    _drop_unused_initializers(graph)
    result = replace(model, graph=graph.SerializeToString(), inputs=inputs, outputs=outputs,
                     partition=_without(model.partition, name),
                     deleted_nodes=[*copy.deepcopy(model.deleted_nodes), record])
    try:
        load(result)  # the result must still be a model the tools accept
    except BinFormatError as e:
        raise HbError(f"node '{name}' cannot be deleted: the model would become invalid ({e})") from None
    return result


def _record(node: NodeProto, cand: Candidate) -> dict:
    attrs = {k: v for k, v in attrs_of(node).items() if isinstance(v, (int, float, str, list))}
    params = quant_params(node)
    if "axis" in attrs and params:
        # One scale has no axis: the node's unused attribute would contradict the descriptor's quantizeAxis.
        attrs["axis"] = params["quantize_axis"]
    record = {"name": node.name, "type": cand.type, "op_type": node.op_type, "domain": node.domain,
              "side": cand.side, "inputs": list(node.input), "outputs": list(node.output), "attributes": attrs}
    return {**record, **params}


def quant_params(node: NodeProto) -> dict:
    """``scale`` (list), ``quantize_axis`` and ``zero_point`` of a HzQuantize/HzDequantize; {} otherwise."""
    if node.domain != DOMAIN or node.op_type not in ("HzQuantize", "HzDequantize"):
        return {}
    a = attrs_of(node)
    scales = [float(a["scale"])] if "scale" in a else [float(s) for s in a["scales"]]
    # A single scale applies to the whole tensor; the board reports axis 0 for it.
    out = {"scale": scales, "quantize_axis": int(a.get("axis", 1)) if len(scales) > 1 else 0}
    if a.get("zero_point"):
        out["zero_point"] = int(a["zero_point"])
    return out


def descriptor_scale(desc: dict) -> tuple[tuple[float, ...], int]:
    """Scale(s) and quantize axis an input/output descriptor carries; ``((), 0)`` for none (or garbage)."""
    scale = desc.get("scale")
    if not isinstance(scale, list) or not scale or not all(isinstance(v, (int, float)) for v in scale):
        return (), 0
    axis = desc.get("quantize_axis", 0)
    if type(axis) is not int:
        return tuple(float(v) for v in scale), 0
    shape = desc.get("shape")
    if axis < 0 and isinstance(shape, list) and shape:  # per-channel along the last axis (a Gemm's): count it
        axis %= len(shape)
    return tuple(float(v) for v in scale), axis


def descriptor_zero_point(desc: dict) -> int:
    """The zero point an input/output descriptor carries (0: none, as on a symmetric grid)."""
    zero_point = desc.get("zero_point", 0)
    return zero_point if type(zero_point) is int else 0


def scale_lines(scale: tuple[float, ...], axis: int, zero_point: int = 0) -> list[str]:
    """How the board prints a quantized tensor's grid (hbDNNQuantiScale): its scales, a zero point that is not 0
    (an asymmetric grid: the value is ``(q - zero_point) * scale``), and the axis."""
    # the board prints floats with C++ stream defaults: 6 significant digits
    zero = [f"zero point data: {zero_point},"] if zero_point else []
    return ["scale data: " + "".join(f"{v:g}," for v in scale), *zero, f"quantizeAxis: {axis}"]


def without_input_side(quantized: ModelProto, records: Sequence[dict]) -> ModelProto:
    """A copy of ``quantized`` without the input-side nodes ``records`` (a .bin's deleted-node records) name,
    deleted as hb_model_modifier deleted them from the .bin: the model the modified .bin's inputs feed."""
    out = copy.deepcopy(quantized)
    for record in records:
        if record.get("side") != "input":
            continue
        node = next((n for n in out.graph.node if n.name == record.get("name")), None)
        if node is None:
            raise HbError(f"the .bin had node '{record.get('name')}' removed, which the quantized model does not "
                          f"have; were the two built by the same makertbin run?")
        _delete_input_side(out, node, tensor_info(out), [])
        out.graph.node.remove(node)
        _rename(out, node.output[0], node.input[0])
    _drop_unused_initializers(out)
    return out


def _rename(graph: ModelProto, old: str, new: str) -> None:
    """Tensor ``old`` becomes ``new`` everywhere in the graph (the deleted node's name for it)."""
    for n in graph.graph.node:
        for seq in (n.input, n.output):
            for k, t in enumerate(seq):
                if t == old:
                    seq[k] = new
    keep = [vi for vi in graph.graph.value_info if vi.name not in (old, new)]
    del graph.graph.value_info[:]
    graph.graph.value_info.extend(keep)


def original_tensor(model: BinModel, name: str) -> str:
    """The quantized model's name of the ``.bin`` output ``name`` (it took a deleted node's output name)."""
    for record in reversed(model.deleted_nodes):
        if record.get("side") == "output" and record.get("outputs") == [name] and record.get("inputs"):
            name = str(record["inputs"][0])
    return name


def _value_info(name: str, info: TensorInfo | None) -> object:
    if info is None or info.shape is None or any(d is None for d in info.shape):
        raise HbError(f"the type or shape of tensor '{name}' is unknown, so it cannot become a model input/output")
    return helper.make_tensor_value_info(name, info.elem_type, list(info.shape))


def _dtype_name(info: TensorInfo) -> str:
    return dtype_name(info.elem_type)


def _delete_input_side(graph: ModelProto, node: NodeProto, info: dict[str, TensorInfo],
                       descriptors: list[dict]) -> list[dict]:
    old, new = node.input[0], node.output[0]
    vi = _value_info(old, info.get(new))
    position = [i for i, v in enumerate(graph.graph.input) if v.name == old][0]
    graph.graph.input[position].CopyFrom(vi)
    out = copy.deepcopy(descriptors)
    for desc in out:
        if desc.get("name") != old:
            continue
        desc.update(shape=list(info[new].shape))
        if desc.get("input_type_rt") == "featuremap":  # image inputs keep taking uint8 runtime data
            desc["dtype"] = _dtype_name(info[new])
        if node.op_type == "Transpose" and isinstance(desc.get("layout"), str) and len(desc["layout"]) == 4:
            perm = attrs_of(node).get("perm") or [3, 2, 1, 0]
            desc["layout"] = "".join(desc["layout"][p] for p in perm)
        desc.update(quant_params(node))
    return out


def _delete_output_side(graph: ModelProto, node: NodeProto, info: dict[str, TensorInfo],
                        descriptors: list[dict]) -> list[dict]:
    old, new = node.output[0], node.input[0]
    vi = _value_info(old, info.get(new))
    position = [i for i, v in enumerate(graph.graph.output) if v.name == old][0]
    graph.graph.output[position].CopyFrom(vi)
    out = copy.deepcopy(descriptors)
    replaced = {"name": old, "shape": list(info[new].shape), "dtype": _dtype_name(info[new]),
                **quant_params(node)}
    for k, desc in enumerate(out):
        if desc.get("name") == old:
            if node.op_type != "HzDequantize":  # moving or casting integers keeps their step
                replaced.update({key: desc[key] for key in ("scale", "quantize_axis", "zero_point") if key in desc})
                if len(replaced.get("scale", [])) > 1 and "quantize_axis" in replaced:
                    replaced["quantize_axis"] = _axis_before(node, int(replaced["quantize_axis"]), info)
            out[k] = replaced
            break
    else:
        out.append(replaced)
    return out


def _axis_before(node: NodeProto, axis: int, info: dict[str, TensorInfo]) -> int:
    """The axis of a deleted output-side move's input that held its output's ``axis`` (per-channel scales
    follow the channels back): through a Transpose's perm, or a reshape that keeps that axis whole."""
    if node.op_type == "Transpose":
        perm = attrs_of(node).get("perm") or list(reversed(range(len(info[node.input[0]].shape))))
        return int(perm[axis])
    before = axis_through_reshape(list(info[node.output[0]].shape), list(info[node.input[0]].shape), axis) \
        if node.output[0] in info and node.input[0] in info else None
    return axis if before is None else before


def _drop_unused_initializers(graph: ModelProto) -> None:
    """Initializers nothing reads any more; a constant that is itself a model output (an SSD's PriorBox,
    folded) stays, as do those an If or Loop body reads."""
    used = {i for n in graph.graph.node for i in references(n)} | {o.name for o in graph.graph.output}
    keep = [t for t in graph.graph.initializer if t.name in used]
    del graph.graph.initializer[:]
    graph.graph.initializer.extend(keep)


def _without(partition: dict, name: str) -> dict:
    part = copy.deepcopy(partition)
    subgraphs = part.get("subgraphs")
    for sub in subgraphs if isinstance(subgraphs, list) else []:
        if isinstance(sub, dict) and isinstance(sub.get("nodes"), list):
            sub["nodes"] = [n for n in sub["nodes"] if n != name]
    if isinstance(part.get("cpu_nodes"), list):
        part["cpu_nodes"] = [n for n in part["cpu_nodes"] if not (isinstance(n, dict) and n.get("name") == name)]
    return part


def info_line(record: dict) -> str:
    """One line of deleted_nodes_info.txt: the node as it was before deletion."""
    attributes = record.get("attributes")
    attrs = " ".join(f"{k}={v}" for k, v in attributes.items()) if isinstance(attributes, dict) else ""
    return (f"{record.get('name')} type={record.get('type')} op_type={record.get('op_type')} "
            f"side={record.get('side')} inputs={record.get('inputs')} outputs={record.get('outputs')} {attrs}").rstrip()
