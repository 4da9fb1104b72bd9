"""An artefact set replaces the previous one as a whole (SPEC §6, §10).

Found by a hunt over interrupts and file-system trouble: a prefix starting with '.' lost the
whole set at the commit, a folder where a file goes was found half-way through the moves (a
mixed set, then every later run refused), and parts of the previous set the new run does not
make (a calibration_data dump, the pages of more subgraphs) stayed next to a model they do not
belong to.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hbtools.errors import ConfigError, ResourceError
from hbtools.runs import transaction


def _write(folder: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def _run(working_dir: Path, files: dict[str, str], set_name: str = "m", **kwargs: object) -> None:
    with transaction.artefact_transaction(working_dir, set_name=set_name, **kwargs) as staging:
        _write(staging, files)


def _tree(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): p.read_text() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != transaction.LOCK_NAME}


def test_a_prefix_starting_with_a_dot_is_moved_in_like_any_other(tmp_path: Path) -> None:
    _run(tmp_path, {".m.bin": "bin", ".m_quantized_model.onnx": "q", ".m.html": "page"}, set_name=".m")
    assert (tmp_path / ".m.bin").read_text() == "bin" and (tmp_path / ".m_quantized_model.onnx").read_text() == "q"
    assert not (tmp_path / transaction.STAGING_NAME).exists()


def test_a_folder_where_a_file_goes_is_refused_before_anything_moves(tmp_path: Path) -> None:
    _run(tmp_path, {"m.bin": "old bin", "m.html": "old page"})
    (tmp_path / "m_quantized_model.onnx").mkdir()
    before = _tree(tmp_path)
    with pytest.raises(ResourceError) as info:
        _run(tmp_path, {"m.bin": "new bin", "m.html": "new page", "m_quantized_model.onnx": "q"})
    message = " ".join(info.value.lines())
    assert str(tmp_path / "m_quantized_model.onnx") in message and "remove or rename it" in message, message
    assert ".hbtools_staging" not in message
    assert _tree(tmp_path) == before and not (tmp_path / transaction.STAGING_NAME).exists()
    (tmp_path / "m_quantized_model.onnx").rmdir()  # as the message says: the next run goes through
    _run(tmp_path, {"m.bin": "new bin", "m_quantized_model.onnx": "q"})
    assert (tmp_path / "m.bin").read_text() == "new bin"


def test_entries_of_the_previous_set_it_does_not_make_are_removed(tmp_path: Path) -> None:
    _run(tmp_path, {"m.bin": "1", "m_subgraph_0.html": "1", "m_subgraph_1.html": "1", "calibration_data/x/0.npy": "1"})
    _run(tmp_path, {"other.bin": "other set"}, set_name="other")  # another prefix in the same folder
    _run(tmp_path, {"m.bin": "2", "m_subgraph_0.html": "2"})
    assert _tree(tmp_path) == {"m.bin": "2", "m_subgraph_0.html": "2", "other.bin": "other set",
                               ".hbtools_set_m.json": json.dumps(["m.bin", "m_subgraph_0.html"]),
                               ".hbtools_set_other.json": json.dumps(["other.bin"])}


def test_what_a_run_reads_is_never_replaced_or_removed(tmp_path: Path) -> None:
    _run(tmp_path, {"m.bin": "1", "calibration_data/x/0.npy": "dumped"})
    reused = tmp_path / "calibration_data" / "x"  # the previous dump given as this run's cal_data_dir
    _run(tmp_path, {"m.bin": "2"}, inputs=[reused])
    assert (reused / "0.npy").read_text() == "dumped"
    with pytest.raises(ConfigError) as info:
        _run(tmp_path, {"m.bin": "3", "calibration_data/x/0.npy": "new dump"}, inputs=[reused])
    assert "is an input of this run" in str(info.value) and (reused / "0.npy").read_text() == "dumped"
    assert (tmp_path / "m.bin").read_text() == "2"
    with pytest.raises(ConfigError):
        transaction.check_inputs_outside(tmp_path, ["m.html"], [tmp_path / "m.html"])


def test_what_follows_the_commit_runs_before_a_held_ctrl_c(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A Ctrl-C after the new set is in place but before the run said so is held until it has: the
    log never ends "successfully" and then "interrupted" without saying the set was replaced."""
    import logging
    import signal

    said: list[str] = []
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    logging.getLogger("hbtools").addHandler(caplog.handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            with transaction.artefact_transaction(
                    tmp_path, set_name="m", committed=lambda: (signal.raise_signal(signal.SIGINT),
                                                               said.append("End Model Convert"))) as staging:
                (staging / "m.bin").write_text("new")
    finally:
        signal.signal(signal.SIGINT, previous)
        logging.getLogger("hbtools").removeHandler(caplog.handler)
    assert said == ["End Model Convert"] and (tmp_path / "m.bin").read_text() == "new"
    assert "complete new set" in caplog.text


def test_an_entry_two_sets_make_belongs_to_the_last_that_made_it(tmp_path: Path) -> None:
    """Two prefixes in one working_dir both dump ``calibration_data/`` (its name is not the prefix's): the second
    dump is the second set's, so the first set's next run without a dump left it alone (it deleted it, silently),
    and the first set's manifest no longer claims it (the debugger would pair that model with the other's data)."""
    _run(tmp_path, {"a.bin": "a", "calibration_data/x.npy": "a's samples"}, set_name="a")
    _run(tmp_path, {"b.bin": "b", "calibration_data/x.npy": "b's samples"}, set_name="b")
    assert "calibration_data" not in json.loads((tmp_path / ".hbtools_set_a.json").read_text())
    _run(tmp_path, {"a.bin": "a again"}, set_name="a")
    assert (tmp_path / "calibration_data" / "x.npy").read_text() == "b's samples"
    _run(tmp_path, {"b.bin": "b again"}, set_name="b")  # its owner's run without a dump removes it
    assert not (tmp_path / "calibration_data").exists()
    assert (tmp_path / "a.bin").read_text() == "a again" and (tmp_path / "b.bin").read_text() == "b again"


def test_a_folder_in_use_is_named_as_the_tool_names_it(tmp_path: Path) -> None:
    """The lock's message spoke of makertbin's working_dir and 'this config' for runall's save_dir too."""
    import fcntl
    import os

    folder = transaction.Destination("save_dir", "choose another save_dir")
    fd = os.open(tmp_path / transaction.LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.write(fd, b"4242\n")
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(ResourceError) as caught:
            _run(tmp_path, {"x.png": "figure"}, folder=folder)
    finally:
        os.close(fd)
    message = str(caught.value)
    assert message.startswith(f"save_dir '{tmp_path}' is in use by another run (pid 4242")
    assert message.endswith("wait for it to finish or choose another save_dir"), message


def test_a_write_error_names_where_the_file_goes_not_the_staging_folder(tmp_path: Path) -> None:
    """runall on a full disk named 'rs/.hbtools_staging/data_distribution/x.png', a folder the user never sees."""
    from hbtools.errors import os_error

    with pytest.raises(ResourceError) as caught:
        with transaction.artefact_transaction(tmp_path, set_name="m") as staging:
            raise os_error(OSError(28, "No space left on device", str(staging / "plots" / "x.png")))
    assert str(caught.value).startswith(f"cannot write '{tmp_path / 'plots' / 'x.png'}': No space left on device")
    assert transaction.STAGING_NAME not in str(caught.value)


def test_reading_an_artefact_beside_an_unfinished_commit_warns(tmp_path: Path) -> None:
    """A run killed amid its final moves (the OOM killer, a power cut) leaves a folder of two runs until the next
    run finishes the moves; hb_verifier then failed on the pair with no word of why."""
    from bin_fixtures import build_bin, invoke

    from hbtools.cli import hb_model_info

    built = build_bin(tmp_path / "m", "resnet_like", prefix="m")
    staging = built.bin.parent / transaction.STAGING_NAME
    staging.mkdir()
    (staging / ".committed").write_text(json.dumps({"move": [], "remove": []}))
    result = invoke(hb_model_info.main, [built.bin])
    assert "WARNING" in result.output and "killed while it moved its results into place" in result.output, \
        result.output[-2000:]


def test_a_file_no_run_wrote_in_a_folder_the_set_replaces_is_kept(tmp_path: Path) -> None:
    """runall replaced its step folders whole: a user's notes in debug_result/node_sensitivity/ and a figure of an
    earlier plot_acc_error call in debug_result/accumulate_error/ were deleted without a word (hunt 13 D1). With
    ``keep_others`` (runall's folders), files a run wrote are still replaced or removed as before; the others, links
    and empty folders among them, are carried into the new folder."""
    _write(tmp_path, {"tables/notes.txt": "mine", "plots/earlier.png": "figure", "plots/a.png": "user's a"})
    (tmp_path / "tables" / "empty").mkdir()
    (tmp_path / "tables" / "link").symlink_to(tmp_path / "plots")
    _run(tmp_path, {"tables/t.txt": "1", "tables/old.txt": "1", "plots/a.png": "run a"}, keep_others=True)
    assert _tree(tmp_path / "tables") == {"notes.txt": "mine", "t.txt": "1", "old.txt": "1"}
    assert (tmp_path / "tables" / "empty").is_dir() and (tmp_path / "tables" / "link").is_symlink()
    assert _tree(tmp_path / "plots") == {"earlier.png": "figure", "a.png": "run a"}  # a file of the run's name: its
    _write(tmp_path, {"tables/later.txt": "added after the run"})
    _run(tmp_path, {"tables/t.txt": "2", "plots/a.png": "run a 2"}, keep_others=True)
    assert _tree(tmp_path / "tables") == {"notes.txt": "mine", "later.txt": "added after the run", "t.txt": "2"}
    assert _tree(tmp_path / "plots") == {"earlier.png": "figure", "a.png": "run a 2"}
    with pytest.raises(RuntimeError):  # a run that fails leaves everything where it was
        with transaction.artefact_transaction(tmp_path, set_name="m", keep_others=True) as staging:
            _write(staging, {"tables/t.txt": "3"})
            raise RuntimeError("stopped")
    assert _tree(tmp_path / "tables")["notes.txt"] == "mine" and _tree(tmp_path / "tables")["t.txt"] == "2"
    _write(tmp_path, {"tables/t.txt.d/mine.txt": "in a folder named like nothing the run writes"})
    with pytest.raises(ResourceError, match=r"inside a folder where this run writes its file"):
        _run(tmp_path, {"tables/t.txt.d": "a file where the user has a folder"}, keep_others=True)
    assert _tree(tmp_path / "tables")["t.txt.d/mine.txt"].startswith("in a folder")


def test_a_dump_folder_is_replaced_whole(tmp_path: Path) -> None:
    """A calibration_data or hb_verifier dump written without a manifest (an older version, the vendor's tool)
    cannot be told from a user's files: carried over, the old samples stayed beside the new ones forever and the
    debugger read them (hunt 14b D1). Without ``keep_others`` a set's folders are its own."""
    _write(tmp_path, {"calibration_data/x/0.npy": "old", "calibration_data/x/7.npy": "old"})
    _run(tmp_path, {"calibration_data/x/0.npy": "new"})
    assert _tree(tmp_path / "calibration_data") == {"x/0.npy": "new"}


def test_a_second_ctrl_c_during_the_clean_up_still_removes_the_staging_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ctrl_c: object) -> None:
    """Ctrl-C pressed again while a stopped run removes its half-written results stopped that removal: the
    staging folder stayed until the next run (hunt 38). The run is stopping anyway: the second one waits."""
    import shutil
    import signal

    removing = shutil.rmtree

    def pressed_again(path: object, *args: object, **kwargs: object) -> None:
        signal.raise_signal(signal.SIGINT)
        removing(path, *args, **kwargs)

    (tmp_path / "m.bin").write_text("old")
    monkeypatch.setattr(shutil, "rmtree", pressed_again)
    with pytest.raises(KeyboardInterrupt):
        with transaction.artefact_transaction(tmp_path, set_name="m") as staging:
            (staging / "m.bin").write_text("half")
            raise KeyboardInterrupt
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != transaction.LOCK_NAME) == ["m.bin"]
    assert (tmp_path / "m.bin").read_text() == "old"
