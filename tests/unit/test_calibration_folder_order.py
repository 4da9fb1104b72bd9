"""A two-input model's calibration folders (or hb_mapper infer's --image-file files) given in the wrong order, or
one folder given twice: the file's size is exactly the other input's, so the ERROR names that input and the order
cal_data_dir lists its folders in, not input_shape, which is right as it is (hunt 51 D1)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from builders import _Graph, make_project
from conformance import _cli

from hbtools.config.model import InputSpec
from hbtools.data.calibration import preflight
from hbtools.errors import HbError


def _tracker_project(root: Path):  # noqa: ANN202 - tests.builders.Project
    """A Siamese pair: template z (1x3x8x8) and search image x (1x3x24x24), a Conv each, pooled and added."""
    g = _Graph(seed=3)
    pooled = [g.op("GlobalAveragePool", [g.conv(name, 3, 4)]) for name in ("z", "x")]
    fm = g.model({"z": [1, 3, 8, 8], "x": [1, 3, 24, 24]}, [g.op("Add", pooled)])
    return make_project(root, fm)


def _errors(out: str) -> list[str]:
    return [line for line in out.splitlines() if " ERROR " in line and "exception in command" not in line]


def test_swapped_or_repeated_calibration_folders_name_the_input_they_belong_to(tmp_path: Path) -> None:
    project = _tracker_project(tmp_path)
    for folders in ("cal_x; cal_z", "cal_x; cal_x"):
        project.write(calibration_parameters={"cal_data_dir": folders})
        code, out = _cli(["makertbin", "-c", str(project.config_path), "--model-type", "onnx"], tmp_path)
        assert code != 0, out
        errors = _errors(out)
        assert len(errors) == 2, errors  # the finding and what to do, one line each
        assert "000.bin has 1728 bytes, expected 192 bytes (shape [1, 3, 8, 8], dtype uint8) for input 'z'; " \
               "that is the size of input 'x' (1x3x24x24 uint8)" in errors[0], errors
        assert "looks like the data of input 'x': cal_data_dir lists one folder per input, in the order of " \
               "input_name (z;x)" in errors[1], errors
        assert "input_shape" not in " ".join(errors), errors


def test_infer_with_the_input_files_swapped_names_the_input_they_belong_to(tmp_path: Path) -> None:
    project = _tracker_project(tmp_path)
    code, out = _cli(["makertbin", "-c", str(project.config_path), "--model-type", "onnx"], tmp_path)
    assert code == 0, out
    z, x = tmp_path / "cal_z" / "000.bin", tmp_path / "cal_x" / "000.bin"
    (tmp_path / "dump").mkdir()
    quantized = str(project.artefact("quantized"))
    code, out = _cli(["infer", "-c", str(project.config_path), "--model-file", quantized, "--model-type", "onnx",
                      "--image-file", "z", str(x), "--image-file", "x", str(z), "--output-dir", "dump"], tmp_path)
    assert code != 0, out
    errors = _errors(out)
    assert len(errors) == 2, errors
    assert "has 1728 bytes, expected 192 bytes" in errors[0] and "the size of input 'x' (1x3x24x24 uint8)" in errors[0]
    assert "looks like the data of input 'x'" in errors[1] and "input_shape" not in errors[1], errors
    code, out = _cli(["infer", "-c", str(project.config_path), "--model-file", quantized, "--model-type", "onnx",
                      "--image-file", "z", str(z), "--image-file", "x", str(x), "--output-dir", "dump"], tmp_path)
    assert code == 0, out  # in the right order they run


def test_a_npy_sample_of_another_input_is_named_as_that_inputs(tmp_path: Path) -> None:
    """A featuremap folder of .npy files holding the other input's shape."""
    (tmp_path / "mask").mkdir()
    np.save(tmp_path / "mask" / "0.npy", np.zeros((1, 3, 16, 16), np.float32))
    image = InputSpec("img", [1, 3, 16, 16], "rgb", "NCHW", "rgb", None, cal_data_dir=tmp_path / "mask")
    mask = InputSpec("mask", [1, 1, 16, 16], "featuremap", "NCHW", "featuremap", None, cal_data_dir=tmp_path / "mask")
    try:
        preflight([image, mask])
    except HbError as e:
        message, hint = str(e), e.hint or ""
    else:
        raise AssertionError("a folder of the image's data was taken for the mask")
    assert "holds float32 [1, 3, 16, 16], expected 256 numbers (shape [1, 1, 16, 16]) for input 'mask'; that is " \
           "the size of input 'img' (1x3x16x16)" in message, message
    assert "cal_data_dir lists one folder per input, in the order of input_name (img;mask)" in hint, hint
