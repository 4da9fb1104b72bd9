"""``load_config``: a makertbin YAML file -> a validated, normalised ``Config``.

Order of work: read the YAML, validate each group on its own (``schema.py``),
resolve paths against the YAML's folder, split the inputs (``inputs.py``), then
the rules that tie groups together. Every problem is a ``ConfigError`` whose
first line names the group (``Key '<group>' error:``) and whose second line says
what is wrong and how to fix it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from hbtools.config.inputs import build_inputs, check_input_channels, check_input_source, label
from hbtools.config.model import (
    CalibrationParameters,
    CompilerParameters,
    Config,
    CustomOpParameters,
    InputSpec,
    ModelParameters,
    random_calibration,
)
from hbtools.config.nodes import merge_node_settings, node_info_snapshot
from hbtools.config.schema import GROUPS, MODEL_FILES, validate_groups
from hbtools.config.values import group_error
from hbtools.config.yaml_io import read_yaml
from hbtools.log import logger
from hbtools.march.profiles import get_profile

__all__ = ["check_input_channels", "config_from_dict", "load_config"]

NO_CAL_DATA = ("load", "skip")  # calibration types that need no calibration data


def _resolve(base: Path, text: str) -> Path:
    # Relative paths are taken from the YAML's folder, not the current directory,
    # so a config works wherever hb_mapper is started from.
    return Path(os.path.normpath(base / Path(text).expanduser()))


def _where(base: Path) -> str:
    return f"check the path (relative paths start from the config's folder {base})"


def _model(mp: dict[str, Any], cp: dict[str, Any], model_type: str, base: Path) -> ModelParameters:
    files = {
        k: _resolve(base, mp[k]) if k in mp else None
        for k in ("onnx_model", "prototxt", "caffe_model")
    }
    for key in MODEL_FILES[model_type]:  # the schema made these keys required
        path = files[key] or base
        if not path.is_file():
            state = "is not a file" if path.exists() else "does not exist"
            raise group_error("model_parameters", f"{key} '{path}' {state}; {_where(base)}")
    working_dir = _resolve(base, mp["working_dir"])
    if working_dir.exists() and not working_dir.is_dir():
        raise group_error(
            "model_parameters",
            f"working_dir '{working_dir}' exists and is not a folder; choose another path",
        )
    if "log_level" in mp:
        logger.info("model_parameters.log_level '%s': the log file holds every level in any case, the console "
                    "INFO and above", mp["log_level"])
    node_info = merge_node_settings(
        mp.get("node_info", {}),
        mp.get("set_node_data_type", []),
        cp.get("run_on_cpu", []),
        cp.get("run_on_bpu", []),
    )
    return ModelParameters(
        model_type=model_type,
        march=mp["march"],
        **files,
        output_model_file_prefix=mp["output_model_file_prefix"],
        working_dir=working_dir,
        layer_out_dump=mp["layer_out_dump"],
        output_nodes=mp.get("output_nodes", []),
        remove_node_type=mp.get("remove_node_type", []),
        remove_node_name=mp.get("remove_node_name", []),
        debug_mode=mp.get("debug_mode", []),
        node_info=node_info,
    )


def _cal_dirs(cp: dict[str, Any], base: Path) -> list[Path | None] | None:
    given = cp.get("cal_data_dir")
    if given is None and cp["calibration_type"] not in NO_CAL_DATA:
        raise group_error(
            "calibration_parameters",
            f"Missing key: 'cal_data_dir' (needed by calibration_type "
            f"{cp['calibration_type']}); give one folder per input, or use "
            f"calibration_type skip (random data) or load (QAT model)",
        )
    return None if given is None else [_resolve(base, d) if d else None for d in given]


def _check_cal_dirs(inputs: list[InputSpec], cal_type: str, base: Path, working_dir: Path) -> None:
    if random_calibration(cal_type, inputs):
        return
    for spec in inputs:
        d = spec.cal_data_dir
        if d is None:
            raise group_error(
                "calibration_parameters",
                f"'cal_data_dir' is empty for {label(spec.name)}; every input needs a folder",
            )
        if not d.is_dir():
            state = "is not a folder" if d.exists() else "does not exist"
            raise group_error(
                "calibration_parameters", f"cal_data_dir '{d}' {state}; {_where(base)}"
            )
        if working_dir.is_dir() and os.path.samefile(d, working_dir):
            # The artefacts would land among the samples (a prefix like '000' even replaces one),
            # and the next run would read small.bin as a sample.
            raise group_error(
                "model_parameters",
                f"working_dir '{working_dir}' is the cal_data_dir of {label(spec.name)}: the artefacts would be "
                "written among the calibration files; choose another working_dir",
            )


def _compiler(
    cc: dict[str, Any], model: ModelParameters, inputs: list[InputSpec]
) -> CompilerParameters:
    group = "compiler_parameters"
    if cc["compile_mode"] == "balance" and cc.get("balance_factor") is None:
        raise group_error(
            group,
            "compile_mode balance needs 'balance_factor' (0-100); add it "
            "or choose compile_mode latency or bandwidth",
        )
    # The allowed core counts are march data (bayes, for one, has a single core).
    cores = get_profile(model.march).core_num
    if cc["core_num"] not in cores:
        raise group_error(
            group,
            f"core_num {cc['core_num']} is not available on march {model.march}; "
            f"use core_num: {' or '.join(map(str, cores))}",
        )
    source = cc.get("input_source", {})
    names = [s.name for s in inputs]
    if None not in names:
        unknown = [k for k in source if k not in names]
        if unknown:
            raise group_error(
                group,
                f"input_source names input '{unknown[0]}', which is not in "
                f"input_name ({', '.join(map(str, names))}); use those names",
            )
    for spec in inputs:
        check_input_source(spec, source.get(spec.name))
    if model.layer_out_dump and "resizer" in source.values():
        raise group_error(
            group,
            "input_source resizer cannot be combined with "
            "model_parameters.layer_out_dump True; use ddr/pyramid or "
            "turn layer_out_dump off",
        )
    return CompilerParameters(
        compile_mode=cc["compile_mode"],
        balance_factor=cc.get("balance_factor"),
        debug=cc["debug"],
        core_num=cc["core_num"],
        optimize_level=cc["optimize_level"],
        input_source=source,
        max_time_per_fc=cc["max_time_per_fc"],
        jobs=cc.get("jobs"),
        advice=cc.get("advice"),
    )


def _custom_op(co: dict[str, Any], base: Path) -> CustomOpParameters:
    op_dir = _resolve(base, co["custom_op_dir"]) if "custom_op_dir" in co else None
    if op_dir is not None and not op_dir.is_dir():
        raise group_error(
            "custom_op", f"custom_op_dir '{op_dir}' is not an existing folder; {_where(base)}"
        )
    files = co.get("op_register_files", [])
    if co.get("custom_op_method") and not files:
        raise group_error(
            "custom_op",
            "custom_op_method register needs 'op_register_files': the Python file(s) of the ops "
            "(write one with 'hb_custom_op create')",
        )
    # The files are looked up in custom_op_dir, else next to the config; ".py" may be left out.
    folder = op_dir or base
    resolved = []
    for name in files:
        path = _resolve(folder, name)
        if not path.is_file() and path.suffix != ".py" and path.with_name(path.name + ".py").is_file():
            path = path.with_name(path.name + ".py")
        if not path.is_file():
            raise group_error(
                "custom_op",
                f"op_register_files: '{path}' does not exist; check the file name and "
                f"custom_op_dir (relative paths start from the config's folder {base})",
            )
        resolved.append(str(path))
    return CustomOpParameters(
        custom_op_method=co.get("custom_op_method"),
        op_register_files=resolved,
        custom_op_dir=op_dir,
    )


def _str(path: Path | None) -> str | None:
    return None if path is None else str(path)


def _snapshot(cfg: Config, groups: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The normalised values by group, JSON-serialisable (paths as str, shapes as 'AxBxC')."""
    m, cal, cc, co = cfg.model, cfg.calibration, cfg.compiler, cfg.custom_op
    ins = cfg.inputs
    return {
        "model_parameters": {
            "onnx_model": _str(m.onnx_model),
            "prototxt": _str(m.prototxt),
            "caffe_model": _str(m.caffe_model),
            "march": m.march,
            "output_model_file_prefix": m.output_model_file_prefix,
            "working_dir": str(m.working_dir),
            "layer_out_dump": m.layer_out_dump,
            "output_nodes": list(m.output_nodes),
            "remove_node_type": list(m.remove_node_type),
            "remove_node_name": list(m.remove_node_name),
            "set_node_data_type": list(groups["model_parameters"].get("set_node_data_type", [])),
            "debug_mode": list(m.debug_mode),
            "node_info": node_info_snapshot(m.node_info),
        },
        "input_parameters": {
            "input_name": [s.name for s in ins],
            "input_type_train": [s.type_train for s in ins],
            "input_layout_train": [s.layout_train for s in ins],
            "input_type_rt": [s.type_rt for s in ins],
            "input_layout_rt": [s.layout_rt for s in ins],
            "input_space_and_range": [s.space_and_range for s in ins],
            "input_shape": [None if s.shape is None else "x".join(map(str, s.shape)) for s in ins],
            "input_batch": cfg.input_batch,
            "norm_type": [s.norm_type for s in ins],
            "mean_value": [None if s.mean is None else list(s.mean) for s in ins],
            "scale_value": [None if s.scale is None else list(s.scale) for s in ins],
        },
        "calibration_parameters": {
            "cal_data_dir": [_str(s.cal_data_dir) for s in ins],
            "cal_data_type": [s.cal_data_type for s in ins],
            "preprocess_on": cal.preprocess_on,
            "calibration_type": cal.calibration_type,
            "max_percentile": cal.max_percentile,
            "per_channel": cal.per_channel,
            "run_on_cpu": list(groups["calibration_parameters"].get("run_on_cpu", [])),
            "run_on_bpu": list(groups["calibration_parameters"].get("run_on_bpu", [])),
            "optimization": list(cal.optimization),
        },
        "compiler_parameters": {
            "compile_mode": cc.compile_mode,
            "balance_factor": cc.balance_factor,
            "debug": cc.debug,
            "core_num": cc.core_num,
            "optimize_level": cc.optimize_level,
            "input_source": dict(cc.input_source),
            "max_time_per_fc": cc.max_time_per_fc,
            "jobs": cc.jobs,
            "advice": cc.advice,
        },
        "custom_op": {
            "custom_op_method": co.custom_op_method,
            "op_register_files": list(co.op_register_files),
            "custom_op_dir": _str(co.custom_op_dir),
        },
    }


def load_config(path: str | Path, model_type: str = "onnx", *, cal_data: bool = True) -> Config:
    """Read, validate and normalise a makertbin YAML config.

    ``model_type`` is the ``--model-type`` of the command ("onnx" or "caffe"); it
    decides which model-file parameters are required. ``cal_data`` False: the
    command reads no calibration data (``hb_mapper infer``), so the cal_data_dir
    folders need not exist. Raises ``ConfigError``.
    """
    yaml_path = Path(os.path.abspath(Path(path).expanduser()))
    raw = read_yaml(yaml_path)
    return config_from_dict(raw, model_type, yaml_path.parent, yaml_path=yaml_path, cal_data=cal_data)


def config_from_dict(raw: dict[Any, Any], model_type: str, base: Path, *,
                     yaml_path: Path | None = None, cal_data: bool = True) -> Config:
    """Validate and normalise a config given as the YAML's mapping; paths are relative to ``base``.

    The built-in configs of ``hb_mapper checker`` and ``makertbin --fast-perf`` come
    through here too, so they are checked exactly like a user's file.
    """
    model_type = str(model_type).strip().lower()
    groups = validate_groups(raw, model_type)
    mp, ip, cp, cc, co = (groups[g] for g in GROUPS)
    model = _model(mp, cp, model_type, base)
    inputs = build_inputs(ip, cp, _cal_dirs(cp, base), model.march)
    if cal_data:
        _check_cal_dirs(inputs, cp["calibration_type"], base, model.working_dir)
    calibration = CalibrationParameters(
        calibration_type=cp["calibration_type"],
        max_percentile=cp.get("max_percentile"),
        per_channel=cp["per_channel"],
        preprocess_on=cp["preprocess_on"],
        optimization=cp.get("optimization", []),
    )
    config = Config(
        model=model,
        inputs=inputs,
        input_batch=ip["input_batch"],
        calibration=calibration,
        compiler=_compiler(cc, model, inputs),
        custom_op=_custom_op(co, base),
        yaml_path=yaml_path,
    )
    config.snapshot = _snapshot(config, groups)
    return config
