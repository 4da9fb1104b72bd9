"""hrt_model_exec: the board tool's infer / perf / model_info, on the x86 simulator."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import click

from hbtools import __version__
from hbtools.cli.common import ToolGroup, reports_errors
from hbtools.errors import HbError
from hbtools.log import setup
from hbtools.outputs import output_dir

DEFAULT_FRAMES = 200  # the board tool's --frame_count
UNASKED_BUDGET_S = 20.0  # seconds of simulator frames when --frame_count is not given

if TYPE_CHECKING:
    import numpy as np

    from hbtools.runtime.simulator import Simulator

log = logging.getLogger("hbtools")


def _model_options(fn: Callable) -> Callable:
    fn = click.option("--core_id", type=click.IntRange(0, 2), default=0, show_default=True,
                      help="Core to run on (0 = any); recorded only, the simulator has no cores.")(fn)
    fn = click.option("--model_name", default="", help="Model in a packed file (may be omitted for one model).")(fn)
    return click.option("--model_file", required=True, type=click.Path(), help="The .bin model.")(fn)


def _input_option(fn: Callable) -> Callable:
    return click.option("--input_file", default="",
                        help="Input files, comma separated, one per model input (image, .npy or raw binary); "
                             "random data when omitted.")(fn)


@click.group(cls=ToolGroup, log_file='hrt_model_exec.log', context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="hrt_model_exec")
def main() -> None:
    """Run a .bin model on the hbtools x86 simulator (board tool interface)."""


@main.command("model_info")
@_model_options
def model_info(model_file: str, model_name: str, core_id: int) -> None:
    """Print the inputs and outputs of the model(s)."""
    setup("hrt_model_exec.log")
    _model_info(model_file, model_name or None)


@reports_errors("model_info")
def _model_info(model_file: str, model_name: str | None) -> None:
    from hbtools.runtime.binfile import read_bin
    from hbtools.tools.hrt_exec import model_info as lines

    click.echo("\n".join(lines(read_bin(model_file), model_name)))


@main.command("infer")
@_model_options
@_input_option
@click.option("--frame_count", type=click.IntRange(min=1), default=1, show_default=True, help="Frames to run.")
@click.option("--enable_dump", type=click.BOOL, default=False, show_default=True, help="Write the outputs to files.")
@click.option("--dump_format", type=click.Choice(["bin", "txt", "npy"]), default="bin", show_default=True)
@click.option("--dump_txt_axis", type=int, default=-1, show_default=True,
              help="txt dumps: one line per index of the axes before this one.")
@click.option("--dump_path", default=".", show_default=True, help="Folder for dumped outputs.")
@click.option("--enable_cls_post_process", type=click.BOOL, default=False, show_default=True,
              help="Print the top-5 classes of the first output.")
def infer(model_file: str, model_name: str, core_id: int, input_file: str, frame_count: int, enable_dump: bool,
          dump_format: str, dump_txt_axis: int, dump_path: str, enable_cls_post_process: bool) -> None:
    """Run the model and report (or dump) its outputs."""
    del core_id
    setup("hrt_model_exec.log")
    _infer(model_file, model_name or None, input_file, frame_count, enable_dump, dump_format, dump_txt_axis,
           dump_path, enable_cls_post_process)


@reports_errors("infer")
def _infer(model_file: str, model_name: str | None, input_file: str, frame_count: int, enable_dump: bool,
           dump_format: str, dump_txt_axis: int, dump_path: str, cls_post: bool) -> None:

    from hbtools.runtime.simulator import Simulator
    from hbtools.tools.hrt_exec import dump_layers, dump_output, top_classes, write_layers

    if enable_dump:  # refused before the run, not after it printed success (made when the first dump is written)
        output_dir(dump_path, "--dump_path", create=False)
    sim, feeds = _simulator(model_file, model_name, input_file)
    layers = dump_layers(sim.model) if enable_dump else []
    if layers:  # keep the intermediate tensors the model recorded as dumpable layers
        sim = Simulator(sim.model, expose_all=True)
    prepared = sim.prepare(feeds)
    for _ in range(frame_count):
        values = sim.run_all(prepared, prepared=True)
    outputs = {o.name: values[o.name] for o in sim.model.outputs}
    log.info("infer success")
    for k, (name, value) in enumerate(outputs.items()):
        click.echo(f"output[{k}] {name}: shape {list(value.shape)} {value.dtype}")
        if enable_dump:
            log.info("output[%d] dumped to %s", k, dump_output(Path(dump_path), k, name, value, dump_format,
                                                              dump_txt_axis))
    if layers:
        written = write_layers(Path(dump_path), layers, values)
        log.info("layer_out_dump: %d conv layer result(s) written to %s as <layer>_float.bin", len(written),
                 dump_path)
    if cls_post:
        name, first = next(iter(outputs.items()))
        best = top_classes(first)
        if best is None:
            log.warning("enable_cls_post_process: output '%s' has shape %s, not one vector of class scores; no "
                        "top-5 printed (it is for classifiers)", name, list(first.shape))
        for rank, (idx, score) in enumerate(best or []):
            click.echo(f"top {rank}: id {idx} score {score:.6f}")


@main.command("perf")
@_model_options
@_input_option
@click.option("--frame_count", type=click.IntRange(min=1), default=None,
              help=f"Frames to run when --perf_time is 0 [default: {DEFAULT_FRAMES}, or as many as "
                   f"{UNASKED_BUDGET_S:.0f} s of the simulator run].")
@click.option("--perf_time", type=click.FloatRange(min=0), default=0, show_default=True,
              help="Minutes to run (0: run --frame_count frames).")
@click.option("--thread_num", type=click.IntRange(1, 8), default=1, show_default=True, help="Running threads.")
@click.option("--profile_path", default="", help="Folder for profiler.log and profiler.csv (off when empty).")
def perf(model_file: str, model_name: str, core_id: int, input_file: str, frame_count: int | None, perf_time: float,
         thread_num: int, profile_path: str) -> None:
    """Measure latency and frame rate of the simulated model."""
    setup("hrt_model_exec.log")
    _perf(model_file, model_name or None, core_id, input_file, frame_count, perf_time, thread_num, profile_path)


@reports_errors("perf")
def _perf(model_file: str, model_name: str | None, core_id: int, input_file: str, frame_count: int | None,
          perf_time: float, thread_num: int, profile_path: str) -> None:
    from hbtools.tools.hrt_exec import perf as run_perf
    from hbtools.tools.hrt_exec import perf_report, write_profile

    sim, feeds = _simulator(model_file, model_name, input_file)
    log.warning("times below are of the x86 simulator on this host, not of the board; hb_perf estimates the board")
    # The board tool's 200 frames take minutes in the simulator (a 640x640 YOLO: 2.8 s a frame); unasked, a
    # time budget bounds them.
    budget = UNASKED_BUDGET_S if frame_count is None and not perf_time else None
    run = run_perf(sim, feeds, frame_count or DEFAULT_FRAMES, thread_num, perf_time, budget_s=budget)
    if budget is not None and run.frames < DEFAULT_FRAMES:
        log.info("perf: %d of the default %d frames run, in the %.0f s the simulator gets when --frame_count is not "
                 "given; --frame_count %d runs them all", run.frames, DEFAULT_FRAMES, budget, DEFAULT_FRAMES)
    core_num = sim.model.config_group("compiler_parameters").get("core_num", 1)
    click.echo("\n".join(perf_report(run, core_num if isinstance(core_num, int) else 1)))
    if profile_path:
        for path in write_profile(Path(profile_path), run, sim.model, core_id):
            log.info("profile written to %s", path)


def _simulator(model_file: str, model_name: str | None,
               input_file: str) -> tuple[Simulator, dict[str, np.ndarray]]:
    import numpy as np

    from hbtools.runtime.binfile import read_bin
    from hbtools.runtime.rt_input import load_rt_file, random_rt_inputs
    from hbtools.runtime.runtime_model import open_model
    from hbtools.runtime.simulator import Simulator

    if model_name is None:
        names = read_bin(model_file).names
        if len(names) > 1:
            raise HbError(f"{model_file} is a packed file with {len(names)} models; choose one with --model_name "
                          f"({', '.join(names)})")
    rm = open_model(model_file, model_name)
    files = [p.strip() for p in input_file.split(",") if p.strip()]
    if files and len(files) != len(rm.inputs):
        # the board tool separates files with ',' only; ';' is the YAML config's separator
        hint = "; separate the files with ',' (not ';')" if ";" in input_file else ""
        raise HbError(f"--input_file gives {len(files)} files; model '{rm.name}' has {len(rm.inputs)} inputs "
                      f"({', '.join(d.name for d in rm.inputs)}) in this order{hint}")
    if not files:
        log.info("no --input_file: running on random data")
        rng = np.random.default_rng(0)
        feeds = random_rt_inputs(rm, rng)
    else:
        feeds = {d.name: load_rt_file(d, p) for d, p in zip(rm.inputs, files, strict=True)}
    return Simulator(rm), feeds
