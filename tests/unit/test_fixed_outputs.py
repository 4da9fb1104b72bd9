"""An output that no input changes (anchors or priors a detector gives beside its predictions, a Constant)
carries no quantization error: the searches score the other outputs as if it were not there (hunt 39 D4: its
cosine of 1, averaged in, halved the error the int16 search saw, and one tensor fewer went int16)."""

from __future__ import annotations

import numpy as np
import onnx
from builders import _Graph
from onnx import numpy_helper

from hbtools.march.profiles import get_profile
from hbtools.pipeline import optimize
from hbtools.quant.plan import make_plan, weight_thresholds
from hbtools.quant.search import Evaluator, scored_tensors
from hbtools.quant.units import build_partition
from hbtools.runtime.session import fetching_session


def _model(with_anchors: bool) -> onnx.ModelProto:
    g = _Graph(5)
    outputs = [g.conv(g.op("Relu", [g.conv("x", 3, 8)]), 8, 4, k=1)]
    if with_anchors:
        anchors = numpy_helper.from_array(np.linspace(0, 15, 32, dtype=np.float32).reshape(16, 2), "a")
        outputs.append(g.op("Constant", [], value=anchors))
    return g.model({"x": [1, 3, 16, 16]}, outputs).model


def _score(with_anchors: bool) -> float:
    optimized = optimize.run(_model(with_anchors))
    profile = get_profile("bayes-e")
    plan = make_plan(optimized, build_partition(optimized, profile, {}), None, profile)
    tensors = [p.tensor for p in plan.activations]
    rng = np.random.default_rng(0)
    feeds = [{"x": rng.normal(0, 1, (1, 3, 16, 16)).astype(np.float32)} for _ in range(6)]
    scored = scored_tensors(optimized)
    session = fetching_session(optimized, list(dict.fromkeys([*tensors, *scored])))
    runs = [dict(zip([*tensors, *scored], session.run([*tensors, *scored], f), strict=False)) for f in feeds]
    refs = [[r[t] for t in scored] for r in runs]
    widest = {t: float(max(np.abs(r[t]).max() for r in runs)) for t in tensors}
    evaluator = Evaluator(optimized, plan, weight_thresholds(optimized, plan), feeds, refs, widest)
    return evaluator.score({t: v * 0.5 for t, v in widest.items()})  # clipped grids: a score well below 1


def test_an_output_no_input_changes_leaves_the_score_of_the_others_as_it_is() -> None:
    alone = _score(with_anchors=False)
    assert alone < 0.999
    assert _score(with_anchors=True) == alone
