"""plot_distribution: histograms of a node's data, float against calibrated.

- weight calibration node: the float weight and the fake-quantized weight;
- activation calibration node: its input in the calibrated model (all calibration on);
- ordinary node: its output in the float and in the calibrated model, and their
  difference;
- bias calibration node (``HzBiasCalibration``, a conv's bias on its int32 accumulator
  grid): the float bias and the bias on that grid. It is no switch of the debugger's
  (the bias follows its conv's input and weight nodes), so it has no threshold; the title
  gives the largest change rounding made.

A blue triangle marks the value of largest magnitude; red dashed lines mark the
calibration threshold (the largest one of a per-channel node).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx

from hbtools.debug import options, plots
from hbtools.debug.data import PLOT_SAMPLES, Sample, load_samples
from hbtools.debug.evaluate import tensor_values
from hbtools.debug.model import CalibratedModel, load_calibrated
from hbtools.debug.switchboard import shared_switchboard
from hbtools.errors import HbError
from hbtools.ops.calibration import HzBiasCalibration, HzCalibration
from hbtools.outputs import file_names
from hbtools.quant.calibrated import float_bias_input

BINS = 200


def plot_distribution(save_dir: str | Path | None = None, model_or_file: str | onnx.ModelProto | None = None,
                      calibrated_data: object = None, nodes_list: str | Sequence[str] | None = None
                      ) -> dict[str, Path]:
    """One PNG per node in ``save_dir``; returns ``{node: path}``."""
    cm = load_calibrated(model_or_file)
    nodes = _required(options.names(nodes_list, "nodes_list"), "nodes_list")
    cm.check([n for n in nodes if n not in cm.bias_nodes], "nodes_list", quantizable_only=False)
    samples = load_samples(calibrated_data, cm, at_most=PLOT_SAMPLES)
    return distributions(cm, samples, nodes, plots.output_dir(save_dir))


def distributions(cm: CalibratedModel, samples: Sequence[Sample], nodes: list[str], folder: Path) -> dict[str, Path]:
    observed = [t for n in nodes if n not in cm.bias_nodes and (t := _tensor_of(cm, n)) is not None]
    floats, quants = ({}, {})
    if observed:
        switchboard = shared_switchboard(cm, observed)
        floats, quants = tensor_values(switchboard, samples, frozenset(cm.calibration))
    files = file_names(nodes, suffix="_distribution.png", fallback="node")
    out = {}
    for name in nodes:
        if name in cm.bias_nodes:
            out[name] = _bias(cm, name, folder / files[name])
            continue
        kind = cm.kind_of(name)
        fig, axes = plots.figure(14.0 if kind == "node" else 9.0, 5.0, 2 if kind == "node" else 1)
        if kind == "weight" and cm.calibration[name].input in cm.constants:
            c = cm.calibration[name]
            w = cm.constants[c.input]
            q = HzCalibration.reference(cm.calibration_proto(name), [w])[0]
            _histograms(axes[0], {"float weight": w, "calibrated weight": q}, c.threshold)
        elif kind in ("weight", "activation"):
            c = cm.calibration[name]
            _histograms(axes[0], {"input (calibrated model)": _joined(quants[c.input])}, c.threshold)
        else:
            t = _tensor_of(cm, name)
            f, q = _joined(floats[t]), _joined(quants[t])
            _histograms(axes[0], {"float model": f, "calibrated model": q}, _threshold_of_output(cm, t))
            _histograms(axes[1], {"calibrated - float": q - f}, None)
            plots.title(axes[1], name, "error distribution")
        plots.title(axes[0], name, {"weight": "weight calibration node: float and calibrated weight",
                                    "activation": "activation calibration node: its input",
                                    "node": "output in the float and the calibrated model"}[kind])
        out[name] = plots.save(fig, folder / files[name])
    return out


def _bias(cm: CalibratedModel, name: str, path: Path) -> Path:
    node = cm.bias_nodes[name]
    bias = cm.constants.get(float_bias_input(node))  # before bias correction, where it changed it
    if bias is None:
        raise HbError(f"nodes_list: the bias of bias calibration node '{name}' ('{node.input[0]}') is computed in "
                      "the model, not a constant, so there is no one float bias to plot")
    on_grid = HzBiasCalibration.reference(node, [cm.constants[node.input[0]]])[0]
    fig, axes = plots.figure(9.0, 5.0, 1)
    _histograms(axes[0], {"float bias": bias, "calibrated bias (int32 grid)": on_grid}, None)
    error = float(np.abs(on_grid.astype(np.float64) - bias).max()) if np.size(bias) else 0.0
    plots.title(axes[0], name, f"bias calibration node: float and calibrated bias (largest change {error:.3g})")
    return plots.save(fig, path)


def _required(names: list[str] | None, param: str) -> list[str]:
    if not names:
        raise HbError(f"{param} is required: the nodes whose data distribution to plot")
    return names


def _tensor_of(cm: CalibratedModel, name: str) -> str | None:
    """The tensor to observe: a calibration node's computed input, an ordinary node's output."""
    kind = cm.kind_of(name)
    if kind != "node":
        t = cm.calibration[name].input
        return None if t in cm.constants else t
    return cm.nodes[cm.standing_for(name)].output[0]


def _threshold_of_output(cm: CalibratedModel, tensor: str) -> float | None:
    c = next((c for c in cm.calibration.values() if c.input == tensor and c.kind == "activation"), None)
    return None if c is None else c.threshold


def _joined(values: list[np.ndarray]) -> np.ndarray:
    return np.concatenate([np.asarray(v, dtype=np.float64).reshape(-1) for v in values])


def _histograms(ax, data: dict[str, np.ndarray], threshold: float | None) -> None:
    arrays = {k: np.asarray(v, dtype=np.float64).reshape(-1) for k, v in data.items()}
    finite = np.concatenate([a[np.isfinite(a)] for a in arrays.values()])
    lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (-1.0, 1.0)
    if threshold is not None:
        lo, hi = min(lo, -threshold), max(hi, threshold)
    if lo == hi:
        lo, hi = lo - 1.0, hi + 1.0
    bins = np.linspace(lo, hi, BINS + 1)
    for label, a in arrays.items():
        ax.hist(a, bins=bins, histtype="stepfilled", alpha=0.45, label=label, log=True)
    for a in arrays.values():
        if a.size:
            peak = float(a[np.argmax(np.abs(a))])
            ax.plot([peak], [1.0], marker="^", color="blue", markersize=9, linestyle="none")
    if threshold is not None:
        for x in (-threshold, threshold):
            ax.axvline(x, color="red", linestyle="--", linewidth=1.2)
    ax.plot([], [], marker="^", color="blue", linestyle="none", label="max |value|")
    if threshold is not None:
        ax.plot([], [], color="red", linestyle="--", label=f"threshold {threshold:.6g}")
    ax.set_xlabel("value")
    ax.set_ylabel("count")
    ax.legend(fontsize=8)
