"""A catalogue of bad inputs across every tool (issue 14): each is one clean ERROR.

Every case runs a tool's real entry point in a fresh copy of a folder that holds a
converted model (artefacts, ``.bin``, dumped calibration data) and asserts what a
user would check: the documented exit code of the mistake's class (docs/errors.md),
exactly one ERROR line naming the problem (besides the tools' fixed framing lines),
no traceback or "internal error" anywhere, and every file and folder that was there
before byte-identical, with nothing added but log files.

``CLS`` numbers are the classes of issue 14's list (1 mixed artefact sets ... 10
custom-op exits); 0 are other config mistakes of SPEC §10.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import yaml
from bin_fixtures import logger_restored
from builders import MODELS, make_project
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import numpy_helper

from hbtools.cli import (
    hb_custom_op,
    hb_eval_preprocess,
    hb_mapper,
    hb_model_info,
    hb_model_modifier,
    hb_pack,
    hb_perf,
    hb_verifier,
    hmct_debugger,
    hrt_model_exec,
    vec_diff,
)
from hbtools.errors import EXIT_INPUT, EXIT_SYSTEM, EXIT_USAGE
from hbtools.pipeline.runner import makertbin

TOOLS: dict[str, Callable[[list[str]], Any]] = {
    "hb_mapper": lambda a: hb_mapper.main.main(args=a, prog_name="hb_mapper"),
    "hmct-debugger": hmct_debugger.main,
    "hb_model_info": lambda a: hb_model_info.main.main(args=a, prog_name="hb_model_info"),
    "hb_model_modifier": lambda a: hb_model_modifier.main.main(args=a, prog_name="hb_model_modifier"),
    "hb_pack": lambda a: hb_pack.main.main(args=a, prog_name="hb_pack"),
    "hb_perf": lambda a: hb_perf.main.main(args=a, prog_name="hb_perf"),
    "hb_verifier": lambda a: hb_verifier.main.main(args=a, prog_name="hb_verifier"),
    "hb_model_verifier": lambda a: hb_verifier.model_verifier.main(args=a, prog_name="hb_model_verifier"),
    "hrt_model_exec": lambda a: hrt_model_exec.main.main(args=a, prog_name="hrt_model_exec"),
    "vec_diff": lambda a: vec_diff.main.main(args=a, prog_name="vec_diff"),
    "hb_custom_op": lambda a: hb_custom_op.main.main(args=a, prog_name="hb_custom_op"),
    "hb_eval_preprocess": lambda a: hb_eval_preprocess.main.main(args=a, prog_name="hb_eval_preprocess"),
}
# Lines some tools add around the problem (seed format); they name no problem themselves.
FRAMING = re.compile(r"exception in command: |yaml file parse failed|Key '\w+' error:$")
# Lines a tool prints once its work is done: a refused output path must come before them (docs/errors.md).
WORK_DONE = re.compile(r"is removed|infer success")
ERROR = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ERROR (.*)$")
DROP = object()


# ---------------------------------------------------------------- the converted folder


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``img/``: resnet_like converted with its calibration data dumped; ``fm/``: a featuremap model."""
    root = tmp_path_factory.mktemp("bad_inputs")
    img = make_project(root / "img", MODELS["resnet_like"](), cal_count=2, calibration_type="max")
    img.write(model_parameters={"debug_mode": "dump_calibration_data"})
    fm = make_project(root / "fm", MODELS["featuremap_mlp"](), cal_count=2, calibration_type="max")
    with logger_restored():
        makertbin(img.config_path, "onnx")
        makertbin(fm.config_path, "onnx")
    odd = make_project(root / "odd", MODELS["resnet_like"](h=15), cal_count=2, calibration_type="max")
    odd.write(input_parameters={"input_type_rt": "nv12", "input_shape": None})  # the size comes from the model
    shutil.copytree(root / "img" / "model_output", root / "odd" / "model_output")  # a previous set to keep
    (root / "afile").write_text("a file, not a folder\n")
    for name in ("empty_a.bin", "empty_b.bin"):
        (root / name).write_bytes(b"")
    for d, n in (("left", 4), ("right", 8)):
        (root / d).mkdir()
        np.ones(n, np.float32).tofile(root / d / "x.bin")
    return root


@dataclass
class Env:
    root: Path

    def paths(self) -> dict[str, str]:
        out = self.root / "img" / "model_output"
        return {"root": str(self.root), "cfg": str(self.root / "img" / "config.yaml"),
                "fmcfg": str(self.root / "fm" / "config.yaml"), "oddcfg": str(self.root / "odd" / "config.yaml"),
                "bin": str(out / "small.bin"),
                "q": str(out / "small_quantized_model.onnx"), "calq": str(out / "small_calibrated_model.onnx"),
                "cal": str(out / "calibration_data"), "sample": str(self.root / "img" / "cal_data" / "000.bin"),
                "model": str(self.root / "img" / "model.onnx"), "afile": str(self.root / "afile"),
                "fmbin": str(self.root / "fm" / "model_output" / "small.bin")}


def snapshot(root: Path) -> dict[str, str]:
    """Every path under ``root`` (log files aside) with its content hash ('dir' for folders)."""
    out = {}
    for p in sorted(root.rglob("*")):
        if p.suffix == ".log" or "__pycache__" in p.parts:
            continue
        if p.is_symlink():
            kind = f"link to {os.readlink(p)}"
        else:
            kind = "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
        out[str(p.relative_to(root))] = kind
    return out


def run_tool(tool: str, args: list[str]) -> tuple[int, str]:
    with logger_restored(), CliRunner().isolation() as streams:
        try:
            TOOLS[tool](args)
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        output = streams[-1].getvalue().decode("utf-8", "replace")
    return code, output


def problem_lines(output: str) -> list[str]:
    lines = [m.group(1) for m in map(ERROR.match, output.splitlines()) if m]
    return [line for line in lines if not FRAMING.search(line)]


# ---------------------------------------------------------------- setups


def config(project: str = "img", **groups: dict[str, Any]) -> Callable[[Env], None]:
    """Rewrite ``project``'s config with ``{group: {key: value | DROP}}``."""

    def apply(env: Env) -> None:
        path = env.root / project / "config.yaml"
        data = yaml.safe_load(path.read_text())
        for group, values in groups.items():
            target = data.setdefault(group, {})
            for key, value in values.items():
                if value is DROP:
                    target.pop(key, None)
                else:
                    target[key] = value
        path.write_text(yaml.safe_dump(data, sort_keys=False))

    return apply


def both(*setups: Callable[[Env], None]) -> Callable[[Env], None]:
    def apply(env: Env) -> None:
        for s in setups:
            s(env)

    return apply


def fm_sample(values: Callable[[np.ndarray], None], name: str = "001.bin") -> Callable[[Env], None]:
    def apply(env: Env) -> None:
        path = env.root / "fm" / "cal_feat" / name
        data = np.fromfile(path, np.float32)
        values(data)
        data.tofile(path)

    return apply


def img_file(name: str, content: bytes | Callable[[Env], None]) -> Callable[[Env], None]:
    def apply(env: Env) -> None:
        if callable(content):
            content(env)
        else:
            (env.root / "img" / "cal_data" / name).write_bytes(content)

    return apply


def float_images(value: float) -> Callable[[Env], None]:
    def apply(env: Env) -> None:
        folder = env.root / "img" / "cal_data"
        for p in folder.iterdir():
            np.full(3 * 16 * 16, value, np.float32).tofile(p)
        config(calibration_parameters={"cal_data_type": "float32"})(env)

    return apply


def truncated_npy(env: Env) -> None:
    folder = env.root / "fm" / "cal_feat"
    for p in list(folder.iterdir()):
        p.unlink()
    for i in range(2):
        np.save(folder / f"{i}.npy", np.zeros((1, 5, 12), np.float32))
    data = (folder / "1.npy").read_bytes()
    (folder / "1.npy").write_bytes(data[: len(data) - 40])


def cut_npy_header(env: Env) -> None:
    """The second sample cut inside its header (the magic and version alone)."""
    truncated_npy(env)
    (env.root / "fm" / "cal_feat" / "1.npy").write_bytes(b"\x93NUMPY\x01\x00")


def text_npy(folder: str) -> Callable[[Env], None]:
    """The first .npy under ``folder`` replaced by text: numpy's answer is to unpickle it, which we refuse."""

    def apply(env: Env) -> None:
        first = sorted((env.root / folder).rglob("*.npy"))[0]
        first.write_text("not an array\n")

    return apply


def broken_link(env: Env) -> None:
    (env.root / "img" / "cal_data" / "002.bin").symlink_to(env.root / "img" / "cal_data" / "gone.bin")


def corrupt_picture(env: Env) -> None:
    import skimage.io

    folder = env.root / "img" / "pictures"
    folder.mkdir()
    skimage.io.imsave(folder / "a.png", np.zeros((16, 16, 3), np.uint8), check_contrast=False)
    (folder / "b.png").write_bytes(b"\x89PNG\r\n\x1a\n not really a picture")
    config(calibration_parameters={"preprocess_on": True, "cal_data_dir": "pictures"})(env)


_HELD: list[int] = []


def lock_held(env: Env) -> None:
    """Another run holds working_dir: its flock and pid in the lock file."""
    fd = os.open(env.root / "img" / "model_output" / ".hbtools.lock", os.O_RDWR | os.O_CREAT, 0o644)
    os.write(fd, b"4242\n")
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    _HELD.append(fd)


def exit_op(env: Env) -> None:
    (env.root / "img" / "exit_op.py").write_text("import sys\nsys.exit(3)\n")
    path = env.root / "img" / "config.yaml"
    data = yaml.safe_load(path.read_text())
    data["custom_op"] = {"custom_op_method": "register", "op_register_files": "exit_op.py", "custom_op_dir": "."}
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def npy_file(name: str, values: np.ndarray) -> Callable[[Env], None]:
    def apply(env: Env) -> None:
        np.save(env.root / name, values)

    return apply


def nan_weight(env: Env) -> None:
    """The first convolution's weight with one NaN."""
    path = env.root / "img" / "model.onnx"
    model = onnx.load(path)
    conv = next(n for n in model.graph.node if n.op_type == "Conv")
    weight = next(t for t in model.graph.initializer if t.name == conv.input[1])
    values = numpy_helper.to_array(weight).copy()
    values.reshape(-1)[0] = np.nan
    weight.CopyFrom(numpy_helper.from_array(values, weight.name))
    onnx.save(model, path)


def empty_cal_copy(env: Env) -> None:
    (env.root / "emptycal").mkdir()


def copy_of(source: str, target: str) -> Callable[[Env], None]:
    def apply(env: Env) -> None:
        copy = shutil.copytree if (env.root / source).is_dir() else shutil.copyfile
        copy(env.root / source, env.root / target)

    return apply


def file_named(name: str) -> Callable[[Env], None]:
    def apply(env: Env) -> None:
        (env.root / name).parent.mkdir(parents=True, exist_ok=True)
        (env.root / name).write_text("in the way\n")

    return apply


def text_file(name: str, text: str) -> Callable[[Env], None]:
    def apply(env: Env) -> None:
        (env.root / name).parent.mkdir(parents=True, exist_ok=True)
        (env.root / name).write_text(text)

    return apply


# ---------------------------------------------------------------- the catalogue


@dataclass(frozen=True)
class Case:
    id: str
    cls: int
    tool: str
    args: str  # split at spaces after {placeholders} are filled
    code: int
    words: tuple[str, ...]
    setup: Callable[[Env], None] | None = None
    cwd: str | None = None  # None: the case folder


def C(id: str, cls: int, tool: str, args: str, code: int, *words: str, setup=None, cwd=None) -> Case:  # noqa: N802
    return Case(id, cls, tool, args, code, words, setup, cwd)


MK = "makertbin --config {cfg} --model-type onnx"
MKFM = "makertbin --config {fmcfg} --model-type onnx"
SENS = "get-sensitivity-of-nodes {calq} {cal}"
INFER = "infer -c {cfg} --model-file {q} --model-type onnx --image-file data {sample} --output-dir"
U, IN, S = EXIT_USAGE, EXIT_INPUT, EXIT_SYSTEM
LONG = "n" * 300


def _config_cases() -> list[Case]:
    ip, mp, cp, cc = "input_parameters", "model_parameters", "calibration_parameters", "compiler_parameters"
    rows = [
        # class 1: numbers that used to fail after the first artefact
        ("scale_nan", 1, {ip: {"scale_value": "nan"}}, "scale_value", "finite"),
        ("scale_nan_list", 1, {ip: {"scale_value": "0.1 nan 0.1"}}, "scale_value", "finite"),
        ("scale_inf", 1, {ip: {"scale_value": "inf"}}, "scale_value", "finite"),
        ("mean_inf", 1, {ip: {"mean_value": "inf"}}, "mean_value", "finite"),
        ("mean_minus_inf", 1, {ip: {"mean_value": "1 -inf 2"}}, "mean_value", "finite"),
        ("mean_nan", 1, {ip: {"mean_value": "nan"}}, "mean_value", "finite"),
        ("mean_float_inf", 1, {ip: {"mean_value": float("inf")}}, "mean_value", "finite"),
        # class 2: converts "successfully" into garbage
        ("scale_zero", 2, {ip: {"scale_value": "0"}}, "scale_value", "contains 0"),
        ("scale_zero_channel", 2, {ip: {"scale_value": "0.1 0 0.1"}}, "scale_value", "contains 0"),
        ("scale_zero_number", 2, {ip: {"scale_value": 0}}, "scale_value", "contains 0"),
        ("scale_zero_list", 2, {ip: {"scale_value": [0.0, 0.0, 0.0]}}, "scale_value", "contains 0"),
        # class 4: the prefix must stay inside working_dir
        ("prefix_slash", 4, {mp: {"output_model_file_prefix": "sub/model"}}, "output_model_file_prefix", "plain"),
        ("prefix_dotdot", 4, {mp: {"output_model_file_prefix": "../model"}}, "output_model_file_prefix", "plain"),
        ("prefix_only_dotdot", 4, {mp: {"output_model_file_prefix": ".."}}, "output_model_file_prefix", "plain"),
        ("prefix_absolute", 4, {mp: {"output_model_file_prefix": "/tmp/model"}}, "output_model_file_prefix",
         "plain"),
        ("prefix_nul", 4, {mp: {"output_model_file_prefix": "mod\0el"}}, "output_model_file_prefix", "NUL"),
        ("prefix_backslash", 4, {mp: {"output_model_file_prefix": "a\\b"}}, "output_model_file_prefix", "plain"),
        ("prefix_long", 4, {mp: {"output_model_file_prefix": "p" * 240}}, "output_model_file_prefix", "bytes"),
        # class 8: node names the model does not have
        ("node_info_unknown", 8, {mp: {"node_info": {"Conv_9": {"ON": "CPU"}}}}, "Conv_9", "closest"),
        ("run_on_cpu_unknown", 8, {cp: {"run_on_cpu": "Conv_7"}}, "Conv_7", "closest"),
        ("output_nodes_unknown", 8, {mp: {"output_nodes": "Conv_77"}}, "Conv_77", "closest", "Conv_"),
        # it is a tensor of the model, but no node computes it (hunt 38 D16)
        ("output_nodes_model_input", 8, {mp: {"output_nodes": "data"}}, "'data' is an input of the model"),
        ("run_on_bpu_unknown", 8, {cp: {"run_on_bpu": "Relu_9"}}, "Relu_9", "does not have"),
        ("node_info_typo", 8, {mp: {"node_info": {"conv_0": {"ON": "CPU"}}}}, "conv_0", "Conv_0"),
        ("node_info_input_type_unknown", 8, {mp: {"node_info": {"Softmax_9": {"InputType": "int16"}}}},
         "Softmax_9", "does not have"),
        # other config mistakes (SPEC §10)
        ("march_bad", 0, {mp: {"march": "bayes-x"}}, "march", "bayes-e"),
        ("cal_type_bad", 0, {cp: {"calibration_type": "best"}}, "calibration_type", "default"),
        ("compile_mode_bad", 0, {cc: {"compile_mode": "fast"}}, "compile_mode", "latency"),
        ("rt_type_bad", 0, {ip: {"input_type_rt": "rgbx"}}, "input_type_rt", "nv12"),
        ("shape_zero", 0, {ip: {"input_shape": "1x3x0x16"}}, "input_shape", "positive"),
        ("shape_text", 0, {ip: {"input_shape": "1x3xax16"}}, "input_shape", "integers"),
        ("percentile_big", 0, {cp: {"max_percentile": 2}}, "max_percentile", "(0, 1]"),
        ("optimization_bad", 0, {cp: {"optimization": "set_Softmax_input_int8,fast"}}, "optimization", "fast"),
        ("optimization_both", 0, {cp: {"optimization": "set_model_output_int8,set_model_output_int16"}},
         "optimization", "keep one"),
        ("model_missing", 0, {mp: {"onnx_model": "nowhere.onnx"}}, "nowhere.onnx", "does not exist"),
        ("cal_dir_missing", 0, {cp: {"cal_data_dir": "nowhere"}}, "nowhere", "does not exist"),
        ("mean_count", 0, {ip: {"mean_value": "1 2"}}, "mean_value", ""),
        ("scale_words", 0, {ip: {"scale_value": "one two"}}, "scale_value", "numbers"),
        ("bool_bad", 0, {mp: {"layer_out_dump": "perhaps"}}, "layer_out_dump", ""),
        ("debug_mode_bad", 0, {mp: {"debug_mode": "dump_everything"}}, "debug_mode", "dump_calibration_data"),
        ("opt_level_bad", 0, {cc: {"optimize_level": "O9"}}, "optimize_level", "O3"),
        ("balance_missing", 0, {cc: {"compile_mode": "balance"}}, "balance_factor", ""),
        ("workdir_is_file", 0, {mp: {"working_dir": "../afile"}}, "working_dir", "not a folder"),
        # the model's NCHW shape read as NHWC: the layout is named, not an odd height or 16 channels
        *[(f"layout_train_other_{rt}", 0, {ip: {"input_layout_train": "NHWC", "input_type_rt": rt,
                                                "input_shape": DROP}},
           "input_layout_train NHWC does not fit", "1x3x16x16", "set input_layout_train: NCHW")
          for rt in ("nv12", "rgb")],
    ]
    return [C(f"config_{name}", cls, "hb_mapper", MK, IN, *[w for w in words if w],
              setup=config(**groups)) for name, cls, groups, *words in rows]


CASES: list[Case] = [
    *_config_cases(),
    # class 1: data that failed after the first artefact, interrupted/concurrent runs
    C("fm_inf", 1, "hb_mapper", MKFM, IN, "001.bin", "NaN or infinite",
      setup=fm_sample(lambda d: d.__setitem__(3, np.inf))),
    # only -inf: an attention mask given as an input, which -1e4 masks the same (a case of ONNX's own tests)
    C("fm_minus_inf", 1, "hb_mapper", MKFM, IN, "001.bin", "infinite", "write -1e4 where it holds -inf",
      setup=fm_sample(lambda d: d.__setitem__(0, -np.inf))),
    C("fm_one_nan", 1, "hb_mapper", MKFM, IN, "001.bin", "NaN", setup=fm_sample(lambda d: d.__setitem__(5, np.nan))),
    C("fm_truncated_npy", 1, "hb_mapper", MKFM, IN, "1.npy", setup=truncated_npy),
    # the fix on its own line, as for the truncated one (hunt 38 D16 c)
    C("fm_npy_header_cut", 1, "hb_mapper", MKFM, IN, "write it again with numpy.save", setup=cut_npy_header),
    C("fm_truncated_raw", 1, "hb_mapper", MKFM, IN, "000.bin", "bytes",
      setup=lambda env: (env.root / "fm" / "cal_feat" / "000.bin").write_bytes(b"\0" * 100)),
    C("odd_nv12_size_from_model", 1, "hb_mapper", "makertbin --config {oddcfg} --model-type onnx", IN,
      "even height", "1x3x15x15"),
    C("img_corrupt_picture", 1, "hb_mapper", MK, IN, "b.png", setup=corrupt_picture),
    C("img_truncated_raw", 1, "hb_mapper", MK, IN, "001.bin", "bytes", setup=img_file("001.bin", b"\1" * 700)),
    C("working_dir_locked", 1, "hb_mapper", MK, S, "in use", "4242", setup=lock_held),
    # class 2: wrong data that used to convert
    C("fm_all_nan", 2, "hb_mapper", MKFM, IN, "NaN", setup=fm_sample(lambda d: d.fill(np.nan))),
    C("fm_all_nan_first", 2, "hb_mapper", MKFM, IN, "000.bin", setup=fm_sample(lambda d: d.fill(np.nan), "000.bin")),
    C("img_float_far_above", 2, "hb_mapper", MK, IN, "pixel range", setup=float_images(1000.0)),
    C("img_float_far_below", 2, "hb_mapper", MK, IN, "pixel range", setup=float_images(-500.0)),
    C("img_float_nan", 2, "hb_mapper", MK, IN, "NaN", setup=float_images(np.nan)),
    C("img_broken_symlink", 2, "hb_mapper", MK, IN, "002.bin", "broken symbolic link", setup=broken_link),
    # a NaN weight: every sample gave NaN, and a calibration type without a search wrote a model of NaN (hunt 38 D5)
    C("weight_nan_max", 2, "hb_mapper", MK, IN, "holds 1 NaN", "Conv node", setup=nan_weight),
    C("weight_nan_checker", 2, "hb_mapper", "checker --model-type onnx --march bayes-e --model {model}", IN,
      "holds 1 NaN", setup=nan_weight),
    # SPEC §10: no tool overwrites one of its own inputs; refused before any work, not found at the commit
    C("cal_data_in_the_dump", 0, "hb_mapper", MK, IN, "is an input of this run", "calibration_data",
      setup=both(copy_of("img/cal_data", "img/model_output/calibration_data/mine"),
                 config(calibration_parameters={"cal_data_dir": "model_output/calibration_data/mine"}))),
    C("model_at_artefact_path", 0, "hb_mapper", MK, IN, "is an input of this run", "small.html",
      setup=both(copy_of("img/model.onnx", "img/model_output/small.html"),
                 config(model_parameters={"onnx_model": "model_output/small.html"}))),
    # class 3: sizes
    C("huge_shape_makertbin", 3, "hb_mapper", MK, S, "memory", "input_shape",
      setup=config(input_parameters={"input_shape": "1x3x100000x100000"})),
    C("huge_shape_checker", 3, "hb_mapper", "checker --model-type onnx --march bayes-e --model {model} "
      "--input-shape data 1x3x100000x100000", S, "memory"),
    C("huge_shape_skip", 3, "hb_mapper", MK, S, "memory", setup=config(
        input_parameters={"input_shape": "1x3x60000x60000"}, calibration_parameters={"calibration_type": "skip"})),
    # class 5: file system problems
    C("workdir_parent_file", 5, "hb_mapper", MK, S, "afile", "Not a directory",
      setup=config(model_parameters={"working_dir": "../afile/out"})),
    C("workdir_too_long", 5, "hb_mapper", MK, S, "too long", setup=config(model_parameters={"working_dir": LONG})),
    C("workdir_no_permission", 5, "hb_mapper", MK, S, "/sys/hbtools_out",
      setup=config(model_parameters={"working_dir": "/sys/hbtools_out"})),
    *[C(f"log_unwritable_{tool}_{k}", 5, tool, args, S, "cannot write the log file", cwd="/sys") for k, (tool, args) in
      enumerate([("hb_mapper", MK), ("hb_mapper", "checker --model {model}"), ("hb_mapper", INFER + " {root}/o"),
                 ("hb_model_info", "{bin}"), ("hb_model_modifier", "{bin}"), ("hb_pack", "{bin} {fmbin} -o x.bin"),
                 ("hb_perf", "{bin}"), ("hb_verifier", "-m {q},{bin}"),
                 ("hb_model_verifier", "-q {q} -b {bin}"), ("hrt_model_exec", "model_info --model_file {bin}"),
                 ("hrt_model_exec", "infer --model_file {bin}"), ("hrt_model_exec", "perf --model_file {bin}"),
                 ("vec_diff", "{sample} {sample}"), ("hmct-debugger", SENS),
                 ("hb_eval_preprocess", "-m ppocr_cls -i {root} -o {root}/pre")])],
    C("custom_op_template_unwritable", 5, "hb_custom_op", "create", S, "Permission denied", cwd="/sys"),
    C("custom_op_template_missing_parent", 5, "hb_custom_op", "create -o {root}/nowhere/op.py", S, "nowhere"),
    # class 6: usage errors (exit 2 in every tool)
    *[C(f"usage_unknown_option_{tool}_{k}", 6, tool, args + " --bogus", U, "--bogus") for k, (tool, args) in
      enumerate([("hb_mapper", "makertbin"), ("hb_mapper", "checker"), ("hb_mapper", "infer"),
                 ("hb_model_info", "{bin}"), ("hb_model_modifier", "{bin}"), ("hb_pack", "{bin}"),
                 ("hb_perf", "{bin}"), ("hb_verifier", ""), ("hb_model_verifier", ""),
                 ("hrt_model_exec", "model_info"), ("hrt_model_exec", "infer"), ("hrt_model_exec", "perf"),
                 ("vec_diff", "a b"), ("hmct-debugger", SENS), ("hb_custom_op", "create"),
                 ("hb_eval_preprocess", "")])],
    *[C(f"usage_no_command_{tool}", 6, tool, "frobnicate", U, "frobnicate")
      for tool in ("hb_mapper", "hrt_model_exec", "hb_custom_op", "hmct-debugger")],
    *[C(f"usage_missing_{k}", 6, tool, args, U, word) for k, (tool, args, word) in enumerate([
        ("hb_model_info", "", "BIN_FILE"), ("hb_perf", "", "BIN_FILE"), ("hb_model_modifier", "", "MODEL_FILE"),
        ("vec_diff", "{sample}", "RIGHT"), ("hb_pack", "{bin} {fmbin}", "--output_name"),
        ("hb_verifier", "", "--model"), ("hb_model_verifier", "-q {q}", "--bin_model"),
        ("hrt_model_exec", "infer", "--model_file"), ("hrt_model_exec", "model_info", "--model_file"),
        ("hmct-debugger", "get-sensitivity-of-nodes {calq}", "CALIBRATION_DATA"),
        ("hmct-debugger", "plot-distribution {calq} {cal}", "-n"),
        ("hb_model_modifier", "{bin} -o", "-o"), ("hb_mapper", "makertbin --config", "--config"),
        ("hb_mapper", "infer --image-file data", "--image-file")])],
    *[C(f"usage_bad_value_{k}", 6, tool, args, U, word) for k, (tool, args, word) in enumerate([
        ("hb_mapper", MK.replace("onnx", "tflite"), "tflite"),
        ("hb_mapper", "checker --model-type keras", "keras"),
        ("hb_mapper", "infer --input-layout NCWH", "NCWH"),
        ("hrt_model_exec", "infer --model_file {bin} --frame_count 0", "frame_count"),
        ("hrt_model_exec", "infer --model_file {bin} --frame_count -3", "frame_count"),
        ("hrt_model_exec", "infer --model_file {bin} --frame_count many", "many"),
        ("hrt_model_exec", "perf --model_file {bin} --frame_count 0", "frame_count"),
        ("hrt_model_exec", "perf --model_file {bin} --thread_num 100000", "thread_num"),
        ("hrt_model_exec", "perf --model_file {bin} --thread_num 0", "thread_num"),
        ("hrt_model_exec", "perf --model_file {bin} --perf_time -1", "perf_time"),
        ("hrt_model_exec", "infer --model_file {bin} --core_id 7", "core_id"),
        ("hrt_model_exec", "infer --model_file {bin} --dump_format csv", "csv"),
        ("hrt_model_exec", "infer --model_file {bin} --enable_dump maybe", "maybe"),
        ("hb_verifier", "-m {q},{bin} -c 99", "99"),
        ("hb_verifier", "-m {q},{bin} -s perhaps", "perhaps"),
        ("hb_model_verifier", "-q {q} -b {bin} -d -1", "-1"),
        ("hmct-debugger", SENS + " -d many", "many"),
        ("hmct-debugger", SENS + " -v sometimes", "sometimes"),
        ("hmct-debugger", "plot-acc-error {calq} {cal} -a maybe -q ['Conv_0']", "maybe")])],
    # class 7: output paths, inputs overwritten, empty comparisons
    C("infer_outdir_is_file", 7, "hb_mapper", INFER + " {afile}", S, "--output-dir", "is a file"),
    # the file is an input of infer, not calibration data (hunt 38 D16 a)
    C("infer_nan_input", 2, "hb_mapper", "infer -c {fmcfg} --model-file "
      "{root}/fm/model_output/small_quantized_model.onnx --model-type onnx --image-file feat {root}/nan.npy "
      "--output-dir {root}/o", IN, "input file", "NaN",
      setup=npy_file("nan.npy", np.full((1, 5, 12), np.nan, np.float32))),
    C("infer_outdir_parent_file", 7, "hb_mapper", INFER + " {afile}/sub", S, "--output-dir"),
    C("infer_outdir_no_permission", 7, "hb_mapper", INFER + " /sys/hbtools_out", S, "--output-dir"),
    C("infer_outdir_too_long", 7, "hb_mapper", INFER + " {root}/" + LONG, S, "too long"),
    # the output folder is refused before the model or the picture is read (a missing picture would come first)
    C("infer_outdir_before_the_run", 7, "hb_mapper", INFER.replace("{sample}", "{root}/none.bin") + " {afile}", S,
      "--output-dir", "is a file"),
    C("hrt_dump_path_file", 7, "hrt_model_exec", "infer --model_file {bin} --enable_dump True --dump_path {afile}", S,
      "--dump_path", "is a file"),
    C("hrt_dump_path_parent_file", 7, "hrt_model_exec",
      "infer --model_file {bin} --enable_dump True --dump_path {afile}/d", S, "--dump_path"),
    C("hrt_dump_path_unmakeable", 7, "hrt_model_exec",
      "infer --model_file {bin} --enable_dump True --dump_path /proc/hbtools_dump", S, "--dump_path", "hbtools_dump"),
    C("hrt_profile_path_file", 7, "hrt_model_exec", "perf --model_file {bin} --frame_count 1 --profile_path {afile}",
      S, "afile"),
    C("hb_perf_result_is_file", 7, "hb_perf", "{bin}", S, "'hb_perf_result' is a file", "remove or rename that file",
      setup=file_named("hb_perf_result"), cwd="{root}"),
    C("hb_perf_model_folder_is_file", 7, "hb_perf", "{bin}", S, "'hb_perf_result/small' is a file",
      "remove or rename that file", setup=file_named("hb_perf_result/small"), cwd="{root}"),
    C("hb_perf_result_dangling_link", 7, "hb_perf", "{bin}", S, "cannot create the hb_perf result folder "
      "'hb_perf_result/small'", "symbolic link", setup=lambda env: (env.root / "hb_perf_result").symlink_to("gone"),
      cwd="{root}"),
    C("vec_diff_out_missing_parent", 7, "vec_diff", "{sample} {sample} -o {root}/nowhere/x.csv", S, "nowhere"),
    C("vec_diff_out_parent_file", 7, "vec_diff", "{sample} {sample} -o {afile}/x.csv", S, "afile"),
    C("vec_diff_out_is_folder", 7, "vec_diff", "{sample} {sample} -o {root}", S, "is a folder"),
    C("vec_diff_out_too_long", 7, "vec_diff", "{sample} {sample} -o {root}/" + LONG, S, "too long"),
    C("vec_diff_out_no_permission", 7, "vec_diff", "{sample} {sample} -o /sys/x.csv", S, "no permission"),
    C("vec_diff_out_is_left", 7, "vec_diff", "{root}/left/x.bin {root}/left/x.bin -o {root}/left/x.bin", U,
      "also an input"),
    C("vec_diff_out_is_right", 7, "vec_diff", "{sample} {afile} -o {afile}", U, "also an input"),
    C("vec_diff_empty_files", 7, "vec_diff", "{root}/empty_a.bin {root}/empty_b.bin -o {root}/v.csv", IN,
      "hold no values"),
    C("vec_diff_all_skipped", 7, "vec_diff", "{root}/left {root}/right -o {root}/v.csv", IN, "no file pair"),
    C("hb_pack_out_is_input", 7, "hb_pack", "{bin} {fmbin} -o {bin}", U, "also an input"),
    C("hb_pack_out_is_second_input", 7, "hb_pack", "{bin} {fmbin} -o {fmbin}", U, "also an input"),
    C("hb_pack_out_parent_missing", 7, "hb_pack", "{bin} {fmbin} -o {root}/nowhere/p.bin", S, "nowhere"),
    C("modifier_out_is_input", 7, "hb_model_modifier", "{bin} -a Dequantize -o {bin}", U, "also an input"),
    C("modifier_out_parent_missing", 7, "hb_model_modifier", "{bin} -a Dequantize -o {root}/nowhere/m.bin", S,
      "nowhere"),
    C("debugger_save_dir_file", 7, "hmct-debugger", "plot-acc-error {calq} {cal} -q ['Conv_0'] -s {afile}", S,
      "save_dir", "is a file"),
    C("debugger_save_dir_parent_file", 7, "hmct-debugger", "plot-distribution {calq} {cal} -n ['Conv_0'] "
      "-s {afile}/plots", S, "save_dir"),
    C("debugger_refused_leaves_no_folder", 7, "hmct-debugger", "plot-acc-error {calq} {cal} -s {root}/new_plots", IN,
      "quantize_node"),
    C("debugger_text_npy", 0, "hmct-debugger", SENS, IN, "not a valid .npy file", "pickled object data is refused",
      "dump the calibration data again", setup=text_npy("img/model_output/calibration_data")),
    *[C(f"{tool}_text_npy", 0, tool, args, IN, "x.npy", "not a valid .npy file", "pickled object data is refused",
        setup=text_file("x.npy", "not an array\n")) for tool, args in
      [("hrt_model_exec", "infer --model_file {fmbin} --input_file {root}/x.npy"),
       ("vec_diff", "{root}/x.npy {root}/x.npy -o {root}/v.csv")]],
    C("debugger_empty_data", 7, "hmct-debugger", "get-sensitivity-of-nodes {calq} {root}/emptycal", IN,
      "emptycal", setup=empty_cal_copy),
    # class 8: names that match nothing
    C("modifier_all_conv", 8, "hb_model_modifier", "{bin} -a Conv", IN, "-a Conv", "deletable"),
    C("modifier_all_typo", 8, "hb_model_modifier", "{bin} -a Dequantise", IN, "Dequantise", "closest: 'Dequantize'"),
    C("modifier_all_not_a_deletable_type", 8, "hb_model_modifier", "{bin} -a Foo", IN, "-a Foo", "does not delete Foo",
      "Quantize, Transpose, Cast, Reshape", "Softmax"),
    C("modifier_remove_unknown", 8, "hb_model_modifier", "{bin} -r Conv_99", IN, "Conv_99"),
    C("debugger_unknown_node", 8, "hmct-debugger", SENS + " -i ['Conv_9']", IN, "Conv_9"),
    C("hrt_unknown_model_name", 8, "hrt_model_exec", "infer --model_file {bin} --model_name other", IN, "other"),
    # class 10: custom-op files that exit
    C("custom_op_sys_exit", 10, "hb_mapper", MK, IN, "exit_op.py", "sys.exit", setup=exit_op),
    # damaged inputs of the .bin tools
    *[C(f"bin_{tool}_{args.split()[0]}_{kind}", 0, tool, args.replace("{bin}", "{root}/" + kind), IN, kind,
        setup=text_file(kind, text)) for tool, args in
      [("hb_model_info", "{bin}"), ("hb_perf", "{bin}"), ("hb_model_modifier", "{bin}"),
       ("hrt_model_exec", "model_info --model_file {bin}"), ("hrt_model_exec", "infer --model_file {bin}")]
      for kind, text in (("text.bin", "not a model\n"), ("empty.bin", ""))],
    C("hrt_input_file_wrong_size", 0, "hrt_model_exec", "infer --model_file {bin} --input_file {afile}", IN, "afile"),
    # a folder where a file is needed: the machine's refusal (exit 3), saying it is a folder
    *[C(f"folder_for_file_{tool}_{k}", 0, tool, args, S, "is a folder") for k, (tool, args) in enumerate(
        [("hb_model_info", "{root}"), ("hb_perf", "{root}"), ("hrt_model_exec", "model_info --model_file {root}"),
         ("hrt_model_exec", "infer --model_file {bin} --input_file {root}"),
         ("hb_verifier", "-m {q},{bin} -i {root}")])],
    # an artefact of the run other than the quantized model: named as such, not "inputs differ"
    C("hb_verifier_calibrated_for_quantized", 1, "hb_verifier", "-m {calq},{bin}", IN, "calibrated model",
      "not the quantized model"),
    C("hb_verifier_float_for_quantized", 1, "hb_verifier", "-m {model},{bin}", IN, "float model",
      "not the quantized model"),
    C("hb_verifier_two_bins", 6, "hb_verifier", "-m {bin},{bin}", U, "--model"),
    C("infer_missing_image", 0, "hb_mapper", "infer -c {cfg} --model-file {q} --model-type onnx --image-file data "
      "{root}/none.bin --output-dir {root}/o", IN, "none.bin"),
    C("checker_missing_model", 0, "hb_mapper", "checker --model {root}/none.onnx", IN, "none.onnx"),
    # the last one won silently (hunt 38 D15)
    C("checker_input_shape_twice", 7, "hb_mapper", "checker --model-type onnx --march bayes-e --model {model} "
      "--input-shape data 1x3x16x16 --input-shape data 1x3x32x32", IN, "'data' twice", "1x3x16x16 and 1x3x32x32"),
    # a commit record damaged from outside stopped every later run in the folder with an internal error (hunt 38 D8)
    C("damaged_commit_record", 5, "hb_mapper", MK, IN, "commit record", "is damaged",
      setup=text_file("img/model_output/.hbtools_staging/.committed", "")),
    C("commit_record_leaving_the_folder", 5, "hb_mapper", MK, IN, "commit record", "other than files",
      setup=text_file("img/model_output/.hbtools_staging/.committed", '["../../elsewhere"]')),
    # makertbin's own artefacts given back: 'computes nothing at run time', 'use featuremap' (hunt 38 D6)
    C("checker_calibrated_artefact", 1, "hb_mapper", "checker --model-type onnx --march bayes-e --model {calq}", IN,
      "is a calibrated model", "that makertbin wrote"),
    C("checker_quantized_artefact", 1, "hb_mapper", "checker --model-type onnx --march bayes-e --model {q}", IN,
      "is a quantized model"),
    C("makertbin_calibrated_artefact", 1, "hb_mapper", MK, IN, "is a calibrated model", setup=both(
        copy_of("img/model_output/small_calibrated_model.onnx", "img/mine.onnx"),
        config(model_parameters={"onnx_model": "mine.onnx"}))),
    C("eval_preprocess_bad_model", 0, "hb_eval_preprocess", "-m resnet999 -i {root} -o {root}/pre", IN, "resnet999"),
]


@pytest.fixture
def env(base: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Env:
    root = tmp_path / "case"
    shutil.copytree(base, root, symlinks=True)
    monkeypatch.chdir(root)
    yield Env(root)
    while _HELD:
        os.close(_HELD.pop())


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input(case: Case, env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    if case.setup:
        case.setup(env)
    before = snapshot(env.root)
    paths = env.paths()
    args = [a.format(**paths) for a in case.args.split()]
    if case.cwd:
        monkeypatch.chdir(case.cwd.format(**paths))
    code, output = run_tool(case.tool, args)
    assert "Traceback" not in output and "internal error" not in output, output
    assert code == case.code, output
    assert not WORK_DONE.search(output), "the work ran before the refusal: " + output
    problems = problem_lines(output)
    assert len(problems) in (1, 2), output  # the problem (and how to fix it, when on its own line)
    naming = [line for line in problems if all(w in line for w in case.words)]
    assert len(naming) == 1, (case.words, output)
    after = snapshot(env.root)
    assert after == before, "a failed run changed or added files: " + ", ".join(
        sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k)))


def test_catalogue_covers_every_class() -> None:
    assert len(CASES) >= 150
    assert {c.cls for c in CASES} >= {0, 1, 2, 3, 4, 5, 6, 7, 8, 10}
    assert len({c.id for c in CASES}) == len(CASES)


def test_comma_separated_optimization_converts(base: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Class 11: D-Robotics' reference YOLO config writes two optimizations with a comma."""
    root = tmp_path / "case"
    shutil.copytree(base, root, symlinks=True)
    monkeypatch.chdir(root)
    config(calibration_parameters={"optimization": "set_Softmax_input_int8,set_Softmax_output_int8"})(Env(root))
    code, output = run_tool("hb_mapper", MK.format(cfg=root / "img" / "config.yaml").split())
    assert code == 0 and "Convert to runtime bin file successfully!" in output, output
    snapshot_text = yaml.safe_load(root.joinpath("img", "config.yaml").read_text())
    assert snapshot_text["calibration_parameters"]["optimization"].count(",") == 1
    onnx.checker.check_model(str(root / "img" / "model_output" / "small_quantized_model.onnx"))


# ---------------------------------------------------------------- class 9: the Python API


def _api_cases() -> list[tuple[str, Callable[[Env], Any], tuple[str, ...]]]:
    from hbtools.debug import get_sensitivity_of_nodes
    from hbtools.runtime.session import HB_ONNXRuntime

    def sess(env: Env) -> HB_ONNXRuntime:
        return HB_ONNXRuntime(model_file=env.paths()["q"])

    def feed(dtype: Any = np.uint8, shape: tuple[int, ...] = (1, 3, 16, 16)) -> dict[str, np.ndarray]:
        return {"data": np.zeros(shape, dtype)}

    return [
        ("wrong_shape", lambda e: sess(e).run(None, feed(shape=(1, 3, 8, 8))), ("'data'", "1x3x8x8", "expects")),
        ("wrong_rank", lambda e: sess(e).run(None, feed(shape=(3, 16, 16))), ("'data'", "3x16x16")),
        ("wrong_dtype", lambda e: sess(e).run(None, feed(np.float64)), ("'data'", "float64")),
        ("wrong_output", lambda e: sess(e).run(["Softmax_9_out"], feed()), ("Softmax_9_out", "closest")),
        ("unknown_input", lambda e: sess(e).run(None, {"image": np.zeros((1, 3, 16, 16), np.uint8)}), ("image",)),
        ("offset_out_of_range", lambda e: sess(e).run(None, feed(), input_offset=1000), ("input_offset", "1000")),
        ("offset_negative", lambda e: sess(e).run(None, {"data": np.full((1, 3, 16, 16), 200, np.uint8)},
                                                  input_offset=-100), ("input_offset", "-100")),
        # raw Python exceptions before (hunt 38 D13)
        ("model_bytes_garbage", lambda e: HB_ONNXRuntime(b"garbage"), ("7 bytes", "not a readable ONNX model")),
        ("model_file_number", lambda e: HB_ONNXRuntime(model_file=5), ("model_file", "not int")),
        ("output_name_number", lambda e: sess(e).run([0], feed()), ("output_names takes tensor names", "[0]")),
        ("ragged_feed", lambda e: sess(e).run(None, {"data": [[1, 2], [3]]}), ("'data'", "not an array")),
        ("debugger_empty_dataset", lambda e: get_sensitivity_of_nodes(
            model_or_file=e.paths()["calq"], calibrated_data={"data": []}), ("no samples",)),
        ("debugger_empty_list", lambda e: get_sensitivity_of_nodes(
            model_or_file=e.paths()["calq"], calibrated_data=[]), ("no samples",)),
    ]


API_CASES = _api_cases()


@pytest.mark.parametrize("name, call, words", API_CASES, ids=[c[0] for c in API_CASES])
def test_api_bad_input(name: str, call: Callable[[Env], Any], words: tuple[str, ...], env: Env) -> None:
    from hbtools.errors import HbError

    expected = HbError if name.startswith(("debugger", "model_")) else ValueError  # FeedError: a ValueError
    with pytest.raises(expected) as info:
        call(env)
    message = str(info.value)
    assert "\n" not in message and all(w in message for w in words), message


# ---------------------------------------------------------------- class 1: interrupted and concurrent runs


def _artefacts(env: Env) -> dict[str, str]:
    return {k: v for k, v in snapshot(env.root / "img" / "model_output").items() if not k.startswith(".")}


def test_ctrl_c_during_calibration_keeps_the_previous_set(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    from hbtools.pipeline import calibrate

    before = _artefacts(env)

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(calibrate, "run", interrupted)  # Ctrl-C after two artefacts and the data dump
    code, output = run_tool("hb_mapper", MK.format(**env.paths()).split())
    assert code == 130 and "interrupted" in output, output
    assert _artefacts(env) == before
    assert not (env.root / "img" / "model_output" / ".hbtools_staging").exists()


def test_sigkill_leaves_the_previous_set_and_the_next_run_cleans_up(env: Env) -> None:
    import signal
    import subprocess
    import sys
    import time

    before = _artefacts(env)
    staging = env.root / "img" / "model_output" / ".hbtools_staging"
    proc = subprocess.Popen([sys.executable, "-c", "from hbtools.cli.hb_mapper import main; main()",
                             *MK.format(**env.paths()).split()],
                            cwd=env.root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not any(staging.glob("*.onnx")) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run ended before it could be killed"
    assert staging.exists() and _artefacts(env) == before
    code, output = run_tool("hb_mapper", MK.format(**env.paths()).split())
    assert code == 0, output
    assert not staging.exists() and "removing the staging folder" in output
    assert set(_artefacts(env)) == set(before)


def test_stale_lock_of_a_dead_run_is_taken_over(env: Env) -> None:
    lock = env.root / "img" / "model_output" / ".hbtools.lock"
    lock.write_text("999999\n")  # the pid of a run that is gone (no flock held)
    code, output = run_tool("hb_mapper", MK.format(**env.paths()).split())
    assert code == 0, output
    assert lock.read_text() == ""  # released


# ---------------------------------------------------------------- property: any mutation converts or fails cleanly

_KEYS = [("model_parameters", k) for k in ("march", "output_model_file_prefix", "working_dir", "layer_out_dump",
                                            "node_info", "debug_mode", "remove_node_type")] + \
        [("input_parameters", k) for k in ("input_type_rt", "input_type_train", "input_layout_train", "input_shape",
                                            "norm_type", "mean_value", "scale_value", "input_batch")] + \
        [("calibration_parameters", k) for k in ("calibration_type", "max_percentile", "per_channel",
                                                  "optimization", "run_on_cpu", "cal_data_type")] + \
        [("compiler_parameters", k) for k in ("compile_mode", "optimize_level", "balance_factor", "core_num")]
_VALUES = st.one_of(
    st.sampled_from(["", "0", "-1", "nan", "inf", "-inf", "1e400", "None", "x", "../x", "/tmp/x", "a/b", "\0",
                     "NCHW", "nv12", "rgb", "featuremap", "1x3x16x16", "1x3x0x16", "1x3x17x16", "0 0 0", "1;2",
                     "set_Softmax_input_int8,set_Softmax_output_int8", "max", "skip", "kl", "O0", "O3",
                     "Conv_0", "Conv_99", "dump_calibration_data", "bayes", "nash-m", "True", "false"]),
    st.integers(-3, 300), st.floats(allow_nan=True, allow_infinity=True), st.none(),
    st.lists(st.sampled_from([0, 1, 0.5, "a", float("nan")]), max_size=4),
)
_DATA_EDITS = st.sampled_from(["none", "truncate", "nan", "inf", "extra_byte", "empty", "delete_all", "broken_link",
                               "subfolder", "hidden"])


def _edit_data(folder: Path, edit: str) -> None:
    files = sorted(folder.iterdir())
    if edit == "truncate":
        files[0].write_bytes(files[0].read_bytes()[:100])
    elif edit in ("nan", "inf"):
        data = np.fromfile(files[0], np.uint8).astype(np.float32)
        data[7] = np.nan if edit == "nan" else np.inf
        data.tofile(files[0])  # also the wrong size for uint8 files
    elif edit == "extra_byte":
        files[-1].write_bytes(files[-1].read_bytes() + b"\0")
    elif edit == "empty":
        files[0].write_bytes(b"")
    elif edit == "delete_all":
        for f in files:
            f.unlink()
    elif edit == "broken_link":
        (folder / "zz.bin").symlink_to(folder / "missing.bin")
    elif edit == "subfolder":
        (folder / "sub").mkdir()
    elif edit == "hidden":
        (folder / ".DS_Store").write_bytes(b"\1\2")


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(mutations=st.lists(st.tuples(st.sampled_from(_KEYS), _VALUES), min_size=1, max_size=3), edit=_DATA_EDITS)
def test_mutations_convert_or_fail_cleanly(base: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           mutations: list[tuple[tuple[str, str], Any]], edit: str) -> None:
    root = tmp_path / f"m{len(list(tmp_path.iterdir()))}"
    shutil.copytree(base, root, symlinks=True)
    monkeypatch.chdir(root)
    env = Env(root)
    groups: dict[str, dict[str, Any]] = {}
    for (group, key), value in mutations:
        groups.setdefault(group, {})[key] = value
    config(**groups)(env)
    _edit_data(root / "img" / "cal_data", edit)
    before = snapshot(root / "img" / "model_output")
    code, output = run_tool("hb_mapper", MK.format(**env.paths()).split())
    assert "Traceback" not in output and "internal error" not in output, output
    assert code in (0, EXIT_INPUT, EXIT_USAGE, EXIT_SYSTEM), output
    if code:
        assert len(problem_lines(output)) in (1, 2), output
        assert snapshot(root / "img" / "model_output") == before, output
    else:
        assert "Convert to runtime bin file successfully!" in output
        assert not any(p.name == ".hbtools_staging" for p in root.rglob(".hbtools_staging"))


def test_ctrl_c_during_the_final_moves_completes_them_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    import logging
    import signal

    from hbtools.runs import transaction

    (tmp_path / "a.onnx").write_text("old a")
    (tmp_path / "b.bin").write_text("old b")
    commit = transaction._commit

    def interrupted_commit(staging: Path, *args: object) -> None:
        # Ctrl-C right at the commit point, delivered to this thread now (os.kill lets the kernel
        # pick a thread, and onnxruntime's may take it late)
        signal.raise_signal(signal.SIGINT)
        commit(staging, *args)

    monkeypatch.setattr(transaction, "_commit", interrupted_commit)
    # As in a terminal: a suite started in the background inherits SIGINT ignored, and then
    # Ctrl-C rightly does nothing.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    logging.getLogger("hbtools").addHandler(caplog.handler)  # a tool's setup stops propagation
    try:
        with pytest.raises(KeyboardInterrupt):
            with transaction.artefact_transaction(tmp_path) as staging:
                (staging / "a.onnx").write_text("new a")
                (staging / "b.bin").write_text("new b")
    finally:
        signal.signal(signal.SIGINT, previous)
        logging.getLogger("hbtools").removeHandler(caplog.handler)
    assert (tmp_path / "a.onnx").read_text() == "new a" and (tmp_path / "b.bin").read_text() == "new b"
    assert not (tmp_path / transaction.STAGING_NAME).exists()
    # the user is told the new set is in place, not left to read "interrupted" as "nothing changed"
    assert "complete new set" in caplog.text, caplog.text


@pytest.mark.parametrize("tool", ["hb_mapper", "hrt_model_exec", "hb_custom_op", "hmct-debugger"])
def test_a_bare_command_group_prints_its_help(tool: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    code, output = run_tool(tool, [])
    assert code == 0 and "Usage:" in output and "ERROR" not in output, output


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full, a device that is always full")
def test_a_full_disk_names_working_dir_and_keeps_the_previous_set(tmp_path: Path) -> None:
    from hbtools.errors import ResourceError
    from hbtools.runs import transaction

    (tmp_path / "small.bin").write_text("old")
    with pytest.raises(ResourceError) as info:
        with transaction.artefact_transaction(tmp_path) as staging:
            (staging / "small.bin").write_text("new")
            with open("/dev/full", "wb") as full:  # write() on a full disk names no file
                full.write(b"x" * 10)
    message = str(info.value)
    assert f"working_dir '{tmp_path}'" in message and "room for both" in message, message
    assert (tmp_path / "small.bin").read_text() == "old"
    assert not (tmp_path / transaction.STAGING_NAME).exists()


def test_a_dangling_symlink_on_an_output_path_is_named(tmp_path: Path) -> None:
    from hbtools.errors import ResourceError
    from hbtools.outputs import output_dir
    from hbtools.runs import transaction

    (tmp_path / "lnk").symlink_to(tmp_path / "gone")
    for make in (lambda: transaction.artefact_transaction(tmp_path / "lnk" / "out").__enter__(),
                 lambda: output_dir(tmp_path / "lnk", "--output")):
        with pytest.raises(ResourceError) as info:
            make()
        assert "symbolic link" in str(info.value) and "gone" in str(info.value), info.value
    assert not (tmp_path / "gone").exists()


def test_sigterm_during_makertbin_keeps_the_previous_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import signal

    from builders import resnet_like

    from hbtools.pipeline import runner

    project = make_project(tmp_path / "p", resnet_like(8))
    monkeypatch.chdir(project.root)
    assert run_tool("hb_mapper", MK.format(cfg=project.config_path).split())[0] == 0
    before = snapshot(project.working_dir)
    saved = []

    def save_then_terminated(model: onnx.ModelProto, path: Path) -> None:
        runner_save(model, path)
        saved.append(path)
        if len(saved) == 2:  # kill, timeout or a stopped container, halfway through the set
            signal.raise_signal(signal.SIGTERM)

    runner_save = runner.save_model
    monkeypatch.setattr(runner, "save_model", save_then_terminated)
    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        code, output = run_tool("hb_mapper", MK.format(cfg=project.config_path).split())
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert code == 143 and "terminated" in output and "Traceback" not in output, output
    assert len(saved) == 2
    assert snapshot(project.working_dir) == before  # no staging folder, the old set byte-identical


@pytest.mark.parametrize("unreadable", ["model.onnx", "cal_data/003.bin", "model_output"])
def test_an_unreadable_input_says_no_permission(tmp_path: Path, unreadable: str) -> None:
    import subprocess
    import sys

    from builders import resnet_like

    # root reads anything: drop the capabilities that let it, as a normal user would run
    prefix = []
    if os.geteuid() == 0:
        if shutil.which("capsh") is None:
            pytest.skip("running as root without capsh: cannot make a file unreadable")
        prefix = ["capsh", "--drop=cap_dac_override,cap_dac_read_search", "--", "-c", 'exec "$@"', "--"]
    project = make_project(tmp_path / "p", resnet_like(8))
    (project.root / "model_output").mkdir()
    (project.root / "model_output" / ".hbtools.lock").touch()  # as a previous run leaves it
    (project.root / unreadable).chmod(0o555 if unreadable == "model_output" else 0)  # working_dir: read-only
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    script = "import sys; from hbtools.cli.hb_mapper import main; sys.argv[0] = 'hb_mapper'; main()"
    result = subprocess.run([*prefix, sys.executable, "-c", script, *MK.format(cfg=project.config_path).split()],
                            cwd=project.root, env=env, capture_output=True, text=True)
    output = result.stdout + result.stderr
    assert result.returncode == EXIT_SYSTEM, output
    lines = problem_lines(output)
    assert len(lines) == 1 and unreadable.split("/")[-1] in lines[0] and "permission" in lines[0].lower(), output
    assert "rewrite" not in lines[0] and "staging" not in lines[0], output  # no internal names either
    assert [p.name for p in project.working_dir.iterdir()] == [".hbtools.lock"]


_WRITERS = {
    "bin": 'from hbtools.tools.hrt_exec import dump_output as d; d(out, 0, "out", values, "bin", 0)',
    "txt": 'from hbtools.tools.hrt_exec import dump_output as d; d(out, 0, "out", values, "txt", 0)',
    "npy": 'from hbtools.tools.hrt_exec import dump_output as d; d(out, 0, "out", values, "npy", 0)',
    "csv": "from hbtools.tools.vec_diff import Row, write_csv; "
           "write_csv([Row('a', 'b', *values[:4].tolist())] * 3, out / 'out.csv')",
}


@pytest.mark.parametrize("fmt", list(_WRITERS))
def test_a_dump_on_a_full_disk_fails_loudly_and_leaves_no_partial_file(tmp_path: Path, fmt: str) -> None:
    import subprocess
    import sys

    # A file-size limit makes every write past 64 bytes fail, as a full disk does; numpy's
    # tofile used to drop that error for small arrays and report success over a cut file.
    script = f"""
import resource, signal, sys
from pathlib import Path
import numpy as np
from hbtools.errors import HbError
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (64, 64))
out, values = Path(sys.argv[1]), np.arange(100, dtype=np.float32)
try:
    {_WRITERS[fmt]}
except HbError as exc:
    print("ERROR", exc)
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    result = subprocess.run([sys.executable, "-c", script, str(tmp_path)], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ERROR cannot write") and f"out.{fmt}" in result.stdout, result.stdout
    assert list(tmp_path.iterdir()) == [], list(tmp_path.iterdir())


def test_sigterm_reported_as_terminated_after_click_turned_it_into_abort() -> None:
    import click

    from hbtools.cli.common import describe
    from hbtools.errors import Terminated

    # click's main(standalone_mode=False) re-raises KeyboardInterrupt as Abort, and hmct-debugger
    # turns Abort back into KeyboardInterrupt: SIGTERM must still read as SIGTERM (exit 143).
    try:
        try:
            try:
                raise Terminated()
            except KeyboardInterrupt:
                raise click.exceptions.Abort() from None
        except click.exceptions.Abort as abort:
            raise KeyboardInterrupt from abort
    except KeyboardInterrupt as exc:
        code, lines = describe(exc)
    assert code == 143 and lines == ["terminated (SIGTERM)"]
    assert describe(KeyboardInterrupt())[0] == 130
    # onnxruntime interrupted while it loads raises ImportError('initialization failed') from the Ctrl-C
    try:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as interrupt:
            raise ImportError("initialization failed") from interrupt
    except ImportError as exc:
        assert describe(exc) == (130, ["interrupted"])
    try:
        try:
            raise Terminated()
        except KeyboardInterrupt:
            raise ImportError("initialization failed")  # noqa: B904 - as the extension raises it
    except ImportError as exc:
        assert describe(exc) == (143, ["terminated (SIGTERM)"])


def test_a_second_run_in_the_same_folder_does_not_cut_the_first_runs_log(tmp_path: Path) -> None:
    from hbtools.log import setup

    log_file = tmp_path / "hb_mapper_makertbin.log"
    with open(log_file, "a", encoding="utf-8") as first:  # a run still going, holding its log
        fcntl.flock(first.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        first.write("first run: Start Model Convert....\n")
        first.flush()
        with logger_restored():
            setup(log_file).error("working_dir is in use by another makertbin run")
        first.write("first run: Convert to runtime bin file successfully!\n")
    text = log_file.read_text()
    assert text.startswith("first run: Start Model Convert") and "in use by another" in text, text
    assert "successfully" in text, text
    with logger_restored():  # alone again: the next run starts a fresh log, as the seed does
        setup(log_file).info("next run")
    assert log_file.read_text().count("\n") == 1


@pytest.mark.parametrize("given, says", [("folder", "is a folder"), ("/dev/null", "not a regular file"),
                                         ("missing.onnx", "does not exist")])
def test_a_model_path_that_is_no_file_says_what_it_is(tmp_path: Path, given: str, says: str) -> None:
    from hbtools.errors import HbError
    from hbtools.graph.model_io import load_model

    (tmp_path / "folder").mkdir()
    with pytest.raises(HbError) as info:
        load_model(tmp_path / given)
    assert says in str(info.value), info.value
