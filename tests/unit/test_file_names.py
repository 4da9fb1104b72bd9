"""File names the tools derive from tensor, node and input names (hunt 9 defects 4, 6, 7).

A name longer than a file name may be (TFLite's fused names through tf2onnx run to hundreds of characters) is
cut with a hash; names that map to one file name ('r:0' and 'r_0') get files of their own; hb_verifier's dump
is replaced as a whole. Models are built with onnx.helper and converted by makertbin.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from bin_fixtures import invoke
from builders import MODELS, FloatModel
from debug_support import Dumped, convert_with_dump
from onnx import TensorProto, helper, numpy_helper

from hbtools.cli import hb_verifier
from hbtools.debug import plot_distribution
from hbtools.debug.model import load_calibrated

LONG = ";".join(["StatefulPartitionedCall/model/block_1/conv2d/BiasAdd"] * 6)  # 317 characters
LONG_INPUT = "serving_default_input_image_" * 10  # 280 characters
PASSED = "Quanti onnx and Sim result Strict check PASSED"
NAME_MAX = 255  # bytes in a file name (ext4, xfs, tmpfs)


def _model(nodes: list[onnx.NodeProto], weights: dict[str, tuple[int, ...]], data: str) -> FloatModel:
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32), name)
             for name, shape in weights.items()]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(data, TensorProto.FLOAT, [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return FloatModel(model, {data: [1, 3, 16, 16]})


def long_names(data: str = "data") -> FloatModel:
    """Tensors and nodes of 317 characters and more."""
    return _model([
        helper.make_node("Conv", [data, "W"], [LONG], name=f"{LONG}_node", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", [LONG], [f"{LONG}/Relu"], name=f"{LONG}/Relu_node"),
        helper.make_node("Conv", [f"{LONG}/Relu", "W2"], ["out"], name="head", pads=[1, 1, 1, 1]),
    ], {"W": (8, 3, 3, 3), "W2": (8, 8, 3, 3)}, data)


def colliding_names() -> FloatModel:
    """Two branches whose tensor and node names differ only in characters a file name cannot hold."""
    return _model([
        helper.make_node("Conv", ["data", "W1"], ["blk/out"], name="blk/conv", pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["data", "W2"], ["blk_out"], name="blk_conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["blk/out"], ["r:0"], name="relu:0"),
        helper.make_node("Relu", ["blk_out"], ["r_0"], name="relu_0"),
        helper.make_node("Mul", ["r:0", "r_0"], ["m"], name="mul"),
        helper.make_node("Conv", ["m", "W3"], ["out"], name="head", pads=[1, 1, 1, 1]),
    ], {"W1": (8, 3, 3, 3), "W2": (8, 3, 3, 3), "W3": (8, 8, 3, 3)}, "data")


@pytest.fixture(scope="module")
def long_built(tmp_path_factory: pytest.TempPathFactory) -> Dumped:
    return convert_with_dump(tmp_path_factory.mktemp("long"), long_names())


@pytest.fixture(scope="module")
def colliding(tmp_path_factory: pytest.TempPathFactory) -> Dumped:
    return convert_with_dump(tmp_path_factory.mktemp("collide"), colliding_names())


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Dumped:
    return convert_with_dump(tmp_path_factory.mktemp("plain"), MODELS["resnet_like"]())


@pytest.fixture(autouse=True)
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)  # hb_verifier writes hb_verifier_dump/ and its log into the current folder
    yield tmp_path
    for handler in list(logging.getLogger("hbtools").handlers):  # a tool's console handler: pytest's stdout
        logging.getLogger("hbtools").removeHandler(handler)


def _verify(built: Dumped) -> str:
    result = invoke(hb_verifier.main, ["-m", f"{built.paths['quantized']},{built.paths['bin']}", "-r", "True"])
    assert result.exit_code == 0 and PASSED in result.output, result.output
    return result.output


def _compared(output: str) -> int:
    return int(re.search(r"compared (\d+) shared tensors", output).group(1))


def _dump(folder: Path = Path("hb_verifier_dump")) -> dict[str, dict[str, np.ndarray]]:
    return {side: {p.name: np.load(p) for p in (folder / side).iterdir()} for side in ("quanti_onnx", "sim")}


def test_verifier_dumps_tensors_whose_names_are_longer_than_a_file_name(long_built: Dumped, in_tmp: Path) -> None:
    """It stopped with 'File name too long' after the comparison, never printing its verdict."""
    output = _verify(long_built)
    dump = _dump()
    for files in dump.values():
        assert len(files) == _compared(output)
        assert all(len(name.encode()) <= NAME_MAX for name in files)
    cut = [name for name in dump["sim"] if len(name.encode()) > 200]
    assert len(cut) == 1, sorted(dump["sim"])  # the Relu's output
    log = (in_tmp / "hb_verifier.log").read_text(encoding="utf-8")
    full = dict(re.findall(r"file name of '([^']+)': '([^']+)'", log))
    assert f"{LONG}/Relu_quantized" in full and sorted(full.values()) == sorted(cut), log


def test_makertbin_dumps_the_calibration_data_of_an_input_name_longer_than_a_file_name(tmp_path: Path) -> None:
    """makertbin with dump_calibration_data stopped with 'File name too long' (blaming working_dir's path), and
    the debugger reads the folder it writes."""
    built = convert_with_dump(tmp_path / "long_input", long_names(LONG_INPUT))
    (folder,) = built.data.iterdir()
    assert folder.name.startswith("serving_default_input_image_") and len(folder.name.encode()) <= NAME_MAX
    assert len(list(folder.glob("*.npy"))) == 4
    saved = plot_distribution(tmp_path / "plots", built.calibrated, built.data, ["head"])
    assert saved["head"].is_file()


def test_debugger_plots_nodes_whose_names_are_longer_than_a_file_name(long_built: Dumped, in_tmp: Path) -> None:
    """The figures of nodes named by 317-character tensors failed with 'File name too long' (runall after all
    of its sensitivity work)."""
    nodes = [n for n in load_calibrated(long_built.calibrated).calibration if n.startswith(LONG)]
    assert nodes and all(len(n) > NAME_MAX for n in nodes)
    saved = plot_distribution(in_tmp / "plots", long_built.calibrated, long_built.data, nodes)
    assert len(set(saved.values())) == len(nodes)
    for path in saved.values():
        assert path.is_file() and len(path.name.encode()) <= NAME_MAX and path.name.endswith("_distribution.png")


def test_names_that_map_to_one_file_name_get_files_of_their_own(colliding: Dumped, in_tmp: Path) -> None:
    """'r:0' and 'r_0' both became r_0_quantized.npy: 6 tensors compared, 5 files, one of them either tensor."""
    output = _verify(colliding)
    dump = _dump()
    for files in dump.values():
        assert len(files) == _compared(output)
    assert {"r_0_quantized.npy", "r_0_quantized_1.npy"} <= set(dump["sim"])
    for name in ("r_0_quantized.npy", "r_0_quantized_1.npy"):  # both runs' files of one tensor agree
        np.testing.assert_allclose(dump["sim"][name], dump["quanti_onnx"][name], atol=1e-5)
    assert not np.allclose(dump["sim"]["r_0_quantized.npy"], dump["sim"]["r_0_quantized_1.npy"])
    nodes = [n for n in load_calibrated(colliding.calibrated).calibration if n.startswith(("r:0", "r_0"))]
    assert len(nodes) == 2
    saved = plot_distribution(in_tmp / "plots", colliding.calibrated, colliding.data, nodes)
    assert len({p.name for p in saved.values()}) == 2
    assert sorted(p.name for p in (in_tmp / "plots").iterdir()) == sorted(p.name for p in saved.values())


def test_verifier_dump_of_a_second_model_leaves_no_file_of_the_first(colliding: Dumped, plain: Dumped,
                                                                     in_tmp: Path) -> None:
    """The second model's dump held tensors of the first one beside its own."""
    _verify(plain)
    alone = {side: set(files) for side, files in _dump().items()}
    _verify(colliding)
    _verify(plain)
    assert {side: set(files) for side, files in _dump().items()} == alone


def test_interrupted_verifier_dump_leaves_the_previous_one(colliding: Dumped, plain: Dumped,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C while the dump was written left a mix of the two models' tensors."""
    _verify(colliding)
    before = _dump()
    written = []

    def interrupted(file: object, value: np.ndarray, *args: object, **kwargs: object) -> None:
        written.append(file)
        if len(written) == 3:
            raise KeyboardInterrupt
        save(file, value, *args, **kwargs)

    save = np.save
    monkeypatch.setattr(np, "save", interrupted)
    result = invoke(hb_verifier.main, ["-m", f"{plain.paths['quantized']},{plain.paths['bin']}", "-r", "True"])
    assert result.exit_code == 130, result.output
    after = _dump()
    assert {side: set(files) for side, files in after.items()} == {side: set(files) for side, files in before.items()}
    assert all(np.array_equal(after[side][name], value) for side in before for name, value in before[side].items())


def test_verifier_refuses_an_input_inside_the_dump_it_replaces(colliding: Dumped, in_tmp: Path) -> None:
    """The dump replaces its folders whole: an input file kept there would be deleted with them."""
    _verify(colliding)
    given = "hb_verifier_dump/sim/data_hz_preprocessed_quantized.npy"
    result = invoke(hb_verifier.main, ["-m", f"{colliding.paths['quantized']},{colliding.paths['bin']}",
                                       "-r", "True", "-i", f"data:{given}"])
    assert result.exit_code != 0
    assert f"'{given}' is an input of this run" in result.output and "Traceback" not in result.output
    assert "move it out of the hb_verifier dump folder" in result.output, result.output
    assert (in_tmp / given).is_file()


def test_file_names_keep_plain_names_and_fit_the_limit() -> None:
    from hbtools.outputs import file_names

    files = file_names(["r:0", "r_0", "blk/conv", "a" * 300, "a" * 300 + "b", ".."], suffix="_float.bin",
                       fallback="layer")
    assert files["r_0"] == "r_0_float.bin" and files["r:0"] == "r_0_1_float.bin"  # the plain name keeps its file
    assert files["blk/conv"] == "blk_conv_float.bin" and files[".."] == "layer_float.bin"
    assert len(set(files.values())) == len(files)
    assert all(len(f.encode()) <= NAME_MAX for f in files.values())
    assert file_names(["模型" * 100])["模型" * 100].encode()[:6] == "模型".encode()  # cut between characters
