from pathlib import Path

import numpy as np
import pytest
import skimage.data
import skimage.io
import skimage.transform

from hbtools.config.model import InputSpec
from hbtools.data import colour
from hbtools.data.calibration import (
    FolderCalibrationSource,
    RandomCalibrationSource,
    dump_calibration_data,
    folder_names,
    preflight,
    raw_dtype,
)
from hbtools.errors import HbError


def spec(folder, train="rgb", rt="rgb", layout="NCHW", shape=None, name="data", **kw):
    if shape is None:
        c = 1 if train == "gray" else 3
        shape = [1, c, 4, 6] if layout == "NCHW" else [1, 4, 6, c]
    return InputSpec(
        name=name, shape=shape, type_train=train, layout_train=layout, type_rt=rt,
        layout_rt=None, cal_data_dir=None if folder is None else Path(folder), **kw,
    )  # fmt: skip


def write(folder, files):
    folder.mkdir(parents=True, exist_ok=True)
    for name, arr in files.items():
        if name.endswith(".npy"):
            np.save(folder / name, arr)
        else:
            arr.tofile(folder / name)
    return folder


def samples(n, shape, dtype=np.uint8, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, size=shape).astype(dtype) for _ in range(n)]


def test_uint8_tofile_identity_in_sorted_order(tmp_path):
    s = spec(tmp_path / "cal")
    a, b, c = samples(3, s.shape)
    write(tmp_path / "cal", {"b.rgb": b, "a.rgb": a, "c.rgb": c})
    src = FolderCalibrationSource([s])
    assert len(src) == 3 and preflight([s]) == 3
    got = [d["data"] for d in src]
    for g, want in zip(got, [a, b, c], strict=True):
        assert g.dtype == np.int8 and g.shape == (1, 3, 4, 6)
        np.testing.assert_array_equal(g.astype(int), want.astype(int) - 128)


def test_picked_samples_are_those_of_a_full_pass_and_only_their_files_are_read(tmp_path):
    s = spec(tmp_path / "cal")
    files = {f"{k}.rgb": x for k, x in enumerate(samples(5, s.shape))}
    write(tmp_path / "cal", files)
    src = FolderCalibrationSource([s])
    everything = [d["data"] for d in src]
    (tmp_path / "cal" / "0.rgb").write_bytes(b"")  # a file not picked is not read (a read would fail its size)
    picked = src.picked({3, 1})
    assert len(picked) == 2
    for got, k in zip(picked, [1, 3], strict=True):
        np.testing.assert_array_equal(got["data"], everything[k])
    generated = RandomCalibrationSource([spec(None)], num_samples=4)
    np.testing.assert_array_equal(generated.picked({2})[0]["data"], list(generated)[2]["data"])


def test_float32_by_cal_data_type_rounds_and_clips(tmp_path):
    s = spec(tmp_path / "cal", cal_data_type="float32")
    data = np.full(s.shape, 100.4, np.float32)
    data[0, 0, 0, :3] = [-7.0, 300.0, 2.5]
    write(tmp_path / "cal", {"0.bin": data})
    (got,) = [d["data"] for d in FolderCalibrationSource([s])]
    assert got[0, 0, 1, 0] == 100 - 128
    np.testing.assert_array_equal(got[0, 0, 0, :3], [-128, 127, 2 - 128])


def test_f32_folder_name_means_float32(tmp_path):
    s = spec(tmp_path / "calibration_data_rgb_f32")
    assert raw_dtype(s) == np.float32
    assert raw_dtype(spec(tmp_path / "cal_f32_x")) == np.uint8
    data = samples(1, s.shape, np.float32)[0]
    write(tmp_path / "calibration_data_rgb_f32", {"x": data})
    (got,) = [d["data"] for d in FolderCalibrationSource([s])]
    np.testing.assert_array_equal(got.astype(int), data.astype(int) - 128)


def test_f32_file_extension_means_float32(tmp_path):
    """The vendor's docs also mark float32 files by an extension ending in _f32 (e.g. 0.bin_f32)."""
    s = spec(tmp_path / "cal")
    data = samples(1, s.shape, np.float32)[0]
    write(tmp_path / "cal", {"0.bin_f32": data})
    assert raw_dtype(s, tmp_path / "cal" / "0.bin_f32") == np.float32
    (got,) = [d["data"] for d in FolderCalibrationSource([s])]
    np.testing.assert_array_equal(got.astype(int), data.astype(int) - 128)


def test_npy_files(tmp_path):
    s = spec(tmp_path / "cal", layout="NHWC")
    data = samples(1, [4, 6, 3], np.float64)[0]  # batch axis missing: same element count
    write(tmp_path / "cal", {"0.npy": data})
    (got,) = [d["data"] for d in FolderCalibrationSource([s])]
    np.testing.assert_array_equal(got[0].astype(int), data.astype(int) - 128)


def test_wrong_size_names_file_bytes_and_dtype(tmp_path):
    s = spec(tmp_path / "cal")
    write(tmp_path / "cal", {"a": samples(1, s.shape)[0], "b": np.zeros(10, np.uint8)})
    with pytest.raises(HbError) as e:
        preflight([s])
    msg = str(e.value)
    assert str(tmp_path / "cal" / "b") in msg and "72 bytes" in msg and "uint8" in msg
    assert "10 bytes" in msg and e.value.hint


def test_float_file_in_uint8_folder_is_caught(tmp_path):
    s = spec(tmp_path / "cal")
    write(tmp_path / "cal", {"a": samples(1, s.shape, np.float32)[0]})
    with pytest.raises(HbError, match="288 bytes, expected 72 bytes") as e:
        FolderCalibrationSource([s])
    # the size fits float32: the message says so (it only said the byte counts)
    assert "its size fits dtype float32 (cal_data_type: float32)" in str(e.value)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_files_of_another_picture_size_say_so(tmp_path, layout):
    """input_shape 1x3x6x6 given for files written at 1x3x4x4: the hint was to set cal_data_type, the wrong fix.
    The size fits the data type at another picture size: the message names that shape."""
    shape = [1, 3, 6, 6] if layout == "NCHW" else [1, 6, 6, 3]
    written = [1, 3, 4, 4] if layout == "NCHW" else [1, 4, 4, 3]
    s = spec(tmp_path / "cal", layout=layout, shape=shape)
    write(tmp_path / "cal", {"a": samples(1, written)[0]})
    with pytest.raises(HbError) as e:
        preflight([s])
    assert f"its size fits a {'x'.join(map(str, written))} uint8 tensor" in str(e.value)
    assert "input_shape" in e.value.hint and "cal_data_type" not in e.value.hint


@pytest.mark.parametrize(("layout", "saved", "fix"), [("NCHW", [1, 4, 6, 3], "(0, 3, 1, 2)"),
                                                     ("NCHW", [4, 6, 3], "(2, 0, 1)"),
                                                     ("NHWC", [1, 3, 4, 6], "(0, 2, 3, 1)")])
def test_npy_in_the_other_layout_is_refused(tmp_path, layout, saved, fix):
    """An HWC picture saved for a CHW input (or the reverse) has the input's element count, and read in the
    input's order its pixels would be scrambled: the file's own shape shows it, so it is refused."""
    s = spec(tmp_path / "cal", layout=layout)
    write(tmp_path / "cal", {"a.npy": samples(1, saved)[0]})
    with pytest.raises(HbError, match="in another order") as e:
        FolderCalibrationSource([s])
    assert "a.npy" in str(e.value) and fix in e.value.hint


def test_bad_npy_shape(tmp_path):
    s = spec(tmp_path / "cal")
    write(tmp_path / "cal", {"a.npy": np.zeros((3, 3))})
    with pytest.raises(HbError, match="a.npy"):
        preflight([s])


def test_empty_and_missing_folder(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / ".DS_Store").write_bytes(b"x")
    with pytest.raises(HbError, match="empty"):
        preflight([spec(tmp_path / "empty")])
    with pytest.raises(HbError, match="does not exist"):
        preflight([spec(tmp_path / "nope")])


def test_multi_input_count_mismatch(tmp_path):
    s1 = spec(tmp_path / "in1", name="a")
    s2 = spec(tmp_path / "in2", name="b")
    write(tmp_path / "in1", {f"{i}": x for i, x in enumerate(samples(3, s1.shape))})
    write(tmp_path / "in2", {f"{i}": x for i, x in enumerate(samples(2, s2.shape))})
    with pytest.raises(HbError, match=r"in1: 3, .*in2: 2"):
        preflight([s1, s2])


def test_multi_input_with_featuremap(tmp_path):
    img = spec(tmp_path / "img", name="img")
    fm = spec(tmp_path / "fm", train="featuremap", rt="featuremap", shape=[1, 8], name="fm")
    feats = [np.random.default_rng(i).standard_normal((1, 8)).astype(np.float32) for i in range(2)]
    write(tmp_path / "img", {f"{i}": x for i, x in enumerate(samples(2, img.shape))})
    write(tmp_path / "fm", {f"{i}": x for i, x in enumerate(feats)})
    got = list(FolderCalibrationSource([img, fm]))
    assert [set(d) for d in got] == [{"img", "fm"}] * 2
    for d, f in zip(got, feats, strict=True):
        assert d["fm"].dtype == np.float32
        np.testing.assert_array_equal(d["fm"], f)


def test_rgb_to_yuv444_intermediate(tmp_path):
    s = spec(tmp_path / "cal", rt="yuv444", layout="NHWC")
    data = np.zeros(s.shape, np.uint8)
    data[..., 0] = 255  # pure red
    write(tmp_path / "cal", {"0": data})
    (got,) = [d["data"] for d in FolderCalibrationSource([s])]
    np.testing.assert_array_equal(got[0, 0, 0], [76 - 128, 85 - 128, 255 - 128])


def test_bgr_video_range_intermediate(tmp_path):
    s = spec(tmp_path / "cal", train="bgr", rt="yuv444", space_and_range="bt601_video")
    data = samples(1, s.shape)[0]
    write(tmp_path / "cal", {"0": data})
    (got,) = [d["data"] for d in FolderCalibrationSource([s])]
    want = colour.round_to_uint8(colour.bgr_to_yuv444(np.moveaxis(data, 1, -1), "bt601_video"))
    np.testing.assert_array_equal(np.moveaxis(got, 1, -1).astype(int), want.astype(int) - 128)


def test_nv12_intermediate_is_subsampled(tmp_path):
    s = spec(tmp_path / "cal", rt="nv12")
    data = samples(1, s.shape)[0]
    write(tmp_path / "cal", {"0": data})
    (got,) = [d["data"] for d in FolderCalibrationSource([s])]
    chroma = got[0, 1:]
    np.testing.assert_array_equal(chroma, chroma[:, ::2, ::2].repeat(2, axis=1).repeat(2, axis=2))
    yuv = colour.rgb_to_yuv444(np.moveaxis(data, 1, -1))
    np.testing.assert_array_equal(
        got[0, 0].astype(int), colour.round_to_uint8(yuv[0, ..., 0]).astype(int) - 128
    )


def test_reads_lazily(tmp_path):
    s = spec(tmp_path / "cal")
    first, second = samples(2, s.shape)
    write(tmp_path / "cal", {"0": first})
    src = FolderCalibrationSource([s])
    second.tofile(tmp_path / "cal" / "0")  # same size, new content, after construction
    (got,) = [d["data"] for d in src]
    np.testing.assert_array_equal(got.astype(int), second.astype(int) - 128)


def test_preprocess_on_png(tmp_path):
    folder = tmp_path / "imgs"
    folder.mkdir()
    photo = skimage.data.astronaut()[::4, ::4]
    skimage.io.imsave(folder / "b.png", photo)
    skimage.io.imsave(folder / "a.png", photo[::-1])
    s = spec(folder, train="bgr", rt="bgr", shape=[1, 3, 32, 48])
    got = [d["data"] for d in FolderCalibrationSource([s], preprocess_on=True)]
    assert len(got) == 2 and got[0].shape == (1, 3, 32, 48) and got[0].dtype == np.int8
    resized = skimage.transform.resize(photo.astype(float), (32, 48), preserve_range=True)
    want = np.moveaxis(colour.round_to_uint8(resized[..., ::-1]), -1, 0)
    np.testing.assert_array_equal(got[1][0].astype(int), want.astype(int) - 128)


def test_preprocess_on_gray_and_rejects_non_images(tmp_path):
    folder = tmp_path / "imgs"
    folder.mkdir()
    skimage.io.imsave(folder / "cam.png", skimage.data.camera()[::8, ::8])
    s = spec(folder, train="gray", rt="gray", layout="NHWC", shape=[1, 16, 16, 1])
    (got,) = [d["data"] for d in FolderCalibrationSource([s], preprocess_on=True)]
    assert got.shape == (1, 16, 16, 1)
    (folder / "notes.txt").write_text("x")
    with pytest.raises(HbError, match="notes.txt"):
        preflight([s], preprocess_on=True)


def test_random_source_deterministic(tmp_path):
    img = spec(None, rt="nv12", layout="NHWC", shape=[1, 4, 6, 3], name="img")
    fm = spec(None, train="featuremap", rt="featuremap", shape=[2, 5], name="fm")
    src = RandomCalibrationSource([img, fm], num_samples=3, seed=7)
    first, again = list(src), list(src)
    assert len(first) == len(src) == 3
    for a, b in zip(first, again, strict=True):
        np.testing.assert_array_equal(a["img"], b["img"])
        np.testing.assert_array_equal(a["fm"], b["fm"])
    assert first[0]["img"].dtype == np.int8 and first[0]["fm"].dtype == np.float32
    assert not np.array_equal(first[0]["fm"], first[1]["fm"])


def test_dump_layout(tmp_path):
    a = spec(tmp_path / "a", name="images:0")
    b = spec(tmp_path / "b", train="featuremap", rt="featuremap", shape=[1, 4], name="im_info")
    write(tmp_path / "a", {f"{i}": x for i, x in enumerate(samples(2, a.shape))})
    write(tmp_path / "b", {f"{i}": np.ones((1, 4), np.float32) * i for i in range(2)})
    src = FolderCalibrationSource([a, b])
    stale = tmp_path / "work" / "calibration_data" / "im_info" / "5.npy"
    stale.parent.mkdir(parents=True)
    np.save(stale, np.zeros(1))
    root = dump_calibration_data(src, tmp_path / "work")
    assert root == tmp_path / "work" / "calibration_data"
    assert sorted(p.name for p in root.iterdir()) == ["im_info", "images_0"]
    assert sorted(p.name for p in (root / "im_info").iterdir()) == ["0.npy", "1.npy"]
    for i, sample in enumerate(src):
        np.testing.assert_array_equal(np.load(root / "images_0" / f"{i}.npy"), sample["images:0"])
        loaded = np.load(root / "im_info" / f"{i}.npy")
        assert loaded.dtype == np.float32 and loaded[0, 0] == i


def test_image_data_outside_0_255_is_refused_not_clipped(tmp_path):
    """int8 image calibration data (cal_data_type: int8, or the folder debug_mode: dump_calibration_data writes)
    was clipped to 0..255, so most pixels became black and the thresholds came from black pictures."""
    s = spec(tmp_path / "cal")
    pixels = samples(2, s.shape)
    write(tmp_path / "cal", {f"{i}": p for i, p in enumerate(pixels)})
    dumped = dump_calibration_data(FolderCalibrationSource([s]), tmp_path / "work") / "data"
    with pytest.raises(HbError) as e:
        FolderCalibrationSource([spec(dumped)]).check_all()
    first = (np.asarray(pixels[0], np.int16) - 128).astype(np.int8)
    assert str(e.value).startswith(f"calibration file {dumped / '0.npy'} for image input 'data' holds int8 values "
                                   f"from {first.min()} to {first.max()}; an image input takes input_type_train "
                                   "pixels 0..255 (before mean/scale); int8 data is what debug_mode: "
                                   "dump_calibration_data writes"), str(e.value)
    assert "not data for cal_data_dir" in str(e.value)
    write(tmp_path / "i8", {"0": first})
    with pytest.raises(HbError, match=r"0 for image input 'data' holds int8 values from -\d+ to \d+"):
        list(FolderCalibrationSource([spec(tmp_path / "i8", cal_data_type="int8")]))
    write(tmp_path / "i16", {"0": np.full(s.shape, 300, np.int16)})
    with pytest.raises(HbError, match="holds int16 values from 300 to 300; an image input takes") as e:
        list(FolderCalibrationSource([spec(tmp_path / "i16", cal_data_type="int16")]))
    assert "dump_calibration_data" not in str(e.value)
    # int8 pixels within 0..127 are pixels
    write(tmp_path / "dark", {"0": (pixels[1] // 2).astype(np.int8)})
    (got,) = [d["data"] for d in FolderCalibrationSource([spec(tmp_path / "dark", cal_data_type="int8")])]
    np.testing.assert_array_equal(got.astype(int), pixels[1].astype(int) // 2 - 128)


def test_bool_image_data_is_refused_not_read_as_black_pixels(tmp_path):
    """A bool .npy (a mask saved by mistake) was read as pixels 0/1 and calibrated on black pictures."""
    s = spec(tmp_path / "cal")
    write(tmp_path / "cal", {f"{i}.npy": p > 128 for i, p in enumerate(samples(2, s.shape))})
    with pytest.raises(HbError) as e:
        FolderCalibrationSource([s]).check_all()
    assert str(e.value).startswith(f"calibration file {tmp_path / 'cal' / '0.npy'} for image input 'data' holds "
                                   "bool values (True/False), not pixels; an image input takes input_type_train "
                                   "pixels 0..255"), str(e.value)
    assert "uint8 or float32" in str(e.value)
    # a featuremap may be a mask: its 0/1 values are data
    got = next(iter(FolderCalibrationSource([spec(tmp_path / "cal", train="featuremap", rt="featuremap")])))["data"]
    assert got.dtype == np.float32 and set(np.unique(got)) <= {0.0, 1.0}


def test_folder_names_distinct():
    assert folder_names(["a/b", "a:b", "..", "x"]) == {
        "a/b": "a_b",
        "a:b": "a_b_1",
        "..": "input",
        "x": "x",
    }


def test_pictures_without_preprocess_on_are_told_to_set_it(tmp_path):
    """A folder of .jpg files read as raw tensors: the hint used to be about cal_data_type."""
    from skimage import data as pictures
    from skimage.io import imsave

    s = spec(tmp_path / "cal")
    (tmp_path / "cal").mkdir(parents=True, exist_ok=True)
    imsave(tmp_path / "cal" / "0.jpg", pictures.astronaut()[:64, :64])
    with pytest.raises(HbError) as e:
        preflight([s])
    assert "picture" in str(e.value) and "preprocess_on: True" in e.value.hint


def test_wrong_size_suggests_the_model_inputs_own_type(tmp_path):
    """An int64 featuremap written as int64 while the folder reads float32: the size fits int64 and float64
    alike, and the hint names the input's own type."""
    s = spec(tmp_path / "cal", train="featuremap", rt="featuremap", shape=[1, 4], model_dtype="int64")
    write(tmp_path / "cal", {"a.bin": np.arange(4, dtype=np.int64).reshape(1, 4)})
    with pytest.raises(HbError, match="its size fits dtype int64"):
        FolderCalibrationSource([s])


def test_a_link_to_a_folder_in_the_calibration_folder_is_no_sample(tmp_path: Path) -> None:
    """Sub-folders are skipped, and so is a link to one (it was read as a sample of 4096 bytes, with
    advice on cal_data_type); a link to a file is a sample, and a broken link stays for its reader to name."""
    from hbtools.data.folders import sample_files

    folder = tmp_path / "cal"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.bin").write_bytes(b"\0" * 12)
    (tmp_path / "elsewhere.bin").write_bytes(b"\0" * 12)
    (folder / "b.bin").symlink_to(tmp_path / "elsewhere.bin")
    (folder / "c.bin").symlink_to(tmp_path / "gone.bin")
    (folder / "linkdir").symlink_to(folder / "sub", target_is_directory=True)
    assert [p.name for p in sample_files(folder)] == ["a.bin", "b.bin", "c.bin"]
