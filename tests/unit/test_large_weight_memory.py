"""Memory of the lowered calibrated model of a network with large weights (fully connected layers).

The searches lower the calibrated model once per candidate evaluator. A weight's float64 levels (a
twin's constant) and float64 copies of its levels to bound its sums were made beside the float32 ones,
and the float64 levels became an initializer that no node read: lowering a VGG-16-style classifier's
calibrated model took 10x its weights at its peak (hunt 30 D1). These tests hold the Python-side peak
of lowering (numpy arrays and serialized tensors, as tracemalloc counts them) to a small multiple of the
weights.
"""

from __future__ import annotations

import tracemalloc
import weakref

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from hbtools.march.profiles import get_profile
from hbtools.ops.base import LoweringContext
from hbtools.pipeline import optimize
from hbtools.quant.plan import build_calibrated_model, make_plan, weight_thresholds
from hbtools.quant.units import build_partition
from hbtools.runtime.lowering import lowered_parts

IN, HIDDEN, OUT = 2048, 4096, 16  # the first product's weight: 32 MB of float32


def _fully_connected() -> onnx.ModelProto:
    """x -> 1x1 Conv (HIDDEN x IN) -> Relu -> 1x1 Conv (OUT x HIDDEN): a classifier's fc layers."""
    rng = np.random.default_rng(0)
    w1 = rng.normal(0, 0.02, (HIDDEN, IN, 1, 1)).astype(np.float32)
    w2 = rng.normal(0, 0.02, (OUT, HIDDEN, 1, 1)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["h"], name="fc1"),
             helper.make_node("Relu", ["h"], ["r"], name="relu1"),
             helper.make_node("Conv", ["r", "w2"], ["y"], name="fc2")]
    graph = helper.make_graph(nodes, "fc", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, IN, 1, 1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, OUT, 1, 1])],
                              [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def _calibrated() -> onnx.ModelProto:
    optimized = optimize.run(_fully_connected())
    profile = get_profile("bernoulli2")
    plan = make_plan(optimized, build_partition(optimized, profile, {}), None, profile)
    thresholds = {p.tensor: 4.0 for p in plan.activations}
    return build_calibrated_model(optimized, plan, thresholds, weight_thresholds(optimized, plan), {})


def test_lowering_a_large_weight_holds_a_few_copies_of_it() -> None:
    calibrated = _calibrated()
    weight_bytes = HIDDEN * IN * 4
    tracemalloc.start()
    try:
        lowered, constants = lowered_parts(calibrated, feed_calibration=True)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # the weight's float32 values, its float32 levels and quantizing's temporaries (3x; it was 6x)
    assert peak < 4 * weight_bytes, f"lowering peaked at {peak / weight_bytes:.1f}x the weight"
    assert not [t.name for t in constants if t.data_type == TensorProto.DOUBLE and len(t.dims) and
                int(np.prod(t.dims)) >= HIDDEN * IN], "an unread float64 copy of the weight's levels was kept"


def test_constants_no_node_reads_are_not_made_into_initializers() -> None:
    ctx = LoweringContext(13, set())
    read = ctx.constant("read", np.arange(4096, dtype=np.float32))
    unread = ctx.cast_constant("unread_f64", read, np.float64)
    assert ctx.known(unread).dtype == np.float64 and np.array_equal(ctx.known(unread), ctx.known(read))
    assert ctx.cast_constant("again", read, np.float64) == unread  # one per source and type
    assert [t.name for t in ctx.made_constants({read})] == [read]
    assert [t.name for t in ctx.initializers] == [read, unread]


def test_the_searches_hold_no_evaluator_session_while_a_step_runs_its_own(tmp_path, monkeypatch) -> None:
    """GPTQ's Hessians and bias correction run sessions of their own over the whole model, then build a
    candidate evaluator: the current evaluator's session (onnxruntime's copy of every weight) is let go
    first, as ``_if_closer`` does for the candidate."""
    from builders import make_project, resnet_like

    from hbtools.log import setup
    from hbtools.pipeline import calibrate
    from hbtools.pipeline.runner import makertbin
    from hbtools.quant import search, weight_rounding

    evaluators: weakref.WeakSet[search.Evaluator] = weakref.WeakSet()  # those the searches let go of go
    made = search.Evaluator.__init__

    def tracked(self: search.Evaluator, *args: object, **kwargs: object) -> None:
        made(self, *args, **kwargs)
        evaluators.add(self)

    held: dict[str, list[int]] = {}

    def counting(step: str, run):  # noqa: ANN001, ANN202 - wraps the step's function as it is
        def wrapped(*args: object, **kwargs: object) -> object:
            held.setdefault(step, []).append(sum(e.session is not None for e in evaluators))
            return run(*args, **kwargs)
        return wrapped

    monkeypatch.setattr(search.Evaluator, "__init__", tracked)
    monkeypatch.setattr(weight_rounding, "input_hessians", counting("GPTQ", weight_rounding.input_hessians))
    monkeypatch.setattr(calibrate, "_corrected_biases", counting("bias correction", calibrate._corrected_biases))
    setup(None)
    project = make_project(tmp_path, resnet_like(), march="bernoulli2", cal_count=8, calibration_type="default")
    makertbin(project.config_path, "onnx")
    assert set(held) == {"GPTQ", "bias correction"}, held
    assert held == {"GPTQ": [0], "bias correction": [0]}, f"evaluator sessions alive during the step: {held}"
