"""Reshape targets written without the batch of one, so that a model made for one sample takes several.

Conversion fixes the input shapes, and onnxruntime then folds an exporter's shape arithmetic
(torch's ``x.view(x.size(0), -1)``, a Paddle recogniser's attention reshapes, a transformer's
``[B, N, heads, d]``) to constant ``Reshape`` targets that hold the batch of one. The float model
took a batch after a script's ``set_dim_param(0, 0, '?')``; its artefacts stopped at the first such
Reshape. ``free_batch`` rewrites the targets (the same shapes at batch 1); ``batch_free_reshapes``
keeps the rewrite only where a batch of samples then gives each sample's own outputs, checked by
running the model (a Reshape that folds the batch into another axis, or an op whose constant sizes
hold the batch, would mix samples or fail, and the model then stays as it was).
"""

from __future__ import annotations

import logging

import numpy as np
from onnx import ModelProto, helper, numpy_helper

from hbtools.graph.graph import GraphView

BATCH_DIM = "batch"
_TRIAL_BATCH = 2
log = logging.getLogger("hbtools")


def free_batch(model: ModelProto, shapes: dict[str, list[int | None]]) -> int:
    """Let the batch through the ``Reshape`` nodes of ``model`` (unchanged at batch 1); how many changed.

    A target without -1 gets -1 in front (the leading dimension takes whatever the
    batch multiplies); a target [1, ..., -1] on an input of batch 1 gets 0 (copy the
    batch). Other targets stay; whether the batch then passes is for the caller to check.
    """
    inits = {t.name: t for t in model.graph.initializer}
    made: dict[str, str] = {}
    changed = 0
    for node in model.graph.node:
        if node.op_type != "Reshape" or len(node.input) < 2 or node.input[1] not in inits:
            continue
        if any(a.name == "allowzero" and a.i for a in node.attribute):
            continue
        target = numpy_helper.to_array(inits[node.input[1]]).astype(np.int64)
        if target.ndim != 1 or not target.size or target[0] == 0:
            continue
        source = shapes.get(node.input[0])
        if -1 not in target:
            target[0] = -1
        elif target[0] == 1 and source and source[0] == 1:
            target[0] = 0
        else:
            continue
        key = f"{node.input[1]}:{target.tolist()}"
        if key not in made:
            made[key] = _unique(f"{node.input[1]}__batched", inits)
            inits[made[key]] = numpy_helper.from_array(target, made[key])
            model.graph.initializer.append(inits[made[key]])
        node.input[1] = made[key]
        changed += 1
    return changed


def batch_free_reshapes(model: ModelProto) -> None:
    """Write ``free_batch``'s targets into ``model`` where a batch then gives each sample's outputs; else leave it.

    Only for models whose inputs all have a batch of one. Checked on random inputs: a batch of two distinct
    samples against the two run one by one (the float model: equal to float rounding), its weights read where
    they are (no copy of the model). The batch-1 targets no node reads any more are dropped.
    """
    inits = {t.name for t in model.graph.initializer}
    inputs = [vi for vi in model.graph.input if vi.name not in inits]
    dims = [[d.dim_value if d.HasField("dim_value") else None for d in vi.type.tensor_type.shape.dim]
            for vi in inputs]
    if not inputs or any(not d or d[0] != 1 or None in d for d in dims):
        return
    reshapes = [n for n in model.graph.node if n.op_type == "Reshape" and len(n.input) > 1]
    targets = [n.input[1] for n in reshapes]
    kept = len(model.graph.initializer)
    if not free_batch(model, GraphView(model).shapes):
        return
    if _takes_a_batch(model, {vi.name: (d, vi.type.tensor_type.elem_type) for vi, d in zip(inputs, dims,
                                                                                          strict=True)}):
        read = {i for n in model.graph.node for i in n.input} | {o.name for o in model.graph.output}
        unread = {t for t in targets if t not in read}
        for t in [t for t in model.graph.initializer if t.name in unread]:
            model.graph.initializer.remove(t)
        return
    for node, target in zip(reshapes, targets, strict=True):  # undone: the batch-1 targets again
        node.input[1] = target
    del model.graph.initializer[kept:]
    log.debug("the folded Reshape targets keep the batch of one: a batch of samples does not give each its "
              "own outputs")


def _takes_a_batch(model: ModelProto, inputs: dict[str, tuple[list[int], int]]) -> bool:
    from hbtools.runtime.lowering import lowered_parts
    from hbtools.runtime.session import make_session

    rng = np.random.default_rng(0)
    samples = [{name: _random(rng, shape, elem) for name, (shape, elem) in inputs.items()}
               for _ in range(_TRIAL_BATCH)]
    # The batch open while the model is lowered, as HB_ONNXRuntime's set_dim_param has it; the probe is a new
    # graph whose weights are the model's own, not copies.
    firsts = [vi.type.tensor_type.shape.dim[0] for vi in model.graph.input if vi.name in inputs]
    try:
        for dim in firsts:
            dim.dim_param = BATCH_DIM
        probe, constants = lowered_parts(model)
        for out in probe.graph.output:
            out.type.tensor_type.ClearField("shape")
        session = make_session(probe, threads=1, constants=constants)
        alone = [session.run(None, s) for s in samples]
        together = session.run(None, {name: np.concatenate([s[name] for s in samples]) for name in inputs})
    except Exception as e:  # noqa: BLE001 - onnxruntime's exception types are not importable; any failure: no batch
        log.debug("a batch of samples does not run: %s", e)
        return False
    finally:
        for dim in firsts:
            dim.dim_value = 1
    # Outputs of another size per sample (the boxes an NMS keeps) or scalars cannot be checked: the batch of
    # one stays.
    if any(a[k].shape != alone[0][k].shape or not a[k].ndim for a in alone for k in range(len(together))):
        return False
    # Outputs that do not depend on the samples tell nothing: at least one must differ between them.
    differ = any(not np.array_equal(alone[0][k], alone[1][k]) for k in range(len(together)))
    return differ and all(same_outputs(got, np.concatenate([a[k] for a in alone]))
                          for k, got in enumerate(together))


def _random(rng: np.random.Generator, shape: list[int], elem: int) -> np.ndarray:
    """Distinct samples that most models take: positive floats (a log or a square root of them is finite),
    pictures' bytes, 0 / 1 for other integers (indices into any table of two rows or more) and booleans."""
    dtype = helper.tensor_dtype_to_np_dtype(elem)
    if dtype.kind == "f":
        return rng.uniform(0.05, 1.0, shape).astype(dtype)
    if dtype in (np.uint8, np.int8):  # pictures and their int8 form
        info = np.iinfo(dtype)
        return rng.integers(info.min, int(info.max) + 1, shape, dtype=dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(np.bool_)
    return rng.integers(0, 2, shape).astype(dtype)


def same_outputs(got: np.ndarray, want: np.ndarray) -> bool:
    """Whether a batched run's output ``got`` is the samples' own outputs ``want`` (floats: to float rounding,
    the same values non-finite where any is; an output with no finite value at all proves nothing: False)."""
    if got.shape != want.shape:
        return False
    if got.dtype.kind != "f":
        return bool(np.array_equal(got, want))
    finite = np.isfinite(want)
    if not np.array_equal(finite, np.isfinite(got)) or not np.array_equal(got[~finite], want[~finite],
                                                                          equal_nan=True):
        return False
    if not finite.any():
        return not want.size
    # The tolerance for values near 0 follows the output's typical size, not its largest: one huge value (an exp
    # of a large input) would otherwise let any difference elsewhere through.
    sizes = np.abs(want[finite])
    sizes = sizes[sizes > 0]
    typical = float(np.median(sizes)) if sizes.size else 0.0
    return bool(np.allclose(got[finite], want[finite], rtol=1e-4, atol=1e-5 * typical + 1e-30))


def _unique(name: str, taken: dict) -> str:
    k, out = 0, name
    while out in taken:
        k += 1
        out = f"{name}{k}"
    return out
