"""An output on a read-only file system is reported as such, not as a missing permission (hunt 38 D11)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from hbtools.errors import ResourceError
from hbtools.outputs import output_file


@pytest.fixture
def read_only_folder(tmp_path: Path):
    folder = tmp_path / "ro"
    folder.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(folder)],
                             capture_output=True).returncode == 0
    if not mounted:
        pytest.skip("mounting a read-only tmpfs needs root")
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], capture_output=True)


def test_an_output_on_a_read_only_file_system_says_so(read_only_folder: Path) -> None:
    with pytest.raises(ResourceError, match="is on a read-only file system; choose a path on a writable one"):
        output_file(read_only_folder / "x.bin", "-o")


def test_a_failed_run_into_a_new_folder_leaves_no_folder(tmp_path: Path) -> None:
    """hunt 38 D10: a run that failed inside its transaction (a full disk when it wrote its lock, here an error of
    the run itself) left the folder it had created, holding only its lock file."""
    from hbtools.runs.transaction import artefact_transaction

    target = tmp_path / "new" / "results"
    with pytest.raises(RuntimeError, match="the run failed"), artefact_transaction(target) as staging:
        (staging / "half.txt").write_text("half")
        raise RuntimeError("the run failed")
    assert not (tmp_path / "new").exists()
    kept = tmp_path / "kept"
    kept.mkdir()
    with pytest.raises(RuntimeError), artefact_transaction(kept):
        raise RuntimeError("the run failed")
    assert kept.is_dir()  # a folder that was there before stays
