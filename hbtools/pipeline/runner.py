"""makertbin: sequence the five stages and write the artefacts."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import onnx

from hbtools.config.builtin import builtin_config
from hbtools.config.loader import load_config
from hbtools.config.model import Config, random_calibration
from hbtools.config.values import closest_names, split_multi
from hbtools.data.calibration import (
    CalibrationSource,
    FolderCalibrationSource,
    RandomCalibrationSource,
    dump_calibration_data,
)
from hbtools.errors import HbError
from hbtools.graph.model_io import save_model
from hbtools.graph.origins import recorded_origins
from hbtools.log import first_of
from hbtools.march.profiles import MarchProfile, get_profile
from hbtools.ops import custom
from hbtools.outputs import file_stem
from hbtools.pipeline import calibrate, compile, optimize, parse, quantize
from hbtools.quant import layer_dump, report, weight_precision
from hbtools.quant.plan import asymmetric_wanted, make_plan, per_channel_wanted
from hbtools.quant.search import release_pool
from hbtools.quant.units import model_partition
from hbtools.runs.memory import check_memory
from hbtools.runs.timing import StepTimes
from hbtools.runs.transaction import artefact_transaction, check_inputs_outside

log = logging.getLogger("hbtools")

SKIP_SAMPLES = 4
SEARCHED_TYPES = ("default", "mix")  # calibration types that search; they also split layers int8 weights spoil
SPLIT_SAMPLES = 8  # samples scoring which layers to split


def artefact_paths(config: Config) -> dict[str, Path]:
    prefix = config.output_prefix_path
    return {
        "original": Path(f"{prefix}_original_float_model.onnx"),
        "optimized": Path(f"{prefix}_optimized_float_model.onnx"),
        "calibrated": Path(f"{prefix}_calibrated_model.onnx"),
        "quantized": Path(f"{prefix}_quantized_model.onnx"),
        "bin": Path(f"{prefix}.bin"),
    }


def makertbin(config_path: str | Path, model_type: str) -> dict[str, Path]:
    return convert(load_config(config_path, model_type))


def makertbin_fast_perf(model: str | Path, model_type: str, march: str, input_shapes: list[tuple[str, str]],
                        proto: str | Path | None = None) -> dict[str, Path]:
    """``makertbin --fast-perf``: the built-in performance config (SPEC §6), artefacts in ./model_output."""
    config = builtin_config(model, model_type, march, input_shapes, fast_perf=True,
                            working_dir=Path("model_output"), prefix=file_stem(Path(model).stem) or "model",
                            option="--input-shape",
                            proto=proto)
    return convert(config)


def convert(config: Config) -> dict[str, Path]:
    log.info("Start Model Convert....")
    profile = get_profile(config.model.march)
    _warn_unsupported(config)
    custom.register_from_config(config.custom_op.op_register_files)  # before parse checks the ops
    parsed = parse.run(config)
    config = dataclasses.replace(config, inputs=parsed.inputs)
    config = _vendor_node_names(config, parsed.model)
    _check_node_names(config, parsed.model, profile)
    check_memory(parsed.model, [spec.shape for spec in parsed.inputs if spec.shape])
    source = _calibration_source(config)  # checks every data file before anything is written
    final = artefact_paths(config)
    inputs = _run_inputs(config)
    check_inputs_outside(config.model.working_dir, _known_entries(config, final), inputs)

    def committed() -> None:  # the set is in place: a Ctrl-C now is acted on only after these lines
        _log_build_parameters(final["bin"])
        log.info("Convert to runtime bin file successfully!")
        log.info("End Model Convert")

    with artefact_transaction(config.model.working_dir, set_name=config.model.output_model_file_prefix,
                              inputs=inputs, committed=committed) as staging:
        _build(config, parsed, source, profile, staging, final)
    return final


def _run_inputs(config: Config) -> list[Path]:
    """The files and folders the run reads: no artefact may replace one (SPEC §10)."""
    m = config.model
    paths = [m.onnx_model, m.prototxt, m.caffe_model, config.yaml_path, config.custom_op.custom_op_dir,
             *(spec.cal_data_dir for spec in config.inputs),
             *(Path(f) for f in config.custom_op.op_register_files)]
    return [Path(p) for p in paths if p]


def _known_entries(config: Config, final: dict[str, Path]) -> list[str]:
    """The entries of working_dir a run is known to write before it runs (the commit checks them all)."""
    prefix = config.model.output_model_file_prefix
    names = [path.name for path in final.values()] + [f"{prefix}.html", f"{prefix}.png"]
    return names + (["calibration_data"] if "dump_calibration_data" in config.model.debug_mode else [])


def _log_build_parameters(bin_path: Path) -> None:
    """The build parameters as hb_model_info prints them from the .bin (hb_mapper 1.x ends its log with them)."""
    from hbtools import __version__
    from hbtools.runtime.binfile import read_bin
    from hbtools.tools.model_info import report

    for model in read_bin(bin_path).models:
        for line in report(model, __version__):
            log.info(line)


def _build(config: Config, parsed: parse.ParseResult, source: CalibrationSource, profile: MarchProfile,
           staging: Path, final: dict[str, Path]) -> None:
    """Write every artefact into ``staging`` (logged under its final name)."""
    paths = {kind: staging / path.name for kind, path in final.items()}
    # Each stage's model is held only while a later step reads it (a VGG's weights are 550 MB a copy).
    original = parsed.take_model()
    save_model(original, paths["original"])
    log.info("Parsing the input model done: %s", final["original"])
    optimized = optimize.run(original, profile, all_bpu=config.model.fast_perf,
                             placed={name: info.on for name, info in config.model.node_info.items() if info.on})
    del original
    times = StepTimes()
    weights_only = None
    # The halves of a split layer need int16 (plan: they cancel only in their sum): no split without it.
    if config.calibration.calibration_type in SEARCHED_TYPES and profile.int16 and not config.model.fast_perf:
        with times.step("weight precision"):
            optimized, weights_only = _finer_weights(config, profile, optimized, source)
    partition = model_partition(optimized, profile, config)
    plan = make_plan(optimized, partition, config, profile)
    compile.check_before_calibration(optimized, partition, config)
    save_model(optimized, paths["optimized"])
    log.info("Model optimization done: %s", final["optimized"])
    if "dump_calibration_data" in config.model.debug_mode:
        dump_calibration_data(source, staging)
        log.info("calibration data dumped to %s", config.model.working_dir / "calibration_data")
    if config.calibration.calibration_type == "skip":
        log.warning("calibration_type 'skip' calibrates on random data: the model is fit for performance "
                    "checks only, not for accuracy evaluation")
    cal = calibrate.run(optimized, plan, lambda: iter(source), len(source),
                        calibration_type=config.calibration.calibration_type,
                        max_percentile=config.calibration.max_percentile,
                        allow_int16=profile.int16 and not config.calibration.options.all_int8,
                        march_int16=profile.int16,
                        loaded_thresholds=parsed.loaded_thresholds, loaded_int16=parsed.loaded_int16,
                        bias_correction=_bias_correction_mode(config),
                        weights_only=weights_only, times=times,
                        generated=isinstance(source, RandomCalibrationSource))
    save_model(cal.model, paths["calibrated"])
    log.info("Model calibration done: %s", final["calibrated"])
    # The similarity table reads the optimized model back from its file: not held through quantize, and let
    # go there once its session is built (the partition and the plan hold parts of it, hence all of it).
    del optimized, partition, plan

    with times.step("quantize"):
        result = quantize.run(cal.model, config, profile)
    summary = cal.summary
    del cal
    if config.model.layer_out_dump:
        layer_dump.annotate(result)
    save_model(result.model, paths["quantized"])
    log.info("Model quantization done: %s", final["quantized"])
    first = next(iter(source))
    layouts = {spec.name: spec.layout_train for spec in parsed.inputs}
    report.log_node_table(result, report.node_similarity(paths["optimized"], result, first, layouts))
    report.log_cpu_reasons(result.partition, result.origins)
    with times.step("compile"):
        compile.run(result, config, parsed.inputs, profile, paths["bin"], calibration=summary)
    log.info("runtime model written: %s", final["bin"])
    log.info(times.line())
    release_pool()


def _finer_weights(config: Config, profile: MarchProfile, optimized: onnx.ModelProto,
                   source: CalibrationSource) -> tuple[onnx.ModelProto, float | None]:
    """``optimized`` with the convolutions int8 weights spoil split in two (``weight_precision``), and the
    output cosine int8 weights alone give."""
    with _quiet():  # the plan made below says its lines once, for the model kept
        plan = make_plan(optimized, model_partition(optimized, profile, config), config, profile)
    chosen = calibrate.spread(len(source), SPLIT_SAMPLES)
    feeds = source.picked(chosen)
    split, weights_only = weight_precision.finer_weights(optimized, plan, lambda: iter(source), feeds)
    return split or optimized, weights_only


@contextmanager
def _quiet() -> Iterator[None]:
    """hbtools' INFO and WARNING lines held back (a step run again, or run only to explain an error)."""
    hbtools_log = logging.getLogger("hbtools")
    level = hbtools_log.level
    hbtools_log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        hbtools_log.setLevel(level)


# The vendor's optimizer writes a Div by a constant as a Mul named ``<Div's name>_mul``, and rdk_model_zoo's
# configs (ConvNeXt, EdgeNeXt) give node_info under that name.
VENDOR_MUL_OF_DIV = "_mul"


def _vendor_node_names(config: Config, model: onnx.ModelProto) -> Config:
    """``config`` with each node name the model lacks but that is the vendor's name for one of its nodes (the Mul
    the vendor writes for Div ``X``: ``X_mul``) given as that node's name."""
    kinds = {n.name: n.op_type for n in model.graph.node}
    renamed = {}
    for name in config.model.node_info:
        base = name[:-len(VENDOR_MUL_OF_DIV)]
        if name not in kinds and name.endswith(VENDOR_MUL_OF_DIV) and kinds.get(base) == "Div" \
                and base not in config.model.node_info:
            renamed[name] = base
    if not renamed:
        return config
    for name, base in renamed.items():
        log.info("%s: '%s' is the vendor toolkit's name for the Mul it writes for Div node '%s'; applied to '%s'",
                 config.model.node_info[name].given_by, name, base, base)
    node_info = {renamed.get(name, name): info for name, info in config.model.node_info.items()}
    return dataclasses.replace(config, model=dataclasses.replace(config.model, node_info=node_info))


def _check_node_names(config: Config, model: onnx.ModelProto, profile: MarchProfile) -> None:
    """Every node a config names must be in the model: a typo would otherwise change nothing.

    All the missing names are said at once, under the parameter that gave them; a name of a node the
    optimize stage writes for a user's node (the node table and older debugger tables name them) is told
    that node's name.
    """
    names = {n.name for n in model.graph.node}
    missing: dict[str, list[str]] = {}
    for name, info in config.model.node_info.items():
        if name not in names:
            missing.setdefault(info.given_by, []).append(name)
    if not missing:
        return
    written_for = _written_for(model, profile)
    parts = []
    for given_by, absent in missing.items():
        listed = first_of([f"'{name}'{_not_the_users(name, names, written_for)}" for name in absent], 10)
        total = sum(info.given_by == given_by for info in config.model.node_info.values())
        parts.append(f"{given_by} names {len(absent)} node(s) (of {total}) that the model does not have: "
                     f"{listed}{_names_split_apart(given_by, absent, names)}")
    raise HbError(f"{'; '.join(parts)} (model {config.model.onnx_model or config.model.caffe_model}); "
                  f"use the model's node names (hb_mapper checker lists them)")


def _written_for(model: onnx.ModelProto, profile: MarchProfile) -> dict[str, str]:
    """node of the optimized model -> the user's node it is written for (``graph.origins``)."""
    with _quiet():
        try:
            return recorded_origins(optimize.run(model, profile))
        except Exception:  # noqa: BLE001 - only explains a name: the ERROR about the name stands without it
            return {}


def _not_the_users(name: str, names: set[str], written_for: dict[str, str]) -> str:
    if name in written_for:
        return f" (a node hbtools writes for the model's node '{written_for[name]}': give '{written_for[name]}')"
    return closest_names(name, names)


def _names_split_apart(given_by: str, absent: list[str], names: set[str]) -> str:
    """A note when the missing names are the parts of model node names holding ';' or ',' (tf2onnx names
    nodes 'a;b'), which the string form of a parameter splits at."""
    whole = sorted(n for n in names if len(parts := split_multi(given_by, n)) > 1 and set(parts) <= set(absent))
    if not whole:
        return ""
    return (f"; the model has node(s) {', '.join(repr(n) for n in whole)}: a string splits at ';' and ',', so "
            f"give such a name as an item of a YAML list ({given_by}: [{whole[0]!r}])")


def _calibration_source(config: Config) -> CalibrationSource:
    if random_calibration(config.calibration.calibration_type, config.inputs):
        return RandomCalibrationSource(config.inputs, num_samples=SKIP_SAMPLES)
    source = FolderCalibrationSource(config.inputs, preprocess_on=config.calibration.preprocess_on)
    source.check_all()
    return source


# Accepted for compatibility with existing configs, but not acted on yet.
def _warn_unsupported(config: Config) -> None:
    if config.calibration.options.lstm_batch_last:
        log.warning("optimization lstm_batch_last has no effect: LSTM layers are unrolled over their time steps, "
                    "which takes either layout")
    kind = config.calibration.calibration_type
    if config.calibration.per_channel and not per_channel_wanted(config):
        log.warning("per_channel takes effect with calibration_type max or kl, not %s; calibrating per tensor", kind)
    if config.calibration.options.asymmetric and not asymmetric_wanted(config):
        log.warning("optimization asymmetric is ignored with calibration_type load: the QAT model's scales are "
                    "used as they are")


def _bias_correction_mode(config: Config) -> str:
    if config.calibration.options.bias_correction:
        return "on"
    # The searching methods try it and keep it only when the output gets closer to float.
    return "auto" if config.calibration.calibration_type in ("default", "mix") else "off"
