"""``schema`` definitions of the makertbin YAML groups.

Ranges and defaults are the union of the two vendor documents (the older English
one and the newer Chinese one): where they disagree, every value either accepts
is accepted, so configs written for either release load unchanged.

``validate_groups`` checks the group structure and each parameter on its own;
rules that tie parameters together live in ``hbtools.config.inputs`` and
``hbtools.config.loader``.
"""

from __future__ import annotations

from typing import Any

from schema import Optional, Schema, SchemaError, Use

from hbtools.config import nodes
from hbtools.config.model import RT_TYPES, TRAIN_TYPES
from hbtools.config.values import (
    as_bool,
    as_choice,
    as_file_name,
    as_int,
    as_names,
    as_per_channel,
    as_per_input,
    as_percentile,
    as_shapes,
    as_text,
    choice,
    choice_item,
    did_you_mean,
    fail,
    group_error,
    inline_mapping,
    is_unset,
    layout_item,
    separate_batch,
    text_item,
)
from hbtools.errors import ConfigError
from hbtools.log import logger

MARCHES = ("bernoulli2", "bayes", "bayes-e", "nash-e", "nash-m")
MODEL_TYPES = ("onnx", "caffe")
MODEL_FILES = {"onnx": ("onnx_model",), "caffe": ("prototxt", "caffe_model")}
REMOVABLE_NODE_TYPES = ("Quantize", "Transpose", "Dequantize", "Cast", "Reshape", "Softmax")
DEBUG_MODES = ("dump_calibration_data",)
LAYOUTS = ("NCHW", "NHWC")
SPACES = ("regular", "bt601_video")
NORM_TYPES = ("no_preprocess", "data_mean", "data_scale", "data_mean_and_scale")
# int64 and float64: index inputs and float64 models (the data takes the model input's type)
CAL_DATA_TYPES = ("float32", "uint8", "int32", "int16", "int8", "int64", "float64")
CALIBRATION_TYPES = ("default", "mix", "kl", "max", "load", "skip")
COMPILE_MODES = ("latency", "bandwidth", "balance")
OPTIMIZE_LEVELS = ("O0", "O1", "O2", "O3")
INPUT_SOURCES = ("ddr", "pyramid", "resizer")

REQUIRED_GROUPS = (
    "model_parameters",
    "input_parameters",
    "calibration_parameters",
    "compiler_parameters",
)
GROUPS = (*REQUIRED_GROUPS, "custom_op")


def _path(key: str) -> Use:
    # Paths stay strings here; the loader resolves them against the YAML's folder.
    return Use(as_text(key))


def _input_source(value: Any) -> dict[str, str]:
    value = inline_mapping(value)
    if not isinstance(value, dict):
        fail(
            f"'input_source' must be a mapping of input name to source, e.g. "
            f'{{"data": "ddr"}}, got {value!r}'
        )
    return {str(k): choice(f"input_source[{k}]", v, INPUT_SOURCES) for k, v in value.items()}


LOG_LEVELS = ("debug", "info", "warn", "warning", "error")
# Accepted from hb_mapper 1.x configs, with nothing to change: the templates leave them out.
LEGACY_KEYS = frozenset({"log_level"})


def model_parameters(model_type: str) -> dict[Any, Any]:
    required = MODEL_FILES[model_type]

    def file_key(name: str) -> Any:
        return name if name in required else Optional(name)

    return {
        file_key("prototxt"): _path("prototxt"),
        file_key("caffe_model"): _path("caffe_model"),
        file_key("onnx_model"): _path("onnx_model"),
        "march": Use(as_choice("march", MARCHES)),
        Optional("output_model_file_prefix", default="model"): Use(
            as_file_name("output_model_file_prefix")
        ),
        Optional("working_dir", default="model_output"): _path("working_dir"),
        Optional("layer_out_dump", default=False): Use(as_bool("layer_out_dump")),
        Optional("output_nodes"): Use(as_names("output_nodes")),
        Optional("remove_node_type"): Use(as_names("remove_node_type", REMOVABLE_NODE_TYPES)),
        Optional("remove_node_name"): Use(as_names("remove_node_name")),
        Optional("set_node_data_type"): Use(nodes.parse_set_node_data_type),
        Optional("debug_mode"): Use(as_names("debug_mode", DEBUG_MODES)),
        Optional("node_info"): Use(nodes.parse_node_info),
        # hb_mapper 1.x's log file level, in every config of the older OE samples: hbtools's log file always
        # holds every level, so the value is checked and has nothing more to change.
        Optional("log_level"): Use(as_choice("log_level", LOG_LEVELS)),
    }


# Per-input parameters come out as lists (one item per input, None = not given for
# that input); inputs.py pairs them up and checks the counts.
INPUT_PARAMETERS: dict[Any, Any] = {
    Optional("input_name"): Use(as_per_input("input_name", text_item)),
    "input_type_train": Use(as_per_input("input_type_train", choice_item(TRAIN_TYPES))),
    "input_layout_train": Use(as_per_input("input_layout_train", layout_item)),
    "input_type_rt": Use(as_per_input("input_type_rt", choice_item(RT_TYPES))),
    Optional("input_layout_rt"): Use(as_per_input("input_layout_rt", choice_item(LAYOUTS))),
    Optional("input_space_and_range"): Use(
        as_per_input("input_space_and_range", choice_item(SPACES))
    ),
    Optional("input_shape"): Use(as_shapes("input_shape")),
    Optional("input_batch", default=1): Use(as_int("input_batch", 1, 4096)),
    Optional("separate_batch"): Use(separate_batch),
    Optional("norm_type"): Use(as_per_input("norm_type", choice_item(NORM_TYPES))),
    Optional("mean_value"): Use(as_per_channel("mean_value")),
    Optional("scale_value"): Use(as_per_channel("scale_value", nonzero=True)),
}

CALIBRATION_PARAMETERS: dict[Any, Any] = {
    Optional("cal_data_dir"): Use(as_per_input("cal_data_dir", text_item)),
    Optional("cal_data_type"): Use(as_per_input("cal_data_type", choice_item(CAL_DATA_TYPES))),
    Optional("preprocess_on", default=False): Use(as_bool("preprocess_on")),
    Optional("calibration_type", default="default"): Use(
        as_choice("calibration_type", CALIBRATION_TYPES)
    ),
    Optional("max_percentile"): Use(as_percentile("max_percentile")),
    Optional("per_channel", default=False): Use(as_bool("per_channel")),
    Optional("run_on_cpu"): Use(as_names("run_on_cpu")),
    Optional("run_on_bpu"): Use(as_names("run_on_bpu")),
    Optional("optimization"): Use(nodes.parse_optimization),
}

COMPILER_PARAMETERS: dict[Any, Any] = {
    Optional("compile_mode", default="latency"): Use(as_choice("compile_mode", COMPILE_MODES)),
    Optional("balance_factor"): Use(as_int("balance_factor", 0, 100)),
    Optional("debug", default=False): Use(as_bool("debug")),
    Optional("core_num", default=1): Use(as_int("core_num", 1, 2)),
    Optional("optimize_level", default="O0"): Use(as_choice("optimize_level", OPTIMIZE_LEVELS)),
    Optional("input_source"): Use(_input_source),
    Optional("max_time_per_fc", default=0): Use(
        as_int("max_time_per_fc", 1000, 4294967295, zero_ok=True)
    ),
    Optional("jobs"): Use(as_int("jobs", 1)),
    Optional("advice"): Use(as_int("advice", 0)),
}

CUSTOM_OP: dict[Any, Any] = {
    Optional("custom_op_method"): Use(as_choice("custom_op_method", ("register",))),
    Optional("op_register_files"): Use(as_names("op_register_files")),
    Optional("custom_op_dir"): _path("custom_op_dir"),
}


def group_schemas(model_type: str) -> dict[str, dict[Any, Any]]:
    return {
        "model_parameters": model_parameters(model_type),
        "input_parameters": INPUT_PARAMETERS,
        "calibration_parameters": CALIBRATION_PARAMETERS,
        "compiler_parameters": COMPILER_PARAMETERS,
        "custom_op": CUSTOM_OP,
    }


def _key_name(key: Any) -> str:
    return key.schema if isinstance(key, Optional) else key


GROUP_KEYS: dict[str, tuple[str, ...]] = {
    group: tuple(_key_name(k) for k in spec) for group, spec in group_schemas("onnx").items()
}
KEY_GROUP = {key: group for group, keys in GROUP_KEYS.items() for key in keys}


# Parameters of hb_compile, the toolchain of the newer boards (S100, J6), that configs carried over
# to hb_mapper still hold (found in D-Robotics rdk_model_zoo): what each is here.
_HB_COMPILE = "is a parameter of hb_compile (the S100 / J6 toolchain), not of hb_mapper"
OTHER_TOOL_KEYS = {
    "std_value": f"{_HB_COMPILE}: hb_compile divides by std, hb_mapper multiplies by scale_value; write "
                 "scale_value: 1/std per channel (std 58.395 is scale_value 0.017125)",
    "quant_config": f"{_HB_COMPILE}; here int16 precision is asked for with calibration_parameters "
                    "optimization (set_all_nodes_int16, set_<NodeKind>_input_int16, ...) and model_parameters "
                    "node_info (InputType / OutputType per node)",
    "extra_params": f"{_HB_COMPILE}, and has no counterpart here: remove it",
    "cache_mode": f"{_HB_COMPILE}, and has no counterpart here: remove it",
    "cache_path": f"{_HB_COMPILE}, and has no counterpart here: remove it",
}


def _check_keys(group: str, data: dict[Any, Any]) -> None:
    known = GROUP_KEYS[group]
    for key in data:
        if key in known:
            continue
        home = KEY_GROUP.get(key) if isinstance(key, str) else None
        if home:
            detail = f"; it belongs in the '{home}' group"
        elif key in OTHER_TOOL_KEYS:
            detail = f"; {key} {OTHER_TOOL_KEYS[key]}"
        else:
            detail = f"{did_you_mean(str(key), known)}; valid parameters are: {', '.join(known)}"
        raise group_error(group, f"Unknown parameter '{key}' in group '{group}'{detail}")


def _error_detail(exc: SchemaError) -> str:
    # The innermost message is ours (or schema's "Missing keys: ..."); the outer
    # "Key 'x' error:" lines only repeat the parameter name the message already has.
    lines = [m for m in (*exc.errors, *exc.autos) if m]
    custom = [m for m in exc.errors if m]
    return (custom or lines)[-1]


def validate_group(group: str, data: Any, model_type: str) -> dict[str, Any]:
    if data is None:  # a group present with every parameter commented out
        data = {}
    if not isinstance(data, dict):
        raise group_error(
            group,
            f"'{group}' must be a mapping of parameter: value, got {type(data).__name__} {data!r}",
        )
    _check_keys(group, data)
    # An empty value means "not given" for every parameter, so defaults apply and a
    # blank required parameter is reported as missing.
    given = {k: v for k, v in data.items() if not is_unset(v)}
    try:
        return Schema(group_schemas(model_type)[group]).validate(given)
    except SchemaError as exc:
        raise group_error(group, _error_detail(exc)) from None


def validate_groups(raw: dict[Any, Any], model_type: str) -> dict[str, dict[str, Any]]:
    """Check the top-level layout and every group; returns the normalised groups."""
    if model_type not in MODEL_TYPES:
        raise ConfigError(f"Unknown model type '{model_type}'; use onnx or caffe")
    for key in raw:
        if key not in GROUPS:
            home = KEY_GROUP.get(key) if isinstance(key, str) else None
            fix = (
                f"'{key}' is a parameter of the '{home}' group; indent it under that group"
                if home
                else f"valid groups are: {', '.join(GROUPS)}"
            )
            raise ConfigError(
                f"Unknown group '{key}' at the top level of the config"
                f"{did_you_mean(str(key), GROUPS)}\n{fix}"
            )
    missing = [g for g in REQUIRED_GROUPS if g not in raw]
    if missing:
        raise ConfigError(
            f"Missing key{'s' if len(missing) > 1 else ''}: {', '.join(repr(g) for g in missing)}\n"
            f"A makertbin config needs the groups {', '.join(REQUIRED_GROUPS)} "
            f"(custom_op is optional)"
        )
    _model_files_of_the_other_type(raw.get("model_parameters"), model_type)
    return {group: validate_group(group, raw.get(group), model_type) for group in GROUPS}


def _model_files_of_the_other_type(mp: Any, model_type: str) -> None:
    """A config naming only the other type's model files: the command's --model-type is what is wrong."""
    if not isinstance(mp, dict):
        return
    given = {k for k, v in mp.items() if not is_unset(v)}
    caffe = {"prototxt", "caffe_model"} & given
    if model_type == "onnx" and "onnx_model" not in given and caffe:
        raise group_error("model_parameters", f"Missing key: 'onnx_model'\nthe config names a Caffe model "
                                              f"({', '.join(sorted(caffe))}): run the command with --model-type caffe")
    if model_type == "caffe" and "onnx_model" in given and not caffe:
        raise group_error("model_parameters", "Missing keys: 'caffe_model', 'prototxt'\nthe config names an ONNX "
                                              "model (onnx_model): run the command with --model-type onnx")
    if "onnx_model" in given and caffe:
        files = ", ".join(sorted(caffe))
        used, other = ("onnx_model", files) if model_type == "onnx" else (files, "onnx_model")
        logger.warning("model_parameters names an ONNX model (onnx_model) and a Caffe model (%s); --model-type %s "
                       "converts %s, and %s is not read", files, model_type, used, other)
