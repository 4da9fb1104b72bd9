"""``remove_node_type`` / ``remove_node_name`` at compile time, and fast-perf's boundary clean-up.

Deleting a node at a model input or output is what ``hb_model_modifier`` does to
a finished ``.bin``; compile applies the same deletions (``hbtools.tools.modifier``,
one implementation) to the model before it is written, so the ``.bin`` records
each one in ``deleted_nodes``. Only nodes next to a model input or output go,
one at a time on the updated graph, in the order the config lists them: a node
that only becomes removable after a later entry has gone stays.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from onnx import ModelProto

from hbtools.config.values import closest_names
from hbtools.errors import HbError
from hbtools.log import first_of
from hbtools.ops.names import ROUND_TRIP_DOC
from hbtools.runtime.binfile import BinModel
from hbtools.tools import modifier

log = logging.getLogger("hbtools")


def _delete(model: BinModel, name: str, node_type: str, side: str) -> BinModel:
    model = modifier.delete(model, name)
    log.info("removed %s node %s at the model %s", node_type, name, side)
    return model


def _remove_type(model: BinModel, node_type: str) -> BinModel:
    """Every removable node of ``node_type``, including ones exposed by removing the previous."""
    wanted = node_type.lower()
    while True:
        found = [c for c in modifier.candidates(model.load_graph()) if c.type.lower() == wanted]
        if not found:
            return model
        model = _delete(model, found[0].name, found[0].type, found[0].side)


def _warn_type_kept(model: BinModel, node_type: str) -> None:
    """Say why ``node_type`` removed nothing (``model``: as it was at that type's turn)."""
    wanted = node_type.lower()
    kept = [n.name for n in model.load_graph().graph.node
            if modifier.display_type(n).lower() == wanted and n.doc_string != ROUND_TRIP_DOC]
    sizeless = {name: end for name, end in modifier.unsized(model.load_graph()).items() if name in kept} \
        if kept else {}
    if not kept:
        log.warning("remove_node_type: the model has no %s node; nothing removed", node_type)
    elif sizeless:
        name, end = next(iter(sizeless.items()))
        log.warning("remove_node_type: %s node %s kept: %s", node_type, name, modifier.unsized_reason(end))
    else:
        # Types go in the order listed: a node another type would expose later is not at the edge yet.
        log.warning("remove_node_type: no %s node is next to a model input or output when its turn comes "
                    "(%s kept); nothing removed", node_type, first_of(kept))


# Nodes the quantize stage adds: a Quantize / Dequantize is named after a tensor of the optimized model; layout
# Transposes, Casts and output copies after tensors it makes itself, which only compile knows.
TENSOR_SUFFIXES = ("_HzQuantize", modifier.DEQUANTIZE_SUFFIX)
ADDED_SUFFIXES = ("_Transpose", "_Cast", "_output")


def check_names(model: ModelProto, names: Sequence[str]) -> None:
    """Refuses, before calibration, a ``remove_node_name`` that no compiled form of ``model`` (the optimized model)
    can have: neither one of its nodes nor the Quantize / Dequantize of one of its tensors. A name that only the
    quantize stage can make (``ADDED_SUFFIXES``) is left to compile, as is whether a node is at an edge."""
    nodes = {n.name for n in model.graph.node if n.name}
    tensors = {*(o for n in model.graph.node for o in n.output), *(v.name for v in model.graph.input)}
    for name in names:
        if name in nodes or name.endswith(ADDED_SUFFIXES):
            continue
        if any(name.endswith(s) and name[:-len(s)] in tensors for s in TENSOR_SUFFIXES):
            continue
        made = [f"{t}{s}" for t in tensors for s in TENSOR_SUFFIXES]
        raise HbError(f"remove_node_name: the model has no node '{name}'{closest_names(name, [*nodes, *made])}",
                      hint="hb_model_modifier <model>.bin lists the nodes next to the model's inputs and outputs")


def _remove_name(model: BinModel, name: str) -> BinModel:
    graph = model.load_graph()
    node = modifier.node_named(graph, name)
    candidate = next((c for c in modifier.candidates(graph) if node is not None and c.name == node.name), None)
    if candidate is None:
        if node is None:  # SPEC §10: a node name the model does not have is an error
            names = dict.fromkeys([*(c.name for c in modifier.candidates(graph)), *(n.name for n in graph.graph.node)])
            raise HbError(f"remove_node_name: the model has no node '{name}'{closest_names(name, names)}",
                          hint="hb_model_modifier <model>.bin lists the nodes next to the model's inputs and outputs")
        else:
            log.warning("remove_node_name: node %s (%s) is not a removable node next to a model input or "
                        "output; kept", name, modifier.display_type(node))
        return model
    return _delete(model, name, candidate.type, candidate.side)


def remove_edge_nodes(model: BinModel, types: Sequence[str], names: Sequence[str], *,
                      until_stable: bool = False) -> BinModel:
    """Apply remove_node_type (each type in order), then remove_node_name (in order).

    ``until_stable`` (fast-perf) repeats the type pass while it still removes
    something, so e.g. a Transpose behind a Dequantize goes too.
    """
    while True:
        before = len(model.deleted_nodes)
        for node_type in types:
            at_turn = model
            model = _remove_type(model, node_type)
            # fast-perf's own list names every type it might meet; only a user's list deserves a warning
            if not until_stable and len(model.deleted_nodes) == len(at_turn.deleted_nodes):
                _warn_type_kept(at_turn, node_type)
        if not until_stable or len(model.deleted_nodes) == before:
            break
    for name in names:
        model = _remove_name(model, name)
    return model
