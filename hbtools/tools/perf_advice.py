"""``compiler_parameters.advice``: the BPU layers whose modelled time exceeds their ideal by more than N µs.

The ideal is the layer's multiply-accumulates at the march's sustained int8 rate (peak
times the calibrated MAC efficiency, hbtools.tools.perf_model.COSTS). What the
cost model adds on top (hbtools.tools.perf_model) comes from the MAC array's channel
blocks: channels padded up to a block, depthwise convolutions using a fraction of
the array, int16 operands taking two passes. Each line names the layer, both times,
the output shape before and after channel alignment and the padding share.
"""

from __future__ import annotations

import math

from onnx import NodeProto

from hbtools.march.profiles import MarchProfile
from hbtools.ops.base import attrs_of
from hbtools.runtime.runtime_model import RuntimeModel
from hbtools.runtime.structure import TensorInfo, tensor_info
from hbtools.tools import perf_model


def _aligned(channels: int) -> int:
    return math.ceil(channels / perf_model.CHANNEL_BLOCK) * perf_model.CHANNEL_BLOCK


def _shape_text(shape: tuple) -> str:
    return "(" + ",".join(str(d) for d in shape) + ")"


def _why(node: NodeProto, info: dict[str, TensorInfo]) -> str:
    """Output shape before/after channel alignment, padding share, and other reasons for the gap
    (the channel counts are read as perf_model reads them)."""
    a = attrs_of(node)
    int16 = "; int16 operand: two passes" if 16 in (a.get("x_bits"), a.get("a_bits"), a.get("b_bits")) else ""
    w = info.get(node.input[1]) if len(node.input) > 1 else None
    if node.op_type != "HzSQuantizedConv" or w is None or not w.shape or len(w.shape) < 2 \
            or any(d is None for d in w.shape):
        return "matmul of two activations" + int16 if node.op_type == "HzSQuantizedMatMul" else "shape unknown"
    group = a.get("group", 1) if isinstance(a.get("group", 1), int) and a.get("group", 1) > 0 else 1
    if a.get("kind") == "MatMul":
        cin, cout = w.shape[0], w.shape[-1]
    elif a.get("kind") == "ConvTranspose":
        cin, cout = w.shape[0] // group, w.shape[1]
    else:
        cout, cin = w.shape[0] // group, w.shape[1]
    if cin == 1 and cout == 1:
        return f"depthwise: {perf_model.DEPTHWISE_EFFICIENCY:.3g} of the MAC array busy" + int16
    parts = []
    out = info.get(node.output[0])
    if out is not None and out.shape and len(out.shape) == 4 and None not in out.shape:
        aligned = (*out.shape[:1], _aligned(out.shape[1]), *out.shape[2:])
        parts.append(f"output shape {_shape_text(out.shape)} aligned to {_shape_text(aligned)}")
    padding = 1.0 - (cin * cout) / (_aligned(cin) * _aligned(cout))
    parts.append(f"channels in {cin} -> {_aligned(cin)}, out {cout} -> {_aligned(cout)}: "
                 f"{100 * padding:.1f} % of the MAC array is padding")
    return "; ".join(parts) + int16


def advice_lines(rm: RuntimeModel, profile: MarchProfile, threshold_us: float) -> list[str]:
    """One line per BPU MAC layer whose modelled compute exceeds the ideal by more than ``threshold_us``."""
    cost = perf_model.estimate(rm, profile)
    info = tensor_info(rm.graph)
    nodes = {n.name: n for n in rm.graph.graph.node}
    peak = profile.peak_int8_tops * 1e12 * cost.core_num * perf_model.constants_for(profile.name).mac_efficiency
    lines = []
    for sub in cost.subgraphs:
        for layer in sub.layers:
            if layer.macs <= 0 or layer.name not in nodes:
                continue
            ideal_us = 2e6 * layer.macs / peak
            extra = layer.compute_ms * 1e3 - ideal_us
            if extra > threshold_us:
                lines.append(f"advice: {layer.name} ({layer.op_type}, {sub.name}) compute "
                             f"{layer.compute_ms * 1e3:.2f} us against {ideal_us:.2f} us at full MAC use "
                             f"(+{extra:.2f} us); "
                             f"{_why(nodes[layer.name], info)}")
    return lines
