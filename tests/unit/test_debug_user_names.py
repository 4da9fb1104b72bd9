"""The debugger speaks in the user's node names, and makertbin takes them back (hunt 13 D4).

The optimize stage writes a bilinear Resize as a Pad 'Resize_0_edges' and a ConvTranspose, and onnxruntime wraps
the Gemm it makes of a MatMul and an Add over a 3-D tensor in 'gemm_input_reshape' / 'gemm_output_reshape'. The
node ranking listed those names (the Resize's cost booked on the Pad), and run_on_cpu refused them as names the
model does not have, with nothing pointing at the user's node.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml
from builders import FloatModel, _Graph, make_project
from click.testing import CliRunner, Result
from debug_support import Dumped, convert_with_dump

import horizon_nn.debug as dbg
from hbtools.cli.hb_mapper import main
from hbtools.graph.origins import recorded_origins


def _resize_and_linear() -> FloatModel:
    """Conv -> Relu -> bilinear Resize x2 -> Conv -> [1, 4, 256] -> Transpose -> MatMul + Add (a Linear on 3-D)."""
    g = _Graph(3)
    a = g.op("Relu", [g.conv("data", 3, 8)])
    r = g.op("Resize", [a, "", g.const(np.array([1, 1, 2, 2], np.float32), "scales")], mode="linear",
             coordinate_transformation_mode="half_pixel")
    c = g.conv(r, 8, 4)
    t = g.op("Transpose", [g.op("Reshape", [c, g.const(np.array([1, 4, -1], np.int64), "shape")])], perm=[0, 2, 1])
    w = g.const((g.rng.standard_normal((4, 6)) * 0.5).astype(np.float32), "w")
    b = g.const((g.rng.standard_normal(6) * 0.1).astype(np.float32), "b")
    return g.model({"data": [1, 3, 8, 8]}, [g.op("Add", [g.op("MatMul", [t, w]), b])])


@pytest.fixture(scope="module")
def dumped(tmp_path_factory: pytest.TempPathFactory) -> Dumped:
    return convert_with_dump(tmp_path_factory.mktemp("user_names"), _resize_and_linear())


def _user_names(dumped: Dumped) -> set[str]:
    """The names run_on_cpu takes: the model's nodes and the input preprocessing makertbin puts before them."""
    return {n.name for n in onnx.load(str(dumped.paths["original"])).graph.node}


def _sens(dumped: Dumped, node_type: str) -> dict[str, dict[str, str]]:
    return dbg.get_sensitivity_of_nodes(model_or_file=str(dumped.calibrated), calibrated_data=str(dumped.data),
                                        node_type=node_type, verbose=True)


def test_the_rankings_name_only_the_users_nodes(dumped: Dumped, capsys: pytest.CaptureFixture) -> None:
    users = _user_names(dumped)
    ours = {n.name for n in dumped.model().graph.node} - users
    assert {"Resize_0_edges", "gemm_input_reshape"} <= ours, "the model these names come from"
    node_rows = _sens(dumped, "node")
    assert set(node_rows) <= users, node_rows
    assert {"Resize_0", "MatMul_0", "Conv_0", "Conv_1"} <= set(node_rows)
    capsys.readouterr()
    _sens(dumped, "activation")
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split()[:4] == ["Activation", "Node", "Threshold", "Bit"], "the seed's columns kept"
    for row in lines[3:]:
        assert set(row.split()[1].split(",")) <= users, row
    curves = dbg.plot_acc_error(save_dir=str(dumped.data.parent / "acc"), model_or_file=str(dumped.calibrated),
                                calibrated_data=str(dumped.data), quantize_node=["weight"])
    assert set(curves["weight"]) <= users and "Resize_0" in curves["weight"]


def test_a_users_node_written_as_several_is_measured_as_a_whole(dumped: Dumped) -> None:
    """Resize_0's row quantizes the Pad's input too: the cost the Pad row used to carry, under the user's name."""
    node_rows = _sens(dumped, "node")
    activation_rows = _sens(dumped, "activation")
    resize_input = next(n for n in activation_rows if n.startswith("Relu_0"))
    assert float(node_rows["Resize_0"]["cosine-similarity"]) == pytest.approx(
        float(activation_rows[resize_input]["cosine-similarity"]), abs=1e-8)  # and its exact kernel
    assert float(node_rows["Resize_0"]["cosine-similarity"]) < 1 - 1e-9, "not a free ConvTranspose any more"
    assert dbg.get_sensitivity_of_nodes(model_or_file=str(dumped.calibrated), calibrated_data=str(dumped.data),
                                        interested_nodes=["Resize_0_edges"]), "an older table's name still taken"


def _makertbin_with_run_on_cpu(root: Path, names: list[str]) -> Result:
    project = make_project(root, _resize_and_linear())
    config = yaml.safe_load(project.config_path.read_text())
    config["calibration_parameters"]["run_on_cpu"] = names
    project.config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    return CliRunner().invoke(main, ["makertbin", "--config", str(project.config_path), "--model-type", "onnx"],
                              catch_exceptions=False)


def test_run_on_cpu_with_a_name_hbtools_wrote_names_the_users_node(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = _makertbin_with_run_on_cpu(tmp_path, ["Resize_0_edges", "gemm_input_reshape"])
    assert result.exit_code != 0
    errors = [line for line in result.output.splitlines() if " ERROR " in line]
    assert "run_on_cpu names 2 node(s) (of 2) that the model does not have" in errors[0], result.output
    assert "'Resize_0_edges' (a node hbtools writes for the model's node 'Resize_0'" in errors[0], errors
    assert "give 'Resize_0'" in errors[0] and "give 'MatMul_0'" in errors[0], errors
    assert "Traceback" not in result.output and not list(tmp_path.glob("model_output/*.bin"))



def test_run_on_cpu_with_the_users_name_places_the_nodes_written_for_it(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A HardSwish (opset 14) is written as a HardSigmoid and a Mul: run_on_cpu with its name was 'ignored' with
    a WARNING and the node stayed on the BPU, while the parts' names were refused as 'give the HardSwish's'."""
    g = _Graph(4)
    y = g.conv(g.op("HardSwish", [g.conv("data", 3, 8)]), 8, 4)
    fm = g.model({"data": [1, 3, 8, 8]}, [y], opset=17)
    [hard_swish] = [n.name for n in fm.model.graph.node if n.op_type == "HardSwish"]
    monkeypatch.chdir(tmp_path)
    project = make_project(tmp_path / "p", fm, cal_count=2)
    project.write(calibration_parameters={"calibration_type": "max", "run_on_cpu": [hard_swish]})
    result = CliRunner().invoke(main, ["makertbin", "--config", str(project.config_path), "--model-type", "onnx"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "ignored" not in result.output, result.output
    cpu = [line for line in result.output.splitlines() if f"placed on the CPU by run_on_cpu / node_info: {hard_swish}"
           in line]
    assert {line.split()[1] for line in cpu} == {"HardSigmoid", "Mul"}, result.output[-3000:]


def _transpose_before_layer_norm() -> FloatModel:
    """Conv -> [1, 8, 16] -> Transpose -> LayerNorm as opset 11 writes it (ReduceMean, Sub, Pow, ...) -> MatMul ->
    Transpose back -> Reshape -> Conv: the block of a torch model exported at opset 11 (hunt 14b D7)."""
    g = _Graph(5)
    c = g.op("Relu", [g.conv("data", 3, 8)])
    t = g.op("Transpose", [g.op("Reshape", [c, g.const(np.array([1, 8, -1], np.int64), "shape")])], perm=[0, 2, 1])
    mean = g.op("ReduceMean", [t], axes=[-1])
    centred = g.op("Sub", [t, mean])
    var = g.op("ReduceMean", [g.op("Pow", [centred, g.const(np.array(2.0, np.float32), "two")])], axes=[-1])
    std = g.op("Sqrt", [g.op("Add", [var, g.const(np.array(1e-5, np.float32), "eps")])])
    normed = g.op("Div", [centred, std])
    scaled = g.op("Add", [g.op("Mul", [normed, g.const(np.ones(8, np.float32), "gamma")]),
                          g.const(np.zeros(8, np.float32), "beta")])
    w = g.const((g.rng.standard_normal((8, 8)) * 0.3).astype(np.float32), "w")
    back = g.op("Transpose", [g.op("Add", [t, g.op("MatMul", [scaled, w])])], perm=[0, 2, 1])
    y = g.conv(g.op("Reshape", [back, g.const(np.array([1, 8, 4, 4], np.int64), "shape")]), 8, 4)
    return g.model({"data": [1, 3, 4, 4]}, [y], opset=11)


def test_a_transpose_onnxruntime_moved_is_the_users_transpose(tmp_path: Path) -> None:
    """onnxruntime pushes the Transpose before a LayerNorm past its Sub; the moved Transpose was recorded as
    written for 'Sub_0', a node inside the LayerNorm (and then its name went to run_on_cpu's ERROR)."""
    fm = _transpose_before_layer_norm()
    users = {n.name: n.op_type for n in fm.model.graph.node}
    project = make_project(tmp_path, fm, cal_count=2)
    result = CliRunner().invoke(main, ["makertbin", "--config", str(project.config_path), "--model-type", "onnx"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output[-3000:]
    optimized = onnx.load(str(next(tmp_path.glob("model_output/*_optimized_float_model.onnx"))))
    origins = recorded_origins(optimized)
    moved = [n.name for n in optimized.graph.node if n.op_type == "Transpose" and n.name not in users]
    assert moved, "onnxruntime moved no Transpose: the model no longer shows the case"
    for name in moved:
        assert users.get(origins.get(name, name)) == "Transpose", (name, origins.get(name))


TABLE_ROW = re.compile(r"^(\S+)\s+(BPU|CPU)\s+(id\(\d+\)|--)\s+(\S+)")


def _table(output: str) -> list[tuple[str, ...]]:
    start = output.index("The converted model node information")
    end = output.index("\n20", start)  # the next log line
    return [m.groups() for line in output[start:end].splitlines() if (m := TABLE_ROW.match(line))]


def test_the_node_tables_name_the_users_nodes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """makertbin's and the checker's node tables listed the optimizer's names ('Resize_0_edges',
    'gemm_input_reshape', 'gemm_output_reshape'), which the user's model does not have. Now a node written as
    several is one row under the user's name, typed by the part that computes."""
    monkeypatch.chdir(tmp_path)
    fm = _resize_and_linear()
    users = {n.name for n in fm.model.graph.node} | {"HZ_PREPROCESS_FOR_data"}
    project = make_project(tmp_path / "p", fm, cal_count=2)
    made = CliRunner().invoke(main, ["makertbin", "--config", str(project.config_path), "--model-type", "onnx"],
                              catch_exceptions=False)
    assert made.exit_code == 0, made.output[-3000:]
    checked = CliRunner().invoke(main, ["checker", "--model-type", "onnx", "--march", "bayes-e", "--model",
                                        str(tmp_path / "p" / "model.onnx")], catch_exceptions=False)
    assert checked.exit_code == 0, checked.output[-3000:]
    for output in (made.output, checked.output):
        rows = _table(output)
        names = [r[0] for r in rows]
        assert set(names) <= users and len(names) == len(set(names)), rows
        by_name = {r[0]: r for r in rows}
        assert by_name["Resize_0"][3] == "HzSQuantizedConvTranspose", rows
        assert by_name["MatMul_0"][3] != "Reshape", rows
    optimized = onnx.load(str(next((tmp_path / "p").glob("model_output/*_optimized_float_model.onnx"))))
    assert {"Resize_0_edges", "gemm_input_reshape"} <= {n.name for n in optimized.graph.node}, "the model's own names"


@pytest.mark.parametrize("key", ["InputType", "OutputType"])
def test_node_info_int16_with_the_users_name_types_its_tensors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                key: str) -> None:
    """The node tables name a HardSwish written as a HardSigmoid and a Mul by the user's name, which ON took but
    InputType / OutputType dropped: 'not in the optimized model', and nothing became int16 (hunt 17 D1)."""
    g = _Graph(4)
    y = g.conv(g.op("HardSwish", [g.conv("data", 3, 8)]), 8, 4)
    fm = g.model({"data": [1, 3, 8, 8]}, [y], opset=17)
    [hard_swish] = [n for n in fm.model.graph.node if n.op_type == "HardSwish"]
    monkeypatch.chdir(tmp_path)
    project = make_project(tmp_path / "p", fm, cal_count=2)
    project.write(calibration_parameters={"calibration_type": "max"},
                  model_parameters={"node_info": {hard_swish.name: {key: "int16"}}})
    result = CliRunner().invoke(main, ["makertbin", "--config", str(project.config_path), "--model-type", "onnx"],
                                catch_exceptions=False)
    assert result.exit_code == 0 and "not in the optimized model" not in result.output, result.output[-3000:]
    calibrated = onnx.load(str(project.artefact("calibrated")))
    bits = {n.input[0]: next(a.i for a in n.attribute if a.name == "bits") for n in calibrated.graph.node
            if n.op_type == "HzCalibration" and n.input[0] in (*hard_swish.input, *hard_swish.output)}
    typed = hard_swish.input[0] if key == "InputType" else hard_swish.output[0]
    assert bits == {t: 16 if t == typed else 8 for t in (hard_swish.input[0], hard_swish.output[0])}, bits


def _cpu_reasons(output: str) -> list[tuple[str, str, str]]:
    """(node, type, reason) rows of the table of CPU nodes and their reasons."""
    start = output.index("The nodes running on the CPU and why")
    end = output.index("\n20", start)
    return [(line[:line.index(" ")], *line.split(None, 2)[1:]) for line in output[start:end].splitlines()[3:]]


def test_the_cpu_reasons_say_which_parts_of_a_users_node_run_on_the_cpu(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A Linear over 3-D put on X3's BPU runs its Gemm there and the Reshapes written around it on the CPU: the CPU
    reasons listed 'MatMul_0  Reshape  Reshape is not supported' as if the MatMul ran on the CPU, and the count
    line counted it as a CPU node, with nothing saying that only parts run there (hunt 17 D4). The tokens are
    no transpose of the map: tokens transposed from it are computed over the map, Reshapes and all (hunt 27 D5)."""
    g = _Graph(5)
    c = g.conv("data", 3, 16)
    t = g.op("Relu", [g.op("Reshape", [c, g.const(np.array([1, -1, 16], np.int64), "s3")])])
    w = g.const((g.rng.standard_normal((16, 64)) * 0.3).astype(np.float32), "w")
    lin = g.op("Add", [g.op("MatMul", [t, w]), g.const((g.rng.standard_normal(64) * 0.1).astype(np.float32), "b")])
    back = g.op("Reshape", [g.op("Transpose", [lin], perm=[0, 2, 1]),
                            g.const(np.array([1, 64, 16, 16], np.int64), "s4")])
    fm = g.model({"data": [1, 3, 16, 16]}, [g.conv(back, 64, 8)])
    monkeypatch.chdir(tmp_path)
    project = make_project(tmp_path / "p", fm, march="bernoulli2", cal_count=2)
    project.write(calibration_parameters={"calibration_type": "max", "run_on_bpu": ["MatMul_0"]})
    made = CliRunner().invoke(main, ["makertbin", "--config", str(project.config_path), "--model-type", "onnx"],
                              catch_exceptions=False)
    assert made.exit_code == 0, made.output[-3000:]
    assert ("MatMul_0", "BPU", "id(1)", "HzSQuantizedConv") in _table(made.output), made.output[-3000:]
    matmul = [r for r in _cpu_reasons(made.output) if r[0] == "MatMul_0"]
    assert matmul and all(kind == "Reshape" and reason.endswith(
        "(the optimize stage wrote this Reshape for MatMul_0; its other parts run on the BPU)")
        for _, kind, reason in matmul), matmul
    cpu = {r[0] for r in _cpu_reasons(made.output)}
    count = re.search(r"(\d+) CPU node\(s\), 1 of them only in part: MatMul_0 \((\d+) nodes of the optimized model\)",
                      made.output)
    assert count and int(count[1]) == len(cpu), made.output[-3000:]
    quantized = onnx.load(str(project.artefact("quantized")))
    in_float = [n.name for n in quantized.graph.node if n.domain != "horizon" and n.name != "data_nchw_Transpose"]
    assert int(count[2]) == len(in_float), (count[0], in_float)  # the CPU nodes, but the input's layout Transpose


def _spelled_out_layer_norm() -> FloatModel:
    """MatMul -> ReduceMean / Sub / Pow / ReduceMean / Add / Sqrt / Div / Mul / Add -> MatMul: the optimize stage
    fuses the LayerNorm pattern into one node, which keeps the first ReduceMean's name."""
    g = _Graph(6)
    a = g.op("MatMul", ["feat", g.const((g.rng.standard_normal((32, 32)) * 0.3).astype(np.float32), "w1")])
    d = g.op("Sub", [a, g.op("ReduceMean", [a], axes=[-1])])
    var = g.op("ReduceMean", [g.op("Pow", [d, g.const(np.float32(2), "two")])], axes=[-1])
    sd = g.op("Sqrt", [g.op("Add", [var, g.const(np.float32(1e-5), "eps")])])
    gamma = g.const((g.rng.standard_normal(32) * 0.3 + 1).astype(np.float32), "gamma")
    beta = g.const((g.rng.standard_normal(32) * 0.3).astype(np.float32), "beta")
    out = g.op("Add", [g.op("Mul", [g.op("Div", [d, sd]), gamma]), beta])
    w2 = g.const((g.rng.standard_normal((32, 8)) * 0.3).astype(np.float32), "w2")
    return g.model({"feat": [1, 16, 32]}, [g.op("MatMul", [out, w2])], opset=13, featuremap={"feat"})


def _node_named(fm: FloatModel, op_type: str, last: bool = False) -> onnx.NodeProto:
    nodes = [n for n in fm.model.graph.node if n.op_type == op_type]
    return nodes[-1] if last else nodes[0]


@pytest.mark.parametrize("named", ["output", "inside", "cpu"])
def test_node_info_on_a_node_of_a_fused_layer_norm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   named: str) -> None:
    """node_info on a spelled-out LayerNorm's last Add or its Div was ignored as 'not in the optimized model': the
    fused node keeps only the first ReduceMean's name (hunt 18 D3). The last Add's OutputType types the fused
    node's output, which is the Add's; the Div writes nothing the fused node writes, so its OutputType is ignored
    with a WARNING naming the fused node; run_on_cpu on it puts the fused node on the CPU."""
    fm = _spelled_out_layer_norm()
    first_mean, div = _node_named(fm, "ReduceMean"), _node_named(fm, "Div")
    last_add = _node_named(fm, "Add", last=True)
    node_info = {"output": {last_add.name: {"OutputType": "int16"}}, "inside": {div.name: {"OutputType": "int16"}},
                 "cpu": {div.name: {"ON": "CPU"}}}[named]
    monkeypatch.chdir(tmp_path)
    project = make_project(tmp_path / "p", fm, cal_count=2)
    project.write(calibration_parameters={"calibration_type": "max"}, model_parameters={"node_info": node_info})
    result = CliRunner().invoke(main, ["makertbin", "--config", str(project.config_path), "--model-type", "onnx"],
                                catch_exceptions=False)
    assert result.exit_code == 0 and "not in the optimized model" not in result.output, result.output[-3000:]
    calibrated = onnx.load(str(project.artefact("calibrated")))
    bits = {n.input[0]: next(a.i for a in n.attribute if a.name == "bits") for n in calibrated.graph.node
            if n.op_type == "HzCalibration"}
    if named == "output":
        assert bits.get(last_add.output[0]) == 16, bits
    elif named == "inside":
        assert bits.get(last_add.output[0]) == 8, bits
        assert (f"node_info names node {div.name}, which the optimize stage fused into node {first_mean.name} "
                f"(HzLayerNorm)") in result.output, result.output[-3000:]
    else:
        assert (first_mean.name, "CPU") in [row[:2] for row in _table(result.output)], result.output[-3000:]


def test_run_on_cpu_of_a_linears_bias_add_moves_the_whole_gemm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """onnxruntime fuses a Linear's MatMul and bias Add over a 3-D tensor into a Gemm between two Reshapes, all
    written for the MatMul. run_on_cpu naming the Add moved only the last Reshape, which now writes the Add's
    output, to the CPU, and the Gemm computing the Add stayed on the BPU (hunt 21 D4)."""
    monkeypatch.chdir(tmp_path)
    project = make_project(tmp_path / "p", _resize_and_linear(), cal_count=2)
    project.write(calibration_parameters={"calibration_type": "max", "run_on_cpu": ["Add_0"]})
    made = CliRunner().invoke(main, ["makertbin", "--config", str(project.config_path), "--model-type", "onnx"],
                              catch_exceptions=False)
    assert made.exit_code == 0, made.output[-3000:]
    matmul = [row for row in _table(made.output) if row[0] == "MatMul_0"]
    assert matmul and all(row[1] == "CPU" for row in matmul), matmul
