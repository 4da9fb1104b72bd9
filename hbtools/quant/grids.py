"""The one module of grid maths: scales, integer levels, dequantization, requantization.

Everything that turns a threshold into a scale, a float into integer levels or
levels back into floats calls this module: the HzCalibration reference and
lowering, the quantize stage, GPTQ, bias correction, the layer dump, the report
and the simulator. One rounding rule holds everywhere: round half to even.

A calibration method yields a magnitude threshold ``T`` per tensor (or per
channel). The grid follows from it:
- symmetric (default): ``s = T / qmax`` in float32, levels ``-qmax..qmax``, no zero point;
- asymmetric (``optimization: asymmetric``, int8 only): the observed range clipped
  to ``[-T, T]`` and widened to contain 0, ``[lo, hi]``, mapped onto -128..127:
  ``s = (hi - lo) / 255``, ``z = round(-128 - lo / s)``. A non-negative tensor
  (after Relu, Sigmoid, …) gets ``z = -128`` and twice the symmetric resolution.
  Per-channel grids share one zero point (integer kernels take a scalar one), so
  they are asymmetric only when every channel is non-negative (``z = -128``);
  otherwise they stay symmetric per channel.

Scales are float32 values wherever they are stored (node attributes): every user
reads the stored float32 scale, never re-derives it from the threshold in another
precision. Quantization divides in float32, as the fake-quant lowering does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hbtools.ops.names import fed_input

ASYMMETRIC_BITS = 8  # int16 grids are fine enough; their kernels have no zero-point form
WEIGHT_BITS = 8
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


def qmax_for(bits: int) -> int:
    """Largest level of a symmetric grid: 127 for int8, 32767 for int16."""
    return (1 << (bits - 1)) - 1


def grid_bounds(bits: int, asymmetric: bool = False) -> tuple[int, int]:
    """Integer range of a grid: symmetric ±qmax, asymmetric the whole signed range."""
    qmax = qmax_for(bits)
    return (-qmax - 1 if asymmetric else -qmax), qmax


# Smallest step kept: below float32's normal range a step rounds to a subnormal or to 0.
SMALLEST_STEP = float(np.finfo(np.float32).tiny)


def scales_for(thresholds: float | np.ndarray, bits: int) -> np.ndarray:
    """float32 step of a symmetric grid per threshold (a zero threshold gets step 1/qmax)."""
    t = np.atleast_1d(np.asarray(thresholds, dtype=np.float64))
    qmax = qmax_for(bits)
    # An all-zero tensor or channel would divide by zero, and so would one of values so small
    # (subnormal float32 weights in a dead channel) that their step underflows float32: any
    # scale represents such values, as 0.
    t = np.where(t / qmax >= SMALLEST_STEP, t, 1.0)
    return (t / qmax).astype(np.float32)


def along_axis(values: Sequence[float] | np.ndarray, axis: int | None, rank: int | None,
               dtype: type = np.float32) -> np.ndarray:
    """``values`` shaped to broadcast along ``axis`` of a rank-``rank`` tensor.

    One value gives a scalar. A negative axis counts from the end and needs no rank.
    """
    v = np.asarray(values, dtype=dtype).reshape(-1)
    if v.size == 1 or axis is None:
        return v.reshape([]) if v.size == 1 else v
    if axis < 0:
        return v.reshape([-1] + [1] * (-axis - 1))
    if rank is None:
        raise ValueError(f"values along axis {axis} need the tensor's rank")
    shape = [1] * rank
    shape[axis] = v.size
    return v.reshape(shape)


def quantize(x: np.ndarray, scale: np.ndarray | float, bits: int, *, zero_point: np.ndarray | float = 0,
             asymmetric: bool = False, offsets: np.ndarray | None = None) -> np.ndarray:
    """Integer levels ``clip(round(x / s) + offsets + z, qmin, qmax)`` as float32 values.

    Divides in float32 (as the fake-quant lowering and HzQuantize do); ``scale`` and
    ``zero_point`` must already broadcast against ``x`` (see ``along_axis``).
    """
    # A value far beyond a tiny step overflows to inf, which the clip below saturates as intended.
    with np.errstate(over="ignore"):
        levels = np.asarray(x, dtype=np.float32) / np.asarray(scale, dtype=np.float32)
    # Rounded and clipped in place where ``levels`` is an array of its own (a weight can be 400 MB).
    own = levels if isinstance(levels, np.ndarray) else None
    levels = np.round(levels, out=own)
    if offsets is not None:
        levels = levels + np.asarray(offsets, dtype=np.float32)
    if np.any(zero_point):
        levels = levels + np.asarray(zero_point, dtype=np.float32)
    lo, hi = grid_bounds(bits, asymmetric)
    return np.clip(levels, np.float32(lo), np.float32(hi), out=levels if own is not None else None)


def dequantize(q: np.ndarray, scale: np.ndarray | float, zero_point: np.ndarray | float = 0) -> np.ndarray:
    """``(q - z) * s`` in float64 (exact for every int32 level times a float32 scale)."""
    levels = np.asarray(q, dtype=np.float64)
    if np.any(zero_point):
        levels = levels - np.asarray(zero_point, dtype=np.float64)
    return levels * np.asarray(scale, dtype=np.float64)


def fake_quantize(x: np.ndarray, scale: np.ndarray | float, bits: int, *, zero_point: np.ndarray | float = 0,
                  asymmetric: bool = False, offsets: np.ndarray | None = None) -> np.ndarray:
    """``dequantize(quantize(x))`` in float32, exactly as the HzCalibration lowering computes it."""
    q = quantize(x, scale, bits, zero_point=zero_point, asymmetric=asymmetric, offsets=offsets)
    if np.any(zero_point):
        q = q - np.asarray(zero_point, dtype=np.float32)
    return (q * np.asarray(scale, dtype=np.float32)).astype(np.float32)


def requantize(acc: np.ndarray, multiplier: np.ndarray | float, out_min: float, out_max: float,
               zero_point: int = 0, *, single: bool = False) -> np.ndarray:
    """``clip(round(acc * m) + z, out_min, out_max)``: the integer ops' output rule.

    The product is float64, or with ``single`` float32 as onnxruntime's integer conv
    kernels requantize (MLAS: the int32 sum converted to float32, times the float32
    multiplier, rounded half to even). Returned as float64 whole numbers.
    """
    dtype = np.float32 if single else np.float64
    scaled = np.asarray(acc, dtype=np.float64).astype(dtype)
    m = np.asarray(multiplier, dtype=np.float64).astype(dtype)
    if m.size > 1 or float(m.reshape(-1)[0]) != 1.0:
        scaled = scaled * m
    rounded = np.round(scaled).astype(np.float64)
    if zero_point:
        rounded = rounded + np.float64(zero_point)
    return np.minimum(np.maximum(rounded, np.float64(out_min)), np.float64(out_max))


def add_f32(a_levels: np.ndarray, b_levels: np.ndarray, a_multiplier: float, b_multiplier: float) -> np.ndarray:
    """``float32(float32(a * ma) + float32(b * mb))`` as float64: an integer add's float32 rule.

    The levels (int8/int16, zero points removed) are exact in float32, the multipliers are taken as
    float32, and each product and the sum round once, as onnxruntime's float32 Mul and Add do.
    """
    a = np.asarray(a_levels, dtype=np.float64).astype(np.float32) * np.float32(a_multiplier)
    b = np.asarray(b_levels, dtype=np.float64).astype(np.float32) * np.float32(b_multiplier)
    return (a + b).astype(np.float64)


def multiplier(numerator: np.ndarray | float, denominator: np.ndarray | float) -> list[float]:
    """Requantization multipliers: one scale over another (float64), per channel where either is."""
    ratio = np.asarray(numerator, dtype=np.float64) / np.asarray(denominator, dtype=np.float64)
    return [float(v) for v in np.atleast_1d(ratio)]


def bias_levels(bias: np.ndarray, accumulator_scale: np.ndarray) -> np.ndarray:
    """int32 levels of a conv bias on its accumulator grid (input scale × weight scale)."""
    step = np.asarray(accumulator_scale, dtype=np.float64)
    return np.clip(np.round(np.asarray(bias, dtype=np.float64) / step), INT32_MIN, INT32_MAX)


def input_scale_array(shape: tuple[int, ...] | list[int], input_scales, input_axis: int,
                      group: int = 1) -> np.ndarray:
    """Per-element input-channel scales of a weight of ``shape`` (float32, broadcastable to it).

    A grouped Conv weight ``[O, C/group, k...]`` reads input channel
    ``(o // (O/group)) * C/group + j`` at ``[o, j]``; other weights have the input
    channels along ``input_axis``.
    """
    u = np.asarray(input_scales, dtype=np.float32)
    rank = len(shape)
    if group > 1 and input_axis == 1:
        out, per_group = shape[0], shape[1]
        table = u.reshape(group, per_group)[np.arange(out) // (out // group)]  # [O, C/group]
        return table.reshape(out, per_group, *[1] * (rank - 2))
    bshape = [1] * rank
    bshape[input_axis] = -1
    return u.reshape(bshape)


def output_scale_array(shape: tuple[int, ...] | list[int], values, axis: int, groups: int = 1) -> np.ndarray:
    """Per-output-channel ``values`` (float32) laid out to broadcast against a weight of ``shape``.

    A grouped ConvTranspose weight ``[C, O/groups, k...]`` holds output channel
    ``(c // (C/groups)) * O/groups + j`` at ``[c, j]``: its axis 1 lists only ``O/groups`` of the
    ``O`` channels, so their values are spread over both axes. Other weights have the output
    channels along ``axis``.
    """
    v = np.asarray(values, dtype=np.float32).reshape(-1)
    rank = len(shape)
    if groups > 1 and v.size > 1:
        cin, per_group = shape[0], shape[1]
        table = v.reshape(groups, per_group)[np.arange(cin) // (cin // groups)]  # [C, O/groups]
        return table.reshape(cin, per_group, *[1] * (rank - 2))
    return along_axis(v, axis if v.size > 1 else None, rank)


def output_channel_rows(w: np.ndarray, axis: int, groups: int = 1) -> np.ndarray:
    """A weight as one row per output channel: ``[O, everything an output channel reads]``
    (a grouped ConvTranspose's as ``output_scale_array`` lays its channels out)."""
    w = np.asarray(w)
    if groups > 1:
        cin, per_group = w.shape[0], w.shape[1]
        blocks = w.reshape(groups, cin // groups, per_group, -1).transpose(0, 2, 1, 3)
        return blocks.reshape(groups * per_group, -1)
    return np.moveaxis(w, axis, 0).reshape(w.shape[axis], -1)


def weight_levels(w: np.ndarray, scales: np.ndarray, axis: int, *, input_scales: np.ndarray | None = None,
                  offsets: np.ndarray | None = None) -> np.ndarray:
    """int8 levels of a weight per output channel along ``axis`` (float32 values).

    ``input_scales`` (broadcastable to ``w``) are per-channel input scales folded
    into the weight; ``offsets`` GPTQ's choices away from nearest rounding.
    """
    w = np.asarray(w, dtype=np.float32)
    if input_scales is not None:
        w = w * np.asarray(input_scales, dtype=np.float32)
    s = along_axis(scales, axis if np.size(scales) > 1 else None, w.ndim)
    return quantize(w, s, WEIGHT_BITS, offsets=offsets)


@dataclass
class Grid:
    thresholds: np.ndarray  # largest magnitude covered, per channel (or one)
    scales: np.ndarray  # float32
    zero_points: np.ndarray | None = None  # int, one per scale; None for a symmetric grid


def whole_steps(scales: np.ndarray) -> np.ndarray:
    """The step of a grid for whole numbers, from the one fitted to their range: 1 where that step is at most 1
    (each integer then has its own level, exact in float32; a finer step holds no other value such a tensor
    takes). A coarser fitted step stays: a whole one beyond it would only be coarser still."""
    return np.where(scales <= 1.0, np.float32(1.0), scales).astype(np.float32)


def activation_grid(threshold: float | np.ndarray, bits: int, *, asymmetric: bool = False,
                    low: float | np.ndarray | None = None, high: float | np.ndarray | None = None,
                    whole: bool = False) -> Grid:
    """The grid of a tensor with method threshold(s) ``threshold`` and observed range [low, high]; ``whole``: the
    tensor holds whole numbers only, and its step is a whole number (``whole_steps``)."""
    t = np.atleast_1d(np.asarray(threshold, dtype=np.float64))
    if not asymmetric or bits != ASYMMETRIC_BITS:
        scales = scales_for(t, bits)
        if whole:
            scales = whole_steps(scales)
            t = scales.astype(np.float64) * qmax_for(bits)
        return Grid(t, scales)
    low = -t if low is None else np.atleast_1d(np.asarray(low, dtype=np.float64))
    high = t if high is None else np.atleast_1d(np.asarray(high, dtype=np.float64))
    lo = np.minimum(0.0, np.maximum(low, -t))
    hi = np.maximum(0.0, np.minimum(high, t))
    if t.size > 1 and (lo < 0).any():
        return activation_grid(t, bits, whole=whole)  # per channel with a signed channel: one zero point cannot fit
    qmin, qmax = grid_bounds(bits, True)
    span = hi - lo
    scales = (np.where(span / (qmax - qmin) >= SMALLEST_STEP, span, 1.0) / (qmax - qmin)).astype(np.float32)
    if whole:
        scales = whole_steps(scales)
    zero_points = np.clip(np.round(qmin - lo / scales.astype(np.float64)), qmin, qmax).astype(np.int64)
    return Grid(np.maximum(-lo, hi), scales, zero_points)


def fed_values(node_name: str, grid: Grid, bits: int, node_has_zero_points: bool) -> dict[str, np.ndarray]:
    """Graph-input values of a HzCalibration lowered with ``feed_calibration`` (per-tensor grids)."""
    feeds = {fed_input(node_name, "scale"): grid.scales.reshape([]),
             fed_input(node_name, "qmax"): np.array(qmax_for(bits), dtype=np.float32)}
    if node_has_zero_points:
        zp = grid.zero_points if grid.zero_points is not None else np.zeros(1)
        qmin, _ = grid_bounds(bits, grid.zero_points is not None)
        feeds[fed_input(node_name, "zero_point")] = np.asarray(zp, dtype=np.float32).reshape([])
        feeds[fed_input(node_name, "qmin")] = np.array(qmin, dtype=np.float32)
    return feeds
