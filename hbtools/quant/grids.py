"""Integer grids of activation tensors: per tensor or per channel, symmetric or asymmetric.

A calibration method yields a magnitude threshold ``T`` per tensor (or per
channel). The grid follows from it:
- symmetric (default): ``s = T / qmax``, levels ``-qmax..qmax``, no zero point;
- asymmetric (``optimization: asymmetric``, int8 only): the observed range clipped
  to ``[-T, T]`` and widened to contain 0, ``[lo, hi]``, mapped onto -128..127:
  ``s = (hi - lo) / 255``, ``z = round(-128 - lo / s)``. A non-negative tensor
  (after Relu, Sigmoid, …) gets ``z = -128`` and twice the symmetric resolution.
  Per-channel grids share one zero point (integer kernels take a scalar one), so
  they are asymmetric only when every channel is non-negative (``z = -128``);
  otherwise they stay symmetric per channel.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hbtools.ops.calibration import grid_bounds, qmax_for, scales_for

ASYMMETRIC_BITS = 8  # int16 grids are fine enough; their kernels have no zero-point form


@dataclass
class Grid:
    thresholds: np.ndarray  # largest magnitude covered, per channel (or one)
    scales: np.ndarray  # float32
    zero_points: np.ndarray | None = None  # int, one per scale; None for a symmetric grid


def activation_grid(threshold: float | np.ndarray, bits: int, *, asymmetric: bool = False,
                    low: float | np.ndarray | None = None, high: float | np.ndarray | None = None) -> Grid:
    """The grid of a tensor with method threshold(s) ``threshold`` and observed range [low, high]."""
    t = np.atleast_1d(np.asarray(threshold, dtype=np.float64))
    if not asymmetric or bits != ASYMMETRIC_BITS:
        return Grid(t, scales_for(t, bits))
    low = -t if low is None else np.atleast_1d(np.asarray(low, dtype=np.float64))
    high = t if high is None else np.atleast_1d(np.asarray(high, dtype=np.float64))
    lo = np.minimum(0.0, np.maximum(low, -t))
    hi = np.maximum(0.0, np.minimum(high, t))
    if t.size > 1 and (lo < 0).any():
        return Grid(t, scales_for(t, bits))  # per channel with a signed channel: one zero point cannot fit
    qmin, qmax = grid_bounds(bits, True)
    span = hi - lo
    scales = (np.where(span > 0, span, 1.0) / (qmax - qmin)).astype(np.float32)
    zero_points = np.clip(np.round(qmin - lo / scales.astype(np.float64)), qmin, qmax).astype(np.int64)
    return Grid(np.maximum(-lo, hi), scales, zero_points)


def fed_values(node_name: str, grid: Grid, bits: int, node_has_zero_points: bool) -> dict[str, np.ndarray]:
    """Graph-input values of a HzCalibration lowered with ``feed_calibration`` (per-tensor grids)."""
    feeds = {f"{node_name}_scale": grid.scales.reshape([]),
             f"{node_name}_qmax": np.array(qmax_for(bits), dtype=np.float32)}
    if node_has_zero_points:
        zp = grid.zero_points if grid.zero_points is not None else np.zeros(1)
        qmin, _ = grid_bounds(bits, grid.zero_points is not None)
        feeds[f"{node_name}_zero_point"] = np.asarray(zp, dtype=np.float32).reshape([])
        feeds[f"{node_name}_qmin"] = np.array(qmin, dtype=np.float32)
    return feeds
