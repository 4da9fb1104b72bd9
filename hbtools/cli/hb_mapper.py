"""hb_mapper: the model conversion command line."""

from __future__ import annotations

import logging

import click

from hbtools import __version__
from hbtools.cli.common import ToolGroup, reports_errors
from hbtools.log import setup

log = logging.getLogger("hbtools")

MODEL_TYPES = click.Choice(["onnx", "caffe"], case_sensitive=False)


@click.group(cls=ToolGroup, log_file='hb_mapper_{command}.log',
             context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="hb_mapper")
def main() -> None:
    """Check, convert and run models for Horizon BPUs."""


@main.command()
@click.option("--model-type", type=MODEL_TYPES, default="onnx", show_default=True, help="Type of the float model.")
@click.option("--march", default="bayes", show_default=True,
              help="BPU micro-architecture: bernoulli2, bayes, bayes-e, nash-e or nash-m.")
@click.option("--model", type=click.Path(), help="ONNX model file, or the Caffe .caffemodel.")
@click.option("--proto", type=click.Path(), help="Caffe prototxt (with --model-type caffe).")
@click.option("--input-shape", "input_shape", nargs=2, multiple=True, metavar="NAME SHAPE",
              help="Shape of one input, e.g. --input-shape data 1x3x224x224; repeat for several inputs.")
@click.option("--output", help="Deprecated and ignored: the log goes to hb_mapper_checker.log.")
def checker(model_type: str, march: str, model: str | None, proto: str | None,
            input_shape: tuple[tuple[str, str], ...], output: str | None) -> None:
    """Check that a float model converts, and show where each node runs (BPU subgraph or CPU)."""
    setup("hb_mapper_checker.log")
    _checker(model_type.lower(), march, model, proto, list(input_shape), output)


def _model_options(model_type: str) -> str:
    """The model options of an example command line, for ``model_type``."""
    if model_type == "caffe":
        return "--model-type caffe --march bayes-e --proto net.prototxt --model net.caffemodel"
    return "--model-type onnx --march bayes-e --model m.onnx"


@reports_errors("checker", single_line=True)
def _checker(model_type: str, march: str, model: str | None, proto: str | None,
             input_shape: list[tuple[str, str]], output: str | None) -> None:
    from hbtools.errors import UsageError
    from hbtools.tools.checker import check

    if output is not None:
        log.warning("--output is deprecated and ignored; the log is written to hb_mapper_checker.log")
    if not model:
        raise UsageError("checker needs --model", hint=f"hb_mapper checker {_model_options(model_type)}")
    if model_type == "caffe" and not proto:
        raise UsageError("--model-type caffe needs --proto with the prototxt file")
    check(model, model_type, march, input_shape, proto)


@main.command()
@click.option("-c", "--config", "config", type=click.Path(), help="YAML conversion config.")
@click.option("--model-type", type=MODEL_TYPES, default="onnx", show_default=True, help="Type of the float model.")
@click.option("--fast-perf", is_flag=True,
              help="Build for the best board performance with a built-in config (needs --model and --march; "
                   "no --config). Calibration is skipped: not for accuracy evaluation.")
@click.option("--model", type=click.Path(), help="Float model for --fast-perf.")
@click.option("--proto", type=click.Path(), help="Caffe prototxt for --fast-perf.")
@click.option("--march", help="BPU micro-architecture for --fast-perf.")
@click.option("-i", "--input-shape", nargs=2, multiple=True, metavar="NAME SHAPE",
              help="Shape of one input for --fast-perf, e.g. -i data 1x3x224x224; repeat for several inputs.")
def makertbin(config, model_type, fast_perf, model, proto, march, input_shape) -> None:
    """Convert a float model into quantized ONNX artefacts and a .bin runtime model."""
    setup("hb_mapper_makertbin.log")
    _makertbin(config, model_type.lower(), fast_perf, model, proto, march, list(input_shape))


@reports_errors("makertbin")
def _makertbin(config: str | None, model_type: str, fast_perf: bool, model: str | None, proto: str | None,
               march: str | None, input_shape: list[tuple[str, str]]) -> None:
    from hbtools.errors import UsageError
    from hbtools.pipeline.runner import makertbin as run
    from hbtools.pipeline.runner import makertbin_fast_perf

    if fast_perf:
        if config:
            raise UsageError("--fast-perf uses a built-in config; do not give --config",
                             hint=f"hb_mapper makertbin --fast-perf {_model_options(model_type)}")
        if not model or not march:
            raise UsageError("--fast-perf needs --model and --march",
                             hint=f"hb_mapper makertbin --fast-perf {_model_options(model_type)}")
        if model_type == "caffe" and not proto:
            raise UsageError("--model-type caffe needs --proto with the prototxt file")
        makertbin_fast_perf(model, model_type, march, input_shape, proto)
        return
    if not config:
        raise UsageError("makertbin needs --config",
                         hint=f"hb_mapper makertbin --config model.yaml --model-type {model_type}")
    run(config, model_type)


@main.command()
@click.option("-c", "--config", "config", type=click.Path(), help="The YAML config the model was converted with.")
@click.option("--model-file", type=click.Path(), help="Float or quantized ONNX artefact to run.")
@click.option("--model-type", type=MODEL_TYPES, default="onnx", show_default=True,
              help="Type of the original float model.")
@click.option("--image-file", "image_file", nargs=2, multiple=True, metavar="NAME FILE",
              help="Input name and its data file, prepared like the config's calibration data; repeat per input.")
@click.option("--input-layout", metavar="LAYOUT[;LAYOUT...]",
              help="Layout (NCHW or NHWC) the model's inputs take: one for all, or one per input in the config's "
                   "input_name order separated by ';' (default: from each input's shape).")
@click.option("--output-dir", type=click.Path(), help="Folder for the ${layername}_float.bin results.")
def infer(config, model_file, model_type, image_file, input_layout, output_dir) -> None:
    """Run a float or quantized model on one input and dump its layer results as float32."""
    setup("hb_mapper_infer.log")
    _infer(config, model_file, model_type.lower(), list(image_file), input_layout, output_dir)


@reports_errors("infer")
def _infer(config: str | None, model_file: str | None, model_type: str, image_file: list[tuple[str, str]],
           input_layout: str | None, output_dir: str | None) -> None:
    from hbtools.errors import UsageError
    from hbtools.tools.infer import infer as run

    layouts = [v.strip().upper() for v in input_layout.split(";")] if input_layout else None
    bad = [v for v in layouts or [] if v not in ("NCHW", "NHWC")]
    if bad:
        raise UsageError(f"--input-layout '{bad[0]}' is not NCHW or NHWC",
                         hint="give NCHW or NHWC, one for all inputs or one per input separated by ';'")
    for value, option in ((config, "--config"), (model_file, "--model-file"), (output_dir, "--output-dir")):
        if not value:
            raise UsageError(f"infer needs {option}", hint="hb_mapper infer -c model.yaml --model-file m.onnx "
                          "--model-type onnx --image-file data img.bin --output-dir out")
    if not image_file:
        raise UsageError("infer needs --image-file NAME FILE for each input")
    run(config, model_file, model_type, image_file, output_dir, layouts)
