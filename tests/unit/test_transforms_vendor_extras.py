"""The vendor transformer classes real scripts use beyond the basic set: crops, pads and
resizes of the vendor's detection/classification samples, the Pillow (torchvision) pair, Add."""

from __future__ import annotations

import numpy as np
import PIL.Image
import pytest

from hbtools.data import colour
from hbtools.data import transforms as T
from horizon_tc_ui.data import transformer

RNG = np.random.default_rng(11)


def rgb_uint8(h: int, w: int) -> np.ndarray:
    return RNG.integers(0, 256, size=(h, w, 3)).astype(np.uint8)


def block_means(image: np.ndarray) -> np.ndarray:
    """2x2 block averages: what a bilinear resize by exactly one half gives at half-pixel centres."""
    h, w = image.shape[:2]
    return image.reshape(h // 2, 2, w // 2, 2, *image.shape[2:]).mean(axis=(1, 3))


def test_the_vendor_names_import_from_the_vendor_path():
    for name in ("PaddedCenterCropTransformer", "LongSideCropTransformer", "PadTransformer",
                 "ShortLongResizeTransformer", "PILResizeTransformer", "PILCenterCropTransformer", "AddTransformer"):
        assert getattr(transformer, name) is getattr(T, name)


# --------------------------------------------------------------------------- PaddedCenterCrop


@pytest.mark.parametrize(("image_size", "side", "top", "left"), [(224, 262, 19, 69), (240, 264, 18, 68)])
def test_padded_center_crop_cuts_efficientnets_square(image_size, side, top, left):
    # side = int(image_size / (image_size + 32) * min(300, 400)); corner = (margin + 1) // 2
    image = rgb_uint8(300, 400)
    out = T.PaddedCenterCropTransformer(image_size=image_size, crop_pad=32)(image)
    assert out.shape == (side, side, 3) and out.dtype == np.float32  # always float32, as the vendor's
    np.testing.assert_array_equal(out, image[top : top + side, left : left + side])


def test_padded_center_crop_defaults_and_bad_parameters():
    assert T.PaddedCenterCropTransformer().crop_side(256, 256) == 224  # 224 / 256 * 256
    with pytest.raises(ValueError, match="crop_pad"):
        T.PaddedCenterCropTransformer(224, crop_pad=-1)
    with pytest.raises(ValueError, match="image_size"):
        T.PaddedCenterCropTransformer(image_size=0)


# --------------------------------------------------------------------------- LongSideCrop


def test_long_side_crop_of_a_wide_image_keeps_the_central_square():
    image = rgb_uint8(70, 100)
    out = T.LongSideCropTransformer()(image)
    assert out.dtype == np.float32  # hunt 43 D11: the vendor's returns float32; hbtools kept uint8
    np.testing.assert_array_equal(out, image[:, 15:85])


def test_long_side_crop_of_a_tall_image_keeps_half_the_difference_plus_the_width():
    image = rgb_uint8(100, 70)  # the vendor's documented example: 70 wide, 100 high -> 70 x 85
    out = T.LongSideCropTransformer()(image)
    assert out.shape == (85, 70, 3)
    np.testing.assert_array_equal(out, image[15:])


# --------------------------------------------------------------------------- ShortLongResize


def test_short_long_resize_by_one_half_averages_2x2_blocks_and_appends_im_info():
    """hunt 43 D12: the vendor's post_process appends im_info = [h, w, scale] (float32) of the resized picture;
    hbtools returned (resized, original)."""
    image = RNG.random((8, 12, 3))
    resized, im_info = transformer.ShortLongResizeTransformer(short_size=4, long_size=100)([image])
    np.testing.assert_allclose(resized, block_means(image), atol=1e-12)
    assert im_info.dtype == np.float32
    np.testing.assert_array_equal(im_info, [4, 6, 0.5])
    one, info = T.ShortLongResizeTransformer(4, 100)(image)  # one image: the two as a tuple
    np.testing.assert_array_equal(one, resized)
    np.testing.assert_array_equal(info, im_info)
    out = T.ShortLongResizeTransformer(600, 1000)([np.zeros((300, 400, 3), np.uint8)])
    assert [o.shape for o in out] == [(600, 800, 3), (3,)]
    np.testing.assert_array_equal(out[1], [600, 800, 2.0])


def test_short_long_resize_caps_by_the_rounded_long_side_as_the_vendor():
    """600 / 1199 * 1999 = 1000.3 rounds to 1000, not over long_size 1000: the vendor keeps 600 / 1199."""
    t = T.ShortLongResizeTransformer(600, 1000, include_im=False)
    assert t.factor(1199, 1999) == 600 / 1199
    assert t.factor(1199, 2001) == 1000 / 2001


def test_vendor_style_hooks_run_around_each_image():
    """The vendor's Transformer.__call__ calls pre_process(data_list, data) and post_process(result_list,
    result) around run_transform of every list element; a subclass that appends in post_process keeps it."""
    calls = []

    class WithShape(transformer.Transformer):
        def __init__(self):
            super().__init__()

        def pre_process(self, data_list, data):
            calls.append((len(data_list), data.shape))

        def run_transform(self, image):
            return image[::2, ::2]

        def post_process(self, data_list, data):
            data_list.append(np.array(data.shape[:2], np.float32))

    out = WithShape()([np.zeros((8, 6, 3), np.uint8), np.zeros((4, 4, 3), np.uint8)])
    assert [o.shape for o in out] == [(4, 3, 3), (2,), (2, 2, 3), (2,)]
    np.testing.assert_array_equal(out[3], [2, 2])
    assert calls == [(2, (8, 6, 3)), (2, (4, 4, 3))]
    assert transformer.Transformer()([np.ones(3)])[0].tolist() == [1, 1, 1]  # the base: unchanged, as the vendor's


# cv2.getAffineTransform of the vendor's get_affine_transform points (OpenCV 5.0 and 4.10, the same doubles; run
# once to write them down). numpy.linalg.solve gives 0.3200000072937013 for the second case's 0.32000000729370126.
CV2_AFFINE = [
    ((np.float32([256, 213.5]), 640.0, 0, [512, 512]), {}, [[0.8, -0.0, 51.2], [0.0, 0.8, 85.2]]),
    ((np.float32([100.5, 60]), np.float32([200, 120]), 30, [128, 96]), {"shift": np.float32([0.1, -0.2])},
     [[0.5542562626330612, 0.32000000729370126, -14.307879909857114],
      [-0.32000000729370137, 0.554256262633061, 66.60677542410082]]),
    ((np.float32([100.5, 60]), 200.0, -15, [128, 96]), {"inv": 1},
     [[1.5092591047286987, 0.40440475940704346, -15.504011154174805],
      [-0.40440475940704346, 1.5092591047286987, 13.437467575073242]]),
]


@pytest.mark.parametrize(("args", "kwargs", "want"), CV2_AFFINE)
def test_the_vendor_modules_affine_helpers(args, kwargs, want):
    """Scripts import get_affine_transform / get_3rd_point / get_dir from the vendor module; the matrix is
    the one cv2.getAffineTransform solves, to the last bit."""
    got = transformer.get_affine_transform(*args, **kwargs)
    assert got.dtype == np.float64 and got.shape == (2, 3)
    np.testing.assert_array_equal(got, want)
    third = transformer.get_3rd_point(np.float32([1, 2]), np.float32([4, 8]))
    np.testing.assert_array_equal(third, [10, 5])
    np.testing.assert_allclose(transformer.get_dir([3.0, -4.0], np.pi / 2), [4.0, 3.0], atol=1e-12)


def test_the_vendor_modules_colour_helpers_and_interpolation_table():
    r, g, b = (rgb_uint8(3, 4)[..., 0] for _ in range(3))
    y, u, v = transformer.rgb2bt601_full_range(r, g, b)
    np.testing.assert_array_equal(y, 0.299 * r + 0.587 * g + 0.114 * b)
    np.testing.assert_array_equal(u, -0.169 * r - 0.331 * g + 0.5 * b + 128)
    np.testing.assert_array_equal(v, 0.5 * r - 0.419 * g - 0.081 * b + 128)
    np.testing.assert_array_equal(transformer.rgb2bt601_full_range(r, g, b, single_channel=True), y)
    y, u, v = transformer.rgb2bt601_video_range(r, g, b)
    np.testing.assert_array_equal(y, 0.257 * r + 0.504 * g + 0.098 * b + 16)
    np.testing.assert_array_equal(v, 0.439 * r - 0.368 * g - 0.071 * b + 128)
    assert transformer.INTERPOLATION_DICT == {"INTER_CUBIC": 2}  # cv2.INTER_CUBIC


@pytest.mark.parametrize(
    ("hw", "short", "long", "factor", "expected"),
    [
        ((21, 100), 20, 100, 20 / 21, (20, 95)),  # 20/21 * 100 = 95.2 stays under 100
        ((10, 100), 20, 100, 1.0, (10, 100)),  # 2 * 100 would pass 100: 100 / 100 instead
        ((300, 40), 50, 200, 200 / 300, (200, 27)),  # 1.25 * 300 would pass 200: 40 * 2/3 = 26.7 -> 27
    ],
)
def test_short_long_resize_caps_the_long_side(hw, short, long, factor, expected):
    t = T.ShortLongResizeTransformer(short, long, include_im=False)
    assert t.factor(*hw) == pytest.approx(factor)
    assert t(rgb_uint8(*hw)).shape == (*expected, 3)


def test_short_long_resize_at_factor_one_is_the_identity():
    image = rgb_uint8(10, 100)
    np.testing.assert_array_equal(T.ShortLongResizeTransformer(20, 100, include_im=False)(image), image)


# --------------------------------------------------------------------------- Pad


def test_pad_scales_the_long_side_to_target_and_pads_bottom_right_to_the_divisor():
    image = RNG.random((8, 16, 3)) * 255
    out = T.PadTransformer(size_divisor=3, target_size=8)(image)  # factor 0.5 -> 4 x 8 -> canvas 6 x 9
    assert out.shape == (6, 9, 3) and out.dtype == np.float32
    # the vendor truncates the resized picture to uint8 (astype) before it goes on the canvas
    np.testing.assert_array_equal(out[:4, :8], np.floor(block_means(image) + 1e-9))
    assert not out[4:].any() and not out[:, 8:].any()


def test_pad_defaults_give_a_float32_canvas_in_multiples_of_128():
    image = rgb_uint8(300, 400)
    out = T.PadTransformer()(image)  # 512 / 400 -> 384 x 512
    assert out.shape == (384, 512, 3) and out.dtype == np.float32  # the vendor's ends in astype(np.float32)
    assert T.Pad(image).dtype == np.float32
    with pytest.raises(ValueError, match="size_divisor"):
        T.PadTransformer(size_divisor=0)


# The vendor's PadTransformer: cv2.resize(img, (int(round(w * f)), int(round(h * f))), interpolation=INTER_LINEAR)
# with f = 13 / 8, of the 5x8 picture below (channel 0), from OpenCV 5.0 and 4.10 (the same bytes; run once to
# write them down). cv2.resize(img, None, fx=f, fy=f) samples the rows with 1 / f instead of 5 / 8: 225 of
# the 312 values differ.
CV2_PAD_13 = [[0, 0, 1, 2, 3, 5, 6, 8, 10, 12, 14, 16, 18], [10, 11, 12, 14, 16, 18, 20, 23, 25, 28, 30, 33, 35],
              [25, 27, 30, 32, 35, 38, 41, 44, 48, 51, 55, 58, 61],
              [51, 53, 57, 60, 63, 67, 71, 74, 78, 83, 87, 91, 94],
              [81, 83, 87, 91, 95, 99, 104, 108, 113, 117, 122, 126, 129],
              [114, 117, 122, 126, 131, 135, 140, 145, 150, 155, 160, 165, 168],
              [153, 156, 161, 166, 171, 177, 182, 187, 192, 198, 203, 208, 212],
              [181, 184, 189, 195, 200, 206, 211, 217, 222, 228, 234, 239, 243]]


def test_pad_resizes_to_the_rounded_size_as_the_vendors_cv2_resize_call():
    """hunt 43 D9: hbtools sampled as cv2.resize(fx=f, fy=f); the vendor passes the explicit rounded size, so a
    side whose length times f is not whole (5 * 13 / 8 = 8.125) was sampled with another ratio."""
    img = (np.arange(40, dtype=np.float64).reshape(5, 8) ** 1.5).astype(np.uint8)
    img3 = np.stack([img, img[::-1], 255 - img], axis=-1)
    out = transformer.PadTransformer(size_divisor=4, target_size=13)([img3])[0]
    assert out.shape == (8, 16, 3) and out.dtype == np.float32
    np.testing.assert_array_equal(out[:8, :13, 0], np.array(CV2_PAD_13, np.float32))
    assert not out[:, 13:].any()


# --------------------------------------------------------------------------- Pillow


@pytest.mark.parametrize("interpolation", [PIL.Image.BILINEAR, PIL.Image.NEAREST, PIL.Image.BICUBIC, PIL.Image.LANCZOS])
def test_pil_resize_of_an_int_size_is_torchvisions_short_side_resize(interpolation):
    image = rgb_uint8(300, 200)
    out = T.PILResizeTransformer(size=256, interpolation=interpolation)(image)
    expected = np.asarray(PIL.Image.fromarray(image).resize((256, 384), interpolation))  # int(256 * 300 / 200)
    assert out.dtype == np.uint8
    np.testing.assert_array_equal(out, expected)


def test_pil_resize_to_height_width_and_of_float_images():
    image = RNG.random((30, 20, 3)).astype(np.float32) * 255
    out = T.PILResizeTransformer(size=(12, 17))(image)
    assert out.shape == (12, 17, 3) and out.dtype == np.float32
    green = np.asarray(PIL.Image.fromarray(image[..., 1], mode="F").resize((17, 12), PIL.Image.BILINEAR))
    np.testing.assert_array_equal(out[..., 1], green)
    with pytest.raises(ValueError, match="Pillow filter"):
        T.PILResizeTransformer(256, interpolation="trilinear")


def test_pil_center_crop_places_the_window_as_torchvision_does():
    image = rgb_uint8(7, 10)  # top = round(3 / 2) = 2 (half to even), left = round(6 / 2) = 3
    out = T.PILCenterCropTransformer(size=4)(image)
    np.testing.assert_array_equal(out, np.asarray(PIL.Image.fromarray(image).crop((3, 2, 7, 6))))
    # hunt 43 D11: the vendor's crops Image.fromarray(data.astype('uint8')) and returns float32
    assert out.dtype == np.float32
    np.testing.assert_array_equal(T.PILCenterCrop(image + 0.75, 4), out)
    with pytest.raises(ValueError, match="larger than the image"):
        T.PILCenterCropTransformer(size=8)(image)


def test_pil_resize_then_center_crop_is_the_resnet_evaluation_chain():
    image = rgb_uint8(300, 450)
    out = T.Compose([T.PILResizeTransformer(256), T.PILCenterCropTransformer(224)])(image)
    pil = PIL.Image.fromarray(image).resize((384, 256), PIL.Image.BILINEAR)
    np.testing.assert_array_equal(out, np.asarray(pil.crop((80, 16, 304, 240))))


# --------------------------------------------------------------------------- Add


def test_add_gives_floats_so_uint8_does_not_wrap():
    image = np.array([[[10, 200, 255]]], dtype=np.uint8)
    out = T.AddTransformer(-128)(image)
    assert out.dtype.kind == "f"
    np.testing.assert_array_equal(out, [[[-118, 72, 127]]])
    np.testing.assert_array_equal(T.Add(np.float32([1.5]), 127), np.float32([128.5]))


# --------------------------------------------------------------------------- colour variants


def test_the_128_variants_are_the_conversion_minus_128_in_float32():
    """The vendor's *_128 transformers add -128. to the float conversion and return float32 (hbtools gave
    int8 of the rounded conversion)."""
    image = rgb_uint8(4, 6)
    gray = T.RGB2GRAYTransformer(data_format="HWC")(image)
    gray128 = transformer.RGB2GRAY_128Transformer(data_format="HWC")(image)
    assert gray128.dtype == np.float32
    np.testing.assert_allclose(gray128, gray - 128, atol=1e-4)
    yuv = T.BGR2YUV444Transformer(data_format="HWC")(image)
    yuv128 = transformer.BGR2YUV444_128Transformer("HWC")(image)
    assert yuv128.dtype == np.float32
    np.testing.assert_allclose(yuv128, yuv - 128, atol=1e-4)
    chw = np.ascontiguousarray(image.transpose(2, 0, 1)).astype(np.float32)
    np.testing.assert_allclose(transformer.RGB2YUV444_128Transformer("CHW")(chw),
                               T.RGB2YUV444Transformer("CHW")(chw) - 128, atol=1e-4)


def test_video_range_and_yuv_by_colour_sequence():
    image = rgb_uint8(4, 6)
    video = transformer.RGB2YUVBT601VIDEOTransformer(data_format="HWC")(image)
    np.testing.assert_array_equal(video, T.RGB2YUV444Transformer("HWC", space_and_range="bt601_video")(image))
    assert video.dtype == np.float32
    # the vendor's rgb2bt601_video_range
    r, g, b = (image[..., i].astype(np.float64) for i in range(3))
    want = np.stack([0.257 * r + 0.504 * g + 0.098 * b + 16, -0.148 * r - 0.291 * g + 0.439 * b + 128,
                     0.439 * r - 0.368 * g - 0.071 * b + 128], axis=-1).astype(np.float32)
    np.testing.assert_array_equal(video, want)
    assert 16 <= video[..., 0].min() and video[..., 0].max() <= 235
    np.testing.assert_array_equal(transformer.BGR2YUVBT601VIDEOTransformer("HWC")(image[..., ::-1]), video)
    yuv = transformer.YUVTransformer(color_sequence="BGR")(image[..., ::-1])  # the vendor's: OpenCV's I420, float32
    assert yuv.dtype == np.float32
    np.testing.assert_array_equal(yuv[..., 0], colour.rgb_to_nv12_opencv(image)[:4])
    with pytest.raises(ValueError, match="color_sequence"):
        transformer.YUVTransformer(color_sequence="YUV")


def test_reduce_channel_keeps_the_first_channel_where_data_format_says():
    batch = RNG.random((1, 3, 5, 7))
    out = transformer.ReduceChannelTransformer(data_format="NCHW")(batch)
    assert out.shape == (1, 1, 5, 7)
    np.testing.assert_array_equal(out[0, 0], batch[0, 0])
    np.testing.assert_array_equal(transformer.ReduceChannelTransformer("HWC")(batch[0].transpose(1, 2, 0)),
                                  batch[0, :1].transpose(1, 2, 0))
