"""Bias correction for weight quantization.

Rounding a conv's weights shifts the mean of each output channel by
``(W - W_q) · E[x]``; adding that shift back to the bias removes the systematic
part of the weight error. ``E[x]`` (per input channel) is streamed from the float
model on calibration data. Only the weight-induced shift is corrected: correcting
the measured end-to-end shift of every layer at once over-corrects, since each
layer's shift already contains its predecessors'.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable

import numpy as np
from onnx import ModelProto, NodeProto, helper, numpy_helper

from hbtools.graph.graph import GraphView
from hbtools.ops.calibration import HzBiasCalibration
from hbtools.quant import grids
from hbtools.runtime.session import fetching_session

CORRECTABLE = ("Conv", "Gemm")  # ops with a bias input to absorb the shift


def _input_channel_means(model: ModelProto, convs: list[NodeProto], feeds: Iterable[dict]) -> dict[str, np.ndarray]:
    """Per conv/Gemm input, its mean per input channel: axis 1 of a Conv of any rank (1-D convs too),
    the last axis of a Gemm."""
    axes = {n.input[0]: -1 if n.op_type == "Gemm" else 1 for n in convs}
    names = list(axes)
    session = fetching_session(model, names)
    sums: dict[str, np.ndarray] = {}
    count = 0
    for feed in feeds:
        for name, value in zip(names, session.run(names, feed), strict=True):
            axis = axes[name] % value.ndim
            others = tuple(k for k in range(value.ndim) if k != axis)
            sums[name] = sums.get(name, 0.0) + value.astype(np.float64).mean(axis=others)
        count += 1
    return {k: v / max(count, 1) for k, v in sums.items()}


def _fake_quant(w: np.ndarray, thresholds: np.ndarray, axis: int) -> np.ndarray:
    steps = grids.along_axis(grids.scales_for(thresholds, grids.WEIGHT_BITS), axis, w.ndim)
    return grids.fake_quantize(w, steps, grids.WEIGHT_BITS).astype(np.float64)


def _weight_shift(node: NodeProto, w: np.ndarray, wq: np.ndarray, mean_x: np.ndarray, trans_b: bool) -> np.ndarray:
    """What to add to the bias to give back the output mean the rounded weights move."""
    err = w - wq
    if node.op_type == "Gemm":
        alpha = next((a.f for a in node.attribute if a.name == "alpha"), 1.0)
        beta = next((a.f for a in node.attribute if a.name == "beta"), 1.0)
        err = err.T if trans_b else err  # -> [K, N]
        # The output takes beta times the bias (C): 2x over-corrected at beta 2 before. Without beta, no bias counts.
        return alpha * (mean_x @ err) / beta if beta else np.zeros(err.shape[-1])
    group = next((a.i for a in node.attribute if a.name == "group"), 1)
    per_in = err.sum(axis=tuple(range(2, err.ndim)))  # [O, I/group]
    out_per_group = per_in.shape[0] // group
    means = mean_x.reshape(group, -1)  # [group, I/group]
    return np.einsum("gok,gk->go", per_in.reshape(group, out_per_group, -1), means).reshape(-1)


def correct_biases(optimized: ModelProto, convs: list[NodeProto], weight_thresholds: dict[str, np.ndarray],
                   weight_axes: dict[str, int], feeds: list[dict],
                   quantized: dict[str, np.ndarray] | None = None) -> ModelProto:
    """A copy of ``optimized`` whose conv biases absorb their weight-rounding shift.

    Weights are rounded to their per-channel grid, except those in ``quantized``
    (name -> fake-quantized weight), e.g. weights that fold a per-channel input's scales.
    """
    means = _input_channel_means(optimized, convs, feeds)
    model = copy.deepcopy(optimized)
    view = GraphView(model)
    nodes = {n.name: n for n in model.graph.node}
    for conv in convs:
        node = nodes[conv.name]
        w_name = node.input[1]
        w = view.const(w_name).astype(np.float64)
        if quantized and w_name in quantized:
            wq = quantized[w_name].astype(np.float64)
        else:
            wq = _fake_quant(w, weight_thresholds[w_name], weight_axes[w_name])
        trans_b = bool(next((a.i for a in node.attribute if a.name == "transB"), 0))
        shift = _weight_shift(node, w, wq, means[node.input[0]], trans_b)
        name = f"{node.name}_bias_corrected"
        if len(node.input) > 2 and node.input[2]:
            bias = np.broadcast_to(view.const(node.input[2]).astype(np.float64).reshape(-1), shift.shape)
            node.input[2] = name
        else:
            bias = np.zeros_like(shift)
            if len(node.input) == 2:
                node.input.append(name)
            else:
                node.input[2] = name
        model.graph.initializer.append(numpy_helper.from_array((bias + shift).astype(np.float32), name))
    return model


def record_float_biases(calibrated: ModelProto, uncorrected: ModelProto) -> None:
    """Tell each HzBiasCalibration of ``calibrated`` (a calibrated model being built from corrected biases)
    whose bias the correction changed the bias of ``uncorrected`` (attribute ``float_bias``).

    The calibrated model runs the corrected biases; the debugger's float model (every node off) reads
    the ones before, so that it is the float model the user exported. Only attributes are added: no copy
    of either model (their weights can be hundreds of MB).
    """
    convs = {n.name: n for n in uncorrected.graph.node if n.op_type in CORRECTABLE and n.name}
    old_inits = {t.name: t for t in uncorrected.graph.initializer}
    inits = {t.name: t for t in calibrated.graph.initializer}
    reader_of = {i: n for n in calibrated.graph.node for i in n.input if i}
    for node in calibrated.graph.node:
        if node.op_type != HzBiasCalibration.op_type or node.input[0] not in inits:
            continue
        reader = reader_of.get(node.output[0])
        conv = convs.get(reader.name) if reader is not None else None
        if conv is None:
            continue
        corrected = numpy_helper.to_array(inits[node.input[0]]).reshape(-1)
        bias = conv.input[2] if len(conv.input) > 2 and conv.input[2] else None
        if bias is not None and bias not in old_inits:
            continue
        old = numpy_helper.to_array(old_inits[bias]) if bias is not None else None
        if old is not None and old.size not in (1, corrected.size):
            continue
        value = np.zeros_like(corrected) if old is None else np.broadcast_to(old.reshape(-1), corrected.shape)
        if not np.array_equal(value, corrected):
            node.attribute.append(helper.make_attribute("float_bias", value.astype(np.float32).tolist()))
