"""The calibrated model's Softmax and LogSoftmax read the kernel's exp table.

The quantized kernel looks ``exp((x - max) * step)`` up in a table of 2**bits entries. The
calibrated model builds the same table with the same ops over the same differences and reads it
as the kernel does, so the two agree bit for bit, and a run computes no exponential per element:
with a constant step onnxruntime folds the table into a constant; with a fed step (the threshold
searches) one exponential per table entry replaces one per element of a large tensor.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from builders import FloatModel, _Graph, held_out, make_project

from hbtools.log import setup
from hbtools.ops.base import attrs_of
from hbtools.pipeline.runner import makertbin
from hbtools.quant.grids import Grid, fed_values
from hbtools.runtime import HB_ONNXRuntime
from hbtools.runtime.lowering import lower_model
from hbtools.runtime.session import make_session, ort_session

SIDE = 96  # 8 x 96 x 96 = 73,728 elements: more than an int16 table's 65,536 entries


def channel_softmax(op: str) -> FloatModel:
    """A segmentation head: conv to 8 classes at full resolution, (Log)Softmax over the classes."""
    g = _Graph(7)
    logits = g.op("Mul", [g.conv("data", 3, 8), g.const(np.array(4.0, dtype=np.float32), "gain")])
    return g.model({"data": [1, 3, SIDE, SIDE]}, [g.op(op, [logits], axis=1)], 13)


def _runtime_exps(model: onnx.ModelProto, path) -> int:
    """Exp nodes left in the graph onnxruntime runs (after its constant folding)."""
    ort_session(lower_model(model), optimized_model_path=str(path))
    return sum(n.op_type == "Exp" for n in onnx.load(str(path)).graph.node)


@pytest.fixture(scope="module", params=[("Softmax", {}), ("Softmax", {"optimization": "set_all_nodes_int16"}),
                                        ("LogSoftmax", {})], ids=["softmax_int8", "softmax_int16", "logsoftmax"])
def converted(request, tmp_path_factory):
    setup(None)
    op, overrides = request.param
    root = tmp_path_factory.mktemp(op)
    fm = channel_softmax(op)
    project = make_project(root, fm, cal_count=4)
    project.write(calibration_parameters={"calibration_type": "max", **overrides})
    paths = makertbin(project.config_path, "onnx")
    samples = held_out(fm, count=3, seed=11)
    return paths, samples, root


def test_calibrated_softmax_equals_the_quantized_kernel_bit_for_bit(converted) -> None:
    paths, samples, _ = converted
    calibrated, quantized = (HB_ONNXRuntime(model_file=str(paths[k])) for k in ("calibrated", "quantized"))
    for k, x in enumerate(samples):
        c = calibrated.run(None, {"data": x})[0]
        q = quantized.run(None, {"data": x})[0].astype(np.float32)
        assert np.array_equal(c, q), f"held-out sample {k}: max difference {np.abs(c - q).max()}"


def test_calibrated_model_computes_no_exponential_at_run_time(converted) -> None:
    paths, _, root = converted
    assert _runtime_exps(onnx.load(str(paths["calibrated"])), root / "optimized.onnx") == 0


def test_fed_grids_build_the_table_once_per_run_and_give_the_built_models_outputs(converted) -> None:
    """The searches' session (grids fed at run time, any of them up to 16 bits) reads a table it builds per
    run: one Exp over the table's 65,536 differences, and per element the outputs of the calibrated model."""
    paths, samples, _ = converted
    model = onnx.load(str(paths["calibrated"]))
    fed = lower_model(model, feed_calibration=True)
    exps = [n for n in fed.graph.node if n.op_type == "Exp"]
    assert len(exps) == 1
    producers = {o: n for n in fed.graph.node for o in n.output}
    constants = {t.name: t for t in fed.graph.initializer}
    mul = producers[exps[0].input[0]]
    (differences,) = [constants[i] for i in mul.input if i in constants]
    assert onnx.numpy_helper.to_array(differences).size == 2**16
    feeds = {}
    for node in model.graph.node:
        a = attrs_of(node)
        if node.op_type == "HzCalibration" and a["kind"] == "activation":
            grid = Grid(np.asarray(a["thresholds"]), np.asarray(a["scales"], np.float32))
            feeds.update(fed_values(node.name, grid, int(a["bits"]), "zero_points" in a))
    session = make_session(fed)
    direct = make_session(lower_model(model))
    for x in samples:
        x8 = (x.astype(np.int16) - 128).astype(np.int8)  # what HB_ONNXRuntime feeds (input_offset 128)
        np.testing.assert_array_equal(session.run(None, {"data": x8, **feeds})[0], direct.run(None, {"data": x8})[0])


def test_quantized_softmax_indexes_its_table_on_integers(converted) -> None:
    """The quantized kernel's table index ``max(x - max(x) + n - 1, 0)`` is computed on int32 (two passes over
    the tensor), not on a float64 copy of the integer input (five passes)."""
    paths, _, _ = converted
    lowered = lower_model(onnx.load(str(paths["quantized"])))
    producers = {o: n for n in lowered.graph.node for o in n.output}
    (gather,) = [n for n in lowered.graph.node if n.op_type == "GatherElements" and "exp" in n.output[0]]
    seen, stack, casts = set(), [gather.input[1]], []
    while stack:
        t = stack.pop()
        node = producers.get(t)
        if node is None or t in seen:
            continue
        seen.add(t)
        if node.op_type == "Cast":  # where the index leaves the quantized input's integers
            casts.append(attrs_of(node)["to"])
            continue
        stack.extend(i for i in node.input if i)
    assert casts and set(casts) == {onnx.TensorProto.INT32}, casts
