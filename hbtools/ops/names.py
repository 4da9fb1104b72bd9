"""Naming contracts between the artefacts and the tools that read them.

A calibrated model names the node calibrating tensor ``T`` ``T_HzCalibration``
(seed 002); a session built with ``feed_calibration`` takes that node's grid and
enable flag from graph inputs ``<node>_scale``, ``<node>_qmax``, ``<node>_qmin``,
``<node>_zero_point`` and ``<node>_enable``; the quantized model holds the integer
form of float tensor ``T`` as ``T_quantized``. Every module builds and parses these
names here. The calibrated model also records which of its nodes the quantized model
runs in float on the CPU (metadata ``hbtools.cpu_nodes``), so that its emulation computes
them in float32 as the quantized model does. The two halves of a split convolution carry
``SPLIT_DOC`` as their doc_string.
"""

from __future__ import annotations

from onnx import ModelProto, NodeProto

from hbtools.graph.model_io import read_json_metadata, write_json_metadata

CALIBRATION_SUFFIX = "_HzCalibration"
QUANTIZED_SUFFIX = "_quantized"
CALIBRATED_SUFFIX = "_calibrated"  # the calibrated model's fake-quantized value of ``T``
# What the artefacts add next to a tensor ``T``: a source tensor named so is renamed by the parse stage.
RESERVED_SUFFIXES = (QUANTIZED_SUFFIX, CALIBRATED_SUFFIX)
FED_GRID_PARTS = ("scale", "qmax", "qmin", "zero_point", "enable")
CPU_NODES_KEY = "hbtools.cpu_nodes"
# doc_string of the two convolutions a layer is split into (``quant.weight_precision``); the plan keeps
# their outputs int16.
SPLIT_DOC = "hbtools: half of a convolution whose weight is split in two (weight precision)"
# doc_string of the Casts around an op whose integer kernel onnxruntime lacks (the quantized model runs it on the
# integers in float32): no node of the user's model, so no message names them as one.
ROUND_TRIP_DOC = "hbtools: integers through a float32 kernel"


def calibration_node(tensor: str) -> str:
    """Name of the HzCalibration node of ``tensor``."""
    return f"{tensor}{CALIBRATION_SUFFIX}"


def calibrated_tensor(node: NodeProto) -> str:
    """The float tensor a HzCalibration node calibrates."""
    if node.name.endswith(CALIBRATION_SUFFIX):
        return node.name[: -len(CALIBRATION_SUFFIX)]
    return node.input[0]


def fed_input(node_name: str, part: str) -> str:
    """Graph input feeding ``part`` (scale, qmax, qmin, zero_point, enable) of a calibration node."""
    if part not in FED_GRID_PARTS:
        raise ValueError(f"unknown fed part {part!r}")
    return f"{node_name}_{part}"


def enable_input(node_name: str) -> str:
    """Boolean graph input switching a calibration node on or off (search, debugger)."""
    return fed_input(node_name, "enable")


def quantized_tensor(tensor: str) -> str:
    """Name of the integer form of float ``tensor`` in the quantized model."""
    return f"{tensor}{QUANTIZED_SUFFIX}"


def record_cpu_nodes(model: ModelProto, names: list[str]) -> None:
    """Record in ``model``'s metadata the nodes the quantized model runs on the CPU."""
    write_json_metadata(model, CPU_NODES_KEY, list(names))


def recorded_cpu_nodes(model: ModelProto) -> set[str]:
    """The nodes ``record_cpu_nodes`` recorded (none for a model without the record)."""
    return set(read_json_metadata(model, CPU_NODES_KEY) or ())
