"""Tests of the makertbin YAML loader (hbtools.config.loader)."""

from __future__ import annotations

import copy
import json
import logging
from pathlib import Path
from typing import Any

import pytest
import yaml

from hbtools.config.loader import check_input_channels, load_config
from hbtools.config.model import InputSpec, NodeInfo
from hbtools.errors import ConfigError

DROP = object()  # marks a key to remove from the base config

BASE: dict[str, dict[str, Any]] = {
    "model_parameters": {"onnx_model": "m.onnx", "march": "bernoulli2"},
    "input_parameters": {
        "input_type_train": "rgb",
        "input_layout_train": "NCHW",
        "input_type_rt": "nv12",
        "input_shape": "1x3x224x224",
        "norm_type": "data_mean_and_scale",
        "mean_value": "123.675 116.28 103.53",
        "scale_value": 0.017,
    },
    "calibration_parameters": {"cal_data_dir": "cal"},
    "compiler_parameters": {"compile_mode": "latency"},
}


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A folder with a dummy model and calibration folders (the loader only checks existence)."""
    (tmp_path / "m.onnx").write_bytes(b"onnx")
    (tmp_path / "m.prototxt").write_text("name: 'x'")
    (tmp_path / "m.caffemodel").write_bytes(b"caffe")
    for name in ("cal", "cal2", "cal_f32"):
        (tmp_path / name).mkdir()
    return tmp_path


def make(workdir: Path, overrides: dict[str, Any] | None = None) -> Path:
    """Write BASE updated by ``overrides`` ({group: {key: value | DROP}} or {group: DROP | value})."""
    data: dict[str, Any] = copy.deepcopy(BASE)
    for group, values in (overrides or {}).items():
        if values is DROP:
            data.pop(group)
        elif not isinstance(values, dict):
            data[group] = values
        else:
            target = data.setdefault(group, {})
            for key, value in values.items():
                if value is DROP:
                    target.pop(key)
                else:
                    target[key] = value
    path = workdir / "c.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def load(workdir: Path, overrides: dict[str, Any] | None = None, **kw: Any):
    model_type = kw.pop("model_type", "onnx")
    return load_config(make(workdir, overrides, **kw), model_type)


def error_lines(workdir: Path, overrides: dict[str, Any] | None = None, **kw: Any) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load(workdir, overrides, **kw)
    return str(info.value).splitlines()


def raw_config(workdir: Path, text: str) -> Path:
    path = workdir / "raw.yaml"
    path.write_text(text)
    return path


# ---------------------------------------------------------------- accepted forms


def test_defaults_of_a_minimal_config(workdir: Path) -> None:
    cfg = load(
        workdir,
        {
            "input_parameters": {
                "norm_type": DROP,
                "mean_value": DROP,
                "scale_value": DROP,
                "input_shape": DROP,
            },
            "compiler_parameters": None,
        },
    )
    m, cal, cc, co = cfg.model, cfg.calibration, cfg.compiler, cfg.custom_op
    assert m.model_type == "onnx" and m.onnx_model == workdir / "m.onnx"
    assert m.prototxt is None and m.caffe_model is None
    assert m.output_model_file_prefix == "model"
    assert m.working_dir == workdir / "model_output"
    assert cfg.output_prefix_path == workdir / "model_output" / "model"
    assert m.layer_out_dump is False
    assert m.output_nodes == [] and m.remove_node_type == [] and m.remove_node_name == []
    assert m.debug_mode == [] and m.node_info == {}
    assert cfg.input_batch == 1
    (spec,) = cfg.inputs
    assert spec.name is None and spec.shape is None
    assert spec.norm_type == "no_preprocess" and spec.mean is None and spec.scale is None
    assert spec.space_and_range == "regular" and spec.layout_rt is None
    assert spec.effective_layout_rt == "NHWC"
    assert spec.cal_data_dir == workdir / "cal" and spec.cal_data_type is None
    assert cal.calibration_type == "default" and cal.max_percentile is None
    assert cal.per_channel is False and cal.preprocess_on is False and cal.optimization == []
    assert cc.compile_mode == "latency" and cc.balance_factor is None and cc.debug is False
    assert cc.core_num == 1 and cc.optimize_level == "O0" and cc.input_source == {}
    assert cc.max_time_per_fc == 0 and cc.jobs is None and cc.advice is None
    assert co.custom_op_method is None and co.op_register_files == [] and co.custom_op_dir is None
    assert cfg.yaml_path == workdir / "c.yaml"


def test_full_config_values(workdir: Path) -> None:
    cfg = load(
        workdir,
        {
            "model_parameters": {
                "output_model_file_prefix": "mobilenet",
                "working_dir": "out",
                "layer_out_dump": True,
                "output_nodes": "conv1; fc",
                "remove_node_type": "quantize; Dequantize",
                "remove_node_name": ["n1", "n2"],
                "debug_mode": "dump_calibration_data",
                "march": "bayes",
            },
            "input_parameters": {
                "input_name": "data",
                "input_layout_rt": "NCHW",
                "input_type_rt": "rgb",
                "input_batch": 8,
            },
            "calibration_parameters": {
                "cal_data_type": "uint8",
                "preprocess_on": True,
                "calibration_type": "kl",
                "per_channel": True,
            },
            "compiler_parameters": {
                "compile_mode": "bandwidth",
                "debug": True,
                "core_num": 1,
                "optimize_level": "o3",
                "jobs": 8,
                "advice": 5,
                "max_time_per_fc": 1000,
                "input_source": {"data": "ddr"},
            },
        },
    )
    m, cc = cfg.model, cfg.compiler
    assert m.output_model_file_prefix == "mobilenet" and m.working_dir == workdir / "out"
    assert m.layer_out_dump is True and m.output_nodes == ["conv1", "fc"]
    assert m.remove_node_type == ["Quantize", "Dequantize"]
    assert m.remove_node_name == ["n1", "n2"] and m.debug_mode == ["dump_calibration_data"]
    assert cfg.input_batch == 8
    assert cfg.inputs[0].name == "data" and cfg.inputs[0].effective_layout_rt == "NCHW"
    assert cfg.inputs[0].cal_data_type == "uint8"
    assert cfg.calibration.calibration_type == "kl" and cfg.calibration.per_channel is True
    assert cfg.calibration.preprocess_on is True
    assert (cc.compile_mode, cc.debug, cc.optimize_level) == ("bandwidth", True, "O3")
    assert (cc.jobs, cc.advice, cc.max_time_per_fc) == (8, 5, 1000)
    assert cc.input_source == {"data": "ddr"}


@pytest.mark.parametrize(
    "given, stored",
    [
        ("bernoulli2", "bernoulli2"),
        ("BAYES", "bayes"),
        ("Bayes-E", "bayes-e"),
        ("nash-e", "nash-e"),
        ("NASH-M", "nash-m"),
    ],
)
def test_march_any_case_stored_lower(workdir: Path, given: str, stored: str) -> None:
    assert load(workdir, {"model_parameters": {"march": given}}).model.march == stored


def test_relative_paths_resolve_against_yaml_folder(
    workdir: Path, tmp_path_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    sub = workdir / "cfg"
    sub.mkdir()
    (workdir / "ops").mkdir()
    for name in ("a.py", "b.py"):
        (workdir / "ops" / name).write_text("")
    path = make(
        sub,
        {
            "model_parameters": {"onnx_model": "../m.onnx", "working_dir": "./o"},
            "calibration_parameters": {"cal_data_dir": "../cal"},
            "custom_op": {
                "custom_op_method": "register",
                "custom_op_dir": "../ops",
                "op_register_files": "a.py; b.py",
            },
        },
    )
    monkeypatch.chdir(tmp_path_factory.mktemp("elsewhere"))
    cfg = load_config(path)
    assert cfg.model.onnx_model == workdir / "m.onnx"
    assert cfg.model.working_dir == sub / "o"
    assert cfg.inputs[0].cal_data_dir == workdir / "cal"
    assert cfg.custom_op.custom_op_dir == workdir / "ops"
    assert cfg.custom_op.custom_op_method == "register"
    assert cfg.custom_op.op_register_files == [str(workdir / "ops" / "a.py"), str(workdir / "ops" / "b.py")]


def test_relative_config_path_and_absolute_model_path(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make(workdir, {"model_parameters": {"onnx_model": str(workdir / "m.onnx")}})
    monkeypatch.chdir(workdir)
    cfg = load_config("c.yaml")
    assert cfg.model.onnx_model == workdir / "m.onnx"
    assert cfg.yaml_path == workdir / "c.yaml"


def test_caffe_model_type(workdir: Path) -> None:
    cfg = load(
        workdir,
        {
            "model_parameters": {
                "onnx_model": DROP,
                "prototxt": "m.prototxt",
                "caffe_model": "m.caffemodel",
            }
        },
        model_type="caffe",
    )
    assert cfg.model.model_type == "caffe"
    assert cfg.model.prototxt == workdir / "m.prototxt"
    assert cfg.model.caffe_model == workdir / "m.caffemodel"


@pytest.mark.parametrize("model_type", ["onnx", "caffe"])
def test_a_config_naming_both_kinds_of_model_says_which_it_converts(workdir: Path, model_type: str,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    """onnx_model beside prototxt / caffe_model: the command's --model-type picks one, and the other was
    ignored without a word."""
    import logging

    with caplog.at_level(logging.WARNING, logger="hbtools"):
        cfg = load(workdir, {"model_parameters": {"prototxt": "m.prototxt", "caffe_model": "m.caffemodel"}},
                   model_type=model_type)
    assert cfg.model.model_type == model_type
    assert f"--model-type {model_type} converts {'onnx_model' if model_type == 'onnx' else 'caffe_model, prototxt'}" \
        in caplog.text, caplog.text


@pytest.mark.parametrize("value", ["a; b ;c", "a;b;c;", ["a", "b", "c"], " a ;  b;c ", "a,b,c", "a, b; c"])
def test_multi_value_forms(workdir: Path, value: Any) -> None:
    cfg = load(workdir, {"model_parameters": {"output_nodes": value}})
    assert cfg.model.output_nodes == ["a", "b", "c"]


@pytest.mark.parametrize(
    "mean, expected",
    [
        ("123.675 116.28 103.53", [123.675, 116.28, 103.53]),
        (128, [128.0]),
        ("128", [128.0]),
        (127.5, [127.5]),
        ([123.675, 116.28, 103.53], [123.675, 116.28, 103.53]),
    ],
)
def test_mean_value_forms(workdir: Path, mean: Any, expected: list[float]) -> None:
    cfg = load(workdir, {"input_parameters": {"mean_value": mean}})
    assert cfg.inputs[0].mean == pytest.approx(expected)


def test_mean_value_unquoted_in_yaml(workdir: Path) -> None:
    text = (
        make(workdir)
        .read_text()
        .replace("mean_value: 123.675 116.28 103.53", "mean_value: 103.94 116.78 123.68")
    )
    assert "mean_value: 103.94 116.78 123.68" in text
    cfg = load_config(raw_config(workdir, text))
    assert cfg.inputs[0].mean == pytest.approx([103.94, 116.78, 123.68])


def test_scale_value_per_channel(workdir: Path) -> None:
    cfg = load(workdir, {"input_parameters": {"scale_value": "0.017 0.0175 0.0174"}})
    assert cfg.inputs[0].scale == pytest.approx([0.017, 0.0175, 0.0174])


def test_input_shape_as_yaml_list_of_ints(workdir: Path) -> None:
    cfg = load(workdir, {"input_parameters": {"input_shape": [1, 3, 64, 32]}})
    assert cfg.inputs[0].shape == [1, 3, 64, 32]


def test_empty_input_name_and_shape_mean_from_model(workdir: Path) -> None:
    cfg = load(workdir, {"input_parameters": {"input_name": "", "input_shape": ""}})
    assert cfg.inputs[0].name is None and cfg.inputs[0].shape is None


def test_mean_given_but_unused_is_dropped_with_warning(
    workdir: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # hbtools.log.setup turns propagation off; caplog listens on the root logger.
    monkeypatch.setattr(logging.getLogger("hbtools"), "propagate", True)
    caplog.set_level(logging.WARNING, logger="hbtools")
    cfg = load(workdir, {"input_parameters": {"norm_type": "data_scale"}})
    assert cfg.inputs[0].mean is None and cfg.inputs[0].scale == [0.017]
    assert "mean_value is ignored" in caplog.text


@pytest.mark.parametrize(("type_rt", "layout_rt", "warned"), [("rgb", "NCHW", True), ("gray", "NCHW", False),
                                                           ("rgb", "NHWC", False), ("nv12", None, False)])
def test_nchw_runtime_layout_on_bernoulli2_is_said_to_be_nhwc(
    workdir: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch, type_rt: str,
    layout_rt: str | None, warned: bool
) -> None:
    """X3 artefacts take image inputs NHWC (SPEC §5); asking for NCHW used to be ignored without a word, and
    data fed as configured gave cosine 0.63."""
    monkeypatch.setattr(logging.getLogger("hbtools"), "propagate", True)
    caplog.set_level(logging.WARNING, logger="hbtools")
    train = "gray" if type_rt == "gray" else "rgb"
    shape = "1x1x224x224" if type_rt == "gray" else "1x3x224x224"
    mean = "128" if type_rt == "gray" else "123.675 116.28 103.53"
    params = {"input_type_rt": type_rt, "input_type_train": train, "input_shape": shape, "mean_value": mean}
    load(workdir, {"input_parameters": {**params, **({"input_layout_rt": layout_rt} if layout_rt else {})}})
    said = ("the quantized model and the .bin take", "NHWC whatever input_layout_rt says",
            "calibrated models take it NCHW")
    assert all(s in caplog.text for s in said) == warned, caplog.text


def test_gray_nchw_on_bernoulli2_is_no_warning(workdir: Path, caplog: pytest.LogCaptureFixture,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The vendor's own gray samples for X3 say input_layout_rt NCHW: one channel is the same bytes either way,
    so only the array shape HB_ONNXRuntime takes is worth a word, at INFO."""
    monkeypatch.setattr(logging.getLogger("hbtools"), "propagate", True)
    caplog.set_level(logging.INFO, logger="hbtools")
    load(workdir, {"input_parameters": {"input_type_rt": "gray", "input_type_train": "gray", "input_layout_rt": "NCHW",
                                        "input_shape": "1x1x28x28", "mean_value": "128"}})
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    assert "same bytes as NCHW for one channel" in caplog.text and "NxHxWx1" in caplog.text


@pytest.mark.parametrize(("layout_rt", "warned"), [("NCHW", True), ("NHWC", False), (None, False)])
def test_nchw_runtime_layout_of_nv12_is_warned_about(workdir: Path, caplog: pytest.LogCaptureFixture,
                                                     layout_rt: str | None, warned: bool) -> None:
    """The vendor documents call input_layout_rt unnecessary with nv12, so an 'NCHW' left from an rgb config is
    common; it still lays out the quantized ONNX model's input (SPEC §5): said in a WARNING, not silently."""
    caplog.set_level(logging.WARNING, logger="hbtools")
    params = {"input_type_rt": "nv12", **({"input_layout_rt": layout_rt} if layout_rt else {})}
    cfg = load(workdir, {"model_parameters": {"march": "bayes-e"}, "input_parameters": params})
    assert cfg.inputs[0].effective_layout_rt == (layout_rt or "NHWC")
    assert ("input_layout_rt NCHW with input_type_rt nv12" in caplog.text) == warned, caplog.text


@pytest.mark.parametrize(("layout_train", "layout_rt", "warned"), [("NHWC", "NCHW", True), ("NCHW", "NHWC", True),
                                                               ("NHWC", "NHWC", False), ("NCHW", None, False)])
def test_featuremap_layout_rt_other_than_train_is_said_to_be_ignored(
    workdir: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch, layout_train: str,
    layout_rt: str | None, warned: bool
) -> None:
    """The .bin takes a featuremap in its input_layout_train layout; the requested input_layout_rt was ignored
    without a word (and hb_model_info echoed it)."""
    monkeypatch.setattr(logging.getLogger("hbtools"), "propagate", True)
    caplog.set_level(logging.WARNING, logger="hbtools")
    shape = "1x3x32x32" if layout_train == "NCHW" else "1x32x32x3"
    params = {"input_type_rt": "featuremap", "input_type_train": "featuremap", "input_layout_train": layout_train,
              "input_shape": shape, "norm_type": "no_preprocess", "mean_value": DROP, "scale_value": DROP}
    load(workdir, {"input_parameters": {**params, **({"input_layout_rt": layout_rt} if layout_rt else {})}})
    said = f"featuremap input is fed in its input_layout_train layout {layout_train}, so input_layout_rt"
    assert (said in caplog.text) == warned, caplog.text


def test_two_inputs_split_and_broadcast(workdir: Path) -> None:
    cfg = load(
        workdir,
        {
            "input_parameters": {
                "input_name": "img; feat",
                "input_type_train": "bgr; featuremap",
                "input_layout_train": "NHWC; NCHW",
                "input_type_rt": ["yuv444", "featuremap"],
                "input_layout_rt": "NHWC",
                "input_shape": "1x224x224x3; 1x64",
                "norm_type": "data_mean; no_preprocess",
                "mean_value": "128; None",
                "scale_value": DROP,
            },
            "calibration_parameters": {"cal_data_dir": "cal; cal_f32", "cal_data_type": "float32"},
            "compiler_parameters": {"input_source": {"img": "ddr", "feat": "ddr"}},
        },
    )
    img, feat = cfg.inputs
    assert (img.name, img.type_train, img.layout_train, img.type_rt) == (
        "img",
        "bgr",
        "NHWC",
        "yuv444",
    )
    assert img.shape == [1, 224, 224, 3] and img.mean == [128.0] and img.norm_type == "data_mean"
    assert (feat.name, feat.type_train, feat.shape, feat.mean) == (
        "feat",
        "featuremap",
        [1, 64],
        None,
    )
    assert feat.is_featuremap and feat.norm_type == "no_preprocess"
    assert img.layout_rt == feat.layout_rt == "NHWC"
    assert img.cal_data_type == feat.cal_data_type == "float32"
    assert (img.cal_data_dir, feat.cal_data_dir) == (workdir / "cal", workdir / "cal_f32")


def test_two_inputs_separated_by_commas(workdir: Path) -> None:
    """SPEC §4: ',' separates the values of several inputs as ';' does (real two-input configs write
    'featuremap,featuremap'; it was rejected as one invalid type). One input's per-channel numbers keep
    their commas, and a shape written with commas instead of 'x' is not taken for several inputs."""
    params = {
        "input_name": "a,b",
        "input_type_train": "rgb,featuremap",
        "input_layout_train": "NCHW, NCHW",
        "input_type_rt": "bgr,featuremap",
        "input_shape": "1x3x64x64,1x8x4x4",
        "norm_type": "data_mean_and_scale,no_preprocess",
        "mean_value": "123.68, 116.779, 103.939; None",
        "scale_value": "0.5; None",
    }
    cfg = load(workdir, {"input_parameters": params,
                         "calibration_parameters": {"cal_data_dir": "cal,cal2", "cal_data_type": "uint8,float32"}})
    a, b = cfg.inputs
    assert (a.name, a.type_train, a.type_rt, a.shape) == ("a", "rgb", "bgr", [1, 3, 64, 64])
    assert (b.name, b.type_train, b.shape, b.cal_data_type) == ("b", "featuremap", [1, 8, 4, 4], "float32")
    assert a.mean == [123.68, 116.779, 103.939] and a.scale == [0.5] and b.mean is None
    assert (a.cal_data_dir, b.cal_data_dir) == (workdir / "cal", workdir / "cal2")
    lines = error_lines(workdir, {"input_parameters": {"input_shape": "1,3,224,224"}})
    assert any("join the dimensions with 'x'" in line for line in lines), lines


def test_per_channel_mean_for_two_inputs(workdir: Path) -> None:
    cfg = load(
        workdir,
        {
            "input_parameters": {
                "input_name": "a; b",
                "input_type_train": "rgb; gray",
                "input_layout_train": "NCHW; NCHW",
                "input_type_rt": "nv12; gray",
                "input_shape": "1x3x64x64; 1x1x32x32",
                "norm_type": "data_mean_and_scale; data_scale",
                "mean_value": ["1 2 3", "None"],
                "scale_value": "0.5 0.25 0.125; 2",
            },
            "calibration_parameters": {"cal_data_dir": ["cal", "cal2"]},
        },
    )
    a, b = cfg.inputs
    assert a.mean == [1.0, 2.0, 3.0] and a.scale == [0.5, 0.25, 0.125]
    assert b.mean is None and b.scale == [2.0] and b.type_rt == "gray"


@pytest.mark.parametrize(
    "pair",
    [
        ("yuv444", "nv12"),
        ("yuv444", "yuv444"),
        ("rgb", "bgr"),
        ("bgr", "rgb"),
        ("rgb", "yuv444"),
        ("gray", "gray"),
    ],
)
def test_allowed_train_rt_pairs(workdir: Path, pair: tuple[str, str]) -> None:
    train, rt = pair
    shape = "1x1x224x224" if train == "gray" else "1x3x224x224"
    mean = "128" if train == "gray" else "1 2 3"
    cfg = load(
        workdir,
        {
            "input_parameters": {
                "input_type_train": train.upper(),
                "input_type_rt": rt,
                "input_shape": shape,
                "mean_value": mean,
            }
        },
    )
    assert (cfg.inputs[0].type_train, cfg.inputs[0].type_rt) == pair


def test_bt601_video_with_nv12(workdir: Path) -> None:
    cfg = load(workdir, {"input_parameters": {"input_space_and_range": "bt601_video"}})
    assert cfg.inputs[0].space_and_range == "bt601_video"


def test_node_info_mapping_form(workdir: Path) -> None:
    cfg = load(
        workdir,
        {
            "model_parameters": {
                "node_info": {
                    "conv1": {
                        "ON": "bpu",
                        "InputType": "int16",
                        "InputType1": "int8",
                        "OutputType": "INT16",
                    },
                    "softmax": {"ON": "CPU"},
                }
            }
        },
    )
    info = cfg.model.node_info
    assert info["conv1"] == NodeInfo("BPU", {None: "int16", 1: "int8"}, "int16")
    assert info["softmax"] == NodeInfo("CPU", {}, None)
    assert cfg.snapshot["model_parameters"]["node_info"]["conv1"] == {
        "ON": "BPU",
        "InputType": "int16",
        "InputType1": "int8",
        "OutputType": "int16",
    }


def test_node_info_unquoted_on_key(workdir: Path) -> None:
    # Unquoted ON is a YAML 1.1 boolean; it must still mean the ON key.
    text = (
        make(workdir)
        .read_text()
        .replace(
            "model_parameters:\n", "model_parameters:\n  node_info:\n    conv1:\n      ON: CPU\n"
        )
    )
    cfg = load_config(raw_config(workdir, text))
    assert cfg.model.node_info["conv1"].on == "CPU"


def test_node_info_and_input_source_seed_layout(workdir: Path) -> None:
    # Braces spread over lines with a trailing comma, as the vendor documents write it.
    text = (
        make(workdir)
        .read_text()
        .replace(
            "model_parameters:\n",
            ('model_parameters:\n  node_info: {\n    "conv1": {\n      "ON": "BPU",\n    }\n  }\n'),
        )
    )
    text = text.replace(
        "compiler_parameters:\n", 'compiler_parameters:\n  input_source: {"data": "ddr"}\n'
    )
    cfg = load_config(raw_config(workdir, text))
    assert cfg.model.node_info["conv1"].on == "BPU"
    assert cfg.compiler.input_source == {"data": "ddr"}


def test_quoted_mapping_strings(workdir: Path) -> None:
    cfg = load(
        workdir,
        {
            "model_parameters": {"node_info": '{"conv1": {"ON": "CPU"}}'},
            "compiler_parameters": {"input_source": '{"data": "pyramid"}'},
        },
    )
    assert cfg.model.node_info["conv1"].on == "CPU"
    assert cfg.compiler.input_source == {"data": "pyramid"}


def test_node_info_string_form_sets_the_output_int16(workdir: Path) -> None:
    """The string form takes over set_node_data_type, which sets a node's output: it also made the inputs
    int16, which the vendor's parser does not."""
    cfg = load(workdir, {"model_parameters": {"node_info": "conv1:int16; conv2:int16"}})
    for name in ("conv1", "conv2"):
        assert cfg.model.node_info[name] == NodeInfo(None, {}, "int16")


def test_run_on_and_set_node_data_type_merge_into_node_info(workdir: Path) -> None:
    cfg = load(
        workdir,
        {
            "model_parameters": {
                "set_node_data_type": "conv1; conv2:int16",
                "node_info": {"conv1": {"ON": "BPU"}},
            },
            "calibration_parameters": {"run_on_cpu": "conv3", "run_on_bpu": ["conv1", "conv4"]},
        },
    )
    info = cfg.model.node_info
    assert info["conv1"] == NodeInfo("BPU", {}, "int16")
    assert info["conv2"].output_type == "int16" and info["conv2"].on is None
    assert info["conv3"].on == "CPU" and info["conv4"].on == "BPU"
    snap = cfg.snapshot["calibration_parameters"]
    assert snap["run_on_cpu"] == ["conv3"] and snap["run_on_bpu"] == ["conv1", "conv4"]


@pytest.mark.parametrize(
    "value",
    [
        "set_model_output_int8",
        "set_model_output_int16",
        "set_Conv_input_int16",
        "set_Sigmoid_output_int16",
        "set_Softmax_input_int8",
        "set_Softmax_output_int8",
        "set_Conv_input_int8",  # vendor X5 configs beside set_all_nodes_int16
        "set_Conv_output_int8",
        "set_all_nodes_int16",
        "asymmetric",
        "bias_correction",
        "lstm_batch_last",
    ],
)
def test_optimization_values(workdir: Path, value: str) -> None:
    cfg = load(workdir, {"calibration_parameters": {"optimization": value}})
    assert cfg.calibration.optimization == [value] and cfg.wants(value)


def test_optimization_several(workdir: Path) -> None:
    cfg = load(
        workdir,
        {
            "calibration_parameters": {
                "optimization": "set_Mul_output_int16; asymmetric ;bias_correction"
            }
        },
    )
    assert cfg.calibration.optimization == ["set_Mul_output_int16", "asymmetric", "bias_correction"]


@pytest.mark.parametrize(
    "value",
    [
        "set_Softmax_input_int8,set_Softmax_output_int8",  # D-Robotics' reference YOLO config
        "set_Softmax_input_int8, set_Softmax_output_int8;",
        "set_Softmax_input_int8; set_Softmax_output_int8",
        ["set_Softmax_input_int8,set_Softmax_output_int8"],
    ],
)
def test_optimization_comma_separated(workdir: Path, value: Any) -> None:
    cfg = load(workdir, {"calibration_parameters": {"optimization": value}})
    assert cfg.calibration.optimization == ["set_Softmax_input_int8", "set_Softmax_output_int8"]
    assert cfg.wants("set_Softmax_input_int8") and cfg.wants("set_Softmax_output_int8")


@pytest.mark.parametrize(
    "given, expected",
    [(True, True), ("True", True), ("false", False), (False, False), ("FALSE", False)],
)
def test_boolean_forms(workdir: Path, given: Any, expected: bool) -> None:
    cfg = load(
        workdir,
        {
            "model_parameters": {"layer_out_dump": given},
            "compiler_parameters": {"debug": given},
            "calibration_parameters": {"per_channel": given, "preprocess_on": given},
        },
    )
    assert cfg.model.layer_out_dump is expected and cfg.compiler.debug is expected
    assert cfg.calibration.per_channel is expected and cfg.calibration.preprocess_on is expected


@pytest.mark.parametrize("cal_type", ["load", "skip"])
def test_load_and_skip_need_no_cal_data_dir(workdir: Path, cal_type: str) -> None:
    cfg = load(
        workdir, {"calibration_parameters": {"cal_data_dir": DROP, "calibration_type": cal_type}}
    )
    assert cfg.calibration.calibration_type == cal_type and cfg.inputs[0].cal_data_dir is None


@pytest.mark.parametrize("cal_type", ["default", "mix", "kl", "max", "MAX"])
def test_calibration_types(workdir: Path, cal_type: str) -> None:
    cfg = load(workdir, {"calibration_parameters": {"calibration_type": cal_type}})
    assert cfg.calibration.calibration_type == cal_type.lower()


@pytest.mark.parametrize("dtype", ["float32", "uint8", "int32", "int16", "int8"])
def test_cal_data_types(workdir: Path, dtype: str) -> None:
    assert (
        load(workdir, {"calibration_parameters": {"cal_data_type": dtype}}).inputs[0].cal_data_type
        == dtype
    )


@pytest.mark.parametrize(
    "value, expected", [(1.0, 1.0), ("0.99995", 0.99995), (0.5, 0.5), (1e-3, 1e-3)]
)
def test_max_percentile(workdir: Path, value: Any, expected: float) -> None:
    cfg = load(
        workdir, {"calibration_parameters": {"calibration_type": "max", "max_percentile": value}}
    )
    assert cfg.calibration.max_percentile == pytest.approx(expected)


@pytest.mark.parametrize("value", [0, 1000, 4294967295, "2000"])
def test_max_time_per_fc(workdir: Path, value: Any) -> None:
    assert load(
        workdir, {"compiler_parameters": {"max_time_per_fc": value}}
    ).compiler.max_time_per_fc == int(value)


@pytest.mark.parametrize("batch", [1, 128, 4096])
def test_input_batch_range(workdir: Path, batch: int) -> None:
    assert load(workdir, {"input_parameters": {"input_batch": batch}}).input_batch == batch


@pytest.mark.parametrize("factor", [0, 50, 100])
def test_balance_with_factor(workdir: Path, factor: int) -> None:
    cfg = load(
        workdir, {"compiler_parameters": {"compile_mode": "balance", "balance_factor": factor}}
    )
    assert (cfg.compiler.compile_mode, cfg.compiler.balance_factor) == ("balance", factor)


@pytest.mark.parametrize("level", ["O0", "O1", "O2", "O3"])
def test_optimize_levels(workdir: Path, level: str) -> None:
    assert (
        load(workdir, {"compiler_parameters": {"optimize_level": level}}).compiler.optimize_level
        == level
    )


@pytest.mark.parametrize("source", ["ddr", "pyramid", "resizer"])
def test_input_source_values(workdir: Path, source: str) -> None:
    cfg = load(workdir, {"compiler_parameters": {"input_source": {"data": source}}})
    assert cfg.compiler.input_source == {"data": source}


def test_core_num_two_on_bernoulli2(workdir: Path) -> None:
    assert load(workdir, {"compiler_parameters": {"core_num": 2}}).compiler.core_num == 2


def test_featuremap_non_4d_shape(workdir: Path) -> None:
    cfg = load(
        workdir,
        {
            "input_parameters": {
                "input_type_train": "featuremap",
                "input_type_rt": "featuremap",
                "input_layout_train": "NC",
                "input_shape": "1x257",
                "norm_type": DROP,
                "mean_value": DROP,
                "scale_value": DROP,
            }
        },
    )
    assert cfg.inputs[0].shape == [1, 257] and cfg.inputs[0].layout_train == "NC"


def test_featuremap_4d_mean_per_channel(workdir: Path) -> None:
    cfg = load(
        workdir,
        {
            "input_parameters": {
                "input_type_train": "featuremap",
                "input_type_rt": "featuremap",
                "input_shape": "1x4x8x8",
                "mean_value": "1 2 3 4",
                "scale_value": 2,
            }
        },
    )
    assert cfg.inputs[0].mean == [1.0, 2.0, 3.0, 4.0]


def test_snapshot_is_json_and_normalised(workdir: Path) -> None:
    cfg = load(workdir, {"model_parameters": {"march": "BAYES"}})
    snap = json.loads(json.dumps(cfg.snapshot))
    assert set(snap) == {
        "model_parameters",
        "input_parameters",
        "calibration_parameters",
        "compiler_parameters",
        "custom_op",
    }
    assert snap["model_parameters"]["march"] == "bayes"
    assert snap["model_parameters"]["onnx_model"] == str(workdir / "m.onnx")
    assert snap["input_parameters"]["input_shape"] == ["1x3x224x224"]
    assert snap["input_parameters"]["mean_value"] == [[123.675, 116.28, 103.53]]
    assert snap["calibration_parameters"]["cal_data_dir"] == [str(workdir / "cal")]
    assert snap["compiler_parameters"]["optimize_level"] == "O0"


def test_check_input_channels() -> None:
    spec = InputSpec(
        name="x",
        shape=None,
        type_train="featuremap",
        layout_train="NCHW",
        type_rt="featuremap",
        layout_rt=None,
        mean=[1.0, 2.0],
        scale=[1.0],
    )
    check_input_channels(spec, 2)
    with pytest.raises(ConfigError, match=r"'mean_value' of input 'x' has 2 values .* 5 channel"):
        check_input_channels(spec, 5)
    spec.mean, spec.scale = [1.0], [1.0, 2.0, 3.0]
    with pytest.raises(ConfigError, match="'scale_value'"):
        check_input_channels(spec, 4)


# ---------------------------------------------------------------- bad configs


def assert_error(lines: list[str], group: str, *fragments: str) -> None:
    assert lines[0] == f"Key '{group}' error:", lines
    assert len(lines) == 2, lines
    for fragment in fragments:
        assert fragment in lines[1], (fragment, lines)


def test_caffe_missing_files_seed_message(workdir: Path) -> None:
    lines = error_lines(workdir, model_type="caffe")
    assert lines[:2] == ["Key 'model_parameters' error:", "Missing keys: 'caffe_model', 'prototxt'"]
    # the config names an ONNX model: the command's model type is what is wrong
    assert lines[2:] == ["the config names an ONNX model (onnx_model): run the command with --model-type onnx"]


@pytest.mark.parametrize(
    "group",
    ["model_parameters", "input_parameters", "calibration_parameters", "compiler_parameters"],
)
def test_missing_group(workdir: Path, group: str) -> None:
    lines = error_lines(workdir, {group: DROP})
    assert lines[0] == f"Missing key: '{group}'" and "custom_op is optional" in lines[1]


def test_unknown_group(workdir: Path) -> None:
    lines = error_lines(workdir, {"compiler_parameter": {}})
    assert "Unknown group 'compiler_parameter'" in lines[0]
    assert "did you mean 'compiler_parameters'" in lines[0]


def test_parameter_at_top_level(workdir: Path) -> None:
    lines = error_lines(workdir, {"march": "bayes"})
    assert "Unknown group 'march'" in lines[0] and "'model_parameters' group" in lines[1]


def test_missing_required_key(workdir: Path) -> None:
    assert_error(
        error_lines(workdir, {"model_parameters": {"march": DROP}}),
        "model_parameters",
        "Missing key: 'march'",
    )


def test_blank_required_key_is_missing(workdir: Path) -> None:
    assert_error(
        error_lines(workdir, {"input_parameters": {"input_type_rt": ""}}),
        "input_parameters",
        "Missing key: 'input_type_rt'",
    )


def test_empty_list_for_required_key_is_missing(workdir: Path) -> None:
    assert_error(
        error_lines(workdir, {"input_parameters": {"input_type_train": []}}),
        "input_parameters",
        "Missing key: 'input_type_train'",
    )


def test_onnx_model_required_for_onnx(workdir: Path) -> None:
    assert_error(
        error_lines(workdir, {"model_parameters": {"onnx_model": DROP}}),
        "model_parameters",
        "Missing key: 'onnx_model'",
    )


def test_unknown_key_names_key_and_group(workdir: Path) -> None:
    assert_error(
        error_lines(workdir, {"compiler_parameters": {"optimise_level": "O3"}}),
        "compiler_parameters",
        "'optimise_level'",
        "group 'compiler_parameters'",
        "did you mean 'optimize_level'",
    )


def test_hb_compile_parameters_say_what_they_are_here(workdir: Path) -> None:
    """Configs carried over from hb_compile (S100 / J6) hold std_value and quant_config (rdk_model_zoo
    samples): the ERROR says whose parameters they are and what to write instead, not "did you mean
    scale_value", which is the reciprocal."""
    assert_error(
        error_lines(workdir, {"input_parameters": {"std_value": "58.395 57.12 57.375"}}),
        "input_parameters",
        "'std_value'",
        "hb_compile",
        "scale_value: 1/std",
    )
    assert_error(
        error_lines(workdir, {"calibration_parameters": {"quant_config": "quant.json"}}),
        "calibration_parameters",
        "'quant_config'",
        "set_all_nodes_int16",
        "node_info",
    )


def test_key_in_wrong_group(workdir: Path) -> None:
    assert_error(
        error_lines(workdir, {"input_parameters": {"cal_data_dir": "cal"}}),
        "input_parameters",
        "'cal_data_dir'",
        "belongs in the 'calibration_parameters'",
    )


def test_group_not_a_mapping(workdir: Path) -> None:
    text = (
        make(workdir)
        .read_text()
        .replace("compiler_parameters:\n  compile_mode: latency", "compiler_parameters: latency")
    )
    assert "compiler_parameters: latency" in text
    with pytest.raises(ConfigError) as info:
        load_config(raw_config(workdir, text))
    assert_error(str(info.value).splitlines(), "compiler_parameters", "must be a mapping")


@pytest.mark.parametrize(
    "group, key, value, fragments",
    [
        (
            "model_parameters",
            "march",
            "x3",
            ("'march'", "bernoulli2, bayes, bayes-e, nash-e, nash-m"),
        ),
        ("model_parameters", "layer_out_dump", "maybe", ("'layer_out_dump'", "True or False")),
        ("model_parameters", "layer_out_dump", 1, ("'layer_out_dump'", "True or False")),
        ("model_parameters", "remove_node_type", "Conv", ("'remove_node_type'", "Quantize")),
        ("model_parameters", "debug_mode", "dump", ("'debug_mode'", "dump_calibration_data")),
        ("model_parameters", "output_model_file_prefix", ["a"], ("'output_model_file_prefix'",)),
        # the staging folder's name for what a run replaces: artefacts so named were never committed (hunt 38 D4)
        ("model_parameters", "output_model_file_prefix", ".old-m", ("'.old-m'", "starts with '.old-'", "'m'")),
        # the pages of the model (html, png) are named after its file stem: 'my model.bin' beside 'my_model.html'
        # (hunt 38 D14)
        ("model_parameters", "output_model_file_prefix", "my model", ("'my model'", "spaces", "'my_model'")),
        ("model_parameters", "output_model_file_prefix", "a*b", ("'a*b'", "'a_b'")),
        ("model_parameters", "output_model_file_prefix", ".hidden", ("'.hidden'", "starts or ends with '.'")),
        ("input_parameters", "input_batch", 0, ("'input_batch'", "1-4096")),
        ("input_parameters", "input_batch", 4097, ("'input_batch'", "1-4096")),
        ("input_parameters", "input_batch", "abc", ("'input_batch'", "integer")),
        ("input_parameters", "input_batch", 2.5, ("'input_batch'", "integer")),
        ("input_parameters", "input_type_train", "nv12", ("'input_type_train'", "featuremap")),
        ("input_parameters", "input_type_rt", "yuv420", ("'input_type_rt'", "nv12")),
        ("input_parameters", "input_layout_train", "N-C-H-W", ("'input_layout_train'", "NCHW")),
        ("input_parameters", "input_layout_rt", "CHWN", ("'input_layout_rt'", "NCHW, NHWC")),
        (
            "input_parameters",
            "input_space_and_range",
            "full",
            ("'input_space_and_range'", "bt601_video"),
        ),
        ("input_parameters", "norm_type", "mean", ("'norm_type'", "data_mean_and_scale")),
        ("input_parameters", "mean_value", "1 two 3", ("'mean_value'", "numbers")),
        ("input_parameters", "input_shape", "1x3x0x224", ("'input_shape'", "positive")),
        ("input_parameters", "input_shape", "?x3x224x224", ("'input_shape'", "1x3x224x224")),
        ("input_parameters", "input_shape", "1x-3x224x224", ("'input_shape'", "positive")),
        ("calibration_parameters", "calibration_type", "entropy", ("'calibration_type'", "kl")),
        ("calibration_parameters", "max_percentile", 0, ("'max_percentile'", "(0, 1]")),
        ("calibration_parameters", "max_percentile", 1.5, ("'max_percentile'", "(0, 1]")),
        ("calibration_parameters", "max_percentile", "high", ("'max_percentile'", "number")),
        ("calibration_parameters", "cal_data_type", "float16", ("'cal_data_type'", "float32")),
        ("calibration_parameters", "per_channel", "yes please", ("'per_channel'", "True or False")),
        ("compiler_parameters", "compile_mode", "speed", ("'compile_mode'", "balance")),
        ("compiler_parameters", "core_num", 3, ("'core_num'", "1-2")),
        ("compiler_parameters", "optimize_level", "O4", ("'optimize_level'", "O0, O1, O2, O3")),
        (
            "compiler_parameters",
            "max_time_per_fc",
            500,
            ("'max_time_per_fc'", "0 or 1000-4294967295"),
        ),
        ("compiler_parameters", "max_time_per_fc", 4294967296, ("'max_time_per_fc'", "0 or 1000")),
        ("compiler_parameters", "balance_factor", 101, ("'balance_factor'", "0-100")),
        ("compiler_parameters", "jobs", 0, ("'jobs'", "1 or more")),
        ("compiler_parameters", "advice", -1, ("'advice'", "0 or more")),
        ("compiler_parameters", "debug", "on", ("'debug'", "True or False")),
        ("compiler_parameters", "input_source", "ddr", ("'input_source'", "mapping")),
        (
            "compiler_parameters",
            "input_source",
            {"data": "dram"},
            ("input_source[data]", "pyramid"),
        ),
        ("custom_op", "custom_op_method", "inline", ("'custom_op_method'", "register")),
    ],
)
def test_bad_parameter_value(
    workdir: Path, group: str, key: str, value: Any, fragments: tuple[str, ...]
) -> None:
    assert_error(error_lines(workdir, {group: {key: value}}), group, *fragments)


@pytest.mark.parametrize(
    "train, rt",
    [
        ("gray", "nv12"),
        ("rgb", "gray"),
        ("yuv444", "rgb"),
        ("featuremap", "nv12"),
        ("rgb", "featuremap"),
    ],
)
def test_bad_train_rt_pair(workdir: Path, train: str, rt: str) -> None:
    assert_error(
        error_lines(
            workdir, {"input_parameters": {"input_type_train": train, "input_type_rt": rt}}
        ),
        "input_parameters",
        f"input_type_rt '{rt}' cannot feed input_type_train '{train}'",
    )


@pytest.mark.parametrize("train, rt", [("rgb", "rgb"), ("yuv444", "nv12")])
def test_bt601_video_needs_nv12_and_rgb_bgr(workdir: Path, train: str, rt: str) -> None:
    assert_error(
        error_lines(
            workdir,
            {
                "input_parameters": {
                    "input_type_train": train,
                    "input_type_rt": rt,
                    "input_space_and_range": "bt601_video",
                }
            },
        ),
        "input_parameters",
        "bt601_video needs input_type_rt nv12",
    )


@pytest.mark.parametrize(
    "node_info, fragment",
    [
        ({"conv1": {"ON": "GPU"}}, "use BPU or CPU"),
        ({"conv1": {"OutputType0": "int16"}}, "OutputType always applies to all"),
        ({"conv1": {"InputType": "int4"}}, "use int8 or int16"),
        ({"conv1": {"Precision": "int16"}}, "unknown key 'Precision'"),
        ({"conv1": "int16"}, "non-empty mapping"),
        ("conv1", "no data type"),
        ("conv1:float16", "use int8 or int16"),
        (["conv1"], "must be"),
    ],
)
def test_bad_node_info(workdir: Path, node_info: Any, fragment: str) -> None:
    assert_error(
        error_lines(workdir, {"model_parameters": {"node_info": node_info}}),
        "model_parameters",
        fragment,
    )


def test_node_info_wins_over_run_on_cpu(workdir: Path, caplog: pytest.LogCaptureFixture) -> None:
    """node_info replaces run_on_cpu / run_on_bpu: a config that has both for a node (an old run_on_cpu line
    left next to a newer node_info) converts with node_info's placement and a WARNING, as with the vendor's
    parser; it was an ERROR."""
    caplog.set_level(logging.WARNING, logger="hbtools")
    cfg = load(workdir, {"model_parameters": {"node_info": {"c": {"ON": "BPU"}}},
                         "calibration_parameters": {"run_on_cpu": "c; d"}})
    assert cfg.model.node_info["c"].on == "BPU" and cfg.model.node_info["d"].on == "CPU"
    assert "node_info puts node 'c' on BPU" in caplog.text and "remove it from run_on_cpu" in caplog.text


def test_run_on_cpu_and_bpu_same_node(workdir: Path) -> None:
    assert_error(
        error_lines(workdir, {"calibration_parameters": {"run_on_cpu": "a; b", "run_on_bpu": "b"}}),
        "calibration_parameters",
        "node 'b' is in both run_on_cpu and run_on_bpu",
    )


def test_node_info_wins_over_set_node_data_type(workdir: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="hbtools")
    cfg = load(workdir, {"model_parameters": {"node_info": {"c": {"OutputType": "int8"}},
                                              "set_node_data_type": "c"}})
    assert cfg.model.node_info["c"].output_type == "int8"
    assert "node_info sets OutputType int8 for node 'c'" in caplog.text


@pytest.mark.parametrize(
    "value, fragment",
    [
        ("set_model_ouput_int16", "did you mean 'set_model_output_int16'"),
        ("fast_mode", "set_{NodeKind}_input_int16"),
        ("set_conv_input_int16", "did you mean 'Conv'"),
        ("set_Foo_output_int16", "'Foo' is not an ONNX op type"),
        ("asymmetric; set_Conv_input_int4", "'set_Conv_input_int4'"),
        ("set_model_output_int8; set_model_output_int16", "keep one"),
        ("set_model_output_int8,set_model_output_int16", "keep one"),
        ("asymmetric,set_Softmax_input_int16x", "'set_Softmax_input_int16x'"),
    ],
)
def test_bad_optimization(workdir: Path, value: str, fragment: str) -> None:
    assert_error(
        error_lines(workdir, {"calibration_parameters": {"optimization": value}}),
        "calibration_parameters",
        "'optimization'",
        fragment,
    )


@pytest.mark.parametrize("mean", ["1 2", "1 2 3 4"])
def test_mean_count_not_channels(workdir: Path, mean: str) -> None:
    assert_error(
        error_lines(workdir, {"input_parameters": {"mean_value": mean}}),
        "input_parameters",
        "'mean_value'",
        "3 channel(s)",
    )


def test_scale_count_not_channels_for_gray(workdir: Path) -> None:
    assert_error(
        error_lines(
            workdir,
            {
                "input_parameters": {
                    "input_type_train": "gray",
                    "input_type_rt": "gray",
                    "input_shape": "1x1x32x32",
                    "mean_value": 128,
                    "scale_value": "1 2 3",
                }
            },
        ),
        "input_parameters",
        "'scale_value'",
        "1 channel(s)",
    )


def test_mean_count_from_nhwc_featuremap_shape(workdir: Path) -> None:
    assert_error(
        error_lines(
            workdir,
            {
                "input_parameters": {
                    "input_type_train": "featuremap",
                    "input_type_rt": "featuremap",
                    "input_layout_train": "NHWC",
                    "input_shape": "1x8x8x4",
                    "mean_value": "1 2 3",
                }
            },
        ),
        "input_parameters",
        "4 channel(s)",
    )


@pytest.mark.parametrize(
    "norm, drop, key",
    [
        ("data_mean", "mean_value", "mean_value"),
        ("data_scale", "scale_value", "scale_value"),
        ("data_mean_and_scale", "scale_value", "scale_value"),
    ],
)
def test_norm_type_needs_mean_or_scale(workdir: Path, norm: str, drop: str, key: str) -> None:
    assert_error(
        error_lines(workdir, {"input_parameters": {"norm_type": norm, drop: DROP}}),
        "input_parameters",
        f"norm_type {norm} needs '{key}'",
    )


def test_none_mean_with_data_mean(workdir: Path) -> None:
    assert_error(
        error_lines(workdir, {"input_parameters": {"mean_value": "None"}}),
        "input_parameters",
        "needs 'mean_value'",
    )


@pytest.mark.parametrize(
    "shape, layout", [("1x3x225x224", "NCHW"), ("1x3x224x223", "NCHW"), ("1x223x224x3", "NHWC")]
)
def test_odd_size_with_nv12(workdir: Path, shape: str, layout: str) -> None:
    assert_error(
        error_lines(
            workdir, {"input_parameters": {"input_shape": shape, "input_layout_train": layout}}
        ),
        "input_parameters",
        "input_type_rt nv12 needs an even height and width",
    )


def test_odd_size_with_yuv444(workdir: Path) -> None:
    assert_error(
        error_lines(
            workdir, {"input_parameters": {"input_type_rt": "yuv444", "input_shape": "1x3x7x8"}}
        ),
        "input_parameters",
        "yuv444 needs an even",
    )


def test_odd_size_fine_with_rgb(workdir: Path) -> None:
    cfg = load(workdir, {"input_parameters": {"input_type_rt": "rgb", "input_shape": "1x3x7x7"}})
    assert cfg.inputs[0].shape == [1, 3, 7, 7]


def test_shape_channels_disagree_with_layout(workdir: Path) -> None:
    """Given in the other layout, the message names the shape meant (hunt 33 D8: it only said to check)."""
    assert_error(
        error_lines(workdir, {"input_parameters": {"input_shape": "1x224x224x3"}}),
        "input_parameters",
        "224 channel(s) in layout NCHW but input_type_train rgb has 3; in NCHW that shape is '1x3x224x224'",
    )


def test_image_input_needs_4d_shape(workdir: Path) -> None:
    assert_error(
        error_lines(workdir, {"input_parameters": {"input_shape": "1x3x224"}}),
        "input_parameters",
        "must be 4-D",
    )


def test_featuremap_non_4d_with_norm(workdir: Path) -> None:
    assert_error(
        error_lines(
            workdir,
            {
                "input_parameters": {
                    "input_type_train": "featuremap",
                    "input_type_rt": "featuremap",
                    "input_shape": "1x64",
                    "norm_type": "data_scale",
                    "mean_value": DROP,
                }
            },
        ),
        "input_parameters",
        "no_preprocess",
    )


def test_input_batch_with_batched_shape(workdir: Path) -> None:
    assert_error(
        error_lines(
            workdir, {"input_parameters": {"input_batch": 4, "input_shape": "8x3x224x224"}}
        ),
        "input_parameters",
        "input_batch 4",
        "'8x3x224x224'",
    )


def test_yuv444_nchw_rt_on_bernoulli2(workdir: Path) -> None:
    assert_error(
        error_lines(
            workdir, {"input_parameters": {"input_type_rt": "yuv444", "input_layout_rt": "NCHW"}}
        ),
        "input_parameters",
        "bernoulli2",
    )


def test_count_mismatch_between_inputs(workdir: Path) -> None:
    assert_error(
        error_lines(
            workdir,
            {
                "input_parameters": {
                    "input_name": "a; b",
                    "input_type_train": "rgb; rgb",
                    "input_layout_train": "NCHW",
                    "input_type_rt": "nv12; nv12",
                    "input_shape": DROP,
                    "norm_type": DROP,
                    "mean_value": DROP,
                    "scale_value": DROP,
                },
                "calibration_parameters": {"cal_data_dir": "cal; cal2"},
            },
        ),
        "input_parameters",
        "'input_layout_train' has 1 value(s) but 'input_name' has 2",
    )


def test_mean_left_out_for_a_featuremap_says_how_to_skip_it(workdir: Path) -> None:
    """An image + featuremap config giving the image's mean only was told 'one value per input' without
    the way to give none."""
    assert_error(
        error_lines(
            workdir,
            {
                "input_parameters": {
                    "input_name": "img; feat",
                    "input_type_train": "rgb; featuremap",
                    "input_layout_train": "NCHW; NCHW",
                    "input_type_rt": "nv12; featuremap",
                    "input_shape": "1x3x224x224; 1x4x8x8",
                    "norm_type": "data_mean_and_scale; no_preprocess",
                    "scale_value": "0.017; None",
                },
                "calibration_parameters": {"cal_data_dir": "cal; cal2"},
            },
        ),
        "input_parameters",
        "'mean_value' has 1 value(s) but 'input_name' has 2",
        "'None' for an input that takes none",
    )


THREE_INPUTS = {
    "input_name": "img; fm; idx",
    "input_type_train": "rgb; featuremap; featuremap",
    "input_layout_train": "NCHW; NCHW; NCHW",
    "input_type_rt": "nv12; featuremap; featuremap",
    "input_shape": "1x3x8x8; 1x4x8x8; 1x2",
    "norm_type": "data_mean_and_scale; no_preprocess; no_preprocess",
    "scale_value": "0.017;;",
}


def test_blank_fields_of_per_input_values_are_counted_as_written(workdir: Path) -> None:
    """'mean_value: 123.675 116.28 103.53;;' for three inputs (hunt 13 N4) is three fields, the image's mean and
    two left blank: it was refused as '2 value(s)', the last blank taken for a trailing separator."""
    params = {**THREE_INPUTS, "mean_value": "123.675 116.28 103.53;;"}
    cfg = load(workdir, {"input_parameters": params, "calibration_parameters": {"cal_data_dir": "cal; cal2; cal_f32"}})
    assert [spec.mean for spec in cfg.inputs] == [[123.675, 116.28, 103.53], None, None]
    assert [spec.scale for spec in cfg.inputs] == [[0.017], None, None]
    # One field too many is told as the user wrote them, a trailing ';' left aside.
    two_inputs = {"input_parameters": {"input_name": "a; b", "input_type_train": "rgb; rgb",
                                       "input_layout_train": "NCHW; NCHW", "input_type_rt": "nv12; nv12",
                                       "input_shape": DROP, "norm_type": DROP, "scale_value": DROP,
                                       "mean_value": "1;2;3;"},
                  "calibration_parameters": {"cal_data_dir": "cal; cal2"}}
    assert_error(error_lines(workdir, two_inputs), "input_parameters",
                 "'mean_value' has 3 value(s) but 'input_name' has 2")


def test_a_single_value_with_a_trailing_separator_is_every_inputs(workdir: Path) -> None:
    """'NHWC;' for two inputs is one value for both, as without the ';': keeping the blank as a second field left
    the second input's layout unset (NCHW in the .bin), and 'float32;' refused a config that converted before."""
    two_inputs = {"input_parameters": {"input_name": "a; b", "input_type_train": "rgb; rgb",
                                       "input_layout_train": "NCHW; NCHW", "input_type_rt": "rgb; rgb",
                                       "input_layout_rt": "NHWC;", "input_shape": DROP, "norm_type": DROP,
                                       "scale_value": DROP, "mean_value": DROP},
                  "calibration_parameters": {"cal_data_dir": "cal; cal2", "cal_data_type": "float32;"}}
    cfg = load(workdir, two_inputs)
    assert [spec.layout_rt for spec in cfg.inputs] == ["NHWC", "NHWC"]
    assert [spec.cal_data_type for spec in cfg.inputs] == ["float32", "float32"]


def test_cal_data_dir_count_mismatch(workdir: Path) -> None:
    assert_error(
        error_lines(workdir, {"calibration_parameters": {"cal_data_dir": "cal; cal2"}}),
        "calibration_parameters",
        "'cal_data_dir' has 2 value(s)",
    )


def test_multi_input_needs_input_name(workdir: Path) -> None:
    assert_error(
        error_lines(
            workdir,
            {
                "input_parameters": {
                    "input_type_train": "rgb; rgb",
                    "input_layout_train": "NCHW; NCHW",
                    "input_type_rt": "nv12; nv12",
                    "input_shape": DROP,
                    "norm_type": DROP,
                    "mean_value": DROP,
                    "scale_value": DROP,
                }
            },
        ),
        "input_parameters",
        "'input_name' is required",
    )


def test_blank_item_in_required_per_input_list(workdir: Path) -> None:
    assert_error(
        error_lines(
            workdir,
            {
                "input_parameters": {
                    "input_name": "a; b",
                    "input_type_train": " ; rgb",
                    "input_layout_train": "NCHW; NCHW",
                    "input_type_rt": "nv12; nv12",
                    "input_shape": DROP,
                    "norm_type": DROP,
                    "mean_value": DROP,
                    "scale_value": DROP,
                },
                "calibration_parameters": {"cal_data_dir": "cal; cal2"},
            },
        ),
        "input_parameters",
        "'input_type_train' is empty for input 'a'",
    )


def test_blank_cal_data_dir_item(workdir: Path) -> None:
    assert_error(
        error_lines(
            workdir,
            {
                "input_parameters": {
                    "input_name": "a; b",
                    "input_type_train": "rgb; rgb",
                    "input_layout_train": "NCHW; NCHW",
                    "input_type_rt": "nv12; nv12",
                    "input_shape": DROP,
                    "norm_type": DROP,
                    "mean_value": DROP,
                    "scale_value": DROP,
                },
                "calibration_parameters": {"cal_data_dir": ["cal", ""]},
            },
        ),
        "calibration_parameters",
        "'cal_data_dir' is empty for input 'b'",
    )


def test_duplicate_input_names(workdir: Path) -> None:
    assert_error(
        error_lines(
            workdir,
            {
                "input_parameters": {
                    "input_name": "a; a",
                    "input_type_train": "rgb; rgb",
                    "input_layout_train": "NCHW; NCHW",
                    "input_type_rt": "nv12; nv12",
                    "input_shape": DROP,
                    "norm_type": DROP,
                    "mean_value": DROP,
                    "scale_value": DROP,
                }
            },
        ),
        "input_parameters",
        "different",
    )


@pytest.mark.parametrize(
    "model_type, key, drop",
    [
        ("onnx", "onnx_model", None),
        ("caffe", "caffe_model", "onnx_model"),
        ("caffe", "prototxt", "onnx_model"),
    ],
)
def test_nonexistent_model_file(workdir: Path, model_type: str, key: str, drop: str | None) -> None:
    params: dict[str, Any] = {
        "prototxt": "m.prototxt",
        "caffe_model": "m.caffemodel",
        key: "nope.bin",
    }
    if drop:
        params[drop] = DROP
    assert_error(
        error_lines(workdir, {"model_parameters": params}, model_type=model_type),
        "model_parameters",
        f"{key} '{workdir / 'nope.bin'}' does not exist",
        "config's folder",
    )


def test_model_path_is_a_folder(workdir: Path) -> None:
    assert_error(
        error_lines(workdir, {"model_parameters": {"onnx_model": "cal"}}),
        "model_parameters",
        "is not a file",
    )


def test_nonexistent_cal_dir(workdir: Path) -> None:
    assert_error(
        error_lines(workdir, {"calibration_parameters": {"cal_data_dir": "missing"}}),
        "calibration_parameters",
        f"cal_data_dir '{workdir / 'missing'}' does not exist",
    )


def test_cal_dir_is_a_file(workdir: Path) -> None:
    assert_error(
        error_lines(workdir, {"calibration_parameters": {"cal_data_dir": "m.onnx"}}),
        "calibration_parameters",
        "is not a folder",
    )


def test_cal_data_dir_required_for_default(workdir: Path) -> None:
    assert_error(
        error_lines(workdir, {"calibration_parameters": {"cal_data_dir": DROP}}),
        "calibration_parameters",
        "Missing key: 'cal_data_dir'",
        "skip",
    )


def test_balance_without_factor(workdir: Path) -> None:
    assert_error(
        error_lines(workdir, {"compiler_parameters": {"compile_mode": "balance"}}),
        "compiler_parameters",
        "balance needs 'balance_factor'",
    )


def test_core_num_two_on_bayes(workdir: Path) -> None:
    assert_error(
        error_lines(
            workdir,
            {"model_parameters": {"march": "bayes"}, "compiler_parameters": {"core_num": 2}},
        ),
        "compiler_parameters",
        "core_num 2",
        "bayes",
    )


def test_input_source_unknown_input(workdir: Path) -> None:
    assert_error(
        error_lines(
            workdir,
            {
                "input_parameters": {"input_name": "data"},
                "compiler_parameters": {"input_source": {"img": "ddr"}},
            },
        ),
        "compiler_parameters",
        "'img'",
    )


@pytest.mark.parametrize(("type_rt", "source", "shape", "fragments"), [
    ("rgb", "pyramid", "1x3x64x64", ("pyramid", "rgb", "ddr")),
    ("bgr", "resizer", "1x3x64x64", ("resizer", "bgr", "ddr")),
    ("nv12", "resizer", "1x3x136x136", ("resizer", "136x136 = 18496", "18432")),
])
def test_camera_input_source_limits(workdir: Path, type_rt: str, source: str, shape: str,
                                    fragments: tuple[str, ...]) -> None:
    """The pyramid and resizer deliver nv12/gray pictures, the resizer fewer than 18432 pixels (seed 004);
    both were accepted for any input and size."""
    assert_error(
        error_lines(
            workdir,
            {
                "model_parameters": {"march": "bayes-e"},
                "input_parameters": {"input_name": "data", "input_type_rt": type_rt, "input_shape": shape},
                "compiler_parameters": {"input_source": {"data": source}},
            },
        ),
        "compiler_parameters",
        *fragments,
    )


def test_camera_input_sources_within_limits(workdir: Path) -> None:
    cfg = load(workdir, {"model_parameters": {"march": "bayes-e"},
                         "input_parameters": {"input_name": "data", "input_shape": "1x3x128x128"},
                         "compiler_parameters": {"input_source": {"data": "resizer"}}})
    assert cfg.compiler.input_source == {"data": "resizer"}


def test_resizer_with_layer_out_dump(workdir: Path) -> None:
    assert_error(
        error_lines(
            workdir,
            {
                "model_parameters": {"layer_out_dump": True},
                "compiler_parameters": {"input_source": {"data": "resizer"}},
            },
        ),
        "compiler_parameters",
        "resizer",
        "layer_out_dump",
    )


def test_working_dir_is_a_file(workdir: Path) -> None:
    assert_error(
        error_lines(workdir, {"model_parameters": {"working_dir": "m.onnx"}}),
        "model_parameters",
        "not a folder",
    )


@pytest.mark.parametrize("working_dir", ["cal", "./cal/"])
def test_working_dir_is_a_calibration_folder(workdir: Path, working_dir: str) -> None:
    # the artefacts would land among the samples, and the next run would read them as samples
    lines = error_lines(workdir, {"model_parameters": {"working_dir": working_dir}})
    assert_error(lines, "model_parameters", "cal_data_dir")
    assert "choose another working_dir" in lines[-1]


def test_missing_custom_op_dir(workdir: Path) -> None:
    assert_error(
        error_lines(workdir, {"custom_op": {"custom_op_dir": "ops"}}), "custom_op", "custom_op_dir"
    )


def test_malformed_yaml(workdir: Path) -> None:
    path = raw_config(workdir, "model_parameters:\n  march: 'bayes\n  onnx_model: m.onnx\n")
    with pytest.raises(ConfigError, match=r"not valid YAML: .* at line \d+, column \d+"):
        load_config(path)


def test_bad_indentation_yaml(workdir: Path) -> None:
    path = raw_config(workdir, "model_parameters:\n  march: bayes\n onnx_model: m.onnx\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(path)


@pytest.mark.parametrize("encoding", ["gbk", "utf-16"])
def test_a_config_with_chinese_comments_in_another_encoding_is_read(workdir: Path, encoding: str,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    """A config saved by a Chinese Windows editor (GBK) or as UTF-16 with its byte-order mark: 'Cannot read config
    file ...: utf-8 codec can't decode byte 0xd0 in position 4' named a byte and no fix."""
    text = "# 模型转换配置\n" + make(workdir).read_text()
    path = workdir / "cn.yaml"
    path.write_bytes(text.encode(encoding))
    with caplog.at_level(logging.WARNING, logger="hbtools"):
        config = load_config(path, "onnx")
    assert config.model.march == BASE["model_parameters"]["march"]
    assert ("not UTF-8; read as GBK" in caplog.text) == (encoding == "gbk")


def test_a_model_given_as_the_config_says_so(workdir: Path) -> None:
    path = workdir / "model.onnx"
    path.write_bytes(b"\x08\x07\x12\x07pytorch\x1a\x032.1\x00\x00\xff\xfe\xd0")
    with pytest.raises(ConfigError, match=r"is not a text file\nPass the YAML config \(not the model or a .bin\)"):
        load_config(path, "onnx")


def test_a_tag_that_builds_an_object_is_refused_with_its_fix(workdir: Path) -> None:
    path = raw_config(workdir, "model_parameters: !!python/object/apply:os.system ['echo hacked']\n")
    with pytest.raises(ConfigError, match=r"not valid YAML: .*\nRemove the tag"):
        load_config(path, "onnx")


def test_config_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="Config file not found: .*nope.yaml"):
        load_config(tmp_path / "nope.yaml")


def test_config_path_is_folder(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not a file"):
        load_config(tmp_path)


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("- a\n- b\n", "mapping of groups, not a list"),
        ("", "is empty"),
        ("just text\n", "not a str"),
    ],
)
def test_config_not_a_mapping(workdir: Path, text: str, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        load_config(raw_config(workdir, text))


def test_duplicate_key(workdir: Path) -> None:
    text = (
        make(workdir).read_text().replace("march: bernoulli2", "march: bernoulli2\n  march: bayes")
    )
    with pytest.raises(ConfigError, match=r"Key 'march' is given twice .*lines 3 and 4"):
        load_config(raw_config(workdir, text))


def test_duplicate_key_with_the_same_value_is_kept_once_with_a_warning(
    workdir: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A vendor config (rdk_model_zoo EfficientFormerv2_s2_config.yaml) lists one node_info entry twice,
    word for word; hb_mapper ran it, hbtools refused the whole file."""
    monkeypatch.setattr(logging.getLogger("hbtools"), "propagate", True)
    caplog.set_level(logging.WARNING, logger="hbtools")
    entry = "    \"conv1\": {'ON': 'BPU', 'InputType': 'int16'}"
    text = make(workdir).read_text().replace(
        "march: bernoulli2", f"march: bernoulli2\n  node_info: {{\n{entry},\n{entry}\n  }}"
    )
    cfg = load_config(raw_config(workdir, text))
    assert cfg.model.node_info["conv1"].input_types == {None: "int16"}
    assert "'conv1' is given twice with the same value" in caplog.text
    clash = text.replace(f"{entry},\n{entry}", f"{entry},\n    \"conv1\": {{'ON': 'CPU'}}")
    with pytest.raises(ConfigError, match=r"Key 'conv1' is given twice with different values .*lines 5 and 6"):
        load_config(raw_config(workdir, clash))


def test_unknown_model_type(workdir: Path) -> None:
    with pytest.raises(ConfigError, match="Unknown model type 'tflite'"):
        load(workdir, model_type="tflite")


@pytest.mark.parametrize("value", ["debug", "INFO", "warn"])
def test_log_level_of_older_configs_is_accepted(workdir: Path, value: str, caplog: pytest.LogCaptureFixture,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """hb_mapper 1.x's model_parameters.log_level, in every config of the older OE samples."""
    monkeypatch.setattr(logging.getLogger("hbtools"), "propagate", True)
    with caplog.at_level("INFO", logger="hbtools"):
        load(workdir, {"model_parameters": {"log_level": value}})
    assert "log_level" in caplog.text and "log file holds every level" in caplog.text


def test_bad_log_level(workdir: Path) -> None:
    assert_error(error_lines(workdir, {"model_parameters": {"log_level": "verbose"}}), "model_parameters",
                 "'log_level' value 'verbose' is not valid", "debug, info, warn")
