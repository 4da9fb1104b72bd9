"""Bounds on the magnitude of tensors that hold whatever the input: a Sigmoid's output stays within 1, twice it
squared within 4, YOLOv5's box size ``(2 * sigmoid) ** 2 * anchor`` within 4 anchors. An int16 grid that reaches
such a bound (``thresholds.int16_threshold``) keeps the values other pictures give beyond the calibration set's.
"""

from __future__ import annotations

import numpy as np

from hbtools.graph.graph import GraphView

# Ops whose output magnitude is at most 1 whatever their input.
UNIT_BOUNDED = ("Sigmoid", "HardSigmoid", "Tanh", "Softmax", "Softsign")
# Ops whose output's magnitude is at most their (first) input's: data movement, max/average pooling, ReLU.
_WITHIN_INPUT = ("Relu", "Abs", "Neg", "Identity", "Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze",
                 "Slice", "Gather", "Split", "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool",
                 "ReduceMean", "ReduceMax", "Expand", "Tile", "DepthToSpace", "SpaceToDepth")


def value_bounds(view: GraphView) -> dict[str, float]:
    """Tensor -> a bound on its magnitude that holds for any input, for the tensors the rules reach: the ops of
    ``UNIT_BOUNDED``, a Clip between constants, and what follows them through ops of ``_WITHIN_INPUT``, Concat,
    nearest or linear Resize, and Mul, Add, Sub of bounded tensors or constants, Div by a constant, Pow with a
    constant positive exponent."""
    bounds: dict[str, float] = {}

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
