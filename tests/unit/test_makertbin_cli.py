"""``hb_mapper makertbin`` as a user runs it: console messages, exit codes, the log file.

Runs the click command in-process (click's CliRunner, exceptions not swallowed) in a
temp folder that is the current directory, on a small model built in the test.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from builders import MODELS, Project, make_project
from click.testing import CliRunner, Result
from onnx import TensorProto, helper

from hbtools.cli.hb_mapper import main

SUCCESS = "Convert to runtime bin file successfully!"
LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR) ")


def invoke(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def makertbin(config: str | Path = "config.yaml", *extra: str) -> Result:
    return invoke("makertbin", "--config", str(config), "--model-type", "onnx", *extra)


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Project:
    """resnet_like in tmp_path (also the current directory), ready to convert."""
    monkeypatch.chdir(tmp_path)
    return make_project(tmp_path, MODELS["resnet_like"](), cal_count=3)


def test_help() -> None:
    top = invoke("--help")
    assert top.exit_code == 0 and "makertbin" in top.output
    sub = invoke("makertbin", "--help")
    assert sub.exit_code == 0
    for option in ("--config", "--model-type", "--fast-perf"):
        assert option in sub.output


def test_success(project: Project) -> None:
    result = makertbin("config.yaml")
    assert result.exit_code == 0, result.output
    assert SUCCESS in result.output and "End Model Convert" in result.output
    assert "ERROR" not in result.output and "Traceback" not in result.output
    assert "Start Model Convert" in result.output
    assert re.search(r"^Node\s+ON\s+Subgraph\s+Type", result.output, re.M), "node table missing"
    log = Path("hb_mapper_makertbin.log")
    assert log.is_file(), "hb_mapper_makertbin.log must be written in the current directory"
    text = log.read_text()
    assert SUCCESS in text and "End Model Convert" in text
    assert LOG_LINE.match(text.splitlines()[0]), text.splitlines()[0]
    for kind in ("original", "optimized", "calibrated", "quantized", "bin"):
        assert project.artefact(kind).is_file()
    # The log shows the model path resolved against the config's folder.
    assert str(project.model_path) in result.output
    # ... and ends with the build parameters, as hb_model_info prints them from the .bin (hb_mapper 1.x's log did)
    for block in ("model_parameters", "input_parameters", "calibration_parameters", "compiler_parameters"):
        assert f"############# {block} info #############" in text
    assert re.search(r"calibration_type\s+: max", text) and re.search(r"BPU march\s+: bayes-e", text), text


def test_success_from_another_directory(project: Project, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    result = makertbin(Path("..") / "config.yaml")
    assert result.exit_code == 0, result.output
    assert project.artefact("bin").is_file()  # relative paths follow the YAML file
    assert (elsewhere / "hb_mapper_makertbin.log").is_file()


# ---------------------------------------------------------------- user mistakes


def _set(**groups: dict) -> Callable[[Project], None]:
    return lambda p: p.write(**groups)


def _write_model(model: onnx.ModelProto) -> Callable[[Project], None]:
    return lambda p: onnx.save(model, str(p.model_path))


def _dynamic_model() -> onnx.ModelProto:
    model = MODELS["resnet_like"]().model
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    return model


def _nhwc_dynamic_batch_model() -> onnx.ModelProto:
    """A Keras-style export: NHWC input ['N', 16, 16, 3] transposed to NCHW in front of a conv."""
    w = helper.make_tensor("w", TensorProto.FLOAT, [4, 3, 3, 3], np.full(108, 0.1, np.float32))
    graph = helper.make_graph(
        [helper.make_node("Transpose", ["data"], ["nchw"], name="to_nchw", perm=[0, 3, 1, 2]),
         helper.make_node("Conv", ["nchw", "w"], ["y"], name="conv", pads=[1, 1, 1, 1])], "g",
        [helper.make_tensor_value_info("data", TensorProto.FLOAT, ["N", 16, 16, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4, 16, 16])], [w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def _opset_model(opset: int) -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["data"], ["y"], name="relu")], "g",
        [helper.make_tensor_value_info("data", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 16, 16])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _cal_files(p: Project) -> list[Path]:
    return sorted((p.root / "cal_data").iterdir())


def _truncate_cal_file(p: Project) -> None:
    f = _cal_files(p)[1]
    f.write_bytes(f.read_bytes()[:-5])


def _empty_cal_folder(p: Project) -> None:
    for f in _cal_files(p):
        f.unlink()


def _npy_wrong_shape(p: Project) -> None:
    np.save(p.root / "cal_data" / "zzz.npy", np.zeros([1, 3, 8, 8], np.uint8))


def _raw(text: str) -> Callable[[Project], None]:
    return lambda p: p.config_path.write_text(text)


def _remove_group(group: str) -> Callable[[Project], None]:
    def edit(p: Project) -> None:
        text = p.config_path.read_text()
        start = text.index(f"{group}:")
        rest = text[start:].split("\n")
        end = next((k for k, line in enumerate(rest[1:], 1) if line and not line.startswith(" ")), len(rest))
        p.config_path.write_text(text[:start] + "\n".join(rest[end:]))
    return edit


# (id, how to break the project, command-line arguments or None for the default, fragments the
# ERROR output must contain: each a regex)
BAD = [
    ("missing_group", _remove_group("compiler_parameters"), None, [r"Missing key.*'compiler_parameters'"]),
    ("missing_onnx_file", _set(model_parameters={"onnx_model": "nowhere/model.onnx"}), None,
     [r"onnx_model", r"nowhere/model\.onnx", r"does not exist"]),
    ("bad_march", _set(model_parameters={"march": "bernoulli9"}), None, [r"march", r"bernoulli9"]),
    ("bad_train_rt_pair", _set(input_parameters={"input_type_train": "gray", "input_type_rt": "nv12"}), None,
     [r"gray", r"nv12"]),
    ("wrong_size_calibration_file", _truncate_cal_file, None,
     [r"001\.bin", r"768 bytes", r"uint8"]),
    ("empty_calibration_folder", _empty_cal_folder, None, [r"cal_data", r"empty"]),
    ("npy_wrong_shape", _npy_wrong_shape, None, [r"zzz\.npy", r"768"]),
    ("missing_calibration_folder", _set(calibration_parameters={"cal_data_dir": "no_such_dir"}), None,
     [r"no_such_dir", r"does not exist"]),
    ("input_name_not_in_model", _set(input_parameters={"input_name": "image"}), None,
     [r"'image'", r"not an input of the model", r"data"]),
    ("input_name_misspelt", _set(input_parameters={"input_name": "dat"}), None,
     [r"'dat' is not an input of the model \(closest: 'data'\)"]),
    ("dynamic_input_without_shape", lambda p: (_write_model(_dynamic_model())(p),
                                              p.write(input_parameters={"input_shape": None})), None,
     [r"dynamic", r"input_shape: '1x3x16x16'"]),
    # The suggested shape is the model's own (NHWC here), not an NCHW example that the transposed-shape
    # check would then refuse.
    ("dynamic_nhwc_input_without_shape", lambda p: (_write_model(_nhwc_dynamic_batch_model())(p),
                                                   p.write(input_parameters={"input_shape": None,
                                                                             "input_layout_train": "NHWC",
                                                                             "input_layout_rt": "NHWC"})), None,
     [r"'data' has a dynamic shape \['\?', 16, 16, 3\]", r"model's own layout: input_shape: '1x16x16x3'"]),
    ("mean_count_not_channels", _set(input_parameters={"mean_value": "120 116"}), None,
     [r"mean_value", r"2 values", r"3 channel"]),
    ("model_not_onnx", lambda p: p.model_path.write_bytes(b"this is not a protobuf at all\x00\xff" * 10), None,
     [r"model\.onnx", r"not a readable ONNX model"]),
    ("opset_too_new", _write_model(_opset_model(22)), None, [r"opset 22", r"1\.\.21"]),
    ("malformed_yaml", _raw("model_parameters:\n  onnx_model: model.onnx\n   march: [bayes-e\n"), None,
     [r"not valid YAML", r"line \d+"]),
    ("unknown_key", _set(calibration_parameters={"calibration_methd": "max"}), None,
     [r"Unknown parameter 'calibration_methd'", r"calibration_parameters"]),
    ("config_file_missing", lambda p: None, ["makertbin", "--config", "missing.yaml", "--model-type", "onnx"],
     [r"missing\.yaml"]),
    ("no_config", lambda p: None, ["makertbin", "--model-type", "onnx"], [r"--config"]),
    ("fast_perf_without_model", lambda p: None, ["makertbin", "--fast-perf"], [r"fast-perf|--model"]),
    ("fast_perf_with_config", lambda p: None, ["makertbin", "--fast-perf", "--config", "config.yaml", "--model",
                                               "model.onnx", "--march", "bayes-e"], [r"fast-perf|--config"]),
    # Named by the model only (no input_name): checked once the parse stage knows the name and the shape.
    ("resizer_input_too_large", lambda p: (_write_model(MODELS["resnet_like"](h=136).model)(p),
                                          p.write(input_parameters={"input_name": None, "input_shape": None,
                                                                    "input_type_rt": "nv12"},
                                                  compiler_parameters={"input_source": {"data": "resizer"}})),
     None, [r"resizer", r"'data'", r"136x136 = 18496", r"18432"]),
    ("pyramid_feeds_no_featuremap", lambda p: p.write(input_parameters={"input_type_train": "featuremap",
                                                                        "input_type_rt": "featuremap",
                                                                        "norm_type": "no_preprocess",
                                                                        "mean_value": None, "scale_value": None},
                                                      compiler_parameters={"input_source": {"data": "pyramid"}}),
     None, [r"pyramid", r"featuremap", r"ddr"]),
    ("image_input_not_4d", lambda p: (_write_model(MODELS["featuremap_mlp"]().model)(p),
                                     p.write(input_parameters={"input_name": "feat", "input_shape": "1x5x12"})),
     None, [r"feat", r"featuremap"]),
]


# Command-line mistakes exit 2, everything else a user gets wrong 1 (docs/errors.md).
USAGE = {"no_config", "fast_perf_without_model", "fast_perf_with_config"}


@pytest.mark.parametrize(("name", "break_it", "args", "expected"), BAD, ids=[b[0] for b in BAD])
def test_user_mistake(project: Project, name: str, break_it: Callable[[Project], None], args: list[str] | None,
                      expected: list[str]) -> None:
    break_it(project)
    result = invoke(*args) if args else makertbin("config.yaml")
    out = result.output
    assert result.exit_code == (2 if name in USAGE else 1), f"exit code {result.exit_code}\n{out}"
    errors = [line for line in out.splitlines() if "ERROR" in line]
    assert errors, f"no ERROR line:\n{out}"
    assert "Traceback" not in out
    assert "internal error" not in out, f"a user mistake must get a real message:\n{out}"
    message = "\n".join(errors)
    for fragment in expected:
        assert re.search(fragment, message), f"ERROR lines miss {fragment!r}:\n{message}"
    assert SUCCESS not in out
    wd = project.working_dir
    assert not wd.exists() or not any(wd.iterdir()), f"working_dir not empty: {list(wd.iterdir())}"
    log = Path("hb_mapper_makertbin.log")
    assert log.is_file() and "ERROR" in log.read_text()


def test_dynamic_shape_hint_gives_every_input(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With several inputs the hint gave one input's shape ('1x13'), which a config applies to the first input:
    following it looped on the same ERROR. It gives the whole value, one shape per input in input_name order."""
    from builders import _Graph

    g = _Graph(2)
    joined = g.op("Concat", ["cat", "dense"], axis=1)
    out = g.op("MatMul", [joined, g.const(np.ones((21, 4), np.float32), "w")])
    fm = g.model({"cat": [1, 8], "dense": [1, 13]}, [out], featuremap={"cat", "dense"})
    for vi in fm.model.graph.input:
        vi.type.tensor_type.shape.dim[0].dim_param = "batch"
    monkeypatch.chdir(tmp_path)
    project = make_project(tmp_path / "p", fm, cal_count=2)
    hints = []
    for given in (None, "1x8"):
        project.write(input_parameters={"input_shape": given})
        result = CliRunner().invoke(main, ["makertbin", "--config", str(project.config_path), "--model-type", "onnx"])
        assert result.exit_code != 0
        hints.append(result.output)
    assert "input 'cat' has a dynamic shape" in hints[0] and "input_shape: '1x8;1x13'" in hints[0], hints[0]
    assert "input 'dense' has a dynamic shape" in hints[1] and "input_shape: '1x8;1x13'" in hints[1], hints[1]
