"""The makertbin console tables: node placement and per-node similarity."""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from onnx import ModelProto, NodeProto, helper

from hbtools.graph.graph import GraphView, elements
from hbtools.graph.model_io import load_model
from hbtools.graph.origins import user_node
from hbtools.log import first_of
from hbtools.march.profiles import PASSIVE_OPS
from hbtools.metrics import CHUNK, chebyshev, cosine_of_chunks, cosine_similarity, l1_distance, l2_distance
from hbtools.pipeline.quantize import QTensor, QuantizedResult
from hbtools.quant.units import Partition
from hbtools.runtime import segments
from hbtools.runtime.lowering import lowered_parts
from hbtools.runtime.session import make_session

log = logging.getLogger("hbtools")


def _with_outputs(model: ModelProto, names: list[str], elem: int | None) -> ModelProto:
    present = {o.name for o in model.graph.output}
    for t in names:
        if t not in present:  # untyped when unknown: a CPU node's output may be bool or int64
            model.graph.output.append(helper.make_tensor_value_info(t, elem, None) if elem
                                      else helper.make_empty_tensor_value_info(t))
    return model


@dataclass
class NodeSimilarity:
    """Per unit output tensor, the cosine between the float and the quantized model on one sample, and
    the outputs whose integers are all the zero point while the float values are not (each float
    value below half a step: the cosine 0 says so, not a fault)."""

    cosines: dict[str, float] = field(default_factory=dict)
    below_step: set[str] = field(default_factory=set)
    # per model output: cosine, L1, L2 and Chebyshev distance (the vendor's "quantized model output" table)
    outputs: dict[str, tuple[float, float, float, float]] = field(default_factory=dict)


def node_similarity(optimized: ModelProto | Path, result: QuantizedResult, feed: dict[str, np.ndarray],
                    train_layouts: dict[str, str] | None = None) -> NodeSimilarity:
    """Cosine of each unit's output between the float and the quantized model (one sample).

    ``optimized``: the float model, or its file (read here, and let go once its session is built: beside
    the session onnxruntime builds, it would be one more copy of every weight). ``feed`` is in the training
    layout of each input (``train_layouts``, NCHW where not given); a quantized input of another shape takes
    the other of NCHW / NHWC.
    """
    if isinstance(optimized, Path):
        optimized = load_model(optimized)
    q_model = result.model
    float_names = {o.name for o in q_model.graph.output} | {n for node in q_model.graph.node for n in node.output}
    pairs: dict[str, tuple[str, QTensor | None]] = {}
    for unit in result.partition.units:
        for t in unit.outputs:
            if t in result.tensors and result.tensors[t].dtype != "int32":
                qt = result.tensors[t]
                pairs[t] = (qt.name, qt)
            elif t in float_names:
                pairs[t] = (t, None)
    # keep=: a unit whose output nothing reads (an image input the graph only takes the size of) is
    # still compared, so the lowering must not drop it.
    # Without memory patterns: a session keeps no block of its intermediates between the runs, where
    # the other session's run (or the next group's) needs the memory.
    groups = _fetch_groups(optimized, pairs)
    float_lowered, constants = lowered_parts(optimized, keep=list(pairs))
    del optimized  # the session takes ``constants`` (emptied once serialized)
    float_sess = make_session(_with_outputs(float_lowered, list(pairs), None), memory_pattern=False,
                              constants=constants)
    del float_lowered, constants
    q_lowered, constants = lowered_parts(q_model, keep=[q for q, _ in pairs.values()])
    elem_of = {vi.name: vi.type.tensor_type.elem_type for vi in q_model.graph.value_info}
    for q_name, _ in pairs.values():
        if q_name not in {o.name for o in q_lowered.graph.output}:
            elem = elem_of.get(q_name)
            q_lowered.graph.output.append(helper.make_tensor_value_info(q_name, elem, None) if elem
                                          else helper.make_empty_tensor_value_info(q_name))
    q_sess = make_session(q_lowered, memory_pattern=False, constants=constants)  # as HB_ONNXRuntime runs it
    del q_lowered, constants
    q_feed = {}
    for i in q_sess.get_inputs():
        x = feed[i.name]
        to_other = (0, 3, 1, 2) if (train_layouts or {}).get(i.name) == "NHWC" else (0, 2, 3, 1)
        q_feed[i.name] = x if list(x.shape) == list(i.shape) else np.transpose(x, to_other)
    found = NodeSimilarity()
    sims = found.cosines
    model_outputs = [o.name for o in q_model.graph.output]
    output_set = set(model_outputs)
    for tensors in groups:
        # Quantized first: its outputs are mostly 8/16-bit, so they cost little while the float run happens.
        q_out = dict(zip(tensors, q_sess.run([pairs[t][0] for t in tensors], q_feed), strict=True))
        f_out = dict(zip(tensors, float_sess.run(tensors, feed), strict=True))
        for t in tensors:
            _, qt = pairs[t]
            f, q = f_out.pop(t), q_out.pop(t)  # each released once compared
            if not isinstance(f, np.ndarray) or not isinstance(q, np.ndarray):  # a sequence or map: no cosine
                continue
            if t in output_set:
                found.outputs[t] = _distances(f, q if qt is None else qt.to_float(q))
            if qt is None:
                sims[t] = cosine_similarity(f, q)
                continue
            if not np.any(q != qt.zero_point) and np.any(f):
                found.below_step.add(t)
            if qt.scale.size == 1:  # per-tensor grid: dequantize piece by piece
                f, q = f.reshape(-1), q.reshape(-1)
                sims[t] = cosine_of_chunks((f[s:s + CHUNK], qt.to_float(q[s:s + CHUNK]))
                                           for s in range(0, q.size, CHUNK))
            else:
                sims[t] = cosine_similarity(f, qt.to_float(q))
    found.outputs = {o: found.outputs[o] for o in model_outputs if o in found.outputs}  # in the model's order
    return found


def _distances(f: np.ndarray, q: np.ndarray) -> tuple[float, float, float, float]:
    return cosine_similarity(f, q), l1_distance(f, q), l2_distance(f, q), chebyshev(f, q)


def _fetch_groups(optimized: ModelProto, pairs: dict[str, tuple[str, QTensor | None]]) -> list[list[str]]:
    """The compared tensors in groups whose float and quantized values take at most ``SEGMENT_BYTES``
    together: both runs are repeated per group. All of them at once took an 800x800 table detector
    (4.2 GB of activations) to 7.1 GB for a table of one sample; a model within the budget runs once."""
    shapes = GraphView(optimized).shapes
    sizes = [elements(shapes.get(t)) * (4 + (np.dtype(qt.dtype).itemsize if qt is not None and qt.dtype in
                                             ("int8", "int16") else 4)) for t, (_, qt) in pairs.items()]
    return segments.byte_groups(list(pairs), sizes, segments.SEGMENT_BYTES)


@dataclass
class _Row:
    """One row of the node table: a node of the quantized graph, or a user's node merged from its parts."""

    name: str
    on: str
    subgraph: str
    kind: str
    cosine: str = "--"
    threshold: str = "--"


def log_node_table(result: QuantizedResult, similarity: NodeSimilarity | None = None) -> None:
    """The node table in the user's node names; a ``*`` marks the cosines of outputs below one step, explained
    under the table."""
    rows = _users_rows(result, _node_rows(result, similarity))
    width = max([len("Node"), *(len(r.name) for r in rows)]) + 2
    header = f"{'Node':<{width}}{'ON':<5}{'Subgraph':<10}{'Type':<30}"
    if similarity is not None:
        header += f"{'Cosine Similarity':<19}Threshold"
    lines = ["=" * len(header), header, "-" * len(header)]
    for row in rows:
        line = f"{row.name:<{width}}{row.on:<5}{row.subgraph:<10}{row.kind:<30}"
        lines.append(line + f"{row.cosine:<19}{row.threshold}" if similarity is not None else line)
    if any(r.cosine.endswith("*") for r in rows):  # a 0 with no word of why reads as a broken conversion
        lines.append("* all float values below half a quantization step on this sample: every quantized value is 0")
    log.info("The converted model node information:\n%s", "\n".join(lines))
    if similarity is not None and similarity.outputs:
        _log_output_table(similarity)
    if similarity is not None:  # read as accuracy, one picture's cosines mislead (0.999 here, 0.7 on held-out data)
        log.info("Cosine Similarity: float against quantized output of each node on the first calibration sample "
                 "only; it is no accuracy measure: evaluate the quantized model on held-out data (hb_mapper infer, "
                 "HB_ONNXRuntime), and find the nodes that lose accuracy with hmct-debugger")


def _log_output_table(similarity: NodeSimilarity) -> None:
    """Each model output against the float model's, on the same sample, as the vendor's makertbin prints it."""
    width = max(len("Output"), *(len(name) for name in similarity.outputs)) + 2
    header = f"{'Output':<{width}}{'Cosine Similarity':<19}{'L1 Distance':<13}{'L2 Distance':<13}Chebyshev Distance"
    lines = ["=" * len(header), header, "-" * len(header)]
    for name, (cos, l1, l2, cheb) in similarity.outputs.items():
        lines.append(f"{name:<{width}}{cos:<19.6f}{l1:<13.6f}{l2:<13.6f}{cheb:.6f}")
    log.info("The quantized model output:\n%s", "\n".join(lines))


def _node_rows(result: QuantizedResult, similarity: NodeSimilarity | None) -> list[_Row]:
    """A row per node of the quantized graph; a unit's cosine and threshold on its last node's row."""
    out_of = {n.name: u for u in result.partition.units for n in u.nodes}
    rows = []
    for name, on, sub, kind in result.partition.rows():
        row = _Row(name, on, sub, kind)
        unit = out_of[name]
        tensor = unit.outputs[0] if unit.outputs else None
        if similarity is not None and unit.nodes[-1].name == name:
            if tensor in similarity.cosines:
                row.cosine = f"{similarity.cosines[tensor]:.6f}" + ("*" if tensor in similarity.below_step else "")
            if result.thresholds.get(tensor) is not None:
                row.threshold = f"{result.thresholds[tensor]:.6f}"
        rows.append(row)
    return rows


def _with_part_note(reason: str, node: NodeProto, user: str, user_on_bpu: bool) -> str:
    """A CPU reason saying, where ``node`` is one the optimize stage wrote for the user's node ``user``, so, and
    whether that node's other parts run on the BPU (once: a reason may name the user's node already)."""
    rest = "; its other parts run on the BPU" if user_on_bpu else ""
    if node.name == user:  # the part that kept the user's name
        return f"{reason} ({rest[2:]})" if rest else reason
    if "the optimize stage wrote" in reason and reason.endswith(")"):
        return reason[:-1] + rest + ")"
    return f"{reason} (part of {user} as the optimize stage wrote it{rest})"


def _counted_parts(users: list[str], on_bpu: set[str], written: int) -> str:
    """What the count of CPU nodes leaves out: which of them run on the CPU only in part, and how many nodes run
    there as the optimize stage wrote them, where that differs."""
    split = [user for user in users if user in on_bpu]
    text = f", {len(split)} of them only in part: {first_of(split)}" if split else ""
    return text + (f" ({written} nodes of the optimized model)" if written != len(users) else "")


def _users_rows(result: QuantizedResult, rows: list[_Row]) -> list[_Row]:
    """The rows in the user's node names, as the debugger names them: the rows of consecutive parts of one user's
    node on one placement become one.

    The optimize stage writes some of the user's nodes as several (a bilinear Resize as a Pad and a ConvTranspose,
    a Linear over 3-D as a Gemm between two Reshapes). The merged row's type is that of the part keeping the user's
    name, else of the first part that computes (not only moves values); its cosine and threshold are the last
    part's that has them (the user's node's output). Parts placed apart (some on the CPU) or apart in the graph (a
    flatten copied into each head) keep a row each, under the user's name, so each placement and each output
    keeps its cosine."""
    op_of = {n.name: n.op_type for u in result.partition.units for n in u.nodes}
    runs: list[tuple[tuple[str, str, str], list[_Row]]] = []
    for row in rows:
        key = (user_node(result.origins, row.name), row.on, row.subgraph)
        if runs and runs[-1][0] == key:
            runs[-1][1].append(row)
        else:
            runs.append((key, [row]))
    merged = []
    for (user, on, sub), parts in runs:
        typed = next((p for p in parts if p.name == user), None) or next(
            (p for p in parts if op_of[p.name] not in PASSIVE_OPS), parts[0])
        cosine = next((p.cosine for p in reversed(parts) if p.cosine != "--"), "--")
        threshold = next((p.threshold for p in reversed(parts) if p.threshold != "--"), "--")
        merged.append(_Row(user, on, sub, typed.kind, cosine, threshold))
    return merged


def _main_reason(reasons: list[str]) -> tuple[str, int]:
    """The reason most CPU nodes share and how many share it: a reason's general part, after the node's own
    ("Conv on a 3-D tensor [1, 8, 256]: the BPU of bernoulli2 (RDK X3) takes 4-D tensors only"), else all of it."""
    general = Counter(r.split(": ", 1)[1] if ": " in r else r for r in reasons)
    return general.most_common(1)[0]


def log_cpu_reasons(partition: Partition, origins: dict[str, str] | None = None) -> None:
    """Each CPU node with the reason it is not on the BPU, after the node table; in the user's node names
    (``origins``), a node written as several parts once per type and reason of its parts, a part under another
    name said to be one (a Reshape around a MatMul whose product runs on the BPU is no CPU MatMul)."""
    origins = origins or {}
    subgraphs = len({u.subgraph for u in partition.units if u.on == "BPU"})
    on_bpu = {user_node(origins, n.name) for u in partition.units if u.on == "BPU" for n in u.nodes}
    rows = []  # (user's node, type, reason) per node on the CPU
    for unit in (u for u in partition.units if u.on == "CPU"):
        for node in unit.nodes:
            user = user_node(origins, node.name)
            rows.append((user, node.op_type, _with_part_note(unit.reason, node, user, user in on_bpu)))
    cpu = list(dict.fromkeys(rows))
    users = list(dict.fromkeys(c[0] for c in cpu))
    log.info("The model has %d BPU subgraph(s) and %d CPU node(s)%s", subgraphs, len(users),
             _counted_parts(users, on_bpu, len(rows)))
    if not cpu:
        return
    if all(u.on == "CPU" or u.kind == "preprocess" for u in partition.units):
        # converts, but runs in float on the board's CPU: almost always a march the model's ops do not suit
        reasons = [u.reason for u in partition.units if u.on == "CPU" for _ in u.nodes]
        reason, count = _main_reason(reasons)
        # a reason shared by several nodes is the main one; one node's of several different ones is not
        main = "" if count == 1 < len(reasons) else f" ({count} of its {len(reasons)} CPU nodes: {reason})" \
            if count < len(reasons) else f" (every CPU node: {reason})"
        log.warning("no node of the model runs on the BPU%s: it runs in float on the CPU%s; the reasons each node "
                    "stays there follow (check the march)", " (only the input preprocessing does)" if subgraphs
                    else "", main)
    name_w = max(len("Node"), *(len(c[0]) for c in cpu)) + 2
    type_w = max(len("Type"), *(len(c[1]) for c in cpu)) + 2
    header = f"{'Node':<{name_w}}{'Type':<{type_w}}Reason"
    lines = [header, "-" * len(header)]
    lines += [f"{name:<{name_w}}{kind:<{type_w}}{reason}" for name, kind, reason in cpu]
    log.info("The nodes running on the CPU and why:\n%s", "\n".join(lines))
