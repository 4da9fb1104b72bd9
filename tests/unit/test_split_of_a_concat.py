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


def _head(transpose: bool, sizes: list[int], opset: int = 13, pieces: tuple[int, ...] = (4, 1), *,
          levels: int = 1, flat: bool = True) -> onnx.ModelProto:
    """Per level: Conv -> per piece (boxes in pixels, then Sigmoid scores, ...) -> Concat [-> Reshape to
    anchors]; the levels (strides 1, 2, ...) joined along the anchors; [Transpose] -> Split."""
    rng = np.random.default_rng(0)
    channels = sum(pieces)
    nodes, heads, anchors = [], [], 0
    for level in range(levels):
        tag = f"_l{level}" if levels > 1 else ""
        nodes += [helper.make_node("Conv", ["x", "w", "b"], [f"c{tag}"], kernel_shape=[1, 1], strides=[2 ** level] * 2,
                                   name=f"conv{tag}"),
                  helper.make_node("Split", [f"c{tag}", "parts"] if opset >= 13 else [f"c{tag}"],
                                   [f"p{k}{tag}" for k in range(len(pieces))], axis=1, name=f"split_head{tag}",
                                   **({} if opset >= 13 else {"split": list(pieces)}))]
        joined = []
        for k in range(len(pieces)):
            op = helper.make_node("Mul", [f"p{k}{tag}", "px"], [f"j{k}{tag}"], name=f"px{k}{tag}") if k == 0 else \
                helper.make_node("Sigmoid", [f"p{k}{tag}"], [f"j{k}{tag}"], name=f"sig{k}{tag}")
            nodes.append(op)
            joined.append(f"j{k}{tag}")
        nodes.append(helper.make_node("Concat", joined, [f"head{tag}"], axis=1, name=f"head{tag}"))
        heads.append(f"head{tag}")
        if flat:
            side = 8 // 2 ** level
            nodes.append(helper.make_node("Reshape", [f"head{tag}", f"flat{tag}"], [f"anchors_cm{tag}"],
                                          name=f"flatten{tag}"))
            heads[-1] = f"anchors_cm{tag}"
            anchors += side * side
    split_in, axis = heads[0], 1
    if levels > 1:
        nodes.append(helper.make_node("Concat", heads, ["levels"], axis=2, name="levels"))
        split_in = "levels"
    if transpose:
        nodes.append(helper.make_node("Transpose", [split_in], ["anchors"], perm=[0, 2, 1], name="anchor_major"))
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
             numpy_helper.from_array(np.array(sizes, np.int64), "cuts")]
    for level in range(levels if flat else 0):
        side = 8 // 2 ** level
        tag = f"_l{level}" if levels > 1 else ""
        inits.append(numpy_helper.from_array(np.array([1, channels, side * side], np.int64), f"flat{tag}"))
    graph = helper.make_graph(nodes, "head", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outs], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 7
    return model


def _run(model: onnx.ModelProto, x: np.ndarray) -> list[np.ndarray]:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})


@pytest.mark.parametrize(("transpose", "sizes", "opset", "pieces", "levels", "flat", "undone"), [
    (True, [4, 1], 13, (4, 1), 1, True, True),
    (False, [4, 1], 13, (4, 1), 1, True, True),
    (True, [4, 1], 11, (4, 1), 1, True, True),
    (True, [4, 3], 13, (4, 1, 2), 1, True, True),  # the second piece joins two tensors
    (True, [2, 3], 13, (4, 1), 1, True, False),  # not at a seam
    (False, [4, 1], 13, (4, 1), 1, False, True),  # each model output is a piece itself
    (True, [4, 1], 13, (4, 1), 3, True, True),  # three levels joined along the anchors (YOLOv10's head)
    (False, [4, 3], 13, (4, 1, 2), 2, True, True),
    (True, [2, 3], 13, (4, 1), 3, True, False),
])
def test_a_split_at_the_seams_reads_the_joined_tensors(transpose: bool, sizes: list[int], opset: int,
                                                       pieces: tuple[int, ...], levels: int, flat: bool,
                                                       undone: bool) -> None:
    model = _head(transpose, sizes, opset, pieces, levels=levels, flat=flat)
    optimized = optimize.run(model)
    names = [n.name for n in optimized.graph.node]
    assert ("split" not in names and not {"head", "head_l0", "levels"} & set(names)) == undone, names
    x = np.random.default_rng(1).uniform(0, 1, (1, 3, 8, 8)).astype(np.float32)
    for want, got in zip(_run(model, x), _run(optimized, x), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("levels", [1, 3])
def test_scores_split_from_pixels_keep_their_values(tmp_path, levels: int) -> None:
    """calibration_type max: the scores get their own grid (on one grid with the pixels, int8 step
    ~2.5, all of them read 0 or 2.5)."""
    from conformance import convert_featuremaps

    from hbtools.runtime import HB_ONNXRuntime
    from hbtools.runtime.session import make_session

    model = _head(True, [4, 1], levels=levels)
    rng = np.random.default_rng(3)
    samples = [rng.uniform(0, 1, (1, 3, 8, 8)).astype(np.float32) for _ in range(8)]
    convert_featuremaps(tmp_path, model, {"x": samples}, "1x3x8x8", "float32", "m", calibration_type="max")
    x = rng.uniform(0, 1, (1, 3, 8, 8)).astype(np.float32)
    want = make_session(model).run(None, {"x": x})[1]
    got = HB_ONNXRuntime(model_file=str(tmp_path / "out" / "m_quantized_model.onnx")).run(None, {"x": x})[1]
    assert np.abs(got - want).max() < 0.01, (want.ravel()[:4], got.ravel()[:4])
