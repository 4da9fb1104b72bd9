"""sensitivity_analysis: the sensitive nodes quantized alone, and un-quantized cumulatively.

Sensitive nodes are the ordinary nodes whose sensitivity (output cosine with only
that node quantized) is below ``pick_threshold``, most sensitive first, unless
``sensitive_nodes`` names them. The chart shows, per node, the output cosine of
the model with only that node quantized (green x) and of the calibrated model with
that node and every node before it in the list left float (red line; the first
point, "none", is the calibrated model itself), against the float baseline of 1.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import onnx

from hbtools.debug import options, plots
from hbtools.debug.data import Sample, load_samples
from hbtools.debug.evaluate import scores
from hbtools.debug.model import CalibratedModel, load_calibrated
from hbtools.debug.sensitivity import measure
from hbtools.debug.switchboard import shared_switchboard
from hbtools.errors import HbError

log = logging.getLogger("hbtools")
METRIC = "cosine-similarity"


def sensitivity_analysis(model_or_file: str | onnx.ModelProto | None = None, calibrated_data: object = None,
                         pick_threshold: float = 0.999, data_num: int | None = 1,
                         sensitive_nodes: str | Sequence[str] | None = None,
                         save_dir: str | Path | None = None) -> dict[str, dict[str, float]]:
    """Chart in ``save_dir``; returns ``{"single": {node: cosine}, "partial": {"none" | node: cosine}}``."""
    cm = load_calibrated(model_or_file)
    threshold = options.cosine_threshold(pick_threshold, "pick_threshold")
    given = options.names(sensitive_nodes, "sensitive_nodes")
    if given == []:
        raise HbError("sensitive_nodes is an empty list: give the nodes to analyse, or leave it out to pick those "
                      "below pick_threshold")
    if given is not None:
        cm.check(given, "sensitive_nodes")
    samples = load_samples(calibrated_data, cm, data_num)
    result, _ = analyse(cm, samples, threshold, given, plots.output_dir(save_dir))
    return result


def analyse(cm: CalibratedModel, samples: Sequence[Sample], pick_threshold: float, given: list[str] | None,
            folder: Path, known: dict[str, float] | None = None) -> tuple[dict[str, dict[str, float]], Path]:
    """``known`` may hold node sensitivities (output cosine) already measured on ``samples``."""
    if given is None:
        if known is None:
            known = {n: v[METRIC] for n, v in measure(cm, samples, [METRIC], "node").rows}
        picked = [n for n, v in sorted(known.items(), key=lambda kv: kv[1]) if v < pick_threshold]
        if not picked:
            log.warning("sensitivity_analysis: no node has an output cosine below pick_threshold %s", pick_threshold)
    else:
        picked = given
    everything = frozenset(cm.calibration)
    single = [frozenset(cm.switches_of(n)) for n in picked]
    partial = [everything - frozenset().union(*(cm.switches_of(n) for n in picked[:k]))
               for k in range(len(picked) + 1)]
    values = scores(shared_switchboard(cm), samples, [*single, *partial], [METRIC], "sensitivity analysis")
    result = {"single": {n: v[METRIC] for n, v in zip(picked, values[:len(picked)], strict=True)},
              "partial": {label: v[METRIC] for label, v in zip(["none", *picked], values[len(picked):],
                                                                strict=True)}}
    return result, _chart(result, folder)


def _chart(result: dict[str, dict[str, float]], folder: Path) -> Path:
    labels = list(result["partial"])
    fig, (ax,) = plots.figure(max(8.0, len(labels) * 0.35), 6.0, bottom=0.3)
    x = range(len(labels))
    ax.axhline(1.0, color="blue", linestyle="--", linewidth=1.0, label="baseline (float model)")
    # Markers: with no node picked the line is the one point of the whole quantized model.
    ax.plot(x, list(result["partial"].values()), color="red", linewidth=1.5, marker="o", markersize=4,
            label="this and earlier nodes not quantized")
    ax.plot(range(1, len(labels)), list(result["single"].values()), "gx", markersize=8,
            label="only this node quantized")
    ax.set_xticks(list(x))
    ax.set_xticklabels(labels, rotation=90, fontsize=7)
    ax.set_ylabel("output cosine similarity")
    ax.ticklabel_format(axis="y", useOffset=False)
    plots.title(ax, "sensitivity analysis", "output cosine similarity against the float model")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return plots.save(fig, folder / "sensitivity_analysis.png")
