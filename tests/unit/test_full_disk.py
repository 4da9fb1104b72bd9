"""A full disk under the result files (report T5, T10): no empty or cut file, and the ERROR names the file.

The disk is simulated below the writers, at ``open``: a file opened for writing where the test says
gets a budget of bytes shared by all such files; past it, ``write`` raises ENOSPC (or numpy's short
write, an OSError with no errno), after writing what still fits, as a real full disk does.
"""

from __future__ import annotations

import builtins
import errno
import io
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from bin_fixtures import build_bin, invoke

from hbtools.cli import hb_model_info, hb_model_modifier, hb_perf
from hbtools.cli.common import describe
from hbtools.errors import EXIT_SYSTEM, ResourceError
from hbtools.outputs import replace_atomically, write_file

ERROR = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ERROR (.*)$", re.M)


class _Disk:
    def __init__(self, free: int, short_write: bool) -> None:
        self.free, self.short_write = free, short_write


class _LimitedFile:
    """A real open file whose writes stop when the simulated disk is full."""

    def __init__(self, real: Any, disk: _Disk) -> None:
        self._real, self._disk = real, disk

    def write(self, data: Any) -> int:
        n = len(data)
        fits = min(n, self._disk.free)
        self._real.write(data[:fits])
        self._disk.free -= fits
        if fits < n:
            self._real.flush()
            if self._disk.short_write:  # numpy's ndarray.tofile / np.save
                raise OSError(f"{n} requested and {fits} written")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return n

    def __enter__(self) -> _LimitedFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self._real.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


@pytest.fixture
def full_disk(monkeypatch: pytest.MonkeyPatch) -> Callable[..., _Disk]:
    def limit(match: Callable[[str], bool], free: int = 0, *, short_write: bool = False) -> _Disk:
        disk = _Disk(free, short_write)
        real_open = io.open

        def fake_open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
            handle = real_open(file, mode, *args, **kwargs)
            where = os.readlink(f"/proc/self/fd/{file}") if isinstance(file, int) else os.path.abspath(file)
            if any(c in mode for c in "wax+") and match(where):
                return _LimitedFile(handle, disk)
            return handle

        monkeypatch.setattr(builtins, "open", fake_open)
        monkeypatch.setattr(io, "open", fake_open)  # os.fdopen and Path.write_text open through io.open
        return disk

    return limit


@pytest.fixture(autouse=True)
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)  # tools write their logs and results into the current folder
    return tmp_path


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A .bin whose output Softmax runs on the CPU, so hb_model_modifier can delete it."""
    root = tmp_path_factory.mktemp("full_disk")
    return build_bin(root / "resnet", "resnet_like", prefix="resnet",
                     calibration_parameters={"run_on_cpu": "Softmax_0"}).bin


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _one_error(output: str) -> str:
    errors = [e for e in ERROR.findall(output) if not e.startswith("exception in command:")]  # seed framing
    assert len(errors) == 1 and "Traceback" not in output, output
    return errors[0]


@pytest.mark.parametrize("free", [0, 3000, 20000])
def test_hb_perf_on_a_full_disk_leaves_the_previous_report(small: Path, in_tmp: Path, full_disk, free: int) -> None:
    """The report is one set: a run that cannot write all of it leaves the previous one as it was."""
    assert invoke(hb_perf.main, [small]).exit_code == 0
    previous = _visible(_files(in_tmp / "hb_perf_result"))
    full_disk(lambda p: "/hb_perf_result/" in p, free)
    result = invoke(hb_perf.main, [small])
    assert result.exit_code == EXIT_SYSTEM, result.output
    error = _one_error(result.output)
    assert re.search(r"cannot write the results in the hb_perf result folder '[^']*hb_perf_result/resnet': No space "
                     r"left on device; the disk is full", error), error
    assert "run hb_perf from another folder" in error
    assert _visible(_files(in_tmp / "hb_perf_result")) == previous


def _visible(files: dict[str, bytes]) -> dict[str, bytes]:
    """The files a user reads (not the lock and set record of a transaction)."""
    return {name: data for name, data in files.items() if not any(part.startswith(".") for part in Path(name).parts)}


def test_debugger_plot_on_a_full_disk_leaves_no_cut_picture(tmp_path: Path, full_disk) -> None:
    from hbtools.debug import plots

    fig, axes = plots.figure()
    axes[0].plot(np.arange(100), np.sin(np.arange(100)))
    path = tmp_path / "pd" / "w1_HzCalibration_distribution.png"
    full_disk(lambda p: "/pd/" in p, 4096)
    with pytest.raises(ResourceError, match=rf"cannot write '{re.escape(str(path))}': .*the disk is full"):
        plots.save(fig, path)
    assert os.listdir(path.parent) == []


def test_model_info_on_a_full_disk_leaves_no_empty_deleted_nodes_file(small: Path, in_tmp: Path, full_disk) -> None:
    modified = invoke(hb_model_modifier.main, [small, "-a", "Softmax", "-a", "Dequantize", "-o", "mod.bin"])
    assert modified.exit_code == 0, modified.output
    full_disk(lambda p: "deleted_nodes_info" in p, 0)
    result = invoke(hb_model_info.main, ["mod.bin"])
    assert result.exit_code == EXIT_SYSTEM, result.output
    assert "cannot write 'deleted_nodes_info.txt': No space left on device; the disk is full" in \
        _one_error(result.output)
    assert not [p for p in os.listdir(in_tmp) if "deleted_nodes_info" in p]


def test_verifier_dump_short_write_is_a_full_disk_leaving_the_previous_dump(tmp_path: Path, full_disk) -> None:
    """The dump is one set: a disk that fills up under it leaves the previous dump as it was."""
    from hbtools.tools.verifier import Verification, save_dumps

    save_dumps(Verification([], [], {"old": np.zeros(3)}, {"old": np.zeros(3)}), tmp_path / "dump")
    previous = _visible(_files(tmp_path / "dump"))
    value = np.arange(5000, dtype=np.int32)
    full_disk(lambda p: "/dump/" in p, 2016, short_write=True)
    with pytest.raises(ResourceError) as caught:
        save_dumps(Verification([], [], {"out": value}, {"out": value}), tmp_path / "dump")
    assert str(caught.value).startswith(f"cannot write the results in the hb_verifier dump folder "
                                        f"'{tmp_path / 'dump'}': could not write all of it (")
    assert "the disk is full" in str(caught.value) and "permission" not in str(caught.value)
    assert _visible(_files(tmp_path / "dump")) == previous
    assert not (tmp_path / "dump" / ".hbtools_staging").exists()


def test_a_bare_short_write_reads_as_a_full_disk_not_permissions() -> None:
    """What reaches the CLI's last resort unnamed (numpy's tofile on a full disk) says the disk is full."""
    code, lines = describe(OSError("4096 requested and 2016 written"))
    assert code == EXIT_SYSTEM
    assert lines == ["cannot write: could not write all of it (4096 requested and 2016 written); "
                     "the disk is full; free some space or choose another disk"]


def test_replace_atomically_keeps_the_previous_file_and_names_it(tmp_path: Path, full_disk) -> None:
    path = tmp_path / "out" / "a.png"
    path.parent.mkdir()
    write_file(path, b"previous")
    full_disk(lambda p: "/out/" in p, 10)
    with pytest.raises(OSError) as caught:
        replace_atomically(path, lambda fh: fh.write(b"x" * 100))
    assert caught.value.errno == errno.ENOSPC and caught.value.filename == str(path)
    assert path.read_bytes() == b"previous" and os.listdir(path.parent) == ["a.png"]
