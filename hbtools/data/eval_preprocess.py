"""``hb_eval_preprocess``: turn a folder of images into model input files by recipe.

A recipe is the preprocessing one sample model needs, written with the transformers
of ``hbtools.data.transforms``. Every output file is a raw ``numpy.tofile`` dump of
one image in the model's run-time input format (the same format as its calibration
data, so the files also work as ``cal_data_dir`` content or ``hb_mapper infer`` input).
Images are read with scikit-image; the PP-OCR and YOLO recipes first bring them to
what OpenCV would have read (uint8 BGR), because those projects' own preprocessing
starts from there.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from hbtools.data.folders import sample_files
from hbtools.errors import HbError
from hbtools.outputs import create_dir, write_array
from hbtools.runs.signals import signals_deferred

if TYPE_CHECKING:
    from hbtools.data.transforms import Compose, Transformer

# numpy, scikit-image and the transformers are imported where they are used: the recipe table is read
# by hb_eval_preprocess --help and at start-up, where a Ctrl-C during a 0.7 s import was a traceback.

log = logging.getLogger("hbtools")
SCRATCH_PREFIX = ".hb_eval_preprocess_"


@dataclass(frozen=True)
class Recipe:
    name: str
    summary: str  # one line for --help
    output: str  # what each output file holds
    # The steps after the picture is read: as scikit-image reads it (RGB floats) or, with ``read`` 'opencv',
    # brought to what OpenCV reads (uint8 BGR). horizon_tc_ui.eval_preprocess hands both to the vendor's scripts.
    steps: Callable[[], list[Transformer]]
    read: str = "skimage"
    # The vendor's file names, <image file name>_<org h>_<org w>_<dst h>_<dst w>.bin (board-side evaluation
    # scripts read the original size back from them), for its models: the model's input (h, w).
    vendor_size: tuple[int, int] | None = None
    aliases: tuple[str, ...] = ()  # other -m names of the same preprocessing

    def pipeline(self) -> Compose:
        """The steps applied to a picture as read here (scikit-image)."""
        from hbtools.data.transforms import Compose, opencv_like

        return Compose([*(opencv_like() if self.read == "opencv" else []), *self.steps()])

    def output_name(self, image: Path, height: int, width: int) -> str:
        """The file ``image`` (``height`` x ``width`` pixels as read) is written to."""
        if self.vendor_size is None:
            return f"{image.stem}.bin"
        return f"{image.name}_{height}_{width}_{self.vendor_size[0]}_{self.vendor_size[1]}.bin"


def _text_line(width: int) -> Callable[[], list[Transformer]]:
    def transformers() -> list[Transformer]:
        from hbtools.data.transforms import HWC2CHWTransformer, TextLineResizeTransformer

        return [TextLineResizeTransformer((48, width)), HWC2CHWTransformer()]

    return transformers


def _det() -> list[Transformer]:
    from hbtools.data.transforms import F32ToU8Transformer, HWC2CHWTransformer, PadResizeTransformer

    # Letterbox into the fixed 640x640 input; the image stays in the top-left corner so
    # boxes map back by one scale factor. Black padding holds no text for DB-Net to find.
    # Resampled by scikit-image ('bilinear'); PadResize gives float32 (as the vendor's), of whole values here.
    return [PadResizeTransformer(640, pad_value=0, pad_position="bottom_right", interpolation="bilinear"),
            F32ToU8Transformer(rounding=True), HWC2CHWTransformer()]


def _imagenet() -> list[Transformer]:
    from hbtools.data.transforms import (
        CenterCropTransformer,
        F32ToU8Transformer,
        HWC2CHWTransformer,
        ScaleTransformer,
        ShortSideResizeTransformer,
    )

    # torchvision's evaluation transform without ToTensor/Normalize: the mean/std belong in
    # the config (norm_type data_mean_and_scale), so the file holds the uint8 RGB crop. Resampled by
    # scikit-image ('bilinear', anti-aliased as torchvision's), in the picture's float64 (data_type None).
    return [ShortSideResizeTransformer(256, data_type=None, interpolation="bilinear"),
            CenterCropTransformer(224, data_type=None), ScaleTransformer(scale_value=255),
            F32ToU8Transformer(rounding=True), HWC2CHWTransformer()]


def _yolo(size: int) -> Callable[[], list[Transformer]]:
    # Ultralytics' letterbox: centred, padding 114 gray, then BGR -> RGB; /255 goes in the config.
    def transformers() -> list[Transformer]:
        from hbtools.data.transforms import (
            BGR2RGBTransformer,
            F32ToU8Transformer,
            HWC2CHWTransformer,
            PadResizeTransformer,
        )

        return [PadResizeTransformer(size, pad_value=114, pad_position="boundary", interpolation="bilinear"),
                F32ToU8Transformer(rounding=True), BGR2RGBTransformer(data_format="HWC"), HWC2CHWTransformer()]

    return transformers


class _Transforms:
    """``hbtools.data.transforms``, imported when a recipe's steps are first made (not at start-up)."""

    def __getattr__(self, name: str) -> object:
        from hbtools.data import transforms

        return getattr(transforms, name)


def _vendor_recipes() -> list[Recipe]:
    """The models of the vendor's hb_eval_preprocess, with its preprocessing: NV12 bytes ``(h * 3 // 2, w)``
    of the model's input size, for the board's nv12 input. Names that share a preprocessing are aliases."""
    t = _Transforms()

    def nv12(name: str, read: str, size: tuple[int, int], steps: Callable[[], list], what: str,
             *aliases: str) -> Recipe:
        return Recipe(name, f"vendor sample: {what}", f"uint8 NV12 {size[0] * 3 // 2}x{size[1]} (rows x bytes)",
                      steps, read, vendor_size=size, aliases=aliases)

    def imagenet_bgr() -> list:
        return [t.ShortSideResizeTransformer(short_size=256), t.CenterCropTransformer(crop_size=224),
                t.HWC2CHWTransformer(), t.RGB2BGRTransformer(data_format="CHW"), t.ScaleTransformer(255),
                t.BGR2NV12Transformer(data_format="CHW")]

    def imagenet_rgb() -> list:
        return [t.ShortSideResizeTransformer(short_size=256), t.CenterCropTransformer(crop_size=224),
                t.HWC2CHWTransformer(), t.ScaleTransformer(255), t.RGB2NV12Transformer(data_format="CHW")]

    def vargconvnet() -> list:
        return [t.ResizeTransformer(target_size=(256, 256)), t.CenterCropTransformer(crop_size=224),
                t.HWC2CHWTransformer(), t.RGB2NV12Transformer(data_format="CHW")]

    def googlenet() -> list:
        return [t.ShortSideResizeTransformer(short_size=256), t.CenterCropTransformer(crop_size=224),
                t.BGR2NV12Transformer(data_format="HWC")]

    def lite(size: int) -> Callable[[], list]:
        return lambda: [t.PaddedCenterCropTransformer(image_size=size, crop_pad=32),
                        t.ResizeTransformer(target_size=(size, size), mode="skimage", method=3),
                        t.HWC2CHWTransformer(), t.ScaleTransformer(255), t.RGB2NV12Transformer(data_format="CHW")]

    def yolo(size: int) -> Callable[[], list]:
        return lambda: [t.PadResizeTransformer(target_size=(size, size)), t.HWC2CHWTransformer(),
                        t.BGR2RGBTransformer(data_format="CHW"), t.RGB2NV12Transformer(data_format="CHW")]

    def stretched(size: tuple[int, int], rgb_first: bool = False) -> Callable[[], list]:
        if rgb_first:
            return lambda: [t.ResizeTransformer(size), t.BGR2RGBTransformer(data_format="HWC"),
                            t.RGB2NV12Transformer(data_format="HWC", cvt_mode="opencv")]
        return lambda: [t.ResizeTransformer(size), t.BGR2NV12Transformer(data_format="HWC", cvt_mode="opencv")]

    def fcos(size: int) -> Callable[[], list]:
        return lambda: [t.PadResizeTransformer((size, size), pad_position="bottom_right", pad_value=0),
                        t.BGR2NV12Transformer(data_format="HWC", cvt_mode="opencv")]

    def nasnet(size: int) -> Callable[[], list]:
        return lambda: [t.BGR2RGBTransformer(data_format="HWC"),
                        t.ShortSideResizeTransformer(short_size=256, data_type="uint8", interpolation="INTER_CUBIC"),
                        t.CenterCropTransformer(crop_size=224, data_type="uint8"),
                        t.ResizeTransformer(target_size=(size, size), data_type="uint8", mode="opencv", method=1,
                                            interpolation="INTER_CUBIC"),
                        t.RGB2NV12Transformer(data_format="HWC", cvt_mode="opencv")]

    def yolov4() -> list:
        return [t.PadResizeTransformer(target_size=(512, 512), pad_position="bottom_right"),
                t.BGR2NV12Transformer(data_format="HWC")]

    def ssd() -> list:
        return [t.ResizeTransformer(target_size=(300, 300), mode="opencv", method=1), t.HWC2CHWTransformer(),
                t.BGR2NV12Transformer(data_format="CHW")]

    def efficientdet() -> list:
        return [t.PadResizeTransformer(target_size=(512, 512), pad_value=0.0, pad_position="bottom_right"),
                t.HWC2CHWTransformer(), t.BGR2RGBTransformer(data_format="CHW"),
                t.RGB2NV12Transformer(data_format="CHW")]

    def centernet() -> list:
        return [t.BGR2RGBTransformer(data_format="HWC"), t.WarpAffineTransformer((512, 512), 1.0),
                t.HWC2CHWTransformer(), t.RGB2NV12Transformer(data_format="CHW")]

    def fcos_big() -> list:
        return [t.PadTransformer(size_divisor=1024, target_size=1024),
                t.BGR2NV12Transformer(data_format="HWC", cvt_mode="opencv")]

    city = (1024, 2048)
    lites = [nv12(f"efficientnet_lite{k}", "skimage", (s, s), lite(s), f"EfficientNet-Lite{k} padded centre crop {s}")
             for k, s in enumerate((224, 240, 260, 280, 300))]
    return [
        nv12("mobilenetv1", "skimage", (224, 224), imagenet_bgr, "short side 256, centre crop 224 (BGR)",
             "mobilenetv2", "resnet18"),
        nv12("mobilenet_onnx", "skimage", (224, 224), imagenet_rgb, "short side 256, centre crop 224 (RGB)"),
        nv12("googlenet", "opencv", (224, 224), googlenet, "short side 256, centre crop 224"),
        nv12("vargconvnet", "skimage", (224, 224), vargconvnet, "resize to 256x256, centre crop 224"),
        *lites,
        nv12("yolov2", "opencv", (608, 608), yolo(608), "letterbox 608", "yolov2_darknet19"),
        nv12("yolov3", "opencv", (416, 416), yolo(416), "letterbox 416", "yolov3_darknet53"),
        nv12("yolov5", "opencv", (672, 672), yolo(672), "letterbox 672", "yolov5s", "yolov5x"),
        nv12("yolov3_vargdarknet", "opencv", (416, 416), stretched((416, 416)), "resize to 416"),
        nv12("yolov4_efficientnetb0", "opencv", (512, 512), yolov4, "letterbox 512, bottom-right"),
        nv12("ssd_mobilenetv1", "opencv", (300, 300), ssd, "resize to 300", "mobilenet_ssd"),
        nv12("efficientdetd0", "opencv", (512, 512), efficientdet, "letterbox 512, black, bottom-right",
             "efficient_det"),
        nv12("unet_mobilenet", "opencv", city, stretched(city, rgb_first=True), "resize to 1024x2048",
             "mobilenet_unet"),
        nv12("centernet", "opencv", (512, 512), centernet, "affine warp into 512", "centernet_resnet50",
             "centernet_resnet101"),
        nv12("fcos_efficientnetb0", "opencv", (512, 512), fcos(512), "letterbox 512, black, bottom-right", "fcos",
             "community_qat_fcos_efficientnetb0", "preq_qat_fcos_efficientnetb0"),
        nv12("preq_qat_fcos_efficientnetb1", "opencv", (640, 640), fcos(640), "letterbox 640, black, bottom-right"),
        nv12("community_qat_fcos_efficientnetb2", "opencv", (768, 768), fcos(768),
             "letterbox 768, black, bottom-right", "preq_qat_fcos_efficientnetb2"),
        nv12("community_qat_fcos_efficientnetb3", "opencv", (896, 896), fcos(896),
             "letterbox 896, black, bottom-right", "preq_qat_fcos_efficientnetb3"),
        nv12("fcos_resnet50", "opencv", (1024, 1024), fcos_big, "longer side 1024, padded to 1024", "fcos_resnext"),
        nv12("deeplabv3plus_efficientnetb0", "opencv", city, stretched(city), "resize to 1024x2048",
             "fastscnn_efficientnetb0", "deeplabv3plus_dilation1248", "deeplabv3plus_efficientnetm1",
             "deeplabv3plus_efficientnetm2"),
        nv12("efficientnasnet_m", "opencv", (300, 300), nasnet(300), "short side 256, crop 224, resize 300"),
        nv12("efficientnasnet_s", "opencv", (280, 280), nasnet(280), "short side 256, crop 224, resize 280"),
    ]


RECIPES: dict[str, Recipe] = {
    r.name: r
    for r in (
        Recipe("ppocr_cls", "PP-OCR text-direction classifier: text-line crop -> height 48, "
               "padded to width 192", "uint8 BGR 1x3x48x192 (NCHW)", _text_line(192), "opencv"),
        Recipe("ppocr_det", "PP-OCRv4 text detector: letterbox into 640x640 (top-left, "
               "black padding)", "uint8 BGR 1x3x640x640 (NCHW)", _det, "opencv"),
        Recipe("ppocr_rec", "PP-OCRv4 text recogniser: text-line crop -> height 48, "
               "padded to width 320", "uint8 BGR 1x3x48x320 (NCHW)", _text_line(320), "opencv"),
        Recipe("imagenet_cls", "ImageNet-style classifier (ResNet, MobileNet, EfficientNet): short side "
               "256, centre crop 224", "uint8 RGB 1x3x224x224 (NCHW)", _imagenet),
        Recipe("yolo_letterbox", "YOLOv5/v8-style detector: letterbox into 640x640 (centred, "
               "padding 114)", "uint8 RGB 1x3x640x640 (NCHW)", _yolo(640), "opencv"),
        Recipe("yolo_letterbox_320", "the same letterbox into 320x320", "uint8 RGB 1x3x320x320 (NCHW)",
               _yolo(320), "opencv"),
    )
}
# The vendor's model names (their aliases too) after ours; only --help lists each recipe once.
RECIPES.update({name: r for r in _vendor_recipes() for name in (r.name, *r.aliases)})


def model_names() -> str:
    """The -m names, for a hint: ours, then the vendor's sample models by example."""
    ours = [n for n, r in RECIPES.items() if r.vendor_size is None]
    return f"{', '.join(ours)}, or a vendor sample model (mobilenetv1, yolov5s, centernet, ...; " \
           "hb_eval_preprocess --help lists them all)"


def recipe(name: str) -> Recipe:
    if name not in RECIPES:
        from hbtools.config.values import closest_names

        raise HbError(f"unknown model name {name!r}{closest_names(name, list(RECIPES))}",
                      hint=f"use one of: {model_names()}")
    return RECIPES[name]


def list_images(image_dir: Path, val_txt: Path | None = None) -> list[Path]:
    """The images to process: those named in ``val_txt`` (first word of each line,
    relative to ``image_dir``), else every image file in ``image_dir`` in natural name order (hidden files,
    such as macOS's ``._name.jpg``, are not images)."""
    from hbtools.data.images import IMAGE_EXTENSIONS

    if not image_dir.is_dir():
        state = "is a file, not a folder" if image_dir.exists() else "does not exist"
        raise HbError(f"image folder {image_dir} {state}", hint="pass an existing folder with -i")
    if val_txt is None:
        files = [p for p in sample_files(image_dir) if p.suffix.lower() in IMAGE_EXTENSIONS]
        if not files:
            raise HbError(f"no images ({', '.join(IMAGE_EXTENSIONS)}) in {image_dir}")
        return files
    if not val_txt.is_file():
        raise HbError(f"val_txt file {val_txt} does not exist")
    # Only the first word counts: labels in another encoding (a GBK val.txt) and a byte-order mark do not
    # matter, and names that are not UTF-8 are read as the file system gives such names (surrogateescape).
    text = val_txt.read_bytes().decode("utf-8-sig", "surrogateescape")
    names = [line.split()[0] for line in text.splitlines() if line.strip()]
    if not names:
        raise HbError(f"val_txt file {val_txt} names no images")
    missing = [n for n in names if not (image_dir / n).is_file()]
    if missing:
        raise HbError(f"{len(missing)} image(s) listed in {val_txt} are not in {image_dir}, "
                      f"e.g. {missing[0]}")
    return [image_dir / n for n in names]


def preprocess_folder(model_name: str, image_dir: Path, output_dir: Path,
                      val_txt: Path | None = None,
                      progress: Callable[[Path], None] | None = None) -> list[Path]:
    """Preprocess the images with the recipe of ``model_name`` into ``output_dir``.

    Files are written to a scratch folder first and moved into ``output_dir`` only
    when every image succeeded, so a failure leaves nothing half-written.
    """
    chosen = recipe(model_name)
    pipeline = chosen.pipeline()
    images = list_images(image_dir, val_txt)
    keys = [p.stem if chosen.vendor_size is None else p.name for p in images]  # what the output name keeps
    clashes = sorted({f"{k}.bin" for k in keys if keys.count(k) > 1})
    if clashes:
        raise HbError(f"several images would be written to {clashes[0]} (same name, other "
                      "extension)", hint="keep one image per file name stem")
    if output_dir.exists() and not output_dir.is_dir():
        raise HbError(f"output path {output_dir} exists and is not a folder")
    # The folders this run makes go again if it fails or is interrupted: a failed run leaves nothing behind.
    made = [p for p in (output_dir, *output_dir.parents) if not p.exists() and not p.is_symlink()]
    create_dir(output_dir, "the -o/--output_dir folder")
    try:
        return _preprocess_into(chosen, pipeline, images, output_dir, progress)
    except BaseException:
        for folder in made:  # deepest first; one that is not empty (someone else's files) stays
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise



def _preprocess_into(chosen: Recipe, pipeline: Compose, images: list[Path],
                     output_dir: Path, progress: Callable[[Path], None] | None) -> list[Path]:
    import numpy as np

    from hbtools.data.transforms import read_image

    _remove_stale_scratch(output_dir)
    scratch, owner = _own_scratch(output_dir)
    names = []
    try:
        for image in images:
            picture = read_image(image)
            names.append(chosen.output_name(image, *picture.shape[:2]))
            sample = np.ascontiguousarray(pipeline(picture))
            write_array(scratch / names[-1], sample)
            if progress is not None:
                progress(image)
        written = []
        with signals_deferred(str(output_dir)):  # Ctrl-C half-way would leave old and new results mixed
            for name in names:
                target = output_dir / name
                (scratch / name).replace(target)
                written.append(target)
        return written
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        os.close(owner)


def _own_scratch(output_dir: Path) -> tuple[Path, int]:
    """A new scratch folder in ``output_dir`` and an fd holding its ``flock`` for as long as this run lives.

    The lock tells a later run that the folder is in use: the kernel drops it when its process dies,
    also of SIGKILL, so a folder nobody holds is a killed run's leftover. Another run may remove a new
    folder before it is locked; then it no longer is the folder at that name, and a new one is made.
    """
    while True:
        scratch = Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX, dir=output_dir))
        fd = _locked(scratch)
        if fd is None:
            continue
        with contextlib.suppress(OSError):
            if os.stat(scratch).st_ino == os.fstat(fd).st_ino:
                return scratch, fd
        os.close(fd)  # removed (and perhaps made again) by another run meanwhile: not ours


def _remove_stale_scratch(output_dir: Path) -> None:
    """Remove the scratch folders of earlier runs that were killed (SIGKILL, the OOM killer, power loss).

    A folder whose lock is held belongs to a run still going (two runs into one folder) and stays.
    """
    for folder in output_dir.glob(f"{SCRATCH_PREFIX}*"):
        fd = _locked(folder)
        if fd is None:
            continue  # a live run's, gone meanwhile, or not a folder: not ours to touch
        try:
            shutil.rmtree(folder, ignore_errors=True)
            log.info("removed %s, the scratch folder of an earlier run that was killed", folder)
        finally:
            os.close(fd)


def _locked(folder: Path) -> int | None:
    """An fd of ``folder`` holding its exclusive ``flock``, or None where it is gone or another run holds it."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd
