"""Bounds on the magnitude of tensors that hold whatever the input: a Sigmoid's output stays within 1, twice it
squared within 4, YOLOv5's box size ``(2 * sigmoid) ** 2 * anchor`` within 4 anchors. An int16 grid that reaches
such a bound (``thresholds.int16_threshold``) keeps the values other pictures give beyond the calibration set's.
"""

from __future__ import annotations

import numpy as np
from onnx import NodeProto, TensorProto

from hbtools.graph.graph import GraphView

# Ops whose output magnitude is at most 1 whatever their input.
UNIT_BOUNDED = ("Sigmoid", "HardSigmoid", "Tanh", "Softmax", "Softsign")
# Ops whose output's magnitude is at most their (first) input's: data movement, max/average pooling, ReLU.
_WITHIN_INPUT = ("Relu", "Abs", "Neg", "Identity", "Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze",
                 "Slice", "Gather", "Split", "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool",
                 "ReduceMean", "ReduceMax", "Expand", "Tile", "DepthToSpace", "SpaceToDepth")


def value_bounds(view: GraphView) -> dict[str, float]:
    """Tensor -> a bound on its magnitude that holds for any input, for the tensors the rules reach: the ops of
    ``UNIT_BOUNDED``, a Clip between constants, a tensor over its own L2 norm (``_divides_by_own_norm``), and what
    follows them through ops of ``_WITHIN_INPUT``, Concat, nearest or linear Resize, and Mul, Add, Sub of bounded
    tensors or constants, Div by a constant, Pow with a constant positive exponent."""
    bounds: dict[str, float] = {}
    producers = {o: n for n in view.graph.node for o in n.output}

    def bound(name: str) -> float | None:
        if not name:
            return None
        if name in bounds:
            return bounds[name]
        c = view.const(name)
        if c is not None and c.size and np.issubdtype(c.dtype, np.floating) and np.all(np.isfinite(c)):
            return float(np.abs(c).max())
        return None

    for node in view.graph.node:
        if node.domain not in ("", "ai.onnx") or not node.input:
            continue
        op = node.op_type
        first = bound(node.input[0])
        out: float | None = None
        if op in UNIT_BOUNDED:
            out = 1.0
        elif op == "Clip" and len(node.input) == 3 and bound(node.input[1]) is not None \
                and bound(node.input[2]) is not None:
            out = max(bound(node.input[1]), bound(node.input[2]))
        elif op in _WITHIN_INPUT or (op == "Resize" and view.attrs(node).get("mode", b"nearest") in
                                     (b"nearest", b"linear", "nearest", "linear")):
            out = first
        elif op == "Concat":
            parts = [bound(i) for i in node.input]
            out = max(parts) if parts and None not in parts else None
        elif op in ("Div", "Mul") and len(node.input) == 2 and _divides_by_own_norm(node, view, producers):
            out = 1.0  # an element over the L2 norm of a group of elements that holds it
        elif op in ("Mul", "Add", "Sub") and len(node.input) == 2:
            second = bound(node.input[1])
            if first is not None and second is not None:
                out = first * second if op == "Mul" else first + second
        elif op == "Div" and len(node.input) == 2 and first is not None:
            c = view.const(node.input[1])
            if c is not None and c.size and np.all(c != 0):
                out = first / float(np.abs(c).min())
        elif op == "Pow" and len(node.input) == 2 and first is not None:
            e = view.const(node.input[1])
            if e is not None and e.size == 1 and float(e.reshape(-1)[0]) > 0:
                out = first ** float(e.reshape(-1)[0])
        if out is not None and np.isfinite(out):
            bounds.update({o: out for o in node.output if o})
    return bounds


# Ops whose float output is a whole number whatever their input.
WHOLE_MAKERS = ("Floor", "Ceil", "Round", "Sign")
# Ops that give whole numbers from whole numbers (and whole constants): data movement, max pooling, integer
# arithmetic. Not averaging or linear resizing, not division.
_KEEP_WHOLE = ("Relu", "Abs", "Neg", "Identity", "Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Slice",
               "Gather", "Split", "MaxPool", "GlobalMaxPool", "ReduceMax", "ReduceMin", "ReduceSum", "Expand", "Tile",
               "DepthToSpace", "SpaceToDepth", "Concat", "Add", "Sub", "Mul", "Max", "Min", "Clip", "Pad")
_INTEGER_TYPES = {TensorProto.BOOL, TensorProto.INT8, TensorProto.UINT8, TensorProto.INT16, TensorProto.UINT16,
                  TensorProto.INT32, TensorProto.UINT32, TensorProto.INT64, TensorProto.UINT64}


def integer_valued(view: GraphView) -> set[str]:
    """Float tensors that hold whole numbers only, whatever the input: the outputs of ``WHOLE_MAKERS``, a Cast of
    an integer or boolean tensor to float, a nearest Resize of one, and what ``_KEEP_WHOLE`` ops make of them
    with whole constants (their grids give each such number a level: ``grids.whole_steps``)."""
    found: set[str] = set()
    types = view.elem_types

    def whole(name: str) -> bool:
        if not name or name in found:
            return True  # an omitted optional input (Clip without a bound, Pad without a value)
        c = view.const(name)
        return c is not None and (not np.issubdtype(c.dtype, np.floating) or bool(np.all(c == np.round(c))))

    for node in view.graph.node:
        if node.domain not in ("", "ai.onnx") or not node.input:
            continue
        op = node.op_type
        if op in WHOLE_MAKERS:
            made = True
        elif op == "Cast":
            made = types.get(node.input[0]) in _INTEGER_TYPES
        elif op == "Resize":
            made = node.input[0] in found and view.attrs(node).get("mode", b"nearest") in (b"nearest", "nearest")
        elif op in _KEEP_WHOLE:
            data = node.input[:1] if op in ("Reshape", "Slice", "Gather", "Split", "Expand", "Tile", "Squeeze",
                                            "Unsqueeze", "ReduceMax", "ReduceMin", "ReduceSum") else node.input
            floats = [v for k, v in view.attrs(node).items() if k in ("min", "max", "value")]
            made = (data[0] in found if len(data) == 1 else any(i in found for i in data)) \
                and all(whole(i) for i in data) and all(float(v) == round(float(v)) for v in floats)
        else:
            made = False
        if made:
            found.update(o for o in node.output if o)
    return found


# Ops between a norm and the division that keep it at least the norm, each at its elements' places: eps clamps and
# additions, broadcasts (a Reshape could put one group's norm beside another group's elements).
_NORM_KEEPING = ("Clip", "Max", "Add", "Expand", "Identity")


def _divides_by_own_norm(node: NodeProto, view: GraphView, producers: dict[str, NodeProto]) -> bool:
    """Whether ``node`` is ``x / n`` or ``x * (1 / n)`` with ``n`` an L2 norm of ``x`` over some of its axes, kept
    at least that by an eps (``F.normalize``: ``x / max(||x||, eps)``; ``x / sqrt(sum(x * x) + eps)``; the
    optimize stage's ``x * Reciprocal(Sqrt(ReduceSum(x * x)))``): each element is at most its group's norm."""
    x, d = node.input
    if node.op_type == "Mul":
        for a, b in ((x, d), (d, x)):
            r = producers.get(b)
            if r is not None and r.op_type == "Reciprocal":
                x, d = a, r.input[0]
                break
        else:
            return False

    def non_negative(name: str) -> bool:
        c = view.const(name)
        return c is not None and c.size > 0 and bool(np.all(c >= 0))

    n = producers.get(d)
    while n is not None and n.op_type in _NORM_KEEPING:
        if n.op_type in ("Max", "Add") and not (len(n.input) == 2 and non_negative(n.input[1])):
            return False
        if n.op_type == "Clip" and ((len(n.input) > 2 and n.input[2]) or "max" in view.attrs(n)):
            return False  # an upper clip could take the norm below an element
        n = producers.get(n.input[0])
    if n is None or view.attrs(n).get("keepdims", 1) != 1:
        return False
    if n.op_type == "ReduceL2":
        return n.input[0] == x
    if n.op_type != "Sqrt":
        return False
    s = producers.get(n.input[0])
    while s is not None and s.op_type in ("Add", "Max") and len(s.input) == 2 and non_negative(s.input[1]):
        s = producers.get(s.input[0])  # sqrt(sum + eps)
    if s is None or view.attrs(s).get("keepdims", 1) != 1:
        return False
    if s.op_type == "ReduceSumSquare":
        return s.input[0] == x
    square = producers.get(s.input[0]) if s.op_type == "ReduceSum" else None
    if square is None:
        return False
    if square.op_type == "Mul":
        return list(square.input) == [x, x]
    return square.op_type == "Pow" and square.input[0] == x and view.const(square.input[1]) is not None and \
        view.const(square.input[1]).size == 1 and float(view.const(square.input[1]).reshape(-1)[0]) == 2.0

