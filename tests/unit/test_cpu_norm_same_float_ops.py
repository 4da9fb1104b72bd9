"""A normalization the quantized model runs on the CPU is the same float computation in the calibrated model.

PoolFormer's GroupNorm(1 group) is exported as Reshape to (N, 1, C*H*W), InstanceNormalization, Reshape
back. On RDK X3 (4-D BPU) the 3-D part stays on the CPU, and the optimize stage writes the
normalization as ``HzLayerNorm`` over the last axis with a [1, 1] scale and bias. The quantized model
writes it as standard ONNX (``HzLayerNorm.float_nodes``) and the calibrated model lowers its
``HzLayerNorm`` with that same function. Both must pick the same ONNX form: onnxruntime's
LayerNormalization kernel and the spelled-out ReduceMean / Sub / ... chain round differently over a
large group (8192 values here), and the calibrated model would no longer be the float emulation of the
quantized one. (Before, the quantized model wrote LayerNormalization and the calibrated model the chain.)
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from builders import _Graph, held_out, make_project

from hbtools.log import setup
from hbtools.pipeline.runner import makertbin
from hbtools.runtime import HB_ONNXRuntime

OPSET = 17  # LayerNormalization exists: the quantized model may write it
CHANNELS, SIDE = 32, 16  # one group of 32 * 16 * 16 = 8192 values


def group_norm_between_convs() -> tuple:
    """Conv -> GroupNorm(1 group) as torch exports it (Reshape, InstanceNormalization, Reshape, Mul, Add) -> Conv."""
    g = _Graph(seed=3)
    x = g.conv("data", 3, CHANNELS, k=3, stride=2)
    flat = g.op("Reshape", [x, g.const(np.array([1, 1, -1], dtype=np.int64), "flat")])
    norm = g.op("InstanceNormalization", [flat, g.const(np.ones(1, np.float32), "s"),
                                          g.const(np.zeros(1, np.float32), "b")], epsilon=1e-5)
    y = g.op("Reshape", [norm, g.const(np.array([1, CHANNELS, SIDE, SIDE], dtype=np.int64), "map")])
    gamma = g.rng.uniform(0.5, 1.5, (CHANNELS, 1, 1)).astype(np.float32)
    beta = (0.1 * g.rng.standard_normal((CHANNELS, 1, 1))).astype(np.float32)
    y = g.op("Add", [g.op("Mul", [y, g.const(gamma, "gamma")]), g.const(beta, "beta")])
    out = g.conv(y, CHANNELS, 8, k=3)
    return g.model({"data": [1, 3, 2 * SIDE, 2 * SIDE]}, [out], opset=OPSET), norm


def nhwc(picture: np.ndarray) -> np.ndarray:
    """The quantized model takes the picture in its runtime layout (input_type_rt rgb: NHWC)."""
    return picture.transpose(0, 2, 3, 1)


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    setup(None)
    fm, norm = group_norm_between_convs()
    project = make_project(tmp_path_factory.mktemp("cpu_norm"), fm, march="bernoulli2")
    paths = makertbin(project.config_path, "onnx")
    sessions = {k: HB_ONNXRuntime(model_file=str(paths[k])) for k in ("calibrated", "quantized")}
    return fm, norm, paths, sessions


def test_the_normalization_runs_on_the_cpu_of_x3_as_one_layer_normalization(converted) -> None:
    """Its [1, 1] scale and bias are the values of its one normalized axis: onnxruntime's kernel, not a chain."""
    _, _, paths, _ = converted
    quantized = onnx.load(str(paths["quantized"]))
    ops = [n.op_type for n in quantized.graph.node if n.domain in ("", "ai.onnx")]
    assert ops.count("LayerNormalization") == 1 and "ReduceMean" not in ops, ops


def test_cpu_normalization_output_is_bit_identical(converted) -> None:
    _, norm, _, sessions = converted
    for k, x in enumerate(held_out(converted[0], count=4, seed=7)):
        c = sessions["calibrated"].run([norm], {"data": x})[0]
        q = sessions["quantized"].run([norm], {"data": nhwc(x)})[0]
        assert np.array_equal(c, q), f"sample {k}: {norm} differs by up to {np.abs(c - q).max():.3g}"


def test_calibrated_equals_quantized(converted) -> None:
    fm, _, _, sessions = converted
    for k, x in enumerate(held_out(fm, count=6, seed=11)):
        c = sessions["calibrated"].run(None, {"data": x})[0]
        q = sessions["quantized"].run(None, {"data": nhwc(x)})[0].astype(np.float32)
        assert np.array_equal(c, q), f"sample {k}: max difference {np.abs(c - q).max():.3g}"
