"""Of the calibration methods that generalise equally well, one clipping less is kept where it generalises as well.

The cross-validated scores (thresholds fitted without a sample's fold) cannot tell a slight clip from none
when the calibration pictures are alike; pictures beyond them (brighter, more saturated) then run into the
clip. Hunt 30 D4: a YOLO-tiny on RDK X3 kept the 99.995th percentile by 0.0002 on its calibration pictures
and lost 0.02-0.03 cosine on saturated held-out pictures, where the max (best cross-validated) lost nothing.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from hbtools.march.profiles import get_profile
from hbtools.pipeline import optimize
from hbtools.pipeline.calibrate import CROSS_MARGIN, _cross_validated
from hbtools.quant.plan import make_plan, weight_thresholds
from hbtools.quant.search import Evaluator
from hbtools.quant.units import build_partition
from hbtools.runtime.session import fetching_session


def _model() -> onnx.ModelProto:
    rng = np.random.default_rng(3)
    w1 = rng.normal(0, 0.4, (8, 3, 3, 3)).astype(np.float32)
    w2 = rng.normal(0, 0.3, (4, 8, 1, 1)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2"], ["y"], name="conv2")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 16, 16])],
                              [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def test_of_methods_equal_on_unseen_samples_the_widest_is_kept() -> None:
    optimized = optimize.run(_model())
    profile = get_profile("bernoulli2")
    plan = make_plan(optimized, build_partition(optimized, profile, {}), None, profile)
    tensors = [p.tensor for p in plan.activations]
    rng = np.random.default_rng(0)
    # alike samples with a heavy tail: a slight clip of the activations' range scores best on them
    feeds = [{"x": (rng.standard_t(3, (1, 3, 16, 16)) * 0.5).astype(np.float32)} for _ in range(8)]
    session = fetching_session(optimized, list(dict.fromkeys([*tensors, "y"])))
    runs = [dict(zip([*tensors, "y"], session.run([*tensors, "y"], f), strict=False)) for f in feeds]
    refs = [[r["y"]] for r in runs]
    widest = {t: float(max(np.abs(r[t]).max() for r in runs)) for t in tensors}
    candidates = {"max": widest, "max-percentile 0.99995": {t: v * 0.95 for t, v in widest.items()}}
    # fitted without a fold, the percentile clips a little more (fewer samples reach as far)
    folds = {"max": widest, "max-percentile 0.99995": {t: v * 0.97 for t, v in widest.items()}}
    evaluator = Evaluator(optimized, plan, weight_thresholds(optimized, plan), feeds, refs, widest)
    scores = {label: evaluator.score(th) for label, th in candidates.items()}
    crossed = {label: evaluator.cross_score([folds[label], folds[label]]) for label in folds}
    best = max(crossed.values())
    # the case: the clip wins on the samples, the max on unseen ones, the two within the margin there
    assert scores["max-percentile 0.99995"] > scores["max"], scores
    assert crossed["max"] >= crossed["max-percentile 0.99995"] >= best - CROSS_MARGIN * (1 - best), crossed
    assert _cross_validated(evaluator, scores, [folds, folds]) == "max"
    # a clip that is better on unseen samples too stays (hunt 34 D2: the widest alone lost a little held out)
    better = {"max": widest, "max-percentile 0.99995": candidates["max-percentile 0.99995"]}
    crossed = {label: evaluator.cross_score([better[label], better[label]]) for label in better}
    assert crossed["max-percentile 0.99995"] > crossed["max"], crossed
    assert _cross_validated(evaluator, scores, [better, better]) == "max-percentile 0.99995"
