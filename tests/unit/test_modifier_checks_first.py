"""hb_model_modifier checks every node name and type it is given before it deletes or announces anything
(hunt 29 D3: D-Robotics' batch_mapper.py passes a hard-coded name the model may not have)."""

from __future__ import annotations

import os
import shutil

import pytest
from bin_fixtures import build_bin, invoke

from hbtools.cli import hb_model_modifier
from hbtools.config.values import closest_names
from hbtools.runtime.binfile import read_bin


@pytest.fixture(scope="module")
def resnet(tmp_path_factory):
    """A model whose deletable nodes are its input Transpose and output Softmax (then the Dequantize before it)."""
    root = tmp_path_factory.mktemp("bins")
    return build_bin(root / "resnet", "resnet_like", prefix="resnet", input_parameters={"input_type_rt": "nv12"},
                     calibration_parameters={"run_on_cpu": "Softmax_0"})


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _errors(output: str) -> list[str]:
    return [line for line in output.splitlines() if " ERROR " in line and "exception in command" not in line]


def test_several_bad_names_are_one_error_before_anything_is_deleted(resnet, in_tmp) -> None:
    """'-r good -r missing' printed "Node 'good' is removed", then failed on the missing name and wrote nothing;
    a short name for an exporter's long one ('720_HzDequantize') got no closest names, a long one did."""
    shutil.copy(resnet.bin, "resnet.bin")
    graph = read_bin("resnet.bin").model().load_graph()
    conv = next(n.name for n in graph.graph.node if n.op_type == "HzSQuantizedConv")
    result = invoke(hb_model_modifier.main, ["resnet.bin", "-r", "Softmax_0", "-r", "Gemm_HzDequantize",
                                             "-r", "data_nchw_Transposed", "-r", conv])
    assert result.exit_code == 1, result.output
    assert "is removed" not in result.output and "found, its OP type" not in result.output, result.output
    [error] = _errors(result.output)
    # the Dequantize is deletable once Softmax_0 (given first) is: it is the closest to the short name
    dequantize = next(n.name for n in graph.graph.node if n.op_type == "HzDequantize")
    assert f"node 'Gemm_HzDequantize' is not in the model (closest: '{dequantize}'" in error, error
    assert "node 'data_nchw_Transposed' is not in the model (closest: 'data_nchw_Transpose'" in error, error
    assert f"node '{conv}' (HzSQuantizedConv) cannot be deleted" in error, error
    assert "Nothing was deleted and no file was written" in error and "these 3 -r names" in error, error
    assert "'Softmax_0'" in error.split("deletable nodes")[1], error
    assert "Traceback" not in result.output and not os.path.exists("resnet_modified.bin")


def test_unknown_types_are_one_error_before_anything_is_deleted(resnet, in_tmp) -> None:
    shutil.copy(resnet.bin, "resnet.bin")
    result = invoke(hb_model_modifier.main, ["resnet.bin", "-a", "Softmax", "-a", "Conv", "-a", "Relu"])
    assert result.exit_code == 1, result.output
    assert "is removed" not in result.output, result.output
    [error] = _errors(result.output)
    assert "-a Conv, -a Relu: hb_model_modifier does not delete Conv or Relu nodes" in error, error
    assert not os.path.exists("resnet_modified.bin")


def test_good_names_are_announced_after_the_file_is_written(resnet, in_tmp) -> None:
    shutil.copy(resnet.bin, "resnet.bin")
    result = invoke(hb_model_modifier.main, ["resnet.bin", "-r", "Softmax_0", "-r", "data_nchw_Transpose"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines.index("Node 'Softmax_0' is removed") < lines.index("Node 'data_nchw_Transpose' is removed")
    assert lines[-1] == "modified model saved as resnet_modified.bin"
    assert [r["name"] for r in read_bin("resnet_modified.bin").model().deleted_nodes] == \
        ["Softmax_0", "data_nchw_Transpose"]


def test_a_short_name_is_close_to_a_long_name_that_holds_it() -> None:
    long = ["/model.23/cv2.0/cv2.0.2/Conv_output_0_HzDequantize", "images_nchw_Transpose"]
    assert closest_names("720_HzDequantize", long) == f" (closest: '{long[0]}')"
    assert closest_names("585_HzDequantize", ["585_HzDequantize_x", long[0]]).startswith(" (closest: '585_")
    assert closest_names("Relu_3", long) == ""  # nothing of it in runs of three characters
