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
