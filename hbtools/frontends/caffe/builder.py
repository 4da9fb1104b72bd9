"""The ONNX graph a Caffe network becomes, built one Caffe layer at a time.

Caffe blobs may be rewritten in place (``bottom: "x" top: "x"``); ONNX tensors are
written once, so each Caffe blob maps to its *current* ONNX tensor. Every layer's
nodes go through ONNX shape inference on their own as soon as they are made, so the
next converter knows its input shapes (Caffe parameters such as Scale's axis or
Reshape's 0 dims depend on them) and a layer whose parameters do not fit its input
is reported by name.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from hbtools.errors import HbError
from hbtools.graph.graph import shape_probe

OPSET = 13  # Softmax over one axis (Caffe's meaning) needs opset 13
IR_VERSION = 7
BLOB_ALIASES = "hbtools.caffe_blob_aliases"  # model property: blob -> tensor, for blobs with no tensor of their name
_SMALL_CONST = 64  # constants this small go into per-layer shape inference by value


def _static(vi: onnx.ValueInfoProto) -> list[int] | None:
    dims = vi.type.tensor_type.shape.dim
    if not vi.type.tensor_type.HasField("shape") or any(not d.HasField("dim_value") for d in dims):
        return None
    return [int(d.dim_value) for d in dims]


class Net:
    """The graph so far: nodes, weights, inputs, and where each Caffe blob lives."""

    def __init__(self, name: str, blob_names: set[str]) -> None:
        self.name = name or "caffe_net"
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.shapes: dict[str, list[int]] = {}
        self.blobs: dict[str, str] = {}  # Caffe blob -> current ONNX tensor
        self.available: dict[str, None] = {}  # produced, not consumed yet (ordered): the net outputs
        self.used: set[str] = set()  # ONNX tensor and initializer names
        self.node_names: set[str] = set()
        self.reserved = blob_names

    def unique(self, base: str, taken: set[str] | None = None) -> str:
        taken = self.used if taken is None else taken
        name, k = base, 1
        while name in taken:
            name, k = f"{base}_{k}", k + 1
        taken.add(name)
        return name

    def add_input(self, blob: str, shape: list[int]) -> None:
        if blob in self.blobs:
            raise HbError(f"caffe input '{blob}' is declared twice")
        if not shape or any(int(d) <= 0 for d in shape):
            raise HbError(f"caffe input '{blob}' has shape {list(shape)}; every dimension must be positive",
                          hint="set input_shape for it (config input_parameters or --input-shape)")
        name = self.unique(blob)
        self.inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape)))
        self.shapes[name] = [int(d) for d in shape]
        self.blobs[blob] = name
        self.available[blob] = None

    def commit(self, layer: Layer) -> None:
        tops = [layer.tops.get(i) for i in range(len(layer.param.top))]
        if None in tops:  # Caffe refuses a layer with more tops than it makes
            made = tops.index(None)
            if layer.param.type == "Pooling":  # SegNet / ENet's max pooling with a mask for unpooling
                raise layer.fail(f"has a second top '{layer.param.top[made]}', the mask of max unpooling (SegNet, "
                                 "ENet), which hbtools does not convert",
                                 hint="max unpooling (Pooling with a mask top, Upsample with two bottoms) has no "
                                      "conversion; replace the Upsample by a Deconvolution or a nearest Upsample "
                                      "(scale) and retrain, or end the network before it")
            raise layer.fail(f"has {len(tops)} top blobs but makes {made}; the extra top "
                             f"'{layer.param.top[made]}' is never written",
                             hint="remove the extra top from the prototxt")
        if layer.bottoms_read < len(layer.param.bottom):
            # Caffe checks each layer's bottom count; an ignored bottom would vanish without a word.
            raise layer.fail(f"has {len(layer.param.bottom)} bottom blobs but reads {layer.bottoms_read}; the "
                             f"extra bottom '{layer.param.bottom[layer.bottoms_read]}' is not used",
                             hint="remove the extra bottom from the prototxt")
        for blob in layer.param.top:
            if blob in self.blobs and blob not in layer.param.bottom:
                # Caffe stops here ("produced by multiple sources"); going on would silently lose the first.
                raise layer.fail(f"top '{blob}' is already produced by an earlier layer or input",
                                 hint="give the top its own name; a blob is only rewritten in place when the "
                                      "layer also reads it (bottom and top the same)")
        if len(layer.blobs) > layer.blobs_read:
            # Caffe refuses this too ("Incompatible number of blobs"): a trained blob would be dropped.
            raise layer.fail(f"the caffemodel has {len(layer.blobs)} blob(s) for it, but its prototxt parameters "
                             f"use {layer.blobs_read}; trained values would be left out",
                             hint="check parameters that change the blob count (bias_term: false while the "
                                  "weights hold a bias, ...) and that the prototxt and the caffemodel belong "
                                  "together")
        self._infer(layer)
        self._name_nodes(layer, set(tops))
        self.nodes.extend(layer.nodes)
        self.inits.extend(layer.consts)
        for blob in layer.param.bottom:
            self.available.pop(blob, None)
        for blob, tensor in zip(layer.param.top, tops, strict=True):
            self.blobs[blob] = tensor
            self.available[blob] = None

    def _name_nodes(self, layer: Layer, tops: set[str]) -> None:
        main = next((n for n in layer.nodes if tops & set(n.output)), None)
        for node in layer.nodes:
            base = layer.name if node is main else f"{layer.name}_{node.op_type}"
            node.name = self.unique(base, self.node_names)

    def _infer(self, layer: Layer) -> None:
        if not layer.nodes:
            return
        produced = {o for n in layer.nodes for o in n.output}
        small = [c for c in layer.consts if np.prod(c.dims) <= _SMALL_CONST]
        big = [c for c in layer.consts if np.prod(c.dims) > _SMALL_CONST]
        known = {c.name for c in small}
        feeds = []
        for name in dict.fromkeys(i for n in layer.nodes for i in n.input if i):
            if name in produced or name in known:
                continue
            if name in self.shapes:
                feeds.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, self.shapes[name]))
        feeds += [helper.make_tensor_value_info(c.name, c.data_type, list(c.dims)) for c in big]
        outs = [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in produced]
        graph = helper.make_graph(layer.nodes, "layer", feeds, outs, small)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
        model.ir_version = IR_VERSION
        bottoms = {b: self.shapes.get(self.blobs.get(b, ""), "?") for b in layer.param.bottom}
        try:
            inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
        except Exception as exc:  # onnx raises InferenceError and plain RuntimeErrors
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise layer.fail(f"its parameters do not fit its input shapes {bottoms}: {first}") from exc
        found = {vi.name: _static(vi) for vi in [*inferred.graph.value_info, *inferred.graph.output]}
        for name in produced:
            if found.get(name) is None:
                raise layer.fail(f"the output shape cannot be worked out from the input shapes {bottoms}")
            self.shapes[name] = found[name]

    def outputs(self) -> list[onnx.ValueInfoProto]:
        graph_inputs = {vi.name for vi in self.inputs}
        outs: list[str] = []
        for blob in self.available:
            tensor = self.blobs[blob]
            if tensor in graph_inputs:
                continue
            if tensor in outs or (tensor != blob and blob not in self.used):
                # Identity layers (Split, Dropout) alias tensors: two unread blobs can be one tensor, and an
                # output blob can be another blob's tensor. Caffe outputs each by its blob name (pycaffe's
                # net.blobs['fc_drop']), and ONNX outputs need distinct names: the copy is an Identity.
                copy = self.unique(blob)
                self.nodes.append(helper.make_node("Identity", [tensor], [copy],
                                                   name=self.unique(f"{blob}_output", self.node_names)))
                self.shapes[copy] = self.shapes[tensor]
                tensor = copy
            outs.append(tensor)
        return [helper.make_tensor_value_info(t, TensorProto.FLOAT, self.shapes[t]) for t in outs]

    def model(self) -> onnx.ModelProto:
        outputs = self.outputs()
        if not self.inputs:
            raise HbError("the caffe network declares no input",
                          hint="add an Input layer (input_param { shape { ... } }) or 'input' + 'input_shape'")
        if not outputs:
            raise HbError("the caffe network has no output (every blob is consumed or the net is empty)")
        graph = helper.make_graph(self.nodes, self.name, self.inputs, outputs, self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                                  producer_name="hbtools.frontends.caffe")
        model.ir_version = IR_VERSION
        # Blobs an Identity layer (Dropout, Split) or an in-place layer left under another tensor's name: output_nodes
        # may name them as pycaffe's net.blobs does.
        tensors = {o for n in self.nodes for o in n.output} | {vi.name for vi in self.inputs}
        aliases = {b: t for b, t in self.blobs.items() if b != t and b not in tensors}
        if aliases:
            helper.set_model_props(model, {BLOB_ALIASES: json.dumps(aliases)})
        # Both serialize what they are given: the structure, with the weights as typed inputs (``shape_probe``).
        probe = shape_probe(model)
        onnx.checker.check_model(probe)
        model.graph.value_info.extend(onnx.shape_inference.infer_shapes(probe, strict_mode=True).graph.value_info)
        return model


class Layer:
    """One Caffe layer being converted: its parameters, weights and the nodes it becomes."""

    def __init__(self, net: Net, param: Any, blobs: list[np.ndarray] | None) -> None:
        self.net, self.param = net, param
        self.name, self.type = param.name, param.type
        self.blobs = blobs or []
        self.nodes: list[onnx.NodeProto] = []
        self.consts: list[onnx.TensorProto] = []
        self.tops: dict[int, str] = {}
        self.blobs_read = 0  # how many of the caffemodel's blobs the parameters call for
        self.bottoms_read = 0  # how many bottoms the converter used

    def fail(self, message: str, hint: str | None = None) -> HbError:
        return HbError(f"caffe layer '{self.name}' (type {self.type}): {message}", hint=hint)

    def bottom(self, i: int = 0) -> str:
        if i >= len(self.param.bottom):
            raise self.fail(f"needs at least {i + 1} bottom blob(s), has {len(self.param.bottom)}")
        self.bottoms_read = max(self.bottoms_read, i + 1)
        blob = self.param.bottom[i]
        if blob not in self.net.blobs:
            raise self.fail(f"bottom '{blob}' is not produced by any earlier layer or input")
        return self.net.blobs[blob]

    def shape(self, tensor: str) -> list[int]:
        return list(self.net.shapes[tensor])

    def in_shape(self, i: int = 0) -> list[int]:
        return self.shape(self.bottom(i))

    def axis(self, axis: int, rank: int, what: str = "axis", *, inclusive_end: bool = False) -> int:
        """Caffe's CanonicalAxisIndex: negative counts from the end."""
        limit = rank + 1 if inclusive_end else rank
        k = axis + limit if axis < 0 else axis
        if not 0 <= k < limit:
            raise self.fail(f"{what} {axis} is out of range for an input of rank {rank}")
        return k

    def top(self, i: int = 0) -> str:
        if i >= len(self.param.top):
            raise self.fail(f"needs at least {i + 1} top blob(s), has {len(self.param.top)}")
        if i not in self.tops:
            blob = self.param.top[i]
            if blob not in self.net.blobs and blob not in self.net.used:
                self.tops[i] = self.net.unique(blob)
            else:  # written in place: a fresh tensor named after the layer
                base = self.name if self.name not in self.net.reserved else f"{blob}_{self.name}"
                self.tops[i] = self.net.unique(base)
        return self.tops[i]

    def alias(self, i: int, tensor: str) -> None:
        """Top ``i`` is ``tensor`` itself (an identity layer makes no node)."""
        if tensor in {vi.name for vi in self.net.inputs}:
            self.node("Identity", [tensor], [self.top(i)])
        else:
            self.tops[i] = tensor

    def set_top(self, i: int, tensor: str) -> None:
        """Top ``i`` is ``tensor``: the tensor is renamed to the top's name if this layer made it last."""
        for node in self.nodes:
            if tensor in node.output and not any(tensor in n.input for n in self.nodes):
                node.output[list(node.output).index(tensor)] = self.top(i)
                return
        self.alias(i, tensor)

    def const(self, value: Any, hint: str, dtype: Any = np.float32) -> str:
        name = self.net.unique(f"{self.name}_{hint}")
        # np.array keeps a scalar 0-D (Clip's bounds must be), where ascontiguousarray makes it [1]
        self.consts.append(numpy_helper.from_array(np.asarray(value, dtype=dtype, order="C"), name))
        return name

    def ints(self, values: list[int], hint: str) -> str:
        return self.const(np.asarray(values, dtype=np.int64), hint, np.int64)

    def node(self, op: str, inputs: list[str], outputs: list[str] | None = None, **attrs: Any) -> str:
        """Add a node; returns its (first) output. Without ``outputs``, one fresh tensor."""
        if outputs is None:
            outputs = [self.net.unique(f"{self.name}_{op.lower()}")]
        self.nodes.append(helper.make_node(op, inputs, outputs, **attrs))
        return outputs[0]

    def weights(self, count: int, what: str = "weight") -> list[np.ndarray]:
        self.blobs_read = max(self.blobs_read, count)
        if len(self.blobs) < count:
            found = (f"has {len(self.blobs)} blob(s) for it, no {what} blob (number {count})" if self.blobs
                     else "has no weights for it")
            raise self.fail(f"the caffemodel {found}",
                            hint="check that the prototxt and the caffemodel belong to the same network "
                                 "(weights are matched by layer name)")
        return self.blobs

    def weight(self, index: int, shape: list[int], what: str) -> np.ndarray:
        """Blob ``index`` in ``shape``; sizes of 1 may differ (legacy blobs are 4-D), nothing else."""
        blob = self.weights(index + 1, what)[index]
        # Sizes of 1 aside (legacy blobs are 4-D, a scalar may be [] or [1]), the shapes must agree as in
        # Caffe: an equal count alone would read a 9x1 kernel as 3x3 or a transposed matrix as it is.
        if blob.size != int(np.prod(shape)) or [d for d in blob.shape if d != 1] != [d for d in shape if d != 1]:
            raise self.fail(f"{what} blob has shape {list(blob.shape)} ({blob.size} values) but the layer "
                            f"needs {shape} for its input shape {self.in_shape(0)}",
                            hint="check that the prototxt and the caffemodel belong to the same network "
                                 "(kernel, num_output, transpose, group ...)")
        return blob.reshape(shape)
