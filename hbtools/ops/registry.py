"""Lookup of Hz op classes by op type."""

from __future__ import annotations

import importlib
import pkgutil

import hbtools.ops
from hbtools.ops.base import HzOp

_OPS: dict[str, type[HzOp]] = {}
# Modules of the package that hold no op classes.
_NOT_OPS = {"base", "registry", "names", "twins", "int_kernels", "custom", "uint8_kernels", "fused"}
_loaded = False


def _load_all() -> None:
    """Import every op module of ``hbtools.ops`` once: each op class registers itself."""
    global _loaded
    if not _loaded:
        for mod in pkgutil.iter_modules(hbtools.ops.__path__):
            if mod.name not in _NOT_OPS:
                importlib.import_module(f"hbtools.ops.{mod.name}")
        _loaded = True


def register(cls: type[HzOp]) -> type[HzOp]:
    _OPS[cls.op_type] = cls
    return cls


def get(op_type: str) -> type[HzOp]:
    if op_type not in _OPS:
        _load_all()
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
    """Whether Hz op ``op_type`` has ``fact`` (``shape_preserving``, ``float_output``, ``mac``, ``boundary``,
    ``index_output``, ``reduction``)."""
    cls = op_class(op_type)
    return bool(cls is not None and getattr(cls, fact))


def op_for_unit_kind(kind: str) -> type[HzOp] | None:
    """The op class that quantizes units of ``kind`` by itself (``HzOp.unit_kind``), if any."""
    _load_all()
    return next((cls for cls in _OPS.values() if cls.unit_kind == kind), None)


def float64_exact(onnx_op: str) -> bool:
    """Whether an op class declares ONNX ``onnx_op`` exact on float64 twins (``HzOp.onnx_ops``)."""
    _load_all()
    return any(onnx_op in cls.onnx_ops and cls.float64_twins for cls in _OPS.values())
