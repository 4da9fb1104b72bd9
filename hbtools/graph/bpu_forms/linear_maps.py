"""Index arithmetic over a map's H and W that is a constant linear map per axis, as two matrix products."""

from __future__ import annotations

import logging

import numpy as np
from onnx import ModelProto, NodeProto, TensorProto, helper, numpy_helper

from hbtools.errors import HbError
from hbtools.graph.graph import GraphView, is_static, part_model, rewrite_nodes
from hbtools.runtime.session import RUN_ERRORS, ort_session

log = logging.getLogger("hbtools")

# Ops linear in their data input once the others are constants (indices, shapes, masks, divisors).
_MOVES = ("Transpose", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Gather", "GatherND",
          "GatherElements", "Slice", "Concat", "Split", "Expand", "Tile")
_LINEAR = (*_MOVES, "Add", "Sub", "Mul", "Div", "Neg", "Where", "ReduceSum", "ReduceMean", "Pad")
_RELAYOUTS = ("Transpose", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity")  # between the map and a seed
_SEEDS = ("GatherND", "GatherElements")  # index arithmetic no BPU runs
_MAX_PROBES = 512  # runs of the region the basis takes (a probe per channel of the map at a time)


def spatial_index_maps_as_matmuls(model: ModelProto) -> int:
    """Index arithmetic that reads a 4-D map [1, C, H, W] and gives a [1, C, h, w] by the same constant linear
    map on every channel, separable over H and W, as ``MatMul`` by the map along W, then along H between two
    Transposes (the form of ``interpolations_as_matmuls``). Returns how many results it rewrote.

    torch's default exporter (dynamo) writes ``adaptive_avg_pool2d`` to a size that does not divide the map
    (PSPNet's bins 3 and 6 on a 64x64 map) as GatherND of constant windows, a 6-D Transpose, masks, 144
    Gathers and Adds, and a Div by the window sizes: about 300 nodes none of which the BPU runs. The region
    is found from its GatherND on (each op linear in the map once its other inputs are constants); its
    matrices come from running it on one-hot maps, and it is replaced only where the products reproduce it
    on a random map."""
    count = 0
    done: set[str] = set()
    seeds = [n.output[0] for n in model.graph.node if n.op_type in _SEEDS and n.domain in ("", "ai.onnx")]
    for seed in seeds:
        if seed in done:
            continue
        view = GraphView(model)
        found = _regions(view, view.producer[seed])
        if found is None:
            continue
        source, results = found
        for nodes, out in results:
            done.update(o for n in nodes for o in n.output)
            matrices = _separable_map(model, view, source, nodes, out)
            if matrices is not None and _replace(model, source, out, *matrices):
                count += 1
    return count


def _regions(view: GraphView, seed: NodeProto) -> tuple[str, list[tuple[list[NodeProto], str]]] | None:
    """The 4-D map ``seed`` reads (behind relayouts), and each [1, C, h, w] result of the nodes linear in it
    from there that is read elsewhere and computed through a seed, with the nodes it needs; None where the
    map is not such a 4-D map."""
    source = seed.input[0]
    while source in view.producer and view.producer[source].op_type in _RELAYOUTS:
        source = view.producer[source].input[0]
    shape = view.shapes.get(source)
    if view.is_const(source) or not is_static(shape) or len(shape) != 4 or shape[0] != 1:
        return None
    reached, nodes = {source}, []
    for node in view.graph.node:
        data = [i for i in node.input if i and not view.is_const(i)]
        if node.op_type not in _LINEAR or node.domain not in ("", "ai.onnx") or not data or \
                not all(i in reached for i in data):
            continue
        if node.op_type in ("Mul", "Div") and len(data) > 1 or node.op_type == "Where" and node.input[0] in reached:
            continue  # a product of the map with itself; a mask computed from it
        nodes.append(node)
        reached.update(o for o in node.output if o)
    inside = {id(n) for n in nodes}
    read = {i for n in view.graph.node if id(n) not in inside for i in n.input if i in reached}
    read |= {o for o in view.graph_outputs if o in reached}
    found = []
    for out in sorted(read - {source}):
        out_shape = view.shapes.get(out)
        needed = _needed(nodes, out)
        if is_static(out_shape) and len(out_shape) == 4 and out_shape[:2] == shape[:2] and \
                any(n.op_type in _SEEDS for n in needed):
            found.append((needed, out))
    return source, found


def _needed(nodes: list[NodeProto], out: str) -> list[NodeProto]:
    """The ``nodes`` ``out`` depends on, in graph order."""
    made = {o: n for n in nodes for o in n.output}
    keep, stack = set(), [out]
    while stack:
        node = made.get(stack.pop())
        if node is not None and id(node) not in keep:
            keep.add(id(node))
            stack.extend(node.input)
    return [n for n in nodes if id(n) in keep]


def _separable_map(model: ModelProto, view: GraphView, source: str, nodes: list[NodeProto],
                   out: str) -> tuple[np.ndarray, np.ndarray] | None:
    """(A [h, H], B [w, W]) with ``out[c] = A @ source[c] @ B.T`` on every channel, or None."""
    _, channels, height, width = view.shapes[source]
    _, _, h, w = view.shapes[out]
    probes = -(-height * width // channels)
    if probes > _MAX_PROBES:
        return None
    part = part_model(model, nodes, [out], view.shapes, view.elem_types, "index_map")
    if [i.name for i in part.graph.input] != [source]:
        return None
    try:
        session = ort_session(part, threads=1)
        def run(x: np.ndarray) -> np.ndarray:
            return np.asarray(session.run([out], {source: x})[0], np.float64)

        if np.any(run(np.zeros(view.shapes[source], np.float32))):
            return None  # affine, not linear
        columns = np.zeros((h * w, height * width))
        for first in range(0, height * width, channels):
            x = np.zeros((1, channels, height * width), np.float32)
            taken = min(channels, height * width - first)
            x[0, np.arange(taken), first + np.arange(taken)] = 1
            y = run(x.reshape(1, channels, height, width)).reshape(channels, h * w)
            columns[:, first:first + taken] = y[:taken].T
        # separable: columns[(i, j), (k, l)] = A[i, k] B[j, l], a matrix of rank one over (i, k) x (j, l)
        pairs = columns.reshape(h, w, height, width).transpose(0, 2, 1, 3).reshape(h * height, w * width)
        u, s, vt = np.linalg.svd(pairs, full_matrices=False)
        if s[0] == 0 or (len(s) > 1 and s[1] > 1e-6 * s[0]):
            return None
        a = (u[:, 0] * np.sqrt(s[0])).reshape(h, height)
        b = (vt[0] * np.sqrt(s[0])).reshape(w, width)
        if a.sum() < 0:
            a, b = -a, -b
        x = np.random.default_rng(0).standard_normal(view.shapes[source]).astype(np.float32)
        if not np.allclose(a @ x[0].astype(np.float64) @ b.T, run(x)[0], rtol=1e-4, atol=1e-5 * np.abs(x).max()):
            return None  # channels mapped differently, or mixed
    except (*RUN_ERRORS, HbError, np.linalg.LinAlgError) as exc:  # left as it is
        log.debug("index arithmetic at %s not probed: %s", out, exc)
        return None
    return a.astype(np.float32), b.astype(np.float32)


def _replace(model: ModelProto, source: str, out: str, a: np.ndarray, b: np.ndarray) -> bool:
    """``out`` as ``source`` times ``b.T`` along W, then ``a.T`` along H between two Transposes (a map that
    keeps an axis as it is skips its product); the region's other nodes are left to ``remove_dead_nodes``.
    False where the node giving ``out`` gives other tensors too."""
    producer = next(n for n in model.graph.node if out in n.output)
    if len(producer.output) != 1:
        return False
    name = producer.name or out
    made: list[NodeProto] = []
    x = source
    if not _identity(b):
        model.graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(b.T), f"{name}_index_map_w"))
        made.append(helper.make_node("MatMul", [x, f"{name}_index_map_w"], [f"{out}_along_w"], name=f"{name}_along_w"))
        x = f"{out}_along_w"
    if not _identity(a):
        model.graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(a.T), f"{name}_index_map_h"))
        made += [helper.make_node("Transpose", [x], [f"{out}_hw_swapped"], name=f"{name}_swap", perm=[0, 3, 1, 2]),
                 helper.make_node("MatMul", [f"{out}_hw_swapped", f"{name}_index_map_h"], [f"{out}_along_h"],
                                  name=f"{name}_along_h"),
                 helper.make_node("Transpose", [f"{out}_along_h"], [out], name=f"{name}_swap_back",
                                  perm=[0, 2, 3, 1])]
    if not made:
        made.append(helper.make_node("Identity", [source], [out], name=name))
    made[-1].output[0] = out
    nodes = []
    for node in model.graph.node:
        nodes.extend(made if node.output == producer.output else [node])
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return True


def _identity(matrix: np.ndarray) -> bool:
    return matrix.shape[0] == matrix.shape[1] and bool(np.allclose(matrix, np.eye(matrix.shape[0]), atol=1e-6))


MAX_CUMSUM_LENGTH = 2048  # the [L, L] matrix of ones: 16 MB at this length


def cumsums_as_matmuls(model: ModelProto) -> int:
    """A float ``CumSum`` over an axis of a static shape as a ``MatMul`` by the constant triangle of ones it
    sums with (``exclusive`` and ``reverse`` choose the triangle): over the last axis ``x @ T``, over another
    ``T^T @ x`` with the axes after it merged into one by a Reshape (a constant first operand, which
    ``matmuls_with_the_weight_second`` writes in the BPU's form). No BPU takes CumSum: Mamba's selective scan
    in its parallel form (two CumSums over the tokens per block) split a 4-block model into 13 BPU subgraphs.
    Returns how many it wrote."""
    view = GraphView(model)
    return rewrite_nodes(model, lambda node: _cumsum_as_matmul(node, view, model))


def _cumsum_as_matmul(node: NodeProto, view: GraphView, model: ModelProto) -> list[NodeProto] | None:
    if node.op_type != "CumSum" or node.domain not in ("", "ai.onnx") or len(node.input) < 2:
        return None
    shape, axis = view.shapes.get(node.input[0]), view.const(node.input[1])
    if not is_static(shape) or not shape or axis is None or np.asarray(axis).size != 1 or \
            view.elem_types.get(node.input[0]) != TensorProto.FLOAT:
        return None
    axis = int(np.asarray(axis).reshape(-1)[0]) % len(shape)
    length = shape[axis]
    if length > MAX_CUMSUM_LENGTH:
        return None
    a = view.attrs(node)
    i, j = np.meshgrid(np.arange(length), np.arange(length), indexing="ij")  # output j sums inputs i
    reverse, exclusive = bool(a.get("reverse", 0)), bool(a.get("exclusive", 0))
    summed = (i > j if exclusive else i >= j) if reverse else (i < j if exclusive else i <= j)
    base = node.name or node.output[0]

    def constant(value: np.ndarray, hint: str) -> str:
        name = f"{base}_{hint}"
        model.graph.initializer.append(numpy_helper.from_array(value, name))
        return name

    triangle = summed.astype(np.float32)
    if axis == len(shape) - 1:
        return [helper.make_node("MatMul", [node.input[0], constant(triangle, "triangle")], [node.output[0]],
                                 name=node.name)]
    rows = [int(np.prod(shape[:axis], dtype=np.int64)), length, int(np.prod(shape[axis + 1:], dtype=np.int64))]
    if axis == len(shape) - 2:
        return [helper.make_node("MatMul", [constant(triangle.T, "triangle"), node.input[0]], [node.output[0]],
                                 name=node.name)]
    merged, summed_rows = f"{base}_rows", f"{base}_summed"
    return [helper.make_node("Reshape", [node.input[0], constant(np.array(rows, np.int64), "rows_shape")], [merged],
                             name=f"{base}_rows"),
            helper.make_node("MatMul", [constant(triangle.T, "triangle"), merged], [summed_rows], name=node.name),
            helper.make_node("Reshape", [summed_rows, constant(np.array(shape, np.int64), "shape")],
                             [node.output[0]], name=f"{base}_shape")]
