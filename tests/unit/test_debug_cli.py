"""hmct-debugger as a user types it: the seeds' command lines, help, and one-line errors.

Command lines go through ``shlex.split`` (what the shell does to them: quotes
removed, lists split at spaces) and then ``main``, in-process; one test runs the
installed console script through bash.
"""

from __future__ import annotations

import logging
import re
import shlex
import subprocess
from pathlib import Path

import pytest
from builders import MODELS
from debug_support import Dumped, assert_png, convert_with_dump

from hbtools.cli.hmct_debugger import join_split_lists, main
from hbtools.debug.model import load_calibrated

ERROR_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ERROR \S")


@pytest.fixture(scope="module")
def dumped(tmp_path_factory: pytest.TempPathFactory) -> Dumped:
    return convert_with_dump(tmp_path_factory.mktemp("resnet_like"), MODELS["resnet_like"]())


@pytest.fixture(autouse=True)
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)
    yield
    for handler in list(logging.getLogger("hbtools").handlers):  # they point at pytest's captured stdout
        logging.getLogger("hbtools").removeHandler(handler)


def run(command: str, dumped: Dumped, capsys: pytest.CaptureFixture) -> tuple[int, str]:
    """A seed command line with the sample paths; returns (exit code, console output)."""
    command = command.replace("calibrated_model.onnx", str(dumped.calibrated))
    command = re.sub(r"\b(calibration_data|calibrated_data)\b(?!/)", str(dumped.data), command, count=1)
    args = shlex.split(command)
    assert args[0] == "hmct-debugger"
    try:
        main(args[1:])
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_sensitivity_command_prints_the_table(dumped: Dumped, capsys: pytest.CaptureFixture) -> None:
    code, out = run("hmct-debugger get-sensitivity-of-nodes calibrated_model.onnx calibration_data "
                    "-m ['cosine-similarity','mse'] -v True", dumped, capsys)
    assert code == 0, out
    lines = out.splitlines()
    assert re.fullmatch(r"=+node=+", lines[0]) and lines[1].split() == ["Node", "cosine-similarity", "mse"]
    assert len(lines) == 3 + len(load_calibrated(dumped.calibrated).quantizable)
    code, out = run("hmct-debugger get-sensitivity-of-nodes calibrated_model.onnx calibration_data -n weight -d 1 "
                    "-i Conv_1", dumped, capsys)
    assert code == 0 and "1 nodes ranked; most sensitive: Conv_1" in out


@pytest.mark.parametrize("command", [
    "hmct-debugger plot-acc-error calibrated_model.onnx calibrated_data -q ['Conv_0','Conv_1']",
    "hmct-debugger plot-acc-error calibrated_model.onnx calibration_data -q [['Conv_0'],['Conv_0','Conv_1']]",
    "hmct-debugger plot-acc-error calibrated_model.onnx calibration_data -nq ['Conv_0','Conv_1'] -a True",
    "hmct-debugger plot-acc-error calibrated_model.onnx calibration_data -nq [['Conv_0'],['Conv_0','Conv_1']]",
    "hmct-debugger plot_acc_error calibrated_model.onnx calibration_data -q ['weight', 'activation']",
    "hmct-debugger plot-distribution calibrated_model.onnx calibration_data "
    "-n ['Relu_0_out_HzCalibration','w_5_HzCalibration','Conv_0']",
    "hmct-debugger get-channelwise-data-distribution calibrated_model.onnx calibration_data "
    "-n ['Relu_0_out_HzCalibration','w_5_HzCalibration'] -a 1",
    "hmct-debugger sensitivity-analysis calibrated_model.onnx calibration_data -p 1.0 -d 1 -sn ['Conv_1'] -sd out",
])
def test_plot_commands_write_pngs(dumped: Dumped, command: str, capsys: pytest.CaptureFixture,
                                  tmp_path: Path) -> None:
    code, out = run(command, dumped, capsys)
    assert code == 0, out
    saved = [Path(line.split(" INFO saved ", 1)[1]) for line in out.splitlines() if " INFO saved " in line]
    assert saved, out
    for path in saved:
        assert_png(path if path.is_absolute() else tmp_path / path, 400, 300)


def test_runall_command(dumped: Dumped, capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    code, out = run("hmct-debugger runall calibrated_model.onnx calibration_data -nt node -dn 1 -v True "
                    "-qn ['Conv_1'] -s result", dumped, capsys)
    assert code == 0, out
    assert f"runall: results saved under {tmp_path / 'result'}" in out
    assert (tmp_path / "result" / "node_sensitivity" / "sensitivity_of_node.csv").is_file()


def test_long_options_take_hyphens_as_the_other_tools_do(dumped: Dumped, capsys: pytest.CaptureFixture,
                                                         tmp_path: Path) -> None:
    """--node-type was refused ('Did you mean --node_type?'): every other hb_* tool spells its long options with
    hyphens; both spellings are taken."""
    code, out = run("hmct-debugger get-sensitivity-of-nodes calibrated_model.onnx calibration_data --node-type weight "
                    "--data-num 1 --verbose True", dumped, capsys)
    assert code == 0, out
    assert "weight" in out.lower() and "cosine-similarity" in out


@pytest.mark.parametrize(("command", "words"), [
    ("get-sensitivity-of-nodes calibrated_model.onnx calibration_data -n layer", ["'layer'", "'weight'"]),
    ("get-sensitivity-of-nodes calibrated_model.onnx calibration_data -i ['Conv_9']",
     ["no node named 'Conv_9'", "Conv_0"]),
    # a bare number or boolean is a node's name (PyTorch and Caffe exports name nodes 103, 104, ...): hunt 38 D1
    ("get-sensitivity-of-nodes calibrated_model.onnx calibration_data -i 103", ["no node named '103'", "Conv_0"]),
    ("get-sensitivity-of-nodes calibrated_model.onnx calibration_data -i 1.5", ["no node named '1.5'"]),
    ("get-sensitivity-of-nodes calibrated_model.onnx calibration_data -i [103,104]", ["no node named '103'"]),
    ("runall calibrated_model.onnx calibration_data -cn 1", ["no node named '1'"]),
    ("sensitivity-analysis calibrated_model.onnx calibration_data -p 2.0", ["pick_threshold is 2.0", "at most 1"]),
    ("runall calibrated_model.onnx calibration_data -pt nan", ["pick_threshold is nan", "above 0"]),
    ("get-sensitivity-of-nodes calibrated_model.onnx calibration_data -d 9", ["from 1 to 4"]),
    ("get-sensitivity-of-nodes calibrated_model.onnx calibration_data -d many", ["'many' is not a valid integer"]),
    ("get-sensitivity-of-nodes calibrated_model.onnx calibration_data -m [cosine,mse]", ["'cosine'", "sqnr"]),
    ("plot-distribution calibrated_model.onnx calibration_data", ["Missing option '-n'"]),
    ("plot-acc-error calibrated_model.onnx calibration_data", ["quantize_node or non_quantize_node"]),
    ("plot-acc-error calibrated_model.onnx calibration_data -a maybe -q ['Conv_1']", ["'maybe'", "boolean"]),
    ("get-channelwise-data-distribution calibrated_model.onnx calibration_data -n ['Conv_1']",
     ["ordinary node", "weight calibration nodes"]),
    ("get-sensitivity-of-nodes missing.onnx calibration_data", ["'missing.onnx' does not exist"]),
    ("get-sensitivity-of-nodes calibrated_model.onnx nowhere", ["'nowhere' does not exist"]),
    ("plot-everything calibrated_model.onnx calibration_data", ["No such command 'plot-everything'"]),
])
def test_mistakes_give_one_error_line(dumped: Dumped, command: str, words: list[str],
                                      capsys: pytest.CaptureFixture) -> None:
    code, out = run(f"hmct-debugger {command}", dumped, capsys)
    # Command-line mistakes caught by the argument parser exit 2, the rest 1 (docs/errors.md).
    usage = ("valid integer", "Missing option", "boolean", "No such command")
    assert code == (2 if any(u in w for w in words for u in usage) else 1), out
    lines = [line for line in out.splitlines() if line.strip()]
    errors = [line for line in lines if " ERROR " in line]
    assert len(errors) == 1 and ERROR_LINE.match(errors[0]), out
    assert "Traceback" not in out
    for word in words:
        assert word in errors[0], errors[0]


@pytest.mark.parametrize(("command", "flags"), [
    ("get-sensitivity-of-nodes", ["-m", "-o", "-n", "-d", "-v", "-i"]),
    ("plot-acc-error", ["-s", "-q", "-nq", "-m", "-a"]),
    ("plot-distribution", ["-s", "-n"]),
    ("get-channelwise-data-distribution", ["-s", "-n", "-a"]),
    ("sensitivity-analysis", ["-p", "-d", "-sn", "-sd"]),
    ("runall", ["-s", "-nm", "-o", "-nt", "-dn", "-v", "-i", "-dnl", "-cn", "-a", "-qn", "-nqn", "-am", "-avm", "-pt",
                "-sn"]),
])
def test_help_lists_the_short_flags(command: str, flags: list[str], capsys: pytest.CaptureFixture) -> None:
    main([command, "-h"])
    out = capsys.readouterr().out
    assert "[OPTIONS] MODEL_OR_FILE CALIBRATION_DATA" in " ".join(out.split())
    for flag in flags:
        assert re.search(rf"^\s+{re.escape(flag)}, --", out, re.MULTILINE), flag


@pytest.mark.parametrize("args", [[], ["--help"], ["-h"], ["--version"], ["plot-distribution", "--help"],
                                  ["runall", "-h"]])
def test_help_leaves_no_log_file(args: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                 capsys: pytest.CaptureFixture) -> None:
    """The log file was opened before the arguments were read: every --help left an empty
    hmct_debugger.log in the current folder."""
    monkeypatch.chdir(tmp_path)
    try:
        main(args)
    except SystemExit as exc:
        assert not exc.code
    assert "hmct-debugger" in capsys.readouterr().out
    assert not list(tmp_path.iterdir())


def test_split_lists_are_joined() -> None:
    assert join_split_lists(["-q", "['weight',", "'activation']", "-a", "True"]) == [
        "-q", "['weight', 'activation']", "-a", "True"]
    assert join_split_lists(["-q", "[['a'],", "['b',", "'c']]"]) == ["-q", "[['a'], ['b', 'c']]"]
    assert join_split_lists(["-i", "[1,", "-2]"]) == ["-i", "[1, -2]"]  # a negative number is no option


def test_unterminated_list_stops_at_the_next_option(dumped: Dumped, capsys: pytest.CaptureFixture) -> None:
    """'-q "[Conv_0" -s ae6' swallowed '-s ae6' into the list ('[Conv_0 -s ae6' is not a list)."""
    assert join_split_lists(["-q", "[Conv_0", "-s", "ae6"]) == ["-q", "[Conv_0", "-s", "ae6"]
    assert join_split_lists(["-q", "['a',", "--save_dir", "x"]) == ["-q", "['a',", "--save_dir", "x"]
    code, out = run("hmct-debugger plot-acc-error calibrated_model.onnx calibration_data -q '[Conv_0' -s ae6",
                    dumped, capsys)
    assert code == 2, out
    [error] = [line for line in out.splitlines() if ERROR_LINE.match(line)]
    assert "'[Conv_0' is an unterminated list" in error and "-s" not in error.split("unterminated")[0], error
    assert not Path("ae6").exists()


def test_console_script_through_the_shell(dumped: Dumped, tmp_path: Path) -> None:
    command = (f"hmct-debugger get-sensitivity-of-nodes {dumped.calibrated} {dumped.data} "
               "-m ['cosine-similarity','mse'] -v True -n weight")
    proc = subprocess.run(["bash", "-c", command], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[1].split() == ["Weight", "Node", "cosine-similarity", "mse"]
    bad = subprocess.run(["bash", "-c", f"hmct-debugger plot-distribution {dumped.calibrated} {dumped.data} -n [x]"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and bad.stdout.count(" ERROR ") == 1 and "Traceback" not in bad.stdout + bad.stderr
    assert "Traceback" in (tmp_path / "hmct_debugger.log").read_text(), "the log keeps the details"


def test_the_log_keeps_every_call(dumped: Dumped, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """hmct_debugger.log was replaced by every call in the folder: a failing call's traceback was gone after the
    next call (hunt 13 N6). Each call now adds its lines below a header naming it; a log grown past its limit is
    cut back to its last calls."""
    log = tmp_path / "hmct_debugger.log"
    code, _ = run("hmct-debugger plot-distribution calibrated_model.onnx calibration_data -n [x]", dumped, capsys)
    assert code == 1
    code, _ = run("hmct-debugger get-sensitivity-of-nodes calibrated_model.onnx calibration_data -n weight -d 1",
                  dumped, capsys)
    assert code == 0
    text = log.read_text()
    headers = [line for line in text.splitlines() if " DEBUG ===== hmct-debugger " in line]
    assert len(headers) == 2 and "plot-distribution" in headers[0] and "-n '[x]'" in headers[0], headers
    assert "get-sensitivity-of-nodes" in headers[1], headers
    assert text.index("Traceback") < text.index(headers[1]), "the failing call's details stay"

    old_call = "2026-01-01 00:00:00,000 DEBUG ===== hmct-debugger an old call =====\n"
    log.write_text(old_call + "x\n" * 600_000 + old_call.replace("an old", "a recent") + "y\n")
    code, _ = run("hmct-debugger get-sensitivity-of-nodes calibrated_model.onnx calibration_data -n weight -d 1",
                  dumped, capsys)
    text = log.read_text()
    assert code == 0 and len(text) < 300_000 and "an old call" not in text, "cut back to its last calls"
    assert text.startswith(old_call.replace("an old", "a recent")) and "get-sensitivity-of-nodes" in text


def test_a_long_last_call_is_kept_whole(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Cutting the log back kept the calls that begin in its last 256 KiB: a last call longer than that was cut
    away whole, its ERROR with it (hunt 17 D5)."""
    log = tmp_path / "hmct_debugger.log"
    old_call = "2026-01-01 00:00:00,000 DEBUG ===== hmct-debugger an old call =====\n"
    long_call = (old_call.replace("an old", "a long") + "2026-01-01 00:00:01,000 INFO per node\n" * 8000
                 + "2026-01-01 00:00:02,000 ERROR the long call failed\n")
    log.write_text(old_call + "x\n" * 600_000 + long_call)
    with pytest.raises(SystemExit):
        main(["no-such-command"])
    capsys.readouterr()
    text = log.read_text()
    assert text.startswith(long_call) and "an old call" not in text, "the last call stays whole, its ERROR too"
    assert "===== hmct-debugger no-such-command =====" in text


def test_an_edited_calibrated_model_gives_one_error_line(dumped: Dumped, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture) -> None:
    """hunt 38 D2: a calibrated model with a node deleted by hand stopped with 'internal error: KeyError'."""
    import onnx

    model = onnx.load(dumped.calibrated)
    weight = next(n for n in model.graph.node if n.op_type == "HzCalibration" and n.name.startswith("w"))
    model.graph.node.remove(weight)
    broken = tmp_path / "edited.onnx"
    onnx.save(model, broken)
    code, out = run(f"hmct-debugger get-sensitivity-of-nodes {broken} calibration_data", dumped, capsys)
    errors = [line for line in out.splitlines() if " ERROR " in line]
    assert code == 1 and len(errors) == 1 and ERROR_LINE.match(errors[0]), out
    assert "fails the ONNX checker" in errors[0] and "internal error" not in out and "Traceback" not in out
