"""A per-channel Mul / Add after a Transpose or Squeeze of a Conv's output folds into the Conv.

Converters that move channels last (NHWC) or drop the batch axis before a BatchNormalization written as
Mul and Add left the affine ops between data movement and the next op: each became a quantized Mul / Add
rounding to int8, where folded into the conv's weights and bias it costs nothing.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
from builders import _Graph

from hbtools.march.profiles import get_profile
from hbtools.pipeline import optimize


def _run(model, x: np.ndarray) -> np.ndarray:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"feat": x})[0]


def _conv(g: _Graph, c: int = 6) -> str:
    w = g.const(g.rng.standard_normal((c, 3, 3, 3)).astype(np.float32))
    b = g.const(g.rng.standard_normal(c).astype(np.float32))
    return g.op("Conv", ["feat", w, b], kernel_shape=[3, 3], pads=[1, 1, 1, 1])


def _check(fm, *, folded: bool) -> None:
    optimized = optimize.run(fm.model, get_profile("bayes-e"))
    ops = [n.op_type for n in optimized.graph.node]
    assert (not {"Mul", "Add", "Sub", "Div"} & set(ops) and ops.count("Conv") == 1) == folded, ops
    x = np.random.default_rng(3).standard_normal((1, 3, 8, 10)).astype(np.float32)
    want, got = _run(fm.model, x), _run(optimized, x)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_channels_last_batchnorm_folds_into_the_conv() -> None:
    g = _Graph(1)
    y = g.op("Transpose", [_conv(g)], perm=[0, 2, 3, 1])
    y = g.op("Mul", [y, g.const(g.rng.uniform(0.5, 2, 6).astype(np.float32))])
    y = g.op("Sub", [y, g.const(g.rng.standard_normal(6).astype(np.float32))])
    y = g.op("Div", [y, g.const(g.rng.uniform(0.5, 2, 6).astype(np.float32))])
    # the model's output stays channels last: no Transpose back for the movement to cancel against
    _check(g.model({"feat": [1, 3, 8, 10]}, [g.op("Relu", [y])], featuremap={"feat"}), folded=True)


def test_batchnorm_after_a_batch_squeeze_folds_into_the_conv() -> None:
    g = _Graph(2)
    y = g.op("Squeeze", [_conv(g), g.const(np.array([0], np.int64))])
    y = g.op("Mul", [y, g.const(g.rng.uniform(0.5, 2, (6, 1, 1)).astype(np.float32))])
    y = g.op("Add", [y, g.const(g.rng.standard_normal((6, 1, 1)).astype(np.float32))])
    _check(g.model({"feat": [1, 3, 8, 10]}, [g.op("Relu", [y])], featuremap={"feat"}), folded=True)


def test_a_constant_that_varies_along_the_map_stays() -> None:
    g = _Graph(3)
    y = g.op("Transpose", [_conv(g)], perm=[0, 2, 3, 1])  # [1, 8, 10, 6]
    y = g.op("Mul", [y, g.const(g.rng.uniform(0.5, 2, (10, 1)).astype(np.float32))])  # along the width
    _check(g.model({"feat": [1, 3, 8, 10]}, [y], featuremap={"feat"}), folded=False)
