"""``hb_mapper checker`` / ``makertbin`` with ``--model-type caffe``, as a user runs them.

The Caffe models (a MobileNet-like and a ResNet-like network) are built by the test
(prototxt + caffemodel); click's CliRunner runs the commands in a temp folder.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml
from builders import EXACT_MEAN, EXACT_SCALE, image_input_params
from caffe_builders import CaffeNet, mobilenet_like, resnet_like
from click.testing import CliRunner, Result

from hbtools.cli.hb_mapper import main
from hbtools.data.folders import sample_files
from hbtools.runtime import HB_ONNXRuntime

SUCCESS = "Convert to runtime bin file successfully!"
SIZE = 16
NETS = {"mobilenet_like": mobilenet_like, "resnet_like": resnet_like}
ARTEFACTS = ("_original_float_model.onnx", "_optimized_float_model.onnx", "_calibrated_model.onnx",
             "_quantized_model.onnx", ".bin")


def invoke(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def checker(*extra: str) -> Result:
    return invoke("checker", "--model-type", "caffe", "--march", "bayes-e", "--proto", "model.prototxt",
                  "--model", "model.caffemodel", *extra)


def error_lines(result: Result) -> list[str]:
    return [line for line in result.output.splitlines() if " ERROR " in line or line.startswith("ERROR")]


@pytest.fixture(autouse=True)
def _cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)


def write_project(net: CaffeNet, prefix: str, **model_parameters: object) -> Path:
    """model.prototxt, model.caffemodel, uint8 calibration images and config.yaml in the cwd."""
    net.write(Path.cwd(), "model")
    cal = Path("cal")
    cal.mkdir()
    rng = np.random.default_rng(3)
    for i in range(3):
        rng.integers(0, 256, (1, 3, SIZE, SIZE), dtype=np.uint8).tofile(cal / f"{i}.bin")
    config = {
        "model_parameters": {"prototxt": "model.prototxt", "caffe_model": "model.caffemodel", "march": "bayes-e",
                             "working_dir": "model_output", "output_model_file_prefix": prefix,
                             **model_parameters},
        "input_parameters": {"input_name": "data", "input_shape": f"1x3x{SIZE}x{SIZE}", **image_input_params()},
        "calibration_parameters": {"cal_data_dir": "cal", "calibration_type": "max"},
        "compiler_parameters": {"compile_mode": "latency", "optimize_level": "O3"},
    }
    path = Path("config.yaml")
    path.write_text(yaml.safe_dump({g: {k: v for k, v in p.items() if v is not None} for g, p in config.items()},
                                   sort_keys=False))
    return path


@pytest.mark.parametrize("name", sorted(NETS))
def test_caffe_model_through_checker_and_makertbin(name: str) -> None:
    net = NETS[name](SIZE)
    write_project(net, name)
    checked = checker()
    assert checked.exit_code == 0, checked.output
    assert not error_lines(checked) and "End Model Check" in checked.output
    first_conv = next(layer.name for layer in net.net.layer if layer.type == "Convolution")
    assert re.search(rf"^{first_conv}\s+BPU\s+id\(0\)", checked.output, re.M), "Caffe layer names in the table"

    result = invoke("makertbin", "--config", "config.yaml", "--model-type", "caffe")
    assert result.exit_code == 0, result.output
    assert SUCCESS in result.output and not error_lines(result)
    for suffix in ARTEFACTS:
        path = Path("model_output") / f"{name}{suffix}"
        assert path.is_file() and path.stat().st_size > 0, f"missing artefact {path}"

    # The original float model (HzPreprocess + the converted network) against numpy on the
    # same normalised image: uint8 data goes in through input_offset=128, as on the board.
    x = np.random.default_rng(9).integers(0, 256, (1, 3, SIZE, SIZE), dtype=np.uint8)
    original = HB_ONNXRuntime(model_file=str(Path("model_output") / f"{name}_original_float_model.onnx"))
    (got,) = original.run(None, {"data": x}, input_offset=128)
    mean, scale = (np.array(v, np.float64).reshape(1, 3, 1, 1) for v in (EXACT_MEAN, EXACT_SCALE))
    ref = net.forward({"data": (x - mean) * scale})[net.net.layer[-1].top[0]]
    assert got.shape == ref.shape
    rel = np.abs(got - ref).max() / np.abs(ref).max()
    assert rel <= 1e-5, f"original float model vs numpy: {rel:.3g} > 1e-5"
    quantized = HB_ONNXRuntime(model_file=str(Path("model_output") / f"{name}_quantized_model.onnx"))
    (q,) = quantized.run(None, {"data": x}, input_offset=128)
    assert np.abs(q - ref).max() < 0.1, "the quantized model still computes the same function"


def test_fast_perf_with_a_caffe_model() -> None:
    mobilenet_like(SIZE).write(Path.cwd(), "model")
    result = invoke("makertbin", "--fast-perf", "--model-type", "caffe", "--march", "bayes-e",
                    "--proto", "model.prototxt", "--model", "model.caffemodel")
    assert result.exit_code == 0, result.output
    assert SUCCESS in result.output
    assert (Path("model_output") / "model.bin").is_file()


def test_fast_perf_of_an_ssd_whose_prior_boxes_are_an_output() -> None:
    """An SSD's PriorBox output is a constant once converted. --fast-perf removes the boundary Dequantize
    nodes, and each removal dropped that constant with the unused weights ('graph output 'prior' is produced
    by no node'): the .bin now keeps it, and the simulator gives the float model's boxes."""
    from hbtools.runtime.binfile import read_bin
    from hbtools.runtime.runtime_model import load
    from hbtools.runtime.simulator import Simulator

    n = CaffeNet("ssd_like", seed=41)
    x = n.input("data", [1, 3, 32, 32])
    c = n.relu(n.conv(x, 8, 3, pad=1, stride=2))
    n.layer("PriorBox", [c, x], ["prior"], "prior_box_param { min_size: 8 aspect_ratio: 2 flip: true clip: false "
            "variance: 0.1 variance: 0.1 variance: 0.2 variance: 0.2 }", name="prior")
    n.conv(c, 16, 3, pad=1, top="loc")
    n.write(Path.cwd(), "model")
    result = invoke("makertbin", "--fast-perf", "--model-type", "caffe", "--march", "bayes-e",
                    "--proto", "model.prototxt", "--model", "model.caffemodel")
    assert result.exit_code == 0 and SUCCESS in result.output, result.output
    model = read_bin(Path("model_output") / "model.bin").models[0]
    assert any(d.get("type") == "Dequantize" for d in model.deleted_nodes), model.deleted_nodes
    rm = load(model)
    sim = Simulator(rm)
    picture = np.random.default_rng(0).integers(0, 256, (1, 32, 32, 3) if rm.inputs[0].shape[-1] == 3
                                                else (1, 3, 32, 32), dtype=np.uint8)
    boxes = sim.run({rm.inputs[0].name: picture})["prior"]
    float_boxes = HB_ONNXRuntime(model_file="model_output/model_original_float_model.onnx").run(
        ["prior"], {"data": np.zeros((1, 3, 32, 32), np.uint8)}, input_offset=128)[0]
    np.testing.assert_allclose(boxes.reshape(float_boxes.shape), float_boxes, rtol=0, atol=1e-6)


def seed_accuracy_net() -> CaffeNet:
    """The vendor document's example: an Input, a 1x1 Convolution and an Accuracy layer."""
    n = CaffeNet("accuracy_example", seed=40)
    n.input("data", [1, 3, SIZE, SIZE])
    n.layer("Convolution", ["data"], ["Convolution1"],
            'convolution_param { num_output: 8 bias_term: false pad: 0 kernel_size: 1 group: 1 stride: 1 '
            'weight_filler { type: "msra" } }', blobs=[n.randn(8, 3, 1, 1)], name="Convolution1")
    n.layer("Accuracy", ["Convolution1"], ["accuracy"], "include { phase: TEST }", name="accuracy")
    return n


def test_accuracy_layer_fails_like_the_vendor_tool() -> None:
    write_project(seed_accuracy_net(), "acc")
    expected = "ValueError: Not support layer name=accuracy type=Accuracy"
    checked = checker()
    assert checked.exit_code == 1
    errors = error_lines(checked)
    assert len(errors) == 1 and expected in errors[0], checked.output
    assert "Traceback" not in checked.output
    converted = invoke("makertbin", "--config", "config.yaml", "--model-type", "caffe")
    assert converted.exit_code == 1
    assert expected in error_lines(converted)[0], converted.output
    assert not Path("model_output").exists(), "nothing written"


def test_caffe_config_without_model_files() -> None:
    write_project(resnet_like(SIZE), "r", prototxt=None, caffe_model=None)  # None: key left out
    assert "prototxt" not in yaml.safe_load(Path("config.yaml").read_text())["model_parameters"]
    result = invoke("makertbin", "--config", "config.yaml", "--model-type", "caffe")
    assert result.exit_code == 1
    lines = [line.split(" ERROR ", 1)[1] for line in error_lines(result)]
    assert lines[:2] == ["Key 'model_parameters' error:", "Missing keys: 'caffe_model', 'prototxt'"], result.output
    assert not Path("model_output").exists()


def test_checker_needs_the_prototxt() -> None:
    result = invoke("checker", "--model-type", "caffe", "--march", "bayes-e", "--model", "model.caffemodel")
    assert result.exit_code == 2
    assert "--proto" in error_lines(result)[0]


def test_node_info_on_a_folded_scale_layer_types_the_convolution() -> None:
    """BatchNorm + Scale fold into the convolution, which then writes the Scale's output: a node_info entry for
    the Scale types what the convolution's BPU op writes (with the Relu it runs with); it was 'not in the
    optimized model' and dropped."""
    write_project(mobilenet_like(SIZE), "m", node_info={"scale4": {"OutputType": "int16"},
                                                         "convolution6": {"OutputType": "int16"}})
    result = invoke("makertbin", "--config", "config.yaml", "--model-type", "caffe")
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.output.splitlines() if " WARNING " in line]
    assert not any("not in the optimized model" in line for line in warnings), warnings
    calibrated = onnx.load(str(next(Path(".").glob("**/m_calibrated_model.onnx"))))
    original = onnx.load(str(next(Path(".").glob("**/m_original_float_model.onnx"))))
    [scale] = [n for n in original.graph.node if n.name == "scale4"]
    [relu] = [n for n in original.graph.node if list(n.input) == list(scale.output)]  # runs with the conv
    bits = {n.input[0]: next(a.i for a in n.attribute if a.name == "bits") for n in calibrated.graph.node
            if n.op_type == "HzCalibration"}
    assert bits.get(relu.output[0]) == 16, bits


def test_deploy_prototxt_with_batch_10() -> None:
    """Classic deploy prototxts declare input_dim: 10; one-sample calibration files then need input_shape."""
    n = CaffeNet("batch10", seed=41)
    x = n.input("data", [10, 3, SIZE, SIZE], form="input_dim")
    n.softmax(n.inner_product(n.pool(n.relu(n.conv(x, 8, 3, stride=2)), "MAX", 3, 2), 5))
    write_project(n, "b10", march="bayes-e")
    config = yaml.safe_load(Path("config.yaml").read_text())
    del config["input_parameters"]["input_shape"]
    Path("config.yaml").write_text(yaml.safe_dump(config))
    result = invoke("makertbin", "--config", "config.yaml", "--model-type", "caffe")
    assert result.exit_code == 1
    errors = error_lines(result)
    assert "holds one sample (768 bytes) but input 'data' has batch 10" in errors[0], result.output
    assert f"set input_shape: '1x3x{SIZE}x{SIZE}'" in errors[1]
    config["input_parameters"]["input_shape"] = f"1x3x{SIZE}x{SIZE}"
    Path("config.yaml").write_text(yaml.safe_dump(config))
    result = invoke("makertbin", "--config", "config.yaml", "--model-type", "caffe")
    assert result.exit_code == 0 and SUCCESS in result.output, result.output


def test_infer_reads_a_caffe_configs_inputs_from_its_prototxt() -> None:
    """A Caffe config without input_name / input_shape (the prototxt has them): hb_mapper infer runs the
    float and the quantized model on a picture. It refused every artefact ("input 'data' is int8 in the
    model; only float inputs can be images"): the inputs were looked up in onnx_model, empty for Caffe."""
    path = write_project(resnet_like(SIZE), "net")
    config = yaml.safe_load(path.read_text())
    del config["input_parameters"]["input_name"], config["input_parameters"]["input_shape"]
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    assert SUCCESS in invoke("makertbin", "--config", "config.yaml", "--model-type", "caffe").output
    picture = np.random.default_rng(5).integers(0, 256, (1, 3, SIZE, SIZE), dtype=np.uint8)
    picture.tofile("picture.bin")
    written = {}
    for kind in ("original_float", "quantized"):
        result = invoke("infer", "-c", "config.yaml", "--model-file", f"model_output/net_{kind}_model.onnx",
                        "--model-type", "caffe", "--image-file", "data", "picture.bin", "--output-dir", kind)
        assert result.exit_code == 0 and not error_lines(result), result.output
        written[kind] = sample_files(Path(kind))
    assert written["original_float"] and [p.name for p in written["quantized"]] == \
        [p.name for p in written["original_float"]]
    float_out, quant_out = (np.fromfile(written[k][0], np.float32) for k in ("original_float", "quantized"))
    cosine = float(np.dot(float_out, quant_out) / np.linalg.norm(float_out) / np.linalg.norm(quant_out))
    assert cosine > 0.98, cosine


def test_a_caffe_config_run_as_onnx_says_which_model_type() -> None:
    write_project(resnet_like(SIZE), "net")
    result = invoke("makertbin", "--config", "config.yaml")  # --model-type onnx, the default
    assert result.exit_code == 1
    assert any("run the command with --model-type caffe" in line for line in error_lines(result)), result.output


def test_a_caffemodel_given_to_the_onnx_checker_says_which_model_type() -> None:
    resnet_like(SIZE).write(Path.cwd(), "model")
    result = invoke("checker", "--march", "bayes-e", "--model", "model.caffemodel")
    assert result.exit_code == 1
    assert "--model-type caffe" in " ".join(error_lines(result)), result.output


def test_the_checker_warns_once_about_a_parameter_of_another_caffe_branch() -> None:
    """The checker reads the prototxt twice (its input shapes, then the parse stage): one WARNING, not two."""
    net = resnet_like(SIZE)
    net.write(Path.cwd(), "model")
    text = Path("model.prototxt").read_text()
    Path("model.prototxt").write_text(text.replace('type: "ReLU"', 'type: "ReLU" some_branch_param { x: 1 }', 1))
    result = checker()
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.output.splitlines() if "WARNING" in line and "some_branch_param" in line]
    assert len(warnings) == 1, result.output


def test_the_example_of_a_missing_model_option_is_a_caffe_command_line() -> None:
    result = invoke("checker", "--model-type", "caffe", "--march", "bayes-e")
    (line,) = error_lines(result)
    assert "--proto net.prototxt --model net.caffemodel" in line and "m.onnx" not in line, line


def test_an_ssd_deploy_prototxt_gets_one_warning_for_its_detection_output() -> None:
    """A deploy prototxt's DetectionOutput parameters (res10 face detector's, MobileNet-SSD's) parse; the checker
    reads the network twice and says once that the layer is left out."""
    n = CaffeNet("ssd_like", seed=42)
    x = n.input("data", [1, 3, 32, 32])
    c = n.relu(n.conv(x, 8, 3, pad=1, stride=2))
    n.layer("PriorBox", [c, x], ["prior"], "prior_box_param { min_size: 8 aspect_ratio: 2 flip: true clip: false "
            "variance: 0.1 variance: 0.1 variance: 0.2 variance: 0.2 }", name="prior")
    loc, conf = n.conv(c, 12, 3, pad=1, top="loc"), n.conv(c, 6, 3, pad=1, top="conf")
    n.layer("DetectionOutput", [loc, conf, "prior"], ["detection_out"],
            "detection_output_param { num_classes: 2 share_location: true background_label_id: 0 "
            "nms_param { nms_threshold: 0.45 top_k: 400 } code_type: CENTER_SIZE keep_top_k: 200 "
            "confidence_threshold: 0.01 }", name="detection")
    n.write(Path.cwd(), "model")
    result = checker()
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.output.splitlines() if "WARNING" in line]
    assert len(warnings) == 1 and "caffe layer 'detection' (DetectionOutput" in warnings[0], result.output


def test_output_nodes_names_a_dropout_blob_another_dropout_reads() -> None:
    """output_nodes: 'fc_drop', a blob a Dropout wrote and another Dropout reads, was refused ("neither a node nor a
    tensor"): the Dropout passes its bottom on under the blob's name, which no ONNX tensor kept (hunt 31 D7). pycaffe's
    net.blobs['fc_drop'] is the inner product's (in-place ReLU'd) output; the .bin outputs it by that name."""
    n = CaffeNet("drops", seed=43)
    x = n.input("data", [1, 3, SIZE, SIZE])
    fc = n.relu(n.inner_product(n.pool(n.conv(x, 8, 3, stride=2), "MAX", 3, 2), 6))
    n.layer("Dropout", [fc], ["fc_drop"], "dropout_param { dropout_ratio: 0.5 }", name="drop1",
            step=lambda v: v.__setitem__("fc_drop", v[fc]))
    n.layer("Dropout", ["fc_drop"], ["fc_drop2"], "dropout_param { dropout_ratio: 0.5 }", name="drop2",
            step=lambda v: v.__setitem__("fc_drop2", v["fc_drop"]))
    n.softmax("fc_drop2")
    write_project(n, "d", output_nodes="fc_drop")
    result = invoke("makertbin", "--config", "config.yaml", "--model-type", "caffe")
    assert result.exit_code == 0 and SUCCESS in result.output, result.output
    quantized = HB_ONNXRuntime(model_file="model_output/d_quantized_model.onnx")
    assert [o.name for o in quantized.get_outputs()] == ["fc_drop"]
    image = np.random.default_rng(5).integers(0, 256, (1, 3, SIZE, SIZE), dtype=np.uint8)
    mean, scale = (np.array(v, np.float64).reshape(1, 3, 1, 1) for v in (EXACT_MEAN, EXACT_SCALE))
    want = n.forward({"data": (image - mean) * scale})["fc_drop"].reshape(1, -1)
    (got,) = quantized.run(None, {"data": image}, input_offset=128)
    assert np.abs(got.reshape(1, -1) - want).max() <= 0.05 * np.abs(want).max()
