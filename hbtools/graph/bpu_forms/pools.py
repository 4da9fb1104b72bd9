"""Pools the BPU takes: over one axis as 2-D, large average pools in steps, average pools over whole windows."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from onnx import ModelProto, NodeProto, helper, numpy_helper

from hbtools.graph.bpu_forms._common import _axes_node, _opset, around_one_row, reshape_node
from hbtools.graph.graph import GraphView, is_static, rewrite_nodes
from hbtools.march.profiles import MarchProfile, OpRule
from hbtools.ops.base import attrs_of


def pools_over_one_axis_as_2d(model: ModelProto, profile: MarchProfile) -> int:
    """A MaxPool / AveragePool over the one axis of a 3-D [N, C, L] tensor (PyTorch's MaxPool1d after Conv1d
    layers: atspm-detector's traffic-signal net) as the same pool over [N, C, 1, L] between an Unsqueeze and
    a Squeeze of that axis: kernel, stride, dilation and pads of the length axis, one row on the other; and
    a pool of a 5-D view of a map that takes one channel at a time (``_channel_pool_as_2d``); and, where the BPU
    takes 5-D tensors, any pool of a 5-D tensor (``_video_pool_as_2d``). The BPU's pools take 4-D tensors only,
    so the pool, and the activation before it that fed only it, ran on the CPU.
    Returns how many it rewrote."""
    view = GraphView(model)
    opset = _opset(model)
    # where the BPU takes no 5-D tensor (RDK X3) the views would be CPU Reshapes around a pool in float
    videos = profile.takes_rank(5)
    return rewrite_nodes(model, lambda node: _pool_as_2d(node, view, opset, model)
                         or _channel_pool_as_2d(node, view, opset, model)
                         or (_video_pool_as_2d(node, view, model) if videos else None))


def _video_pool_as_2d(node: NodeProto, view: GraphView, model: ModelProto) -> list[NodeProto] | None:
    """A pool of a 5-D [N, C, T, H, W] tensor (MaxPool3d / AvgPool3d of video nets: X3D, R(2+1)D, C3D) as 2-D
    pools of views of it: over T, a pool of [N, C, T, H*W] with a kernel of one along H*W; over H and W, a pool
    of [N, C*T, H, W]. A window is a box, so its max, and its mean (the count of a box a product of counts per
    axis, padding counted or not), is the pool over T of the pools over H and W; each axis keeps its kernel,
    stride, pads, dilation and ceil_mode. The BPU's pools take 4-D tensors only."""
    shape = view.shapes.get(node.input[0]) if node.op_type in ("MaxPool", "AveragePool") \
        and node.domain in ("", "ai.onnx") else None
    out_shape = view.shapes.get(node.output[0])
    a = view.attrs(node)
    if shape is None or out_shape is None or len(shape) != 5 or not is_static([*shape, *out_shape]) \
            or len([o for o in node.output if o]) != 1 or a.get("auto_pad", "NOTSET") not in ("NOTSET", b"NOTSET"):
        return None
    window = {"kernel_shape": list(a["kernel_shape"]), "strides": list(a.get("strides", [1] * 3))}
    if "dilations" in a:  # an AveragePool takes them from opset 19 only
        window["dilations"] = list(a["dilations"])
    pads = list(a.get("pads", [0] * 6))
    over_t = any(v[0] != 1 for v in window.values()) or pads[0] or pads[3]
    over_hw = any(v[1:] != [1, 1] for v in window.values()) or any(pads[1:3] + pads[4:])
    if not (over_t or over_hw):
        return None
    n, c, t, h, w = shape
    others = [x for x in node.attribute if x.name not in (*window, "pads")]
    steps = []  # (tag, the 4-D view pooled, the 2-D pool's attributes)
    if over_t:
        steps.append(("t", [n, c, t, h * w], {"pads": [pads[0], 0, pads[3], 0],
                                             **{key: [v[0], 1] for key, v in window.items()}}))
    if over_hw:
        steps.append(("hw", [n, c * out_shape[2], h, w], {"pads": [*pads[1:3], *pads[4:]],
                                                         **{key: v[1:] for key, v in window.items()}}))
    nodes, x = [], node.input[0]
    for tag, view_shape, attrs in steps:
        name = node.name if tag == steps[-1][0] else f"{node.name}_{tag}"  # the last pool keeps the name
        flat, pooled = f"{x}_{node.name}_{tag}_4d", f"{node.output[0]}_{tag}"
        pool = helper.make_node(node.op_type, [flat], [pooled], name=name, **attrs)
        pool.attribute.extend(others)
        nodes += [reshape_node(model, x, flat, view_shape, f"{node.name}_{tag}_4d"), pool]
        x = pooled
    return [*nodes, reshape_node(model, x, node.output[0], list(out_shape), f"{node.name}_5d")]


def _channel_pool_as_2d(node: NodeProto, view: GraphView, opset: int, model: ModelProto) -> list[NodeProto] | None:
    """A pool over a 5-D [N, 1, C, H, W] view of a map (LPRNet's ``MaxPool3d((1, 3, 3), stride=(s, 1, 2))`` on
    ``x.unsqueeze(1)``) that takes one channel at a time: the 4-D pool over H and W, then every s-th channel (a
    Slice with step s), the same values; between a Squeeze and an Unsqueeze of the added axis."""
    shape = view.shapes.get(node.input[0]) if node.op_type in ("MaxPool", "AveragePool") \
        and node.domain in ("", "ai.onnx") else None
    out_shape = view.shapes.get(node.output[0])
    if shape is None or out_shape is None or len(shape) != 5 or shape[1] != 1 or None in shape or None in out_shape \
            or len([o for o in node.output if o]) != 1:
        return None
    a = view.attrs(node)
    kernel, strides = list(a["kernel_shape"]), list(a.get("strides", [1, 1, 1]))
    pads = list(a.get("pads", [0] * 6))
    step = strides[0]
    if kernel[0] != 1 or pads[0] or pads[3] or list(a.get("dilations", [1, 1, 1]))[0] != 1 or \
            a.get("auto_pad", "NOTSET") not in ("NOTSET", b"NOTSET") or -(-shape[2] // step) != out_shape[2] or \
            (step > 1 and opset < 10):
        return None
    attrs = {"kernel_shape": kernel[1:], "strides": strides[1:], "pads": [pads[1], pads[2], pads[4], pads[5]]}
    if "dilations" in a:
        attrs["dilations"] = list(a["dilations"])[1:]
    others = [x for x in node.attribute if x.name not in ("kernel_shape", "strides", "pads", "dilations")]
    flat, pooled = f"{node.input[0]}_{node.name}_2d", f"{node.output[0]}_{node.name}_2d"
    pool = helper.make_node(node.op_type, [flat], [pooled], name=node.name, **attrs)
    pool.attribute.extend(others)
    nodes = [_axes_node(model, opset, "Squeeze", node.input[0], flat, [1], f"{node.name}_to_2d"), pool]
    if step > 1:
        picked = f"{node.output[0]}_{node.name}_channels"
        names = [f"{node.name}_{k}" for k in ("starts", "ends", "axes", "steps")]
        model.graph.initializer.extend(numpy_helper.from_array(np.array([v], np.int64), n)
                                       for v, n in zip((0, shape[2], 1, step), names, strict=True))
        nodes.append(helper.make_node("Slice", [pooled, *names], [picked], name=f"{node.name}_channels"))
        pooled = picked
    return [*nodes, _axes_node(model, opset, "Unsqueeze", pooled, node.output[0], [1], f"{node.name}_from_2d")]


def _pool_as_2d(node: NodeProto, view: GraphView, opset: int, model: ModelProto) -> list[NodeProto] | None:
    shape = view.shapes.get(node.input[0]) if node.op_type in ("MaxPool", "AveragePool") \
        and node.domain in ("", "ai.onnx") else None
    if shape is None or len(shape) != 3 or len([o for o in node.output if o]) != 1:
        return None
    a = view.attrs(node)
    attrs = {"kernel_shape": [1, *a["kernel_shape"]]}
    for key, one in (("strides", 1), ("dilations", 1)):
        if key in a:
            attrs[key] = [one, *a[key]]
    if "pads" in a:
        attrs["pads"] = [0, a["pads"][0], 0, a["pads"][1]]
    others = [x for x in node.attribute if x.name not in attrs]
    pool = helper.make_node(node.op_type, [node.input[0]], [node.output[0]], name=node.name, **attrs)
    pool.attribute.extend(others)
    return around_one_row(model, opset, node, pool)


def large_average_pools_in_steps(model: ModelProto, profile: MarchProfile,
                                 placed: Mapping[str, str] | None = None) -> int:
    """An AveragePool over whole non-overlapping windows (kernel = stride, no padding, windows that tile the
    map) larger than the march's kernel or stride limit: over the whole map a GlobalAveragePool, otherwise
    the same mean taken in steps, each a pool over whole windows within the limits (a 30x30 one as 6x6 then
    5x5). A mean of equal-sized means is the mean: the same values up to float rounding, and one more grid
    between the steps once quantized. PSPNet's AdaptiveAvgPool2d of a 60x60 map and MobileOne's
    squeeze-and-excitation (avg_pool2d over the whole map) export such pools, which went to the CPU. A window
    over a whole axis whose length has a prime factor beyond the limit (a mean over 13 columns on RDK X3) in
    windows of the limit, the last padded with zeros, and the sum over the padded length scaled by one constant
    Mul to the mean.
    Pools that ``placed`` (node_info) names stay. The count of pools rewritten."""
    rule = profile.rule("AveragePool")
    limit = min(v for v in (rule.kernel, rule.stride) if v is not None) if rule is not None else None
    if limit is None or profile.rule("GlobalAveragePool") is None:
        return 0
    view = GraphView(model)
    named = set(placed or ())

    def rewrite(node: NodeProto) -> list[NodeProto] | None:
        if node.op_type != "AveragePool" or node.domain not in ("", "ai.onnx") or node.name in named:
            return None
        shape = view.shapes.get(node.input[0])
        a = view.attrs(node)
        kernel = list(a.get("kernel_shape", []))
        plain = list(a.get("strides", [1, 1])) == kernel and not any(a.get("pads", [0] * 4)) \
            and list(a.get("dilations", [1, 1])) == [1, 1] and a.get("auto_pad", "NOTSET") in ("NOTSET", b"NOTSET")
        if not plain or shape is None or len(shape) != 4 or len(kernel) != 2 \
                or any(not isinstance(d, int) for d in shape[2:]) or max(kernel) <= limit \
                or any(size % k for size, k in zip(shape[2:], kernel, strict=True)):
            return None
        if kernel == list(shape[2:]):
            return [helper.make_node("GlobalAveragePool", [node.input[0]], [node.output[0]], name=node.name)]
        steps = _whole_window_steps(kernel, shape[2:], limit)
        if steps is None:
            return None
        # Padding counts as zeros (count_include_pad): the padded steps divide the sum by the padded length, which
        # one constant factor puts right.
        padded = int(np.prod([k for axis in steps for k, _ in axis]))
        correction = padded / int(np.prod(kernel))
        nodes, x = [], node.input[0]
        for i in range(len(steps[0])):
            (kh, ph), (kw, pw) = steps[0][i], steps[1][i]
            last = i == len(steps[0]) - 1 and correction == 1
            out = node.output[0] if last else f"{node.output[0]}_step{i}"
            padding = {"pads": [0, 0, ph, pw], "count_include_pad": 1} if ph or pw else {}
            nodes.append(helper.make_node("AveragePool", [x], [out], name=node.name if last else f"{node.name}_step{i}",
                                          kernel_shape=[kh, kw], strides=[kh, kw], **padding))
            x = out
        if correction != 1:
            factor = f"{node.name or node.output[0]}_padding_correction"
            model.graph.initializer.append(numpy_helper.from_array(np.array(correction, np.float32), factor))
            nodes.append(helper.make_node("Mul", [x, factor], [node.output[0]], name=node.name))
        return nodes

    return rewrite_nodes(model, rewrite)


def large_max_pools_in_steps(model: ModelProto, profile: MarchProfile,
                             placed: Mapping[str, str] | None = None) -> int:
    """A MaxPool of stride 1 with a kernel larger than the march takes (the SPP block of YOLOv3/v4/v5 and YOLOX:
    9x9 and 13x13 on RDK X3, whose limit is 7) as a cascade of stride-1 MaxPools within the limit whose kernels
    add up (k - 1 = sum of k_i - 1) and which share its padding: the max over the window is the max of maxes
    over overlapping windows that cover it (YOLOv5's SPPF is this cascade of 5x5 pools). Exact, on float and on
    int8 levels alike. A MaxPool over whole non-overlapping windows (kernel = stride, no padding, windows that
    tile the map: a max over one axis written as a pool, ``axis_reductions_as_pools``) beyond the kernel or stride
    limit is a GlobalMaxPool over the whole map, else the max taken in steps of whole windows within the limits,
    as ``large_average_pools_in_steps`` takes a mean. Pools that ``placed`` (node_info) names stay. The count of
    pools rewritten."""
    rule = profile.rule("MaxPool")
    if rule is None or rule.kernel is None:
        return 0
    limit = rule.kernel
    named = set(placed or ())
    view = GraphView(model)

    def rewrite(node: NodeProto) -> list[NodeProto] | None:
        if node.op_type != "MaxPool" or node.domain not in ("", "ai.onnx") or node.name in named or \
                len([o for o in node.output if o]) != 1:
            return None
        a = attrs_of(node)
        kernel = list(a.get("kernel_shape", []))
        rank = len(kernel)
        pads = list(a.get("pads", [0] * 2 * rank))
        if rank == 2 and list(a.get("strides", [1] * rank)) == kernel and kernel != [1, 1]:
            return _whole_window_max_steps(node, a, view.shapes.get(node.input[0]), rule, profile)
        if rank != 2 or max(kernel) <= limit or list(a.get("strides", [1] * rank)) != [1] * rank \
                or list(a.get("dilations", [1] * rank)) != [1] * rank \
                or a.get("auto_pad", "NOTSET") not in ("NOTSET", b"NOTSET") or any(p >= k for p, k in zip(
                    pads, kernel * 2, strict=True)):
            return None
        count = max(-(-(k - 1) // (limit - 1)) for k in kernel)
        sizes = [[1 + (k - 1) // count + (i < (k - 1) % count) for i in range(count)] for k in kernel]
        left = {axis: [pads[axis], pads[axis + rank]] for axis in range(rank)}  # padding still to take, per side
        nodes, x = [], node.input[0]
        for i in range(count):
            step = [sizes[axis][i] for axis in range(rank)]
            taken = [[min(left[axis][side], step[axis] - 1) for axis in range(rank)] for side in (0, 1)]
            for axis in range(rank):
                left[axis] = [left[axis][0] - taken[0][axis], left[axis][1] - taken[1][axis]]
            last = i == count - 1
            out = node.output[0] if last else f"{node.output[0]}_step{i}"
            nodes.append(helper.make_node("MaxPool", [x], [out], name=node.name if last else f"{node.name}_step{i}",
                                          kernel_shape=step, pads=[*taken[0], *taken[1]]))
            x = out
        return nodes

    return rewrite_nodes(model, rewrite)


def _whole_window_max_steps(node: NodeProto, a: dict, shape: list | None, rule: OpRule,
                            profile: MarchProfile) -> list[NodeProto] | None:
    """``large_max_pools_in_steps`` for a pool over whole non-overlapping windows (kernel = stride)."""
    kernel = list(a["kernel_shape"])
    limit = min(v for v in (rule.kernel, rule.stride) if v is not None)
    if any(a.get("pads", [0] * 4)) or list(a.get("dilations", [1, 1])) != [1, 1] or a.get("ceil_mode", 0) \
            or a.get("auto_pad", "NOTSET") not in ("NOTSET", b"NOTSET") or max(kernel) <= limit \
            or shape is None or len(shape) != 4 or any(not isinstance(d, int) for d in shape[2:]) \
            or any(size % k for size, k in zip(shape[2:], kernel, strict=True)):
        return None
    if kernel == list(shape[2:]) and profile.rule("GlobalMaxPool") is not None:
        return [helper.make_node("GlobalMaxPool", [node.input[0]], [node.output[0]], name=node.name)]
    steps = _whole_window_steps(kernel, shape[2:], limit)  # a MaxPool's padding takes part in no maximum
    if steps is None:
        return None
    nodes, x = [], node.input[0]
    for i in range(len(steps[0])):
        (kh, ph), (kw, pw) = steps[0][i], steps[1][i]
        last = i == len(steps[0]) - 1
        out = node.output[0] if last else f"{node.output[0]}_step{i}"
        nodes.append(helper.make_node("MaxPool", [x], [out], name=node.name if last else f"{node.name}_step{i}",
                                      kernel_shape=[kh, kw], strides=[kh, kw], pads=[0, 0, ph, pw]))
        x = out
    return nodes


def _whole_window_steps(kernel: list[int], size: list[int], limit: int) -> list[list[tuple[int, int]]] | None:
    """Steps of (kernel, end padding) per axis, as many on each, that pool whole windows of ``kernel`` within
    ``limit``: each axis in whole windows of its factors; a window over the whole axis whose length has a prime
    factor beyond the limit in windows of the limit, the last one padded at the end. Padded windows inside one of
    several would take values of the next (None)."""
    factors = [_factors(k, limit) for k in kernel]
    steps = [[(f, 0) for f in whole] if whole is not None else _padded_steps(k, limit) if k == n else None
             for whole, k, n in zip(factors, kernel, size, strict=True)]
    if any(f is None for f in steps):
        return None
    count = max(len(f) for f in steps)
    return [f + [(1, 0)] * (count - len(f)) for f in steps]


def _padded_steps(n: int, limit: int) -> list[tuple[int, int]]:
    """Windows of ``limit`` (kernel, end padding) that reduce a length ``n`` to one, step by step."""
    steps = []
    while n > 1:
        k = min(n, limit)
        windows = -(-n // k)
        steps.append((k, windows * k - n))
        n = windows
    return steps


def _factors(n: int, limit: int) -> list[int] | None:
    """``n`` as a product of whole factors of at most ``limit``, largest first (None: a prime factor is larger)."""
    out = []
    while n > 1:
        f = next((d for d in range(min(n, limit), 1, -1) if n % d == 0), None)
        if f is None:
            return None
        out.append(f)
        n //= f
    return out or [1]


def average_pools_over_whole_windows(model: ModelProto) -> None:
    """An AveragePool whose divisor varies with the position (``count_include_pad=0`` with padding, the
    ONNX default that TensorFlow exports use; or ``ceil_mode`` windows hanging over the end) as the
    same pool over whole windows of k*k values (dilated ones too), padding counted, times a constant map
    of k*k / count: the sums are the same, and both ops have BPU forms. A ceil_mode pool whose windows
    all fit stays."""
    view = GraphView(model)
    nodes = []
    for node in model.graph.node:
        shape = view.shapes.get(node.input[0]) if node.op_type == "AveragePool" else None
        a = view.attrs(node)
        if shape is None or len(shape) != 4 or any(not isinstance(d, int) for d in shape[2:]) \
                or a.get("auto_pad", "NOTSET") not in ("NOTSET", b"NOTSET"):
            nodes.append(node)
            continue
        kernel = list(a["kernel_shape"])
        strides = list(a.get("strides", [1, 1]))
        dilations = list(a.get("dilations", [1, 1]))
        pads = list(a.get("pads", [0, 0, 0, 0]))
        ends, counts = [], []
        for k, size in enumerate(shape[2:]):
            padded = size + pads[k] + pads[k + 2]
            extent = (kernel[k] - 1) * dilations[k] + 1  # the window's span; its taps are dilations apart
            out = -(-(padded - extent) // strides[k]) + 1 if a.get("ceil_mode", 0) else \
                (padded - extent) // strides[k] + 1
            if a.get("ceil_mode", 0) and (out - 1) * strides[k] >= size + pads[k]:
                out -= 1  # onnxruntime drops a last window that would start in the end padding
            end = (out - 1) * strides[k] + extent - size - pads[k]  # end padding whole windows need
            ends.append(max(end, pads[k + 2]))
            lo, hi = (0, size) if not a.get("count_include_pad", 0) else (-pads[k], size + pads[k + 2])
            taps = (np.arange(out) * strides[k] - pads[k])[:, None] + np.arange(kernel[k])[None, :] * dilations[k]
            counts.append(((taps >= lo) & (taps < hi)).sum(axis=1))
        if any(e >= k for e, k in zip(ends, kernel, strict=True)):
            nodes.append(node)  # onnxruntime takes no pad as large as the kernel, which a dilated window may need
            continue
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
        dilated = {"dilations": dilations} if any(d != 1 for d in dilations) else {}
        nodes.append(helper.make_node("AveragePool", [node.input[0]], [whole], name=f"{node.name}_whole_windows",
                                      kernel_shape=kernel, strides=strides, pads=[*pads[:2], *ends],
                                      count_include_pad=1, **dilated))
        factor = f"{node.name}_window_counts"
        model.graph.initializer.append(numpy_helper.from_array(
            (window / count).astype(np.float32).reshape(1, 1, *count.shape), factor))
        nodes.append(helper.make_node("Mul", [whole, factor], list(node.output), name=node.name))
    del model.graph.node[:]
    model.graph.node.extend(nodes)
