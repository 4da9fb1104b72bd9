"""plot_acc_error: error of every node's output along the graph for partly quantized models.

Each curve is one partly quantized model: ``quantize_node`` quantizes only the given
nodes (a name: that node alone; a list: those nodes together; ``'weight'`` /
``'activation'``: every calibration node of that kind), ``non_quantize_node``
quantizes everything except them. The y value at a node is the metric between its
output in that model and in the float model; ``average_mode`` plots the running
mean from the model input instead.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto

from hbtools.debug import options, plots
from hbtools.debug.data import PLOT_SAMPLES, Sample, load_samples
from hbtools.debug.evaluate import Config, sweep
from hbtools.debug.model import KINDS, CalibratedModel, load_calibrated
from hbtools.debug.switchboard import shared_switchboard
from hbtools.errors import HbError
from hbtools.metrics import METRICS, average, running_average

log = logging.getLogger("hbtools")

Groups = str | Sequence[str | Sequence[str]] | None


@dataclass
class Curve:
    label: str
    config: Config


def plot_acc_error(save_dir: str | Path | None = None, calibrated_data: object = None,
                   model_or_file: str | onnx.ModelProto | None = None, quantize_node: Groups = None,
                   non_quantize_node: Groups = None, metric: str = "cosine-similarity",
                   average_mode: bool = False) -> dict[str, dict[str, float]]:
    """Plot the accumulated-error curves; returns ``{curve: {node: value}}`` in graph order."""
    cm = load_calibrated(model_or_file)
    metric = options.one_metric(metric, "metric")
    curves = curves_for(cm, options.groups(quantize_node, "quantize_node"),
                        options.groups(non_quantize_node, "non_quantize_node"))
    samples = load_samples(calibrated_data, cm, at_most=PLOT_SAMPLES)
    values, _ = accumulate(cm, samples, curves, metric, bool(average_mode), plots.output_dir(save_dir),
                           curve_mode(quantize_node, non_quantize_node))
    return values


def curves_for(cm: CalibratedModel, quantize: list | None, non_quantize: list | None) -> list[Curve]:
    if quantize is None and non_quantize is None:
        raise HbError("plot_acc_error needs quantize_node or non_quantize_node, e.g. quantize_node=['weight', "
                      "'activation'] or non_quantize_node=[['Conv_2'], ['Conv_2', 'Conv_90']]")
    everything = frozenset(cm.calibration)
    curves: list[Curve] = []
    both = quantize is not None and non_quantize is not None
    for param, items, keep in (("quantize_node", quantize, True), ("non_quantize_node", non_quantize, False)):
        for k, item in enumerate(items or []):
            names = [item] if isinstance(item, str) else item
            cm.check([n for n in names if n not in KINDS], param)
            switches = frozenset().union(*(cm.switches_of_group(n) for n in names))
            label = item if isinstance(item, str) else f"partial_qmodel_{k}"
            if both:
                label = f"{'quantize' if keep else 'non_quantize'} {label}"
            curves.append(Curve(label, switches if keep else everything - switches))
    return curves


def accumulate(cm: CalibratedModel, samples: Sequence[Sample], curves: list[Curve], metric: str,
               average_mode: bool, folder: Path, mode: str) -> tuple[dict[str, dict[str, float]], Path]:
    nodes = _traced_nodes(cm)
    switchboard = shared_switchboard(cm, [cm.nodes[cm.standing_for(n)].output[0] for n in nodes])
    per_sample = np.zeros((len(curves), len(samples), len(nodes)))
    # per sample and node, whether the float output is finite: a metric against NaN would void the node's mean
    finite = np.ones((len(samples), len(nodes)), bool)
    checked = np.zeros(len(samples), bool)  # the float outputs are the same for every curve: checked once

    def visit(index: int, k: int, reference: list[np.ndarray], got: list[np.ndarray]) -> None:
        if not checked[index]:
            finite[index] = [bool(np.all(np.isfinite(r))) for r in reference]
            checked[index] = True
        per_sample[k, index] = [METRICS[metric](r, g) if ok else np.nan
                                for r, g, ok in zip(reference, got, finite[index], strict=True)]

    sweep(switchboard, samples, [c.config for c in curves], visit, "accumulated error")
    unscored = [i + 1 for i in range(len(samples)) if not finite[i].all()]
    if unscored:
        log.warning("the float model's outputs of some nodes are NaN or infinite on sample(s) %s of calibrated_data: "
                    "those samples are left out of those nodes' points", ", ".join(map(str, unscored)))
    values = np.stack([average(metric, per_sample[:, finite[:, j], j], axis=1) if finite[:, j].any()
                       else np.full(len(curves), np.nan) for j in range(len(nodes))], axis=1)
    if average_mode:
        values = running_average(metric, values)
    fig, (ax,) = plots.figure(max(10.0, len(nodes) * 0.08), 6.0, bottom=0.3)
    for curve, row in zip(curves, values, strict=True):
        ax.plot(range(len(nodes)), row, label=curve.label, linewidth=1.2)
    ax.set_ylabel(f"{metric}{' (running mean)' if average_mode else ''}")
    ax.ticklabel_format(axis="y", useOffset=False)
    plots.title(ax, f"accumulated error, {mode.replace('_', ' ')}", f"{metric} of every node's output against the "
                "float model")
    plots.node_ticks(ax, nodes)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    name = f"accumulate_error_{mode}_{metric}{'_average' if average_mode else ''}.png"
    path = plots.save(fig, folder / name)
    per_curve = {c.label: dict(zip(nodes, map(float, row), strict=True)) for c, row in zip(curves, values, strict=True)}
    return per_curve, path


def _traced_nodes(cm: CalibratedModel) -> list[str]:
    """User nodes with a float first output, in graph order (the curve's x axis)."""
    types = cm.tensor_types
    outputs = {user: cm.nodes[cm.standing_for(user)].output for user in cm.members}
    return [user for user, out in outputs.items() if out and types.get(out[0], TensorProto.FLOAT) == TensorProto.FLOAT]


def curve_mode(quantize_node: Groups, non_quantize_node: Groups) -> str:
    if quantize_node is not None and non_quantize_node is not None:
        return "quantize_and_non_quantize"
    return "quantize" if quantize_node is not None else "non_quantize"
