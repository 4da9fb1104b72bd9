"""Lookup of Hz op classes by op type."""

from __future__ import annotations

import importlib

from hbtools.ops.base import HzOp

_OPS: dict[str, type[HzOp]] = {}
# Modules that define Hz ops; imported on first lookup so each op registers itself.
_OP_MODULES = ("hbtools.ops.preprocess", "hbtools.ops.calibration", "hbtools.ops.quantized")


def register(cls: type[HzOp]) -> type[HzOp]:
    _OPS[cls.op_type] = cls
    return cls


def get(op_type: str) -> type[HzOp]:
    if op_type not in _OPS:
        for mod in _OP_MODULES:
            importlib.import_module(mod)
    try:
        return _OPS[op_type]
    except KeyError:
        raise KeyError(f"unknown Hz op type {op_type!r}") from None


def op_class(op_type: str) -> type[HzOp] | None:
    """The Hz op class of ``op_type``, or None for any other op type."""
    try:
        return get(op_type)
    except KeyError:
        return None


def has_fact(op_type: str, fact: str) -> bool:
    """Whether Hz op ``op_type`` has ``fact`` (``shape_preserving``, ``float_output``, ``mac``, ``boundary``)."""
    cls = op_class(op_type)
    return bool(cls is not None and getattr(cls, fact))
