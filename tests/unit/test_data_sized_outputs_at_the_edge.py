"""A model output whose size the data decides (torch's ``nonzero``: NonZero then a Transpose; NMS indices cast to
int32): --fast-perf and ``remove_node_type: Transpose`` stopped with "the type or shape of tensor 'nz' is unknown"
after the whole conversion, and hb_model_modifier listed the Transpose as deletable and then refused it (hunt 48
D1). A node whose other side has no fixed shape is not deletable: fast-perf keeps it, remove_node_type keeps it with
a WARNING that says why, and hb_model_modifier refuses it saying why."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml
from bin_fixtures import invoke
from onnx import TensorProto, helper, numpy_helper

from hbtools.cli import hb_mapper, hb_model_modifier


def _class_pixels() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["f"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Relu", ["f"], ["r"], name="relu"),
             helper.make_node("ArgMax", ["r"], ["cm"], axis=1, keepdims=0, name="argmax"),
             helper.make_node("Equal", ["cm", "one"], ["m"], name="eq"),
             helper.make_node("NonZero", ["m"], ["nzT"], name="nonzero"),
             helper.make_node("Transpose", ["nzT"], ["nz"], perm=[1, 0], name="tr")]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("r", TensorProto.FLOAT, [1, 4, 16, 16]),
         helper.make_tensor_value_info("nz", TensorProto.INT64, ["k", 3])],
        [numpy_helper.from_array((rng.standard_normal((4, 3, 3, 3)) * 0.3).astype(np.float32), "w"),
         numpy_helper.from_array(np.zeros(4, np.float32), "b"), numpy_helper.from_array(np.array(1, np.int64), "one")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    onnx.save(_class_pixels(), "m.onnx")
    return tmp_path


def test_fast_perf_keeps_the_node_before_a_data_sized_output(project: Path) -> None:
    result = invoke(hb_mapper.main, ["makertbin", "--fast-perf", "--model", "m.onnx", "--model-type", "onnx",
                                     "--march", "bayes-e"])
    assert result.exit_code == 0 and "ERROR" not in result.output, result.output
    assert (project / "model_output" / "m.bin").is_file()


def test_remove_node_type_says_why_it_keeps_it_and_hb_model_modifier_refuses_it(project: Path) -> None:
    Path("cal").mkdir()
    rng = np.random.default_rng(1)
    for i in range(3):
        rng.integers(0, 256, (1, 3, 16, 16), dtype=np.uint8).tofile(f"cal/{i}.bin")
    config = {"model_parameters": {"onnx_model": "m.onnx", "march": "bayes-e", "working_dir": "out",
                                   "output_model_file_prefix": "m", "remove_node_type": "Transpose"},
              "input_parameters": {"input_type_train": "rgb", "input_layout_train": "NCHW", "input_type_rt": "rgb",
                                   "norm_type": "no_preprocess"},
              "calibration_parameters": {"cal_data_dir": "cal", "calibration_type": "max"},
              "compiler_parameters": {"optimize_level": "O0"}}
    Path("c.yaml").write_text(yaml.safe_dump(config))
    result = invoke(hb_mapper.main, ["makertbin", "-c", "c.yaml", "--model-type", "onnx"])
    assert result.exit_code == 0 and "ERROR" not in result.output, result.output
    assert "remove_node_type: Transpose node tr kept: the tensor 'nzT' on its other side has no fixed shape" \
        in result.output, result.output
    listed = invoke(hb_model_modifier.main, ["out/m.bin"])
    assert "'tr'" not in listed.output, listed.output
    refused = invoke(hb_model_modifier.main, ["out/m.bin", "-r", "tr"])
    assert refused.exit_code != 0 and "node 'tr' cannot be deleted: the tensor 'nzT' on its other side has no " \
        "fixed shape" in refused.output, refused.output
    assert not Path("out/m_modified.bin").exists()
    by_type = invoke(hb_model_modifier.main, ["out/m.bin", "-a", "Transpose"])
    assert by_type.exit_code != 0 and "tr is not: the tensor 'nzT' on its other side has no fixed shape" \
        in by_type.output, by_type.output
