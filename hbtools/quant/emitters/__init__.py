"""One emitter per partition-unit kind: the unit's float nodes -> Hz integer ops.

An emitter is ``emit(state, unit)``; it reads its inputs' integer forms from the
shared ``EmitState`` and records the integer tensors it writes. Adding a BPU op
kind is one module here plus its op class in ``hbtools.ops`` -- or just the op class, when
it declares the unit kind and emits its units itself (``HzOp.unit_kind``, ``HzOp.emit``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from hbtools.ops import registry
from hbtools.quant.emitters.state import EmitState, QTensor, QuantizedResult
from hbtools.quant.units import Unit

Emitter = Callable[[EmitState, Unit], None]
_EMITTERS: dict[str, Emitter] = {}
_MODULES = ("preprocess", "conv", "matmul", "lut", "eltwise", "pool", "passive", "concat", "cpu")


def emits(kind: str) -> Callable[[Emitter], Emitter]:
    """Register the decorated function as the emitter of unit kind ``kind``."""
    def register(fn: Emitter) -> Emitter:
        _EMITTERS[kind] = fn
        return fn
    return register


def emitter_for(unit: Unit) -> Emitter:
    """The emitter of ``unit``: its kind's on the BPU, the float pass-through on the CPU."""
    if not _EMITTERS:
        for mod in _MODULES:
            importlib.import_module(f"{__name__}.{mod}")
    kind = unit.kind if unit.on == "BPU" else "cpu"
    if kind in _EMITTERS:
        return _EMITTERS[kind]
    op = registry.op_for_unit_kind(kind)  # an op class that quantizes its units itself
    if op is None:
        raise RuntimeError(f"no emitter for BPU unit kind {kind!r} ({unit.name})")
    return op.emit


__all__ = ["EmitState", "QTensor", "QuantizedResult", "emits", "emitter_for"]
