"""Convolutions whose int8 weights spoil their output keep the rounding remainder as a second one.

Rounding a weight to its int8 grid changes a convolution's output by ``Conv(x, W - Q(W))``. For
most layers that is a fraction of a percent of the output, below what the activation grids lose.
Filters whose taps nearly cancel (edge and difference filters, BatchNormalization folded into a
layer with a large gain) are the exception: their output is small next to ``|W| |x|``, and the
same rounding is several percent of it, by an amount that follows each picture's level. Bias
correction and GPTQ fit that error on the calibration pictures, not on others.

``WeightsOnlyScores`` scores the float model with any set of layers' weights rounded (and their bias
corrected, fitted on the other samples) in one onnxruntime session; ``rounding_losses`` ranks the
layers by their own loss in another; ``choose`` takes the shortest head of that ranking that wins
back most of the loss; ``split_weights`` writes each chosen layer as two convolutions that sum to
it, the first with the weight on its int8 grid (quantized exactly), the second with the remainder
on a grid of its own, 127 times finer: about 16-bit weight precision on int8 multipliers.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from onnx import ModelProto, NodeProto, helper, numpy_helper

from hbtools.graph.graph import GraphView, is_static
from hbtools.graph.origins import record_origins, recorded_origins, user_node
from hbtools.log import first_of
from hbtools.metrics import cosine_of_chunks
from hbtools.ops.names import SPLIT_DOC
from hbtools.quant.grids import WEIGHT_BITS, fake_quantize, output_channel_rows, qmax_for
from hbtools.quant.plan import CalibrationPlan, exact_grid_thresholds
from hbtools.quant.search import KnownParts, output_pieces, scored_outputs
from hbtools.runtime.session import RUN_ERRORS, fetching_session

log = logging.getLogger("hbtools")

Samples = Callable[[], Iterable[dict[str, np.ndarray]]]
RESIDUAL = "_weight_residual"  # suffix of the second convolution's name, weight and output
SUM = "_sum"  # suffix of the Add joining the two halves


@dataclass(frozen=True)
class ConvWeight:
    node: str  # the Conv
    weight: str  # its constant weight
    output: str
    macs: int  # multiply-accumulates of one run


def candidates(model: ModelProto, plan: CalibrationPlan) -> list[ConvWeight]:
    """The convolutions whose weight the plan quantizes to int8, per output channel, read by them alone."""
    view = GraphView(model)
    nodes = view.node_by_name
    shapes = view.shapes
    per_channel_inputs = {p.tensor for p in plan.activations if p.axis is not None}
    found = []
    for p in plan.weights:
        if len(p.rewire) != 1 or p.axis != 0 or p.groups != 1:
            continue
        node = nodes.get(p.rewire[0][0])
        if node is None or node.op_type != "Conv" or p.rewire[0][1] != 1 or node.input[0] in per_channel_inputs:
            continue
        w = view.const(p.tensor)
        out_shape = shapes.get(node.output[0])
        if w is None or w.ndim < 3 or not out_shape or not is_static(out_shape):
            continue
        macs = int(np.prod(out_shape)) * int(np.prod(w.shape[1:]))
        found.append(ConvWeight(node.name, p.tensor, node.output[0], macs))
    return found


def rounded(w: np.ndarray) -> np.ndarray:
    """``w`` on its int8 grid per output channel, as the calibrated model rounds it to nearest."""
    thresholds = exact_grid_thresholds(output_channel_rows(w.astype(np.float64), 0))
    thresholds[thresholds == 0] = 1.0  # an all-zero channel stays zero on any grid
    scales = (thresholds / qmax_for(WEIGHT_BITS)).astype(np.float32).reshape([-1] + [1] * (w.ndim - 1))
    return fake_quantize(w.astype(np.float32), scales, WEIGHT_BITS)


def _residual_node(node: NodeProto, weight: str, output: str) -> NodeProto:
    return helper.make_node("Conv", [node.input[0], weight], [output], name=node.name + RESIDUAL,
                            **{a.name: helper.get_attribute_value(a) for a in node.attribute})


def rounding_losses(model: ModelProto, convs: Sequence[ConvWeight], samples: Samples,
                    limit: int) -> dict[str, float]:
    """Per convolution, ``RMS(Conv(x, W - Q(W))) / RMS(Conv(x, W) + b)`` over at most ``limit`` samples."""
    if not convs:
        return {}
    probe = split_weights(model, convs)  # the residual Conv(x, W - Q(W)) beside each layer
    fetch = []
    for c in convs:
        for tensor in (c.output, c.output + RESIDUAL):
            probe.graph.node.append(helper.make_node("ReduceSumSquare", [tensor], [tensor + "_energy"],
                                                     keepdims=0))
            fetch.append(tensor + "_energy")
    for tensor in fetch:
        probe.graph.output.append(helper.make_tensor_value_info(tensor, 1, []))
    session = fetching_session(probe, [])
    sums = np.zeros(len(fetch), dtype=np.float64)
    for index, feed in enumerate(samples()):
        if index >= limit:
            break
        sums += np.array([float(v) for v in session.run(fetch, feed)])
    out, res = sums[0::2], sums[1::2]
    return {c.node: float(np.sqrt(r / o)) if o > 0 else 0.0 for c, o, r in zip(convs, out, res, strict=True)}


SWITCH = "_weight_switch"  # graph input: 1 puts a layer's residual back (float weight), 0 leaves it rounded
CORRECTION = "_bias_correction"  # graph input: what bias correction adds to a rounded layer's output
MEAN = "_residual_mean"  # output: the per-channel mean of a layer's rounding change


def _switched_model(model: ModelProto, convs: Sequence[ConvWeight]) -> ModelProto:
    """``model`` with each layer as ``Conv(x, Q(W), b) + s * Conv(x, W - Q(W)) + c``, ``s`` a scalar input
    and ``c`` a per-channel one (bias correction's term, zero with ``s`` = 1): one session scores any
    choice of layers with float or rounded weights, every weight constant. It also gives the per-channel
    mean of each ``Conv(x, W - Q(W))``, which bias correction adds."""
    view = GraphView(model)
    switched = split_weights(model, convs)
    sums = {c.node + SUM: c for c in convs}
    nodes = list(switched.graph.node)
    del switched.graph.node[:]
    for node in nodes:
        c = sums.get(node.name)
        if c is None:
            switched.graph.node.append(node)
            continue
        residual = c.output + RESIDUAL
        node.input[1], node.output[0] = c.output + "_switched", c.output + "_uncorrected"
        switched.graph.node.extend([
            helper.make_node("Mul", [residual, c.node + SWITCH], [c.output + "_switched"]),
            node,
            helper.make_node("Add", [c.output + "_uncorrected", c.node + CORRECTION], [c.output]),
            # per sample and channel ([N, C, 1, ...]); any opset (ReduceMean's axes moved to an input at 18)
            helper.make_node("GlobalAveragePool", [residual], [c.output + MEAN])])
        w = view.const(c.weight)
        switched.graph.input.extend([
            helper.make_tensor_value_info(c.node + SWITCH, 1, []),
            helper.make_tensor_value_info(c.node + CORRECTION, 1, [1, w.shape[0]] + [1] * (w.ndim - 2))])
        switched.graph.output.append(helper.make_tensor_value_info(c.output + MEAN, 1, None))
    return switched


class WeightsOnlyScores:
    """Output cosine of the float model with the weights of some layers rounded to int8 (and their bias
    corrected), on ``feeds``.

    Bias correction adds to a rounded layer the mean of what rounding takes from its output. Here it is
    fitted on the other samples than the one scored (leave one out): the rounding change of a filter
    whose taps cancel follows each picture's level, and a mean fitted on a picture itself would hide
    what it cannot repair on others. Compared as the searches compare (``search``): the scored outputs
    without their known parts (``KnownParts``), an output that joins pieces piece by piece; the score is the worst
    piece's cosine over the samples."""

    def __init__(self, model: ModelProto, convs: Sequence[ConvWeight], feeds: Sequence[dict]) -> None:
        self.convs = list(convs)
        self.outputs = scored_outputs(model)
        self.pieces = output_pieces(model)
        self.means = [c.output + MEAN for c in self.convs]
        view = GraphView(model)
        self.zeros = {}
        for c in self.convs:
            w = view.const(c.weight)
            self.zeros[c.node] = np.zeros([1, w.shape[0]] + [1] * (w.ndim - 2), np.float32)
        self.session = fetching_session(_switched_model(model, convs), self.outputs)
        self.feeds = list(feeds)
        outputs, means = [], []
        for feed in self.feeds:
            values = self._run(feed, {c.node for c in self.convs}, {}, [*self.outputs, *self.means])
            outputs.append(values[:len(self.outputs)])
            means.append([m.mean(axis=0, keepdims=True) for m in values[len(self.outputs):]])
        self.known = KnownParts(model, self.feeds, outputs)
        self.refs = [self._cut(values, i) for i, values in enumerate(outputs)]
        total = [sum(m[k] for m in means) for k in range(len(self.convs))]
        others = max(len(means) - 1, 1)
        self.corrections = [{c.node: (total[k] - m[k]) / others for k, c in enumerate(self.convs)} for m in means]
        self.live = [any(np.any(r[k]) for r in self.refs) for k in range(len(self.refs[0]))] if self.refs else []

    def _run(self, feed: dict, float_layers: set[str], corrections: dict[str, np.ndarray],
             fetch: list[str] | None = None) -> list[np.ndarray]:
        extra = {}
        for c in self.convs:
            kept = c.node in float_layers
            extra[c.node + SWITCH] = np.array(1.0 if kept else 0.0, np.float32)
            extra[c.node + CORRECTION] = self.zeros[c.node] if kept else corrections[c.node].astype(np.float32)
        return self.session.run(fetch or self.outputs, {**feed, **extra})

    def _cut(self, tensors: list[np.ndarray], sample: int) -> list[np.ndarray]:
        cut = []
        for k, (tensor, joined) in enumerate(zip(tensors, self.pieces, strict=True)):
            flat = self.known.without(tensor, k, sample).reshape(-1)
            if joined is not None and joined.labels.size == flat.size:
                cut.extend(flat[where] for where in joined.indices())
            else:
                cut.append(flat)
        return cut

    def score(self, float_layers: set[str]) -> float:
        """The worst scored piece's cosine with the float outputs, over every sample."""
        got = [self._cut(self._run(feed, float_layers, corrections), i)
               for i, (feed, corrections) in enumerate(zip(self.feeds, self.corrections, strict=True))]
        scores = [cosine_of_chunks((g[k], r[k]) for g, r in zip(got, self.refs, strict=True))
                  for k in range(len(self.live)) if self.live[k]]
        return min(scores, default=1.0)  # outputs all zero on these samples: nothing to compare


# Weights-only output loss (1 - cosine) int8 weights may cost with no layer split. Below it GPTQ and bias
# correction repair what rounding loses, and a split moves the int16 search more than it wins
# (PP-OCRv6 tiny det, 0.0051 here: one layer split, held-out cosine 0.9983 / 0.9815 -> 0.9973 / 0.9528).
LOSS_FLOOR = 0.01
RECOVER = 0.9  # share of the weights-only loss the split layers win back, down to GOAL_FLOOR
GOAL_FLOOR = 0.005
MAX_EXTRA_MACS = 0.5  # the split layers' share of the candidates' multiply-accumulates at most
MIN_RECOVERED = 0.5  # where no list within MAX_EXTRA_MACS reaches the goal: the share the best must win back
RANK_SAMPLES = 16  # samples measuring each layer's rounding loss


@dataclass(frozen=True)
class Choice:
    split: list[ConvWeight]
    base: float  # weights-only output cosine, every weight int8
    reached: float  # ... with the split layers' weights at full precision
    extra_macs: float  # the split layers' share of the candidates' multiply-accumulates


def _ladder(n: int) -> list[int]:
    """Prefix sizes tried: 1, 2, 4, then steps of a quarter of the size reached, up to ``n``."""
    sizes, k = [], 1
    while k < n:
        sizes.append(k)
        k = k * 2 if k < 4 else k + max(1, k // 4) * 2
    return [*sizes, n]


def choose(model: ModelProto, plan: CalibrationPlan, samples: Samples, feeds: Sequence[dict]) -> Choice | None:
    """The layers to split (``split_weights``), or None where int8 weights lose less than ``LOSS_FLOOR``.

    Layers are taken in order of their own rounding loss (``rounding_losses``), and the shortest such
    list whose weights-only cosine wins back ``RECOVER`` of the loss is chosen; where none within
    ``MAX_EXTRA_MACS`` does, the best one, if it wins back ``MIN_RECOVERED``. The scores are not
    monotonic in the list's length (rounding errors of layers in a chain partly cancel), so each
    length of a ladder is scored, not bisected."""
    convs = candidates(model, plan)
    if not convs or not feeds:
        return None
    scores = WeightsOnlyScores(model, convs, feeds)
    base = scores.score(set())
    if not 1.0 - base > LOSS_FLOOR:  # NaN too: nothing to compare
        return None
    goal = 1.0 - max(GOAL_FLOOR, (1.0 - base) * (1.0 - RECOVER))
    losses = rounding_losses(model, convs, samples, RANK_SAMPLES)
    order = sorted(convs, key=lambda c: -losses[c.node])
    total = sum(c.macs for c in convs)
    best_score, best_length = base, 0
    for k in _ladder(len(order)):
        if sum(c.macs for c in order[:k]) > MAX_EXTRA_MACS * total:
            break
        reached = scores.score({c.node for c in order[:k]})
        if reached > best_score:
            best_score, best_length = reached, k
        if reached >= goal:
            break
    if best_score < goal and best_score - base < MIN_RECOVERED * (1.0 - base):
        best_length = 0  # no list within the budget wins back enough to pay for its time
    chosen = order[:best_length]
    return Choice(chosen, base, best_score, sum(c.macs for c in chosen) / total)


def split_weights(model: ModelProto, convs: Sequence[ConvWeight]) -> ModelProto:
    """A copy where each of ``convs`` is ``Conv(x, Q(W), b) + Conv(x, W - Q(W))``: the same function in
    float, the first weight exactly on its int8 grid, the second (its remainder) on a grid of its own."""
    view = GraphView(model)
    out = ModelProto()
    out.CopyFrom(model)
    by_node = {c.node: c for c in convs}
    origins = recorded_origins(out)
    inits = {t.name: t for t in out.graph.initializer}
    nodes = list(out.graph.node)
    del out.graph.node[:]
    for node in nodes:
        c = by_node.get(node.name)
        if c is None:
            out.graph.node.append(node)
            continue
        w = view.const(c.weight)
        grid = rounded(w)
        inits[c.weight].CopyFrom(numpy_helper.from_array(grid.astype(w.dtype), c.weight))
        out.graph.initializer.append(numpy_helper.from_array((w.astype(np.float32) - grid).astype(w.dtype),
                                                             c.weight + RESIDUAL))
        node.output[0] = c.output + "_grid"
        residual = _residual_node(node, c.weight + RESIDUAL, c.output + RESIDUAL)
        node.doc_string = residual.doc_string = SPLIT_DOC
        out.graph.node.extend([node, residual,
                               helper.make_node("Add", [c.output + "_grid", c.output + RESIDUAL], [c.output],
                                                name=c.node + SUM)])
        origins[residual.name] = origins[c.node + SUM] = user_node(origins, c.node)
    record_origins(out, origins)
    return out


def finer_weights(model: ModelProto, plan: CalibrationPlan, samples: Samples,
                  feeds: Sequence[dict]) -> tuple[ModelProto | None, float | None]:
    """``model`` with the layers ``choose`` picks split (``split_weights``), or None where none is; and the
    output cosine with every weight int8 and float activations (None where not measured), of the weights as the
    model keeps them: with the split layers' remainders. The int16 search compares it with its own cosine to say
    whether the weights or the activations lose the accuracy."""
    try:
        choice = choose(model, plan, samples, feeds)
    except RUN_ERRORS:
        return None, None  # a sample the float model cannot run: calibration reports it, with its number
    if choice is None:
        return None, None
    if not choice.split:
        log.info("int8 weights alone bring the output cosine to %.4f on %d samples; no convolution is split: "
                 "keeping the remainder of those that lose most (within +%.0f%% multiply-accumulates) wins back "
                 "too little (%.4f)", choice.base, len(feeds), 100 * MAX_EXTRA_MACS, choice.reached)
        return None, choice.base
    names = [c.node for c in choice.split]
    shown = first_of(names, 6)
    log.info("int8 weights alone bring the output cosine to %.4f on %d samples; %d convolutions keep their "
             "weights' remainder as a second int8 convolution beside them (%.4f, +%.0f%% multiply-accumulates "
             "of the convolutions): %s", choice.base, len(feeds), len(names), choice.reached,
             100 * choice.extra_macs, shown)
    return split_weights(model, choice.split), choice.reached
