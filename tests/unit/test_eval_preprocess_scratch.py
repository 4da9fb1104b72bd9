"""hb_eval_preprocess's scratch folders (report T8): a killed run's are removed by the next run, a live
run's stay, and a Ctrl-C while the results are moved into place lands after the last one."""

from __future__ import annotations

import fcntl
import logging
import os
import signal
from pathlib import Path

import numpy as np
import pytest
import skimage.io
from bin_fixtures import logger_restored

from hbtools.data.eval_preprocess import preprocess_folder
from hbtools.log import setup

SCRATCH_PREFIX = ".hb_eval_preprocess_"  # what a run names its scratch folder in the -o folder


@pytest.fixture
def images(tmp_path: Path) -> Path:
    folder = tmp_path / "images"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for k in range(4):
        skimage.io.imsave(folder / f"img{k}.png", rng.integers(0, 256, (40, 60, 3), dtype=np.uint8),
                          check_contrast=False)
    return folder


def _killed_run_scratch(out: Path, name: str = "x1y2z3") -> Path:
    """What a SIGKILLed run leaves: a scratch folder with finished files and nobody holding it."""
    scratch = out / f"{SCRATCH_PREFIX}{name}"
    scratch.mkdir(parents=True)
    (scratch / "img0.bin").write_bytes(b"\0" * 100)
    return scratch


def test_a_killed_runs_scratch_folder_is_removed_by_the_next_run(images: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    stale = [_killed_run_scratch(out, n) for n in ("aaaa", "bbbb")]
    with logger_restored():
        setup(None)
        written = preprocess_folder("ppocr_cls", images, out)
    assert not any(p.exists() for p in stale)
    assert sorted(os.listdir(out)) == sorted(p.name for p in written) == [f"img{k}.bin" for k in range(4)]


def test_a_live_runs_scratch_folder_stays(images: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    live = _killed_run_scratch(out)
    fd = os.open(live, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # as the other run holds it while it works
        with logger_restored():
            setup(None)
            preprocess_folder("ppocr_cls", images, out)
        assert (live / "img0.bin").read_bytes() == b"\0" * 100
    finally:
        os.close(fd)
    assert sorted(os.listdir(out)) == sorted([live.name, *(f"img{k}.bin" for k in range(4))])


def test_ctrl_c_while_the_results_are_moved_lands_after_the_last_one(images: Path, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch,
                                                                     caplog: pytest.LogCaptureFixture,
                                                                     ctrl_c: None) -> None:
    out = tmp_path / "out"
    out.mkdir()
    for k in range(4):
        (out / f"img{k}.bin").write_bytes(b"old")
    real_replace = Path.replace

    def replace(self: Path, target: Path) -> Path:
        if self.name == "img1.bin":
            signal.raise_signal(signal.SIGINT)  # a real Ctrl-C, half-way through the moves
        return real_replace(self, target)

    monkeypatch.setattr(Path, "replace", replace)
    with caplog.at_level(logging.WARNING, "hbtools"), pytest.raises(KeyboardInterrupt):
        preprocess_folder("ppocr_cls", images, out)
    assert [(out / f"img{k}.bin").read_bytes() != b"old" for k in range(4)] == [True] * 4  # all new, none old
    assert sorted(os.listdir(out)) == [f"img{k}.bin" for k in range(4)]  # the scratch folder went too
    assert f"SIGINT arrived while the new results were moved into place; the move was completed first, so {out} " \
           "holds the complete new set" in caplog.text
