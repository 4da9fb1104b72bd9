"""get_channelwise_data_distribution: box plot of a calibration node's input per channel.

For each channel: the box spans the quartiles, the red line is the median, the blue
dashed line the mean, whiskers reach 1.5 IQR and points beyond are outliers (at most
``MAX_OUTLIERS`` drawn per channel, always including the extremes). The channel axis
is ``axis``; by default the node's own axis for a weight and 1 for an activation.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx

from hbtools.debug import options, plots
from hbtools.debug.data import PLOT_SAMPLES, Sample, load_samples
from hbtools.debug.evaluate import tensor_values
from hbtools.debug.model import KINDS, CalibratedModel, CalibrationNode, load_calibrated
from hbtools.debug.switchboard import shared_switchboard
from hbtools.errors import HbError
from hbtools.outputs import file_names
from hbtools.quant import grids

MAX_OUTLIERS = 50


def get_channelwise_data_distribution(save_dir: str | Path | None = None,
                                      model_or_file: str | onnx.ModelProto | None = None,
                                      calibrated_data: object = None, nodes_list: str | Sequence[str] | None = None,
                                      axis: int | None = None) -> dict[str, Path]:
    """One box-plot PNG per calibration node in ``save_dir``; returns ``{node: path}``."""
    cm = load_calibrated(model_or_file)
    nodes = options.names(nodes_list, "nodes_list")
    if not nodes:
        raise HbError("nodes_list is required: the calibration nodes whose input to plot per channel")
    cm.check(nodes, "nodes_list", allowed=KINDS)
    axis = options.integer_or_none(axis, "axis")
    samples = load_samples(calibrated_data, cm, at_most=PLOT_SAMPLES)
    return channel_boxes(cm, samples, nodes, axis, plots.output_dir(save_dir))


def channel_boxes(cm: CalibratedModel, samples: Sequence[Sample], nodes: list[str], axis: int | None,
                  folder: Path) -> dict[str, Path]:
    tensors = [cm.calibration[n].input for n in nodes if cm.calibration[n].input not in cm.constants]
    quants: dict[str, list[np.ndarray]] = {}
    if tensors:
        _, quants = tensor_values(shared_switchboard(cm, tensors), samples, frozenset(cm.calibration))
    files = file_names(nodes, suffix="_channelwise.png", fallback="node")
    out = {}
    for name in nodes:
        c = cm.calibration[name]
        if c.input in cm.constants:
            data, one = cm.constants[c.input], cm.constants[c.input].shape
        else:  # the samples one after another along the first axis; a message shows one sample's shape
            data, one = np.concatenate(quants[c.input], axis=0), quants[c.input][0].shape
        channels, ax_ = channel_rows(c, data, axis, name, one)
        out[name] = _plot(name, channels, ax_, c.threshold, folder / files[name])
    return out


def channel_rows(c: CalibrationNode, data: np.ndarray, axis: int | None, name: str,
                 shape: tuple[int, ...] | None = None) -> tuple[np.ndarray, int]:
    """The values of ``data`` (what calibration node ``c`` reads) as one row per channel, and the axis
    (``shape``: the tensor's own, which messages show; ``data``'s by default).

    Without an ``axis``: a weight's output channels (a grouped ConvTranspose's spread over its first two
    axes, one row per output channel of the layer), an activation's axis 1.
    """
    if axis is not None:
        ax_ = axis
    else:
        ax_ = (c.axis if c.axis >= 0 else 0) if c.kind == "weight" else 1
    if not -data.ndim <= ax_ < data.ndim:
        raise HbError(f"axis {ax_} is out of range for {name}: its input has {data.ndim} dimensions "
                      f"{list(data.shape if shape is None else shape)}; choose 0 to {data.ndim - 1}")
    values = np.asarray(data, dtype=np.float64)
    if axis is None and c.kind == "weight" and c.groups > 1:
        return grids.output_channel_rows(values, ax_, c.groups), ax_
    return np.moveaxis(values, ax_, 0).reshape(data.shape[ax_], -1), ax_


def _plot(name: str, channels: np.ndarray, axis: int, threshold: float, path: Path) -> Path:
    count = channels.shape[0]
    fig, (ax,) = plots.figure(min(max(8.0, count * 0.12), 24.0), 6.0)
    ax.bxp([_box(c) for c in channels], showmeans=True, meanline=True, showfliers=True,
           medianprops={"color": "red", "linewidth": 1.2},
           meanprops={"color": "blue", "linestyle": "--", "linewidth": 1.0},
           flierprops={"marker": ".", "markersize": 2, "alpha": 0.6})
    for y in (-threshold, threshold):
        ax.axhline(y, color="gray", linestyle=":", linewidth=0.8)
    step = max(1, count // 32)
    ax.set_xticks(range(1, count + 1, step))
    ax.set_xticklabels([str(i) for i in range(0, count, step)], fontsize=7)
    ax.set_xlabel(f"channel (axis {axis}), {count} channels")
    ax.set_ylabel("value")
    plots.title(ax, name, "per-channel distribution (red: median, blue dashed: mean)")
    return plots.save(fig, path)


def _box(values: np.ndarray) -> dict:
    q1, med, q3 = np.percentile(values, [25, 50, 75])
    iqr = q3 - q1
    inside = values[(values >= q1 - 1.5 * iqr) & (values <= q3 + 1.5 * iqr)]
    low, high = (inside.min(), inside.max()) if inside.size else (q1, q3)
    fliers = values[(values < low) | (values > high)]
    if fliers.size > MAX_OUTLIERS:
        # Thin the outliers for drawing but keep the extremes, which are what the plot is read for.
        keep = np.random.default_rng(0).choice(fliers, MAX_OUTLIERS - 2, replace=False)
        fliers = np.concatenate([keep, [fliers.min(), fliers.max()]])
    return {"med": med, "q1": q1, "q3": q3, "whislo": low, "whishi": high, "mean": float(values.mean()),
            "fliers": fliers}
