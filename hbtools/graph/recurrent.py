"""Recurrent ops unrolled over their time steps (an optimize-stage rewrite).

An ONNX ``LSTM`` or ``GRU`` node is one opaque CPU op for the partition. With its sequence
length fixed by the input shape it is a chain of ops the BPU takes: one projection of the
whole input sequence (Gemm), then per time step a Gemm of the previous hidden state, the
gate nonlinearities (Sigmoid, Tanh: lookup tables), and element-wise products and sums.
Each step's tensors get their own calibration, so the state's range may differ from step
to step. The float results agree with onnxruntime's kernels to float32 rounding.

Unrolled only where the ONNX definition is met without the rarely exported options: default
activations, no ``clip``, no peepholes, no ``input_forget``, every sequence as long as the
input; and, unless the config puts the node on the BPU, only short layers (``AUTO_STEPS``).
Any other node stays as it is (a CPU node), with its reason logged.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
from onnx import ModelProto, NodeProto, helper, numpy_helper

from hbtools.graph.graph import GraphView
from hbtools.graph.model_io import default_opset, read_json_metadata, write_json_metadata
from hbtools.march.profiles import MarchProfile

log = logging.getLogger("hbtools")

# The unrolled graph grows with time steps x directions (about a dozen tensors each): so do the
# conversion's time and memory and the simulation's per-node overhead, while the BPU gains little
# on a small recurrent layer. Up to AUTO_STEPS a layer is unrolled unasked (the model stays one BPU
# subgraph); a longer one when node_info puts it on the BPU (or makertbin --fast-perf), up to MAX_STEPS.
AUTO_STEPS = 64
MAX_STEPS = 256
_DEFAULT_ACTIVATIONS = {"LSTM": ["Sigmoid", "Tanh", "Tanh"], "GRU": ["Sigmoid", "Tanh"]}
_GATES = {"LSTM": 4, "GRU": 3}
RECURRENT_OPS = tuple(_GATES)
_DIRECTIONS = {"forward": ["forward"], "reverse": ["reverse"], "bidirectional": ["forward", "reverse"]}


def unroll_recurrences(model: ModelProto, placed: Mapping[str, str] | None = None, everything: bool = False,
                       explain: bool = True, profile: MarchProfile | None = None) -> int:
    """Rewrite the LSTM / GRU nodes of ``model`` that can be unrolled and are short enough
    (``AUTO_STEPS``), or that ``placed`` (node name -> "BPU" / "CPU", the config's node_info)
    puts on the BPU, or all with ``everything``, but none it puts on the CPU; returns how many were.
    Unasked, none where the BPU of ``profile`` cannot compute the gates (``gates_fit``).
    The node writing the first output takes the layer's name, which node_info may give. ``explain``
    logs why each layer left whole was."""
    placed = placed or {}
    fits = profile is None or gates_fit(profile)
    view = GraphView(model)
    opset = default_opset(model)
    nodes: list[NodeProto] = []
    done = 0
    g = model.graph
    taken = {*(o for n in g.node for o in n.output), *(n.name for n in g.node), *(i.name for i in g.input),
             *(t.name for t in g.initializer)}
    for node in g.node:
        if node.op_type not in _GATES or node.domain not in ("", "ai.onnx"):
            nodes.append(node)
            continue
        asked = everything or placed.get(node.name) == "BPU"
        spec, reason = _spec(node, view, MAX_STEPS if asked else AUTO_STEPS)
        # Batch-first layers are unrolled whatever the march: onnxruntime has no kernel for them.
        if spec is not None and not asked and not fits and spec.layout == 0:
            spec, reason = None, (f"the BPU of {profile.label} takes no 2-D tensors, which the gates of each time "
                                  "step are: unrolled, every step would cross to the CPU and back (node_info ON: BPU "
                                  "unrolls it anyway)")
        if placed.get(node.name) == "CPU":
            spec, reason = None, "node_info puts it on the CPU"
        if spec is None:
            if explain:
                log.info("%s %s stays one node (on the CPU): %s", node.op_type, node.name, reason)
            nodes.append(node)
            continue
        builder = _Builder(node.name, opset, model, taken)
        (_unroll_lstm if node.op_type == "LSTM" else _unroll_gru)(node, spec, builder)
        first = next((o for o in node.output if o), None)
        if first is not None:
            next(n for n in builder.nodes if first in n.output).name = node.name
        nodes.extend(builder.nodes)
        done += 1
    if done:
        del g.node[:]
        g.node.extend(nodes)
    return done


def gates_fit(profile: MarchProfile) -> bool:
    """Whether the BPU of ``profile`` computes an unrolled step's gates, element-wise ops on [batch, hidden]."""
    rules = [profile.rule(op) for op in ("Mul", "Add", "Sigmoid", "Tanh")]
    return all(rule is not None and rule.ranks[0] <= 2 <= rule.ranks[1] for rule in rules)


UNROLLED_KEY = "hbtools.unrolled_layers"


def record_unrolled(model: ModelProto, names: list[str]) -> None:
    """Keep in ``model`` the names of the recurrent layers the optimize stage unrolled (``unrolled_layers``)."""
    if names:
        write_json_metadata(model, UNROLLED_KEY, sorted(names))


def unrolled_layers(model: ModelProto) -> list[str]:
    """The recurrent layers (LSTM / GRU, by the user's names) the optimize stage unrolled over their time steps."""
    return list(read_json_metadata(model, UNROLLED_KEY) or [])


@dataclass
class _Spec:
    steps: int
    batch: int
    hidden: int
    directions: list[str]  # "forward" / "reverse", in the order of the output's direction axis
    w: np.ndarray  # [D, G*H, I]
    r: np.ndarray  # [D, G*H, H]
    b: np.ndarray  # [D, 2*G*H]
    layout: int
    linear_before_reset: int = 0
    initial: dict[int, str] = field(default_factory=dict)  # input index (5: h, 6: c) -> tensor, if not zero


def _spec(node: NodeProto, view: GraphView, max_steps: int) -> tuple[_Spec | None, str]:
    """What an unrolling needs to know of ``node``, or None and why it cannot be unrolled."""
    a = view.attrs(node)
    kind = node.op_type
    gates = _GATES[kind]
    inputs = list(node.input) + [""] * (8 - len(node.input))
    hidden = int(a.get("hidden_size", 0))
    direction = a.get("direction", b"forward")
    direction = direction.decode() if isinstance(direction, bytes) else direction
    directions = _DIRECTIONS.get(direction)
    acts = [s.decode() if isinstance(s, bytes) else s for s in a.get("activations", [])]
    if directions is None:
        return None, f"direction {direction}"
    if acts and [x.lower() for x in acts] != [x.lower() for x in _DEFAULT_ACTIVATIONS[kind] * len(directions)]:
        return None, f"activations {acts} (unrolled: only the default ones)"
    if a.get("clip") is not None:
        return None, "a cell clip"
    if a.get("input_forget", 0):
        return None, "input_forget"
    w, r = view.const(inputs[1]), view.const(inputs[2])
    b = view.const(inputs[3]) if inputs[3] else None
    if w is None or r is None or (inputs[3] and b is None):
        return None, "weights computed at run time"
    if kind == "LSTM" and inputs[7]:
        peepholes = view.const(inputs[7])
        if peepholes is None or np.any(peepholes):
            return None, "peephole weights"
    layout = int(a.get("layout", 0))
    shape = view.shapes.get(inputs[0])
    if shape is None or len(shape) != 3 or any(not d for d in shape):
        return None, "the input's shape is not static"
    steps, batch = (shape[0], shape[1]) if layout == 0 else (shape[1], shape[0])
    if steps > MAX_STEPS:
        return None, f"{steps} time steps (unrolled up to {MAX_STEPS})"
    if steps * len(directions) > max_steps:
        return None, (f"{steps} time steps x {len(directions)} direction(s), more than the {max_steps} steps "
                      "unrolled unless node_info puts the node on the BPU (ON: BPU, or run_on_bpu)")
    if inputs[4]:
        lens = view.const(inputs[4])
        if lens is None or np.any(np.asarray(lens) != steps):
            return None, "sequence lengths shorter than the input or computed at run time"
    d = len(directions)
    if hidden <= 0 or w.shape[:2] != (d, gates * hidden) or r.shape != (d, gates * hidden, hidden):
        return None, "weights of unexpected shape"
    b = np.zeros((d, 2 * gates * hidden), np.float32) if b is None else b.astype(np.float32)
    initial = {}
    for k in (5, 6) if kind == "LSTM" else (5,):
        if inputs[k]:
            value = view.const(inputs[k])
            if value is None or np.any(value):
                initial[k] = inputs[k]
    return _Spec(steps, batch, hidden, directions, w.astype(np.float32), r.astype(np.float32), b, layout,
                 int(a.get("linear_before_reset", 0)), initial), ""


class _Builder:
    """New nodes and constants, named after the node they replace."""

    def __init__(self, base: str, opset: int, model: ModelProto, taken: set[str]) -> None:
        self.base, self.opset, self.model = base, opset, model
        self.nodes: list[NodeProto] = []
        self._count = 0
        self._taken = taken

    def name(self, hint: str) -> str:
        while True:
            self._count += 1
            name = f"{self.base}_{hint}_{self._count}"
            if name not in self._taken:
                self._taken.add(name)
                return name

    def const(self, hint: str, value: np.ndarray) -> str:
        name = self.name(hint)
        self.model.graph.initializer.append(numpy_helper.from_array(value, name))
        return name

    def op(self, op: str, inputs: list[str], hint: str, outputs: int = 1, out: str | None = None,
           **attrs) -> str | list[str]:
        names = [out] if out else [self.name(hint) for _ in range(outputs)]
        self.nodes.append(helper.make_node(op, inputs, names, name=names[0], **attrs))
        return names if outputs > 1 else names[0]

    def axes_op(self, op: str, x: str, axes: list[int], hint: str, out: str | None = None) -> str:
        """Unsqueeze / Squeeze (axes an input from opset 13)."""
        if self.opset < 13:
            return self.op(op, [x], hint, out=out, axes=axes)
        return self.op(op, [x, self.const(f"{hint}_axes", np.array(axes, np.int64))], hint, out=out)

    def split(self, x: str, sizes: list[int], hint: str) -> list[str]:
        """``x`` [B, n] cut along axis 1 into parts of ``sizes``."""
        if self.opset < 13:
            return self.op("Split", [x], hint, outputs=len(sizes), axis=1, split=sizes)
        return self.op("Split", [x, self.const(f"{hint}_sizes", np.array(sizes, np.int64))], hint,
                       outputs=len(sizes), axis=1)

    def rename(self, x: str, out: str) -> None:
        """Make the node that computes ``x`` (read by no node yet) write ``out`` instead."""
        node = next(n for n in reversed(self.nodes) if x in n.output)
        node.output[list(node.output).index(x)] = out

    def transpose(self, x: str, perm: list[int], hint: str, out: str | None = None) -> str:
        return self.op("Transpose", [x], hint, out=out, perm=perm)


def _sequence_first(node: NodeProto, spec: _Spec, b: _Builder) -> str:
    """The input as [T, B, I]."""
    return node.input[0] if spec.layout == 0 else b.transpose(node.input[0], [1, 0, 2], "x_t")


def _projections(x: str, w: np.ndarray, bias: np.ndarray, spec: _Spec, b: _Builder, hint: str) -> list[str]:
    """Per time step, ``x_t W^T + bias`` ([B, G*H]): one Gemm over every step, then a Gather per step."""
    inputs = w.shape[1]
    rows = b.op("Reshape", [x, b.const(f"{hint}_rows_shape", np.array([spec.steps * spec.batch, inputs], np.int64))],
                f"{hint}_rows")
    proj = b.op("Gemm", [rows, b.const(f"{hint}_w", np.ascontiguousarray(w.T)), b.const(f"{hint}_b", bias)],
                f"{hint}_gemm")
    seq = b.op("Reshape", [proj, b.const(f"{hint}_seq_shape", np.array([spec.steps, spec.batch, -1], np.int64))],
               f"{hint}_seq")
    return [b.op("Gather", [seq, b.const(f"{hint}_t{t}", np.array(t, np.int64))], f"{hint}_step{t}", axis=0)
            for t in range(spec.steps)]


def _initial(spec: _Spec, k: int, d: int, b: _Builder, hint: str) -> str | None:
    """Direction ``d``'s initial state (input ``k``: [D, B, H], or [B, D, H] with layout 1) as [B, H],
    or None where it is zero."""
    if k not in spec.initial:
        return None
    return b.op("Gather", [spec.initial[k], b.const(f"{hint}_dir", np.array(d, np.int64))], hint, axis=spec.layout)


def _outputs(node: NodeProto, spec: _Spec, per_step: list[list[str]], finals: list[list[str]], b: _Builder) -> None:
    """Y ([T, D, B, H], or [B, T, D, H] with layout 1) and the final states ([D, B, H] / [B, D, H])."""
    outs = list(node.output) + [""] * 3
    if outs[0]:
        per_direction = []
        for d, states in enumerate(per_step):
            rows = [b.axes_op("Unsqueeze", h, [0, 1], f"y{d}_{t}") for t, h in enumerate(states)]
            per_direction.append(b.op("Concat", rows, f"y{d}", axis=0) if len(rows) > 1 else rows[0])
        joined = b.op("Concat", per_direction, "y", axis=1) if len(per_direction) > 1 else per_direction[0]
        if spec.layout == 0:
            b.rename(joined, outs[0])
        else:
            b.transpose(joined, [2, 0, 1, 3], "y_layout", out=outs[0])
    for k, states in enumerate(finals, start=1):
        if not outs[k]:
            continue
        rows = [b.axes_op("Unsqueeze", s, [0], f"final{k}_{d}") for d, s in enumerate(states)]
        joined = b.op("Concat", rows, f"final{k}", axis=0) if len(rows) > 1 else rows[0]
        if spec.layout == 0:
            b.rename(joined, outs[k])
        else:
            b.transpose(joined, [1, 0, 2], f"final{k}_layout", out=outs[k])


def _order(spec: _Spec, d: int) -> list[int]:
    return list(range(spec.steps)) if spec.directions[d] == "forward" else list(range(spec.steps - 1, -1, -1))


def _unroll_lstm(node: NodeProto, spec: _Spec, b: _Builder) -> None:
    """ONNX gate order i, o, f, c: c_t = f*c + i*tanh(.), h_t = o*tanh(c_t)."""
    x = _sequence_first(node, spec, b)
    hid = spec.hidden
    per_step, last_h, last_c = [], [], []
    for d in range(len(spec.directions)):
        bias = spec.b[d, :4 * hid] + spec.b[d, 4 * hid:]
        xw = _projections(x, spec.w[d], bias, spec, b, f"d{d}")
        r_t = b.const(f"d{d}_r", np.ascontiguousarray(spec.r[d].T))
        h, c = _initial(spec, 5, d, b, f"d{d}_h0"), _initial(spec, 6, d, b, f"d{d}_c0")
        states: dict[int, str] = {}
        for t in _order(spec, d):
            gates = xw[t] if h is None else b.op("Add", [xw[t], b.op("Gemm", [h, r_t], f"d{d}_rec{t}")],
                                                 f"d{d}_gates{t}")
            i, o, f, g = b.split(gates, [hid] * 4, f"d{d}_split{t}")
            i, o, f = (b.op("Sigmoid", [v], f"d{d}_{n}{t}") for v, n in ((i, "i"), (o, "o"), (f, "f")))
            new = b.op("Mul", [i, b.op("Tanh", [g], f"d{d}_g{t}")], f"d{d}_in{t}")
            c = new if c is None else b.op("Add", [b.op("Mul", [f, c], f"d{d}_keep{t}"), new], f"d{d}_c{t}")
            h = b.op("Mul", [o, b.op("Tanh", [c], f"d{d}_tc{t}")], f"d{d}_h{t}")
            states[t] = h
        per_step.append([states[t] for t in range(spec.steps)])
        last_h.append(h)
        last_c.append(c)
    _outputs(node, spec, per_step, [last_h, last_c], b)


def _unroll_gru(node: NodeProto, spec: _Spec, b: _Builder) -> None:
    """ONNX gate order z, r, h: h_t = (1 - z)*n + z*h = n + z*(h - n)."""
    x = _sequence_first(node, spec, b)
    hid = spec.hidden
    per_step, last_h = [], []
    for d in range(len(spec.directions)):
        wb, rb = spec.b[d, :3 * hid], spec.b[d, 3 * hid:]
        # Recurrent biases of z and r add like the input ones; the candidate's goes inside r*(.)
        # with linear_before_reset, and outside the reset otherwise (it is then part of R h's sum).
        bias = wb + np.concatenate([rb[:2 * hid], np.zeros(hid, np.float32) if spec.linear_before_reset
                                    else rb[2 * hid:]])
        xw = _projections(x, spec.w[d], bias, spec, b, f"d{d}")
        r_zr = b.const(f"d{d}_rzr", np.ascontiguousarray(spec.r[d, :2 * hid].T))
        r_h = b.const(f"d{d}_rh", np.ascontiguousarray(spec.r[d, 2 * hid:].T))
        rb_h = b.const(f"d{d}_rbh", rb[2 * hid:].copy())
        h = _initial(spec, 5, d, b, f"d{d}_h0")
        states: dict[int, str] = {}
        for t in _order(spec, d):
            x_zr, x_h = b.split(xw[t], [2 * hid, hid], f"d{d}_xs{t}")
            if h is None:
                zr = x_zr
            else:
                zr = b.op("Add", [x_zr, b.op("Gemm", [h, r_zr], f"d{d}_reczr{t}")], f"d{d}_zr{t}")
            z, r = (b.op("Sigmoid", [v], f"d{d}_{n}{t}")
                    for v, n in zip(b.split(zr, [hid, hid], f"d{d}_zrs{t}"), "zr", strict=True))
            # The candidate reads R h (+ its bias): after the reset with linear_before_reset, else
            # R (r*h), its bias then being in the projection. h = 0 leaves the bias alone, or nothing.
            if spec.linear_before_reset:
                rec = rb_h if h is None else b.op("Gemm", [h, r_h, rb_h], f"d{d}_rech{t}")
                rec = b.op("Mul", [r, rec], f"d{d}_reset{t}")
            else:
                rec = None if h is None else b.op("Gemm", [b.op("Mul", [r, h], f"d{d}_rh{t}"), r_h], f"d{d}_rech{t}")
            cand_in = x_h if rec is None else b.op("Add", [x_h, rec], f"d{d}_cin{t}")
            n = b.op("Tanh", [cand_in], f"d{d}_n{t}")
            if h is None:  # h_0 = 0: h_1 = (1 - z) * n = n - z*n
                h = b.op("Sub", [n, b.op("Mul", [z, n], f"d{d}_zn{t}")], f"d{d}_h{t}")
            else:
                h = b.op("Add", [n, b.op("Mul", [z, b.op("Sub", [h, n], f"d{d}_dh{t}")], f"d{d}_zdh{t}")],
                         f"d{d}_h{t}")
            states[t] = h
        per_step.append([states[t] for t in range(spec.steps)])
        last_h.append(h)
    _outputs(node, spec, per_step, [last_h], b)

