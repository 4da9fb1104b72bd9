"""Exact integer kernels in numpy for the reference implementations of the Hz ops.

Products are summed in float64 through BLAS: every partial sum of integer
products is itself an integer, and float64 holds integers exactly up to 2**53,
so the result equals int64 accumulation whenever ``exact_bound`` stays below
that. Callers pass the bound they can prove from the data; above it the kernels
fall back to int64 arithmetic (slow, but never wrong).

Layouts follow ONNX: activations ``N, C, spatial...``; Conv weights
``Cout, Cin/group, kernel...``; ConvTranspose weights ``Cin, Cout/group, kernel...``.
"""

from __future__ import annotations

import itertools

import numpy as np

EXACT_LIMIT = 2.0**53


def _accumulator_dtype(bound: float) -> type:
    return np.float64 if bound < EXACT_LIMIT else np.int64


def max_abs(x: np.ndarray) -> float:
    return float(np.abs(x.astype(np.int64)).max()) if x.size else 0.0


def product_bound(x: np.ndarray, w: np.ndarray, reduce_axes: tuple[int, ...]) -> float:
    """Largest |sum of x * w| over any output: max|x| times the largest per-output sum of |w|."""
    if not x.size or not w.size:
        return 0.0
    return max_abs(x) * float(np.abs(w.astype(np.int64)).sum(axis=reduce_axes).max())


def matmul(a: np.ndarray, b: np.ndarray, bound: float) -> np.ndarray:
    """Exact ``a @ b`` of integer arrays (numpy broadcasting rules)."""
    acc = _accumulator_dtype(bound)
    return np.matmul(a.astype(acc), b.astype(acc))


def resolve_pads(
    auto_pad: str, in_shape: list[int], kernel: list[int], strides: list[int], dilations: list[int],
    pads: list[int] | None,
) -> tuple[list[int], list[int]]:
    """Begin and end padding per spatial axis for Conv / pooling (ONNX ``auto_pad`` rules)."""
    n = len(kernel)
    if auto_pad in ("", "NOTSET"):
        p = list(pads) if pads else [0] * (2 * n)
        return p[:n], p[n:]
    if auto_pad == "VALID":
        return [0] * n, [0] * n
    begin, end = [], []
    for size, k, s, d in zip(in_shape, kernel, strides, dilations, strict=True):
        out = -(-size // s)
        total = max(0, (out - 1) * s + (k - 1) * d + 1 - size)
        small, large = total // 2, total - total // 2
        begin.append(small if auto_pad == "SAME_UPPER" else large)
        end.append(large if auto_pad == "SAME_UPPER" else small)
    return begin, end


def _tap_slices(offsets: tuple[int, ...], strides: list[int], out_shape: list[int]) -> tuple[slice, ...]:
    return tuple(slice(o, o + s * (n - 1) + 1, s) for o, s, n in zip(offsets, strides, out_shape, strict=True))


def conv(
    x: np.ndarray, w: np.ndarray, *, strides: list[int], pads_begin: list[int], pads_end: list[int],
    dilations: list[int], group: int, bound: float,
) -> np.ndarray:
    """Exact grouped N-d convolution with zero padding; float64 (exact) or int64 result.

    One matrix product per kernel tap: memory stays at the size of the output
    instead of an im2col copy of the input.
    """
    acc = _accumulator_dtype(bound)
    n, c, *size = x.shape
    cout, cg, *kernel = w.shape
    og = cout // group
    xp = np.pad(x.astype(acc), [(0, 0), (0, 0), *zip(pads_begin, pads_end, strict=True)])
    out_shape = [
        (s + pb + pe - d * (k - 1) - 1) // st + 1
        for s, pb, pe, d, k, st in zip(size, pads_begin, pads_end, dilations, kernel, strides, strict=True)
    ]
    if min(out_shape, default=1) <= 0:
        raise ValueError(f"convolution output would be empty: input {x.shape}, kernel {kernel}")
    depthwise = cg == 1 and og == 1
    wk = w.astype(acc)
    if not depthwise:
        wk = wk.reshape(group, og, cg, *kernel)
    out = np.zeros([n, cout, *out_shape] if depthwise else [n, group, og, int(np.prod(out_shape))], dtype=acc)
    for tap in itertools.product(*(range(k) for k in kernel)):
        offsets = tuple(t * d for t, d in zip(tap, dilations, strict=True))
        patch = xp[(slice(None), slice(None), *_tap_slices(offsets, strides, out_shape))]
        if depthwise:
            out += patch * wk[(slice(None), 0, *tap)].reshape(1, cout, *[1] * len(out_shape))
        else:
            cols = patch.reshape(n, group, cg, -1)
            out += np.matmul(wk[(slice(None), slice(None), slice(None), *tap)], cols)
    return out.reshape(n, cout, *out_shape)


def conv_transpose(
    x: np.ndarray, w: np.ndarray, *, strides: list[int], pads_begin: list[int], pads_end: list[int],
    dilations: list[int], output_padding: list[int], group: int, bound: float,
) -> np.ndarray:
    """Exact grouped N-d transposed convolution: each kernel tap scatters into a strided slice."""
    acc = _accumulator_dtype(bound)
    n, cin, *size = x.shape
    _, og, *kernel = w.shape
    cg = cin // group
    # A negative end pad grows the output (conv_transpose_pads): the scatter target holds those rows too.
    full = [
        st * (s - 1) + d * (k - 1) + 1 + op + max(0, -e)
        for s, st, d, k, op, e in zip(size, strides, dilations, kernel, output_padding, pads_end, strict=True)
    ]
    out = np.zeros([n, group, og, *full], dtype=acc)
    xs = x.astype(acc).reshape(n, group, cg, -1)
    # (Cin, Og, k...) -> per group (G, Og, Cg, k...) so a tap is a (G, Og, Cg) matrix.
    wk = w.astype(acc).reshape(group, cg, og, *kernel).swapaxes(1, 2)
    for tap in itertools.product(*(range(k) for k in kernel)):
        offsets = tuple(t * d for t, d in zip(tap, dilations, strict=True))
        contrib = np.matmul(wk[(slice(None), slice(None), slice(None), *tap)], xs)
        out[(slice(None), slice(None), slice(None), *_tap_slices(offsets, strides, size))] += contrib.reshape(
            n, group, og, *size
        )
    crop = tuple(slice(b, f - max(0, e)) for b, e, f in zip(pads_begin, pads_end, full, strict=True))
    out = out[(slice(None), slice(None), slice(None), *crop)]
    if min(out.shape[3:], default=1) <= 0:
        raise ValueError(f"transposed convolution output would be empty: input {x.shape}, kernel {kernel}")
    return np.ascontiguousarray(out.reshape(n, group * og, *out.shape[3:]))


def conv_transpose_pads(
    auto_pad: str, in_shape: list[int], kernel: list[int], strides: list[int], dilations: list[int],
    output_padding: list[int], pads: list[int] | None, output_shape: list[int] | None,
) -> tuple[list[int], list[int]]:
    """Begin/end cropping of ConvTranspose, from ``pads`` or derived from ``output_shape``/``auto_pad``.

    An ``output_shape`` larger than the natural output gives a negative end: that many zero rows (columns)
    follow the natural output, as onnxruntime adds them. Under ``auto_pad`` onnxruntime gives the natural
    output instead of a larger one, so the padding stays at least 0 there."""
    n = len(kernel)
    if output_shape is None and auto_pad in ("", "NOTSET", "VALID"):
        p = list(pads) if pads and auto_pad != "VALID" else [0] * (2 * n)
        return p[:n], p[n:]
    begin, end = [], []
    for i in range(n):
        target = output_shape[-n:][i] if output_shape else in_shape[i] * strides[i]
        total = strides[i] * (in_shape[i] - 1) + output_padding[i] + (kernel[i] - 1) * dilations[i] + 1 - target
        if total < 0 and output_shape:
            begin.append(0)
            end.append(total)
            continue
        total = max(0, total)
        small, large = total // 2, total - total // 2
        begin.append(small if auto_pad == "SAME_UPPER" else large)
        end.append(large if auto_pad == "SAME_UPPER" else small)
    return begin, end
