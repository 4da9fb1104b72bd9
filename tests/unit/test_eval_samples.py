"""hbtools.eval.samples: the calibration folders and model pair the sample scripts share."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import skimage.io
from onnx import TensorProto, helper

from hbtools.eval import samples


def _scaled(gain: float) -> onnx.ModelProto:
    """y = x * gain on a float 1x3 input."""
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "g"], ["y"])], "scaled",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])],
        [helper.make_tensor("g", TensorProto.FLOAT, [], [gain])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8  # what the installed onnxruntime reads (as tests/builders.py)
    return model


def test_write_calibration_saves_pictures_and_prepared_files_in_order(tmp_path, capsys):
    stale = tmp_path / "calibration_data" / "old.bin"
    stale.parent.mkdir()
    stale.write_bytes(b"from an earlier run")
    pictures = [("dark", np.full((4, 5), 10, np.uint8)), ("bright", np.full((4, 5), 200, np.uint8))]

    # The prepare function receives the saved PNG, not the array: read it back.
    count = samples.write_calibration(tmp_path, pictures, lambda png: skimage.io.imread(png)[None],
                                      "uint8 1x4x5")

    assert count == 2 and not stale.exists()
    assert sorted(p.name for p in (tmp_path / "calibration_images").iterdir()) == [
        "0000_dark.png", "0001_bright.png"]
    bins = sorted((tmp_path / "calibration_data").iterdir())
    assert [p.name for p in bins] == ["0000_dark.bin", "0001_bright.bin"]
    np.testing.assert_array_equal(np.fromfile(bins[1], np.uint8), np.full(20, 200))
    printed = capsys.readouterr().out
    assert f"2 calibration samples (uint8 1x4x5) in {tmp_path / 'calibration_data'}" in printed


def test_missing_build_output_exits_with_one_error_line(tmp_path):
    with pytest.raises(SystemExit) as info:
        samples.open_models(tmp_path, "ppocr_cls")
    message = str(info.value.code)
    assert message.startswith("ERROR ") and "ppocr_cls_original_float_model.onnx" in message
    assert message.endswith("run 03_build.sh first") and "\n" not in message
    assert not (tmp_path / "inference").exists()


def test_open_models_runs_the_float_and_the_quantized_artefact(tmp_path, capsys):
    (tmp_path / "model_output").mkdir()
    onnx.save(_scaled(1.0), tmp_path / "model_output" / "m_original_float_model.onnx")
    onnx.save(_scaled(2.0), tmp_path / "model_output" / "m_quantized_model.onnx")
    sessions = samples.open_models(tmp_path, "m")
    assert list(sessions) == ["float", "quantized"]
    x = np.array([[1.0, -2.0, 3.0]], np.float32)
    np.testing.assert_allclose(samples.first_output(sessions["quantized"], x), 2 * x)

    png = samples.inference_picture(tmp_path, "tiny", np.zeros((3, 3), np.uint8))
    assert png == tmp_path / "inference" / "tiny.png" and png.is_file()
    samples.print_agreement(True, "1 of 1 pictures")
    samples.print_agreement(False)
    assert capsys.readouterr().out.splitlines() == [
        "float and quantized agree: yes (1 of 1 pictures)", "float and quantized agree: no"]
