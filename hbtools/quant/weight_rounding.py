"""Weight rounding that minimizes each convolution's or matrix product's output error (GPTQ).

Rounding every weight to its nearest grid point minimizes the error of the weight,
not of the layer's output. With ``H = E[x xᵀ]`` over the layer's input patches
(streamed from the float model on calibration data), GPTQ / optimal brain
quantization rounds the weights of an output channel one input position at a time
and spreads each rounding error over the positions not yet rounded, weighted by
``H⁻¹``; the output error ``(W - Q) H (W - Q)ᵀ`` drops well below nearest rounding's.
Scales (the per-channel thresholds) are unchanged: only the integers move, by a
small offset from nearest rounding that the calibrated model stores next to the
weight (``HzCalibration``'s optional second input).

The Hessians take every output position of a layer (up to ``POSITIONS`` per sample, a
random sample beyond), in chunks, so memory does not depend on the picture size; the
rounding loop is over a layer's input positions, each step a vectorized update of all
output channels (and of all groups of a depthwise conv). A MatMul or Gemm is a 1x1 conv whose
positions are the rows of its input.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
from onnx import ModelProto, NodeProto
from scipy.linalg import lapack

from hbtools.graph.graph import GraphView
from hbtools.quant import grids
from hbtools.runs.progress import progress
from hbtools.runtime.blas import one_blas_thread
from hbtools.runtime.segments import byte_groups
from hbtools.runtime.session import fetching_session

# Output positions per sample and layer: every one up to here (a 480x480 input's stride-2 map), a
# sample beyond; a sample of 4096 made the rounding, and held-out accuracy, swing with the draw.
POSITIONS = 65536
CHUNK_BYTES = 32_000_000  # float64 patches held at once
# A Hessian from fewer positions than this many per input of a patch is nearly singular: GPTQ then
# fits the rounding to those few patches (a transformer MatMul over 8 samples of 40 tokens, a
# 3x3x256 conv on a 15x15 map), and other inputs lose what it gained. Such weights keep nearest.
POSITIONS_PER_INPUT = 4
# Multiply-accumulates one sample's patches may cost a layer's Hessian (positions x K² x groups): beyond it the
# positions are sampled down to fit. The densest layer of the corpus costs 1.07e10 (a 3x3x96 conv on a 120x120 map,
# PP-OCR det at 480); a 3x3x256 conv on a 160x160 map (CRAFT at 640) cost 1.4e11, and GPTQ ran for many minutes.
HESSIAN_PRODUCTS = 1 << 34
HESSIAN_BYTES = 256_000_000  # float64 Hessians held at once (more layers take another pass over the samples)
DAMPING = 0.01  # of the mean diagonal, keeps H invertible where inputs are (nearly) constant
QMAX = grids.qmax_for(grids.WEIGHT_BITS)
BLOCK = 128  # columns rounded between two matrix-product updates of the rest


@dataclass
class ConvGeometry:
    group: int
    kernel: tuple[int, int]
    strides: tuple[int, int]
    dilations: tuple[int, int]
    pads: tuple[int, int, int, int]
    dense: bool = False  # a MatMul / Gemm: every row of the input's last axis is one position

    @classmethod
    def of(cls, node: NodeProto, view: GraphView) -> ConvGeometry:
        if node.op_type != "Conv":
            return cls(1, (1, 1), (1, 1), (1, 1), (0, 0, 0, 0), dense=True)
        a = view.attrs(node)
        w_shape = view.const(node.input[1]).shape
        pads = tuple(a.get("pads", [0, 0, 0, 0]))
        return cls(int(a.get("group", 1)), tuple(a.get("kernel_shape", w_shape[2:])),
                   tuple(a.get("strides", [1, 1])), tuple(a.get("dilations", [1, 1])), pads)


def roundable(node: NodeProto, view: GraphView) -> bool:
    """2-D Conv with a constant 4-D weight and explicit padding (what ``patches`` handles), or a MatMul /
    Gemm (without transA) with a constant 2-D weight."""
    if node.op_type not in ("Conv", "MatMul", "Gemm") or len(node.input) < 2 or not view.is_const(node.input[1]):
        return False
    a = view.attrs(node)
    if node.op_type != "Conv":
        return view.const(node.input[1]).ndim == 2 and not a.get("transA", 0)
    return view.const(node.input[1]).ndim == 4 and a.get("auto_pad", b"NOTSET") in (b"NOTSET", "NOTSET")


def _by_output_channel(node: NodeProto, view: GraphView, w: np.ndarray) -> np.ndarray:
    """A weight as [O, C/g, kh, kw]: a conv's as it is, a MatMul's [K, N] and a Gemm's as [N, K, 1, 1]."""
    if node.op_type == "Conv":
        return w
    rows = w if node.op_type == "Gemm" and view.attrs(node).get("transB", 0) else w.T
    return rows[:, :, None, None]


def weight_offsets(node: NodeProto, view: GraphView, thresholds: np.ndarray, hessian: np.ndarray) -> np.ndarray:
    """GPTQ's offsets (``rounding_offsets``) for ``node``'s weight, in the weight's own layout."""
    w = view.const(node.input[1])
    group = int(view.attrs(node).get("group", 1)) if node.op_type == "Conv" else 1
    offsets = rounding_offsets(_by_output_channel(node, view, w), thresholds, group, hessian)
    if node.op_type == "Conv":
        return offsets
    rows = offsets[:, :, 0, 0]
    return rows if node.op_type == "Gemm" and view.attrs(node).get("transB", 0) else np.ascontiguousarray(rows.T)


def patches(x: np.ndarray, geo: ConvGeometry, rng: np.random.Generator, positions: int) -> Iterator[np.ndarray]:
    """Input patches of one sample ``x`` [C, H, W] at every output position (sampled where there are
    more than ``positions``), as float64 chunks [group, C/group·kh·kw, P] of at most ``CHUNK_BYTES``."""
    if geo.dense:
        rows = x.reshape(-1, x.shape[-1])
        chosen = np.arange(len(rows)) if len(rows) <= positions else rng.choice(len(rows), positions, replace=False)
        step = max(1, CHUNK_BYTES // (8 * x.shape[-1]))
        for start in range(0, chosen.size, step):
            yield rows[chosen[start:start + step]].astype(np.float64).T[None]
        return
    kh, kw = geo.kernel
    dh, dw = geo.dilations
    top, left, bottom, right = geo.pads
    x = np.pad(x, ((0, 0), (top, bottom), (left, right)))
    windows = np.lib.stride_tricks.sliding_window_view(x, ((kh - 1) * dh + 1, (kw - 1) * dw + 1), axis=(1, 2))
    windows = windows[:, ::geo.strides[0], ::geo.strides[1], ::dh, ::dw]  # C, Ho, Wo, kh, kw (a view)
    c, ho, wo = windows.shape[:3]
    chosen = np.arange(ho * wo) if ho * wo <= positions else rng.choice(ho * wo, size=positions, replace=False)
    g = geo.group
    step = max(1, CHUNK_BYTES // (8 * c * kh * kw))
    for start in range(0, chosen.size, step):
        rows, cols = np.divmod(chosen[start:start + step], wo)
        picked = windows[:, rows, cols]  # C, P, kh, kw (float32)
        # one float64 copy, already in the [group, C/group·kh·kw, P] order (a transposed copy and a cast were two)
        yield picked.reshape(g, c // g, rows.size, kh * kw).transpose(0, 1, 3, 2).astype(
            np.float64, order="C").reshape(g, -1, rows.size)


def input_hessians(optimized: ModelProto, layers: list[NodeProto], feeds: Sequence[dict],
                   positions: int = POSITIONS, seed: int = 0) -> Iterator[tuple[str, np.ndarray]]:
    """Per layer (a roundable Conv, MatMul or Gemm, by name), ``E[x xᵀ]`` of its input patches,
    [group, K, K], streamed over ``feeds``; only where the samples give at least
    ``POSITIONS_PER_INPUT`` positions per input of a patch (K).

    The float64 Hessians of a group of layers are held together while the samples run (a 3x3x512
    conv's alone is 170 MB); groups stay under ``HESSIAN_BYTES``, each a pass over ``feeds``, and
    each Hessian is handed on as its group completes, so memory does not grow with the depth of
    the model.
    """
    view = GraphView(optimized)
    geos = {n.name: ConvGeometry.of(n, view) for n in layers}
    limits = {n.name: _position_limit(n, view, positions) for n in layers}
    # A layer the samples cannot give enough positions would be dropped after its pass; its Hessian is not
    # built (a classifier's dense layer over a flattened 7x7x512 map: a 25088² Hessian, 5 GB, for 8 rows).
    layers = [n for n in layers if _reachable(n, view, geos[n.name], limits[n.name], len(feeds))]
    groups = _hessian_groups(layers, view)
    for k, group in enumerate(groups):
        names = list(dict.fromkeys(n.input[0] for n in group))
        session = fetching_session(optimized, names)
        rng = np.random.default_rng(seed if k == 0 else [seed, k])
        sums: dict[str, np.ndarray] = {}
        seen: dict[str, int] = {}
        count = 0
        for feed in progress(feeds, f"GPTQ Hessians {k + 1}/{len(groups)}", "sample"):
            with one_blas_thread():  # many small products: OpenBLAS's threads stall beside any busy process
                count += _accumulate(group, geos, session.run(names, feed), names, sums, seen, rng, limits)
        for node in group:
            if node.name in sums:
                hessian = sums.pop(node.name) / max(count, 1)
                if seen[node.name] >= POSITIONS_PER_INPUT * hessian.shape[-1]:
                    yield node.name, hessian


def _accumulate(group: list[NodeProto], geos: dict, fetched: list[np.ndarray], names: list[str],
                sums: dict[str, np.ndarray], seen: dict[str, int], rng: np.random.Generator,
                limits: dict[str, int]) -> int:
    """Add one feed's input products to each layer's sum (``sums``, positions in ``seen``); its sample count."""
    values = dict(zip(names, fetched, strict=True))
    for node in group:
        x = values[node.input[0]]
        if geos[node.name].dense and x.ndim <= 2:
            # Each row of a 2-D input is a sample of one position: their products are summed in
            # one matrix product, not a K x K outer product (and Python step) per row.
            sums[node.name] = sums.get(node.name, 0.0) + _row_products(x)
            seen[node.name] = seen.get(node.name, 0) + (len(x) if x.ndim == 2 else 1)
            continue
        for sample in x:  # a batch contributes each of its samples
            h, taken = 0.0, 0
            for cols in patches(sample, geos[node.name], rng, limits[node.name]):
                h = h + np.matmul(cols, cols.transpose(0, 2, 1))
                taken += cols.shape[2]
            sums[node.name] = sums.get(node.name, 0.0) + h / max(taken, 1)
            seen[node.name] = seen.get(node.name, 0) + taken
    return len(values[names[0]]) if names else 1


def _patch_size(node: NodeProto, view: GraphView) -> tuple[int, int]:
    """(groups, inputs per patch K) of a roundable layer: its Hessian is [groups, K, K]."""
    w = _by_output_channel(node, view, view.const(node.input[1]))
    group = int(view.attrs(node).get("group", 1)) if node.op_type == "Conv" else 1
    return max(group, 1), int(np.prod(w.shape[1:]))


def _position_limit(node: NodeProto, view: GraphView, positions: int) -> int:
    """Positions per sample for ``node``'s Hessian: ``positions``, fewer where they would cost more than
    ``HESSIAN_PRODUCTS`` (wide patches on a large map)."""
    group, k = _patch_size(node, view)
    return max(1, min(positions, HESSIAN_PRODUCTS // (k * k * group)))


def _reachable(node: NodeProto, view: GraphView, geo: ConvGeometry, positions: int, feeds: int) -> bool:
    """Whether ``feeds`` samples can give ``node`` the ``POSITIONS_PER_INPUT`` positions per input of a patch
    that ``input_hessians`` asks of its Hessian, counted as it counts them (True where shapes are unknown)."""
    x = view.shapes.get(node.input[0])
    inputs = _patch_size(node, view)[1]
    if not x or any(not isinstance(d, int) or d <= 0 for d in x):
        return True
    if geo.dense and len(x) <= 2:
        per_feed = x[0] if len(x) == 2 else 1  # each row one position
    elif geo.dense:
        per_feed = x[0] * min(int(np.prod(x[1:-1])), positions)  # per sample, the rows of its last axis
    else:
        y = view.shapes.get(node.output[0])
        if not y or len(y) != 4 or any(not isinstance(d, int) or d <= 0 for d in y):
            return True
        per_feed = x[0] * min(y[2] * y[3], positions)
    return per_feed * feeds >= POSITIONS_PER_INPUT * inputs


def _row_products(x: np.ndarray) -> np.ndarray:
    """``Σ r rᵀ`` over the rows ``r`` of ``x`` [M, K] (a 1-D ``x`` is one row), as [1, K, K] in float64."""
    rows = x.reshape(-1, x.shape[-1])
    step = max(1, CHUNK_BYTES // (8 * rows.shape[1]))
    h = np.zeros((1, rows.shape[1], rows.shape[1]))
    for start in range(0, len(rows), step):
        chunk = rows[start:start + step].astype(np.float64)
        h += (chunk.T @ chunk)[None]
    return h


def _hessian_groups(layers: list[NodeProto], view: GraphView) -> list[list[NodeProto]]:
    """``layers`` in order, cut into groups whose Hessians take at most ``HESSIAN_BYTES`` together."""
    sizes = [8 * group * k**2 for group, k in (_patch_size(node, view) for node in layers)]
    return byte_groups(layers, sizes, HESSIAN_BYTES)


def rounding_offsets(w: np.ndarray, thresholds: np.ndarray, group: int, hessian: np.ndarray) -> np.ndarray:
    """int8 offsets from nearest rounding of conv weight ``w`` [O, C/g, kh, kw] chosen by GPTQ.

    ``clip(round(w / s) + offset, -127, 127)`` are the weight's integers, ``s`` the
    per-output-channel scale of ``thresholds``.
    """
    out_channels = w.shape[0]
    k = int(np.prod(w.shape[1:]))
    steps = grids.scales_for(thresholds, grids.WEIGHT_BITS)  # float32, as the calibration node stores them
    scale = steps.astype(np.float64).reshape(group, out_channels // group, 1)
    work = w.astype(np.float64).reshape(group, out_channels // group, k).copy()
    # Nearest as the lowering rounds (float32 division): the offsets are taken from these integers.
    nearest = grids.quantize(w.reshape(group, out_channels // group, k), steps.reshape(group, -1, 1),
                             grids.WEIGHT_BITS).astype(np.float64)
    h = np.array(hessian, dtype=np.float64)
    diag = np.diagonal(h, axis1=1, axis2=2).copy()
    dead = diag <= 0  # inputs that are always zero: their weights do not matter
    damp = DAMPING * np.maximum(diag.mean(axis=1), 1e-12)
    h[:, np.arange(k), np.arange(k)] += damp[:, None]
    upper = upper_cholesky_of_inverse(h)
    del h
    chosen = np.empty_like(work)
    # Lazy batch updates (GPTQ's blocks): a rounding error reaches the columns of its own block at
    # once and the later columns in one matrix product per block, the same sums without sweeping
    # the whole weight once per column (that sweep took over a minute on one 3x3x512 conv).
    for start in range(0, k, BLOCK):
        stop = min(start + BLOCK, k)
        block = work[:, :, start:stop]
        errors = np.empty_like(block)
        for j in range(stop - start):
            col = block[:, :, j]
            q = np.clip(np.round(col / scale[:, :, 0]), -QMAX, QMAX)
            chosen[:, :, start + j] = q
            err = (col - q * scale[:, :, 0]) / upper[:, start + j, start + j][:, None]
            block[:, :, j + 1:] -= err[:, :, None] * upper[:, None, start + j, start + j + 1:stop]
            errors[:, :, j] = err
        if stop < k:
            work[:, :, stop:] -= np.matmul(errors, upper[:, start:stop, stop:])
    chosen = np.where(dead[:, None, :], nearest, chosen)
    return (chosen - nearest).astype(np.int8).reshape(w.shape)


def upper_cholesky_of_inverse(h: np.ndarray) -> np.ndarray:
    """Per group, the upper triangular ``U`` with ``UᵀU = H⁻¹``: row by row, how a rounding error
    propagates to the positions not yet rounded.

    With ``P`` the reversal of the positions and ``L`` the lower Cholesky factor of ``PHP``,
    ``U = P L⁻¹ P``: one Cholesky factorization and one triangular inverse, a third of the work
    of inverting ``H`` and factorizing the inverse (GPTQ's recipe), which dominated large layers.
    """
    lower = np.linalg.cholesky(h[:, ::-1, ::-1])
    for factor in lower:
        # In place: the transpose of a C-ordered lower factor is a Fortran-ordered upper one, what
        # LAPACK overwrites without a copy (a 3x3x512 conv's factor is 170 MB).
        inverse, info = lapack.dtrtri(factor.T, lower=0, overwrite_c=1)
        if info:
            raise np.linalg.LinAlgError(f"triangular inverse failed ({info})")
        if not np.shares_memory(inverse, factor):
            factor[...] = inverse.T
    return lower[:, ::-1, ::-1]


def output_error(w: np.ndarray, integers: np.ndarray, thresholds: np.ndarray, group: int,
                 hessian: np.ndarray) -> float:
    """``trace((W - Q) H (W - Q)ᵀ)``: the layer's summed mean squared output error."""
    shape = (group, w.shape[0] // group, -1)
    scale = grids.scales_for(thresholds, grids.WEIGHT_BITS).astype(np.float64).reshape(group, w.shape[0] // group, 1)
    diff = w.astype(np.float64).reshape(shape) - integers.astype(np.float64).reshape(shape) * scale
    return float(np.einsum("gok,gkl,gol->", diff, hessian, diff))
