"""hb_eval_preprocess: recipe outputs, image selection and bad arguments."""

from __future__ import annotations

import math

import numpy as np
import pytest
import skimage.data
import skimage.io
import skimage.transform
import skimage.util
from click.testing import CliRunner

from hbtools.cli.hb_eval_preprocess import main
from hbtools.data.pictures import page_line

LINE = page_line(0, 0, 1)[:, :60]  # grey 19x60: "Regi", narrower than 192 at height 48


@pytest.fixture
def images(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the tool writes its log into the current folder
    folder = tmp_path / "images"
    folder.mkdir()
    skimage.io.imsave(folder / "line.png", LINE, check_contrast=False)
    skimage.io.imsave(folder / "cat.png", skimage.data.chelsea())  # RGB 300x451
    (folder / "notes.txt").write_text("not an image")
    return folder


def run(*args: str):
    return CliRunner().invoke(main, list(args))


def error_lines(result) -> list[str]:
    return [line for line in result.output.splitlines() if " ERROR " in line]


def expected_resize(rgb: np.ndarray, h: int, w: int) -> np.ndarray:
    """BGR uint8 resize computed directly with skimage (bilinear, edge, float32)."""
    out = skimage.transform.resize(rgb[..., ::-1].astype(np.float32), (h, w, 3), order=1,
                                   mode="edge", preserve_range=True)
    return np.clip(np.rint(out), 0, 255).astype(np.uint8)


def test_ppocr_cls_writes_one_text_line_sample_per_image(images, tmp_path):
    result = run("-m", "ppocr_cls", "-i", str(images), "-o", str(tmp_path / "out"))
    assert result.exit_code == 0, result.output
    files = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert files == ["cat.bin", "line.bin"]  # notes.txt is not an image
    line = np.fromfile(tmp_path / "out" / "line.bin", np.uint8).reshape(3, 48, 192)
    width = math.ceil(48 * LINE.shape[1] / LINE.shape[0])
    want = expected_resize(np.repeat(LINE[..., None], 3, axis=-1), 48, width).transpose(2, 0, 1)
    np.testing.assert_array_equal(line[:, :, :width], want)
    assert (line[:, :, width:] == 128).all()  # PaddleOCR's padding before normalisation
    assert "2 image(s)" in result.output


def test_ppocr_det_letterboxes_into_640(images, tmp_path):
    result = run("-m", "ppocr_det", "-i", str(images), "-o", str(tmp_path / "out"))
    assert result.exit_code == 0, result.output
    cat = np.fromfile(tmp_path / "out" / "cat.bin", np.uint8).reshape(3, 640, 640)
    h = int(300 * 640 / 451)  # 425
    want = expected_resize(skimage.data.chelsea(), h, 640).transpose(2, 0, 1)
    np.testing.assert_array_equal(cat[:, :h], want)
    assert (cat[:, h:] == 0).all()


def test_imagenet_cls_resizes_short_side_and_centre_crops(images, tmp_path):
    result = run("-m", "imagenet_cls", "-i", str(images), "-o", str(tmp_path / "out"))
    assert result.exit_code == 0, result.output
    cat = np.fromfile(tmp_path / "out" / "cat.bin", np.uint8).reshape(3, 224, 224)
    w = int(451 * 256 / 300)  # 384: short side 256, as torchvision's Resize(256)
    scaled = skimage.transform.resize(skimage.util.img_as_float(skimage.data.chelsea()), (256, w), order=1)
    crop = scaled[16:240, (w - 224) // 2:(w - 224) // 2 + 224]
    want = np.clip(np.rint(crop * 255), 0, 255).astype(np.uint8).transpose(2, 0, 1)  # RGB, not BGR
    assert np.abs(cat.astype(int) - want).max() <= 1


def test_yolo_letterbox_centres_with_gray_padding(images, tmp_path):
    result = run("-m", "yolo_letterbox_320", "-i", str(images), "-o", str(tmp_path / "out"))
    assert result.exit_code == 0, result.output
    cat = np.fromfile(tmp_path / "out" / "cat.bin", np.uint8).reshape(3, 320, 320)
    h = int(300 * 320 / 451)  # 212 rows of picture, 54 rows of padding above and below
    top = (320 - h) // 2
    want = expected_resize(skimage.data.chelsea(), h, 320)[..., ::-1].transpose(2, 0, 1)  # back to RGB
    np.testing.assert_array_equal(cat[:, top:top + h], want)
    assert (cat[:, :top] == 114).all() and (cat[:, top + h:] == 114).all()
    assert (tmp_path / "out" / "line.bin").stat().st_size == 3 * 320 * 320


def test_val_txt_selects_images_and_ignores_labels(images, tmp_path):
    val = tmp_path / "val.txt"
    val.write_text("cat.png 281\n\n")
    result = run("-m", "ppocr_rec", "-i", str(images), "-o", str(tmp_path / "out"), "-v", str(val))
    assert result.exit_code == 0, result.output
    [only] = list((tmp_path / "out").iterdir())
    assert only.name == "cat.bin" and only.stat().st_size == 3 * 48 * 320


@pytest.mark.parametrize("encoding", ["gbk", "utf-8-sig"])
def test_val_txt_labels_in_any_encoding(images, tmp_path, encoding):
    """Only the first word of a line counts: Chinese labels in GBK stopped the tool with an internal error, and a
    byte-order mark became part of the first name ('1 image(s) ... are not in images, e.g. \ufeffcat.png')."""
    val = tmp_path / "val.txt"
    val.write_bytes("cat.png 猫\nline.png 文字\n".encode(encoding))
    result = run("-m", "ppocr_rec", "-i", str(images), "-o", str(tmp_path / "out"), "-v", str(val))
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["cat.bin", "line.bin"]


def test_hidden_files_are_not_pictures(images, tmp_path):
    """macOS leaves ``._name.png`` beside each picture of an archive: the tool read it as a damaged picture and
    stopped; calibration folders skip hidden files, and so does it."""
    (images / "._cat.png").write_bytes(b"\x00\x05\x16\x07 resource fork")
    result = run("-m", "ppocr_rec", "-i", str(images), "-o", str(tmp_path / "out"))
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["cat.bin", "line.bin"]


def test_help_lists_the_recipes():
    result = run("--help")
    assert result.exit_code == 0
    for name in ("ppocr_cls", "ppocr_det", "ppocr_rec"):
        assert name in result.output
    assert "-v, --val_txt" in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-m", "yolo", "-i", "images", "-o", "out"], "unknown model name 'yolo'"),
        (["-i", "images", "-o", "out"], "missing -m/--model_name"),
        (["-m", "ppocr_cls", "-i", "nowhere", "-o", "out"], "image folder nowhere does not exist"),
        (["-m", "ppocr_cls", "-i", "images", "-o", "out", "-v", "none.txt"], "none.txt does not exist"),
        (["-m", "ppocr_cls", "-i", "images", "-o", "out", "--colour", "bgr"], "No such option"),
    ],
)
def test_bad_arguments_are_one_error_line(images, tmp_path, args, message):
    result = run(*args)
    assert result.exit_code == (2 if message in ("No such option", "missing -m/--model_name") else 1)  # usage: 2
    [line] = error_lines(result)
    assert message in line
    assert "Traceback" not in result.output
    assert not (tmp_path / "out").exists()


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # imageio probing plugins
def test_missing_listed_image_and_unreadable_image_write_nothing(images, tmp_path):
    val = tmp_path / "val.txt"
    val.write_text("cat.png\ndog.png\n")
    result = run("-m", "ppocr_cls", "-i", str(images), "-o", str(tmp_path / "out"), "-v", str(val))
    assert result.exit_code == 1
    [line] = error_lines(result)
    assert "1 image(s) listed" in line and "dog.png" in line

    (images / "zz_broken.png").write_bytes(b"\x89PNG not really")
    result = run("-m", "ppocr_cls", "-i", str(images), "-o", str(tmp_path / "out"))
    assert result.exit_code == 1
    [line] = error_lines(result)
    assert "zz_broken.png" in line
    # cat.png and line.png were fine, but a failed run leaves no output behind, not even the folder it made.
    assert not (tmp_path / "out").exists()


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # imageio probing plugins
def test_failed_or_interrupted_run_removes_only_the_folders_it_made(images, tmp_path, monkeypatch):
    (images / "zz_broken.png").write_bytes(b"\x89PNG not really")
    (tmp_path / "kept").mkdir()  # there before the run: stays, empty
    for target in ("new/deeper/out", "kept"):
        result = run("-m", "ppocr_cls", "-i", str(images), "-o", str(tmp_path / target))
        assert result.exit_code == 1, result.output
    assert not (tmp_path / "new").exists()
    assert (tmp_path / "kept").is_dir() and list((tmp_path / "kept").iterdir()) == []

    (images / "zz_broken.png").unlink()

    def interrupted(path):
        raise KeyboardInterrupt

    # read where it is used: eval_preprocess imports the transformers only when it runs (a light start-up)
    monkeypatch.setattr("hbtools.data.transforms.read_image", interrupted)
    result = run("-m", "ppocr_cls", "-i", str(images), "-o", str(tmp_path / "out"))
    assert result.exit_code == 130, result.output
    assert not (tmp_path / "out").exists()


def test_cmyk_palette_and_grey_alpha_pictures_read_as_their_colours(tmp_path, monkeypatch):
    """Pillow's other modes (CMYK JPEG, palette PNG, grey + alpha PNG) give the same sample as the plain
    RGB / grey picture they were made from: CMYK was taken as RGB(A), grey + alpha refused."""
    import PIL.Image

    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "images"
    folder.mkdir()
    rgb = skimage.data.chelsea()
    grey = skimage.data.camera()
    PIL.Image.fromarray(rgb).save(folder / "rgb.png")
    PIL.Image.fromarray(rgb).convert("CMYK").save(folder / "cmyk.jpg", quality=100)
    PIL.Image.fromarray(grey).save(folder / "grey.png")
    PIL.Image.fromarray(np.dstack([grey, np.full_like(grey, 90)])).save(folder / "grey_alpha.png")
    PIL.Image.fromarray(np.dstack([rgb, np.full(rgb.shape[:2], 200, np.uint8)])).save(folder / "rgba.png")
    result = run("-m", "imagenet_cls", "-i", str(folder), "-o", str(tmp_path / "out"))
    assert result.exit_code == 0, result.output
    sample = {p.stem: np.fromfile(p, np.uint8).astype(int) for p in (tmp_path / "out").iterdir()}
    assert np.array_equal(sample["grey_alpha"], sample["grey"])
    assert np.array_equal(sample["rgba"], sample["rgb"])
    # JPEG and the CMYK round trip cost a few levels, a colour mix-up costs far more.
    assert np.abs(sample["cmyk"] - sample["rgb"]).mean() < 3


@pytest.mark.parametrize(("content", "reason"), [(b"", "the file is empty"),
                                                 (b"\xff\xd8 not a jpeg", "damaged or not an image")])
def test_unreadable_picture_says_why_without_plugin_advice(images, tmp_path, content, reason):
    (images / "zz_bad.jpg").write_bytes(content)
    result = run("-m", "imagenet_cls", "-i", str(images), "-o", str(tmp_path / "out"))
    assert result.exit_code == 1
    [line] = error_lines(result)
    assert "zz_bad.jpg" in line and reason in line
    assert "pip install" not in result.output


def test_image_dir_that_is_a_file_is_named_as_such(images, tmp_path):
    result = run("-m", "imagenet_cls", "-i", str(images / "cat.png"), "-o", str(tmp_path / "out"))
    [line] = error_lines(result)
    assert "is a file, not a folder" in line


def test_tiff_and_webp_pictures_are_read_like_png(tmp_path, monkeypatch):
    """TIFF and WebP pictures (which OpenCV, the vendor tools' reader, takes) were skipped without a word;
    lossless ones give exactly the PNG's sample."""
    import PIL.Image

    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "images"
    folder.mkdir()
    rgb = PIL.Image.fromarray(skimage.data.chelsea())
    rgb.save(folder / "plain.png")
    rgb.save(folder / "scan.tif")
    rgb.save(folder / "scan2.tiff")
    rgb.save(folder / "web.webp", lossless=True)
    result = run("-m", "imagenet_cls", "-i", str(folder), "-o", str(tmp_path / "out"))
    assert result.exit_code == 0, result.output
    sample = {p.stem: np.fromfile(p, np.uint8) for p in (tmp_path / "out").iterdir()}
    assert sorted(sample) == ["plain", "scan", "scan2", "web"]
    for name in ("scan", "scan2", "web"):
        assert np.array_equal(sample[name], sample["plain"]), name


def _vendor_recipes() -> list:
    from hbtools.data.eval_preprocess import RECIPES

    return list({id(r): r for r in RECIPES.values() if r.vendor_size is not None}.values())


@pytest.mark.parametrize("recipe", _vendor_recipes(), ids=lambda r: r.name)
def test_the_vendors_sample_models_write_nv12_under_the_vendors_file_names(recipe, tmp_path, monkeypatch):
    """Board-side evaluation with the vendor's sample models runs `hb_eval_preprocess -m mobilenetv1 ...` and
    reads the original picture size back from the file name: those names were unknown models. Each writes
    the NV12 bytes of its input size, named <file name>_<h>_<w>_<input h>_<input w>.bin."""
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "images"
    folder.mkdir()
    skimage.io.imsave(folder / "cat.png", skimage.data.chelsea())  # RGB 300x451
    name = recipe.aliases[-1] if recipe.aliases else recipe.name
    result = run("-m", name, "-i", str(folder), "-o", str(tmp_path / "out"))
    assert result.exit_code == 0, result.output
    h, w = recipe.vendor_size
    [written] = list((tmp_path / "out").iterdir())
    assert written.name == f"cat.png_300_451_{h}_{w}.bin"
    assert written.stat().st_size == h * w * 3 // 2


@pytest.mark.parametrize(("model", "space"), [("mobilenetv1", "regular"), ("fcos_resnet50", "bt601_video")])
def test_a_vendor_models_nv12_holds_the_picture_in_its_colours(model, space, tmp_path, monkeypatch):
    """The colour order through the vendor's steps (skimage RGB read, CHW, RGB->BGR, BGR->NV12; or OpenCV's
    BGR read and its video-range I420): decoded, the file is the picture's resized crop, not its mirror."""
    from hbtools.data import colour

    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "images"
    folder.mkdir()
    cat = skimage.data.chelsea()
    skimage.io.imsave(folder / "cat.png", cat)
    assert run("-m", model, "-i", str(folder), "-o", str(tmp_path / "out")).exit_code == 0
    [written] = list((tmp_path / "out").iterdir())
    if model == "mobilenetv1":  # short side 256, centre crop 224
        size, crop = (224, 224), skimage.transform.resize(cat, (256, 385), preserve_range=True)[16:240, 80:304]
    else:  # longer side 1024, padded with black to 1024x1024
        size, crop = (1024, 1024), skimage.transform.resize(cat, (681, 1024), preserve_range=True)
    rgb = colour.nv12_to_rgb(np.fromfile(written, np.uint8).reshape(size[0] * 3 // 2, size[1]), space)
    got = rgb[:crop.shape[0], :crop.shape[1]].astype(np.float64)
    assert np.mean(np.abs(got - crop)) < 6, np.mean(np.abs(got - crop))
    swapped = got[..., ::-1]
    assert np.mean(np.abs(swapped - crop)) > 2 * np.mean(np.abs(got - crop))


@pytest.mark.parametrize("model", ["mobilenetv1", "googlenet", "centernet_resnet50"])
def test_the_vendors_eval_preprocess_modules_give_the_same_bytes(model, tmp_path, monkeypatch):
    """The vendor's own eval_preprocess script takes each model's transformers and input size from
    horizon_tc_ui.eval_preprocess (data_transformer.<model>_data_transformer(), conf.MODEL_DICT's read mode)
    and reads the picture with its SingleImageDataLoader: those modules were missing. Done that way, the
    bytes are those hb_eval_preprocess writes."""
    from horizon_tc_ui.eval_preprocess import data_transformer
    from horizon_tc_ui.eval_preprocess.conf import MODEL_DICT
    from horizon_tc_ui.eval_preprocess.dataloader import SingleImageDataLoader

    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "images"
    folder.mkdir()
    skimage.io.imsave(folder / "cat.png", skimage.data.chelsea())
    assert run("-m", model, "-i", str(folder), "-o", str(tmp_path / "out")).exit_code == 0
    [written] = list((tmp_path / "out").iterdir())
    transformers, (h, w) = getattr(data_transformer, f"{model}_data_transformer")()
    image = SingleImageDataLoader(transformers, str(folder / "cat.png"), imread_mode=MODEL_DICT[model]["read_mode"])[0]
    assert written.name == f"cat.png_300_451_{h}_{w}.bin"
    assert image.tobytes() == written.read_bytes()


VENDOR_MODELS = (
    "mobilenetv1 mobilenetv2 googlenet resnet18 efficientnet_lite0 efficientnet_lite1 efficientnet_lite2 "
    "efficientnet_lite3 efficientnet_lite4 vargconvnet yolov2 yolov2_darknet19 yolov3 yolov3_darknet53 "
    "yolov3_vargdarknet yolov4_efficientnetb0 yolov5 yolov5s yolov5x mobilenet_ssd ssd_mobilenetv1 efficientdetd0 "
    "efficient_det mobilenet_unet unet_mobilenet mobilenet_onnx centernet centernet_resnet50 centernet_resnet101 "
    "fcos_efficientnetb0 fcos fcos_resnet50 fcos_resnext deeplabv3plus_efficientnetb0 fastscnn_efficientnetb0 "
    "efficientnasnet_m efficientnasnet_s deeplabv3plus_dilation1248 deeplabv3plus_efficientnetm1 "
    "deeplabv3plus_efficientnetm2 community_qat_fcos_efficientnetb0 community_qat_fcos_efficientnetb2 "
    "community_qat_fcos_efficientnetb3 preq_qat_fcos_efficientnetb0 preq_qat_fcos_efficientnetb1 "
    "preq_qat_fcos_efficientnetb2 preq_qat_fcos_efficientnetb3").split()
# the vendor module's functions whose names are not a model's
VENDOR_FUNCTIONS = {"mobilenet": "mobilenetv1", "deeplabv3plus_efficientnet": "deeplabv3plus_efficientnetm1",
                    "fcos_efficientnetb1": "preq_qat_fcos_efficientnetb1",
                    "fcos_efficientnetb2": "preq_qat_fcos_efficientnetb2",
                    "fcos_efficientnetb3": "preq_qat_fcos_efficientnetb3"}


def test_every_name_of_the_vendors_eval_preprocess_module_is_there():
    """Scripts import the vendor module's functions and its data_transformer_info dict, and pass any of its model
    names to hb_eval_preprocess: vargconvnet was an unknown model, mobilenet_data_transformer and the other
    functions named apart from a model, and the dict, were missing (hunt 43 D13)."""
    from horizon_tc_ui.eval_preprocess import data_transformer

    info = data_transformer.data_transformer_info
    assert set(VENDOR_MODELS) <= set(info), sorted(set(VENDOR_MODELS) - set(info))
    for model in VENDOR_MODELS:
        transformers, size = info[model]
        assert transformers and size == data_transformer.get_data_transformer_info(model)[1], model
    for function, model in VENDOR_FUNCTIONS.items():
        transformers, size = getattr(data_transformer, f"{function}_data_transformer")()
        assert size == info[model][1] and [type(t) for t in transformers] == [type(t) for t in info[model][0]]
