"""Caffe front end: what a user gets wrong is one HbError saying what and where."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import numpy as np
import pytest
from caffe_builders import CaffeNet
from google.protobuf import text_format
from onnx import numpy_helper

from hbtools.errors import HbError
from hbtools.frontends.caffe import load_caffe
from hbtools.frontends.caffe.proto import NetParameter


def small_net() -> CaffeNet:
    n = CaffeNet(seed=20)
    n.conv(n.input("data", [1, 3, 6, 6]), 4, 3, pad=1, top="conv1")
    return n


def convert_error(net: CaffeNet, tmp_path: Path, **kwargs: object) -> str:
    with pytest.raises(HbError) as info:
        load_caffe(*net.write(tmp_path), **kwargs)  # type: ignore[arg-type]
    return str(info.value)


def test_an_accuracy_layer_gives_the_vendor_message(tmp_path: Path) -> None:
    n = small_net()
    n.layer("Accuracy", ["conv1"], ["accuracy"], "include { phase: TEST }", name="accuracy")
    assert convert_error(n, tmp_path) == "ValueError: Not support layer name=accuracy type=Accuracy"


def test_unknown_layer_type_is_reported_before_any_weight_is_read(tmp_path: Path) -> None:
    proto, _ = small_net().write(tmp_path)
    text = proto.read_text() + 'layer { name: "mystery" type: "Mystery" bottom: "conv1" top: "m" }\n'
    proto.write_text(text)
    (tmp_path / "empty.caffemodel").write_bytes(b"")
    with pytest.raises(HbError, match=r"^ValueError: Not support layer name=mystery type=Mystery$"):
        load_caffe(proto, tmp_path / "empty.caffemodel")


def test_parameters_of_other_caffe_branches_are_skipped_with_a_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    proto, weights = small_net().write(tmp_path)
    proto.write_text(proto.read_text() + 'layer { name: "proposal" type: "Proposal" bottom: "conv1" top: "p" '
                                          'proposal_param { feat_stride: 16 } }\n')
    logger = logging.getLogger("hbtools")  # may not propagate once a CLI test has set up logging
    logger.addHandler(caplog.handler)
    try:
        with pytest.raises(HbError, match="Not support layer name=proposal type=Proposal"):
            load_caffe(proto, weights)
    finally:
        logger.removeHandler(caplog.handler)
    assert any(r.levelno == logging.WARNING and "proposal_param" in r.getMessage() for r in caplog.records)


def test_weights_must_belong_to_the_prototxt(tmp_path: Path) -> None:
    n = small_net()
    proto, _ = n.write(tmp_path)
    other = CaffeNet(seed=21)
    other.conv(other.input("data", [1, 3, 6, 6]), 4, 3, pad=1)
    other.net.layer[1].name = "another_conv"  # weights are matched by layer name
    _, weights = other.write(tmp_path / "other")
    with pytest.raises(HbError,
                       match=r"caffe layer 'convolution2' \(type Convolution\): the caffemodel has no weights for it"):
        load_caffe(proto, weights)


def test_blob_of_the_wrong_size(tmp_path: Path) -> None:
    n = small_net()
    blob = n.net.layer[1].blobs[0]
    del blob.data[:]
    del blob.shape.dim[:]
    blob.shape.dim.extend([8, 3, 3, 3])
    blob.data.extend([0.0] * 8 * 27)
    message = convert_error(n, tmp_path)
    assert "weight blob has shape [8, 3, 3, 3]" in message and "needs [4, 3, 3, 3]" in message


@pytest.mark.parametrize(("text", "expected"), [
    ('layer { name: "x" type: "Input" top: "x" input_param { shape { dim: 1 } }', "not a valid Caffe prototxt"),
    ('name: "empty"', "has no layers"),
    ('layer { name: "x" type: "Input" top: "x" input_param { shape { dim: 1 dim: 3 } } }\n'
     'layers { name: "y" type: RELU bottom: "x" top: "y" }', "mixes 'layer' and legacy 'layers'"),
])
def test_bad_prototxt_text(text: str, expected: str, tmp_path: Path) -> None:
    (tmp_path / "bad.prototxt").write_text(text)
    (tmp_path / "w.caffemodel").write_bytes(b"")
    with pytest.raises(HbError, match=expected):
        load_caffe(tmp_path / "bad.prototxt", tmp_path / "w.caffemodel")


def test_missing_and_corrupt_files(tmp_path: Path) -> None:
    proto, weights = small_net().write(tmp_path)
    with pytest.raises(HbError, match="prototxt '.*nope.prototxt' does not exist"):
        load_caffe(tmp_path / "nope.prototxt", weights)
    with pytest.raises(HbError, match="caffe_model '.*nope.caffemodel' does not exist"):
        load_caffe(proto, tmp_path / "nope.caffemodel")
    good = weights.read_bytes()
    weights.write_bytes(b"\xff\xff\xff not protobuf")
    with pytest.raises(HbError, match="cannot be read as a .caffemodel"):
        load_caffe(proto, weights)
    weights.write_bytes(good[:len(good) // 2])  # an interrupted download
    with pytest.raises(HbError, match=r"\(\d+ bytes\) cannot be read as a .caffemodel") as info:
        load_caffe(proto, weights)
    assert "damaged or incomplete" in (info.value.hint or "")
    weights.write_bytes(b"")
    with pytest.raises(HbError, match=r"\(0 bytes\) holds no layers"):
        load_caffe(proto, weights)


def test_swapped_prototxt_and_caffemodel(tmp_path: Path) -> None:
    proto, weights = small_net().write(tmp_path)
    with pytest.raises(HbError, match=r"prototxt '.*net.caffemodel' is a binary file") as info:
        load_caffe(weights, proto)
    assert "swapped" in (info.value.hint or "") and "\n" not in str(info.value)
    with pytest.raises(HbError, match=r"caffe_model '.*net.prototxt' is a text file") as info:
        load_caffe(proto, proto)
    assert "swapped" in (info.value.hint or "")


def test_prototxt_from_a_windows_editor(tmp_path: Path) -> None:
    """A byte order mark, CRLF line ends and GBK-encoded comments are all read."""
    n = small_net()
    proto, weights = n.write(tmp_path)
    text = "# \u5377\u79ef\u7f51\u7edc\n" + proto.read_text()
    proto.write_bytes(b"\xef\xbb\xbf" + text.replace("\n", "\r\n").encode("gbk"))
    model = load_caffe(proto, weights)
    assert [o.name for o in model.graph.output] == ["conv1"]


def test_typo_in_a_layer_type_is_pointed_out(tmp_path: Path) -> None:
    n = small_net()
    n.layer("Relu", ["conv1"], ["r"])
    with pytest.raises(HbError, match="type=Relu") as info:
        load_caffe(*n.write(tmp_path))
    assert 'did you mean type "ReLU"' in (info.value.hint or "")


def test_nan_weights_are_warned_about(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    n = small_net()
    n.net.layer[1].blobs[0].data[3] = float("nan")
    logger = logging.getLogger("hbtools")
    logger.addHandler(caplog.handler)
    try:
        load_caffe(*n.write(tmp_path))
    finally:
        logger.removeHandler(caplog.handler)
    assert any(r.levelno == logging.WARNING and "layer 'convolution2' holds 1 NaN/inf" in r.getMessage()
               for r in caplog.records)


def test_a_data_layer_needs_an_input_shape(tmp_path: Path) -> None:
    n = CaffeNet(seed=22)
    n.layer("Data", [], ["data", "label"], 'data_param { source: "train_lmdb" batch_size: 8 }', name="data")
    n.layer("ReLU", ["data"], ["out"])
    proto, weights = n.write(tmp_path)
    with pytest.raises(HbError, match=r"caffe input 'data' \(layer 'data' \(Data\)\) has no shape") as info:
        load_caffe(proto, weights)
    assert "input_shape" in (info.value.hint or "")
    model = load_caffe(proto, weights, {"data": [1, 3, 4, 4]})
    assert [i.name for i in model.graph.input] == ["data"]  # the label top is not an input


@pytest.mark.parametrize(("layer", "expected"), [
    (("ReLU", ["nothing"], ["r"], ""), "bottom 'nothing' is not produced"),
    (("Concat", ["data", "conv1"], ["c"], "concat_param { axis: 2 }"), "do not fit its input shapes"),
    (("Eltwise", ["data", "conv1"], ["e"], ""), "bottom shapes differ"),
    (("Reshape", ["conv1"], ["r"], "reshape_param { shape { dim: 5 dim: -1 } }"), "cannot hold the 144 values"),
    (("Slice", ["conv1"], ["a", "b"], "slice_param { slice_point: 9 }"), "does not cut axis 1"),
    (("Pooling", ["conv1"], ["p"], "pooling_param { pool: MAX kernel_size: 2 pad: 2 }"), "must be smaller"),
    (("Convolution", ["conv1"], ["c"], "convolution_param { num_output: 3 kernel_size: 1 group: 2 }"),
     "group 2 does not divide"),
    (("Pooling", ["conv1", "data"], ["p"], "pooling_param { pool: MAX kernel_size: 2 }"),
     "has 2 bottom blobs but reads 1; the extra bottom 'data' is not used"),
    (("ReLU", ["data"], ["conv1"], ""), "top 'conv1' is already produced by an earlier layer"),
    (("ReLU", ["conv1"], ["r1", "r2"], ""), "has 2 top blobs but makes 1; the extra top 'r2' is never written"),
    (("Convolution", ["conv1", "data"], ["c"], "convolution_param { num_output: 3 kernel_size: 1 bias_term: false }"),
     "has 2 bottom(s) and 1 top(s)"),
    (("Convolution", ["conv1", "data"], ["c", "d"],
      "convolution_param { num_output: 3 kernel_size: 1 bias_term: false }"),
     "bottom 1 has shape [1, 3, 6, 6], bottom 0 [1, 4, 6, 6]"),
    (("Exp", ["conv1"], ["e"], "exp_param { base: 0 }"), "base 0 must be positive"),
    (("ArgMax", ["conv1"], ["a"], "argmax_param { top_k: 5 axis: 1 }"), "top_k 5 must be between 1 and the 4"),
])
def test_layer_parameters_that_do_not_fit(layer: tuple, expected: str, tmp_path: Path) -> None:
    n = small_net()
    type_, bottoms, tops, params = layer
    n.layer(type_, bottoms, tops, params, blobs=[np.zeros((3, 4, 1, 1), np.float32)] if type_ == "Convolution"
            else [])
    assert expected in convert_error(n, tmp_path)


def test_an_input_shape_the_weights_do_not_fit_is_named(tmp_path: Path) -> None:
    n = small_net()
    n.inner_product("conv1", 5)
    proto, weights = n.write(tmp_path)
    with pytest.raises(HbError, match=r"needs \[5, 256\]") as info:
        load_caffe(proto, weights, {"data": [1, 3, 8, 8]})
    assert "input_shape sets 'data' 1x3x8x8 (the prototxt says 1x3x6x6)" in (info.value.hint or "")
    assert load_caffe(proto, weights, {"data": [1, 3, 6, 6]}).graph.output[0].name == "fc3"


def test_blobs_the_prototxt_does_not_use(tmp_path: Path) -> None:
    """bias_term: false in an edited prototxt while the caffemodel holds the trained bias: Caffe refuses
    the pair, and converting without the bias would give other numbers."""
    n = small_net()
    proto, weights = n.write(tmp_path)
    proto.write_text(proto.read_text().replace("bias_term: true", "bias_term: false"))
    with pytest.raises(HbError, match=r"'convolution2' \(type Convolution\): the caffemodel has 2 blob\(s\) for it, "
                                      r"but its prototxt parameters use 1") as info:
        load_caffe(proto, weights)
    assert "bias_term" in (info.value.hint or "")


def test_a_blob_of_the_right_size_but_another_shape(tmp_path: Path) -> None:
    """A 1x9 kernel is not a 3x3 one, and a transposed InnerProduct matrix is not the matrix: Caffe
    compares blob shapes, not only their sizes."""
    n = small_net()
    proto, weights = n.write(tmp_path)
    proto.write_text(proto.read_text().replace("kernel_size: 3", "kernel_h: 1 kernel_w: 9").replace("pad: 1", "pad: 0"))
    with pytest.raises(HbError, match=r"weight blob has shape \[4, 3, 3, 3\] \(108 values\) but the layer needs "
                                      r"\[4, 3, 1, 9\]"):
        load_caffe(proto, weights)
    m = CaffeNet(seed=23)
    m.inner_product(m.input("data", [1, 6]), 4)
    proto, weights = m.write(tmp_path / "ip")
    proto.write_text(proto.read_text().replace("transpose: false", "transpose: true"))
    with pytest.raises(HbError, match=r"weight blob has shape \[4, 6\] \(24 values\) but the layer needs \[6, 4\]"):
        load_caffe(proto, weights)


def _as_raw_float16(caffemodel: Path) -> None:
    """Rewrite ``caffemodel`` as OpenCV's cv2.dnn.shrinkCaffeModel does: each blob's values as float16
    ``raw_data`` (field 12) of ``raw_data_type`` FLOAT16 (2, field 10), the float fields cleared."""
    from hbtools.frontends.caffe import proto

    net = proto.WeightsNet.FromString(caffemodel.read_bytes())
    for layer in net.layer:
        for blob in layer.blobs:
            values = np.frombuffer(b"".join(blob.data), dtype="<f4")
            del blob.data[:]
            blob.raw_data_type = 2
            blob.raw_data = values.astype("<f2").tobytes()
    caffemodel.write_bytes(net.SerializeToString())


def test_float16_weights_as_opencv_shrinks_them_are_read(tmp_path: Path) -> None:
    """HyperLPR ships caffemodels shrunk to float16 by OpenCV; they were refused ('shape [32, 3, 3, 3] but 0
    values'). The weights read are the float16 values, and the network is the float32 one's up to them."""
    n = small_net()
    proto_path, model_path = n.write(tmp_path)
    full = load_caffe(proto_path, model_path)
    _as_raw_float16(model_path)
    half = load_caffe(proto_path, model_path)
    full_w = {t.name: numpy_helper.to_array(t) for t in full.graph.initializer}
    half_w = {t.name: numpy_helper.to_array(t) for t in half.graph.initializer}
    assert full_w.keys() == half_w.keys() and full_w
    for name, w in full_w.items():
        np.testing.assert_array_equal(half_w[name], w.astype(np.float16).astype(np.float32))


def test_raw_data_of_an_unknown_type_is_named(tmp_path: Path) -> None:
    from hbtools.frontends.caffe import proto

    proto_path, model_path = small_net().write(tmp_path)
    net = proto.WeightsNet.FromString(model_path.read_bytes())
    blob = net.layer[1].blobs[0]
    del blob.data[:]
    blob.raw_data_type, blob.raw_data = 7, b"\0" * 4 * 108
    model_path.write_bytes(net.SerializeToString())
    with pytest.raises(HbError, match=r"raw data of type 7, which hbtools does not read"):
        load_caffe(proto_path, model_path)


@pytest.mark.parametrize(("type_", "tops", "expected"), [
    ("BN", ["bn"], "BN layer of the SegNet / PSPNet forks .* BatchNorm layer .* Scale layer with bias_term"),
    ("DenseImageData", ["bn"], "replace it by an Input layer"),
    ("Pooling", ["pool", "pool_mask"], "mask of max unpooling .* which hbtools does not convert"),
])
def test_fork_layers_get_advice_that_leads_somewhere(type_: str, tops: list[str], expected: str,
                                                     tmp_path: Path) -> None:
    """SegNet's BN (a normalisation: removing it breaks the network), a data layer ("did you mean ImageData?"),
    max pooling with an unpooling mask ("remove the extra top", which only led to the next error)."""
    n = small_net()
    params = "pooling_param { pool: MAX kernel_size: 2 stride: 2 }" if type_ == "Pooling" else ""
    n.layer(type_, ["conv1"], tops, params, name="fork")
    with pytest.raises(HbError) as info:
        load_caffe(*n.write(tmp_path))
    assert re.search(expected, " ".join(info.value.lines())), info.value.lines()


def test_a_yolo_output_layer_ends_the_network(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """YOLOv3 ports end in a decoding layer of their own: the network ends before it, as before SSD's
    DetectionOutput (it was refused with "did you mean DetectionOutput?")."""
    n = small_net()
    n.layer("Yolov3DetectionOutput", ["conv1"], ["det"], name="yolo")
    with caplog.at_level(logging.WARNING, logger="hbtools"):
        model = load_caffe(*n.write(tmp_path))
    assert [o.name for o in model.graph.output] == ["conv1"]
    assert "Yolov3DetectionOutput" in caplog.text and "left out" in caplog.text


def test_input_dim_of_other_than_four_values_says_so(tmp_path: Path) -> None:
    """Caffe's net-level input_dim takes four values per input; three were reported as an input without a
    shape."""
    n = CaffeNet(seed=21)
    n.conv(n.input("data", [1, 3, 6, 6], form="input_dim"), 4, 3, pad=1, top="conv1")
    proto, weights = n.write(tmp_path)
    net = NetParameter()
    text_format.Parse(proto.read_text(), net)
    del net.input_dim[0]
    proto.write_text(text_format.MessageToString(net))
    with pytest.raises(HbError, match="input_dim gives 3 values for 1 input"):
        load_caffe(proto, weights)
