"""Raw calibration files of an integer model input read with a float ``cal_data_type``.

A PointPillars-style model takes int32 pillar coordinates beside float features. With ``cal_data_type`` float32 for
that input (easy to get wrong in a ``;`` list, and the file size cannot tell int32 from float32), the int32 files
were read as float32 denormals, which the cast to the model's int32 made 0: calibration ran on zeros with no word,
exit code 0, and the held-out cosine fell from 0.9999 to 0.97 (hunt 46 D1). Such data is refused before anything
is written; float files holding whole numbers are still taken."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml
from conformance import INTERNAL, _cli
from onnx import TensorProto, helper, numpy_helper


def _project(root: Path, cal_data_type: str, written: type) -> Path:
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array((rng.standard_normal((4, 3, 3, 3)) / 3).astype(np.float32), "w")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Cast", ["k"], ["kf"], name="cast", to=TensorProto.FLOAT),
             helper.make_node("Mul", ["r", "kf"], ["y"], name="scale")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8]),
                                           helper.make_tensor_value_info("k", TensorProto.INT32, [1, 1, 1, 1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, root / "m.onnx")
    for name in ("x", "k"):
        (root / f"cal_{name}").mkdir()
    for i in range(4):
        rng.uniform(-1, 1, (1, 3, 8, 8)).astype(np.float32).tofile(root / "cal_x" / f"{i}.bin")
        np.full((1, 1, 1, 1), i + 1, written).tofile(root / "cal_k" / f"{i}.bin")
    config = {
        "model_parameters": {"onnx_model": str(root / "m.onnx"), "march": "bayes-e", "working_dir": str(root / "out"),
                             "output_model_file_prefix": "m"},
        "input_parameters": {"input_name": "x;k", "input_type_train": "featuremap;featuremap",
                             "input_layout_train": "NCHW;NCHW", "input_type_rt": "featuremap;featuremap",
                             "input_shape": "1x3x8x8;1x1x1x1", "norm_type": "no_preprocess;no_preprocess"},
        "calibration_parameters": {"cal_data_dir": f"{root / 'cal_x'};{root / 'cal_k'}",
                                   "cal_data_type": cal_data_type, "calibration_type": "max"},
        "compiler_parameters": {"optimize_level": "O3"},
    }
    (root / "config.yaml").write_text(yaml.safe_dump(config))
    return root / "config.yaml"


def test_int32_files_read_as_float32_are_refused_naming_the_input(tmp_path: Path) -> None:
    config = _project(tmp_path, "float32;float32", np.int32)
    code, out = _cli(["makertbin", "--config", str(config), "--model-type", "onnx"], tmp_path)
    assert code != 0 and INTERNAL not in out and "Traceback" not in out
    assert "for input 'k' holds float32 values that are not whole numbers" in out, out[-2000:]
    assert "the model's input 'k' is int32" in out and "set cal_data_type" in out and "int32" in out
    assert not (tmp_path / "out" / "m.bin").exists()


@pytest.mark.parametrize(("cal_data_type", "written"), [("float32;int32", np.int32), ("float32;float32", np.float32)],
                         ids=["int32-files", "whole-floats"])
def test_integer_input_data_in_its_own_type_or_as_whole_floats_converts(tmp_path: Path, cal_data_type: str,
                                                                       written: type) -> None:
    config = _project(tmp_path, cal_data_type, written)
    code, out = _cli(["makertbin", "--config", str(config), "--model-type", "onnx"], tmp_path)
    assert code == 0 and INTERNAL not in out, out[-2000:]
    assert (tmp_path / "out" / "m.bin").exists()


def test_values_an_integer_input_cannot_hold_are_refused(tmp_path: Path) -> None:
    """Whole numbers beyond the integer input's range wrapped around in the cast without a word (hunt 47 D6)."""
    config = _project(tmp_path, "float32;float32", np.float32)
    np.full((1, 1, 1, 1), 3e9, np.float32).tofile(tmp_path / "cal_k" / "2.bin")
    code, out = _cli(["makertbin", "--config", str(config), "--model-type", "onnx"], tmp_path)
    assert code != 0 and INTERNAL not in out
    assert "but the model's input 'k' is int32 (-2147483648..2147483647): they would wrap around" in out, out[-2000:]


def test_a_npy_file_of_fractions_for_an_integer_input_says_to_save_it_as_integers(tmp_path: Path) -> None:
    """A .npy file carries its own type, so the hint to set cal_data_type could not help (hunt 47 D7)."""
    config = _project(tmp_path, "float32;int32", np.int32)
    for old in (tmp_path / "cal_k").iterdir():
        old.unlink()
    for i in range(4):
        np.save(tmp_path / "cal_k" / f"{i}.npy", np.full((1, 1, 1, 1), i + 0.5, np.float32))
    code, out = _cli(["makertbin", "--config", str(config), "--model-type", "onnx"], tmp_path)
    assert code != 0 and INTERNAL not in out
    assert "save the file as an array of int32" in out and "set cal_data_type" not in out, out[-2000:]
