"""The nodes an integer grid typically cannot serve: a log or division of values spanning many decades.

A power spectrum (|STFT|², a mel filterbank of it) holds values from about 1e-10 to 1e4: even a 16-bit grid
over that range puts the quiet bins on 0, and their log or reciprocal is then off by tens of dB. When the
int16 search finds that no grid reaches the float model, these chains are what the WARNING names for
``run_on_cpu``: each log / reciprocal / division reading a calibrated tensor, and what computes that tensor
back to the squaring that spreads its range (a convolution ends a chain: it is the feature extractor).
"""

from __future__ import annotations

from collections.abc import Collection

import numpy as np
from onnx import ModelProto, NodeProto, TensorProto, numpy_helper

# Ops that move data without computing: on the CPU between CPU nodes they follow by themselves.
_MOVES = {"Transpose", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Slice", "Concat", "Split",
          "Gather", "Expand", "Tile", "Pad", "Cast"}
_ENDS = {"Conv", "ConvTranspose"}
MOST = 10  # names in the WARNING at most


def fragile_nodes(model: ModelProto, calibrated: Collection[str]) -> list[str]:
    """Names of the nodes of ``model`` in such chains whose log / division input is in ``calibrated``.

    A log's chain always counts; a division's only where it reaches a squaring (dividing by the range of a
    log spectrum, or by a norm that ``eps`` keeps away from 0, is no such case)."""
    producers = {o: n for n in model.graph.node for o in n.output if o}
    constants = _constants(model)
    order = {n.name: k for k, n in enumerate(model.graph.node)}
    found: dict[str, None] = {}
    for node in model.graph.node:
        tensor = _fragile_input(node, constants)
        if tensor is None:
            continue
        chain, tensors, squared = _chain(tensor, producers, constants)
        # On a grid somewhere: the input itself, or a tensor the chain computes it from (a log on the CPU
        # reading a float BPU result still gets what the grids before it lost).
        gridded = any(t in calibrated for t in [tensor, *tensors])
        if gridded and (node.op_type == "Log" or squared):
            found.update(dict.fromkeys([node.name, *chain]))
    return sorted(found, key=lambda name: order.get(name, 0))[:MOST]


def _chain(tensor: str, producers: dict[str, NodeProto],
           constants: dict[str, TensorProto]) -> tuple[list[str], list[str], bool]:
    """The computing nodes from ``tensor`` up to a squaring, a convolution or another log / division, the
    tensors they read, and whether a squaring was reached."""
    chain: list[str] = []
    read: list[str] = []
    squared = False
    stack, seen = [tensor], set()
    while stack and len(chain) < 4 * MOST:
        producer = producers.get(stack.pop())
        if producer is None or producer.name in seen or producer.op_type in _ENDS \
                or _fragile_input(producer, constants) is not None:
            continue
        seen.add(producer.name)
        if producer.op_type not in _MOVES:
            chain.append(producer.name)
        inputs = [i for i in producer.input if i and i not in constants]
        read += inputs
        if _squares(producer, constants):
            squared = True
        else:
            stack.extend(inputs)
    return chain, read, squared


def _constants(model: ModelProto) -> dict[str, TensorProto]:
    """The model's constant tensors by name (read as arrays only where a value matters: a Pow's exponent)."""
    values = {t.name: t for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            values[node.output[0]] = node.attribute[0].t
    return values


def _exponent(node: NodeProto, constants: dict[str, TensorProto]) -> np.ndarray | None:
    if node.op_type != "Pow" or len(node.input) != 2 or node.input[1] not in constants:
        return None
    return numpy_helper.to_array(constants[node.input[1]])


def _fragile_input(node: NodeProto, constants: dict[str, TensorProto]) -> str | None:
    """The input whose small values the node magnifies: a log's, a reciprocal's, a divisor, a negative power's."""
    if node.op_type in ("Log", "Reciprocal") and node.input:
        return node.input[0]
    if node.op_type == "Div" and len(node.input) == 2 and node.input[1] not in constants:
        return node.input[1]
    exponent = _exponent(node, constants)
    return node.input[0] if exponent is not None and np.all(exponent < 0) else None


def _squares(node: NodeProto, constants: dict[str, TensorProto]) -> bool:
    """x * x or x ** 2 (or a higher even power): where a chain's range starts to spread."""
    if node.op_type == "Mul" and len(node.input) == 2 and node.input[0] == node.input[1]:
        return True
    exponent = _exponent(node, constants)
    return exponent is not None and bool(np.all(exponent >= 2))


def run_on_cpu_text(names: list[str], lead: str = "Here that is most likely this log / division chain") -> str:
    """The WARNING's suggestion, in the YAML list form that takes any node name (tf2onnx's hold ';')."""
    if not names:
        return ""
    return f" {lead}; keep it in float with run_on_cpu: [" + ", ".join(repr(n) for n in names) + "]"
