"""runall: every analysis in one go, all results under ``save_dir``.

With the defaults:
1. sensitivity of the weight calibration nodes and 2. of the activation calibration
   nodes (tables printed with ``verbose``, written as .txt and .csv);
3. data distribution of the 5 most sensitive of each kind;
4. their per-channel box plots;
5. accumulated error with only weights / only activations quantized;
6. sensitivity analysis of the ordinary nodes below ``pick_threshold``.
With ``node_type='node'`` step 1 ranks ordinary nodes and steps 3-4 use the
calibration nodes feeding the 5 most sensitive. Explicit node lists replace the
automatic choices of their step.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import onnx

from hbtools.debug import options, plots
from hbtools.debug.accumulate import Groups, accumulate, curve_mode, curves_for
from hbtools.debug.analysis import METRIC, analyse
from hbtools.debug.channelwise import channel_boxes
from hbtools.debug.data import PLOT_SAMPLES, load_samples
from hbtools.debug.distribution import distributions
from hbtools.debug.model import KINDS, CalibratedModel, load_calibrated
from hbtools.debug.sensitivity import Sensitivity, measure
from hbtools.runs.transaction import Destination, artefact_transaction

TOP = 5


def runall(model_or_file: str | onnx.ModelProto | None = None, calibrated_data: object = None,
           save_dir: str | Path | None = None, ns_metrics: str | Sequence[str] = "cosine-similarity",
           output_node: str | None = None, node_type: str | None = None, data_num: int | None = None,
           verbose: bool = False, interested_nodes: str | Sequence[str] | None = None,
           dis_nodes_list: str | Sequence[str] | None = None, cw_nodes_list: str | Sequence[str] | None = None,
           axis: int | None = None, quantize_node: Groups = None, non_quantize_node: Groups = None,
           ae_metric: str = "cosine-similarity", average_mode: bool = False, pick_threshold: float = 0.999,
           sensitive_nodes: str | Sequence[str] | None = None) -> dict[str, list[Path]]:
    """Run all analyses; returns the files written, per step."""
    cm = load_calibrated(model_or_file)
    metrics = options.metric_list(ns_metrics, "ns_metrics")
    kinds = list(KINDS) if node_type is None else [options.node_type(node_type, "node_type")]
    interested = options.names(interested_nodes, "interested_nodes")
    dis_nodes = options.names(dis_nodes_list, "dis_nodes_list")
    cw_nodes = options.names(cw_nodes_list, "cw_nodes_list")
    for param, given in (("dis_nodes_list", dis_nodes), ("cw_nodes_list", cw_nodes)):
        if given:
            cm.check(given, param, allowed=KINDS if param == "cw_nodes_list" else ("node", *KINDS),
                     quantizable_only=param == "cw_nodes_list")
    ae_metric = options.one_metric(ae_metric, "ae_metric")
    quantize = options.groups(quantize_node, "quantize_node")
    non_quantize = options.groups(non_quantize_node, "non_quantize_node")
    if quantize is None and non_quantize is None:
        quantize = ["weight", "activation"]
    curves = curves_for(cm, quantize, non_quantize)
    axis = options.integer_or_none(axis, "axis")
    threshold = options.cosine_threshold(pick_threshold, "pick_threshold")
    sensitive = options.names(sensitive_nodes, "sensitive_nodes")
    if sensitive is not None:
        cm.check(sensitive, "sensitive_nodes")
    samples = load_samples(calibrated_data, cm, data_num)
    root = plots.output_dir(save_dir)
    # One set under save_dir: a run that fails or is interrupted after minutes of work leaves the previous
    # results as they were, never a mix of two runs' tables and plots.
    save_dir_folder = Destination("save_dir", "choose another save_dir")
    with artefact_transaction(root, set_name="runall", folder=save_dir_folder, keep_others=True) as staging:
        written: dict[str, list[Path]] = {}

        # Steps 1-2: sensitivity tables.
        folder = _sub(staging, "node_sensitivity")
        ranked: list[Sensitivity] = []
        for kind in (["node"] if interested else kinds):
            result = measure(cm, samples, metrics, kind, output_node, interested)
            ranked.append(result)
            if verbose:
                print(result.table())
            written.setdefault("node_sensitivity", []).extend(result.write(folder, f"sensitivity_of_{result.kind}"))

        # Steps 3-4: distributions of the most sensitive calibration nodes.
        top = dis_nodes if dis_nodes else _top_calibration_nodes(cm, ranked)
        plot_samples = samples[:PLOT_SAMPLES]
        written["data_distribution"] = list(distributions(cm, plot_samples, top, _sub(staging, "data_distribution"))
                                            .values())
        boxes = cw_nodes if cw_nodes else [n for n in top if n in cm.calibration]
        written["channelwise_distribution"] = list(channel_boxes(cm, plot_samples, boxes, axis,
                                                                 _sub(staging, "channelwise_distribution")).values())

        # Step 5: accumulated error.
        _, path = accumulate(cm, plot_samples, curves, ae_metric, bool(average_mode), _sub(staging, "accumulate_error"),
                             curve_mode(quantize, non_quantize))
        written["accumulate_error"] = [path]

        # Step 6: sensitivity analysis, reusing the node ranking when step 1 made one with cosine.
        known = next(({n: v[METRIC] for n, v in r.rows} for r in ranked
                      if r.kind == "node" and not interested and output_node is None and METRIC in r.metrics), None)
        _, chart = analyse(cm, samples, threshold, sensitive, _sub(staging, "sensitivity_analysis"), known)
        written["sensitivity_analysis"] = [chart]
    written = {step: [root / path.relative_to(staging) for path in files] for step, files in written.items()}

    print(f"runall: results saved under {root.resolve()}")
    for step, files in written.items():
        print(f"  {step}/: {len(files)} file(s)")
    return written


def _sub(root: Path, name: str) -> Path:
    path = root / name
    path.mkdir(parents=True, exist_ok=True)
    return path


def _top_calibration_nodes(cm: CalibratedModel, ranked: list[Sensitivity]) -> list[str]:
    """The TOP most sensitive per table; ordinary nodes stand for the calibration nodes feeding them."""
    out: list[str] = []
    for result in ranked:
        for name in result.names[:TOP]:
            out.extend(sorted(cm.switches_of(name)) if cm.kind_of(name) == "node" else [name])
    return list(dict.fromkeys(out))
