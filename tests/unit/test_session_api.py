"""User scripts written for the vendor's ``HB_ONNXRuntime`` run unchanged (seed 004 §HB_ONNXRuntime,
the vendor sample scripts): layout, batch dims, copies for worker processes, models given in memory."""

from __future__ import annotations

import copy
import gc
import pickle
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from builders import _Graph, featuremap_mlp, make_project, resnet_like

from hbtools.errors import HbError
from hbtools.pipeline.runner import makertbin
from hbtools.runtime.session import FeedError
from horizon_tc_ui import HB_ONNXRuntime


@pytest.fixture(scope="module")
def nhwc_model(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A model converted for NV12 NHWC runtime input (its quantized model takes NHWC int8)."""
    project = make_project(tmp_path_factory.mktemp("api"), resnet_like(16))
    project.write(input_parameters={"input_type_rt": "nv12", "input_layout_rt": "NHWC"})
    return makertbin(project.config_path, "onnx")


def _image(batch: int = 1) -> np.ndarray:
    return np.random.default_rng(3).integers(0, 256, (batch, 16, 16, 3), dtype=np.uint8)


def test_layout_tells_the_sample_script_how_to_lay_out_its_image(nhwc_model: dict[str, Path]) -> None:
    assert HB_ONNXRuntime(model_file=nhwc_model["quantized"]).layout == ["NHWC"]
    assert HB_ONNXRuntime(model_file=nhwc_model["original"]).layout == ["NCHW"]


def test_set_dim_param_lets_a_script_feed_a_batch(nhwc_model: dict[str, Path]) -> None:
    sess = HB_ONNXRuntime(model_file=nhwc_model["quantized"])
    single = [sess.run(None, {"data": _image(2)[i:i + 1]})[0] for i in range(2)]
    sess.set_dim_param(0, 0, "?")
    (batched,) = sess.run(sess.output_names, {"data": _image(2)})
    assert batched.shape == (2, 10)
    np.testing.assert_allclose(batched, np.concatenate(single), atol=1e-6)
    with pytest.raises(FeedError, match="input index 1 out of range"):
        sess.set_dim_param(1, 0, "?")


def test_every_artefact_of_a_3d_linear_takes_a_batch(tmp_path: Path) -> None:
    """onnxruntime writes a MatMul + Add over [1, T, K] as Reshape [T, K] -> Gemm -> Reshape [1, T, N], the batch
    of one in both shapes: the float model took a batch after set_dim_param, every artefact failed (hunt 41 D4)."""
    fm = featuremap_mlp()
    project = make_project(tmp_path, fm, cal_count=4)
    project.write(calibration_parameters={"calibration_type": "default"})
    paths = makertbin(project.config_path, "onnx")
    batch = np.random.default_rng(5).standard_normal((3, 5, 12)).astype(np.float32)
    for kind in ("original", "optimized", "calibrated", "quantized"):
        sess = HB_ONNXRuntime(model_file=paths[kind])
        singles = np.concatenate([sess.run_feature(None, {"feat": batch[i:i + 1]})[0] for i in range(3)])
        sess.set_dim_param(0, 0, "?")
        got = sess.run_feature(None, {"feat": batch})[0]
        if kind in ("calibrated", "quantized"):  # integer grids: the same levels
            np.testing.assert_array_equal(got, singles, err_msg=kind)
        else:  # a batched float product may sum in another order
            np.testing.assert_allclose(got, singles, rtol=1e-5, atol=1e-6, err_msg=kind)


def test_a_session_can_be_pickled_and_copied(nhwc_model: dict[str, Path]) -> None:
    sess = HB_ONNXRuntime(model_file=nhwc_model["quantized"])
    (want,) = sess.run(None, {"data": _image()})
    for other in (pickle.loads(pickle.dumps(sess)), copy.deepcopy(sess)):
        np.testing.assert_array_equal(other.run(None, {"data": _image()})[0], want)


def test_the_model_may_be_given_in_memory(nhwc_model: dict[str, Path]) -> None:
    path = nhwc_model["quantized"]
    (want,) = HB_ONNXRuntime(path).run(None, {"data": _image()})
    for sess in (HB_ONNXRuntime(onnx.load(path)), HB_ONNXRuntime(path.read_bytes()),
                 HB_ONNXRuntime(onnx_model=path.read_bytes())):
        np.testing.assert_array_equal(sess.run(None, {"data": _image()})[0], want)


def test_a_script_can_fetch_an_intermediate_tensor(nhwc_model: dict[str, Path]) -> None:
    sess = HB_ONNXRuntime(model_file=nhwc_model["quantized"])
    tensor = next(t for n in onnx.load(nhwc_model["quantized"]).graph.node if n.op_type.startswith("HzSQuantized")
                  for t in n.output)
    layer, final = sess.run([tensor, "Softmax_0_out"], {"data": _image()})
    assert layer.dtype == np.int8 and layer.shape[0] == 1 and layer.any()
    np.testing.assert_array_equal(final, sess.run(None, {"data": _image()})[0])


def test_layers_fetched_one_at_a_time_share_one_session(nhwc_model: dict[str, Path]) -> None:
    """A layer-by-layer comparison asks for one intermediate tensor per call: each set of names built and kept a
    session of its own, a copy of the weights each (35 MB a layer on a 22 MB model: hunt 41 D3). One session
    now fetches every tensor asked for so far; the values are those of one call asking for them all."""
    def sessions() -> set[int]:
        gc.collect()
        return {id(o) for o in gc.get_objects() if isinstance(o, ort.InferenceSession)}

    before = sessions()  # other tests' sessions not yet collected are not this one's
    sess = HB_ONNXRuntime(model_file=nhwc_model["original"])
    model = onnx.load(str(nhwc_model["original"]))
    layers = [n.output[0] for n in model.graph.node][:-1][:6]
    feed = {"data": np.ascontiguousarray(_image().transpose(0, 3, 1, 2))}
    one_by_one = [sess.run([name], feed)[0] for name in layers]
    again = [sess.run([name], feed)[0] for name in layers]
    together = sess.run(layers, feed)
    held = sessions() - before
    assert len(held) <= 2, f"{len(held)} onnxruntime sessions held for one model"  # its own and one fetching
    for a, b, c in zip(one_by_one, again, together, strict=True):
        # onnxruntime may fuse other nodes when other tensors are outputs: the last bits may differ
        np.testing.assert_allclose(a, c, rtol=1e-5, atol=1e-5 * float(np.abs(c).max()))
        np.testing.assert_array_equal(b, c)  # the one session asked again


def test_a_float_layer_name_asked_of_the_quantized_model_points_at_its_quantized_name(
        nhwc_model: dict[str, Path]) -> None:
    """Comparing a layer: the script asks the quantized model for the float model's tensor name;
    the message must name the quantized model's tensor for it, not only the model outputs."""
    quantized_names = {t for n in onnx.load(nhwc_model["quantized"]).graph.node for t in n.output}
    float_layer = next(t for n in onnx.load(nhwc_model["original"]).graph.node if n.op_type == "Add"
                       for t in n.output)
    assert float_layer not in quantized_names and f"{float_layer}_quantized" in quantized_names
    with pytest.raises(FeedError) as info:
        HB_ONNXRuntime(model_file=nhwc_model["quantized"]).run([float_layer], {"data": _image()})
    assert f"'{float_layer}_quantized'" in str(info.value)
    # A short name is too unlike '<name>_quantized' for a closest-name match ('c2' got no hint at all).
    short = onnx.load(nhwc_model["quantized"])
    for node in short.graph.node:
        node.input[:] = ["c2_quantized" if t == f"{float_layer}_quantized" else t for t in node.input]
        node.output[:] = ["c2_quantized" if t == f"{float_layer}_quantized" else t for t in node.output]
    with pytest.raises(FeedError, match=r"tensor 'c2' \(closest: 'c2_quantized'\)"):
        HB_ONNXRuntime(short).run(["c2"], {"data": _image()})


def test_one_output_name_given_as_a_string(nhwc_model: dict[str, Path]) -> None:
    sess = HB_ONNXRuntime(model_file=nhwc_model["quantized"])
    (out,) = sess.run("Softmax_0_out", {"data": _image()})
    assert out.shape == (1, 10)


def test_image_values_in_any_integer_type_are_fed_like_uint8(nhwc_model: dict[str, Path]) -> None:
    sess = HB_ONNXRuntime(model_file=nhwc_model["quantized"])
    (want,) = sess.run(None, {"data": _image()})
    for feed in (_image().astype(np.int64), _image().tolist()):
        np.testing.assert_array_equal(sess.run(None, {"data": feed})[0], want)
    with pytest.raises(FeedError, match="use input_offset 128 for 0..255 image data"):
        sess.run(None, {"data": _image().astype(np.int64) + 200})


def test_the_newer_toolkits_hbruntime_runs_the_onnx_artefacts(nhwc_model: dict[str, Path]) -> None:
    """D-Robotics' classification scripts import HBRuntime (with HB_ONNXRuntime) and the ImageNet class names:
    the import failed, and the script with it."""
    import onnxruntime

    from horizon_tc_ui import HBRuntime
    from horizon_tc_ui.data.imagenet_val import imagenet_val

    want = HB_ONNXRuntime(model_file=nhwc_model["quantized"]).run(None, {"data": _image()})
    sess = HBRuntime(str(nhwc_model["quantized"]))
    got = sess.run(sess.output_names, {sess.input_names[0]: _image()})
    np.testing.assert_array_equal(got[0], want[0])
    assert isinstance(sess.sess, onnxruntime.InferenceSession)
    with pytest.raises(HbError, match="is a compiled model"):
        HBRuntime(str(nhwc_model["quantized"].with_suffix(".bin")))
    assert sorted(imagenet_val) == list(range(1000)) and imagenet_val[np.int64(0)][0].startswith("tench")


def test_input_offset_given_as_text_is_the_number(nhwc_model: dict[str, Path]) -> None:
    """The vendor's sample scripts declare ``-o/--input_offset`` as a click string option and pass it on:
    ``-o 128`` crashed in the feed conversion with a TypeError."""
    sess = HB_ONNXRuntime(model_file=nhwc_model["quantized"])
    (want,) = sess.run(None, {"data": _image()}, input_offset=128)
    np.testing.assert_array_equal(sess.run(None, {"data": _image()}, input_offset="128")[0], want)
    with pytest.raises(FeedError, match="input_offset 'x128' is not a whole number"):
        sess.run(None, {"data": _image()}, input_offset="x128")


def test_every_artefact_of_a_view_by_the_batch_size_takes_a_batch(tmp_path: Path) -> None:
    """torch's ``x.view(x.size(0), -1)`` before a Linear: Shape -> Gather -> Concat -> Reshape, which the optimize
    stage folds to the constant [1, 256] once the input shape is fixed. The float model took a batch after
    set_dim_param; the optimized, calibrated and quantized models stopped at that Reshape."""
    g = _Graph(4)
    maps = g.op("Relu", [g.conv("data", 3, 4)])
    size = g.op("Unsqueeze", [g.op("Gather", [g.op("Shape", ["data"]), g.const(np.array(0, np.int64), "i")], axis=0),
                              g.const(np.array([0], np.int64), "axes")])
    target = g.op("Concat", [size, g.const(np.array([-1], np.int64), "rest")], axis=0)
    fm = g.model({"data": [1, 3, 8, 8]}, [g.gemm(g.op("Reshape", [maps, target]), 256, 10)])
    del fm.model.graph.value_info[:]
    fm.model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "N"  # exported with a dynamic batch
    paths = makertbin(make_project(tmp_path, fm, cal_count=4).config_path, "onnx")
    images = np.random.default_rng(6).integers(0, 256, (3, 8, 8, 3), dtype=np.uint8)
    for kind in ("original", "optimized", "calibrated", "quantized"):
        sess = HB_ONNXRuntime(model_file=paths[kind])
        feeds = images if sess.layout == ["NHWC"] else images.transpose(0, 3, 1, 2)
        singles = np.concatenate([sess.run(None, {"data": feeds[i:i + 1]})[0] for i in range(3)])
        sess.set_dim_param(0, 0, "?")
        got = sess.run(None, {"data": feeds})[0]
        assert got.shape == (3, 10), kind
        np.testing.assert_allclose(got, singles, rtol=1e-5, atol=1e-6, err_msg=kind)


def _mixing(g: _Graph, x: str) -> str:
    """Reshapes that drop the batch of one and a Transpose between: a batch of several mixes its samples."""
    rows = g.op("Transpose", [g.op("Reshape", [x, g.const(np.array([5, 12], np.int64), "rows")])], perm=[1, 0])
    return g.op("Reshape", [rows, g.const(np.array([1, 60], np.int64), "flat")])


def _resized(g: _Graph, x: str) -> str:
    """A Resize to sizes that hold the batch of one (torch's interpolate(size=...) once the shape is folded): a batch
    of several came out as one sample, without an error."""
    maps = g.op("Reshape", [x, g.const(np.array([1, 5, 3, 4], np.int64), "maps")])
    return g.op("Resize", [maps, "", "", g.const(np.array([1, 5, 6, 8], np.int64), "sizes")], mode="nearest")


@pytest.mark.parametrize("holds_the_batch", [_mixing, _resized])
def test_a_batch_of_a_model_built_for_one_sample_gives_each_sample_its_outputs(tmp_path: Path,
                                                                              holds_the_batch) -> None:
    g = _Graph(5)
    fm = g.model({"feat": [1, 5, 12]}, [g.op("Relu", [holds_the_batch(g, "feat")])], featuremap={"feat"})
    paths = makertbin(make_project(tmp_path, fm).config_path, "onnx")
    batch = np.random.default_rng(0).standard_normal((3, 5, 12)).astype(np.float32)
    for kind in ("optimized", "calibrated", "quantized"):
        sess = HB_ONNXRuntime(model_file=paths[kind])
        singles = np.concatenate([sess.run_feature(None, {"feat": batch[i:i + 1]})[0] for i in range(3)])
        sess.set_dim_param(0, 0, "?")
        for _ in range(2):  # the first batch finds out how to run one; the second runs that way
            np.testing.assert_array_equal(sess.run_feature(None, {"feat": batch})[0], singles, err_msg=kind)


def test_an_input_size_the_model_cannot_take_says_which_shape_it_was_built_for(tmp_path: Path) -> None:
    g = _Graph(5)
    fm = g.model({"feat": [1, 5, 12]}, [g.op("Relu", [_mixing(g, "feat")])], featuremap={"feat"})
    sess = HB_ONNXRuntime(model_file=makertbin(make_project(tmp_path, fm).config_path, "onnx")["quantized"])
    sess.set_dim_param(0, 1, "?")
    longer = np.random.default_rng(0).standard_normal((1, 6, 12)).astype(np.float32)
    with pytest.raises(FeedError, match="built for input shape 'feat' 1x5x12: feed that shape"):
        sess.run_feature(None, {"feat": longer})


def test_sample_script_helpers_get_hw_input_type_and_providers(nhwc_model: dict[str, Path]) -> None:
    """The vendor's evaluation samples call get_hw() to size the image, get_input_type() == 3 (int8)
    to tell a quantized model, and set_providers / get_provider before running."""
    quantized = HB_ONNXRuntime(model_file=nhwc_model["quantized"])
    source = HB_ONNXRuntime(resnet_like(16).model)
    assert quantized.get_hw() == (16, 16) and source.get_hw() == (16, 16)
    assert quantized.get_input_type() == onnx.TensorProto.INT8
    assert source.get_input_type() == onnx.TensorProto.FLOAT
    # the vendor's verifier indexes input_types by position and maps the ONNX enum to a numpy type
    assert quantized.input_types == [onnx.TensorProto.INT8] and source.input_types == [onnx.TensorProto.FLOAT]
    assert quantized.output_types == [onnx.TensorProto.FLOAT]
    quantized.set_providers(["CUDAExecutionProvider"])
    assert quantized.get_provider() == "CPUExecutionProvider"
    assert quantized.run(None, {"data": _image()})[0].shape[0] == 1
    with pytest.raises(FeedError, match="out of range"):
        quantized.get_hw(1)


def test_shapes_and_counts_scripts_read_from_the_session(nhwc_model: dict[str, Path]) -> None:
    """Scripts take the batch from input_shapes[0][0] ('?' when symbolic) and reshape raw samples with it."""
    sess = HB_ONNXRuntime(model_file=nhwc_model["quantized"])
    assert sess.input_shapes == [[1, 16, 16, 3]]
    (output,) = sess.run(None, {"data": _image()})
    assert sess.output_shapes == [list(output.shape)]
    assert (sess.input_num, sess.output_num) == (1, 1)
    sess.set_dim_param(0, 0, "?")
    assert sess.input_shapes[0][0] == "?"


def test_the_toolkit_version_is_importable() -> None:
    from horizon_tc_ui import __version__

    assert isinstance(__version__, str) and __version__[0].isdigit()


@pytest.mark.parametrize("elem, dtype", [(onnx.TensorProto.UINT16, np.uint16), (onnx.TensorProto.UINT32, np.uint32),
                                         (onnx.TensorProto.UINT64, np.uint64)])
def test_unsigned_inputs_take_their_own_type(tmp_path: Path, elem: int, dtype: type) -> None:
    """makertbin converts a model with uint16/32/64 inputs (on the CPU), but HB_ONNXRuntime and hb_verifier
    refused uint16 data for a uint16 input: 'expects float32; cannot convert uint16 data without loss'."""
    from onnx import helper

    graph = helper.make_graph([helper.make_node("Add", ["x", "y"], ["z"])], "g",
                              [helper.make_tensor_value_info(n, elem, [2, 3]) for n in ("x", "y")],
                              [helper.make_tensor_value_info("z", elem, [2, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "u.onnx")
    sess = HB_ONNXRuntime(model_file=str(tmp_path / "u.onnx"))
    x, y = np.arange(6, dtype=dtype).reshape(2, 3), np.full((2, 3), 7, dtype)
    (z,) = sess.run(None, {"x": x, "y": y})
    assert z.dtype == dtype and z.tolist() == (x + y).tolist()
    (z,) = sess.run(None, {"x": x.astype(np.int64), "y": y})  # other integers that fit are widened exactly
    assert z.tolist() == (x + y).tolist()
    with pytest.raises(FeedError, match=f"input 'x' takes {np.dtype(dtype).name}, and int64 data holds values"):
        sess.run(None, {"x": x.astype(np.int64) - 1, "y": y})


def _plain(nodes: list, inputs: dict[str, list[int]], inits: list | None = None, opset: int = 13) -> onnx.ModelProto:
    from onnx import TensorProto, helper

    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in
                                           inputs.items()],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in nodes[-1].output],
                              inits or [])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def test_a_sequence_first_output_of_a_batch_keeps_its_batch_axis() -> None:
    """A CRNN's [T, N, C] output for CTC: a batch of 3 came back as [3 T, 1, C] (every sample's frames one after
    another in one column) once outputs were joined along the first axis (hunt 44 D1); the whole run was right."""
    from onnx import helper

    sess = HB_ONNXRuntime(onnx_model=_plain([helper.make_node("Transpose", ["x"], ["y"], perm=[2, 0, 1])],
                                             {"x": [1, 4, 6]}))
    x = np.random.default_rng(1).standard_normal((3, 4, 6)).astype(np.float32)
    sess.set_dim_param(0, 0, "?")
    (got,) = sess.run_feature(None, {"x": x})
    np.testing.assert_array_equal(got, x.transpose(2, 0, 1))


def test_a_warm_up_batch_of_identical_samples_does_not_decide_how_batches_run() -> None:
    """A model written for one sample (rows centred on the mean of every row of the flattened batch) mixes the
    samples of a whole batch. A first batch of zeros cannot show it: every later batch ran whole and mixed
    (hunt 44 D4)."""
    from onnx import helper, numpy_helper

    rows = numpy_helper.from_array(np.array([-1, 6], np.int64), "rows")
    back = numpy_helper.from_array(np.array([-1, 4, 6], np.int64), "back")
    nodes = [helper.make_node("Reshape", ["x", "rows"], ["r"]),
             helper.make_node("ReduceMean", ["r"], ["m"], axes=[0], keepdims=1),  # same for identical samples
             helper.make_node("Sub", ["r", "m"], ["s"]), helper.make_node("Reshape", ["s", "back"], ["y"])]
    sess = HB_ONNXRuntime(onnx_model=_plain(nodes, {"x": [1, 4, 6]}, [rows, back]))
    x = np.random.default_rng(2).standard_normal((3, 4, 6)).astype(np.float32)
    singles = np.concatenate([sess.run_feature(None, {"x": x[i:i + 1]})[0] for i in range(3)])
    sess.set_dim_param(0, 0, "?")
    sess.run_feature(None, {"x": np.zeros_like(x)})  # the warm-up
    for _ in range(2):
        np.testing.assert_allclose(sess.run_feature(None, {"x": x})[0], singles, rtol=1e-6)


def test_outputs_of_another_size_per_sample_come_from_the_whole_batch() -> None:
    """An NMS inside the model keeps its own number of boxes per picture ([K, 3] rows of batch, class, box): the
    samples' results cannot be joined, and the batch stopped with a bare numpy error (hunt 44 D2); the whole run
    gives them, with each box's batch index."""
    from onnx import helper, numpy_helper

    most = numpy_helper.from_array(np.array([10], np.int64), "most")
    iou = numpy_helper.from_array(np.array([0.5], np.float32), "iou")
    floor = numpy_helper.from_array(np.array([0.5], np.float32), "floor")
    nodes = [helper.make_node("NonMaxSuppression", ["boxes", "scores", "most", "iou", "floor"], ["kept"])]
    model = _plain(nodes, {"boxes": [1, 8, 4], "scores": [1, 1, 8]}, [most, iou, floor], opset=11)
    model.graph.output[0].type.tensor_type.elem_type = onnx.TensorProto.INT64
    sess = HB_ONNXRuntime(onnx_model=model)
    rng = np.random.default_rng(3)
    corners = rng.uniform(0, 10, (3, 8, 2)).astype(np.float32)
    boxes = np.concatenate([corners, corners + 1], axis=2)
    scores = rng.uniform(0, 1, (3, 1, 8)).astype(np.float32)
    counts = [len(sess.run_feature(None, {"boxes": boxes[i:i + 1], "scores": scores[i:i + 1]})[0]) for i in range(3)]
    assert len(set(counts)) > 1, counts  # the pictures keep different numbers of boxes
    sess.set_dim_param(0, 0, "?")
    sess.set_dim_param(1, 0, "?")
    (kept,) = sess.run_feature(None, {"boxes": boxes, "scores": scores})
    assert np.bincount(kept[:, 0], minlength=3).tolist() == counts
