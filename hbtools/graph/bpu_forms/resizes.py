"""Resize and Upsample: whole-factor upsampling, interpolations as matrix products, the repeat of one pixel."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import ModelProto, NodeProto, helper, numpy_helper

from hbtools.graph.bpu_forms._common import _opset, around_one_row
from hbtools.graph.graph import GraphView, is_static, rewrite_nodes
from hbtools.graph.model_io import default_opset
from hbtools.march.profiles import MarchProfile
from hbtools.runtime.session import ort_session

# A linear or cubic Resize becomes a dense [in, out] interpolation matrix (``interpolations_as_matmuls``): over a
# signal of thousands of samples that is millions of weights and in * out MACs per channel (Wave-U-Net at 16384
# samples: a 5-minute checker run and 3.8 GB), where the CPU's Resize reads two samples per output.
MAX_INTERPOLATION_ELEMENTS = 1 << 20


def resizes_of_one_axis_as_2d(model: ModelProto, profile: MarchProfile) -> int:
    """A Resize of the length of a 3-D [N, C, L] tensor (``F.interpolate(mode='linear')`` in audio U-Nets such
    as Wave-U-Net, or nearest) as the same Resize of [N, C, 1, L] between an Unsqueeze and a Squeeze of that
    row, for the 4-D forms after it to take (the interpolation matrix along W, the BPU's nearest Resize): the
    BPU's Resize takes 4-D tensors only, and each upsampling of a Wave-U-Net ran on the CPU between two BPU
    subgraphs. Not where the BPU takes no 3-D tensor (RDK X3): the layers around it run on the CPU there, and not
    a linear or cubic one whose interpolation matrix would pass ``MAX_INTERPOLATION_ELEMENTS``. Returns how many
    it rewrote."""
    if not profile.takes_rank(3):
        return 0
    view = GraphView(model)
    opset = _opset(model)
    return rewrite_nodes(model, lambda node: _resize_as_2d(node, view, opset, model))


def _resize_as_2d(node: NodeProto, view: GraphView, opset: int, model: ModelProto) -> list[NodeProto] | None:
    resize = resize_of_the_row(node, view, model)
    return None if resize is None else around_one_row(model, opset, node, resize)


def resize_of_the_row(node: NodeProto, view: GraphView, model: ModelProto) -> NodeProto | None:
    """The Resize of [N, C, 1, L] that resizes the length of ``node``'s 3-D input as ``node`` does (its scales or
    sizes constants added to ``model``; it reads and writes ``node``'s tensors until its caller sets others);
    None where ``node`` is no such Resize (``resizes_of_one_axis_as_2d``)."""
    if node.op_type != "Resize" or node.domain not in ("", "ai.onnx") or len(node.input) < 3:
        return None
    shape, out_shape = view.shapes.get(node.input[0]), view.shapes.get(node.output[0])
    text = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in view.attrs(node).items()}
    # tf_crop_and_resize reads a 3-D roi, and a policy or axes would take the added row into their sizes
    if shape is None or out_shape is None or len(shape) != 3 or len(out_shape) != 3 \
            or not is_static([*shape, *out_shape]) or shape[:2] != out_shape[:2] or shape == out_shape \
            or text.get("coordinate_transformation_mode") == "tf_crop_and_resize" or "axes" in text \
            or text.get("keep_aspect_ratio_policy", "stretch") != "stretch" \
            or any(i and not view.is_const(i) for i in node.input[1:]):
        return None
    mode = text.get("mode", "nearest")
    if mode != "nearest" and shape[2] * out_shape[2] > MAX_INTERPOLATION_ELEMENTS:
        return None  # as a dense interpolation matrix it would cost more than the CPU's Resize
    scales = view.const(node.input[2]) if node.input[2] else None
    empty, row = f"{node.name}_none_2d", f"{node.name}_row_2d"  # empty: roi, and scales where sizes are given
    if scales is not None and scales.size == 3:
        inputs, values = [node.input[0], empty, row], np.array([*scales[:2], 1, scales[2]], np.float32)
    else:
        inputs, values = [node.input[0], empty, empty, row], np.array([*out_shape[:2], 1, out_shape[2]], np.int64)
    model.graph.initializer.extend([numpy_helper.from_array(np.zeros(0, np.float32), empty),
                                    numpy_helper.from_array(values, row)])
    resize = helper.make_node("Resize", inputs, [node.output[0]], name=node.name)
    resize.attribute.extend(node.attribute)
    return resize


def upsampling_by_whole_factors(model: ModelProto, profile: MarchProfile | None = None) -> None:
    """A Resize of one pixel as a Tile (a nearest Resize on a BPU without Tile, such as RDK X3's), and a
    bilinear Resize by an even whole factor s (2, 4, 6) of
    H and W with half-pixel coordinates (PyTorch's ``interpolate(..., mode='bilinear')``,
    segmentation decoders) as an edge Pad of one pixel and a depthwise ConvTranspose (stride s,
    kernel 2s, the bilinear weights ``1 - |t - s + 0.5| / s`` per axis, pads 1.5 s): the same
    weighted sums, with BPU forms, where the Resize has none. Without the Pad, the borders would
    blend with zeros instead of repeating the edge."""
    view = GraphView(model)
    nodes = []
    for node in model.graph.node:
        if _resize_of_one_pixel(node, view):  # every mode repeats the one value (ASPP's image pooling branch)
            nodes.append(_repeat_of_one_pixel(node, view.shapes[node.output[0]], model, profile))
            continue
        factor = _bilinear_factor(node, view)
        if factor is None:
            nodes.append(node)
            continue
        channels = view.shapes[node.input[0]][1]
        taps = 1.0 - np.abs(np.arange(2 * factor) - factor + 0.5) / factor
        weight = np.broadcast_to(np.outer(taps, taps), (channels, 1, 2 * factor, 2 * factor)).astype(np.float32)
        padded, w, pads = f"{node.output[0]}_edges", f"{node.name}_bilinear_w", f"{node.name}_edge_pads"
        model.graph.initializer.extend([numpy_helper.from_array(np.ascontiguousarray(weight), w),
                                        numpy_helper.from_array(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64), pads)])
        nodes.append(helper.make_node("Pad", [node.input[0], pads], [padded], name=f"{node.name}_edges", mode="edge"))
        nodes.append(helper.make_node("ConvTranspose", [padded, w], [node.output[0]], name=node.name, group=channels,
                                      kernel_shape=[2 * factor] * 2, strides=[factor] * 2,
                                      pads=[3 * factor // 2] * 4))
    del model.graph.node[:]
    model.graph.node.extend(nodes)


def interpolations_as_matmuls(model: ModelProto) -> None:
    """Any other linear or cubic Resize of H and W of a 4-D map (align_corners, a factor of 8, a size that
    is not a multiple) as what it is, a linear map per axis: ``MatMul`` by the interpolation matrix along W,
    then along H between two Transposes. The matrices are onnxruntime's own Resize of one-hot rows, so
    every coordinate mode and rounding is the Resize's.

    The Transposes turn the axes (C, H, W -> W, C, H and back) rather than swap H and W: the BPU of RDK X3
    moves data only between NCHW and NHWC, which these two are, and a swap ran on its CPU between three
    BPU subgraphs."""
    view = GraphView(model)
    nodes = []
    for node in model.graph.node:
        matrices = _interpolation_matrices(node, view) if node.op_type == "Resize" else None
        if matrices is None:
            nodes.append(node)
            continue
        x = node.input[0]
        for axis, matrix in zip((3, 2), matrices, strict=True):
            if matrix is None:
                continue
            w = f"{node.name}_interpolation_{'hw'[axis - 2]}"
            model.graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(matrix.T), w))
            if axis == 3:
                out = f"{node.output[0]}_along_w"
                nodes.append(helper.make_node("MatMul", [x, w], [out], name=f"{node.name}_along_w"))
            else:
                moved, done = f"{node.output[0]}_hw_swapped", f"{node.output[0]}_along_h"
                out = f"{node.output[0]}_h_back"
                nodes += [helper.make_node("Transpose", [x], [moved], name=f"{node.name}_swap", perm=[0, 3, 1, 2]),
                          helper.make_node("MatMul", [moved, w], [done], name=f"{node.name}_along_h"),
                          helper.make_node("Transpose", [done], [out], name=f"{node.name}_swap_back",
                                           perm=[0, 2, 3, 1])]
            x = out
        nodes[-1].output[0] = node.output[0]
    del model.graph.node[:]
    model.graph.node.extend(nodes)


def _interpolation_matrices(node: NodeProto, view: GraphView) -> tuple[np.ndarray | None,
                                                                      np.ndarray | None] | None:
    """(W, H) interpolation matrices [out, in] of a linear / cubic Resize of a 4-D map's H and W (None for an
    axis it does not resize); None where it is not such a Resize."""
    a = view.attrs(node)
    mode = a.get("mode", "nearest")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    shape, out_shape = view.shapes.get(node.input[0]), view.shapes.get(node.output[0])
    coords = a.get("coordinate_transformation_mode", "half_pixel")
    coords = coords.decode() if isinstance(coords, bytes) else coords
    if mode not in ("linear", "cubic") or coords == "tf_crop_and_resize" or shape is None or out_shape is None \
            or len(shape) != 4 or any(not isinstance(d, int) for d in [*shape, *out_shape]) \
            or shape[:2] != out_shape[:2] or shape[2:] == out_shape[2:] or a.get("antialias", 0) \
            or any(i and not view.is_const(i) for i in node.input[1:]):
        return None
    scales = view.const(node.input[2]) if len(node.input) > 2 and node.input[2] else None
    matrices = []
    for axis in (3, 2):
        if shape[axis] == out_shape[axis]:
            matrices.append(None)
            continue
        # one-hot rows along ``axis`` as a batch; the probe resizes that axis alone, as the node does
        probe_out = [shape[axis], 1, out_shape[axis], 1]
        eye = np.eye(shape[axis], dtype=np.float32).reshape(shape[axis], 1, shape[axis], 1)
        attrs = {k: v for k, v in a.items() if k != "axes"}
        if scales is not None and scales.size == 4:
            inputs = {"scales": np.array([1, 1, float(scales[axis]), 1], np.float32)}
        else:
            inputs = {"sizes": np.array(probe_out, np.int64)}
        out = _resize_probe(eye, attrs, inputs, probe_out, view)
        if out is None:
            return None
        matrices.append(out.reshape(shape[axis], out_shape[axis]).T.astype(np.float32))
    return matrices[0], matrices[1]


def _resize_probe(x: np.ndarray, attrs: dict, inputs: dict, out_shape: list[int], view: GraphView) -> np.ndarray | None:
    """onnxruntime's Resize of ``x`` with ``attrs`` and a ``scales`` or ``sizes`` input, at the model's opset
    (None if it fails or gives another shape)."""
    opset = next((o.version for o in view.model.opset_import if o.domain in ("", "ai.onnx")), 13)
    empty = np.array([], np.float32)
    consts = {"roi": empty, "scales": inputs.get("scales", empty), **({"sizes": inputs["sizes"]} if "sizes" in
                                                                      inputs else {})}
    node = helper.make_node("Resize", ["x", *consts], ["y"], **attrs)
    graph = helper.make_graph([node], "probe", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, x.shape)],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(v, k) for k, v in consts.items()])
    probe = helper.make_model(graph, opset_imports=[helper.make_opsetid("", max(opset, 11))])
    probe.ir_version = 8
    try:
        y = ort_session(probe).run(None, {"x": x})[0]
    except Exception:  # noqa: BLE001 - an attribute combination onnxruntime refuses: keep the Resize
        return None
    return y if list(y.shape) == list(out_shape) else None


def _resize_of_one_pixel(node: NodeProto, view: GraphView) -> bool:
    """A Resize of a [N, C, 1, 1] tensor to [N, C, H, W] (static shapes)."""
    if node.op_type not in ("Resize", "Upsample") or node.domain not in ("", "ai.onnx"):
        return False
    shape_in, shape_out = view.shapes.get(node.input[0]), view.shapes.get(node.output[0])
    return (shape_in is not None and shape_out is not None and len(shape_in) == len(shape_out) == 4
            and is_static([*shape_in, *shape_out])
            and shape_in[2:] == [1, 1] and shape_out[:2] == shape_in[:2])


def _repeat_of_one_pixel(node: NodeProto, shape: list[int], model: ModelProto,
                         profile: MarchProfile | None) -> NodeProto:
    """What repeats a [N, C, 1, 1] tensor to ``shape``: a Tile, or a nearest Resize where the march's BPU has
    no Tile but has that Resize."""
    opset = default_opset(model)
    if profile is None or profile.rule("Tile") is not None or profile.rule("Resize") is None or opset < 10:
        reps = f"{node.name}_repeats"
        model.graph.initializer.append(numpy_helper.from_array(np.array([1, 1, *shape[2:]], np.int64), reps))
        return helper.make_node("Tile", [node.input[0], reps], [node.output[0]], name=node.name)
    scales = f"{node.name}_scales"
    model.graph.initializer.append(numpy_helper.from_array(np.array([1, 1, *shape[2:]], np.float32), scales))
    if opset == 10:
        return helper.make_node("Resize", [node.input[0], scales], [node.output[0]], name=node.name, mode="nearest")
    roi = f"{node.name}_roi"  # empty: the whole tensor (an input until opset 13)
    model.graph.initializer.append(numpy_helper.from_array(np.zeros(0, np.float32), roi))
    return helper.make_node("Resize", [node.input[0], roi, scales], [node.output[0]], name=node.name,
                            mode="nearest", coordinate_transformation_mode="asymmetric", nearest_mode="floor")


def _bilinear_factor(node: NodeProto, view: GraphView) -> int | None:
    """The factor s of a Resize that ``upsampling_by_whole_factors`` rewrites (None: not one)."""
    if node.op_type != "Resize" or node.domain not in ("", "ai.onnx") or len(node.input) < 3:
        return None
    a = view.attrs(node)
    text = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in a.items()}
    if text.get("mode") != "linear" or text.get("coordinate_transformation_mode", "half_pixel") not in (
            "half_pixel", "pytorch_half_pixel") or a.get("antialias", 0) or a.get("axes") \
            or a.get("keep_aspect_ratio_policy", b"stretch") not in (b"stretch", "stretch"):
        return None
    shape_in, shape_out = view.shapes.get(node.input[0]), view.shapes.get(node.output[0])
    if shape_in is None or shape_out is None or len(shape_in) != 4 or len(shape_out) != 4 \
            or not is_static([*shape_in, *shape_out]):
        return None
    if shape_out[:2] != shape_in[:2] or shape_out[2] % shape_in[2] or shape_out[3] % shape_in[3]:
        return None
    factor = shape_out[2] // shape_in[2]
    if factor != shape_out[3] // shape_in[3] or factor not in (2, 4, 6):
        return None
    scales = view.const(node.input[2]) if node.input[2] else None  # sizes given: the output shape says it
    if scales is not None and scales.size and not np.allclose(scales.reshape(-1), [1, 1, factor, factor]):
        return None  # scales not whole: half-pixel coordinates use the scale, not the size ratio
    return factor
