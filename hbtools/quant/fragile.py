"""The nodes an integer grid typically cannot serve: a log or division of values spanning many decades, and
recurrent layers unrolled over their time steps.

A power spectrum (|STFT|², a mel filterbank of it) holds values from about 1e-10 to 1e4: even a 16-bit grid
over that range puts the quiet bins on 0, and their log or reciprocal is then off by tens of dB. When the
int16 search finds that no grid reaches the float model, these chains are what the WARNING names for
``run_on_cpu``: each log / reciprocal / division of a tensor computed from a square (through at most one
convolution: a mel filterbank), and the nodes between, by the user's names; and each root of such a tensor that
no division reads (a magnitude, silero-vad's sqrt(re² + im²): its quiet frames' squares fell on 0 and 12 % of its
voice decisions flipped, none with those four nodes in float).
"""

from __future__ import annotations

from collections.abc import Collection

import numpy as np
from onnx import ModelProto, NodeProto, TensorProto, numpy_helper

from hbtools.graph.constant_terms import CARRIES
from hbtools.graph.origins import recorded_origins, user_node
from hbtools.graph.recurrent import unrolled_layers

# Ops that move data without computing: on the CPU between CPU nodes they follow by themselves.
_MOVES = {*CARRIES, "Pad", "Cast"}
_ENDS = {"Conv", "ConvTranspose"}
MOST = 10  # names in the WARNING at most
DEEPEST = 10  # nodes between a log / division and its squaring at most
CHAIN = "this chain from a squaring to a log, division or root"  # what the WARNING calls ``fragile_nodes``


def _index(model: ModelProto) -> tuple[dict[str, NodeProto], dict[str, list[NodeProto]], dict[str, TensorProto]]:
    """Each tensor's producer, each tensor's readers, and the constants of ``model``."""
    producers = {o: n for n in model.graph.node for o in n.output if o}
    readers: dict[str, list[NodeProto]] = {}
    for n in model.graph.node:
        for i in set(n.input):
            readers.setdefault(i, []).append(n)
    return producers, readers, _constants(model)


def fragile_nodes(model: ModelProto, calibrated: Collection[str]) -> list[str]:
    """The user's names (``graph.origins``) of the nodes on the ways from a log / division whose input
    holds ``calibrated`` tensors back to a squaring.

    Only such chains: a log of anything else (of a probability, or with a floor the optimize stage
    folded into a bias where no squaring precedes) is no case for the CPU, and moving the log alone
    there can make it read exact zeros."""
    producers, readers, constants = _index(model)
    order = {n.name: k for k, n in enumerate(model.graph.node)}
    found: dict[str, None] = {}
    for node in model.graph.node:
        tensor = _fragile_input(node, constants)
        if tensor is None and _root(node, constants) and not _divides_by(node, readers, constants):
            tensor = node.input[0]  # a magnitude (an STFT's sqrt(re² + im²)): its squares span twice the decades
        if tensor is None:
            continue
        chain = _to_squares(tensor, producers, constants, 0, 0, set())
        if chain and _normalises(node, chain, readers, constants):
            continue
        if chain and any(o in calibrated for n in [node, *chain] for o in [*n.input, *n.output]):
            found.update(dict.fromkeys(n.name for n in sorted([node, *chain], key=lambda n: order[n.name])
                                       if n.op_type not in _MOVES))
    origins = recorded_origins(model)
    return list(dict.fromkeys(user_node(origins, name) for name in found))[:MOST]


def _to_squares(tensor: str, producers: dict[str, NodeProto], constants: dict[str, TensorProto], depth: int,
                convs: int, seen: set[str]) -> list[NodeProto] | None:
    """The nodes on the ways from ``tensor`` up to a squaring, through at most one convolution (a mel
    filterbank between the power and its log) and ``DEEPEST`` nodes; None where no squaring is reached
    (another log / division, a model input, a second convolution)."""
    producer = producers.get(tensor)
    if producer is None or depth > DEEPEST or producer.name in seen or _fragile_input(producer, constants) is not None:
        return None
    seen.add(producer.name)
    if _squares(producer, constants):
        return [producer]
    if producer.op_type in _ENDS:
        if convs:
            return None
        convs += 1
    found: list[NodeProto] = []
    for i in producer.input:
        if i and i not in constants:
            found += _to_squares(i, producers, constants, depth + 1, convs, seen) or []
    return [producer, *found] if found else None


def _normalises(node: NodeProto, chain: list[NodeProto], readers: dict[str, list[NodeProto]],
                constants: dict[str, TensorProto]) -> bool:
    """Whether ``node`` divides a tensor by a root of the sum of its own squares (an L2 or RMS normalisation,
    ``x / sqrt(mean(x * x))``): the quotient keeps the scale of neither, so a grid serves it. ``x / (x * x)``,
    with no root between, is 1 / x, and stays such a chain."""
    if not any(_root(n, constants) for n in chain):
        return False
    squared = {n.input[0] for n in chain if _squares(n, constants)}
    if node.op_type == "Div":
        numerators = [node.input[0]]
    else:  # a reciprocal, read by products (the optimize stage writes a division so)
        numerators = [i for r in readers.get(node.output[0], []) if r.op_type == "Mul" for i in r.input
                      if i != node.output[0]]
    return bool(numerators) and all(n in squared for n in numerators)


def _divides_by(node: NodeProto, readers: dict[str, list[NodeProto]], constants: dict[str, TensorProto]) -> bool:
    """Whether a division or reciprocal reads ``node``'s output (after an added constant, an epsilon): then
    that division is the chain's end, judged as such (a normalisation or not)."""
    outs = [node.output[0]]
    outs += [r.output[0] for r in readers.get(node.output[0], []) if r.op_type == "Add"
             and any(i in constants for i in r.input)]
    return any(_fragile_input(r, constants) == o for o in outs for r in readers.get(o, []))


def _root(node: NodeProto, constants: dict[str, TensorProto]) -> bool:
    exponent = _exponent(node, constants)
    return node.op_type == "Sqrt" or (exponent is not None and bool(np.all((exponent > 0) & (exponent < 1))))


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


def reciprocal_tables(model: ModelProto, calibrated: Collection[str]) -> list[str]:
    """The user's names of the nodes computed through a reciprocal lookup table of a ``calibrated`` tensor: the
    Divs of two tensors the optimize stage wrote as a product with a reciprocal (``bpu_forms``), and Reciprocals.
    A table over a divisor spanning several decades across the samples (EfficientViT's linear attention divides
    by sums from 0.1 to 4000) holds neither end: its cosine stays low with every activation int16, and the same
    Divs in float take it from 0.965 to 0.995."""
    producers, readers, constants = _index(model)
    origins = recorded_origins(model)
    found: dict[str, None] = {}
    for node in model.graph.node:
        # the table may read an earlier tensor (a + eps folds into it): its output is the one on a grid then
        if node.op_type != "Reciprocal" or node.domain not in ("", "ai.onnx") or not node.input \
                or not any(t in calibrated for t in [*node.input, *node.output]):
            continue
        chain = _to_squares(node.input[0], producers, constants, 0, 0, set())
        if not (chain and _normalises(node, chain, readers, constants)):  # as fragile_nodes: a grid serves those
            found[user_node(origins, node.name)] = None
    return list(found)[:MOST]


def float_advice(model: ModelProto, calibrated: Collection[str], weights: bool = False) -> str:
    """The WARNING's suggestion of nodes to keep in float, when no grid brings the output near float: a log /
    division chain (``fragile_nodes``) and the divisions through a reciprocal table (``reciprocal_tables``), and
    the recurrent layers unrolled over their time steps, whose int8 weights' error comes back at every step
    (Resemblyzer's 64-step LSTM: embeddings at cosine 0.911 on the BPU, 0.988 with the layer on the CPU).
    ``weights``: the loss is known to be in the weights' grids, where the layers come first and the divisions
    only may add to it."""
    chain = fragile_nodes(model, calibrated)
    tables = [name for name in reciprocal_tables(model, calibrated) if name not in chain]
    divisions = [*chain, *tables][:MOST]
    layers = unrolled_layers(model)
    recurrent = run_on_cpu_text(layers, "Here that is most likely the recurrence unrolled over its time steps "
                                        "(its int8 weights' error comes back at every step)")
    if weights:
        return recurrent + run_on_cpu_text(divisions, "A chain from a squaring to a log, division or root, or a "
                                                      "division through a reciprocal table may lose accuracy too")
    if not divisions:
        return recurrent
    if not tables:
        return run_on_cpu_text(chain)
    what = ("these divisions, each" if len(divisions) > 1 else "this division,") + " computed through a " \
        "reciprocal lookup table, which cannot hold a divisor spanning several decades across the samples"
    return run_on_cpu_text(divisions, f"Here that is most likely {CHAIN + ' or ' if chain else ''}"
                                      f"{what}")


def run_on_cpu_text(names: list[str], lead: str = f"Here that is most likely {CHAIN}") -> str:
    """The WARNING's suggestion, in the YAML list form that takes any node name (tf2onnx's hold ';')."""
    if not names:
        return ""
    return f" {lead}; keep it in float with run_on_cpu: [" + ", ".join(repr(n) for n in names) + "]"
