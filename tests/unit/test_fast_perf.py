"""``makertbin --fast-perf`` and remove_node_type / remove_node_name at compile."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from builders import MODELS, Project, _Graph, make_project
from click.testing import CliRunner, Result

from hbtools.cli.hb_mapper import main
from hbtools.runtime.binfile import read_bin
from hbtools.runtime.runtime_model import open_model

ROW = re.compile(r"^(\S+)\s+(BPU|CPU)\s+(id\(\d+\)|--)\s+(\S+)")


def invoke(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def rows(output: str) -> dict[str, tuple[str, str]]:
    start = output.index("The converted model node information")
    return {m[1]: (m[2], m[3]) for line in output[start:].splitlines() if (m := ROW.match(line))}


@pytest.fixture(autouse=True)
def _cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)


def _softmax_sandwich() -> onnx.ModelProto:
    """conv -> Hardmax -> Transpose -> Hardmax -> conv -> Reshape: the Transpose is BPU-able but isolated."""
    g = _Graph(11)
    s1 = g.op("Hardmax", [g.conv("data", 3, 8)], axis=1)  # not a BPU op
    s2 = g.op("Hardmax", [g.op("Transpose", [s1], perm=[0, 1, 3, 2])], axis=1)
    out = g.op("Reshape", [g.conv(s2, 8, 4), g.const(np.array([1, 4, 64], dtype=np.int64), "shape")])
    return g.model({"data": [1, 3, 8, 8]}, [out]).model


def test_fast_perf_builds_with_everything_on_the_bpu() -> None:
    onnx.save(_softmax_sandwich(), "net.onnx")
    result = invoke("makertbin", "--fast-perf", "--model", "net.onnx", "--model-type", "onnx", "--march", "bayes-e",
                    "-i", "data", "1x3x8x8")
    assert result.exit_code == 0, result.output
    out = result.output
    assert "Convert to runtime bin file successfully!" in out
    assert rows(out)["Transpose_0"] == ("BPU", "id(1)")  # a checker would keep it in float
    checked = invoke("checker", "--model", "net.onnx", "--march", "bayes-e")
    assert rows(checked.output)["Transpose_0"] == ("CPU", "--")
    assert "calibration_type 'skip'" in out and "WARNING" in out
    wd = Path("model_output")
    assert {p.name for p in wd.iterdir()} >= {"net.bin", "net_quantized_model.onnx"}
    model = read_bin(wd / "net.bin").models[0]
    assert model.config["compiler_parameters"]["optimize_level"] == "O3"
    assert model.config["calibration_parameters"]["calibration_type"] == "skip"
    # The output Dequantize goes, then the Reshape it exposed: removed until none is left.
    assert [d["type"] for d in model.deleted_nodes] == ["Dequantize", "Reshape"]
    # The last conv's int32 accumulators, which the Reshape carried to the output: a scale per channel.
    assert model.outputs[0]["dtype"] == "int32" and len(model.outputs[0]["scale"]) == 4
    open_model(wd / "net.bin")  # still a valid runtime model
    assert Path("hb_mapper_makertbin.log").is_file()


def test_fast_perf_sets_a_dynamic_batch_to_one() -> None:
    model = MODELS["resnet_like"]().model
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "N"
    onnx.save(model, "dyn.onnx")
    result = invoke("makertbin", "--fast-perf", "--model", "dyn.onnx", "--march", "bernoulli2")
    assert result.exit_code == 0, result.output
    assert "dynamic first dimension set to 1" in result.output
    model.graph.input[0].type.tensor_type.shape.dim[2].dim_param = "H"
    onnx.save(model, "dyn.onnx")
    result = invoke("makertbin", "--fast-perf", "--model", "dyn.onnx", "--march", "bernoulli2")
    assert result.exit_code == 1 and re.search(r"ERROR .*dynamic shape.*--input-shape", result.output)


@pytest.mark.parametrize("args", [
    ["--config", "c.yaml", "--model", "m.onnx", "--march", "bayes-e"],
    ["--march", "bayes-e"],
    ["--model", "m.onnx"],
])
def test_fast_perf_argument_errors(args: list[str]) -> None:
    result = invoke("makertbin", "--fast-perf", *args)
    assert result.exit_code == 2  # a command-line mistake (docs/errors.md)
    assert re.search(r"ERROR .*(--config|--model|--march)", result.output), result.output
    assert "Traceback" not in result.output


@pytest.fixture
def project(tmp_path: Path) -> Project:
    """data_movement ends in Reshape -> (HzDequantize) -> output."""
    return make_project(tmp_path / "p", MODELS["data_movement"](), cal_count=2)


def _deleted(project: Project) -> list[str]:
    return [d["type"] for d in read_bin(project.artefact("bin")).models[0].deleted_nodes]


def _build(project: Project, expect_ok: bool = True) -> Result:
    result = invoke("makertbin", "--config", str(project.config_path), "--model-type", "onnx")
    assert not expect_ok or result.exit_code == 0, result.output
    return result


def test_remove_node_type_in_order(project: Project) -> None:
    project.write(model_parameters={"remove_node_type": "Dequantize; Reshape"})
    out = _build(project).output
    assert _deleted(project) == ["Dequantize", "Reshape"]
    assert re.search(r"removed Dequantize node \S+ at the model output", out)
    # The other order: the Reshape is not at the output yet when its turn comes, so it stays.
    project.write(model_parameters={"remove_node_type": "Reshape; Dequantize"})
    _build(project)
    assert _deleted(project) == ["Dequantize"]
    open_model(project.artefact("bin"))


def test_remove_node_type_that_removes_nothing_warns(project: Project) -> None:
    project.write(model_parameters={"remove_node_type": "Softmax; Reshape"})
    out = _build(project).output
    assert re.search(r"WARNING remove_node_type: the model has no Softmax node; nothing removed", out)
    # The Reshape sits behind the output Dequantize, which the list does not remove first.
    assert re.search(r"WARNING remove_node_type: no Reshape node is next to a model input or output .*"
                     r"Reshape_0.* kept", out), out
    assert _deleted(project) == []


def test_remove_node_type_names_no_cast_the_users_model_lacks(tmp_path: Path) -> None:
    """D-Robotics' classifier configs list Cast in remove_node_type: the WARNING named the Casts the quantized model
    puts around an int8 MaxPool at opset 11 (onnxruntime has no integer kernel there), nodes the user's model
    never had (hunt 19 D5)."""
    g = _Graph(7)
    pooled = g.op("MaxPool", [g.op("Relu", [g.conv("data", 3, 8)])], kernel_shape=[2, 2], strides=[2, 2])
    fm = g.model({"data": [1, 3, 16, 16]}, [g.conv(pooled, 8, 4)], opset=11)
    project = make_project(tmp_path / "p", fm, cal_count=2)
    project.write(calibration_parameters={"calibration_type": "max"}, model_parameters={"remove_node_type": "Cast"})
    out = _build(project).output
    quantized = onnx.load(str(project.artefact("quantized")))
    assert any(n.op_type == "Cast" for n in quantized.graph.node), "the round trip this test is about"
    assert re.search(r"WARNING remove_node_type: the model has no Cast node; nothing removed", out), out[-2000:]


def test_remove_node_name(project: Project) -> None:
    project.write(model_parameters={"remove_node_name": "Conv_0; Conv_2_out_HzDequantise"})
    failed = _build(project, expect_ok=False)
    # SPEC §10: a node name the model does not have is an ERROR offering the closest names; nothing is written.
    # The output Dequantize is named after the conv whose int32 accumulators the Reshape carries to it.
    assert failed.exit_code == 1, failed.output
    assert re.search(r"ERROR remove_node_name: the model has no node 'Conv_2_out_HzDequantise'.*"
                     r"Conv_2_out_HzDequantize", failed.output)
    assert not project.artefact("bin").exists()
    project.write(model_parameters={"remove_node_name": "Conv_0; Conv_2_out_HzDequantize"})
    out = _build(project).output
    assert re.search(r"WARNING remove_node_name: node Conv_0 \(HzSQuantizedConv\) is not a removable node", out)
    model = read_bin(project.artefact("bin")).models[0]
    assert [d["name"] for d in model.deleted_nodes] == ["Conv_2_out_HzDequantize"]
    # The quantized ONNX artefact keeps the node; only the .bin loses it.
    names = {n.name for n in onnx.load(str(project.artefact("quantized"))).graph.node}
    assert "Conv_2_out_HzDequantize" in names


def test_a_remove_node_name_no_compiled_model_can_have_is_refused_before_calibration(project: Project) -> None:
    """Hunt 38 D7: a misspelt name stopped the run at compile, after the whole calibration; the optimized model
    already tells which names a compiled model can have (its nodes, the Quantize / Dequantize of its tensors)."""
    project.write(calibration_parameters={"calibration_type": "default"},
                  model_parameters={"remove_node_name": "Conv_2_out_HzDequantize; Conv_O"})
    failed = _build(project, expect_ok=False)
    assert failed.exit_code == 1, failed.output
    assert re.search(r"ERROR remove_node_name: the model has no node 'Conv_O' \(closest: .*'Conv_0'", failed.output)
    assert "calibration method" not in failed.output and "Model optimization done" not in failed.output
    assert not project.artefact("bin").exists() and not project.artefact("calibrated").exists()
    # a name only the quantize stage makes (a layout Transpose) is left to compile, which keeps it with a WARNING
    project.write(calibration_parameters={"calibration_type": "max"},
                  model_parameters={"remove_node_name": "data_nhwc_Transpose"})
    out = _build(project, expect_ok=False).output
    assert "Model optimization done" in out, out[-2000:]


def test_a_model_file_name_with_a_space_names_the_artefacts_by_its_stem() -> None:
    """The artefacts take the model file's name: 'my net.onnx' gives my_net.bin and my_net.html alike (a prefix
    must be a file stem since hunt 38 D14)."""
    onnx.save(_softmax_sandwich(), "my net.onnx")
    result = invoke("makertbin", "--fast-perf", "--model", "my net.onnx", "--model-type", "onnx", "--march",
                    "bayes-e", "-i", "data", "1x3x8x8")
    assert result.exit_code == 0, result.output
    assert (Path("model_output") / "my_net.bin").is_file() and (Path("model_output") / "my_net.html").is_file()
