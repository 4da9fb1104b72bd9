import itertools

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from hbtools.config.model import ALLOWED_RT_FOR_TRAIN, InputSpec
from hbtools.data import colour
from hbtools.data.intermediate import to_intermediate
from hbtools.errors import HbError
from hbtools.ops import registry
from hbtools.ops.base import DOMAIN, LoweringContext
from hbtools.ops.preprocess import HzPreprocess, affine, make_preprocess_node

PAIRS = [(t, rt) for t, rts in ALLOWED_RT_FOR_TRAIN.items() if t != "featuremap" for rt in rts]
NORMS = {
    "no_preprocess": (None, None),
    "data_mean": ([123.675, 116.28, 103.53], None),
    "data_scale": (None, [0.0078125]),
    "data_mean_and_scale": ([128.0], [0.017125, 0.017507, 0.017429]),
}


def make_spec(
    train, rt, layout="NCHW", space="regular", norm="no_preprocess", mean=None, scale=None
):
    c = 1 if train == "gray" else 3
    if c == 1:  # the per-channel variants below are written for 3 channels
        mean, scale = mean and mean[:1], scale and scale[:1]
    shape = [2, c, 4, 6] if layout == "NCHW" else [2, 4, 6, c]
    return InputSpec(
        name="data", shape=shape, type_train=train, layout_train=layout, type_rt=rt,
        layout_rt=None, space_and_range=space, norm_type=norm, mean=mean, scale=scale,
    )  # fmt: skip


def node_for(spec):
    c = 1 if spec.type_train == "gray" else 3
    return make_preprocess_node(spec, "data", "data_pre", "data_HzPreprocess", c)


def run_lowered(node, x, opset):
    ctx = LoweringContext(opset, {"data", "data_pre", node.name})
    nodes = HzPreprocess.lower(node, ctx)
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("data", TensorProto.INT8, list(x.shape))],
        [helper.make_tensor_value_info("data_pre", TensorProto.FLOAT, list(x.shape))],
        initializer=ctx.initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
    onnx.checker.check_model(model, full_check=True)
    assert {n.op_type for n in nodes} <= {"Cast", "Conv", "MatMul", "Mul", "Add"}
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"data": x})[0]


def random_q(shape, seed=0):
    return np.random.default_rng(seed).integers(-128, 128, size=shape, dtype=np.int8)


CASES = [
    (train, rt, layout, space, norm)
    for (train, rt), layout, norm in itertools.product(PAIRS, ["NCHW", "NHWC"], NORMS)
    for space in (["regular", "bt601_video"] if rt in ("nv12", "yuv444") else ["regular"])
]


@pytest.mark.parametrize("train,rt,layout,space,norm", CASES)
def test_lowered_equals_reference(train, rt, layout, space, norm):
    mean, scale = NORMS[norm]
    spec = make_spec(train, rt, layout, space, norm, mean, scale)
    node = node_for(spec)
    x = random_q(spec.shape)
    opset = 11 + CASES.index((train, rt, layout, space, norm)) % 11  # spread over 11..21
    got = run_lowered(node, x, opset)
    (ref,) = HzPreprocess.reference(node, [x])
    assert got.dtype == np.float32 and ref.dtype == np.float32 and got.shape == x.shape
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-4)
    # affine() is what the quantizer turns into an integer conv: check it against reference too.
    m, b = affine(node)
    q = np.moveaxis(x, 1, -1) if layout == "NCHW" else x
    out = q.astype(np.float64) @ m.T + b
    out = np.moveaxis(out, -1, 1) if layout == "NCHW" else out
    np.testing.assert_allclose(out, ref, rtol=0, atol=1e-4)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("integer", [0, 1])
def test_without_colour_conversion_a_scale_and_shift_per_channel(layout, integer):
    """The same colour space at training and run time: no convolution over the channels (onnxruntime
    ran a 1x1 conv over three channels about six times slower than two element-wise products), and
    every pixel value gives the reference's output (the integer form bit for bit)."""
    spec = make_spec("bgr", "bgr", layout, norm="data_mean_and_scale", mean=[123.675, 116.28, 103.53],
                     scale=[0.01712, 0.01751, 0.01743])
    node = node_for(spec)
    node.attribute.append(helper.make_attribute("integer", integer))
    levels = np.arange(-128, 128, dtype=np.int8).reshape(16, 16)  # every intermediate value
    x = np.stack([np.roll(levels, k) for k in range(3)])[None]
    x = x if layout == "NCHW" else np.ascontiguousarray(np.moveaxis(x, 1, -1))
    ctx = LoweringContext(13, {"data", "data_pre", node.name})
    assert not {n.op_type for n in HzPreprocess.lower(node, ctx)} & {"Conv", "MatMul"}
    got = run_lowered(node, x, 13)
    (ref,) = HzPreprocess.reference(node, [x])
    if integer:
        np.testing.assert_array_equal(got, ref)
    else:
        np.testing.assert_allclose(got, ref, rtol=0, atol=1e-4)


@pytest.mark.parametrize("opset", range(11, 22))
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_every_opset(opset, layout):
    spec = make_spec("bgr", "nv12", layout, "bt601_video", "data_mean_and_scale", [100.0], [0.02])
    node = node_for(spec)
    x = random_q(spec.shape, seed=opset)
    np.testing.assert_allclose(
        run_lowered(node, x, opset), HzPreprocess.reference(node, [x])[0], atol=1e-4
    )


def test_seed_formula_weight_and_bias():
    # Same colour space: weight = scale, bias = (128 - mean) * scale.
    spec = make_spec(
        "rgb", "rgb", norm="data_mean_and_scale", mean=[10.0, 20.0, 30.0], scale=[0.5, 0.25, 2.0]
    )
    m, b = affine(node_for(spec))
    np.testing.assert_allclose(m, np.diag([0.5, 0.25, 2.0]))
    np.testing.assert_allclose(b, [59.0, 27.0, 196.0])


def test_norm_type_ignores_unused_values():
    spec = make_spec("rgb", "bgr", norm="data_scale", mean=[50.0], scale=[2.0])
    m, b = affine(node_for(spec))
    np.testing.assert_allclose(m, 2.0 * np.eye(3)[::-1])
    np.testing.assert_allclose(b, [256.0] * 3)


def test_pure_red_through_nv12_intermediate():
    spec = make_spec("rgb", "nv12", "NHWC")
    red_yuv = np.array([76, 85, 255], dtype=np.float64)  # full range, from colour tests
    x = np.broadcast_to(red_yuv - 128, spec.shape).astype(np.int8)
    (out,) = HzPreprocess.reference(node_for(spec), [x])
    np.testing.assert_allclose(out[0, 0, 0], [255.0, 0.0, 0.0], atol=1.0)


@pytest.mark.parametrize("train,rt", [p for p in PAIRS])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_intermediate_then_preprocess_recovers_train_data(train, rt, layout):
    spec = make_spec(train, rt, layout)
    rng = np.random.default_rng(4)
    data = rng.integers(20, 236, size=spec.shape).astype(np.uint8)
    if rt == "nv12":  # nv12 loses chroma detail; keep each 2x2 block one colour
        hw = (2, 3) if layout == "NCHW" else (1, 2)
        data = data.take(range(0, 4, 2), hw[0]).take(range(0, 6, 2), hw[1])
        data = data.repeat(2, axis=hw[0]).repeat(2, axis=hw[1])
    q = to_intermediate(data, spec)
    assert q.dtype == np.int8 and q.shape == tuple(spec.shape)
    (back,) = HzPreprocess.reference(node_for(spec), [q])
    tol = 0 if rt in (train, "rgb", "bgr", "gray") else 1.5  # rounding in yuv costs ~1 step
    np.testing.assert_allclose(back, data, atol=tol + 1e-4)


def test_registered():
    assert registry.get("HzPreprocess") is HzPreprocess
    node = node_for(make_spec("gray", "gray"))
    assert node.domain == DOMAIN and node.op_type == "HzPreprocess"


def test_attributes_per_channel():
    spec = make_spec("bgr", "yuv444", norm="data_mean", mean=[100.0])
    attrs = {a.name: helper.get_attribute_value(a) for a in node_for(spec).attribute}
    assert list(attrs["mean"]) == [100.0] * 3 and list(attrs["scale"]) == [1.0] * 3
    assert attrs["layout"] == b"NCHW" and attrs["input_type_rt"] == b"yuv444"


@pytest.mark.parametrize(
    "kwargs,channels,match",
    [
        ({"train": "rgb", "rt": "gray"}, 3, "cannot feed"),
        ({"train": "rgb", "rt": "rgb"}, 1, "3 channels"),
        (
            {"train": "rgb", "rt": "rgb", "norm": "data_mean", "mean": [1.0, 2.0]},
            3,
            "mean_value has 2",
        ),
        ({"train": "rgb", "rt": "rgb", "norm": "data_scale"}, 3, "needs scale_value"),
    ],
)
def test_config_errors(kwargs, channels, match):
    spec = make_spec(**kwargs)
    with pytest.raises(HbError, match=match):
        make_preprocess_node(spec, "data", "out", "n", channels)


def test_reference_independent_of_affine_numbers():
    # reference goes through colour.convert step by step; affine composes matrices.
    spec = make_spec("yuv444", "nv12", "NHWC", "bt601_video")
    x = random_q(spec.shape)
    (ref,) = HzPreprocess.reference(node_for(spec), [x])
    expected = colour.rgb_to_yuv444(colour.yuv444_to_rgb(x + 128.0, "bt601_video"))
    np.testing.assert_allclose(ref, expected, atol=1e-4)


@pytest.mark.parametrize(("train", "rt"), PAIRS)
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_whole_pixels_take_the_same_values_as_float_ones(train: str, rt: str, layout: str) -> None:
    """uint8 samples (the usual calibration file) reordered without the float conversion: the values of the same
    pixels given as float64, which take the general conversion."""
    spec = make_spec(train, rt, layout=layout)
    data = np.random.default_rng(3).integers(0, 256, spec.shape).astype(np.uint8)
    if rt == "nv12":  # chroma shared by 2x2 blocks
        hw = (2, 3) if layout == "NCHW" else (1, 2)
        data = data.take(range(0, spec.shape[hw[0]], 2), hw[0]).take(range(0, spec.shape[hw[1]], 2), hw[1])
        data = data.repeat(2, axis=hw[0]).repeat(2, axis=hw[1])
    got, want = to_intermediate(data, spec), to_intermediate(data.astype(np.float64), spec)
    assert got.dtype == want.dtype == np.int8 and got.flags.c_contiguous
    np.testing.assert_array_equal(got, want)
