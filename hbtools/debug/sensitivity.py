"""get_sensitivity_of_nodes: how much quantizing each node alone costs the model output.

The sensitivity of a node is the metric between the float model's output and the
output of the model in which only that node is quantized: for an ordinary node, the
calibration nodes feeding it; for a calibration node, itself. Everything else stays
float.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

from hbtools.debug import options
from hbtools.debug.data import Sample, load_samples
from hbtools.debug.evaluate import COSINE, below_step, scores
from hbtools.debug.model import CalibratedModel, load_calibrated
from hbtools.debug.switchboard import shared_switchboard
from hbtools.debug.tables import console_table, csv_text
from hbtools.errors import HbError
from hbtools.log import first_of
from hbtools.log import logger as log
from hbtools.metrics import HIGHER_IS_BETTER
from hbtools.ops.base import attrs_of
from hbtools.ops.calibration import HzCalibration
from hbtools.outputs import write_file

# A weight that quantizing moves by less than this part of its largest value is taken as already quantized.
UNCHANGED_WEIGHT = 1e-6


@dataclass
class Sensitivity:
    kind: str  # table layout: "node", "weight" or "activation"
    metrics: list[str]
    rows: list[tuple[str, dict[str, float]]]  # most sensitive first
    cm: CalibratedModel
    below_step: set[str] = field(default_factory=set)  # rows with an output all 0 after quantization on a sample

    def as_dict(self) -> dict[str, dict[str, str]]:
        return {name: {m: str(values[m]) for m in self.metrics} for name, values in self.rows}

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self.rows]

    @property
    def asymmetric(self) -> bool:
        """Whether an activation row has a zero point: Threshold and Bit then do not say where its grid lies
        (an int8 zero point of -128 holds 0..threshold, not ±threshold), so a Range column follows the seed's."""
        return self.kind == "activation" and any(self.cm.calibration[name].zero_points for name, _ in self.rows)

    def headers(self) -> list[str]:
        lead = {"node": ["Node"], "weight": ["Weight", "Node"],
                "activation": ["Activation", "Node", "Threshold", "Bit"]}[self.kind]
        return [*lead, *self.metrics, *(["Range"] if self.asymmetric else [])]

    def cells(self, marked: bool = False) -> list[list[str]]:
        """The rows as text; ``marked``: a ``*`` after the cosine of the ``below_step`` rows (the table's
        footnote says why), kept out of the CSV so its numbers stay numbers."""
        out = []
        asymmetric = self.asymmetric
        for name, values in self.rows:
            lead = [name]
            if self.kind != "node":
                c = self.cm.calibration[name]
                readers = dict.fromkeys(self.cm.user_node(r) for r in c.consumers)
                lead.append(",".join(readers) or "--")  # a model output no node reads
                if self.kind == "activation":
                    lead += [str(c.threshold), str(c.bits)]
            star = "*" if marked and name in self.below_step else ""
            grid = []
            if asymmetric:
                low, high = self.cm.calibration[name].value_range()
                grid = [f"{low:.6g}..{high:.6g}"]
            out.append([*lead, *(str(values[m]) + (star if m == "cosine-similarity" else "")
                                 for m in self.metrics), *grid])
        return out

    def table(self) -> str:
        text = console_table(self.kind, self.headers(), self.cells(marked=True))
        if "cosine-similarity" in self.metrics and self.below_step:  # a bare 0 reads as a broken node
            text += ("\n* on some samples an output's float values are all below half a quantization step: "
                     "every quantized value is 0 and the cosine there is 0")
        return text

    def write(self, folder: Path, stem: str) -> list[Path]:
        txt, csv = folder / f"{stem}.txt", folder / f"{stem}.csv"
        folder.mkdir(parents=True, exist_ok=True)
        write_file(txt, (self.table() + "\n").encode("utf-8"))
        write_file(csv, csv_text(self.headers(), self.cells()).encode("utf-8"))
        return [txt, csv]


def get_sensitivity_of_nodes(model_or_file: str | onnx.ModelProto | None = None,
                             metrics: str | Sequence[str] = "cosine-similarity",
                             calibrated_data: object = None, output_node: str | None = None,
                             node_type: str = "node", data_num: int | None = None, verbose: bool = False,
                             interested_nodes: str | Sequence[str] | None = None) -> dict[str, dict[str, str]]:
    """Quantization sensitivity of every node of ``node_type`` (or of ``interested_nodes``).

    Returns ``{node: {metric: value}}`` as strings, most sensitive first by the first
    metric; with ``verbose`` the table is printed too.
    """
    cm = load_calibrated(model_or_file)
    metric_names = options.metric_list(metrics, "metrics")
    node_type = options.node_type(node_type, "node_type")
    interested = options.names(interested_nodes, "interested_nodes")
    if interested == []:
        raise HbError("interested_nodes is an empty list: give the nodes to rank, or leave it out to rank every "
                      f"{node_type} node")
    samples = load_samples(calibrated_data, cm, data_num)
    result = measure(cm, samples, metric_names, node_type, output_node, interested)
    if verbose:
        print(result.table())
    return result.as_dict()


def measure(cm: CalibratedModel, samples: Sequence[Sample], metrics: list[str], node_type: str,
            output_node: str | None = None, interested: list[str] | None = None) -> Sensitivity:
    if interested is not None:
        nodes = cm.check(interested, "interested_nodes")
        kinds = {cm.kind_of(n) for n in nodes}
        kind = kinds.pop() if len(kinds) == 1 else "node"
    else:
        nodes = cm.quantizable if node_type == "node" else cm.of_kind(node_type)
        kind = node_type
    observe = None
    if output_node is not None:
        # Where the error is measured: any ordinary node, the one making a model output included.
        (output_node,) = cm.check([output_node], "output_node", allowed=("node",), quantizable_only=False)
        observe = [o for o in cm.nodes[cm.standing_for(output_node)].output if o]
        if interested is None:  # a node downstream of output_node cannot change it: not ranked
            upstream = _upstream(cm, observe)
            nodes = [n for n in nodes if _affects(cm, n, upstream)]
            if not nodes:
                which = "node" if kind == "node" else f"{kind} node"
                raise HbError(f"no {which} that quantizes anything lies before output_node '{output_node}', so "
                              "nothing can change its outputs: choose an output_node after the model's quantized "
                              "nodes, or leave it out to measure at the model outputs")
    if kind == "weight":
        _warn_of_quantized_weights(cm, nodes)
    _warn_of_single_values(cm, observe or cm.outputs, metrics[0])
    switchboard = shared_switchboard(cm, observe)
    configs = [frozenset(cm.switches_of(n)) for n in nodes]
    values = scores(switchboard, samples, configs, metrics, f"sensitivity of {kind} nodes")
    flagged = {n for n, b in zip(nodes, below_step(switchboard, samples, configs), strict=True) if b}
    return Sensitivity(kind, metrics, rank(list(zip(nodes, values, strict=True)), metrics[0]), cm, flagged)


def _warn_of_single_values(cm: CalibratedModel, observed: list[str], metric: str) -> None:
    """A cosine similarity per sample of outputs holding one value each is 1 whatever the error (a hand
    landmark model's handedness score): ranked by it, every node ties and the order means nothing."""
    sizes = [cm.shapes.get(t) for t in observed]
    if metric != COSINE or not sizes or not all(s is not None and None not in s and math.prod(s) == 1
                                                 for s in sizes):
        return
    log.warning("%s hold%s one value per sample, whose cosine similarity is 1 whatever the error: ranked by it, "
                "every node ties; give metrics='mse' (or 'mre', 'l1') to rank by the size of the error",
                ", ".join(f"'{t}'" for t in observed), "s" if len(observed) == 1 else "")


def _warn_of_quantized_weights(cm: CalibratedModel, nodes: list[str]) -> None:
    """Say when weights are already on their grid: a QDQ model converted with calibration_type load keeps the
    dequantized weights as its float ones, so its weight table reads about 1 everywhere and ranks nothing."""
    loaded = any(n.op_type == HzCalibration.op_type and attrs_of(n).get("method") == "load"
                 for n in cm.model.graph.node)
    if not loaded:  # a bilinear Resize's weights, which hbtools writes, are on their grid too
        return
    unchanged = [n for n in nodes if _quantizing_leaves_unchanged(cm, n)]
    if unchanged:
        log.warning("quantizing leaves the weights of %d of %d weight node(s) as they are (%s): the model's float "
                    "weights are already int8 values times their scales, as in a QDQ model converted with "
                    "calibration_type load. Their weight sensitivity is about 1 and does not rank them; the node "
                    "and activation sensitivities still rank the model", len(unchanged), len(nodes),
                    first_of(unchanged))


def _quantizing_leaves_unchanged(cm: CalibratedModel, name: str) -> bool:
    node = cm.calibration_proto(name)
    if any(i and i not in cm.constants for i in node.input):  # a weight computed at run time
        return False
    values = [cm.constants[i] for i in node.input if i]  # the weight, its rounding offsets
    weight = values[0].astype(np.float64)
    moved = np.abs(HzCalibration.reference(node, values)[0] - weight).max(initial=0.0)
    return bool(moved <= UNCHANGED_WEIGHT * np.abs(weight).max(initial=0.0))


def _upstream(cm: CalibratedModel, tensors: list[str]) -> set[str]:
    """Names of the nodes (ordinary and calibration) that ``tensors`` are computed from."""
    seen: set[str] = set()
    stack = list(tensors)
    visited: set[str] = set()
    while stack:
        t = stack.pop()
        if t in visited:
            continue
        visited.add(t)
        node = cm.producers.get(t)
        if node is not None:
            seen.add(node.name)
            stack.extend(i for i in node.input if i)
    return seen


def _affects(cm: CalibratedModel, name: str, upstream: set[str]) -> bool:
    """Whether quantizing ``name`` (a node or a calibration node) can change what ``upstream`` computes."""
    return name in upstream or any(s in upstream for s in cm.switches_of(name))


def rank(rows: list[tuple[str, dict[str, float]]], metric: str) -> list[tuple[str, dict[str, float]]]:
    """Most sensitive first: lowest cosine / sqnr, highest error; undefined values last."""
    sign = 1.0 if metric in HIGHER_IS_BETTER else -1.0

    def key(row: tuple[str, dict[str, float]]) -> tuple[bool, float]:
        v = row[1][metric]
        return (math.isnan(v), sign * v if not math.isnan(v) else 0.0)

    return sorted(rows, key=key)
