import numpy as np
import pytest
import skimage.color
import skimage.data
from PIL import Image

from hbtools.data import colour

PURE = np.array(
    [[255, 0, 0], [0, 255, 0], [0, 0, 255], [255, 255, 255], [0, 0, 0]], dtype=np.float64
)


def test_pure_colours_full_range():
    yuv = colour.round_to_uint8(colour.rgb_to_yuv444(PURE))
    # JFIF values: red saturates V at 255 (255.5 before clipping).
    expected = [[76, 85, 255], [150, 44, 21], [29, 255, 107], [255, 128, 128], [0, 128, 128]]
    np.testing.assert_array_equal(yuv, expected)


def test_pure_colours_video_range():
    yuv = colour.round_to_uint8(colour.rgb_to_yuv444(PURE, "bt601_video"))
    expected = [[81, 90, 240], [145, 54, 34], [41, 240, 110], [235, 128, 128], [16, 128, 128]]
    np.testing.assert_array_equal(yuv, expected)


def test_video_range_matches_skimage():
    img = skimage.data.astronaut()[:64, :64]
    ours = colour.rgb_to_yuv444(img, "bt601_video")
    theirs = skimage.color.rgb2ycbcr(img)
    np.testing.assert_allclose(ours, theirs, atol=0.05)


def test_full_range_matches_pillow():
    img = skimage.data.astronaut()[:64, :64]
    ours = colour.round_to_uint8(colour.rgb_to_yuv444(img)).astype(int)
    theirs = np.asarray(Image.fromarray(img).convert("YCbCr")).astype(int)
    # Pillow uses fixed-point coefficients, so allow one step.
    assert np.abs(ours - theirs).max() <= 1


@pytest.mark.parametrize("space", ["regular", "bt601_video"])
def test_yuv_round_trip(space):
    rgb = np.random.default_rng(0).uniform(0, 255, size=(4, 5, 3))
    np.testing.assert_allclose(
        colour.yuv444_to_rgb(colour.rgb_to_yuv444(rgb, space), space), rgb, atol=1e-9
    )
    np.testing.assert_allclose(
        colour.yuv444_to_bgr(colour.bgr_to_yuv444(rgb, space), space), rgb, atol=1e-9
    )


def test_bgr_yuv_consistent_with_rgb_yuv():
    rgb = np.random.default_rng(1).uniform(0, 255, size=(6, 3))
    np.testing.assert_allclose(
        colour.bgr_to_yuv444(colour.rgb_to_bgr(rgb)), colour.rgb_to_yuv444(rgb)
    )


def test_rgb_bgr_swap():
    x = np.arange(12).reshape(2, 2, 3)
    np.testing.assert_array_equal(colour.rgb_to_bgr(x)[..., 0], x[..., 2])
    np.testing.assert_array_equal(colour.bgr_to_rgb(colour.rgb_to_bgr(x)), x)


def test_video_range_bounds():
    grid = np.stack(np.meshgrid(*[np.linspace(0, 255, 18)] * 3), axis=-1).reshape(-1, 3)
    yuv = colour.rgb_to_yuv444(grid, "bt601_video")
    assert yuv[:, 0].min() >= 16 - 1e-9 and yuv[:, 0].max() <= 235 + 1e-9
    assert yuv[:, 1:].min() >= 16 - 1e-9 and yuv[:, 1:].max() <= 240 + 1e-9


@pytest.mark.parametrize("rt", ["nv12", "yuv444", "rgb", "bgr"])
@pytest.mark.parametrize("train", ["rgb", "bgr", "yuv444"])
@pytest.mark.parametrize("space", ["regular", "bt601_video"])
def test_affine_matches_convert(rt, train, space):
    x = np.random.default_rng(2).uniform(0, 255, size=(7, 3))
    m, b = colour.affine_from_intermediate(rt, train, space)
    src = colour.intermediate_space(rt, space)
    np.testing.assert_allclose(x @ m.T + b, colour.convert(x, src, train), atol=1e-9)
    mi, bi = colour.affine_to_intermediate(train, rt, space)
    np.testing.assert_allclose(mi @ m, np.eye(3), atol=1e-12)
    np.testing.assert_allclose(mi @ b + bi, 0, atol=1e-9)


def test_space_and_range_only_affects_yuv():
    assert colour.intermediate_space("nv12", "bt601_video") == "yuv444_video"
    assert colour.intermediate_space("rgb", "bt601_video") == "rgb"
    m, b = colour.affine_from_intermediate("bgr", "rgb")
    np.testing.assert_array_equal(m, np.eye(3)[::-1])
    np.testing.assert_array_equal(b, 0)


def test_gray():
    np.testing.assert_allclose(colour.rgb_to_gray(PURE)[:, 0], [76.245, 149.685, 29.07, 255, 0])
    m, b = colour.affine_from_intermediate("gray", "gray")
    assert m.shape == (1, 1) and m[0, 0] == 1 and b[0] == 0
    with pytest.raises(ValueError):
        colour.convert(PURE, "rgb", "gray")


def test_round_to_uint8_saturates():
    out = colour.round_to_uint8(np.array([-3.0, 0.4, 2.5, 254.6, 300.0]))
    assert out.dtype == np.uint8
    np.testing.assert_array_equal(out, [0, 0, 2, 255, 255])


def test_nv12_layout():
    yuv = np.zeros((2, 4, 3))
    yuv[..., 0] = np.arange(8).reshape(2, 4)
    yuv[:, :2, 1], yuv[:, :2, 2] = 10, 20
    yuv[:, 2:, 1] = [[30, 31], [32, 33]]  # block mean 31.5 -> 32 (half to even)
    yuv[:, 2:, 2] = 40
    nv12 = colour.nv12_encode(yuv)
    assert nv12.shape == (3, 4) and nv12.dtype == np.uint8
    np.testing.assert_array_equal(nv12[:2], yuv[..., 0])
    np.testing.assert_array_equal(nv12[2], [10, 20, 32, 40])
    back = colour.nv12_decode(nv12)
    np.testing.assert_array_equal(back[..., 1], [[10, 10, 32, 32]] * 2)
    np.testing.assert_array_equal(back[..., 2], [[20, 20, 40, 40]] * 2)


def test_nv12_exact_for_blockwise_constant_chroma():
    rng = np.random.default_rng(3)
    yuv = rng.integers(0, 256, size=(2, 6, 8, 3)).astype(np.uint8)
    yuv[..., 1:] = yuv[:, ::2, ::2, 1:].repeat(2, axis=1).repeat(2, axis=2)
    np.testing.assert_array_equal(colour.nv12_decode(colour.nv12_encode(yuv)), yuv)


def test_nv12_round_trip_error_bound_on_photo():
    rgb = skimage.data.astronaut()[:128, :128].astype(np.float64)
    yuv = colour.rgb_to_yuv444(rgb)
    back = colour.nv12_decode(colour.rgb_to_nv12(rgb)).astype(np.float64)
    assert np.abs(back[..., 0] - yuv[..., 0]).max() <= 0.5 + 1e-9
    chroma_err = np.abs(back[..., 1:] - np.clip(yuv[..., 1:], 0, 255))
    assert chroma_err.mean() < 2.0
    rgb_back = colour.nv12_to_rgb(colour.rgb_to_nv12(rgb))
    assert np.abs(rgb_back - rgb).mean() < 4.0


def test_nv12_rejects_odd_sizes():
    with pytest.raises(ValueError, match="even"):
        colour.nv12_encode(np.zeros((3, 4, 3)))
    with pytest.raises(ValueError):
        colour.nv12_decode(np.zeros((4, 4), np.uint8))
