"""Scoring calibration choices on what the user will run, and the searches built on it.

``Evaluator`` runs the calibrated model, lowered with fed calibration grids
(``feed_calibration``), on a few kept samples: one session scores any threshold,
bit width or enable assignment. Method choice, ``mix`` refinement, mixed precision
(int16 promotion) and sensitivity ranking return their results; none changes the
plan it was given.
"""

from __future__ import annotations

import copy
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import islice

import numpy as np
from onnx import AttributeProto, ModelProto, NodeProto, TensorProto, helper

from hbtools.errors import HbError
from hbtools.graph.constant_terms import MOVES, Tails, constant_tensors
from hbtools.graph.graph import GraphView, elements, is_static, itemsize, outer_references
from hbtools.metrics import cosine_of_products, products
from hbtools.quant.plan import CalibrationPlan, build_calibrated_model
from hbtools.runs.progress import progress
from hbtools.runtime.custom_session import CustomOpSession
from hbtools.runtime.heap import release_freed_memory
from hbtools.runtime.session import RUN_ERRORS, fetching_model, fetching_session
from hbtools.runtime.suffixes import Suffixes

log = logging.getLogger("hbtools")

PROMOTE_TARGET = 0.9999  # output cosine at which the int16 search stops
KEEP_GAIN = 0.99  # share of the all-int16 improvement mixed precision must keep
SAMPLE_KEEP_GAIN = 0.9  # ... and each calibration sample of its own
DEMOTE_STEPS = 24  # tensors go back to int8 in about this many groups
# Every activation int16 scores 0.995 and more on real CNNs (each grid's error ~1/256 of int8's); below this
# the integer grids cannot hold some values at all: a log-power spectrum in the model (DNSMOS 0.939, Spotify's
# basic-pitch 0.921), where the fix is float on the CPU, not more bits.
ALL_INT16_FLOOR = 0.99
# Samples each tensor's sensitivity is measured on (``_sensitivity_samples``): an order for the demotions,
# which are judged on every scoring sample. Measured as a gain over all-int8 on the first two samples (up
# to session 34), the order depended on which two (PP-OCRv5 det: rank correlation 0.39 between two pairs,
# 73-98 of 133 tensors int16 over four sets); see ``_rank_by_sensitivity`` for what it measures now.
SENSITIVITY_SAMPLES = 2
SENSITIVITY_MAX_TENSORS = 200  # beyond this, the noisiest tensors are measured
SUFFIXES = 6  # cuts of the model the sensitivity measurements rerun from
SUFFIXES_WORTH_SECONDS = 3.0  # measurements taking less than this run the whole model
TRIM_EVERY = 8  # sensitivity measurements between two hand-backs of freed memory
# Samples scored side by side, each run on one onnxruntime thread: the small convolutions of a
# batch-1 model split badly over threads, whole runs side by side keep every core busy (as the
# debugger's sweeps run). Two: each run in flight holds its own intermediates.
SCORE_WORKERS = max(1, min(2, os.cpu_count() or 1))
# ... and only for models whose activations (all of them, float32) take at most this: the second
# run's intermediates, and what glibc keeps of them in its thread's heap, came to 0.3-0.6x that
# total (PP-OCRv4 rec 207 MB: +68 MB peak; PP-OCRv5 det at 480x480, 362 MB: +250 MB; PP-OCRv4 det at
# 640x640, 750 MB: +320 MB, over 1 GB in all).
SIDE_BY_SIDE_BYTES = 256 << 20
_pool_lock = threading.Lock()
_pools: dict[int, ThreadPoolExecutor] = {}  # by process id


def _pool() -> ThreadPoolExecutor:
    """The score runs' thread pool of this process: a child forked after a search had the parent's
    pool, whose threads it does not have (work handed to it would never run), so it makes its own."""
    with _pool_lock:
        pid = os.getpid()
        if pid not in _pools:
            _pools.clear()
            _pools[pid] = ThreadPoolExecutor(SCORE_WORKERS, thread_name_prefix="hbtools-score")
        return _pools[pid]


def release_pool() -> None:
    """Stop this process's score threads once a search is over: the interpreter joins idle pool threads
    at exit, and a Ctrl-C during that join printed a traceback after a finished run."""
    with _pool_lock:
        pool = _pools.pop(os.getpid(), None)
    if pool is not None:
        pool.shutdown(wait=True)


def side_by_side(run: Callable[[int], list[np.ndarray]], order: list[int], session: object,
                 workers: int | None = None) -> Iterator[tuple[int, list[np.ndarray]]]:
    """``(i, run(i))`` for ``i`` in ``order``, in that order, with up to ``workers`` runs in flight
    (``SCORE_WORKERS`` unless given).

    A consumer that stops early leaves at most the runs already started (their results are
    dropped). Runs over a session with custom ops (Python code between onnxruntime parts) go
    one at a time.
    """
    workers = SCORE_WORKERS if workers is None else min(workers, SCORE_WORKERS)
    if workers < 2 or len(order) < 2 or isinstance(session, CustomOpSession):
        for i in order:
            yield i, run(i)
        return
    pool = _pool()
    upcoming = iter(order)
    pending = deque((i, pool.submit(run, i)) for i in islice(upcoming, workers))
    try:
        while pending:
            i, future = pending.popleft()
            following = next(upcoming, None)
            if following is not None:
                pending.append((following, pool.submit(run, following)))
            yield i, future.result()
    finally:
        for _, future in pending:
            future.cancel()


def score_workers(model: ModelProto) -> int:
    """Runs of ``model`` scored side by side: ``SCORE_WORKERS`` where its activations are small
    enough (``SIDE_BY_SIDE_BYTES``), else one."""
    view = GraphView(model)
    shapes, types = view.shapes, view.elem_types
    total = sum(elements(shapes.get(o)) * itemsize(types.get(o) or TensorProto.FLOAT)
                for n in model.graph.node for o in n.output if o)
    return SCORE_WORKERS if total <= SIDE_BY_SIDE_BYTES else 1


def session_threads(workers: int) -> int:
    """onnxruntime threads of a session whose runs go ``workers`` side by side (0: onnxruntime's default)."""
    return 1 if workers > 1 else 0


# Ops whose results are places decided by values (which quantization moves), and the ops that pick
# elements at such places: TopK and NonMaxSuppression always, a gather when its indices come from a decision.
_DECISIONS = ("TopK", "ArgMax", "ArgMin", "NonMaxSuppression", "NonZero")
_GATHERS = ("Gather", "GatherElements", "GatherND")
# Pick by value themselves: an index output (ArgMax's class map, a SimCC keypoint bin) is scored on what it
# chose from, not by the cosine of its indices.
_SELECTIONS = ("TopK", "NonMaxSuppression", "ArgMax", "ArgMin")
_FLOATS = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.BFLOAT16)


def scored_outputs(model: ModelProto) -> list[str]:
    """What stands for the model outputs in a score: each output, or, for an output made by picking
    elements at places decided by the data (an end-to-end detector's top-k boxes: TopK, then
    GatherElements at its indices), the float tensors it picks from.

    A picked output holds the float model's choice in the float model and the quantized model's in
    the quantized one: where two candidates score alike (the many near-zero scores of a detector)
    the order flips, and the cosine compares unrelated boxes. A YOLO26 head's top-300 list scored
    0.34 for every calibration method, so the search chose by noise. The tensors it picks from keep
    their places.

    A calibrated model gives as many tensors as its float model, in the same order (the searches score
    the one against the other's values): a weight or bias read after the pick is no source in either
    (its grid made it look computed in the calibrated one), and a tensor the pick reads through its
    HzCalibration stands there as that node's output, the value the pick reads. Each tensor is listed
    once (a DETR's scores and boxes pick from the same tensors)."""
    producer = {o: n for n in model.graph.node for o in n.output}
    types = constant = None

    def upstream(test: Callable[[NodeProto], bool]) -> Callable[[str], bool]:
        """Whether a node passing ``test`` makes a tensor or anything it is computed from."""
        memo: dict[str, bool] = {}

        def found(name: str) -> bool:
            stack = [name]
            while stack:  # depth first without recursion (deep graphs)
                t = stack[-1]
                node = producer.get(t)
                if t in memo or node is None:
                    memo.setdefault(t, False)
                    stack.pop()
                    continue
                pending = [i for i in node.input if i and i not in memo]
                if pending:
                    stack.extend(pending)
                    continue
                memo[t] = test(node) or any(memo[i] for i in node.input if i)
                stack.pop()
            return memo[name]

        return found

    decided = upstream(lambda n: n.op_type in _DECISIONS and n.domain in ("", "ai.onnx"))
    has_pick = upstream(lambda n: n.domain in ("", "ai.onnx") and (
        n.op_type in _SELECTIONS or (n.op_type in _GATHERS and decided(n.input[1])) or _decides_inside(n)))

    outputs = {o.name for o in model.graph.output}  # a calibrated model's outputs keep the float model's names
    names: dict[str, str] = {}  # by the float model's name
    for out in model.graph.output:
        if not has_pick(out.name):
            names.setdefault(out.name, out.name)
            continue
        # Walk up through the tensors made by picks; the tensors they read that no pick made are
        # what the output holds values of (the int ones only say where).
        sources: list[str] = []
        stack, seen = [out.name], set()
        while stack:
            t = stack.pop()
            if t in seen:
                continue
            seen.add(t)
            reads = [i for i in dict.fromkeys([*producer[t].input, *outer_references(producer[t])]) if i]
            for i in reads:
                if not has_pick(i) and i in producer:
                    types = types if types is not None else GraphView(model).elem_types
                    constant = constant if constant is not None else constant_tensors(model)
                    if i not in constant and types.get(i, TensorProto.FLOAT) in _FLOATS:
                        sources.append(i)
            stack.extend(i for i in reversed(reads) if has_pick(i))
        for name in sources or [out.name]:
            names.setdefault(name if name in outputs else _uncalibrated(producer, name), name)
    return list(names.values())


def _uncalibrated(producer: dict[str, NodeProto], name: str) -> str:
    """What the HzCalibration making ``name`` calibrates, else ``name``: a tensor's name in the float model."""
    node = producer.get(name)
    return node.input[0] if node is not None and node.op_type == "HzCalibration" else name


def _decides_inside(node: NodeProto) -> bool:
    """Whether a Loop / Scan / If body decides by value (an ArgMax, TopK, ...): a greedy decoder feeding each
    step's token back. Its outputs follow the decisions, and any grid moves a near tie (SLANet's table
    decoder: every calibration method scored 0.64-0.77); the tensors it reads keep their places."""
    for attr in node.attribute:
        for sub in [attr.g] if attr.type == AttributeProto.GRAPH else list(attr.graphs):
            if any((n.op_type in _DECISIONS and n.domain in ("", "ai.onnx")) or _decides_inside(n) for n in sub.node):
                return True
    return False


_SOFTMAXES = ("Softmax", "HzSoftmax", "LogSoftmax", "HzLogSoftmax")


def final_logits(model: ModelProto) -> list[str | None]:
    """Per scored output (``scored_outputs``), the logits a final Softmax or LogSoftmax giving it reads (None:
    none).

    Softmax saturates: on samples the float model classifies with confidence its outputs stay at
    0 and 1 whatever the quantization does, and 8 such calibration samples scored a classifier's
    int8 model at 0.99998, so the int16 search stopped before it began; on other pictures the
    model gave 0.989. The logits show that error. They do not replace the outputs as the score,
    though: on a many-class output (a CTC head) their cosine is mostly the many small logits, and
    choosing by it clipped the few large ones that decide (PP-OCRv5 rec: 0.68 on held-out
    pictures). The same rule finds them in the float model and in a calibrated one. Log-probabilities
    (CTC heads of speech and text models) hide more: the offset all of a row's values share keeps
    their cosine near 1 whatever the logits do.
    """
    maker = _maker_of(model)
    return [node.input[0] if node is not None and node.op_type in _SOFTMAXES else None
            for node in (maker(o) for o in scored_outputs(model))]


def _maker_of(model: ModelProto) -> Callable[[str], NodeProto | None]:
    """The node making a tensor, looking through its HzCalibration (the same in a float and a calibrated model)."""
    producer = {o: n for n in model.graph.node for o in n.output}

    def maker(name: str) -> NodeProto | None:
        return producer.get(_uncalibrated(producer, name))

    return maker


@dataclass
class Pieces:
    """What an output joins: per element, the index of the tensor (in ``names``) it comes from."""

    names: list[str]
    labels: np.ndarray  # flat, the output's size; -1 where a constant was joined

    def indices(self) -> list[np.ndarray | slice]:
        """Per joined tensor, where its elements are in the flat output (a slice where contiguous)."""
        found: list[np.ndarray | slice] = []
        for k in range(len(self.names)):
            idx = np.flatnonzero(self.labels == k)
            found.append(slice(int(idx[0]), int(idx[-1]) + 1) if idx.size and idx[-1] - idx[0] + 1 == idx.size
                         else idx)
        return found


def output_pieces(model: ModelProto) -> list[Pieces | None]:
    """Per scored output (``scored_outputs``) joined by a Concat (also behind Reshape, Transpose,
    Flatten, Squeeze, nested Concats): the tensors it joins and where each lands (None: otherwise).

    Detector heads join unlike things in one output (YOLOv8: 4 box coordinates in pixels beside
    the class scores in 0..1; YOLOX: boxes, objectness, classes; YOLOv8-pose: keypoints in pixels
    interleaved with their confidences by a Concat and a Reshape). One cosine over such an output is
    the largest piece's alone, and a search that scored it clipped the small ones (a YOLOv8n's class
    scores were at cosine 0.76 while the output was at 0.9999). Each piece is scored as an output
    of its own. Where each lands is found by running the moves on tensors filled with their index.
    """
    producer = {o: n for n in model.graph.node for o in n.output}
    inits = {t.name: t for t in model.graph.initializer}

    def source(name: str) -> str:
        return _uncalibrated(producer, name)

    shapes: dict | None = None
    found: list[Pieces | None] = []
    for out in scored_outputs(model):
        moves: list[NodeProto] = []
        leaves: list[str] = []
        stack, seen = [source(out)], set()
        while stack:
            name = stack.pop()
            if name in seen:
                continue
            seen.add(name)
            node = producer.get(name)
            if node is None or node.op_type not in MOVES or node.domain not in ("", "ai.onnx"):
                leaves.append(name)
                continue
            data = list(node.input) if node.op_type == "Concat" else node.input[:1]
            copy = helper.make_node(node.op_type, [source(i) if i in data else i for i in node.input],
                                    list(node.output[:1]), name=node.name)
            copy.attribute.extend(node.attribute)
            moves.append(copy)
            stack.extend(source(i) for i in data)
        joined = [n for n in leaves if n not in inits]
        if len(joined) < 2:
            found.append(None)
            continue
        shapes = shapes if shapes is not None else GraphView(model).shapes
        if not all(shapes.get(n) and is_static(shapes[n]) for n in leaves):
            found.append(None)
            continue
        found.append(Pieces(joined, _where_each_lands(model, moves[::-1], leaves, joined, source(out), shapes,
                                                      inits)))
    return found


def _where_each_lands(model: ModelProto, moves: list[NodeProto], leaves: list[str], joined: list[str], out: str,
                      shapes: dict, inits: dict) -> np.ndarray:
    """The flat output of ``moves`` run on ``leaves`` filled with their index in ``joined`` (-1: constants)."""
    from onnx.reference import ReferenceEvaluator

    params = {i for n in moves for i in n.input if i in inits and i not in leaves}
    graph = helper.make_graph(moves, "pieces",
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, shapes[n]) for n in leaves],
                              [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)],
                              [inits[i] for i in sorted(params)])
    probe = helper.make_model(graph, opset_imports=[o for o in model.opset_import if o.domain in ("", "ai.onnx")])
    feeds = {n: np.full(shapes[n], joined.index(n) if n in joined else -1, np.float32) for n in leaves}
    return ReferenceEvaluator(probe).run(None, feeds)[0].reshape(-1).astype(np.int64)


def constant_terms(model: ModelProto) -> list[np.ndarray | None]:
    """Per scored output (``scored_outputs``), the part of it no input changes, flat (None: nothing;
    ``constant_terms.Tails``).

    An Ultralytics export's boxes are anchor points in pixels plus or minus predicted distances. The
    grid is most of their energy, and the same in the float and the quantized model: their cosine
    stayed at 0.9999 with the decoding on an int8 grid of 2.5 pixels. Scores compare what is left
    once this part is taken from both.
    """
    tails = Tails(model)
    return [tails.constant_part(out) for out in scored_outputs(model)]


class KnownParts:
    """Per scored output (``scored_outputs``) and sample, the part of it the scores leave out, flat: what
    it holds whatever the input (``constant_terms``) and what the model input decides alone where the
    output adds it (``Tails.known_model``).

    A restoration net's output is its input plus a correction (``x + f(x)``). The input is most of the
    output's energy, so its cosine was 0.99999 while the correction, what the net computes, was at 0.98
    (SNR 14 dB) on int8 grids, and the int16 search stopped before it began. The part is the same in the
    float and the quantized model, and scores compare what is left once it is taken from both. An output
    the input alone decides keeps its whole value (nothing would be left to compare).
    """

    def __init__(self, model: ModelProto, feeds: list[dict], refs: list[list[np.ndarray]]) -> None:
        """``refs``: per sample, the float model's value of each scored output (at least)."""
        tails = Tails(model)
        self.parts: list[np.ndarray | list[np.ndarray] | None] = []
        self.offsets: list[str] = []  # scored outputs left without their float mean (``_dominant_offsets``)
        joined = output_pieces(model)
        for k, out in enumerate(scored_outputs(model)):
            probe = tails.known_model(out)
            part: np.ndarray | list[np.ndarray] | None = None
            if probe is not None and all(r[k].dtype.kind == "f" for r in refs):
                part = _known_values(probe, out, feeds)
                if part is None or any(p.size != r[k].size for p, r in zip(part, refs, strict=True)) or \
                        not any(np.any(r[k].reshape(-1) != p) for p, r in zip(part, refs, strict=True)):
                    part = None
            self.parts.append(part if part is not None else tails.constant_part(out))
            if isinstance(self.parts[-1], np.ndarray) and any(r[k].size != self.parts[-1].size for r in refs):
                self.parts[-1] = None
            if self.parts[-1] is None and all(r[k].dtype.kind == "f" for r in refs):
                pieces = joined[k] if joined[k] is not None and all(r[k].size == joined[k].labels.size
                                                                    for r in refs) else None
                self.parts[-1] = _dominant_offsets([r[k] for r in refs], pieces)
                if self.parts[-1] is not None:
                    self.offsets.append(out)

    def without(self, tensor: np.ndarray, k: int, sample: int) -> np.ndarray:
        """``tensor`` (scored output ``k`` of ``sample``, or any other fetched tensor: as it is) without its
        known part, flat where it has one."""
        part = self.parts[k] if k < len(self.parts) else None
        if isinstance(part, list):
            part = part[sample]
        return tensor if part is None else tensor.reshape(-1) - part


OFFSET_DOMINATES = 10.0  # an output's mean energy this many times its spread's: its cosine hides the errors


def _dominant_offsets(values: list[np.ndarray], pieces: Pieces | None = None) -> list[np.ndarray] | None:
    """Per sample, the float output's mean, where the means dominate its energy (``OFFSET_DOMINATES``); else None.

    An output joining ``pieces`` (each scored on its own, ``Evaluator._scored_pieces``) takes each piece's own
    mean where it dominates that piece, and nothing elsewhere: the whole output's mean (polygon corners in pixels
    beside class scores) left the scores as values far from zero, their cosine 1 whatever their error.

    A forecast in physical units (N-BEATS: values near 50 varying by 3) has a cosine of 0.999996 whatever
    its quantization does: the offset is nearly all of it. Every calibration method tied there, and the
    int16 search kept the series mean on an int8 grid of step 0.46, added back to every forecast value
    (error 0.13 of the forecast's deviation, against 0.04 with that one tensor int16). Taken from both
    outputs, the float mean leaves the error as it is and the scores see it against the deviation.
    """
    flat = [v.reshape(-1).astype(np.float64) for v in values]
    parts = [np.zeros(f.size, dtype=np.float32) for f in flat]
    found = False
    for where in pieces.indices() if pieces is not None else [slice(None)]:
        means = _dominant_means([f[where] for f in flat])
        if means is not None:
            found = True
            for part, mean in zip(parts, means, strict=True):
                part[where] = mean
    return parts if found else None


def _dominant_means(flat: list[np.ndarray]) -> list[float] | None:
    """Per sample, the mean of its values where the means dominate their energy (``OFFSET_DOMINATES``); else None."""
    means = [float(f.mean()) if f.size else 0.0 for f in flat]
    offset = sum(m * m * f.size for m, f in zip(means, flat, strict=True))
    spread = sum(float(np.sum((f - m) ** 2)) for m, f in zip(means, flat, strict=True))
    return None if spread <= 0 or offset < OFFSET_DOMINATES * spread else means


def _known_values(probe: ModelProto, out: str, feeds: list[dict]) -> list[np.ndarray] | None:
    """``out`` of ``probe`` (``Tails.known_model``) per sample, flat; None where it cannot run (the scores then
    leave out the constant part alone, as before there was a known part)."""
    try:
        session = fetching_session(probe, [], spinning=False, threads=1)
        names = [i.name for i in session.get_inputs()]
        return [np.asarray(session.run([out], {n: feed[n] for n in names})[0], np.float32).reshape(-1)
                for feed in feeds]
    except (*RUN_ERRORS, HbError, KeyError) as exc:
        log.debug("the part of '%s' its input decides is not known: %s", out, exc)
        return None


def scored_tensors(model: ModelProto) -> list[str]:
    """What a score compares: the ``scored_outputs``, then their ``final_logits``."""
    return [*scored_outputs(model), *(t for t in final_logits(model) if t)]


def reachable_cosine(refs: list[np.ndarray], got: list[np.ndarray]) -> float:
    """Upper bound of the cosine between the concatenated ``refs`` and outputs of which only the
    first ``len(got)`` are known (inf when ``refs`` are all zero).

    With ``a`` the references and ``b`` the outputs, split into the known samples ``s`` and the
    rest ``r``, the cosine ``(a_s.b_s + a_r.b_r) / (|a| |b|)`` is largest for ``b_r`` along
    ``a_r``, where (Cauchy-Schwarz) it is at most ``sqrt(max(a_s.b_s, 0)^2 / |b_s|^2 + |a_r|^2) / |a|``.
    """
    total = sum(products(r, r)[1] for r in refs)
    seen = dot = norm = 0.0
    for ref, out in zip(refs, got, strict=False):
        ab, aa, bb = products(ref, out)
        seen, dot, norm = seen + aa, dot + ab, norm + bb
    return bound_of_products(total, seen, dot, norm)


def bound_of_products(total: float, seen: float, dot: float, norm: float) -> float:
    """``reachable_cosine`` from sums: ``total`` = |a|^2, ``seen`` = |a_s|^2, ``dot`` = a_s.b_s, ``norm`` = |b_s|^2."""
    if total == 0.0:
        return np.inf
    first = max(dot, 0.0) ** 2 / norm if norm > 0 else 0.0
    return float(np.sqrt(first + max(total - seen, 0.0)) / np.sqrt(total))


def scoring_order(refs: list[list[np.ndarray]]) -> list[int]:
    """Sample indices, the largest share of the float outputs' energy first: a score that cannot
    reach its ``at_least`` shows it after fewer runs (the bound drops as the energy seen grows)."""
    if not refs:
        return []
    energy = np.array([[float(np.square(t, dtype=np.float64).sum()) for t in r] for r in refs])
    share = (energy / np.maximum(energy.sum(axis=0), 1e-300)).sum(axis=1)
    return [int(i) for i in np.argsort(-share, kind="stable")]


class Evaluator:
    """Scores threshold assignments on one session with fed calibration scales."""

    def __init__(self, optimized: ModelProto, plan: CalibrationPlan, weight_th: dict[str, np.ndarray],
                 feeds: list[dict], refs: list[list[np.ndarray]], built: dict[str, float]) -> None:
        """``built``: activation thresholds the session is built with. Fed grids replace them at run
        time, but the weight grids stay as they fix them (a grid widened so that a bias fits int32
        depends on the input's step): give the candidates' largest, which widen the least."""
        self.calibrated = build_calibrated_model(optimized, plan, built, weight_th, {})
        self.workers = score_workers(optimized)
        self.built = built
        self.fetched = scored_tensors(self.calibrated)
        self.refs = refs  # per sample, the float model's ``scored_tensors``
        self.known = KnownParts(self.calibrated, feeds, refs)  # what scores leave out of each output
        self._pieces, self.views = self._scored_pieces(refs)
        # Scores do numpy work between runs and the searches take turns with other sessions: no
        # spinning threads, no intermediates kept between runs.
        self.session = self._new_session()
        self.plan = plan
        self.feeds = feeds
        self._weights_alone: float | None = None
        self._energy = [[products(r, r)[1] for r in self._cut(sample, i)] for i, sample in enumerate(refs)]
        self._order = scoring_order([[self.known.without(t, k, i) for k, t in enumerate(r)]
                                     for i, r in enumerate(refs)])
        self._suspects: list[int] = []  # samples the last goal-checked score found furthest off, worst first
        self.seconds_per_run = 0.0  # of the last score
        self.complete = True  # whether the last score ran every sample (False: it is a bound)
        self.samples_run = 0  # by the last score
        self.units = np.zeros(0)  # the last score's ``goal_units``
        self.sample_units = np.ones(len(feeds))  # the last score's per sample

    def _new_session(self) -> object:
        return fetching_session(self.calibrated, self.fetched, feed_calibration=True, spinning=False,
                                memory_pattern=False, threads=session_threads(self.workers))

    def close(self) -> None:
        """Let go of the session (onnxruntime's copies of the weights) while another evaluator is built and
        compared with this one's scores; ``reopen`` builds it again if this one is kept."""
        self.session = None

    def reopen(self) -> None:
        if self.session is None:
            self.session = self._new_session()

    def _scored_pieces(self, refs: list[list[np.ndarray]]) -> tuple[list[tuple[int, object]], list]:
        """What a score compares, as (fetched index, flat slice / indices or None) pieces, and per model
        output its pieces and the piece of its logits (None: no final Softmax). The pieces an output
        joins (``output_pieces``) whose float values are all zero on the scoring samples are left out
        (their cosine means nothing)."""
        pieces: list[tuple[int, object]] = []
        views = []
        outputs = len(scored_outputs(self.calibrated))
        logit_index = iter(range(outputs, len(self.fetched)))
        fixed = _fixed_outputs(refs, outputs)
        for k, (logit, joined) in enumerate(zip(final_logits(self.calibrated), output_pieces(self.calibrated),
                                                strict=True)):
            if k in fixed:
                if logit:
                    next(logit_index)
                continue
            own = []
            if joined is not None and all(r[k].size == joined.labels.size for r in refs):
                for where in joined.indices():
                    if any(np.any(self.known.without(r[k], k, i).reshape(-1)[where]) for i, r in enumerate(refs)):
                        own.append(len(pieces))
                        pieces.append((k, where))
            if len(own) < 2:  # not joined, or only one piece carries anything: the whole output
                del pieces[len(pieces) - len(own):]
                own = [len(pieces)]
                pieces.append((k, None))
            j = None
            if logit:
                j = len(pieces)
                pieces.append((next(logit_index), None))
            views.append((own, j))
        return pieces, views

    def _cut(self, tensors: list[np.ndarray], sample: int) -> list[np.ndarray]:
        """``tensors`` (the fetched ones of one run of ``sample``) as the scored pieces, without their known parts."""
        return [self.known.without(tensors[k], k, sample) if cut is None
                else self.known.without(tensors[k], k, sample).reshape(-1)[cut] for k, cut in self._pieces]

    def _extra(self, thresholds: dict[str, float], bits: dict[str, int] | None = None,
               plan: CalibrationPlan | None = None) -> dict[str, np.ndarray]:
        """The fed grids: each activation's at its threshold, with its bits unless ``bits`` gives others (an
        asymmetric grid over the observed range of ``plan``, a copy of this evaluator's, if given)."""
        extra: dict[str, np.ndarray] = {}
        for p in (plan or self.plan).activations:
            extra.update(p.fed(thresholds[p.tensor], (bits or {}).get(p.tensor, p.bits)))
        return extra

    def all_int16(self) -> tuple[dict[str, float], dict[str, int]]:
        """Thresholds and bits giving every activation a 16-bit grid over its widest range (an int16
        grid's error is about 1/256 of an int8 one's). Scores that keep a grid off a tensor (the weights
        alone, sensitivity) feed it int16 rather than switching its fake quant off: a session with a
        switch per node ran PP-OCRv4 det at 640x640 in 0.30 s a sample against 0.13 s, and held a
        second copy of the model."""
        return dict(self.built), {p.tensor: 16 for p in self.plan.activations}

    def weights_alone(self) -> float:
        """The score with every activation int16 (``all_int16``): what the weights alone do to the
        output. Computed once (a GPTQ candidate's is the bias correction's starting point)."""
        if self._weights_alone is None:
            self._weights_alone = self.score(*self.all_int16())
        return self._weights_alone

    def score(self, thresholds: dict[str, float], bits: dict[str, int] | None = None,
              at_least: float | None = None, *, logits: bool = False,
              goals: np.ndarray | None = None, sample_goals: np.ndarray | None = None) -> float:
        """Output cosine over all evaluation samples at once, averaged over model outputs.

        ``logits``: an output a final Softmax gives scores the lower of its cosine and that of
        the logits (``final_logits``).

        One cosine over the concatenated samples, not a mean of per-sample cosines: a
        sample whose float output is ~0 (a detector on a picture without text) has a
        meaningless per-sample cosine that would otherwise swamp the score.

        With ``at_least``, the samples stop as soon as the score cannot reach it even if the
        rest matched the float model exactly; the value returned is then that bound (below
        ``at_least``), so a comparison with ``at_least`` decides as the full score would.

        ``goals`` (one per ``goal_units``) stop the samples the same way, as soon as one of the
        units cannot reach its goal. ``self.units`` holds the units' values after a full score (after
        a stopped one, bounds of which at least one is below its goal). ``sample_goals`` (one per sample)
        stop them as soon as a sample's own score is below its goal; ``self.sample_units`` holds the
        samples' scores (1 for a sample not run).
        """
        extra = self._extra(thresholds, bits)
        session = self.session
        total = np.sum(self._energy, axis=0)
        sums = np.zeros((3, len(self._pieces)))  # per scored piece: |ref|^2, ref.out and |out|^2 so far
        started = time.perf_counter()
        self.complete = False
        self.sample_units = np.ones(len(self.feeds))
        def run(i: int) -> list[np.ndarray]:
            return session.run(self.fetched, {**self.feeds[i], **extra})

        checked = goals is not None or sample_goals is not None or at_least is not None
        errors: dict[int, tuple[bool, float]] = {}  # per sample run: below its own goal, share of the error
        order = self._goal_order() if checked else self._order
        rows: dict[int, np.ndarray] = {}
        try:
            for done, (i, out) in enumerate(side_by_side(run, order, session, self.workers), start=1):
                self.samples_run = done
                own = rows[i] = self._products(i, out)
                sums += own
                self.sample_units[i] = self._score_of(own, logits)
                self.seconds_per_run = (time.perf_counter() - started) / done
                failed = sample_goals is not None and self.sample_units[i] < sample_goals[i]
                errors[i] = (failed, float(np.sum(_ratio(own[0] - 2 * own[1] + own[2], total))))
                if (failed or at_least is not None or goals is not None) and done < len(self.feeds):
                    def bound_of(k: int, s: np.ndarray = sums) -> float:
                        return bound_of_products(total[k], *s[:, k])

                    bound = self._combined(bound_of, logits)
                    if failed:
                        return bound
                    if goals is not None:
                        self.units = self.goal_units(bound_of, logits)
                        if np.any(self.units < goals):
                            return bound
                    if at_least is not None and bound < at_least:
                        return bound
        finally:
            if checked:  # the next such score runs these first
                self._suspects = [*sorted(errors, key=errors.get, reverse=True),
                                  *(j for j in self._suspects if j not in errors)]
        self.complete = True
        if order != self._order:  # the sums of ``_order``'s run, to the last bit: ties and goals decide alike
            sums = np.zeros_like(sums)
            for i in self._order:
                sums += rows[i]
        self.units = self.goal_units(lambda k: cosine_of_products(sums[1, k], sums[0, k], sums[2, k]), logits)
        return self._score_of(sums, logits)

    def _goal_order(self) -> list[int]:
        """The order of a score that may stop (goals, ``at_least``): the samples the last such score found
        below their own goals first, then those with the largest share of its error, then ``_order``.
        Demotions of more and more sensitive tensors fail on the same few samples (or on the output those
        samples carry most error in), as mix's trials and the losing methods do: run first, they stop a
        failing score after a run or two rather than most of the samples. The order decides only when a
        score stops, never what it decides: a score stops once its goals are out of reach whatever the
        rest of the samples give."""
        return [*self._suspects, *(i for i in self._order if i not in self._suspects)]

    def goal_units(self, cosine: Callable[[int], float], logits: bool) -> np.ndarray:
        """What must each keep its own share of a gain (``promote_to_int16``): a model output's score
        (``_combined``'s), or where an output joins several pieces, each piece's ``cosine`` (and its
        logits' with ``logits``). A mean lets one hide behind another: the goal came from the output
        int16 helps most, and another stayed at its int8 cosine (0.99990 where int16 gave 0.99998)."""
        units: list[float] = []
        for own, j in self.views:
            if len(own) == 1:
                value = cosine(own[0])
                units.append(min(value, cosine(j)) if logits and j is not None else value)
            else:
                units.extend(cosine(k) for k in own)
                if logits and j is not None:
                    units.append(cosine(j))
        return np.array(units)

    def _products(self, sample: int, out: list[np.ndarray]) -> np.ndarray:
        """Per scored piece (columns) of one sample's run: |ref|^2, ref.out and |out|^2 (rows)."""
        rows = [(self._energy[sample][k], *products(ref, got)[::2]) for k, (ref, got)
                in enumerate(zip(self._cut(self.refs[sample], sample), self._cut(out, sample), strict=True))]
        return np.array(rows, dtype=np.float64).T

    def _score_of(self, sums: np.ndarray, logits: bool) -> float:
        """The score from the summed ``_products`` of the samples run."""
        return self._combined(lambda k: cosine_of_products(sums[1, k], sums[0, k], sums[2, k]), logits)

    def cross_score(self, fold_thresholds: list[dict[str, float]],
                    fold_plans: list[CalibrationPlan] | None = None) -> float:
        """``score`` with sample ``j`` run at ``fold_thresholds[j % len(fold_thresholds)]`` (thresholds fitted
        without that sample's fold: ``calibrate._cross_validated``), and the asymmetric grids at the ranges
        observed without it if ``fold_plans`` (copies of this evaluator's plan) give them."""
        plans = fold_plans or [None] * len(fold_thresholds)
        extras = [self._extra(th, None, plan) for th, plan in zip(fold_thresholds, plans, strict=True)]
        session = self.session

        def run(i: int) -> list[np.ndarray]:
            return session.run(self.fetched, {**self.feeds[i], **extras[i % len(extras)]})

        sums = np.zeros((3, len(self._pieces)))
        for i, out in side_by_side(run, self._order, session, self.workers):  # summed in ``score``'s order
            sums += self._products(i, out)
        return self._score_of(sums, False)

    def method_scores(self, candidates: dict[str, dict[str, float]],
                      first: str | None = None) -> tuple[dict[str, float], set[str]]:
        """Each method's score (in ``candidates``' order), enough to pick the best of them.

        ``first`` (the best so far, if known) is scored first; each later method stops as soon as
        it cannot reach the best before it, and its value is then an upper bound below that best
        (the labels of such bounds are returned too). The best and its score are those a full
        scoring of every method gives, ties to the earlier method in ``candidates`` included.
        """
        scores: dict[str, float] = {}
        bounds: set[str] = set()
        for label in sorted(candidates, key=lambda m: m != first):
            scores[label] = self.score(candidates[label], at_least=max(scores.values(), default=None))
            if not self.complete:
                bounds.add(label)
        return {label: scores[label] for label in candidates}, bounds

    def _combined(self, cosine: Callable[[int], float], logits: bool) -> float:
        """The mean over model outputs of ``cosine`` (of a scored piece; an output of several pieces
        has their mean), with ``logits`` the lower of an output's and its logits'."""
        def output(own: list[int], j: int | None) -> float:
            value = float(np.mean([cosine(k) for k in own]))
            return min(value, cosine(j)) if logits and j is not None else value

        return float(np.mean([output(own, j) for own, j in self.views]))

    def refine(self, thresholds: dict[str, float], candidates: dict[str, dict[str, float]],
               best: float) -> tuple[dict[str, float], dict[str, str]]:
        """mix: per tensor, keep whichever method's threshold scores best (greedy, in graph order)."""
        current = copy.copy(thresholds)
        methods = {t: "default" for t in current}
        for p in progress(self.plan.activations, "mix search", "tensor"):
            for label, cand in candidates.items():
                if np.isclose(cand[p.tensor], current[p.tensor]):
                    continue
                trial = {**current, p.tensor: cand[p.tensor]}
                s = self.score(trial, at_least=best + 1e-6)
                if s > best + 1e-6:
                    best, current, methods[p.tensor] = s, trial, label
        log.info("mix calibration: output cosine %.6f", best)
        return current, methods

    def promote_to_int16(self, thresholds: dict[str, float], max_thresholds: dict[str, float], score: float,
                         noise: dict[str, float], *, target: float = PROMOTE_TARGET,
                         weights_only: float | None = None,
                         advice: Callable[[bool], str] | None = None) -> tuple[dict[str, int], dict[str, float]]:
        """Mixed precision: int16 only where the int8 grid costs the output.

        Start from every tensor at int16, then move tensors back to int8, least sensitive
        first, as long as every output (each piece of an output that joins several,
        ``goal_units``) keeps ``KEEP_GAIN`` of what int16 gains it over int8, and every sample
        ``SAMPLE_KEEP_GAIN`` of its own gain (or they stay above ``target``). Returns the int16
        tensors (tensor -> 16) and the thresholds with theirs widened to the max (a 16-bit grid
        needs no clipping).

        An output that comes out of a final Softmax (``final_logits``) is scored throughout by the
        lower of its cosine and that of the logits the Softmax reads: its probabilities saturate, so
        they hide logit errors that move an argmax (a CTC string, a class) where the margin is small.
        """
        # PP-OCRv6 tiny rec: probabilities at 0.99976 in-sample kept 58 of 72 tensors int16 and 77.5 % of
        # the held-out strings; scored with its logits (int8 0.93 against 0.986) the search kept 68 and
        # 87.5 % (docs/hb_mapper.md).
        logits = any(final_logits(self.calibrated))
        int8_score = self.score(thresholds, logits=logits)  # each unit's and each sample's own score
        int8, int8_samples = self.units, self.sample_units
        if np.all(int8 >= target):
            log.info("mixed precision: the search makes no tensor int16: with every tensor it decides on int8, each "
                     "output already scores %.6f or more on the calibration samples (its goal is %g); node_info or "
                     "set_model_output_int16 give a tensor int16 where an output needs more (a picture's levels)",
                     float(np.min(int8)), target)
            return {}, dict(thresholds)
        if logits:
            log.info("mixed precision: output cosine %.6f, %.6f counting the logits of the final Softmax "
                     "(the search scores the lower)", score, int8_score)
            score = int8_score
        candidates = self._int8_candidates(noise)
        if not candidates:
            return {}, dict(thresholds)
        all16 = dict.fromkeys(candidates, 16)
        # a 16-bit grid needs no clipping, and covers a bounded function's range (``int16_threshold``)
        wide = {t: self.plan.int16_threshold(t, max_thresholds[t]) for t in candidates}
        best16 = self.score({**thresholds, **wide}, all16, logits=logits)
        if best16 < ALL_INT16_FLOOR and weights_only is not None and 1 - weights_only >= (1 - best16) / 2:
            # The weights' grids, not the activations': keeping nodes in float would not help.
            log.warning("even with every activation int16 the output cosine on the calibration samples is only %.4f, "
                        "and int8 weights alone (float activations, nearest rounding) give %.4f: the loss is in the "
                        "weights' int8 grids (GPTQ and bias correction kept what they could); hmct-debugger's "
                        "weight sensitivity (node_type weight) names the layers, and a model trained for "
                        "quantization (QAT, calibration_type load) keeps its accuracy.%s", best16, weights_only,
                        advice(True) if advice else "")
        elif best16 < ALL_INT16_FLOOR:
            log.warning("even with every activation int16 the output cosine on the calibration samples is only %.4f: "
                        "the BPU's integer grids cannot hold some of this model's values (typically a Log, Pow or "
                        "division of values spanning many decades, such as a log-power spectrum computed in the "
                        "model); hmct-debugger's node sensitivity names the nodes, and run_on_cpu keeps them in "
                        "float.%s", best16, advice(False) if advice else "")
        gain = self.units - int8
        if np.all(gain <= 0):
            return {}, dict(thresholds)
        goals = np.where(gain > 0, np.minimum(target, int8 + KEEP_GAIN * gain), -np.inf)
        # Each sample keeps a share of its own gain too: the pooled score weighs the samples by their
        # output energy, and a picture with a little text (a few percent of the mean energy, or less)
        # loses its output to demotions that the others hide. A share, not the pooled 99 %: one sample's
        # score is noisier, and every sample at 99 % kept every tensor of PP-OCRv2 rec int16.
        # ... but never less than the pooled score may lose: a sample that int8 already scores nearly as well
        # as int16 would otherwise allow no loss at all (PP-OCRv6 tiny rec: most demotions failed on two
        # samples whose own gains were a few 1e-5).
        sample_gain = self.sample_units - int8_samples
        pooled = (1 - KEEP_GAIN) * (best16 - score)
        slack = np.maximum((1 - SAMPLE_KEEP_GAIN) * sample_gain, pooled)
        sample_goals = np.where(sample_gain > 0, np.minimum(target, self.sample_units - slack), -np.inf)
        ranked = self._rank_by_sensitivity(thresholds, wide, noise, logits,
                                           (pooled, np.where(sample_gain > 0, slack, np.inf)))
        current, current_score = dict(all16), best16
        step = max(1, len(ranked) // DEMOTE_STEPS)
        least_first = ranked[::-1]
        for start in progress(range(0, len(least_first), step), "int16 search: demotions", "group"):
            group = least_first[start:start + step]
            trial = {t: b for t, b in current.items() if t not in group}
            th = {**thresholds, **{t: wide[t] for t in trial}}
            s = self.score(th, trial, logits=logits, goals=goals, sample_goals=sample_goals)
            kept = self.complete and np.all(self.units >= goals) and np.all(self.sample_units >= sample_goals)
            log.debug("mixed precision: %d tensors back to int8 %s (score %s%.6f; outputs %s, samples %s below "
                      "their goals; %d of %d samples run)", len(group), "kept" if kept else "undone",
                      "" if self.complete else "at most ", s, np.flatnonzero(self.units < goals).tolist(),
                      np.flatnonzero(self.sample_units < sample_goals).tolist(), self.samples_run, len(self.feeds))
            if kept:
                current, current_score = trial, s
        chosen = {**thresholds, **{t: wide[t] for t in current}}
        already = sum(p.bits == 16 for p in self.plan.activations)  # int16 before the search (node_info, rules)
        log.info("mixed precision: %d of %d tensors calibrated as int16 (%d of them before the search), output "
                 "cosine %.6f (int8 %.6f, all int16 %.6f)", len(current) + already, len(self.plan.activations),
                 already, current_score, score, best16)
        return current, chosen

    def _rank_by_sensitivity(self, thresholds: dict[str, float], wide: dict[str, float], noise: dict[str, float],
                             logits: bool = False, allowance: tuple[float, np.ndarray] | None = None) -> list[str]:
        """int8 tensors ordered by what their int8 grid costs the output (measured), most costly first.

        The demotions start from every tensor int16: a tensor's cost is what going back to its int8 grid
        alone does to the output, on ``SENSITIVITY_SAMPLES`` samples: the one with the largest share of the
        output energy, and the one that can lose least (``allowance``: what the pooled score and each
        sample may lose; their share of it is the cost, the larger of the two). The pooled part counts each
        scored piece's squared error against its energy on every scoring sample, not on the few measured:
        a cosine over two samples swung by up to 0.04 on detector pieces nearly empty there (YOLOv8n class
        scores), more than any tensor costs. A tensor's gain over all-int8, measured instead until session
        35, is nothing where its consumer rounds to nearly the same grid again, yet demoting it is costly:
        groups of such tensors failed first. Unmeasured tensors fall back to the histogram's relative
        noise. A tensor's grid changes nothing before the first node reading it: each measurement reruns
        the model from the last of ``SUFFIXES`` cuts before that node.
        """
        candidates = self._int8_candidates(noise)
        measured = candidates[:SENSITIVITY_MAX_TENSORS]
        if not measured:
            return candidates
        pooled, slack = allowance if allowance is not None else (1.0, np.full(len(self.feeds), np.inf))
        samples = self._sensitivity_samples(slack)
        feeds = [self.feeds[i] for i in samples]
        demoted = {t: self.plan.activation(t).fed(thresholds[t], 8) for t in measured}
        model = fetching_model(self.calibrated, self.fetched, feed_calibration=True)
        first_reader = {}
        for i, node in enumerate(model.graph.node):
            for name in node.input:
                first_reader.setdefault(name, i)
        starts = {t: min((first_reader[f] for f in demoted[t] if f in first_reader), default=0) for t in measured}
        ordered = sorted(starts.values())
        # Cuts cost a few session builds: only where the measurements take a while.
        worth = self.seconds_per_run * len(feeds) * len(measured) >= SUFFIXES_WORTH_SECONDS
        suffixes = Suffixes(model, self.fetched,
                            [ordered[k * len(ordered) // SUFFIXES] for k in range(1, SUFFIXES)] if worth else [],
                            whole=self.session, threads=session_threads(self.workers))
        del model
        release_freed_memory()  # what building the suffixes' sessions took and dropped
        extra = self._extra({**thresholds, **{t: wide[t] for t in candidates}}, dict.fromkeys(candidates, 16))
        earlier = [suffixes.run({**f, **extra}) for f in feeds]
        base = self._errors(samples, [[e[o] for o in self.fetched] for e in earlier])
        share = self._score_shares(logits)
        energy = np.sum(self._energy, axis=0)
        # Per measured sample and piece, the weight of a squared error in the pooled loss (an estimate of
        # the loss over all scoring samples), and in that sample's own loss; near 1 a cosine is
        # 1 - error / (2 energy).
        whole = _ratio(share * len(self.feeds) / len(samples), 2 * energy * max(pooled, 1e-12))
        own = [_ratio(share, 2 * np.asarray(self._energy[i]) * slack[i]) if np.isfinite(slack[i]) else 0 * share
               for i in samples]
        cost = {}
        for k, t in enumerate(progress(measured, "int16 search: sensitivity", "tensor")):
            changed = {**extra, **demoted[t]}
            runs = [out for _, out in side_by_side(
                lambda j: suffixes.rerun(starts[t], {**feeds[j], **changed}, earlier[j]),  # noqa: B023 - used at once
                list(range(len(feeds))), suffixes.session_of(starts[t]), self.workers)]
            added = self._errors(samples, runs) - base
            cost[t] = max(float(whole @ added.sum(axis=0)), *(float(w @ a) for w, a in zip(own, added, strict=True)))
            # Runs of several sessions without a memory pattern leave their intermediates' memory free
            # but scattered over the heaps, which kept growing by about 190 MB over the measurements
            # (PP-OCRv6 small rec, 66 tensors). A trim costs tens of ms on such a heap, and the pages
            # come back at a cost: every few tensors bounds the growth at a small share of that.
            if k % TRIM_EVERY == TRIM_EVERY - 1:
                release_freed_memory()
        suffixes = earlier = runs = None  # their sessions and values
        release_freed_memory()
        return sorted(candidates, key=lambda t: (cost.get(t, -np.inf), noise[t]), reverse=True)

    def _int8_candidates(self, noise: dict[str, float]) -> list[str]:
        """The tensors the int16 search decides on: those of ``noise`` planned int8 that may be int16, noisiest
        first."""
        return sorted((t for t in noise if self.plan.activation(t).bits == 8 and t not in self.plan.int8_only),
                      key=noise.get, reverse=True)

    def _sensitivity_samples(self, slack: np.ndarray) -> list[int]:
        """The samples the sensitivity is measured on: the largest share of the output energy first (it
        stands for the pooled score), then the one that can lose least (``slack`` times its share of the
        energy), then the next largest shares."""
        chosen = self._order[:1]
        share = np.sum(np.array(self._energy) / np.maximum(np.sum(self._energy, axis=0), 1e-300), axis=1)
        tight = [i for i in np.argsort(slack * share, kind="stable") if np.isfinite(slack[i]) and i not in chosen]
        chosen += [int(i) for i in tight[:1]]
        chosen += [i for i in self._order if i not in chosen]
        return chosen[:min(SENSITIVITY_SAMPLES, len(self.feeds))]

    def _score_shares(self, logits: bool) -> np.ndarray:
        """Per scored piece, its share of the score: outputs count alike, the pieces of one output alike,
        and with ``logits`` a final Softmax's logits as much as its output."""
        share = np.zeros(len(self._pieces))
        for own, j in self.views:
            share[own] += 1.0 / len(self.views) / len(own)
            if logits and j is not None:
                share[j] += 1.0 / len(self.views)
        return share

    def _errors(self, samples: list[int], runs: list[list[np.ndarray]]) -> np.ndarray:
        """Per sample of ``samples`` (rows) and scored piece, the squared error of its run in ``runs``."""
        rows = [self._products(i, out) for i, out in zip(samples, runs, strict=True)]
        return np.array([r[0] - 2 * r[1] + r[2] for r in rows])


def _fixed_outputs(refs: list[list[np.ndarray]], outputs: int) -> set[int]:
    """The scored outputs whose float value is the same on every scoring sample (anchors or priors a model gives
    as an output, a Constant): no grid changes them, and a score averaging their cosine of 1 with the others'
    hid half of a classifier's error from the int16 search (the first ``outputs`` of each sample's tensors are the
    outputs). None when every output is so, or with one sample."""
    if len(refs) < 2:
        return set()
    fixed = {k for k in range(outputs) if all(np.array_equal(refs[0][k], r[k]) for r in refs[1:])}
    return fixed if len(fixed) < outputs else set()


def _ratio(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a / b, 0 where b is not positive."""
    return np.divide(a, b, out=np.zeros(np.broadcast(a, b).shape), where=b > 0)
