"""The search's session scores exactly the calibrated model it stands for, grids fed at run time.

A conv channel whose weights are nearly zero next to its bias gets a widened weight grid so
that the bias fits int32, and how wide depends on the input's step. The session is built
once, so the widening it holds must be the one the scored thresholds imply, at 8 and at 16 bits.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from hbtools.march.profiles import get_profile
from hbtools.metrics import cosine_similarity
from hbtools.pipeline import optimize
from hbtools.quant.plan import build_calibrated_model, make_plan, weight_thresholds
from hbtools.quant.search import Evaluator
from hbtools.quant.units import build_partition
from hbtools.runtime.lowering import lower_model
from hbtools.runtime.session import fetching_session, make_session


def _model_with_a_dead_channel() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w1 = rng.normal(0, 0.3, (4, 3, 3, 3)).astype(np.float32)
    # Channel 0: small weights next to its bias; its grid is widened only for a fine input step
    # (a 16-bit one at threshold 1, not at the real threshold). Channel 1: dead, always widened.
    w1[0] *= 0.003 / np.abs(w1[0]).max()
    w1[1] *= 1e-10
    b1 = np.array([2.0, 1.0, -0.2, 0.05], np.float32)
    w2 = rng.normal(0, 0.5, (2, 4, 1, 1)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2"], ["y"], name="conv2")]
    graph = helper.make_graph(nodes, "dead_channel",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 8, 8])],
                              [numpy_helper.from_array(v, k) for k, v in (("w1", w1), ("b1", b1), ("w2", w2))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("bits", [8, 16])
def test_search_session_scores_the_built_calibrated_model(bits: int) -> None:
    optimized = optimize.run(_model_with_a_dead_channel())
    profile = get_profile("bayes-e")
    plan = make_plan(optimized, build_partition(optimized, profile, {}), None, profile)
    plan = plan.with_bits({p.tensor: bits for p in plan.activations})
    rng = np.random.default_rng(1)
    # A wide input range: at the real thresholds the input step is coarse, so channel 0 is not widened.
    feeds = [{"x": rng.normal(0, 100, (1, 3, 8, 8)).astype(np.float32)} for _ in range(3)]
    tensors = [p.tensor for p in plan.activations]
    floats = fetching_session(optimized, tensors + ["y"])
    values = [dict(zip([*tensors, "y"], floats.run([*tensors, "y"], f), strict=True)) for f in feeds]
    widest = {t: float(max(np.abs(v[t]).max() for v in values)) for t in tensors}
    refs = [[v["y"]] for v in values]
    weight_th = weight_thresholds(optimized, plan)
    evaluator = Evaluator(optimized, plan, weight_th, feeds, refs, widest)
    model = build_calibrated_model(optimized, plan, widest, weight_th, {})
    session = make_session(lower_model(model))
    got = np.concatenate([session.run(["y"], f)[0].ravel() for f in feeds])
    direct = cosine_similarity(np.concatenate([r[0].ravel() for r in refs]), got)
    assert evaluator.score(widest) == pytest.approx(direct, abs=1e-9)
    # The dead channel's grid really is widened (else the test would not test the widening).
    w_node = next(n for n in model.graph.node if n.op_type == "HzCalibration" and n.input[0] == "w1")
    th = next(a for a in w_node.attribute if a.name == "thresholds").floats
    w1 = numpy_helper.to_array(next(t for t in optimized.graph.initializer if t.name == "w1"))
    assert th[1] > 10 * np.abs(w1[1]).max()
