"""hbtools.data.transforms: shapes and values against plain numpy, round trips, dtypes."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.ndimage
import skimage.data
import skimage.io
import skimage.transform
import skimage.util

from hbtools.data import colour
from hbtools.data import transforms as T
from hbtools.data.transforms.geometry import opencv_resize, resize
from hbtools.errors import HbError
from horizon_tc_ui.data import transformer

RNG = np.random.default_rng(7)


def rgb_uint8(h: int = 6, w: int = 8) -> np.ndarray:
    return RNG.integers(0, 256, size=(h, w, 3)).astype(np.uint8)


def test_vendor_import_path_is_the_same_code():
    from horizon_tc_ui.data import transformer

    assert transformer.ShortSideResizeTransformer is T.ShortSideResizeTransformer
    assert transformer.RGB2NV12Transformer is T.RGB2NV12Transformer
    assert set(T.__all__) <= set(dir(transformer))


# --------------------------------------------------------------------------- geometry


@pytest.mark.parametrize(
    ("hw", "expected"),
    [((300, 450), (256, 384)), ((450, 300), (384, 256)), ((200, 333), (256, 426)), ((9, 9), (256, 256))],
)
def test_short_side_resize_keeps_aspect_ratio(hw, expected):
    out = T.ShortSideResizeTransformer(short_size=256)(np.zeros((*hw, 3), np.uint8))
    assert out.shape == (*expected, 3) and out.dtype == np.float32  # the vendor's data_type='float'


def test_bilinear_upscale_of_a_ramp_is_the_ramp_at_the_pixel_centres():
    ramp = np.tile(np.arange(8, dtype=np.float64), (4, 1))
    out = resize(ramp, 4, 16, "bilinear")  # hbtools' skimage resampling, edges repeated
    # Output pixel i samples input position (i + 0.5) * 8 / 16 - 0.5, clamped at the edges.
    expected = np.clip((np.arange(16) + 0.5) * 8 / 16 - 0.5, 0, 7)
    np.testing.assert_allclose(out, np.tile(expected, (4, 1)), atol=1e-12)
    assert out.dtype == np.float64


def test_nearest_upscale_repeats_pixels_and_interpolation_matters():
    img = rgb_uint8(3, 4)
    nearest = T.Resize(img, (6, 8), interpolation="nearest")
    np.testing.assert_array_equal(nearest, img.repeat(2, axis=0).repeat(2, axis=1))
    assert not np.array_equal(T.Resize(img, (6, 8), interpolation="bicubic"), nearest)


def test_resize_gives_float32_by_default_and_data_type_none_keeps_the_type():
    img = rgb_uint8(10, 12)
    assert T.Resize(img, 5).dtype == np.float32  # the vendor's data_type='float'
    assert T.Resize(img, 5, data_type=None).dtype == np.uint8
    np.testing.assert_array_equal(T.Resize(img, 5, data_type=None), colour.round_to_uint8(T.Resize(img, 5)))
    as_float = skimage.util.img_as_float(img)
    out = T.Resize(as_float, 5, data_type=None)
    assert out.dtype == np.float64 and 0 <= out.min() and out.max() <= 1
    np.testing.assert_allclose(out * 255, T.Resize(img, 5), atol=1e-4)
    assert resize(img, 5, 5).dtype == np.uint8  # the plain function keeps the type


def test_bad_parameters_fail_when_the_transformer_is_made():
    with pytest.raises(ValueError, match="interpolation"):
        T.ResizeTransformer(8, interpolation="lanczos9")
    with pytest.raises(ValueError, match="target_size"):
        T.ResizeTransformer((0, 8))
    with pytest.raises(ValueError, match="pad_position"):
        T.PadResizeTransformer(8, pad_position="middle")


def test_center_crop_is_the_central_slice():
    img = np.arange(7 * 10 * 3).reshape(7, 10, 3)
    np.testing.assert_array_equal(T.CenterCrop(img, crop_size=(4, 6)), img[1:5, 2:8])
    # The vendor's corner W // 2 - 7 // 2 = 2 (not (W - 7) // 2 = 1: the parities differ).
    np.testing.assert_array_equal(T.CenterCrop(img, crop_size=7), img[:, 2:9])
    assert T.CenterCrop(img, crop_size=7).dtype == np.float32
    assert T.CenterCrop(img.astype(np.uint8), crop_size=7, data_type="uint8").dtype == np.uint8
    with pytest.raises(ValueError, match="larger than the image"):
        T.CenterCrop(img, crop_size=8)


def test_seed_calibration_pipeline_matches_step_by_step_numpy():
    # ShortSideResize 256 -> CenterCrop 224 -> HWC2CHW -> RGB2BGR -> Scale 255 (seed 004).
    img = skimage.util.img_as_float(skimage.data.chelsea())  # 300x451
    pipeline = T.Compose([
        T.ShortSideResizeTransformer(short_size=256), T.CenterCropTransformer(crop_size=224),
        T.HWC2CHWTransformer(), T.RGB2BGRTransformer(data_format="CHW"),
        T.ScaleTransformer(scale_value=255),
    ])  # fmt: skip
    out = pipeline(img)
    resized = opencv_resize(img, 256, 384)  # cv2.resize's bilinear, as the vendor's ShortSideResize
    top, left = 256 // 2 - 224 // 2, 384 // 2 - 224 // 2
    expected = resized[top : top + 224, left : left + 224].transpose(2, 0, 1)[::-1] * 255
    assert out.shape == (3, 224, 224)
    np.testing.assert_allclose(out, expected, atol=1e-9)


@pytest.mark.parametrize("position", ["boundary", "bottom_right"])
def test_pad_resize_letterboxes(position):
    img = rgb_uint8(100, 200)
    t = T.PadResizeTransformer(64, pad_value=7, pad_position=position)
    out = t(img)
    p = t.placement(100, 200)
    assert (p.scale, p.height, p.width) == (0.32, 32, 64)
    assert (p.top, p.left) == ((16, 0) if position == "boundary" else (0, 0))
    assert out.shape == (64, 64, 3) and out.dtype == np.float32  # always float32, as the vendor's
    inside = np.zeros((64, 64), bool)
    inside[p.top : p.top + 32, :] = True
    # cv2.resize's bilinear resampling (the vendor's), not skimage's
    np.testing.assert_array_equal(out[inside].reshape(32, 64, 3), opencv_resize(img, 32, 64))
    assert (out[~inside] == 7).all()


@pytest.mark.parametrize(("w", "resized_w"), [(50, 120), (100, 192), (400, 192)])
def test_text_line_resize_scales_to_the_height_and_pads_right(w, resized_w):
    img = rgb_uint8(20, w)
    out = T.TextLineResize(img, (48, 192))
    assert resized_w == min(192, math.ceil(48 * w / 20))
    np.testing.assert_array_equal(out[:, :resized_w], resize(img, 48, resized_w))
    assert (out[:, resized_w:] == 128).all()


# --------------------------------------------------------------------------- layout and colour


def test_hwc_chw_round_trips():
    img = rgb_uint8(4, 5)
    chw = T.HWC2CHW(img)
    np.testing.assert_array_equal(chw, np.transpose(img, (2, 0, 1)))
    np.testing.assert_array_equal(T.CHW2HWC(chw), img)
    batch = np.stack([img, img])
    np.testing.assert_array_equal(T.HWC2CHW(batch), batch.transpose(0, 3, 1, 2))
    np.testing.assert_array_equal(T.Transpose(img, (1, 0, 2)), img.transpose(1, 0, 2))


def test_rgb_bgr_swap_in_either_layout():
    img = rgb_uint8(4, 5)
    np.testing.assert_array_equal(T.RGB2BGR(img), img[..., ::-1])
    chw = img.transpose(2, 0, 1)
    np.testing.assert_array_equal(T.RGB2BGR(chw), chw[::-1])  # layout told from the shape
    np.testing.assert_array_equal(T.BGR2RGB(T.RGB2BGR(img, data_format="HWC"), data_format="HWC"), img)
    with pytest.raises(ValueError, match="data_format"):
        T.RGB2BGR(np.zeros((3, 4, 3)))  # both ends could be channels
    with pytest.raises(ValueError, match="3 channels"):
        T.RGB2BGR(np.zeros((4, 5, 1)), data_format="HWC")


def _vendor_yuv_planes(rgb: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Y, U, V of channel-last RGB by the vendor's formula (horizon_tc_ui rgb2bt601_full_range), float64."""
    r, g, b = (rgb[..., i].astype(np.float64) for i in range(3))
    return (0.299 * r + 0.587 * g + 0.114 * b, -0.169 * r - 0.331 * g + 0.5 * b + 128,
            0.5 * r - 0.419 * g - 0.081 * b + 128)


def test_rgb2nv12_is_the_vendors_truncated_calc_with_top_left_chroma():
    """cvt_mode 'rgb_calc' (the default) as the vendor's rgb2nv12_calc: Y, U, V truncated (astype uint8), each
    chroma sample from the top-left pixel of its 2x2 block (hbtools rounded and averaged the block)."""
    img = rgb_uint8(4, 6)
    nv12 = T.RGB2NV12Transformer()(img.astype(np.float64))
    assert nv12.shape == (6, 6) and nv12.dtype == np.uint8
    y, u, v = _vendor_yuv_planes(img)
    np.testing.assert_array_equal(nv12[:4], np.floor(y))
    uv = nv12[4:].reshape(2, 3, 2)
    np.testing.assert_array_equal(uv[..., 0], np.floor(u[::2, ::2]))
    np.testing.assert_array_equal(uv[..., 1], np.floor(v[::2, ::2]))
    np.testing.assert_array_equal(T.RGB2NV12Transformer()(img), nv12)  # uint8 in: the same numbers
    # By hand: R, G, B = 10, 200, 30 -> Y 123.81 -> 123 (rounded: 124), U 75.11 -> 75, V 46.77 -> 46 (rounded:
    # 47); the block's other, black pixels (Y 0, U and V 128) do not enter U and V (the block mean would).
    block = np.zeros((2, 2, 3), np.uint8)
    block[0, 0] = 10, 200, 30
    np.testing.assert_array_equal(T.RGB2NV12(block), [[123, 0], [0, 0], [75, 46]])


def test_bgr2nv12_and_chw_input_agree_with_rgb2nv12():
    img = rgb_uint8(4, 6)
    want = T.RGB2NV12(img)
    np.testing.assert_array_equal(T.BGR2NV12(img[..., ::-1]), want)
    np.testing.assert_array_equal(T.RGB2NV12(img.transpose(2, 0, 1), data_format="CHW"), want)
    video = T.RGB2NV12(img, space_and_range="bt601_video")
    assert 16 <= video[:4].min() and video[:4].max() <= 235
    with pytest.raises(ValueError, match="even width"):  # an odd height is the vendor's (below)
        T.RGB2NV12(rgb_uint8(6, 5))


def test_nv12_to_yuv444_repeats_chroma_over_2x2_blocks():
    # A picture constant on each 2x2 block survives NV12 -> YUV444 up to rounding.
    img = rgb_uint8(2, 3).repeat(2, axis=0).repeat(2, axis=1)
    nv12 = T.RGB2NV12(img)
    yuv = T.NV12ToYUV444(nv12)
    assert yuv.shape == (4, 6, 3) and yuv.dtype == np.uint8
    np.testing.assert_array_equal(yuv, np.floor(np.stack(_vendor_yuv_planes(img), axis=-1)))
    flat = T.NV12ToYUV444Transformer(target_size=(4, 6), yuv444_output_layout="CHW")(nv12.ravel())
    np.testing.assert_array_equal(flat, yuv.transpose(2, 0, 1))
    with pytest.raises(ValueError, match="bytes"):
        T.NV12ToYUV444(nv12.ravel()[:-1], target_size=(4, 6))


@pytest.mark.parametrize("layout", ["", "HWC", "hwc", "NHWC"])
def test_nv12_to_yuv444_takes_any_layout_but_chw_as_hwc(layout):
    """OE cls_inference.py passes yuv444_output_layout="" (its -y option's default); the vendor gives HWC
    for anything but "CHW" (hunt 40 D3: hbtools raised)."""
    nv12 = T.RGB2NV12(rgb_uint8(4, 6))
    out = T.NV12ToYUV444Transformer((4, 6), yuv444_output_layout=layout)(nv12.ravel())
    np.testing.assert_array_equal(out, T.NV12ToYUV444(nv12))
    assert T.NV12ToYUV444Transformer((4, 6), yuv444_output_layout="chw")(nv12).shape == (3, 4, 6)


def test_yuv444_and_gray_are_the_vendors_formula_unrounded_in_float32():
    """The vendor's RGB2YUV444Transformer: ``image + 0.``, rgb2bt601_full_range's three-decimal coefficients,
    float32 out (hbtools returned uint8, rounded, from the exact BT.601 matrix)."""
    img = rgb_uint8(4, 6)
    y, u, v = _vendor_yuv_planes(img)
    yuv = T.RGB2YUV444(img, "HWC")
    assert yuv.dtype == np.float32
    np.testing.assert_array_equal(yuv, np.stack([y, u, v], axis=-1).astype(np.float32))
    np.testing.assert_array_equal(T.RGB2YUV444(img.transpose(2, 0, 1), "CHW"), yuv.transpose(2, 0, 1))
    np.testing.assert_array_equal(T.BGR2YUV444(img[..., ::-1]), yuv)
    # R, G, B = 200, 100, 50 -> U = -33.8 - 33.1 + 25 + 128 = 86.1 (the exact BT.601 matrix: 86.13)
    np.testing.assert_allclose(T.RGB2YUV444(np.array([[[200, 100, 50]]], np.uint8), "HWC")[0, 0],
                               [124.2, 86.1, 182.05], rtol=0, atol=1e-5)
    gray = T.RGB2GRAY(img)
    assert gray.shape == (4, 6, 1) and gray.dtype == np.float32
    np.testing.assert_array_equal(gray[..., 0], y.astype(np.float32))
    np.testing.assert_array_equal(T.BGR2GRAY(img[..., ::-1]), gray)
    # hbtools.data.colour, which converts model inputs, is unchanged: exact BT.601
    np.testing.assert_allclose(colour.rgb_to_yuv444(np.array([[200.0, 100, 50]]))[0, 1], 128 + (50 - 124.2) / 1.772)


# --------------------------------------------------------------------------- values


def test_scale_mean_normalize_per_channel():
    img = rgb_uint8(2, 4)
    np.testing.assert_allclose(T.Scale(img, 0.5), img / 2)
    means, std = [10.0, 20.0, 30.0], [1.0, 2.0, 4.0]
    np.testing.assert_allclose(T.Mean(img, means), img - np.array(means))
    chw = img.transpose(2, 0, 1)
    np.testing.assert_allclose(T.Mean(chw, means), chw - np.array(means)[:, None, None])
    np.testing.assert_allclose(T.Normalize(chw, std), chw / np.array(std)[:, None, None])
    np.testing.assert_allclose(T.Mean(img, 5), img - 5.0)
    with pytest.raises(ValueError, match="3 channels"):
        T.Mean(img, [1.0, 2.0])
    # the vendor's classification script: ScaleTransformer(scale_value=np.array([0.007843] * 3)) after HWC2CHW
    scales = np.array([0.5, 1.0, 2.0])
    np.testing.assert_allclose(T.ScaleTransformer(scale_value=scales)(chw), chw * scales[:, None, None])
    np.testing.assert_allclose(T.ScaleTransformer(scales, data_format="HWC")(img), img * scales)


# cv2.cvtColor(BGR_2x4, COLOR_BGR2YUV_I420) (OpenCV 4.10 and 5.0 alike), its U and V planes interleaved as NV12.
OPENCV_BGR_2X4 = [[[0, 0, 255], [0, 255, 0], [255, 0, 0], [255, 255, 255]],
                  [[10, 20, 30], [200, 100, 50], [0, 0, 0], [128, 128, 128]]]
OPENCV_NV12_2X4 = [[82, 145, 41, 235], [35, 99, 16, 126], [90, 240, 240, 110]]


# The vendor's CenterNet preprocessing (get_affine_transform, then cv2.warpAffine with INTER_LINEAR) on
# OpenCV 4.10 (its fixed-point warp; 4.11 on computes the coordinates in float), for a 4x6 ramp.
WARP_IN = (np.arange(24).reshape(4, 6) * 10).astype(np.uint8)
WARP_OPENCV_5X7 = [[0, 7, 15, 22, 29, 36, 36], [43, 52, 60, 69, 78, 86, 79], [94, 102, 111, 119, 128, 137, 121],
                   [146, 155, 163, 172, 181, 189, 166], [129, 135, 142, 148, 154, 160, 139]]
WARP_OPENCV_FLOAT_ROW2 = [0.0, 7.6842, 10.1339, 11.3393, 12.5893, 13.7946, 15.0446]  # of the ramp / 7, scale 0.75


def test_warp_affine_is_the_vendors_opencv_warp() -> None:
    """The vendor's eval preprocessing imports WarpAffineTransformer (CenterNet): the import failed, and the
    module with it. Values as OpenCV 4.10 gives them, zero outside the picture, float32 out."""
    got = transformer.WarpAffineTransformer((5, 7), 1.0)(WARP_IN)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, np.array(WARP_OPENCV_5X7, np.float32))
    scaled = T.WarpAffineTransformer((5, 7), 0.75)(WARP_IN.astype(np.float32) / 7)
    np.testing.assert_allclose(scaled[2], WARP_OPENCV_FLOAT_ROW2, atol=1e-4)
    colour3 = T.WarpAffineTransformer((5, 7), 1.0)(np.repeat(WARP_IN[..., None], 3, axis=2))
    np.testing.assert_array_equal(colour3, np.repeat(got[..., None], 3, axis=2))


def test_yuv_transformer_is_the_vendors_opencv_i420_repeated_in_float32() -> None:
    """hunt 43 D11: the vendor's YUVTransformer converts by cv2.cvtColor(..., COLOR_BGR2YUV_I420), repeats each
    chroma sample over its 2x2 block and returns float32; hbtools' gave exact full-range BT.601 in the input's type."""
    bgr = np.array(OPENCV_BGR_2X4, np.uint8)
    y, uv = np.array(OPENCV_NV12_2X4[:2]), np.array(OPENCV_NV12_2X4[2]).reshape(2, 2)
    want = np.stack([y, np.repeat(uv[:, 0], 2)[None].repeat(2, 0), np.repeat(uv[:, 1], 2)[None].repeat(2, 0)], axis=-1)
    got = transformer.YUVTransformer(color_sequence="BGR")([bgr])[0]
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(T.YUVTransformer("RGB")(bgr[..., ::-1].astype(np.float64)), want)
    np.testing.assert_array_equal(T.YUVTransformer("BGR", data_format="CHW")(bgr.transpose(2, 0, 1)),
                                  want.transpose(2, 0, 1))


def test_nv12_cvt_mode_opencv_is_opencvs_conversion() -> None:
    """The vendor's eval preprocessing builds BGR2NV12Transformer(data_format="HWC", cvt_mode="opencv"): the
    keyword stopped the whole module at import. Its values are OpenCV's I420 conversion: video range, in
    fixed point, chroma from each 2x2 block's top-left pixel."""
    bgr = np.array(OPENCV_BGR_2X4, np.uint8)
    got = transformer.BGR2NV12Transformer(data_format="HWC", cvt_mode="opencv")(bgr)
    np.testing.assert_array_equal(got, np.array(OPENCV_NV12_2X4, np.uint8))
    rgb_chw = np.ascontiguousarray(bgr[..., ::-1].transpose(2, 0, 1)).astype(np.float32)
    np.testing.assert_array_equal(T.RGB2NV12Transformer(data_format="CHW", cvt_mode="opencv")(rgb_chw), got)
    np.testing.assert_array_equal(T.RGB2NV12Transformer(cvt_mode="rgb_calc")(bgr[..., ::-1]),
                                  T.RGB2NV12Transformer()(bgr[..., ::-1]))
    with pytest.raises(ValueError, match="cvt_mode 'cv2' is not one of"):
        T.BGR2NV12Transformer(cvt_mode="cv2")


def test_float_to_integer_is_the_vendors_astype_and_rounds_when_asked():
    """hunt 43 D2: the vendor's F32ToU8 / F32ToS8 are ``astype(np.uint8)`` / ``astype(np.int8)``; hbtools rounded,
    and F32ToS8 clipped to 0..255 before subtracting 128, so data already on the signed scale lost every
    value under 0.5."""
    x = np.array([127.9999, -3.0, 300.0, 0.5, 1.5, -0.7, 200.2, -129.5])
    np.testing.assert_array_equal(T.F32ToU8(x), [127, 253, 44, 0, 1, 0, 200, 127])  # truncated, wrapped
    np.testing.assert_array_equal(T.F32ToS8(x), [127, -3, 44, 0, 1, 0, -56, 127])
    assert T.F32ToS8(x).dtype == np.int8 and T.F32ToU8(x).dtype == np.uint8
    np.testing.assert_array_equal(T.F32ToU8(x, rounding=True), [128, 0, 255, 0, 2, 0, 200, 0])
    np.testing.assert_array_equal(T.F32ToS8(x, rounding=True), [127, -3, 127, 0, 2, -1, 127, -128])
    # the seed's recipe written with the vendor's transformers: image - 128, then int8
    picture = skimage.data.astronaut().astype(np.float32)
    signed = transformer.F32ToS8Transformer()([transformer.AddTransformer(-128)([picture])[0]])[0]
    np.testing.assert_array_equal(signed, (picture.astype(np.int16) - 128).astype(np.int8))


def test_function_forms_equal_the_classes():
    img = skimage.util.img_as_float(skimage.data.astronaut()[::4, ::4])
    np.testing.assert_array_equal(
        T.ShortSideResize(img, short_size=64), T.ShortSideResizeTransformer(short_size=64)(img)
    )
    assert T.ShortSideResize.__name__ == "ShortSideResize"
    assert "ShortSideResizeTransformer" in T.ShortSideResize.__doc__


# --------------------------------------------------------------------------- reading


def test_read_image_skimage_mode(tmp_path):
    img = rgb_uint8(5, 7)
    skimage.io.imsave(tmp_path / "c.png", img)
    skimage.io.imsave(tmp_path / "g.png", img[..., 0])
    got = T.read_image(tmp_path / "c.png")
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, img / 255)
    gray = T.read_image(tmp_path / "g.png", read_mode="skimage")
    np.testing.assert_allclose(gray, np.repeat(img[..., :1], 3, axis=-1) / 255)
    with pytest.raises(HbError, match="read_mode"):
        T.read_image(tmp_path / "c.png", read_mode="pil")
    with pytest.raises(HbError, match="cannot read image"):
        T.read_image(tmp_path / "missing.png")


def test_read_image_opencv_mode(tmp_path):
    img = rgb_uint8(5, 7)
    skimage.io.imsave(tmp_path / "c.png", img)
    if not T.opencv_available():
        with pytest.raises(HbError, match="needs OpenCV") as info:
            T.read_image(tmp_path / "c.png", read_mode="opencv")
        assert "opencv-python-headless" in info.value.hint
        return
    got = T.read_image(tmp_path / "c.png", read_mode="opencv")
    assert got.dtype == np.uint8
    np.testing.assert_array_equal(got, img[..., ::-1])


def test_opencv_like_brings_a_skimage_read_to_what_opencv_reads(tmp_path):
    img = rgb_uint8(5, 7)
    skimage.io.imsave(tmp_path / "c.png", img)
    got = T.Compose(T.opencv_like("skimage"))(T.read_image(tmp_path / "c.png"))
    assert got.dtype == np.uint8
    np.testing.assert_array_equal(got, img[..., ::-1])  # uint8 BGR, as cv2.imread
    assert T.opencv_like("opencv") == []  # already uint8 BGR
    with pytest.raises(HbError, match="read_mode"):
        T.opencv_like("pil")


def _opencv_reference(image: np.ndarray, height: int, width: int, nearest: bool) -> np.ndarray:
    """cv2.resize's INTER_LINEAR / INTER_NEAREST pixel by pixel: output pixel d of an axis of n -> m samples
    (d + 0.5) * n / m - 0.5, its floor clamped to [0, n - 1] with weight 0 past an edge (nearest: floor(d * n / m))."""
    def taps(d: int, n: int, m: int) -> list[tuple[int, float]]:
        if nearest:
            return [(min(int(np.floor(d * n / m)), n - 1), 1.0)]
        f = (d + 0.5) * n / m - 0.5
        s = int(np.floor(f))
        f -= s
        if s < 0:
            s, f = 0, 0.0
        if s >= n - 1:
            s, f = n - 1, 0.0
        return [(s, 1 - f), (min(s + 1, n - 1), f)]

    src = image.astype(np.float64)
    out = np.zeros((height, width, *image.shape[2:]))
    for y in range(height):
        for x in range(width):
            for sy, wy in taps(y, image.shape[0], height):
                for sx, wx in taps(x, image.shape[1], width):
                    out[y, x] += wy * wx * src[sy, sx]
    return out


@pytest.mark.parametrize("size", [(5, 7), (13, 31), (8, 4)])
def test_resize_mode_opencv_is_opencvs_linear_and_nearest(size: tuple[int, int]) -> None:
    """ResizeTransformer(mode=...) (the vendor's transformer.py: 'skimage' or 'opencv') was refused as an unknown
    keyword. 'opencv' samples at half-pixel centres without anti-aliasing, as cv2.resize does."""
    pixels = rgb_uint8(9, 12)
    img = pixels.astype(np.float32) / 255
    for interpolation, nearest in (("", False), ("INTER_LINEAR", False), ("INTER_NEAREST", True)):
        out = T.ResizeTransformer(size, mode="opencv", interpolation=interpolation)(img)
        assert out.dtype == np.float32
        np.testing.assert_allclose(out, _opencv_reference(img, *size, nearest), atol=1e-6)
    as_uint8 = T.ResizeTransformer(size, mode="opencv", data_type=None)(pixels)
    assert as_uint8.dtype == np.uint8
    # OpenCV's fixed point (weights in 1/2048, truncating shifts): within 1 of the exact interpolation
    assert np.abs(as_uint8 - _opencv_reference(pixels, *size, False)).max() < 1
    # by default float32 of the uint8 result, as the vendor's cv2.resize(...).astype(np.float32)
    default = T.ResizeTransformer(size, mode="opencv")(pixels)
    assert default.dtype == np.float32
    np.testing.assert_array_equal(default, as_uint8)


def test_resize_mode_skimage_takes_the_vendors_method_and_data_type() -> None:
    img = rgb_uint8(9, 12).astype(np.float64)
    vendor = T.ResizeTransformer(target_size=(6, 6), mode="skimage", method=3)(img)
    np.testing.assert_array_equal(vendor, T.ResizeTransformer((6, 6), interpolation="bicubic")(img))
    assert T.ResizeTransformer((6, 6), "skimage", 1, "float")(img).dtype == np.float32
    as_uint8 = T.ResizeTransformer((6, 6), "skimage", 1, "uint8")(img + 0.7)
    assert as_uint8.dtype == np.uint8
    np.testing.assert_array_equal(as_uint8, np.floor(T.ResizeTransformer((6, 6), method=1)(img + 0.7)))
    with pytest.raises(ValueError, match=r"mode 'pil' is not one of \('skimage', 'opencv'\)"):
        T.ResizeTransformer(8, mode="pil")
    with pytest.raises(ValueError, match="interpolation 'INTER_LANCZOS4' is not one mode 'opencv' takes"):
        T.ResizeTransformer(8, mode="opencv", interpolation="INTER_LANCZOS4")
    with pytest.raises(ValueError, match="data_type 'int8'"):
        T.ResizeTransformer(8, data_type="int8")


def test_a_list_of_images_is_transformed_one_by_one_as_the_vendor_scripts_call_it():
    """Vendor preprocess scripts pass ``[image]`` through each transformer and take ``[0]``."""
    image = skimage.util.img_as_float(skimage.data.astronaut()[:40, :60]).astype(np.float32)
    transformers = [T.HWC2CHWTransformer(), T.ScaleTransformer(scale_value=255.0),
                    T.MeanTransformer(means=np.array([123.675, 116.28, 103.53]))]
    images = [image, image[:20]]
    single = image
    for t in transformers:
        images = t(images)
        single = t(single)
    assert isinstance(images, list) and len(images) == 2
    assert images[0].shape == (3, 40, 60) and images[1].shape == (3, 20, 60)
    np.testing.assert_array_equal(images[0], single)


# cv2.resize(np.arange(20, dtype=np.float32).reshape(4, 5) ** 1.5, dsize, interpolation=cv2.INTER_CUBIC) with
# OpenCV 5.0.0 (not a dependency; run once to write these down), rounded to 4 decimals.
CV2_CUBIC = {
    (3, 7): [[1.1444, 1.8062, 3.1724, 4.6803, 6.3544, 8.8128, 10.523],
             [19.6274, 22.0007, 25.7582, 28.8418, 32.0105, 36.2196, 39.0131],
             [54.1956, 57.3764, 62.3668, 66.3993, 70.4994, 75.8616, 79.3904]],
    (6, 3): [[-0.8164, 1.4663, 5.634], [4.1946, 8.5135, 14.1979], [15.6249, 22.6951, 30.5433],
             [27.77, 36.0577, 45.0438], [48.1923, 57.9918, 68.392], [61.9369, 72.5688, 83.7576]],
}


@pytest.mark.parametrize("size", sorted(CV2_CUBIC))
def test_opencv_cubic_resize_matches_opencv(size: tuple[int, int]) -> None:
    """INTER_CUBIC (vendor scripts pass it to ResizeTransformer(mode='opencv') and ShortSideResizeTransformer):
    OpenCV's bicubic kernel (a = -0.75), half-pixel centres, edge pixels repeated; overshoot kept in float."""
    img = np.arange(20, dtype=np.float32).reshape(4, 5) ** 1.5
    got = T.ResizeTransformer(target_size=size, mode="opencv", interpolation="INTER_CUBIC")(img)
    np.testing.assert_allclose(got, np.array(CV2_CUBIC[size], np.float32), atol=1e-3)


def test_a_vendor_calibration_chain_with_opencv_names_and_data_type() -> None:
    """The transformer list of a real calibration-data script: OpenCV interpolation names and data_type='uint8'
    on ShortSideResize, CenterCrop and Resize, called on a list of images as the vendor's classes are."""
    chain = [transformer.BGR2RGBTransformer(data_format="HWC"),
             transformer.ShortSideResizeTransformer(short_size=256, data_type="uint8", interpolation="INTER_CUBIC"),
             transformer.CenterCropTransformer(crop_size=224, data_type="uint8"),
             transformer.ResizeTransformer(target_size=(300, 300), data_type="uint8", mode="opencv", method=1,
                                           interpolation="INTER_CUBIC")]
    images = [np.asarray(skimage.data.astronaut()[..., ::-1], np.float32)]
    for step in chain:
        images = step(images)
    assert len(images) == 1 and images[0].shape == (300, 300, 3) and images[0].dtype == np.uint8
    with pytest.raises(ValueError, match="data_type 'int8' is not one of"):
        transformer.CenterCropTransformer(crop_size=224, data_type="int8")


# --------------------------------------------------------------------------- the vendor's numbers (hunt 40 D1)
# What horizon_tc_ui's transformer.py computes, written from its formulas: cv2.resize(image, (w, h)) is
# _opencv_reference (bilinear at half-pixel centres, no anti-aliasing), then astype(np.float32).


@pytest.mark.parametrize(("hw", "expected"), [((7, 61), (7, 60)), ((61, 7), (60, 7)), ((12, 20), (7, 11))])
def test_short_side_resize_long_side_is_the_vendors_int_of_short_times_ratio(hw, expected):
    """The vendor: ``int(short_size * (W / H))`` (7 * (61 / 7) = 60.99...: 60), not ``int(W * short_size / H)`` (61)."""
    t = T.ShortSideResizeTransformer(short_size=7)
    assert t(np.zeros((*hw, 3), np.uint8)).shape == (*expected, 3)


def test_short_side_resize_resamples_as_cv2_resize_and_gives_float32():
    """Default: cv2.resize's bilinear (the vendor's call), not skimage's anti-aliased resize; float32 out."""
    pixels = rgb_uint8(12, 20)
    img = pixels.astype(np.float32) / 255
    out = T.ShortSideResizeTransformer(short_size=5)(img)
    assert out.shape == (5, 8, 3) and out.dtype == np.float32  # int(5 * (20 / 12)) = 8
    np.testing.assert_allclose(out, _opencv_reference(img, 5, 8, nearest=False), atol=1e-6)
    as_uint8 = T.ShortSideResizeTransformer(5)(pixels)  # cv2.resize of uint8 is uint8, then astype(float32)
    assert as_uint8.dtype == np.float32
    np.testing.assert_array_equal(as_uint8, opencv_resize(pixels, 5, 8))
    assert np.abs(as_uint8 - _opencv_reference(pixels, 5, 8, nearest=False)).max() < 1  # OpenCV's fixed point
    truncated = T.ShortSideResizeTransformer(5, data_type="uint8")(pixels)
    np.testing.assert_array_equal(truncated, opencv_resize(pixels, 5, 8))
    # a scikit-image name still asks for skimage's resampling
    np.testing.assert_array_equal(T.ShortSideResizeTransformer(5, interpolation="bilinear")(img), resize(img, 5, 8))


@pytest.mark.parametrize("position", ["boundary", "bottom_right"])
def test_pad_resize_resamples_as_cv2_resize_into_a_float32_canvas(position):
    pixels = rgb_uint8(12, 20)
    img = pixels.astype(np.float64) / 255
    out = T.PadResizeTransformer(8, pad_value=0.5, pad_position=position)(img)
    # scale min(8 / 20, 8 / 12) = 0.4: int(0.4 * 12) x int(0.4 * 20) = 4 x 8, top (8 - 4) // 2 = 2 when centred
    top = 2 if position == "boundary" else 0
    assert out.dtype == np.float32
    np.testing.assert_allclose(out[top : top + 4], _opencv_reference(img, 4, 8, nearest=False), atol=1e-6)
    rest = np.ones(8, bool)
    rest[top : top + 4] = False
    assert (out[rest] == 0.5).all()
    as_uint8 = T.PadResizeTransformer(8, pad_value=127.0, pad_position=position)(pixels)
    assert as_uint8.dtype == np.float32
    np.testing.assert_array_equal(as_uint8[top : top + 4], opencv_resize(pixels, 4, 8))


def _vendor_skimage_resize(image: np.ndarray, size: tuple[int, int], order: int = 1) -> np.ndarray:
    """The vendor's ResizeTransformer.skimage_resize for 1 or 3 channels: 0..1 by the image's min/max,
    skimage.transform.resize with its defaults (mode 'reflect', anti-aliasing when shrinking), scaled back."""
    low, high = image.min(), image.max()
    unit = (image - low) / (high - low)
    return (skimage.transform.resize(unit, size, order=order) * (high - low) + low).astype(np.float32)


def test_resize_skimage_mode_is_the_vendors_normalised_skimage_call():
    pixels = rgb_uint8(12, 20)
    for size, order in (((5, 7), 1), ((9, 30), 1), ((5, 7), 3)):
        out = T.ResizeTransformer(size, mode="skimage", method=order)(pixels)
        assert out.dtype == np.float32
        np.testing.assert_array_equal(out, _vendor_skimage_resize(pixels, size, order))
    np.testing.assert_array_equal(T.ResizeTransformer((5, 7))(pixels), _vendor_skimage_resize(pixels, (5, 7)))
    truncated = T.ResizeTransformer((5, 7), data_type="uint8")(pixels)
    np.testing.assert_array_equal(truncated, np.floor(_vendor_skimage_resize(pixels, (5, 7))).astype(np.uint8))
    # a constant picture: that value, float32
    constant = T.ResizeTransformer((3, 4))(np.full((6, 8, 3), 9, np.uint8))
    assert constant.dtype == np.float32 and constant.shape == (3, 4, 3) and (constant == 9).all()
    # other channel counts: scipy.ndimage.zoom, order 1
    four = RNG.integers(0, 256, size=(6, 8, 4)).astype(np.uint8)
    zoomed = scipy.ndimage.zoom(four, (3 / 6, 4 / 8, 1), order=1).astype(np.float32)
    np.testing.assert_array_equal(T.ResizeTransformer((3, 4))(four), zoomed)


# cv2.resize(np.uint8(np.arange(20).reshape(4, 5) ** 1.8), (w, h)) (INTER_LINEAR) with OpenCV 5.0.0 (not a dependency;
# run once to write these down). Rounding the exact interpolation is 1 off in places: OpenCV's uint8 path works in
# fixed point.
CV2_LINEAR_UINT8 = {
    (3, 7): [[3, 4, 6, 8, 11, 15, 19], [41, 45, 52, 60, 68, 77, 84], [119, 128, 139, 150, 163, 175, 186]],
    (7, 3): [[0, 3, 10], [7, 14, 24], [19, 31, 46], [43, 60, 79], [71, 92, 116], [111, 136, 164], [136, 163, 194]],
    (9, 11): [[0, 0, 0, 1, 2, 3, 5, 7, 9, 11, 12], [3, 3, 4, 5, 6, 8, 10, 12, 15, 17, 19],
              [11, 12, 14, 16, 19, 21, 24, 28, 31, 35, 36], [20, 22, 25, 28, 32, 36, 40, 44, 49, 54, 55],
              [41, 42, 46, 50, 55, 60, 65, 70, 76, 81, 84], [60, 62, 67, 72, 78, 84, 90, 96, 103, 109, 111],
              [89, 91, 97, 103, 110, 116, 124, 130, 138, 145, 148],
              [119, 122, 129, 136, 143, 150, 158, 166, 174, 182, 186],
              [130, 133, 141, 148, 156, 163, 171, 179, 188, 196, 200]],
}


@pytest.mark.parametrize("size", sorted(CV2_LINEAR_UINT8))
def test_opencv_linear_resize_of_uint8_gives_opencvs_bytes(size: tuple[int, int]) -> None:
    """ShortSideResize / PadResize / Resize(mode='opencv') of a uint8 picture: OpenCV's own bytes (its fixed
    point), not the exact interpolation rounded, which differs by 1 on about one pixel in nine."""
    img = (np.arange(20, dtype=np.float64).reshape(4, 5) ** 1.8).astype(np.uint8)
    want = np.array(CV2_LINEAR_UINT8[size], np.uint8)
    np.testing.assert_array_equal(opencv_resize(img, *size), want)
    np.testing.assert_array_equal(T.ResizeTransformer(size, mode="opencv")(img), want.astype(np.float32))
    rgb = np.stack([img, img[::-1], 255 - img], axis=-1)
    np.testing.assert_array_equal(opencv_resize(rgb, *size)[..., 0], want)
    assert np.abs(np.rint(_opencv_reference(img, *size, nearest=False)) - want).max() <= 1


def test_opencv_nearest_picks_opencvs_source_pixel_where_the_two_scales_differ() -> None:
    """hunt 43 D10: OpenCV's INTER_NEAREST takes floor(d * (1 / (size / n))) (the inverse scale in double);
    hbtools took floor(d * (n / size)), which for 14 -> 18 rows puts row 9 on source row 7 (9 * 14 / 18 = 7
    exactly) where OpenCV, one bit under 7, reads row 6; 6 -> 34 columns: column 17 on 3, OpenCV 2 (both
    checked with OpenCV 5.0 and 4.10)."""
    rows, cols = np.meshgrid(np.arange(14), np.arange(6), indexing="ij")
    image = np.stack([rows, cols, rows * 6 + cols], axis=-1).astype(np.uint8)
    out = opencv_resize(image, 18, 34, "nearest")
    want_rows = np.minimum(np.floor(np.arange(18) * (1 / (18 / 14))), 13).astype(int)
    want_cols = np.minimum(np.floor(np.arange(34) * (1 / (34 / 6))), 5).astype(int)
    assert want_rows[9] == 6 and want_cols[17] == 2
    np.testing.assert_array_equal(out, image[want_rows][:, want_cols])
    as_float = T.ResizeTransformer((18, 34), mode="opencv", interpolation="INTER_NEAREST")(image.astype(np.float32))
    np.testing.assert_array_equal(as_float, out)


# cv2.resize of the uint16 picture below (OpenCV 5.0; run once to write them down): INTER_LINEAR to 3x7 (4.10 gives
# 31564 at [0, 5], the exact value lying at .5) and INTER_CUBIC to 6x7, whose overshoots OpenCV saturates.
U16 = [[0, 65535, 0, 65535, 1000], [65535, 0, 40000, 0, 3], [7, 30001, 65535, 65535, 0], [0, 0, 12345, 65535, 65535]]
CV2_U16_LINEAR = [[10922, 35888, 40914, 6667, 40914, 31565, 834], [32771, 22616, 25791, 52768, 38482, 18725, 2],
                  [1, 2858, 9632, 21210, 52871, 60854, 54612]]
CV2_U16_CUBIC = [[0, 46774, 56658, 0, 55917, 49618, 0], [39616, 35011, 25323, 17606, 26560, 16603, 0],
                 [65535, 20318, 7132, 48060, 18096, 0, 0], [9242, 15987, 40070, 65535, 65535, 28230, 0],
                 [0, 5288, 25311, 41334, 65535, 58528, 29704], [204, 0, 0, 7728, 50113, 65535, 65535]]


def test_opencv_resize_of_uint16_is_rounded_and_saturated_as_opencvs() -> None:
    """hunt 43 D5: a uint16 picture came back as unrounded floats, INTER_CUBIC overshoots up to 4059 past
    0..65535; OpenCV stores 16-bit results rounded and saturated."""
    img = np.array(U16, np.uint16)
    linear = opencv_resize(img, 3, 7, "linear")
    assert linear.dtype == np.uint16
    np.testing.assert_array_equal(linear, CV2_U16_LINEAR)
    np.testing.assert_array_equal(opencv_resize(img, 6, 7, "cubic"), CV2_U16_CUBIC)
    # the vendor-named resize: OpenCV's uint16 result, then float32
    got = T.ResizeTransformer((6, 7), mode="opencv", interpolation="INTER_CUBIC")(img)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, np.array(CV2_U16_CUBIC, np.float32))


def test_rgb_calc_nv12_takes_an_odd_height_as_the_vendors() -> None:
    """hunt 43 D6: the vendor's rgb2nv12_calc refuses only H and W both odd; 3x4 gives 3 + 2 rows (chroma of
    rows 0 and 2). hbtools refused every odd height."""
    rgb = rgb_uint8(3, 4)
    r, g, b = (rgb[..., i].astype(np.float64) for i in range(3))
    y = 0.299 * r + 0.587 * g + 0.114 * b
    u = (-0.169 * r - 0.331 * g + 0.5 * b + 128)[::2, ::2]
    v = (0.5 * r - 0.419 * g - 0.081 * b + 128)[::2, ::2]
    want = np.vstack([y, np.stack([u, v], axis=-1).reshape(2, 4)]).astype(np.uint8)
    np.testing.assert_array_equal(T.RGB2NV12Transformer(data_format="HWC")(rgb), want)
    np.testing.assert_array_equal(transformer.BGR2NV12Transformer(data_format="HWC")([rgb[..., ::-1]])[0], want)
    with pytest.raises(ValueError, match="even width"):
        T.RGB2NV12Transformer(data_format="HWC")(rgb_uint8(4, 3))
    with pytest.raises(ValueError, match="even height and width"):
        T.RGB2NV12Transformer(data_format="HWC", cvt_mode="opencv")(rgb)


@pytest.mark.parametrize("second", ["bilinear", "INTER_CUBIC", 3])
def test_short_side_resize_says_where_an_interpolation_given_second_goes(second) -> None:
    """hunt 43 D3: hbtools' old order was (short_size, interpolation, data_type); the vendor's is (short_size,
    data_type, interpolation). An interpolation given second was refused as an unknown data_type."""
    with pytest.raises(ValueError, match=r"interpolation, given where data_type goes.*\(short_size, data_type='float', "
                                         rf"interpolation=''\): pass interpolation={second!r}"):
        T.ShortSideResizeTransformer(256, second)
    with pytest.raises(ValueError, match="data_type 'int8' is not one of"):
        T.ShortSideResizeTransformer(256, "int8")
    assert T.ShortSideResizeTransformer(256, interpolation=second).interpolation == second
