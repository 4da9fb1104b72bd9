"""A config naming nodes the model lacks says every missing name at once, under the parameter that gave it.

Found on rdk_model_zoo configs whose node_info lists 10-40 nodes of one export: the message named only the
first missing node (one re-run per name) and listed node_info / run_on_cpu / run_on_bpu / set_node_data_type
whatever the user wrote.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml
from onnx import TensorProto, helper, numpy_helper

from hbtools.errors import HbError
from hbtools.pipeline.runner import makertbin


def _project(root: Path, model_parameters: dict, calibration_parameters: dict, relu: str = "Relu_0") -> Path:
    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.normal(scale=0.1, size=(4, 3, 3, 3)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], name="Conv_0", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["c"], ["y"], name=relu)],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(root / "m.onnx"))
    (root / "cal").mkdir()
    rng.integers(0, 256, (1, 3, 8, 8)).astype(np.float32).tofile(root / "cal" / "0.bin")
    config = {
        "model_parameters": {"onnx_model": "m.onnx", "march": "bayes-e", "working_dir": "out",
                             "output_model_file_prefix": "m", **model_parameters},
        "input_parameters": {"input_name": "x", "input_type_rt": "featuremap", "input_type_train": "featuremap",
                             "input_layout_train": "NCHW", "input_shape": "1x3x8x8", "norm_type": "no_preprocess"},
        "calibration_parameters": {"cal_data_dir": "cal", "cal_data_type": "float32", "calibration_type": "max",
                                   **calibration_parameters},
        "compiler_parameters": {"compile_mode": "latency"},
    }
    path = root / "c.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def test_every_missing_name_is_said_under_its_parameter(tmp_path: Path) -> None:
    node_info = {"Conv_0": {"ON": "BPU"}, "/blocks.1/attn/Softmax": {"ON": "BPU", "InputType": "int16"},
                 "/blocks.2/attn/Softmax": {"ON": "BPU", "InputType": "int16"}}
    path = _project(tmp_path, {"node_info": node_info}, {"run_on_cpu": "Relu_9"})
    with pytest.raises(HbError) as info:
        makertbin(path, "onnx")
    text = str(info.value)
    assert "node_info names 2 node(s) (of 3) that the model does not have" in text
    assert "'/blocks.1/attn/Softmax'" in text and "'/blocks.2/attn/Softmax'" in text
    assert "run_on_cpu names 1 node(s) (of 1)" in text and "'Relu_9'" in text and "closest: 'Relu_0'" in text
    assert "set_node_data_type" not in text and "run_on_bpu" not in text
    assert not (tmp_path / "out" / "m.bin").exists()


def test_a_name_holding_a_separator_is_said_to_need_a_yaml_list(tmp_path: Path) -> None:
    """tf2onnx names nodes 'a;b' (basic-pitch's 'model_1/normalized_log_1/Square;model_1/normalized_log_1/Square').
    Written as the string form of run_on_cpu, the name splits at ';' and the ERROR offered the very name the
    user wrote as the closest one; it now says to give it as a YAML list item."""
    name = "model_1/log/Square;model_1/log/Square1"
    path = _project(tmp_path, {}, {"run_on_cpu": name}, relu=name)
    with pytest.raises(HbError) as info:
        makertbin(path, "onnx")
    text = str(info.value)
    assert "run_on_cpu names 2 node(s) (of 2) that the model does not have" in text, text
    assert f"the model has node(s) '{name}'" in text and "give such a name as an item of a YAML list" in text, text
    assert f"(run_on_cpu: ['{name}'])" in text, text
    (tmp_path / "list").mkdir()
    makertbin(_project(tmp_path / "list", {}, {"run_on_cpu": [name]}, relu=name), "onnx")  # a list names it
    assert (tmp_path / "list" / "out" / "m.bin").exists()


def test_the_vendors_name_for_the_mul_it_writes_for_a_div_names_that_div(tmp_path: Path) -> None:
    """Hunt 40 D2: rdk_model_zoo's ConvNeXt / EdgeNeXt configs give node_info to '<Div>_mul', the Mul the vendor's
    optimizer writes for a Div by a constant; they were refused as naming a node the model lacks."""
    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.normal(scale=0.1, size=(4, 3, 3, 3)).astype(np.float32), "w")
    two = numpy_helper.from_array(np.array(2.0, np.float32), "two")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], name="Conv_0", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["c"], ["r"], name="Relu_0"),
         helper.make_node("Div", ["r", "two"], ["y"], name="/ds/Div")],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], [weight, two])
    path = _project(tmp_path, {"node_info": {"/ds/Div_mul": {"ON": "CPU"}}}, {})
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(tmp_path / "m.onnx"))
    makertbin(path, "onnx")
    quantized = onnx.load(str(tmp_path / "out" / "m_quantized_model.onnx"))
    div = [n.op_type for n in quantized.graph.node if n.name.startswith("/ds/Div")]
    assert div and all(op in ("Div", "Mul") for op in div), [(n.name, n.op_type) for n in quantized.graph.node]
    # without the config's name the Div goes to the BPU: the name above is what put it on the CPU
    (tmp_path / "plain").mkdir()
    onnx.save(model, str(tmp_path / "plain" / "m.onnx"))
    path = _project(tmp_path / "plain", {}, {})
    onnx.save(model, str(tmp_path / "plain" / "m.onnx"))
    makertbin(path, "onnx")
    quantized = onnx.load(str(tmp_path / "plain" / "out" / "m_quantized_model.onnx"))
    assert not any(n.op_type in ("Div", "Mul") for n in quantized.graph.node), quantized.graph.node
