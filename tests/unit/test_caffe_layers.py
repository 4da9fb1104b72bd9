"""Caffe front end, layer by layer: the converted ONNX (run by onnxruntime) against numpy.

Every case builds a small Caffe network with ``CaffeNet`` (prototxt text + caffemodel
bytes), converts it with ``load_caffe`` and compares each network output with the
float64 numpy reference: max |onnx - ref| / max |ref| <= 1e-5.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from caffe_builders import CaffeNet, conv2d, interp_bilinear, lrn, pool2d
from google.protobuf import text_format
from onnx import ModelProto

from hbtools.errors import HbError
from hbtools.frontends.caffe import load_caffe
from hbtools.frontends.caffe.proto import NetParameter
from hbtools.frontends.caffe.reader import read_weights

RTOL = 1e-5


def run(model: ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def assert_close(got: np.ndarray, ref: np.ndarray, what: str) -> None:
    assert got.shape == ref.shape, f"{what}: shape {got.shape}, reference {ref.shape}"
    rel = np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-12)
    assert rel <= RTOL, f"{what}: max |onnx - numpy| / max |numpy| = {rel:.3g} > {RTOL}"


def check(net: CaffeNet, tmp_path: Path, outputs: list[str]) -> ModelProto:
    """Convert ``net``; its outputs, in order, must be the blobs ``outputs`` and match numpy."""
    proto, weights = net.write(tmp_path)
    model = load_caffe(proto, weights)
    onnx.checker.check_model(model, full_check=True)
    feeds = net.sample()
    ref = net.forward(feeds)
    got = run(model, feeds)
    assert len(got) == len(outputs), [o.name for o in model.graph.output]
    for g, blob in zip(got, outputs, strict=True):
        assert_close(g, ref[blob], blob)
    return model


# ---------------------------------------------------------------- the cases

def convolutions() -> tuple[CaffeNet, list[str]]:
    n = CaffeNet(seed=1)
    x = n.input("data", [2, 4, 11, 10])
    a = n.conv(x, 6, 3, stride=2, pad=1)
    b = n.conv(a, 6, 3, pad=2, dilation=2, group=2, bias=False)
    c = n.conv(b, 6, 3, pad=1, group=6)  # depthwise
    d = n.conv(c, 5, 1)  # pointwise
    return n, [d]


def deconvolutions() -> tuple[CaffeNet, list[str]]:
    n = CaffeNet(seed=2)
    x = n.input("data", [1, 4, 5, 6])
    a = n.conv(x, 6, 4, stride=2, pad=1, deconv=True)
    b = n.conv(a, 4, 3, pad=1, group=2, bias=False, deconv=True)
    return n, [b]


def inner_products() -> tuple[CaffeNet, list[str]]:
    n = CaffeNet(seed=3)
    x = n.input("data", [2, 3, 4, 5])
    a = n.inner_product(x, 7)  # 4-D input, flattened from axis 1
    b = n.inner_product(a, 6, transpose=True, bias=False)
    c = n.inner_product(x, 3, axis=2)  # keeps N and C
    d = n.inner_product(x, 4, axis=-1, transpose=True)
    return n, [b, c, d]


def batch_norm_scale() -> tuple[CaffeNet, list[str]]:
    n = CaffeNet(seed=4)
    x = n.input("data", [2, 5, 6, 6])
    a = n.conv(x, 8, 3, pad=1, bias=False)
    n.batch_norm(a, eps=1e-3)
    n.scale(a)
    b = n.inner_product(a, 6)
    n.batch_norm(b)  # 2-D input
    n.scale(b, bias=False)
    c = n.conv(x, 4, 1)
    n.scale(c, axis=1, num_axes=-1)  # a C x H x W scale
    return n, [b, c]


def activations() -> tuple[CaffeNet, list[str]]:
    n = CaffeNet(seed=5)
    x = n.input("data", [1, 4, 5, 5])
    a = n.relu(x, slope=0.1, in_place=False)
    b = n.prelu(a)
    c = n.prelu(x, shared=True)
    d = n.unary("Sigmoid", c, lambda v: 1 / (1 + np.exp(-v)))
    e = n.unary("TanH", x, np.tanh)
    f = n.unary("ELU", x, lambda v: np.where(v > 0, v, 0.5 * (np.exp(v) - 1)), "elu_param { alpha: 0.5 }")
    g = n.unary("AbsVal", x, np.abs)
    h = n.relu(g, in_place=False)
    return n, [b, d, e, f, h]


def eltwise() -> tuple[CaffeNet, list[str]]:
    n = CaffeNet(seed=6)
    x = n.input("data", [1, 3, 4, 4])
    a, b = n.conv(x, 3, 1), n.conv(x, 3, 3, pad=1)
    return n, [n.eltwise([x, a]), n.eltwise([x, a, b], coeff=[0.5, -1.5, 2.0]), n.eltwise([a, b], "PROD"),
               n.eltwise([x, a, b], "MAX")]


def data_movement() -> tuple[CaffeNet, list[str]]:
    n = CaffeNet(seed=7)
    x = n.input("data", [2, 6, 4, 5])
    cat = n.layer("Concat", [x, x], ["cat"], "concat_param { axis: 1 }",
                  step=lambda v: v.__setitem__("cat", np.concatenate([v[x], v[x]], axis=1)))
    n.layer("Slice", [cat], ["s1", "s2", "s3"], "slice_param { axis: 1 slice_point: 2 slice_point: 7 }",
            step=lambda v: v.update(s1=v[cat][:, :2], s2=v[cat][:, 2:7], s3=v[cat][:, 7:]))
    n.layer("Slice", ["s2"], ["w1", "w2", "w3", "w4", "w5"], "slice_param { axis: -1 }",
            step=lambda v: v.update({f"w{i + 1}": v["s2"][..., i:i + 1] for i in range(5)}))
    n.layer("Concat", ["w5", "w1"], ["cat2"], "concat_param { concat_dim: 3 }",
            step=lambda v: v.__setitem__("cat2", np.concatenate([v["w5"], v["w1"]], axis=3)))
    n.layer("Flatten", ["s1"], ["flat"], step=lambda v: v.__setitem__("flat", v["s1"].reshape(2, -1)))
    n.layer("Flatten", ["s3"], ["flat2"], "flatten_param { axis: 2 }",
            step=lambda v: v.__setitem__("flat2", v["s3"].reshape(2, 5, -1)))
    n.layer("Flatten", ["s3"], ["flat3"], "flatten_param { axis: 0 end_axis: 1 }",
            step=lambda v: v.__setitem__("flat3", v["s3"].reshape(10, 4, 5)))
    n.layer("Reshape", ["w1"], ["r1"], "reshape_param { shape { dim: 0 dim: -1 dim: 2 } }",
            step=lambda v: v.__setitem__("r1", v["w1"].reshape(2, -1, 2)))
    n.layer("Reshape", ["w2"], ["r2"], "reshape_param { shape { dim: 1 dim: -1 } axis: 1 num_axes: 1 }",
            step=lambda v: v.__setitem__("r2", v["w2"].reshape(2, 1, 5, 4, 1)))
    n.layer("Permute", ["s2"], ["p1"], "permute_param { order: 0 order: 2 order: 3 order: 1 }",
            step=lambda v: v.__setitem__("p1", v["s2"].transpose(0, 2, 3, 1)))
    n.layer("Permute", ["s2"], ["p2"], "permute_param { order: 0 order: 3 }",
            step=lambda v: v.__setitem__("p2", v["s2"].transpose(0, 3, 1, 2)))
    for blob in ("w3", "w4"):
        n.layer("Silence", [blob], [])
    return n, ["cat2", "flat", "flat2", "flat3", "r1", "r2", "p1", "p2"]


def softmax_and_friends() -> tuple[CaffeNet, list[str]]:
    n = CaffeNet(seed=8)
    x = n.input("data", [2, 5, 3, 4])
    a, b, c = n.softmax(x), n.softmax(x, axis=2), n.softmax(x, axis=-1)
    n.layer("LRN", [x], ["lrn_a"], "lrn_param { local_size: 3 alpha: 0.5 beta: 0.75 k: 2 }",
            step=lambda v: v.__setitem__("lrn_a", lrn(v[x], 3, 0.5, 0.75, 2.0, within=False)))
    n.layer("LRN", [x], ["lrn_w"], "lrn_param { local_size: 3 alpha: 0.3 beta: 0.6 norm_region: WITHIN_CHANNEL }",
            step=lambda v: v.__setitem__("lrn_w", lrn(v[x], 3, 0.3, 0.6, 1.0, within=True)))
    n.layer("Power", [x], ["pw"], "power_param { power: 2 scale: 0.5 shift: 1 }",
            step=lambda v: v.__setitem__("pw", (1 + 0.5 * v[x]) ** 2))
    n.layer("Power", ["pw"], ["pw2"], "power_param { power: 0.5 shift: 0.25 }",
            step=lambda v: v.__setitem__("pw2", (0.25 + v["pw"]) ** 0.5))
    n.layer("Dropout", ["pw2"], ["pw2"], "dropout_param { dropout_ratio: 0.3 }", step=lambda v: None)
    n.layer("Dropout", [x], ["drop"], "dropout_param { dropout_ratio: 0.25 scale_train: false }",
            step=lambda v: v.__setitem__("drop", v[x] * 0.75))
    return n, [a, b, c, "lrn_a", "lrn_w", "pw2", "drop"]


def resizing() -> tuple[CaffeNet, list[str]]:
    n = CaffeNet(seed=9)
    x = n.input("data", [1, 3, 5, 4])
    n.layer("Upsample", [x], ["up"], "upsample_param { scale: 2 }",
            step=lambda v: v.__setitem__("up", v[x].repeat(2, axis=2).repeat(2, axis=3)))
    n.layer("Interp", [x], ["zoom"], "interp_param { zoom_factor: 3 }",
            step=lambda v: v.__setitem__("zoom", interp_bilinear(v[x], 13, 10)))
    n.layer("Interp", [x], ["sized"], "interp_param { height: 7 width: 9 }",
            step=lambda v: v.__setitem__("sized", interp_bilinear(v[x], 7, 9)))
    n.layer("Interp", ["up", x], ["like"], "",
            step=lambda v: v.__setitem__("like", interp_bilinear(v["up"], 5, 4)))
    n.layer("Crop", ["zoom", x], ["crop"], "crop_param { axis: 2 offset: 1 offset: 3 }",
            step=lambda v: v.__setitem__("crop", v["zoom"][:, :, 1:6, 3:7]))
    return n, ["sized", "like", "crop"]


def exp_log_threshold_argmax() -> tuple[CaffeNet, list[str]]:
    n = CaffeNet(seed=10)
    x = n.input("data", [2, 5, 3, 4])

    def put(top: str, fn: Callable[[np.ndarray], np.ndarray], bottom: str = x) -> Callable[[dict], None]:
        return lambda v: v.__setitem__(top, fn(v[bottom]))
    n.layer("Exp", [x], ["e"], "", step=put("e", np.exp))
    n.layer("Exp", [x], ["e2"], "exp_param { base: 2 scale: 0.5 shift: -1 }",
            step=put("e2", lambda v: 2 ** (0.5 * v - 1)))
    n.layer("AbsVal", [x], ["a"], "", step=put("a", np.abs))
    n.layer("Log", ["a"], ["l"], "", step=put("l", np.log, "a"))
    n.layer("Log", ["a"], ["l10"], "log_param { base: 10 scale: 2 shift: 1 }",
            step=put("l10", lambda v: np.log10(1 + 2 * v), "a"))
    n.layer("BNLL", [x], ["b"], "", step=put("b", lambda v: np.log1p(np.exp(v))))
    n.layer("Threshold", [x], ["t"], "threshold_param { threshold: 0.3 }", step=put("t", lambda v: 1.0 * (v > 0.3)))
    n.layer("ArgMax", [x], ["am"], "argmax_param { axis: 1 }", step=put("am", lambda v: v.argmax(1)[:, None] * 1.0))
    n.layer("ArgMax", [x], ["mv"], "argmax_param { axis: 1 top_k: 2 out_max_val: true }",
            step=put("mv", lambda v: -np.sort(-v, axis=1)[:, :2]))
    n.layer("ArgMax", [x], ["flat"], "argmax_param { top_k: 3 out_max_val: true }",
            step=put("flat", lambda v: np.stack([np.argsort(-v.reshape(2, -1), axis=1)[:, :3],
                                                 -np.sort(-v.reshape(2, -1), axis=1)[:, :3]], axis=1)))
    return n, ["e", "e2", "l", "l10", "b", "t", "am", "mv", "flat"]


def shared_weight_convolution() -> tuple[CaffeNet, list[str]]:
    """One Convolution layer with two bottom/top pairs: both use the layer's weights (siamese nets)."""
    n = CaffeNet(seed=11)
    a, b = n.input("left", [1, 3, 6, 6]), n.input("right", [1, 3, 6, 6])
    w, bias = n.randn(4, 3, 3, 3), n.randn(4)

    def step(v: dict) -> None:
        for blob, top in ((a, "ca"), (b, "cb")):
            v[top] = conv2d(v[blob], w, bias, (2, 2), (1, 1), (1, 1), 1)
    n.layer("Convolution", [a, b], ["ca", "cb"], "convolution_param { num_output: 4 kernel_size: 3 stride: 2 pad: 1 }",
            [w, bias], step)
    return n, ["ca", "cb"]


def ssd_normalize() -> tuple[CaffeNet, list[str]]:
    """SSD's Normalize (conv4_3_norm): L2 over channels per position, or over everything; learned scale."""
    n = CaffeNet(seed=12)
    x = n.input("data", [2, 4, 3, 5])
    gamma = n.rng.uniform(5, 20, 4).astype(np.float32)

    def per_position(v: dict) -> None:
        v["np"] = v[x] / np.sqrt((v[x] ** 2).sum(axis=1, keepdims=True) + 1e-10) * gamma.reshape(1, 4, 1, 1)

    def across(v: dict) -> None:
        v["na"] = v[x] / np.sqrt((v[x] ** 2).sum(axis=(1, 2, 3), keepdims=True) + 1e-3) * 20.0
    n.layer("Normalize", [x], ["np"], "norm_param { across_spatial: false channel_shared: false "
            "scale_filler { type: 'constant' value: 20 } }", [gamma], per_position)
    n.layer("Normalize", [x], ["na"], "norm_param { eps: 0.001 }", [np.array([20.0], np.float32)], across)
    return n, ["np", "na"]


def _darknet_reorg(x: np.ndarray, stride: int, reverse: bool) -> np.ndarray:
    """Darknet's reorg_cpu loop, which the Caffe YOLOv2 ports run with forward = reverse, on flat memory."""
    b_, c, h, w = x.shape
    flat, out = x.ravel(), np.empty(x.size)
    out_c = c // (stride * stride)
    for b in range(b_):
        for k in range(c):
            for j in range(h):
                for i in range(w):
                    in_index = i + w * (j + h * (k + c * b))
                    offset = k // out_c
                    w2, h2 = i * stride + offset % stride, j * stride + offset // stride
                    out_index = w2 + w * stride * (h2 + h * stride * (k % out_c + out_c * b))
                    if reverse:
                        out[out_index] = flat[in_index]
                    else:
                        out[in_index] = flat[out_index]
    s2 = stride * stride
    return out.reshape((b_, c // s2, h * stride, w * stride) if reverse else (b_, c * s2, h // stride, w // stride))


def _mvn(x: np.ndarray, axes: tuple[int, ...], variance: bool, eps: float) -> np.ndarray:
    mean = x.mean(axis=axes, keepdims=True)
    if not variance:
        return x - mean
    return (x - mean) / (np.sqrt((x * x).mean(axis=axes, keepdims=True) - mean * mean) + eps)


def relu6_shuffle_reorg_mvn_tile_axpy() -> tuple[CaffeNet, list[str]]:
    """Layers of the MobileNet, ShuffleNet, YOLOv2 and SENet Caffe ports: 'Not support layer' before."""
    n = CaffeNet(seed=13)
    x = n.input("data", [2, 8, 4, 6])
    a = n.input("gate", [2, 8, 1, 1])

    def put(top: str, fn: Callable[..., np.ndarray], *bottoms: str) -> Callable[[dict], None]:
        return lambda v: v.__setitem__(top, fn(*(v[b] for b in bottoms or (x,))))

    def shuffled(v: np.ndarray, group: int) -> np.ndarray:
        out = np.empty_like(v)
        per = v.shape[1] // group
        for i in range(group):
            for j in range(per):
                out[:, j * group + i] = v[:, i * per + j]
        return out
    n.layer("Power", [x], ["big"], "power_param { scale: 5 }", step=put("big", lambda v: 5 * v))
    n.layer("ReLU6", ["big"], ["r6"], "", step=put("r6", lambda v: np.clip(v, 0, 6), "big"))
    n.layer("ShuffleChannel", [x], ["sh"], "shuffle_channel_param { group: 2 }",
            step=put("sh", lambda v: shuffled(v, 2)))
    n.layer("Reorg", [x], ["ro"], "reorg_param { stride: 2 }", step=put("ro", lambda v: _darknet_reorg(v, 2, False)))
    n.layer("Reorg", [x], ["rr"], "reorg_param { stride: 2 reverse: true }",
            step=put("rr", lambda v: _darknet_reorg(v, 2, True)))
    n.layer("MVN", [x], ["mv"], "", step=put("mv", lambda v: _mvn(v, (2, 3), True, 1e-9)))
    n.layer("MVN", [x], ["ma"], "mvn_param { across_channels: true eps: 0.01 }",
            step=put("ma", lambda v: _mvn(v, (1, 2, 3), True, 0.01)))
    n.layer("MVN", [x], ["mm"], "mvn_param { normalize_variance: false }",
            step=put("mm", lambda v: _mvn(v, (2, 3), False, 0.0)))
    n.layer("Tile", [x], ["ti"], "tile_param { axis: 2 tiles: 3 }", step=put("ti", lambda v: np.tile(v, (1, 1, 3, 1))))
    n.layer("Axpy", [a, x, "sh"], ["ax"], "", step=put("ax", lambda g, v, y: g * v + y, a, x, "sh"))
    return n, ["r6", "ro", "rr", "mv", "ma", "mm", "ti", "ax"]


CASES: dict[str, Callable[[], tuple[CaffeNet, list[str]]]] = {
    "relu6_shuffle_reorg_mvn_tile_axpy": relu6_shuffle_reorg_mvn_tile_axpy,
    "ssd_normalize": ssd_normalize,
    "exp_log_bnll_threshold_argmax": exp_log_threshold_argmax,
    "shared_weight_convolution": shared_weight_convolution,
    "convolutions": convolutions,
    "deconvolutions": deconvolutions,
    "inner_products": inner_products,
    "batch_norm_scale": batch_norm_scale,
    "activations": activations,
    "eltwise": eltwise,
    "data_movement": data_movement,
    "softmax_lrn_power_dropout": softmax_and_friends,
    "upsample_interp_crop": resizing,
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_layers_match_numpy(case: str, tmp_path: Path) -> None:
    net, outputs = CASES[case]()
    check(net, tmp_path, outputs)


# Pooling: Caffe rounds the output size up, then drops a last window that would start in
# the padding. (size, size) pairs include ones where only one axis is rounded up.
POOL_SHAPES = [(7, 7), (8, 8), (5, 6), (6, 5), (9, 12)]
POOL_CONFIGS = [(2, 2, 0), (3, 2, 0), (3, 2, 1), (3, 3, 1), (3, 1, 1), (4, 3, 2)]


@pytest.mark.parametrize("method", ["MAX", "AVE"])
def test_pooling_rounds_like_caffe(method: str, tmp_path: Path) -> None:
    n = CaffeNet(seed=10)
    outputs = []
    for h, w in POOL_SHAPES:
        x = n.input(f"x{h}_{w}", [1, 2, h, w])
        outputs += [n.pool(x, method, k, s, p) for k, s, p in POOL_CONFIGS]
        outputs.append(n.pool(x, method, 3, 2, 1, floor=True))
    outputs += [n.pool("x9_12", method, global_=True)]
    model = check(n, tmp_path, outputs)
    ops = {node.op_type for node in model.graph.node}
    assert {"GlobalMaxPool" if method == "MAX" else "GlobalAveragePool"} <= ops
    # Rounding up shows as ONNX ceil_mode where onnx's shape rule agrees with Caffe's.
    assert any(a.name == "ceil_mode" and a.i == 1 for node in model.graph.node for a in node.attribute)


@pytest.mark.parametrize(("type_", "group"), [("ConvolutionDepthwise", ""), ("DepthwiseConvolution", "group: 4"),
                                             ("ConvolutionDepthwise", "group: 2")])
def test_depthwise_convolutions_of_mobilenet_and_shufflenet_ports(type_: str, group: str, tmp_path: Path) -> None:
    """The depthwise layers of the MobileNet / ShuffleNet Caffe ports are grouped Convolutions (group: the input's
    channels where not given); they were refused with advice to remove them."""
    n = CaffeNet(seed=18)
    x = n.input("x", [1, 4, 7, 7])
    groups = int(group.split()[-1]) if group else 4
    w, b = n.randn(8, 4 // groups, 3, 3, scale=0.5), n.randn(8, scale=0.1)

    def step(v: dict) -> None:
        v["dw"] = conv2d(v[x], w, b, (2, 2), (1, 1), (1, 1), groups)

    n.layer(type_, [x], ["dw"], f"convolution_param {{ num_output: 8 kernel_size: 3 stride: 2 pad: 1 {group} }}",
            blobs=[w, b], step=step)
    check(n, tmp_path, ["dw"])


@pytest.mark.parametrize("ceil", [False, True])
def test_pooling_ceil_mode_of_caffe_forks(ceil: bool, tmp_path: Path) -> None:
    """BVLC/caffe PR #3057's ``ceil_mode`` (DenseNet-Caffe, PyTorch exporters): ``false`` rounds down as
    ``round_mode: FLOOR`` does. It was skipped with a WARNING, and DenseNet's maps came out a row and a
    column larger (57 for 56)."""
    n = CaffeNet(seed=16)
    x = n.input("x", [1, 2, 8, 8])

    def step(v: dict) -> None:
        v["p"] = pool2d(v[x], "MAX", (3, 3), (2, 2), (1, 1), ceil=ceil)

    n.layer("Pooling", [x], ["p"], f"pooling_param {{ pool: MAX kernel_size: 3 stride: 2 pad: 1 "
                                   f"ceil_mode: {str(ceil).lower()} }}", step=step)
    check(n, tmp_path, ["p"])
    n.net.layer[-1].pooling_param.round_mode = 1 if ceil else 0  # FLOOR / CEIL: the two disagree
    proto, weights = n.write(tmp_path)
    with pytest.raises(HbError, match="ceil_mode and round_mode disagree"):
        load_caffe(proto, weights)


@pytest.mark.parametrize("form", ["input_shape", "input_dim"])
def test_net_level_inputs_and_input_shape_override(form: str, tmp_path: Path) -> None:
    n = CaffeNet(seed=11)
    a = n.input("a", [1, 3, 6, 6], form=form)
    b = n.input("b", [1, 3, 6, 6], form=form)
    out = n.eltwise([n.conv(a, 3, 3, pad=1), b])
    check(n, tmp_path, [out])
    proto, weights = n.write(tmp_path / "again")
    model = load_caffe(proto, weights, {"a": [2, 3, 8, 10], "b": [2, 3, 8, 10]})
    assert [[d.dim_value for d in o.type.tensor_type.shape.dim] for o in model.graph.output] == [[2, 3, 8, 10]]


def test_single_input_override_without_a_name(tmp_path: Path) -> None:
    n = CaffeNet(seed=12)
    n.pool(n.input("data", [1, 3, 8, 8]), "AVE", global_=True)
    model = load_caffe(*n.write(tmp_path), {None: [4, 3, 5, 5]})
    assert [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim] == [4, 3, 5, 5]


def test_in_place_layers_names_and_outputs(tmp_path: Path) -> None:
    """Layer names become node names; blobs rewritten in place get fresh tensors; the outputs
    are the blobs nothing consumes, as in Caffe."""
    n = CaffeNet(seed=13)
    x = n.input("data", [1, 3, 8, 8])
    c = n.conv(x, 4, 3, pad=1, top="conv")
    n.batch_norm(c)
    n.scale(c)
    n.relu(c)
    side = n.pool(c, "MAX", 2, 2, top="side")
    main = n.conv(c, 4, 1, top="main")
    n.relu(main)
    model = check(n, tmp_path, [side, main])
    layer_names = [layer.name for layer in n.net.layer if layer.type != "Input"]
    main_nodes = [node.name for node in model.graph.node if "_" not in node.name]
    assert main_nodes == layer_names
    tensors = [o for node in model.graph.node for o in node.output]
    assert len(tensors) == len(set(tensors)), "every tensor written once"
    assert model.graph.output[0].name == "side"
    assert model.graph.output[1].name == layer_names[-1]  # the in-place ReLU on "main"


def test_every_unread_top_of_a_split_is_an_output(tmp_path: Path) -> None:
    """Caffe's outputs are the blobs nothing reads: both tops of a Split (one tensor in ONNX) count."""
    n = CaffeNet(seed=16)
    c = n.conv(n.input("data", [1, 3, 4, 4]), 3, 1)
    n.layer("Split", [c], ["s1", "s2"], step=lambda v: v.update(s1=v[c], s2=v[c]))
    n.layer("Dropout", [c], ["d"], step=lambda v: v.__setitem__("d", v[c]))
    model = check(n, tmp_path, ["s1", "s2", "d"])
    names = [o.name for o in model.graph.output]
    assert len(set(names)) == 3 and names[1:] == ["s2", "d"], names


def test_phase_rules_drop_training_layers(tmp_path: Path) -> None:
    n = CaffeNet(seed=14)
    x = n.input("data", [1, 3, 4, 4])
    y = n.conv(x, 2, 1)
    n.layer("Accuracy", [y, "label"], ["accuracy"], "include { phase: TRAIN }")
    n.layer("SoftmaxWithLoss", [y, "label"], ["loss"], "exclude { phase: TEST }")
    check(n, tmp_path, [y])


def test_legacy_v1_layers(tmp_path: Path) -> None:
    """``layers { type: CONVOLUTION }`` networks (Caffe before 1.0) read the same way."""
    rng = np.random.default_rng(15)
    w, b = rng.standard_normal((4, 3, 3, 3)).astype(np.float32), rng.standard_normal(4).astype(np.float32)
    text = """name: "old" input: "data" input_dim: 1 input_dim: 3 input_dim: 7 input_dim: 7
    layers { name: "conv1" type: CONVOLUTION bottom: "data" top: "conv1" blobs_lr: 1 blobs_lr: 2
             convolution_param { num_output: 4 kernel_size: 3 stride: 2 } }
    layers { name: "relu1" type: RELU bottom: "conv1" top: "conv1" }
    layers { name: "pool1" type: POOLING bottom: "conv1" top: "pool1"
             pooling_param { pool: AVE kernel_size: 2 stride: 2 } }
    """
    net = NetParameter()
    text_format.Parse(text, net)
    for blob in (w, b):
        proto = net.layers[0].blobs.add()
        proto.num, proto.channels, proto.height, proto.width = [1] * (4 - blob.ndim) + list(blob.shape)
        proto.data.extend(blob.ravel().tolist())
    (tmp_path / "old.prototxt").write_text(text)
    (tmp_path / "old.caffemodel").write_bytes(net.SerializeToString())
    model = load_caffe(tmp_path / "old.prototxt", tmp_path / "old.caffemodel")
    x = rng.standard_normal((1, 3, 7, 7)).astype(np.float32)
    ref = pool2d(np.maximum(conv2d(x.astype(np.float64), w, b, (2, 2), (0, 0), (1, 1), 1), 0), "AVE", (2, 2),
                 (2, 2), (0, 0))
    (got,) = run(model, {"data": x})
    assert_close(got, ref, "pool1")
    assert [node.name for node in model.graph.node] == ["conv1", "relu1", "pool1"]


def test_legacy_v1_mvn_reads_its_parameters(tmp_path: Path) -> None:
    """``mvn_param`` of a ``layers { type: MVN }`` entry (a Caffe 1.0 field of the legacy layer) was
    skipped with a WARNING, and the MVN normalised the variance per channel as by default."""
    text = """name: "old" input: "data" input_dim: 1 input_dim: 3 input_dim: 4 input_dim: 4
    layers { name: "mvn" type: MVN bottom: "data" top: "mvn"
             mvn_param { across_channels: true normalize_variance: false } }
    """
    net = NetParameter()
    text_format.Parse(text, net)
    (tmp_path / "old.prototxt").write_text(text)
    (tmp_path / "old.caffemodel").write_bytes(net.SerializeToString())
    model = load_caffe(tmp_path / "old.prototxt", tmp_path / "old.caffemodel")
    x = np.random.default_rng(17).standard_normal((1, 3, 4, 4)).astype(np.float32) * 3 + 1
    (got,) = run(model, {"data": x})
    assert_close(got, _mvn(x.astype(np.float64), (1, 2, 3), False, 1e-9), "mvn")


def test_weights_written_without_packing(tmp_path: Path) -> None:
    """Blob data stored as single floats (unpacked repeated field) reads like packed data."""
    def field(tag: int, payload: bytes) -> bytes:
        return bytes([tag, len(payload)]) + payload

    blob = field(0x3A, field(0x0A, b"\x02")) + b"".join(b"\x2d" + struct.pack("<f", v) for v in (1.5, -2.0))
    layer = field(0x0A, b"c") + field(0x3A, blob)
    (tmp_path / "w.caffemodel").write_bytes(b"\xa2\x06" + bytes([len(layer)]) + layer)  # NetParameter.layer
    weights = read_weights(tmp_path / "w.caffemodel")
    assert list(weights) == ["c"] and weights["c"][0].tolist() == [1.5, -2.0]


def _caffe_prior_box(layer_hw: tuple[int, int], image_hw: tuple[int, int], min_sizes: list[float],
                     max_sizes: list[float], ratios: list[float], variance: list[float], clip: bool) -> np.ndarray:
    """prior_box_layer.cpp of the SSD branch, defaults flip: true, offset: 0.5, steps from the sizes."""
    all_ratios = [1.0]
    for r in ratios:
        if all(abs(r - a) >= 1e-6 for a in all_ratios):
            all_ratios += [r, 1 / r]
    step_h, step_w = image_hw[0] / layer_hw[0], image_hw[1] / layer_hw[1]
    out = []
    for h in range(layer_hw[0]):
        for w in range(layer_hw[1]):
            cx, cy = (w + 0.5) * step_w, (h + 0.5) * step_h
            for k, mn in enumerate(min_sizes):
                shapes = [(mn, mn)] + ([(np.sqrt(mn * max_sizes[k]),) * 2] if max_sizes else [])
                shapes += [(mn * np.sqrt(r), mn / np.sqrt(r)) for r in all_ratios[1:]]
                for bw, bh in shapes:
                    out += [(cx - bw / 2) / image_hw[1], (cy - bh / 2) / image_hw[0],
                            (cx + bw / 2) / image_hw[1], (cy + bh / 2) / image_hw[0]]
    corners = np.clip(out, 0, 1) if clip else np.array(out)
    return np.stack([corners, np.tile(variance, len(out) // len(variance))])[None]


def test_ssd_prior_boxes_are_constants_and_the_net_ends_before_detection_output(tmp_path: Path,
                                                                                caplog: pytest.LogCaptureFixture
                                                                                ) -> None:
    """An SSD deploy net stopped at 'Not support layer ... type=PriorBox'. PriorBox is a constant for the fixed
    input size; DetectionOutput (decoding and NMS, a number of boxes) is left out, with a warning naming its
    bottoms, which become the outputs."""
    n = CaffeNet(seed=15)
    x = n.input("data", [1, 3, 12, 16])
    f = n.conv(x, 4, 3, stride=2, pad=1)
    loc, conf = n.conv(f, 4 * 4, 1, top="loc"), n.conv(f, 4 * 3, 1, top="conf")
    priors = {"pa": ([8.0], [16.0], [2.0], [0.1, 0.1, 0.2, 0.2], False),
              "pb": ([4.0, 10.0], [], [3.0], [0.1], True)}
    for top, (mn, mx, ar, var, clip) in priors.items():
        params = " ".join([*(f"min_size: {v}" for v in mn), *(f"max_size: {v}" for v in mx),
                           *(f"aspect_ratio: {v}" for v in ar), *(f"variance: {v}" for v in var),
                           f"clip: {'true' if clip else 'false'}"])
        ref = _caffe_prior_box((6, 8), (12, 16), mn, mx, ar, var, clip)
        n.layer("PriorBox", [f, x], [top], f"prior_box_param {{ {params} }}",
                step=lambda v, top=top, ref=ref: v.__setitem__(top, ref))
    n.layer("Concat", ["pa", "pb"], ["priors"], "concat_param { axis: 2 }",
            step=lambda v: v.__setitem__("priors", np.concatenate([v["pa"], v["pb"]], axis=2)))
    n.layer("DetectionOutput", [loc, conf, "priors"], ["detection_out"], "include { phase: TEST }", name="detection")
    logger = logging.getLogger("hbtools")  # may not propagate once a CLI test has set up logging
    logger.addHandler(caplog.handler)
    try:
        model = check(n, tmp_path, [loc, conf, "priors"])
    finally:
        logger.removeHandler(caplog.handler)
    assert [o.name for o in model.graph.output] == ["loc", "conf", "priors"]
    # the first cell of 'pa': centre (1, 1) in the 12 x 16 image, min_size 8 -> corners (-3, -3, 5, 5) / (16, 12)
    first = run(model, n.sample())[2][0, 0, :4]
    np.testing.assert_allclose(first, [-3 / 16, -3 / 12, 5 / 16, 5 / 12], rtol=1e-6)
    assert "caffe layer 'detection' (DetectionOutput: SSD's box decoding and per-class non-maximum " \
           "suppression) is left out" in caplog.text
    assert "its bottoms 'loc', 'conf', 'priors' are the outputs" in caplog.text

    n.layer("Softmax", ["detection_out"], ["after"], "")
    with pytest.raises(HbError, match="reads 'detection_out', the output of layer 'detection' "
                                      r"\(DetectionOutput\), which the conversion ends before"):
        load_caffe(*n.write(tmp_path / "after"))


def test_outputs_end_with_the_cut_layers_bottoms_in_its_order(tmp_path: Path) -> None:
    """Outputs follow the layers that write them, but the bottoms of the DetectionOutput the network ends
    before come last in its bottom order (loc, conf, prior: what its WARNING lists and host-side decoding
    reads), even where the prior boxes are written first (chuanqi305's MobileNet-SSD writes them per scale)."""
    n = CaffeNet(seed=16)
    x = n.input("data", [1, 3, 12, 16])
    n.conv(x, 2, 1, top="extra")  # read by no layer: an output of its own
    f = n.conv(x, 4, 3, stride=2, pad=1)
    n.layer("PriorBox", [f, x], ["prior"], "prior_box_param { min_size: 8 variance: 0.1 }")
    loc, conf = n.conv(f, 4, 1, top="loc"), n.conv(f, 3, 1, top="conf")
    n.layer("DetectionOutput", [loc, conf, "prior"], ["detection_out"], "", name="detection")
    model = load_caffe(*n.write(tmp_path))
    assert [o.name for o in model.graph.output] == ["extra", "loc", "conf", "prior"]


def test_an_output_blob_an_identity_layer_wrote_keeps_its_caffe_name(tmp_path: Path) -> None:
    """A Dropout (or a Split) top that is a network output while its bottom is not was output under the bottom's
    name ('fc'), so pycaffe-style code reading 'fc_drop' and output_nodes: 'fc_drop' found nothing (hunt 30 D8)."""
    n = CaffeNet(seed=17)
    x = n.input("data", [1, 3, 8, 8])
    f = n.conv(x, 4, 3, top="fc")
    n.layer("Dropout", [f], ["fc_drop"], "dropout_param { dropout_ratio: 0.5 }", name="drop",
            step=lambda v: v.__setitem__("fc_drop", v["fc"]))
    g = n.conv(x, 2, 1, top="g")
    n.layer("Split", [g], ["g_a", "g_b"], "", name="split",
            step=lambda v: (v.__setitem__("g_a", v["g"]), v.__setitem__("g_b", v["g"])))
    n.layer("ReLU", ["g_a"], ["r"], "", name="relu", step=lambda v: v.__setitem__("r", np.maximum(v["g_a"], 0)))
    model = check(n, tmp_path, ["fc_drop", "g_b", "r"])
    assert [o.name for o in model.graph.output] == ["fc_drop", "g_b", "r"]


def test_the_cut_layers_bottoms_are_outputs_even_where_another_layer_reads_one(tmp_path: Path,
                                                                             caplog: pytest.LogCaptureFixture) -> None:
    """A bottom of the left-out DetectionOutput that another layer also reads (a Softmax of the confidences) was
    dropped from the outputs although the WARNING listed it; a bottom that is a network input (prior boxes fed
    from the host) is no output, and the WARNING no longer lists it (hunt 31 D6)."""
    n = CaffeNet(seed=18)
    x = n.input("data", [1, 3, 12, 16])
    priors = n.input("priors", [1, 2, 48])  # fed from the host
    f = n.conv(x, 4, 3, stride=2, pad=1)
    loc, conf = n.conv(f, 4, 1, top="loc"), n.conv(f, 3, 1, top="conf")
    n.layer("Softmax", [conf], ["conf_sm"], "", name="sm")
    n.layer("DetectionOutput", [loc, conf, priors], ["detection_out"], "", name="detection")
    logger = logging.getLogger("hbtools")
    logger.addHandler(caplog.handler)
    try:
        model = load_caffe(*n.write(tmp_path))
    finally:
        logger.removeHandler(caplog.handler)
    assert [o.name for o in model.graph.output] == ["conf_sm", "loc", "conf"]
    assert "its bottoms 'loc', 'conf' are the outputs" in caplog.text, caplog.text
