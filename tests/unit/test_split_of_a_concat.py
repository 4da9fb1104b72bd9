"""A Split at the seams of a Concat (behind a Transpose or not) reads the joined tensors instead.

Ultralytics' end-to-end heads (YOLOv10, YOLO26) join the boxes in pixels and the class scores, lay
them out anchor-major and split them again for the top-k. Joined, both were on one quantization grid
whose step the pixels set, and every score of a YOLO26 at 1280x1280 read 0 in int8.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from hbtools.pipeline import optimize


def _head(transpose: bool, sizes: list[int], opset: int = 13, pieces: tuple[int, ...] = (4, 1)) -> onnx.ModelProto:
    """Conv -> per piece (boxes in pixels, then Sigmoid scores, ...) -> Concat -> [Transpose] -> Split."""
    rng = np.random.default_rng(0)
    channels = sum(pieces)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[1, 1], name="conv"),
             helper.make_node("Split", ["c", "parts"] if opset >= 13 else ["c"], [f"p{k}" for k in range(len(pieces))],
                              axis=1, name="split_head", **({} if opset >= 13 else {"split": list(pieces)}))]
    joined = []
    for k in range(len(pieces)):
        op = helper.make_node("Mul", [f"p{k}", "px"], [f"j{k}"], name=f"px{k}") if k == 0 else \
            helper.make_node("Sigmoid", [f"p{k}"], [f"j{k}"], name=f"sig{k}")
        nodes.append(op)
        joined.append(f"j{k}")
    nodes += [helper.make_node("Concat", joined, ["head"], axis=1, name="head"),
              helper.make_node("Reshape", ["head", "flat"], ["anchors_cm"], name="flatten")]
    split_in, axis = "anchors_cm", 1
    if transpose:
        nodes.append(helper.make_node("Transpose", ["anchors_cm"], ["anchors"], perm=[0, 2, 1], name="anchor_major"))
        split_in, axis = "anchors", -1
    outs = [f"y{k}" for k in range(len(sizes))]
    if opset >= 13:
        nodes.append(helper.make_node("Split", [split_in, "cuts"], outs, axis=axis, name="split"))
    else:
        nodes.append(helper.make_node("Split", [split_in], outs, axis=axis, split=sizes, name="split"))
    inits = [numpy_helper.from_array((rng.standard_normal((channels, 3, 1, 1)) * 0.5).astype(np.float32), "w"),
             numpy_helper.from_array(np.zeros(channels, np.float32), "b"),
             numpy_helper.from_array(np.array(100, np.float32), "px"),
             numpy_helper.from_array(np.array(pieces, np.int64), "parts"),
             numpy_helper.from_array(np.array([1, channels, 64], np.int64), "flat"),
             numpy_helper.from_array(np.array(sizes, np.int64), "cuts")]
    graph = helper.make_graph(nodes, "head", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outs], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 7
    return model


def _run(model: onnx.ModelProto, x: np.ndarray) -> list[np.ndarray]:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})


@pytest.mark.parametrize(("transpose", "sizes", "opset", "pieces", "undone"), [
    (True, [4, 1], 13, (4, 1), True),
    (False, [4, 1], 13, (4, 1), True),
    (True, [4, 1], 11, (4, 1), True),
    (True, [4, 3], 13, (4, 1, 2), True),  # the second piece joins two tensors
    (True, [2, 3], 13, (4, 1), False),  # not at a seam
])
def test_a_split_at_the_seams_reads_the_joined_tensors(transpose: bool, sizes: list[int], opset: int,
                                                       pieces: tuple[int, ...], undone: bool) -> None:
    model = _head(transpose, sizes, opset, pieces)
    optimized = optimize.run(model)
    names = [n.name for n in optimized.graph.node]
    assert ("split" not in names and "head" not in names) == undone, names
    x = np.random.default_rng(1).uniform(0, 1, (1, 3, 8, 8)).astype(np.float32)
    for want, got in zip(_run(model, x), _run(optimized, x), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


def test_scores_split_from_pixels_keep_their_values(tmp_path) -> None:
    """calibration_type max: the scores get their own grid (on one grid with the pixels, int8 step
    ~2.5, all of them read 0 or 2.5)."""
    from conformance import convert_featuremaps

    from hbtools.runtime import HB_ONNXRuntime
    from hbtools.runtime.session import make_session

    model = _head(True, [4, 1])
    rng = np.random.default_rng(3)
    samples = [rng.uniform(0, 1, (1, 3, 8, 8)).astype(np.float32) for _ in range(8)]
    convert_featuremaps(tmp_path, model, {"x": samples}, "1x3x8x8", "float32", "m", calibration_type="max")
    x = rng.uniform(0, 1, (1, 3, 8, 8)).astype(np.float32)
    want = make_session(model).run(None, {"x": x})[1]
    got = HB_ONNXRuntime(model_file=str(tmp_path / "out" / "m_quantized_model.onnx")).run(None, {"x": x})[1]
    assert np.abs(got - want).max() < 0.01, (want.ravel()[:4], got.ravel()[:4])
