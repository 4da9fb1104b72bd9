"""onnxruntime's fused transformer ops written as the standard ops they stand for.

onnxruntime's transformer optimizer (``onnxruntime.transformers.optimizer``) joins a BERT layer's
Q/K/V projections, scaled dot product and softmax into ``Attention``, a cross attention's into
``MultiHeadAttention``, and the word, position and segment embeddings with the layer norm after them
into ``EmbedLayerNormalization``, LLaMA-style rotary position embeddings into ``RotaryEmbedding``.
onnx's shape inference knows none of them and the BPU has no kernel
for them: the whole attention ran on the CPU. Written as MatMul / Reshape / Transpose / Softmax (and
Gather / Add / the spelled-out layer norm), they are what a PyTorch export would have been.

Not written (the node stays onnxruntime's, on the CPU, with the reason in the CPU node table): a mask_index
of end and start positions, past key / value caches, Attention's own rotary embeddings, rotary positions given at
run time, packed Q/K/V inputs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from onnx import helper

if TYPE_CHECKING:
    from collections.abc import Callable

    from hbtools.graph.contrib import Writer
    from hbtools.graph.graph import GraphView


def _given(node_inputs: list[str], k: int) -> bool:
    return len(node_inputs) > k and bool(node_inputs[k])


def _heads(w: Writer, x: str, heads: int, keys: bool = False) -> str:
    """[batch, length, heads * size] as [batch, heads, length, size] ([batch, heads, size, length] for keys)."""
    split = w.op("Reshape", [x, w.const(np.array([0, 0, heads, -1], np.int64))])
    return w.op("Transpose", [split], perm=[0, 2, 3, 1] if keys else [0, 2, 1, 3])


def _causal(w: Writer, length: int, fill: float) -> str:
    """The additive mask onnxruntime's ``unidirectional`` attention applies: ``fill`` above the diagonal."""
    return w.const(np.triu(np.full((length, length), fill, np.float32), 1))


def _attend(w: Writer, q: str, k: str, v: str, heads: int, biases: list[str]) -> None:
    """softmax(q k^T + biases) v over the heads of ``q``, ``k``, ``v`` ([batch, length, hidden], ``q``
    already scaled), into the node's output."""
    scores = w.op("MatMul", [_heads(w, q, heads), _heads(w, k, heads, keys=True)])
    for bias in biases:
        scores = w.op("Add", [scores, bias])
    probs = w.op("Softmax", [scores], axis=-1)
    context = w.op("Transpose", [w.op("MatMul", [probs, _heads(w, v, heads)])], perm=[0, 2, 1, 3])
    w.op("Reshape", [context, w.const(np.array([0, 0, -1], np.int64))], w.node.output[0])


def _masks(w: Writer, a: dict, ins: list[str], bias_input: int, lengths: tuple[int | None, int | None]) -> \
        list[str] | str:
    """The additive attention bias input and the causal mask, or why they cannot be written."""
    biases = [ins[bias_input]] if _given(ins, bias_input) else []
    if a.get("unidirectional", 0):
        rows, cols = lengths
        if rows is None or rows != cols:
            return "it is causal (unidirectional) over a sequence length not known before run time"
        biases.append(_causal(w, rows, float(a.get("mask_filter_value", -10000.0))))
    return biases


def _unsqueeze(w: Writer, x: str, axes: list[int]) -> str:
    if w.opset >= 13:
        return w.op("Unsqueeze", [x, w.const(np.array(axes, np.int64))])
    return w.op("Unsqueeze", [x], axes=axes)


def _mask_bias(w: Writer, a: dict, mask: str, rank: int, length: int | None) -> str:
    """Attention's mask_index as the additive bias onnxruntime makes of it, ``mask_filter_value`` on the keys
    masked: a 0 / 1 mask [batch, keys] or [batch, queries, keys] (0 masks), or the end position of each
    sequence [batch] (keys from it on are masked)."""
    if rank == 1:
        kept = w.op("Less", [w.const(np.arange(length, dtype=np.int32)[None]), _unsqueeze(w, mask, [1])])
        rank = 2
    else:
        kept = w.op("Greater", [mask, w.const(np.array(0, np.int32))])
    masked = w.op("Cast", [w.op("Not", [kept])], to=helper.np_dtype_to_tensor_dtype(np.dtype(np.float32)))
    bias = w.op("Mul", [masked, w.const(float(a.get("mask_filter_value", -10000.0)))])
    return _unsqueeze(w, bias, [1, 2] if rank == 2 else [1])


def attention(w: Writer, a: dict, view: GraphView) -> str | None:
    """com.microsoft Attention: one input projected to Q, K, V by one weight [hidden_in, q + k + v]."""
    ins = list(w.node.input)
    for k, what in ((4, "a past key / value cache"), (6, "a past sequence length")):
        if _given(ins, k):
            return f"it takes {what}"
    mask_shape = view.shapes.get(ins[3]) if _given(ins, 3) else []
    x_shape = view.shapes.get(ins[0]) or [None, None]
    mask_rank = len(mask_shape or [])
    if mask_shape is None or mask_rank not in (0, 1, 2, 3) or \
            (mask_rank == 1 and (mask_shape[0] != x_shape[0] or x_shape[1] is None)):
        return ("it takes a padding mask (mask_index) other than a raw [batch, keys] or [batch, queries, keys] "
                "mask or the end positions [batch]")
    if a.get("do_rotary", 0):
        return "it applies rotary embeddings"
    weights = view.const(ins[1])
    bias = view.const(ins[2]) if _given(ins, 2) else np.zeros(weights.shape[-1:] if weights is not None else 0)
    if weights is None or weights.ndim != 2 or bias is None:
        return "its weights or bias are not constants"
    heads = int(a["num_heads"])
    sizes = list(a.get("qkv_hidden_sizes", [weights.shape[1] // 3] * 3))
    if sum(sizes) != weights.shape[1] or sizes[0] != sizes[1] or any(s % heads for s in sizes):
        return f"its Q / K / V sizes {sizes} do not split its weight {list(weights.shape)} over {heads} heads"
    scale = float(a.get("scale", 0.0)) or 1.0 / np.sqrt(sizes[0] // heads)
    x = ins[0]
    ends = np.cumsum([0, *sizes])
    # The scale folded into Q's projection: one Mul fewer on the way to the scores.
    projected = [w.op("Add", [w.op("MatMul", [x, w.const(weights[:, lo:hi] * (scale if j == 0 else 1.0))]),
                              w.const(bias[lo:hi] * (scale if j == 0 else 1.0))])
                 for j, (lo, hi) in enumerate(zip(ends[:-1], ends[1:], strict=True))]
    length = x_shape[1]
    biases = _masks(w, a, ins, 5, (length, length))
    if isinstance(biases, str):
        return biases
    _attend(w, *projected, heads, biases + ([_mask_bias(w, a, ins[3], mask_rank, length)] if mask_rank else []))
    return None


def multi_head_attention(w: Writer, a: dict, view: GraphView) -> str | None:
    """com.microsoft MultiHeadAttention on projected query, key and value ([batch, length, hidden] each)."""
    ins = list(w.node.input)
    if not _given(ins, 1) or not _given(ins, 2):
        return "its query packs Q, K and V (no key / value inputs)"
    for k, what in ((4, "a key padding mask"), (6, "a past key cache"), (7, "a past value cache")):
        if _given(ins, k):
            return f"it takes {what}"
    shapes = [view.shapes.get(t) for t in ins[:3]]
    if any(s is None or len(s) != 3 or s[-1] is None for s in shapes):
        return "its query, key and value are not all [batch, length, hidden] of known hidden sizes"
    heads = int(a["num_heads"])
    q, k, v = ins[:3]
    if _given(ins, 3):
        bias = view.const(ins[3])
        if bias is None:
            return "its bias is not a constant"
        ends = np.cumsum([0, *(s[-1] for s in shapes)])
        q, k, v = (w.op("Add", [t, w.const(bias[lo:hi])]) for t, lo, hi in zip((q, k, v), ends[:-1], ends[1:],
                                                                              strict=True))
    scale = float(a.get("scale", 0.0)) or 1.0 / np.sqrt(shapes[0][-1] // heads)
    q = w.op("Mul", [q, w.const(np.float32(scale))])
    biases = _masks(w, a, ins, 5, (shapes[0][1], shapes[1][1]))
    if isinstance(biases, str):
        return biases
    _attend(w, q, k, v, heads, biases)
    return None


def embed_layer_norm(w: Writer, a: dict, view: GraphView) -> str | None:
    """com.microsoft EmbedLayerNormalization: word + position (+ segment) embeddings, then the layer norm;
    its mask_index output is the count of ones in each row of the mask."""
    from hbtools.graph.contrib import layer_norm

    node = w.node
    ins = list(node.input) + [""] * (9 - len(node.input))
    outs = list(node.output) + [""] * (3 - len(node.output))
    used = set(view.consumers) | set(view.graph_outputs)
    if outs[1] in used and not ins[7]:
        return "its mask_index output is used, and it has no mask input"
    if outs[1] in used and int(a.get("mask_index_type", 1)) != 1:
        return f"its mask_index_type is {a['mask_index_type']}"
    positions = ins[8]
    if not positions:  # 0 .. sequence length - 1
        length = w.op("Gather", [w.op("Shape", [ins[0]]), w.const(np.array(1, np.int64))])
        positions = w.op("Range", [w.const(np.array(0, np.int64)), length, w.const(np.array(1, np.int64))])
    total = w.op("Add", [w.op("Gather", [ins[2], ins[0]]), w.op("Gather", [ins[3], positions])],
                 None if ins[1] and ins[4] else outs[2] or None)
    if ins[1] and ins[4]:
        total = w.op("Add", [total, w.op("Gather", [ins[4], ins[1]])], outs[2] or None)
    layer_norm(w, total, ins[5], ins[6], float(a.get("epsilon", 1e-12)), outs[0])
    if outs[1] in used:
        axes = {"axes": [1]} if w.opset < 13 else {}
        reduce_in = [ins[7]] if w.opset < 13 else [ins[7], w.const(np.array([1], np.int64))]
        w.op("Cast", [w.op("ReduceSum", reduce_in, keepdims=0, **axes)], outs[1], to=helper.np_dtype_to_tensor_dtype(
            np.dtype(np.int32)))
    return None


WRITERS: dict[str, Callable[[Writer, dict, GraphView], str | None]] = {
    "Attention": attention, "MultiHeadAttention": multi_head_attention, "EmbedLayerNormalization": embed_layer_norm}


def _rotate(w: Writer, x: str, cos: str, sin: str, half: int, interleaved: bool) -> str:
    """The rotary part ``x`` (last axis 2 * ``half``) turned by the angles of ``cos`` / ``sin``."""
    def part(t: str, lo: int, hi: int) -> str:
        return w.op("Slice", [t, w.const(np.array([lo], np.int64)), w.const(np.array([hi], np.int64)),
                              w.const(np.array([-1], np.int64))])

    if interleaved:  # pairs (x[2i], x[2i + 1]): the last axis (of a 4-D x) as [half, 2]
        pairs = w.op("Reshape", [x, w.const(np.array([0, 0, 0, half, 2], np.int64))])
        x1, x2 = part(pairs, 0, 1), part(pairs, 1, 2)
    else:
        x1, x2 = part(x, 0, half), part(x, half, 2 * half)
    first = w.op("Sub", [w.op("Mul", [x1, cos]), w.op("Mul", [x2, sin])])
    second = w.op("Add", [w.op("Mul", [x2, cos]), w.op("Mul", [x1, sin])])
    if not interleaved:
        return w.op("Concat", [first, second], axis=-1)
    return w.op("Reshape", [w.op("Concat", [first, second], axis=-1),
                            w.const(np.array([0, 0, 0, 2 * half], np.int64))])


def rotary_embedding(w: Writer, a: dict, view: GraphView) -> str | None:
    """com.microsoft RotaryEmbedding with constant positions and caches: the angles are constants, the turn
    Mul / Sub / Add on the query or key ([batch, length, heads * size] or [batch, heads, length, size])."""
    ins = list(w.node.input)
    positions, cos_cache, sin_cache = (view.const(t) for t in ins[1:4])
    shape = view.shapes.get(ins[0])
    if positions is None or cos_cache is None or sin_cache is None:
        return "its positions or its cos / sin caches are computed at run time"
    if shape is None or len(shape) not in (3, 4) or None in shape or a.get("is_packed_batching", 0):
        return "its input is not [batch, length, hidden] or [batch, heads, length, size] of known sizes"
    half = cos_cache.shape[1]
    rotary = int(a.get("rotary_embedding_dim", 0)) or 2 * half
    heads = int(a.get("num_heads", 0))
    size = shape[3] if len(shape) == 4 else (shape[2] // heads if heads else rotary)
    batch, length = shape[0], shape[2] if len(shape) == 4 else shape[1]
    if rotary != 2 * half or rotary > size or (len(shape) == 3 and shape[2] % size):
        return f"its rotary size {rotary} does not fit heads of size {size} and caches of width {half}"
    if positions.size == 1:  # an offset: positions offset .. offset + length - 1
        positions = int(positions.reshape(-1)[0]) + np.arange(length)[None]
    positions = np.broadcast_to(positions, (batch, length))
    if positions.max() >= cos_cache.shape[0]:
        return f"a position {int(positions.max())} is beyond its caches of {cos_cache.shape[0]} positions"
    axis = 2 if len(shape) == 3 else 1  # where the heads are: [b, s, n, h] or [b, n, s, h]
    interleaved = bool(a.get("interleaved", 0))
    angles = [np.expand_dims(c[positions], axis) for c in (cos_cache, sin_cache)]
    if interleaved:
        angles = [t[..., None] for t in angles]
    cos, sin = (w.const(t) for t in angles)
    x = ins[0] if len(shape) == 4 else w.op("Reshape", [ins[0], w.const(np.array([0, 0, -1, size], np.int64))])
    if rotary < size:
        ends = [np.array([v], np.int64) for v in (0, rotary, size)]
        rot = w.op("Slice", [x, w.const(ends[0]), w.const(ends[1]), w.const(np.array([-1], np.int64))])
        rest = w.op("Slice", [x, w.const(ends[1]), w.const(ends[2]), w.const(np.array([-1], np.int64))])
        turned = w.op("Concat", [_rotate(w, rot, cos, sin, half, interleaved), rest], axis=-1)
    else:
        turned = _rotate(w, x, cos, sin, half, interleaved)
    if len(shape) == 4:
        w.op("Identity", [turned], w.node.output[0])
    else:
        w.op("Reshape", [turned, w.const(np.array([0, 0, -1], np.int64))], w.node.output[0])
    return None


WRITERS["RotaryEmbedding"] = rotary_embedding
