"""Padding and cropping: auto_pad written out, ConvTranspose output shapes as pads, zero pads folded into convolutions,
constant pads as joins, crops as slices.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import ModelProto, NodeProto, helper, numpy_helper

from hbtools.graph.graph import GraphView, rewrite_nodes
from hbtools.graph.model_io import default_opset
from hbtools.ops import int_kernels
from hbtools.runtime.session import ort_session

PAD_BLOCK_ELEMENTS = 1 << 22  # a constant block a Pad may become (16 MB of float32)


_AUTO_PAD_OPS = ("Conv", "AveragePool", "MaxPool", "LpPool")


def auto_pads_as_pads(model: ModelProto) -> int:
    """``auto_pad`` SAME_UPPER / SAME_LOWER / VALID (TensorFlow exports) of a Conv or pool over a map of
    static size as the explicit ``pads`` it stands for, so the rewrites and integer kernels after
    this, which read ``pads``, see the node's real padding. The count of nodes rewritten.

    A pool under SAME ignores ``ceil_mode`` (its output is ceil(size / stride) either way), so that
    goes too; under VALID it keeps it. A dilated SAME pool keeps its auto_pad: onnxruntime pads it for
    the undilated kernel, the spec for the dilated one, and either choice would change a model that
    runs as exported; so does a SAME pool that onnxruntime crops (``_pool_crops``)."""
    view = GraphView(model)
    count = 0
    for node in model.graph.node:
        if node.op_type not in _AUTO_PAD_OPS or node.domain not in ("", "ai.onnx"):
            continue
        a = view.attrs(node)
        auto = a.get("auto_pad", b"NOTSET")
        auto = auto.decode() if isinstance(auto, bytes) else auto
        shape = view.shapes.get(node.input[0])
        w = view.const(node.input[1]) if node.op_type == "Conv" and len(node.input) > 1 else None
        kernel = list(a["kernel_shape"]) if "kernel_shape" in a else list(w.shape[2:]) if w is not None else None
        if auto in ("", "NOTSET") or shape is None or kernel is None or len(shape) != len(kernel) + 2 \
                or any(not isinstance(d, int) or d <= 0 for d in shape[2:]):
            continue
        spatial = len(kernel)
        dilations = list(a.get("dilations") or [1] * spatial)
        strides = list(a.get("strides") or [1] * spatial)
        if node.op_type != "Conv" and auto != "VALID" and (any(d != 1 for d in dilations)
                                                            or _pool_crops(auto, shape[2:], kernel, strides)):
            continue
        begin, end = int_kernels.resolve_pads(auto, list(shape[2:]), kernel, strides, dilations, None)
        gone = ("auto_pad", "pads") if auto == "VALID" else ("auto_pad", "pads", "ceil_mode")
        kept = [x for x in node.attribute if x.name not in gone]
        del node.attribute[:]
        node.attribute.extend([*kept, helper.make_attribute("pads", [*begin, *end])])
        count += 1
    return count


def conv_transpose_output_shapes_as_pads(model: ModelProto) -> int:
    """A ConvTranspose's ``output_shape`` (tf2onnx writes it for Keras' Conv2DTranspose) as the explicit
    ``pads`` (and ``output_padding``, for an output larger than the natural one) that give the same output,
    so the quantized op, which reads those, computes what the float model computes. The count of nodes
    rewritten.

    onnxruntime and the ONNX text disagree on which side takes an odd padding: the candidates are
    checked against onnxruntime on the node's own weight, and a node none of them matches stays as it is.
    """
    view = GraphView(model)
    count = 0
    for node in model.graph.node:
        if node.op_type != "ConvTranspose" or node.domain not in ("", "ai.onnx"):
            continue
        a = view.attrs(node)
        w = view.const(node.input[1]) if len(node.input) > 1 else None
        shape = view.shapes.get(node.input[0])
        if "output_shape" not in a or w is None or shape is None or len(shape) != w.ndim \
                or any(not isinstance(d, int) or d <= 0 for d in shape):
            continue
        spatial = w.ndim - 2
        kernel = list(a.get("kernel_shape") or w.shape[2:])
        strides = list(a.get("strides") or [1] * spatial)
        dilations = list(a.get("dilations") or [1] * spatial)
        extra = list(a.get("output_padding") or [0] * spatial)
        wanted = list(a["output_shape"])[-spatial:]
        total = [s * (n - 1) + e + (k - 1) * d + 1 - o
                 for n, s, e, k, d, o in zip(shape[2:], strides, extra, kernel, dilations, wanted, strict=True)]
        # A negative total padding asks for more than the natural output: ONNX adds those rows and columns
        # at the end, as output_padding does.
        grown = [e + max(0, -t) for e, t in zip(extra, total, strict=True)]
        total = [max(0, t) for t in total]
        kept = [x for x in node.attribute if x.name not in ("output_shape", "pads", "auto_pad", "output_padding")]
        if any(grown):
            kept.append(helper.make_attribute("output_padding", grown))
        for first in (lambda t: t // 2, lambda t: t - t // 2):
            pads = [*(first(t) for t in total), *(t - first(t) for t in total)]
            candidate = [*kept, helper.make_attribute("pads", pads)]
            if _same_conv_transpose(node, candidate, shape, w, view.const(node.input[2]) if len(node.input) > 2
                                    and node.input[2] else None):
                del node.attribute[:]
                node.attribute.extend(candidate)
                count += 1
                break
    return count


def _same_conv_transpose(node: NodeProto, attributes: list, shape: list[int], weight: np.ndarray,
                         bias: np.ndarray | None) -> bool:
    """Whether ConvTranspose ``node`` with ``attributes`` instead of its own gives, in onnxruntime, its output."""
    inputs = [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, shape)]
    inits = [numpy_helper.from_array(weight.astype(np.float32), "w")]
    names = ["x", "w"]
    if bias is not None:
        inits.append(numpy_helper.from_array(bias.astype(np.float32), "b"))
        names.append("b")
    nodes = [helper.make_node("ConvTranspose", names, ["own"]), helper.make_node("ConvTranspose", names, ["new"])]
    nodes[0].attribute.extend(node.attribute)
    nodes[1].attribute.extend(attributes)
    outputs = [helper.make_tensor_value_info(k, onnx.TensorProto.FLOAT, None) for k in ("own", "new")]
    probe = helper.make_model(helper.make_graph(nodes, "probe", inputs, outputs, inits),
                              opset_imports=[helper.make_opsetid("", 13)])
    probe.ir_version = 8
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    try:
        own, new = ort_session(probe).run(None, {"x": x})
    except Exception:  # noqa: BLE001 - a candidate onnxruntime refuses is not the node's form
        return False
    return own.shape == new.shape and bool(np.allclose(own, new, rtol=1e-5, atol=1e-6 * float(np.abs(own).max() + 1)))


def _pool_crops(auto_pad: str, sizes: list[int], kernel: list[int], strides: list[int]) -> bool:
    """A SAME pool whose kernel is smaller than its stride: onnxruntime does not clamp the padding it needs
    at zero, and a negative begin padding skips the map's first rows, which no ``pads`` express."""
    for size, k, s in zip(sizes, kernel, strides, strict=True):
        needed = (-(-size // s) - 1) * s + k - size
        halved = needed if auto_pad == "SAME_UPPER" else needed + 1
        if int(halved / 2) < 0:  # C++ division, towards zero
            return True
    return False


def zero_pads_into_convs(model: ModelProto) -> None:
    """A zero Pad of the spatial axes read only by Convs (TensorFlow's SAME padding written out,
    PyTorch's ZeroPad2d / F.pad) becomes those Convs' own padding: the same sums, and no Pad op,
    which has no BPU form here."""
    view = GraphView(model)
    outputs = set(view.graph_outputs)
    gone = set()
    for node in model.graph.node:
        spatial = _zero_spatial_pads(node, view)
        users = view.consumers.get(node.output[0], []) if spatial is not None else []
        if not users or node.output[0] in outputs or any(
                u.op_type != "Conv" or u.input[0] != node.output[0] or
                view.attrs(u).get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET") for u in users):
            continue
        for conv in users:
            own = list(view.attrs(conv).get("pads", [0] * len(spatial)))
            pads = [a + b for a, b in zip(own, spatial, strict=True)]
            kept = [a for a in conv.attribute if a.name != "pads"]
            del conv.attribute[:]
            conv.attribute.extend([*kept, helper.make_attribute("pads", pads)])
            conv.input[0] = node.input[0]
        gone.add(node.name)
    keep = [n for n in model.graph.node if n.name not in gone]
    del model.graph.node[:]
    model.graph.node.extend(keep)


def _zero_spatial_pads(node: NodeProto, view: GraphView) -> list[int] | None:
    """The [begin..., end...] pads of the spatial axes of a Pad that adds zeros to them only (None: not one)."""
    spec = _constant_pad(node, view)
    if spec is None:
        return None
    shape, pads, value = spec
    rank = len(shape)
    if len(shape) < 3 or value != 0 or any(pads[:2]) or any(pads[rank:rank + 2]):  # batch or channels padded
        return None
    return [*pads[2:rank], *pads[rank + 2:]]


def crops_as_slices(model: ModelProto) -> int:
    """A constant Pad with negative amounts (a crop: ``F.pad`` with negative values) as the Slice it is, then
    a Pad of what the amounts still add: the BPU has Slice, and no form of a Pad that crops. The count
    rewritten."""
    view = GraphView(model)
    opset = default_opset(model)

    def rewrite(node: NodeProto) -> list[NodeProto] | None:
        spec = _constant_pad(node, view, crops=True)
        if spec is None or opset < 11 or view.elem_types.get(node.input[0]) != onnx.TensorProto.FLOAT:
            return None
        shape, pads, value = spec
        rank = len(shape)
        if min(pads) >= 0 or any(not isinstance(d, int) for d in shape):
            return None
        axes = [k for k in range(rank) if pads[k] < 0 or pads[rank + k] < 0]
        starts = [-min(pads[k], 0) for k in axes]
        ends = [shape[k] + min(pads[rank + k], 0) for k in axes]
        cropped = f"{node.output[0]}_cropped"
        names = []
        for what, values in (("starts", starts), ("ends", ends), ("axes", axes)):
            names.append(f"{node.name}_crop_{what}")
            model.graph.initializer.append(numpy_helper.from_array(np.array(values, np.int64), names[-1]))
        rest = [max(v, 0) for v in pads]
        if not any(rest):
            return [helper.make_node("Slice", [node.input[0], *names], [node.output[0]], name=node.name)]
        amounts, fill = f"{node.name}_rest_pads", f"{node.name}_rest_value"
        model.graph.initializer.append(numpy_helper.from_array(np.array(rest, np.int64), amounts))
        model.graph.initializer.append(numpy_helper.from_array(np.array(value, np.float32), fill))
        return [helper.make_node("Slice", [node.input[0], *names], [cropped], name=f"{node.name}_crop"),
                helper.make_node("Pad", [cropped, amounts, fill], [node.output[0]], name=node.name, mode="constant")]

    return rewrite_nodes(model, rewrite)


def _constant_pad(node: NodeProto, view: GraphView, crops: bool = False) -> tuple[list, list[int], float] | None:
    """(input shape, [begin..., end...] pads, value) of a constant-mode Pad whose pads and value are constants,
    none negative (a crop, unless ``crops``), over a tensor of known rank (None: not one)."""
    if node.op_type != "Pad" or node.domain not in ("", "ai.onnx"):
        return None
    a = view.attrs(node)
    if a.get("mode", b"constant") not in (b"constant", "constant"):
        return None
    shape = view.shapes.get(node.input[0])
    if len(node.input) > 1 and node.input[1]:  # opset 11: pads (and value, axes) are inputs
        pads = view.const(node.input[1])
        value = view.const(node.input[2]) if len(node.input) > 2 and node.input[2] else np.zeros(1)
        axes = view.const(node.input[3]) if len(node.input) > 3 and node.input[3] else None
        if pads is None or value is None or value.size != 1 or (axes is None and len(node.input) > 3
                                                                 and node.input[3]):
            return None
        pads = [int(v) for v in pads.reshape(-1)]
        if axes is not None:  # opset 18: pads of the listed axes only; the others take none
            axes = [int(v) for v in axes.reshape(-1)]
            if shape is None or len(pads) != 2 * len(axes):
                return None
            rank = len(shape)
            full = [0] * (2 * rank)
            for k, axis in enumerate(axes):
                axis %= rank
                full[axis], full[rank + axis] = pads[k], pads[len(axes) + k]
            pads = full
    else:
        pads, value = list(a.get("pads", [])), np.array(a.get("value", 0.0))
    if shape is None or len(pads) != 2 * len(shape) or (min(pads) < 0 and not crops):
        return None
    return list(shape), pads, float(np.asarray(value).reshape(-1)[0])


def constant_pads_as_concats(model: ModelProto) -> int:
    """A constant Pad left after ``zero_pads_into_convs`` (a value other than zero, as EfficientViT's
    linear attention appends a row of ones; or zeros no Conv absorbs) as Concats of constant blocks, one
    per padded axis: the same values, and Concat takes constants onto its output grid on the BPU.

    Only float32 tensors of a known shape, pads given as constants and none negative (a crop), and
    blocks of at most ``PAD_BLOCK_ELEMENTS`` values (a padded batch of a large map stays a Pad). Returns
    how many Pads it rewrote."""
    view = GraphView(model)
    nodes = []
    count = 0
    for node in model.graph.node:
        spec = _constant_pad(node, view)
        if spec is None or not any(spec[1]) or not _fits_blocks(spec[0], spec[1]) or \
                view.elem_types.get(node.input[0]) != onnx.TensorProto.FLOAT:
            nodes.append(node)
            continue
        count += 1
        shape, pads, value = spec
        rank = len(shape)
        begin, end = pads[:rank], pads[rank:]
        x, axes = node.input[0], [k for k in range(rank) if begin[k] or end[k]]
        for n, axis in enumerate(axes):
            parts = []
            for where, width in (("before", begin[axis]), ("after", end[axis])):
                if width:
                    block = np.full([*shape[:axis], width, *shape[axis + 1:]], value, dtype=np.float32)
                    const = f"{node.name}_axis{axis}_{where}"
                    model.graph.initializer.append(numpy_helper.from_array(block, const))
                    parts.append(const)
            parts.insert(1 if begin[axis] else 0, x)
            last = n == len(axes) - 1
            out = node.output[0] if last else f"{node.output[0]}_axis{axis}"
            nodes.append(helper.make_node("Concat", parts, [out], name=node.name if last else f"{node.name}_axis{axis}",
                                          axis=axis))
            shape = [*shape[:axis], shape[axis] + begin[axis] + end[axis], *shape[axis + 1:]]
            x = out
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return count


def _fits_blocks(shape: list, pads: list[int]) -> bool:
    """Whether a map of static ``shape`` padded by ``pads`` takes constant blocks of at most
    ``PAD_BLOCK_ELEMENTS`` values (each axis's blocks are as large as the map padded so far)."""
    if any(not isinstance(d, int) or d <= 0 for d in shape):
        return False
    rank = len(shape)
    grown = list(shape)
    for axis in range(rank):
        if max(pads[axis], pads[rank + axis]) * int(np.prod(grown)) // grown[axis] > PAD_BLOCK_ELEMENTS:
            return False
        grown[axis] += pads[axis] + pads[rank + axis]
    return True
