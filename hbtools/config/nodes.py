"""Per-node settings: ``node_info``, ``set_node_data_type``, ``run_on_cpu/bpu``, ``optimization``.

The three older parameters are folded into ``ModelParameters.node_info`` (the newer
seed merged them the same way), so downstream code has a single place to look.
"""

from __future__ import annotations

import re
from typing import Any

import onnx.defs

from hbtools.config.model import NodeInfo
from hbtools.config.values import (
    did_you_mean,
    fail,
    group_error,
    inline_mapping,
    is_unset,
    split_multi,
)
from hbtools.log import logger

DATA_TYPES = ("int8", "int16")
NODE_INFO_FORMS = (
    "a mapping {node_name: {ON: BPU|CPU, InputType: int8|int16, InputType<N>: int8|int16, "
    "OutputType: int8|int16}} or a string 'node_name1:int16;node_name2:int16'"
)


def _data_type(key: str, node: str, value: Any) -> str:
    text = str(value).strip().lower()
    if text not in DATA_TYPES:
        fail(f"'{key}' of node '{node}' is {value!r}; use int8 or int16")
    return text


def _node_entry(node: str, spec: Any) -> NodeInfo:
    if not isinstance(spec, dict) or not spec:
        fail(f"'node_info' entry '{node}' must be a non-empty mapping; write {NODE_INFO_FORMS}")
    info = NodeInfo()
    for raw_key, value in spec.items():
        # Unquoted ON is YAML 1.1 for boolean true, so PyYAML hands us True as the key.
        key = "ON" if raw_key is True else str(raw_key).strip()
        if key.upper() == "ON":
            on = str(value).strip().upper()
            if on not in ("BPU", "CPU"):
                fail(f"'ON' of node '{node}' is {value!r}; use BPU or CPU")
            info.on = on
        elif m := re.fullmatch(r"inputtype(\d*)", key, re.IGNORECASE):
            index = int(m.group(1)) if m.group(1) else None
            info.input_types[index] = _data_type(key, node, value)
        elif key.lower() == "outputtype":
            info.output_type = _data_type(key, node, value)
        elif re.fullmatch(r"outputtype\d+", key, re.IGNORECASE):
            fail(
                f"'{key}' of node '{node}' is not supported: OutputType always applies to all "
                f"outputs of the node; write 'OutputType'"
            )
        else:
            fail(
                f"unknown key '{key}' in node_info entry '{node}'; use ON, InputType, "
                f"InputType<N> (N = input index) or OutputType"
            )
    return info


def parse_node_info(value: Any) -> dict[str, NodeInfo]:
    """``node_info`` in either documented form -> {node name: NodeInfo}."""
    value = inline_mapping(value)
    if isinstance(value, dict):
        return {str(node).strip(): _node_entry(str(node), spec) for node, spec in value.items()}
    if not isinstance(value, str):
        fail(f"'node_info' must be {NODE_INFO_FORMS}, got {value!r}")
    out: dict[str, NodeInfo] = {}
    for item in split_multi("node_info", value):
        if is_unset(item):
            continue
        node, sep, dtype = item.rpartition(":")
        if not sep or not node.strip():
            fail(
                f"'node_info' item {item!r} has no data type; write 'node_name:int16' "
                f"or use the mapping form {NODE_INFO_FORMS}"
            )
        # The string form takes over set_node_data_type, which sets a node's output type: the
        # output only, as the vendor's parser reads it (the mapping form names inputs).
        dtype = _data_type("node_info", node.strip(), dtype)
        out[node.strip()] = NodeInfo(output_type=dtype)
    return out


def parse_set_node_data_type(value: Any) -> list[str]:
    """``set_node_data_type``: node names (optionally ``name:int16``) whose OUTPUT is int16."""
    names: list[str] = []
    for item in split_multi("set_node_data_type", value):
        if is_unset(item):
            continue
        node, sep, dtype = str(item).rpartition(":")
        if sep and dtype.strip().lower() != "int16":
            fail(
                f"'set_node_data_type' item {item!r}: only int16 can be set here; "
                f"use node_info for other data types"
            )
        names.append(node.strip() if sep else str(item))
    return names


def merge_node_settings(
    node_info: dict[str, NodeInfo],
    int16_outputs: list[str],
    run_on_cpu: list[str],
    run_on_bpu: list[str],
) -> dict[str, NodeInfo]:
    """Fold the older per-node parameters into node_info. node_info replaces them: where they
    contradict it, node_info's setting is kept with a WARNING (as the vendor's parser does); a node
    in both run_on_cpu and run_on_bpu is an error."""
    both = [n for n in run_on_cpu if n in run_on_bpu]
    if both:
        raise group_error(
            "calibration_parameters",
            f"node '{both[0]}' is in both run_on_cpu and run_on_bpu; keep it in one",
        )
    merged = {
        name: NodeInfo(info.on, dict(info.input_types), info.output_type)
        for name, info in node_info.items()
    }
    for names, on in ((run_on_cpu, "CPU"), (run_on_bpu, "BPU")):
        for name in names:
            info = merged.setdefault(name, NodeInfo(given_by=f"run_on_{on.lower()}"))
            if info.on not in (None, on):
                logger.warning("node_info puts node '%s' on %s and calibration_parameters.run_on_%s puts it on %s: "
                               "node_info replaces run_on_cpu / run_on_bpu, so the node runs on %s; remove it from "
                               "run_on_%s", name, info.on, on.lower(), on, info.on, on.lower())
                continue
            info.on = on
    for name in int16_outputs:
        info = merged.setdefault(name, NodeInfo(given_by="set_node_data_type"))
        if info.output_type not in (None, "int16"):
            logger.warning("node_info sets OutputType %s for node '%s' and set_node_data_type asks for int16: "
                           "node_info replaces set_node_data_type, so the output is %s; remove the node from "
                           "set_node_data_type", info.output_type, name, info.output_type)
            continue
        info.output_type = "int16"
    return merged


def node_info_snapshot(node_info: dict[str, NodeInfo]) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for name, info in node_info.items():
        entry: dict[str, str] = {}
        if info.on:
            entry["ON"] = info.on
        for index, dtype in sorted(
            info.input_types.items(), key=lambda kv: (kv[0] is not None, kv[0] or 0)
        ):
            entry["InputType" if index is None else f"InputType{index}"] = dtype
        if info.output_type:
            entry["OutputType"] = info.output_type
        out[name] = entry
    return out


FIXED_OPTIMIZATIONS = (
    "set_model_output_int8",
    "set_model_output_int16",
    "set_all_nodes_int16",
    "set_all_nodes_int8",
    "set_Softmax_input_int8",
    "set_Softmax_output_int8",
    "asymmetric",
    "bias_correction",
    "lstm_batch_last",
)
OPTIMIZATION_FORMS = ", ".join(
    (*FIXED_OPTIMIZATIONS, "set_{NodeKind}_input_int16", "set_{NodeKind}_output_int16",
     "set_{NodeKind}_input_int8", "set_{NodeKind}_output_int8")
)


def _onnx_op_types() -> list[str]:
    return sorted({s.name for s in onnx.defs.get_all_schemas() if s.domain in ("", "ai.onnx")})


def _check_optimization(item: str) -> None:
    if item in FIXED_OPTIMIZATIONS:
        return
    m = re.fullmatch(r"set_(\w+?)_(input|output)_int(?:16|8)", item)
    if not m:
        fail(
            f"'optimization' value {item!r} is not valid{did_you_mean(item, FIXED_OPTIMIZATIONS)}; "
            f"use one or more of (separated by ';' or ','): {OPTIMIZATION_FORMS}"
        )
    kind = m.group(1)
    if not onnx.defs.has(kind):
        # NodeKind is the ONNX op type, and op types are case-sensitive (Conv, not conv).
        same_case = [op for op in _onnx_op_types() if op.lower() == kind.lower()]
        hint = (
            f" (did you mean '{same_case[0]}'?)"
            if same_case
            else did_you_mean(kind, _onnx_op_types())
        )
        fail(
            f"'optimization' value {item!r}: '{kind}' is not an ONNX op type{hint}; "
            f"NodeKind is the case-sensitive ONNX op type, e.g. set_Conv_output_int16"
        )


def parse_optimization(value: Any) -> list[str]:
    items: list[str] = []
    for item in split_multi("optimization", value):
        if is_unset(item):
            continue
        # Reference configs separate optimizations with ',' as well as ';'.
        for part in str(item).split(","):
            text = part.strip()
            if not text:
                continue
            _check_optimization(text)
            if text not in items:
                items.append(text)
    if "set_model_output_int8" in items and "set_model_output_int16" in items:
        fail("'optimization' has both set_model_output_int8 and set_model_output_int16; keep one")
    if "set_all_nodes_int8" in items and "set_all_nodes_int16" in items:
        fail("'optimization' has both set_all_nodes_int8 and set_all_nodes_int16; keep one")
    return items
