"""Will a run fit in memory? Checked before any work, so a too-large ``input_shape``
is one ERROR line instead of a MemoryError half-way through."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Sequence

import numpy as np
import onnx

from hbtools.errors import ResourceError
from hbtools.graph.graph import shape_probe

log = logging.getLogger("hbtools")

# Copies of one input sample alive at once in a run (the sample, its preprocessed
# float copy, the session's input buffer, the random samples of skip/load).
INPUT_COPIES = 6


def available_memory() -> int | None:
    """Bytes the kernel says a new allocation can get (MemAvailable), or None if unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _elements(shape: Iterable[int]) -> int:
    return int(np.prod([max(int(d), 1) for d in shape], dtype=np.float64))


def check_memory(model: onnx.ModelProto, shapes: Sequence[Sequence[int]]) -> None:
    """Both checks below, the cheap one first."""
    check_input_sizes(shapes)
    check_model_memory(model)


def check_input_sizes(shapes: Sequence[Sequence[int]], what: str = "input_shape") -> None:
    """Refuse inputs whose copies alone cannot fit (cheap: before the model is touched)."""
    need = sum(_elements(s) for s in shapes) * 4 * INPUT_COPIES
    _check(need, f"the inputs ({what} {', '.join('x'.join(map(str, s)) for s in shapes)})")


def check_model_memory(model: onnx.ModelProto) -> None:
    """Refuse a model whose float activations (all fetched at once by calibration) cannot fit."""
    try:  # without the weights, which shapes do not need (a copy of them took as much again as the model)
        inferred = onnx.shape_inference.infer_shapes(shape_probe(model))
    except Exception:  # noqa: BLE001 -- an estimate only: without shapes there is nothing to check
        return
    own = {vi.name for vi in model.graph.input}  # the probe declares the weights as inputs too
    graph_inputs = [vi for vi in inferred.graph.input if vi.name in own]
    total = 0
    for vi in [*graph_inputs, *inferred.graph.value_info, *inferred.graph.output]:
        dims = vi.type.tensor_type.shape.dim
        if dims and all(d.HasField("dim_value") for d in dims):
            total += _elements(d.dim_value for d in dims) * 4
    inputs = sum(_elements(d.dim_value for d in vi.type.tensor_type.shape.dim) * 4 for vi in graph_inputs)
    _check(total + inputs * INPUT_COPIES, "the model's activations at this input_shape")


def _check(need: int, what: str) -> None:
    have = available_memory()
    log.debug("memory estimate: %d bytes for %s, %s available", need, what, have)
    if have is not None and need > have:
        raise ResourceError(
            f"the run needs about {_gib(need)} of memory for {what}, but {_gib(have)} is available; "
            f"use a smaller input_shape or a machine with more memory"
        )


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"
