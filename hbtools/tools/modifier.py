"""hb_model_modifier logic: delete nodes at a model's inputs and outputs.

Deletable (seed 001 §6.2.8): on the input side Quantize, Transpose, Cast and
Reshape nodes that are the only reader of a model input; on the output side
Transpose, Dequantize, Cast, Reshape and Softmax nodes whose output is a model
output that nothing else reads. Deleting one makes its neighbour the new model
input or output, so deletions happen one at a time, each on the updated graph.
Every deletion is recorded in the model (``deleted_nodes``) with the node as it was.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace

from onnx import ModelProto, NodeProto, helper

from hbtools.errors import HbError
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
    return node.op_type


@dataclass(frozen=True)
class Candidate:
    name: str
    type: str
    side: str  # input | output


def candidates(graph: ModelProto) -> list[Candidate]:
    """Nodes that can be deleted now, in graph order."""
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


def find(graph: ModelProto, name: str) -> NodeProto:
    for n in graph.graph.node:
        if n.name == name:
            return n
    raise HbError(f"node '{name}' is not in the model", hint="run hb_model_modifier MODEL.bin to list deletable nodes")


def delete(model: BinModel, name: str) -> BinModel:
    """A copy of ``model`` without node ``name``, which must be a current candidate."""
    graph = model.load_graph()
    node = find(graph, name)
    cand = next((c for c in candidates(graph) if c.name == name), None)
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
    graph.graph.node.remove(node)
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
    return {"name": node.name, "type": cand.type, "op_type": node.op_type, "domain": node.domain,
            "side": cand.side, "inputs": list(node.input), "outputs": list(node.output), "attributes": attrs}


def _value_info(name: str, info: TensorInfo | None) -> object:
    if info is None or info.shape is None or any(d is None for d in info.shape):
        raise HbError(f"the type or shape of tensor '{name}' is unknown, so it cannot become a model input/output")
    return helper.make_tensor_value_info(name, info.elem_type, list(info.shape))


def _dtype_name(info: TensorInfo) -> str:
    return str(helper.tensor_dtype_to_np_dtype(info.elem_type))


def _delete_input_side(graph: ModelProto, node: NodeProto, info: dict[str, TensorInfo],
                       descriptors: list[dict]) -> list[dict]:
    old, new = node.input[0], node.output[0]
    vi = _value_info(new, info.get(new))
    position = [i for i, v in enumerate(graph.graph.input) if v.name == old][0]
    graph.graph.input[position].CopyFrom(vi)
    out = copy.deepcopy(descriptors)
    for desc in out:
        if desc.get("name") != old:
            continue
        desc.setdefault("config_name", old)  # hb_model_info finds the config values by it
        desc.update(name=new, shape=list(info[new].shape))
        if desc.get("input_type_rt") == "featuremap":  # image inputs keep taking uint8 runtime data
            desc["dtype"] = _dtype_name(info[new])
        if node.op_type == "Transpose" and isinstance(desc.get("layout"), str) and len(desc["layout"]) == 4:
            perm = attrs_of(node).get("perm") or [3, 2, 1, 0]
            desc["layout"] = "".join(desc["layout"][p] for p in perm)
        if node.op_type == "HzQuantize":
            a = attrs_of(node)
            desc["scale"] = [float(a["scale"])] if "scale" in a else [float(s) for s in a["scales"]]
            if a.get("zero_point"):
                desc["zero_point"] = int(a["zero_point"])
    return out


def _delete_output_side(graph: ModelProto, node: NodeProto, info: dict[str, TensorInfo],
                        descriptors: list[dict]) -> list[dict]:
    old, new = node.output[0], node.input[0]
    vi = _value_info(new, info.get(new))
    position = [i for i, v in enumerate(graph.graph.output) if v.name == old][0]
    graph.graph.output[position].CopyFrom(vi)
    out = copy.deepcopy(descriptors)
    replaced = {"name": new, "shape": list(info[new].shape), "dtype": _dtype_name(info[new])}
    if node.op_type == "HzDequantize":
        a = attrs_of(node)
        replaced["scale"] = [float(s) for s in a["scales"]]
        if a.get("zero_point"):
            replaced["zero_point"] = int(a["zero_point"])
    for k, desc in enumerate(out):
        if desc.get("name") == old:
            if node.op_type != "HzDequantize" and "scale" in desc:
                replaced["scale"] = desc["scale"]  # moving or casting integers keeps their step
            out[k] = replaced
            break
    else:
        out.append(replaced)
    return out


def _drop_unused_initializers(graph: ModelProto) -> None:
    used = {i for n in graph.graph.node for i in n.input}
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
