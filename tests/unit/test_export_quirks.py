"""Graphs written the way exporters and users write them, found to stop or go wrong in a survey of
small models (tf2onnx, PyTorch and hand-edited exports): each converts, and its quantized model
computes what the float model computes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from builders import _Graph
from conformance import convert_and_check

COSINE = 0.99


def _i64(values: list[int]) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def test_an_image_input_the_graph_takes_only_the_size_of_converts(tmp_path: Path) -> None:
    """A second image input read only by Shape (resize to the original picture's size), and a third
    nothing reads: their preprocessing has no reader, and the report compares the units anyway."""
    g = _Graph(2)
    logits = g.conv(g.op("Relu", [g.conv("data", 3, 8, stride=2)]), 8, 4, k=1)
    size = g.op("Slice", [g.op("Shape", ["ref"]), g.const(_i64([2]), "a"), g.const(_i64([4]), "b")])
    sizes = g.op("Concat", [g.const(_i64([1, 4]), "nc"), size], axis=0)
    out = g.op("Resize", [logits, "", "", sizes], mode="nearest")
    fm = g.model({"data": [1, 3, 16, 16], "ref": [1, 3, 32, 32], "unused": [1, 3, 16, 16]}, [out])
    outcome = convert_and_check(fm, tmp_path, "max", checker=False)
    assert min(outcome.cosine) > COSINE


def test_a_model_tensor_named_like_the_preprocessed_input_converts(tmp_path: Path) -> None:
    """The parse stage's own names (``<input>_hz_preprocessed``) may already be taken, e.g. by an
    artefact whose preprocessing was cut out by hand and converted again."""
    g = _Graph(1)
    g.conv("data", 3, 8)
    g.nodes[-1].output[0] = "data_hz_preprocessed"
    out = g.conv(g.op("Relu", ["data_hz_preprocessed"]), 8, 4, k=1)
    outcome = convert_and_check(g.model({"data": [1, 3, 16, 16]}, [out]), tmp_path, "max", checker=False)
    assert min(outcome.cosine) > COSINE


@pytest.mark.parametrize("added", [False, True])
def test_a_conv_transpose_with_an_output_shape_keeps_it(added: bool, tmp_path: Path) -> None:
    """tf2onnx writes Keras' Conv2DTranspose with ``output_shape`` (here 64 where the pads alone give 65);
    the quantized op reads pads, so the optimize stage writes the output shape as the pads it stands for.
    Without that the quantized output was 65 x 65 (``convert_and_check`` compares the shapes), and an Add
    with a 64 x 64 branch stopped the conversion."""
    g = _Graph(5)
    a = g.op("Relu", [g.conv("data", 3, 16, stride=2)])
    wt = (g.rng.standard_normal((16, 16, 3, 3)) / 12).astype(np.float32)
    up = g.op("ConvTranspose", [a, g.const(wt, "wt")], kernel_shape=[3, 3], strides=[2, 2], output_shape=[64, 64])
    out = g.conv(g.op("Add", [up, g.conv("data", 3, 16, k=1)]) if added else up, 16, 8, k=1)
    outcome = convert_and_check(g.model({"data": [1, 3, 64, 64]}, [out]), tmp_path, "max", checker=False)
    assert min(outcome.cosine) > COSINE
