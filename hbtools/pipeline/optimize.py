"""Optimize stage: numerically neutral graph rewrites.

onnxruntime's basic-level optimizer does constant folding (static shape chains
included, since the parse stage fixed the input shapes), Identity/Dropout
removal and Conv+BatchNormalization fusion. On top of it we fold per-channel
or scalar affine constants that follow a Conv (PP-OCR's learnable affine
blocks) and turn any remaining BatchNormalization into a depthwise 1x1 Conv,
so the quantizer sees fewer, larger integer ops.
"""

from __future__ import annotations

import copy
import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import ModelProto, NodeProto, helper, numpy_helper

from hbtools.graph.graph import (
    GraphView,
    infer_shapes,
    name_unnamed_nodes,
    remove_dead_nodes,
    topological_sort,
)
from hbtools.graph.layer_norm import fuse_layer_norms
from hbtools.graph.model_io import with_horizon_domain
from hbtools.march.profiles import MarchProfile
from hbtools.ops import custom
from hbtools.ops.base import DOMAIN
from hbtools.runtime.session import ort_session

log = logging.getLogger("hbtools")


def run(model: ModelProto, profile: MarchProfile | None = None) -> ModelProto:
    """Return the optimized copy of an original float model (HzPreprocess kept in front).

    With the march ``profile``, convolutions are also put in forms its BPU takes (a patch
    embedding with a larger kernel than it takes becomes SpaceToDepth and a 1x1 Conv)."""
    model = copy.deepcopy(model)
    pre_nodes = [n for n in model.graph.node if n.domain == DOMAIN]
    original_inputs = list(model.graph.input)
    body = _without_preprocess(model, pre_nodes)
    cut = _cut_custom_nodes(body)
    body = _onnxruntime_basic(body)
    # onnxruntime inlines function ops (HardSwish from opset 14, ...) into unnamed nodes;
    # partition, calibration and tables key on node names.
    name_unnamed_nodes(body)
    _sums_as_adds(body)
    fused = fuse_layer_norms(body)
    if fused:
        log.info("%d layer normalizations written as one HzLayerNorm node each", fused)
    _spatial_reductions_as_global_pools(body)
    _zero_pads_into_convs(body)
    _upsampling_in_bpu_forms(body)
    _interpolations_as_matmuls(body)
    if profile is not None:
        _large_patch_convs_as_space_to_depth(body, profile)
    _transposes_in_fewer_axes(body)
    _average_pools_over_whole_windows(body)
    _fold_affine_into_conv(body)
    _batchnorm_to_depthwise_conv(body)
    if _affine_to_depthwise_conv(body):
        _fold_affine_into_conv(body)  # the Add of a Mul+Add pair goes into the new conv's bias
    remove_dead_nodes(body)
    _restore_custom_nodes(body, cut)
    out = _with_preprocess(body, pre_nodes, original_inputs, model)
    topological_sort(out)
    log.info("Optimized model: %d nodes (from %d)", len(out.graph.node), len(model.graph.node))
    return out


def _without_preprocess(model: ModelProto, pre_nodes: list) -> ModelProto:
    """The float body: each HzPreprocess output becomes a float graph input."""
    body = copy.deepcopy(model)
    shapes = GraphView(model).shapes
    pre_names = {n.name for n in pre_nodes}
    keep = [n for n in body.graph.node if n.name not in pre_names]
    del body.graph.node[:]
    body.graph.node.extend(keep)
    new_inputs = [i for i in body.graph.input if not any(i.name == n.input[0] for n in pre_nodes)]
    for n in pre_nodes:
        new_inputs.append(helper.make_tensor_value_info(n.output[0], onnx.TensorProto.FLOAT, shapes.get(n.input[0])))
    del body.graph.input[:]
    body.graph.input.extend(new_inputs)
    with_horizon_domain(body)
    return body


@dataclass
class _CustomCut:
    nodes: list[NodeProto]
    inputs: set[str]  # custom outputs, graph inputs of the body while onnxruntime optimizes it
    outputs: set[str]  # custom inputs, graph outputs of the body meanwhile (so they survive)
    constants: list[onnx.TensorProto]
    opsets: list[onnx.OperatorSetIdProto]


def _cut_custom_nodes(body: ModelProto) -> _CustomCut:
    """Take the custom CPU ops out of the body: onnxruntime cannot load them.

    Their outputs become body inputs and their inputs body outputs, so what
    onnxruntime rewrites around them keeps the tensor names they connect to.
    """
    nodes = [n for n in body.graph.node if custom.custom_op_of(n) is not None]
    if not nodes:
        return _CustomCut([], set(), set(), [], [])
    view = GraphView(body)
    shapes = view.shapes
    for n in nodes:
        body.graph.node.remove(n)
    outs = {o for n in nodes for o in n.output if o}
    ins = {i for n in nodes for i in n.input if i and i not in outs}
    consts = [t for t in body.graph.initializer if t.name in ins]
    produced = {o for n in body.graph.node for o in n.output}
    present = {o.name for o in body.graph.output}
    elem = {vi.name: vi.type.tensor_type.elem_type for vi in [*body.graph.value_info, *body.graph.input]}
    extra_out = sorted(i for i in ins if i in produced and i not in present)
    body.graph.output.extend(helper.make_tensor_value_info(i, elem.get(i, onnx.TensorProto.FLOAT), None)
                             for i in extra_out)
    body.graph.input.extend(helper.make_tensor_value_info(o, onnx.TensorProto.FLOAT, shapes.get(o))
                            for o in sorted(outs))
    domains = {n.domain for n in nodes}
    opsets = [o for o in body.opset_import if o.domain in domains]
    return _CustomCut(nodes, outs, set(extra_out), consts, opsets)


def _restore_custom_nodes(body: ModelProto, cut: _CustomCut) -> None:
    if not cut.nodes:
        return
    kept_in = [i for i in body.graph.input if i.name not in cut.inputs]
    del body.graph.input[:]
    body.graph.input.extend(kept_in)
    kept_out = [o for o in body.graph.output if o.name not in cut.outputs]
    del body.graph.output[:]
    body.graph.output.extend(kept_out)
    have = {t.name for t in body.graph.initializer}
    body.graph.initializer.extend(t for t in cut.constants if t.name not in have)
    body.graph.node.extend(cut.nodes)
    imported = {o.domain for o in body.opset_import}
    body.opset_import.extend(o for o in cut.opsets if o.domain not in imported)
    topological_sort(body)
    remove_dead_nodes(body)


def _with_preprocess(body: ModelProto, pre_nodes: list, inputs: list, source: ModelProto) -> ModelProto:
    pre_outputs = {n.output[0] for n in pre_nodes}
    kept_inputs = [i for i in body.graph.input if i.name not in pre_outputs]
    del body.graph.input[:]
    # Keep the original input order: preprocessed inputs come back as the raw inputs.
    order = {i.name: k for k, i in enumerate(inputs)}
    merged = {i.name: i for i in kept_inputs}
    for i in inputs:
        merged[i.name] = i
    body.graph.input.extend(sorted(merged.values(), key=lambda vi: order.get(vi.name, len(order))))
    nodes = [*pre_nodes, *body.graph.node]
    del body.graph.node[:]
    body.graph.node.extend(nodes)
    body.ir_version = source.ir_version
    with_horizon_domain(body)
    out = infer_shapes(body)
    # An output after an op that shape inference does not know (a com.microsoft op of a model
    # onnxruntime optimized before us) keeps the shape the parsed model declares: the checker needs one.
    declared = {o.name: o for o in source.graph.output if o.type.tensor_type.HasField("shape")}
    for o in out.graph.output:
        if not o.type.tensor_type.HasField("shape") and o.name in declared:
            o.type.tensor_type.shape.CopyFrom(declared[o.name].type.tensor_type.shape)
    return out


def _onnxruntime_basic(model: ModelProto) -> ModelProto:
    for out in model.graph.output:  # stale output shapes make onnxruntime warn
        out.type.tensor_type.ClearField("shape")
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "optimized.onnx")
        ort_session(model, optimized_model_path=path, per_node=True, rounding_fusions=True)
        optimized = onnx.load(path)
    optimized.ir_version = model.ir_version
    with_horizon_domain(optimized)
    # onnxruntime-only ops must never reach an artefact unless the model had them already (a model
    # quantized by onnxruntime carries com.microsoft ops of its own).
    own = {(n.domain, n.op_type) for n in model.graph.node}
    unexpected = {(n.domain, n.op_type) for n in optimized.graph.node if n.domain not in ("", "ai.onnx")} - own
    if unexpected:
        log.warning("onnxruntime's optimizations made ops the model does not have (%s); keeping the unoptimized "
                    "graph", ", ".join(sorted(f"{d}.{op}" for d, op in unexpected)))
        return model
    return optimized


def _sums_as_adds(model: ModelProto) -> None:
    """``Sum`` (Caffe2's and old exporters' residual joins) as a chain of ``Add``: the BPU op.

    The chain adds in input order, as onnxruntime's Sum does, so the float model is unchanged.
    """
    nodes = []
    for node in model.graph.node:
        ins = [i for i in node.input if i]
        if node.op_type != "Sum" or node.domain not in ("", "ai.onnx") or len(ins) < 2:
            nodes.append(node)
            continue
        acc = ins[0]
        for k, term in enumerate(ins[1:], start=1):
            last = k == len(ins) - 1
            out = node.output[0] if last else f"{node.output[0]}_sum{k}"
            name = node.name if last else f"{node.name}_sum{k}"
            nodes.append(helper.make_node("Add", [acc, term], [out], name=name))
            acc = out
    del model.graph.node[:]
    model.graph.node.extend(nodes)


_GLOBAL_POOL_OF = {"ReduceMean": "GlobalAveragePool", "ReduceMax": "GlobalMaxPool"}


def _spatial_reductions_as_global_pools(model: ModelProto) -> None:
    """A mean or max over the two spatial axes of a 4-D tensor (``x.mean((2, 3))``, the squeeze of
    squeeze-and-excitation blocks in PyTorch and Paddle exports) as GlobalAveragePool /
    GlobalMaxPool, the BPU's pooling ops; without ``keepdims`` a Flatten follows, which gives
    the same [N, C]."""
    view = GraphView(model)
    nodes = []
    for node in model.graph.node:
        pool = _GLOBAL_POOL_OF.get(node.op_type) if node.domain in ("", "ai.onnx") else None
        if pool is None:
            nodes.append(node)
            continue
        shape = view.shapes.get(node.input[0])
        if shape is None or len(shape) != 4 or view.reduced_axes(node) != [2, 3]:
            nodes.append(node)
            continue
        if view.attrs(node).get("keepdims", 1):
            nodes.append(helper.make_node(pool, [node.input[0]], [node.output[0]], name=node.name))
            continue
        pooled = f"{node.output[0]}_pooled"
        nodes.append(helper.make_node(pool, [node.input[0]], [pooled], name=f"{node.name}_pool"))
        nodes.append(helper.make_node("Flatten", [pooled], [node.output[0]], name=node.name, axis=1))
    del model.graph.node[:]
    model.graph.node.extend(nodes)


def _zero_pads_into_convs(model: ModelProto) -> None:
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
    if node.op_type != "Pad" or node.domain not in ("", "ai.onnx"):
        return None
    a = view.attrs(node)
    mode = a.get("mode", b"constant")
    if mode not in (b"constant", "constant"):
        return None
    shape = view.shapes.get(node.input[0])
    if len(node.input) > 1 and node.input[1]:  # opset 11: pads (and value, axes) are inputs
        pads = view.const(node.input[1])
        value = view.const(node.input[2]) if len(node.input) > 2 and node.input[2] else np.zeros(1)
        if pads is None or value is None or (len(node.input) > 3 and node.input[3]):
            return None
        pads = [int(v) for v in pads.reshape(-1)]
    else:
        pads, value = list(a.get("pads", [])), np.array(a.get("value", 0.0))
    if shape is None or len(pads) != 2 * len(shape) or len(shape) < 3 or np.any(value != 0) or min(pads) < 0:
        return None
    rank = len(shape)
    begin, end = pads[:rank], pads[rank:]
    if any(begin[:2]) or any(end[:2]):  # batch or channels padded
        return None
    return [*begin[2:], *end[2:]]


def _upsampling_in_bpu_forms(model: ModelProto) -> None:
    """A Resize of one pixel as a Tile, and a bilinear Resize by an even whole factor s (2, 4, 6) of
    H and W with half-pixel coordinates (PyTorch's ``interpolate(..., mode='bilinear')``,
    segmentation decoders) as an edge Pad of one pixel and a depthwise ConvTranspose (stride s,
    kernel 2s, the bilinear weights ``1 - |t - s + 0.5| / s`` per axis, pads 1.5 s): the same
    weighted sums, with BPU forms, where the Resize has none. Without the Pad, the borders would
    blend with zeros instead of repeating the edge."""
    view = GraphView(model)
    nodes = []
    for node in model.graph.node:
        if _resize_of_one_pixel(node, view):  # every mode repeats the one value (ASPP's image pooling branch)
            shape = view.shapes[node.output[0]]
            reps = f"{node.name}_repeats"
            model.graph.initializer.append(numpy_helper.from_array(np.array([1, 1, *shape[2:]], np.int64), reps))
            nodes.append(helper.make_node("Tile", [node.input[0], reps], [node.output[0]], name=node.name))
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


def _interpolations_as_matmuls(model: ModelProto) -> None:
    """Any other linear or cubic Resize of H and W of a 4-D map (align_corners, a factor of 8, a size that
    is not a multiple) as what it is, a linear map per axis: ``MatMul`` by the interpolation matrix along W,
    then along H between two Transposes. The matrices are onnxruntime's own Resize of one-hot rows, so
    every coordinate mode and rounding is the Resize's."""
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
                nodes += [helper.make_node("Transpose", [x], [moved], name=f"{node.name}_swap", perm=[0, 1, 3, 2]),
                          helper.make_node("MatMul", [moved, w], [done], name=f"{node.name}_along_h"),
                          helper.make_node("Transpose", [done], [out], name=f"{node.name}_swap_back",
                                           perm=[0, 1, 3, 2])]
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
        probe_in = [shape[axis], 1, 1, 1]
        probe_in[2] = shape[axis]
        probe_out = [shape[axis], 1, out_shape[axis], 1]
        eye = np.eye(shape[axis], dtype=np.float32).reshape(probe_in)
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


def _large_patch_convs_as_space_to_depth(model: ModelProto, profile: MarchProfile) -> None:
    """A patch embedding (Conv with kernel = stride, no padding: ViT's 16x16/16) whose kernel exceeds what the
    BPU takes as SpaceToDepth by the kernel and a 1x1 Conv over the k*k*C channels: the same sums, in forms the
    BPU has. Only where the map divides into whole patches (else the Conv would drop its edge)."""
    rule = profile.rule("Conv")
    limit = rule.kernel if rule is not None else None
    if limit is None:
        return
    view = GraphView(model)
    nodes = []
    for node in model.graph.node:
        w = view.const(node.input[1]) if node.op_type == "Conv" and len(node.input) > 1 else None
        shape = view.shapes.get(node.input[0])
        a = view.attrs(node)
        k = list(w.shape[2:]) if w is not None and w.ndim == 4 else []
        if not k or k[0] != k[1] or k[0] <= limit or shape is None or len(shape) != 4 \
                or list(a.get("strides", [1, 1])) != k or any(a.get("pads", [0])) or int(a.get("group", 1)) != 1 \
                or any(d != 1 for d in a.get("dilations", [1, 1])) or a.get("auto_pad", "NOTSET") not in \
                ("NOTSET", b"NOTSET", "VALID", b"VALID") or any(not isinstance(d, int) or d % k[0] for d in shape[2:]):
            nodes.append(node)
            continue
        b = k[0]
        # SpaceToDepth puts input channel c of patch offset (i, j) at (i * b + j) * C + c
        weight = w.transpose(0, 2, 3, 1).reshape(w.shape[0], -1, 1, 1)
        name = f"{node.input[1]}_patches"
        model.graph.initializer.append(numpy_helper.from_array(weight.astype(w.dtype), name))
        moved = f"{node.input[0]}_{node.name}_space_to_depth"
        nodes.append(helper.make_node("SpaceToDepth", [node.input[0]], [moved], name=f"{node.name}_space_to_depth",
                                      blocksize=b))
        nodes.append(helper.make_node("Conv", [moved, name, *node.input[2:]], list(node.output), name=node.name,
                                      kernel_shape=[1, 1]))
    del model.graph.node[:]
    model.graph.node.extend(nodes)


def _transposes_in_fewer_axes(model: ModelProto) -> None:
    """A Transpose of more than 4 axes between two Reshapes (MobileViT's unfolding into patches goes through
    [1, C, h, 2, w, 2]) moves the same elements with its size-1 axes dropped and with the axes that stay
    side by side merged; the Reshapes around it only need the element order, so the first one makes the
    smaller shape and the Transpose takes the shorter perm. The BPU takes at most 5 axes (4 on bernoulli2)."""
    view = GraphView(model)
    for node in model.graph.node:
        shape = view.shapes.get(node.input[0]) if node.op_type == "Transpose" else None
        if shape is None or len(shape) <= 4 or any(not isinstance(d, int) or d <= 0 for d in shape):
            continue
        before = view.producer.get(node.input[0])
        after = view.consumers.get(node.output[0], [])
        reshapes = [before, *after]
        if before is None or not after or node.output[0] in view.graph_outputs \
                or len(view.consumers.get(node.input[0], [])) != 1 or node.input[0] in view.graph_outputs \
                or any(r.op_type != "Reshape" or not view.is_const(r.input[1]) for r in reshapes) \
                or any(0 in view.const(r.input[1]).tolist() for r in after):
            continue
        perm = list(view.attrs(node).get("perm", range(len(shape) - 1, -1, -1)))
        dims, new_perm = _fewer_axes(shape, perm)
        if len(dims) >= len(shape):
            continue
        target = f"{before.input[1]}_{node.name}_fewer_axes"
        model.graph.initializer.append(numpy_helper.from_array(np.array(dims, dtype=np.int64), target))
        before.input[1] = target
        del node.attribute[:]
        node.attribute.append(helper.make_attribute("perm", new_perm))


def _fewer_axes(shape: list[int], perm: list[int]) -> tuple[list[int], list[int]]:
    """The input dims and perm of the same transpose without size-1 axes, adjacent moved axes merged."""
    kept = [a for a in range(len(shape)) if shape[a] != 1]
    index = {a: k for k, a in enumerate(kept)}
    order = [index[a] for a in perm if a in index]  # output order of the kept input axes
    groups: list[list[int]] = []  # runs of input axes that stay adjacent, in output order
    for a in order:
        if groups and groups[-1][-1] + 1 == a:
            groups[-1].append(a)
        else:
            groups.append([a])
    by_input = sorted(range(len(groups)), key=lambda g: groups[g][0])
    dims = [int(np.prod([shape[kept[a]] for a in groups[g]])) for g in by_input]
    position = {g: k for k, g in enumerate(by_input)}
    return dims, [position[g] for g in range(len(groups))]


def _average_pools_over_whole_windows(model: ModelProto) -> None:
    """An AveragePool whose divisor varies with the position (``count_include_pad=0`` with padding, the
    ONNX default that TensorFlow exports use; or ``ceil_mode`` windows hanging over the end) as the
    same pool over whole windows of k*k values, padding counted, times a constant map of k*k / count:
    the sums are the same, and both ops have BPU forms. A ceil_mode pool whose windows all fit stays."""
    view = GraphView(model)
    nodes = []
    for node in model.graph.node:
        shape = view.shapes.get(node.input[0]) if node.op_type == "AveragePool" else None
        a = view.attrs(node)
        if shape is None or len(shape) != 4 or any(not isinstance(d, int) for d in shape[2:]) \
                or a.get("auto_pad", "NOTSET") not in ("NOTSET", b"NOTSET") or any(d != 1 for d in
                                                                                 a.get("dilations", [1, 1])):
            nodes.append(node)
            continue
        kernel = list(a["kernel_shape"])
        strides = list(a.get("strides", [1, 1]))
        pads = list(a.get("pads", [0, 0, 0, 0]))
        ends, counts = [], []
        for k, size in enumerate(shape[2:]):
            padded = size + pads[k] + pads[k + 2]
            out = -(-(padded - kernel[k]) // strides[k]) + 1 if a.get("ceil_mode", 0) else \
                (padded - kernel[k]) // strides[k] + 1
            if a.get("ceil_mode", 0) and (out - 1) * strides[k] >= size + pads[k]:
                out -= 1  # onnxruntime drops a last window that would start in the end padding
            end = (out - 1) * strides[k] + kernel[k] - size - pads[k]  # end padding whole windows need
            ends.append(max(end, pads[k + 2]))
            lo, hi = (0, size) if not a.get("count_include_pad", 0) else (-pads[k], size + pads[k + 2])
            starts = np.arange(out) * strides[k] - pads[k]
            counts.append(np.minimum(starts + kernel[k], hi) - np.maximum(starts, lo))
        count = counts[0][:, None] * counts[1][None, :]
        window = kernel[0] * kernel[1]
        if np.all(count == window) and ends == pads[2:]:
            # every window is whole: the floor-mode pool counting its padding is the same
            kept = [x for x in node.attribute if x.name not in ("ceil_mode", "count_include_pad")]
            del node.attribute[:]
            node.attribute.extend([*kept, helper.make_attribute("count_include_pad", 1)])
            nodes.append(node)
            continue
        whole = f"{node.output[0]}_whole_windows"
        nodes.append(helper.make_node("AveragePool", [node.input[0]], [whole], name=f"{node.name}_whole_windows",
                                      kernel_shape=kernel, strides=strides, pads=[*pads[:2], *ends],
                                      count_include_pad=1))
        factor = f"{node.name}_window_counts"
        model.graph.initializer.append(numpy_helper.from_array(
            (window / count).astype(np.float32).reshape(1, 1, *count.shape), factor))
        nodes.append(helper.make_node("Mul", [whole, factor], list(node.output), name=node.name))
    del model.graph.node[:]
    model.graph.node.extend(nodes)


def _resize_of_one_pixel(node: NodeProto, view: GraphView) -> bool:
    """A Resize of a [N, C, 1, 1] tensor to [N, C, H, W] (static shapes)."""
    if node.op_type not in ("Resize", "Upsample") or node.domain not in ("", "ai.onnx"):
        return False
    shape_in, shape_out = view.shapes.get(node.input[0]), view.shapes.get(node.output[0])
    return (shape_in is not None and shape_out is not None and len(shape_in) == len(shape_out) == 4
            and all(isinstance(d, int) and d > 0 for d in [*shape_in, *shape_out])
            and shape_in[2:] == [1, 1] and shape_out[:2] == shape_in[:2])


def _bilinear_factor(node: NodeProto, view: GraphView) -> int | None:
    """The factor s of a Resize that ``_upsampling_in_bpu_forms`` rewrites (None: not one)."""
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
            or not all(isinstance(d, int) and d > 0 for d in [*shape_in, *shape_out]):
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


def _per_channel_const(value: np.ndarray, channels: int) -> np.ndarray | None:
    """A constant that broadcasts as one value per channel of an NCHW tensor, as a [C] vector."""
    if value.size == 1:
        return np.full(channels, float(value.reshape(-1)[0]))
    squeezed = value.reshape(-1)
    if squeezed.size == channels and value.ndim >= 3 and value.shape[-1] == 1 and value.shape[-2] == 1:
        return squeezed.astype(np.float64)
    return None


def _fold_affine_into_conv(model: ModelProto) -> None:
    """Conv/ConvTranspose -> Mul(c) / Add(c) / Sub(c) / Div(c), c per-channel or scalar: fold into W and B."""
    changed = True
    while changed:
        changed = False
        view = GraphView(model)
        for node in model.graph.node:
            if node.op_type not in ("Mul", "Add", "Sub", "Div"):
                continue
            act = [i for i in node.input if not view.is_const(i)]
            if len(act) != 1:
                continue
            conv = view.producer.get(act[0])
            if conv is None or conv.op_type not in ("Conv", "ConvTranspose") \
                    or len(view.consumers.get(act[0], [])) != 1:
                continue
            if act[0] in view.graph_outputs or not view.is_const(conv.input[1]):
                continue
            if len(conv.input) > 2 and not view.is_const(conv.input[2]):
                continue
            const_name = next(i for i in node.input if view.is_const(i))
            if node.op_type in ("Sub", "Div") and node.input[1] != const_name:
                continue  # c - x and c / x are not affine in x
            weight = view.const(conv.input[1]).astype(np.float64)
            # ConvTranspose weights are [C_in, C_out / group, k...]: output channels on axis 1.
            transposed = conv.op_type == "ConvTranspose"
            group = int(view.attrs(conv).get("group", 1))
            channels = weight.shape[1] * group if transposed else weight.shape[0]
            if transposed and group != 1 and node.op_type in ("Mul", "Div"):
                continue
            c = _per_channel_const(view.const(const_name).astype(np.float64), channels)
            if c is None:
                continue
            bias = view.const(conv.input[2]).astype(np.float64) if len(conv.input) > 2 and conv.input[2] \
                else np.zeros(channels)
            along = [1, -1] + [1] * (weight.ndim - 2) if transposed else [-1] + [1] * (weight.ndim - 1)
            if node.op_type == "Mul":
                weight, bias = weight * c.reshape(along), bias * c
            elif node.op_type == "Div":
                weight, bias = weight / c.reshape(along), bias / c
            elif node.op_type == "Add":
                bias = bias + c
            else:
                bias = bias - c
            _set_conv_params(model, conv, weight, bias, node.output[0])
            model.graph.node.remove(node)
            changed = True
            break


def _set_conv_params(model: ModelProto, conv, weight: np.ndarray, bias: np.ndarray, new_output: str) -> None:
    w_name, b_name = f"{conv.name}_weight_folded", f"{conv.name}_bias_folded"
    for name in (w_name, b_name):
        for t in list(model.graph.initializer):
            if t.name == name:
                model.graph.initializer.remove(t)
    model.graph.initializer.extend(
        [
            numpy_helper.from_array(weight.astype(np.float32), w_name),
            numpy_helper.from_array(bias.astype(np.float32), b_name),
        ]
    )
    conv.input[1] = w_name
    if len(conv.input) > 2:
        conv.input[2] = b_name
    else:
        conv.input.append(b_name)
    conv.output[0] = new_output


def _affine_to_depthwise_conv(model: ModelProto) -> bool:
    """Mul / Add / Sub by a per-channel constant of a 4-D tensor no conv precedes (a BatchNormalization
    an exporter wrote as Mul + Add after an activation): a depthwise 1x1 Conv, which the BPU runs."""
    view = GraphView(model)
    changed = False
    for node in list(model.graph.node):
        if node.op_type not in ("Mul", "Add", "Sub") or len(node.input) != 2:
            continue
        act = [i for i in node.input if not view.is_const(i)]
        shape = view.shapes.get(act[0]) if len(act) == 1 else None
        if shape is None or len(shape) != 4 or not isinstance(shape[1], int) or shape[1] <= 1:
            continue
        const_name = next(i for i in node.input if view.is_const(i))
        if node.op_type == "Sub" and node.input[1] != const_name:
            continue  # c - x
        value = view.const(const_name).astype(np.float64)
        c = _per_channel_const(value, shape[1]) if value.ndim in (3, 4) and value.size == shape[1] else None
        if c is None:
            continue  # scalars stay lookup tables; other shapes are no per-channel affine
        weight = c if node.op_type == "Mul" else np.ones(shape[1])
        bias = np.zeros(shape[1]) if node.op_type == "Mul" else (c if node.op_type == "Add" else -c)
        conv = helper.make_node("Conv", [act[0], "", ""], [node.output[0]], name=node.name, group=shape[1],
                                kernel_shape=[1, 1])
        index = list(model.graph.node).index(node)
        model.graph.node.remove(node)
        model.graph.node.insert(index, conv)
        _set_conv_params(model, model.graph.node[index], weight.reshape(-1, 1, 1, 1), bias, node.output[0])
        changed = True
    return changed


def _batchnorm_to_depthwise_conv(model: ModelProto) -> None:
    """Each remaining BatchNormalization of a 4-D tensor becomes a depthwise 1x1 Conv; of a 3-D
    tensor [N, C, L] (after a Squeeze, in sequence heads) the same Conv between an Unsqueeze and
    a Squeeze, so it runs on the BPU too."""
    view = GraphView(model)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
    for node in list(model.graph.node):
        if node.op_type != "BatchNormalization" or len(node.output) != 1:
            continue
        rank = len(view.shapes[node.input[0]]) if view.shapes.get(node.input[0]) is not None else 0
        if rank not in (3, 4):
            continue
        params = [view.const(i) for i in node.input[1:5]]
        if any(p is None for p in params):
            continue
        gamma, beta, mean, var = (p.astype(np.float64) for p in params)
        eps = view.attrs(node).get("epsilon", 1e-5)
        k = gamma / np.sqrt(var + eps)
        channels = k.size
        x, y = node.input[0], node.output[0]
        nodes = []
        if rank == 3:
            x, y = f"{node.input[0]}_{node.name}_4d", f"{node.output[0]}_4d"
            nodes.append(_axes_node("Unsqueeze", node.input[0], x, f"{node.name}_unsqueeze", opset, model))
        nodes.append(helper.make_node("Conv", [x, "", ""], [y], name=node.name, group=channels, kernel_shape=[1, 1]))
        if rank == 3:
            nodes.append(_axes_node("Squeeze", y, node.output[0], f"{node.name}_squeeze", opset, model))
        index = list(model.graph.node).index(node)
        model.graph.node.remove(node)
        for k_node, new in enumerate(nodes):
            model.graph.node.insert(index + k_node, new)
        conv = model.graph.node[index + (1 if rank == 3 else 0)]  # protobuf inserted a copy; edit that one
        _set_conv_params(model, conv, k.reshape(-1, 1, 1, 1), beta - mean * k, y)


def _axes_node(op: str, x: str, y: str, name: str, opset: int, model: ModelProto) -> NodeProto:
    """Unsqueeze / Squeeze of the last axis of a 3-D / 4-D tensor (axes an input from opset 13)."""
    if opset < 13:
        return helper.make_node(op, [x], [y], name=name, axes=[3])
    axes = f"{name}_axes"
    model.graph.initializer.append(numpy_helper.from_array(np.array([3], dtype=np.int64), axes))
    return helper.make_node(op, [x, axes], [y], name=name)
