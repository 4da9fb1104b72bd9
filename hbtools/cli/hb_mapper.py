"""hb_mapper: the model conversion command line."""

from __future__ import annotations

import click

from hbtools import __version__
from hbtools.cli.common import reports_errors
from hbtools.log import setup


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="hb_mapper")
def main() -> None:
    """Check, convert and run models for Horizon BPUs."""


@main.command()
@click.option("-c", "--config", "config", type=click.Path(), help="YAML conversion config.")
@click.option("--model-type", type=click.Choice(["onnx", "caffe"], case_sensitive=False), default="onnx",
              show_default=True, help="Type of the float model.")
@click.option("--fast-perf", is_flag=True, help="Build with a built-in performance config (not yet available).")
@click.option("--model", type=click.Path(), help="Float model for --fast-perf.")
@click.option("--proto", type=click.Path(), help="Caffe prototxt for --fast-perf.")
@click.option("--march", help="BPU micro-architecture for --fast-perf.")
@click.option("-i", "--input-shape", nargs=2, multiple=True, help="NAME SHAPE for --fast-perf.")
def makertbin(config, model_type, fast_perf, model, proto, march, input_shape) -> None:
    """Convert a float model into quantized ONNX artefacts and a .bin runtime model."""
    setup("hb_mapper_makertbin.log")
    _makertbin(config, model_type.lower(), fast_perf)


@reports_errors("makertbin")
def _makertbin(config: str | None, model_type: str, fast_perf: bool) -> None:
    from hbtools.errors import HbError
    from hbtools.pipeline.runner import makertbin as run

    if fast_perf:
        raise HbError("--fast-perf is not available in this version", hint="use --config with a YAML file")
    if not config:
        raise HbError("makertbin needs --config", hint="hb_mapper makertbin --config model.yaml --model-type onnx")
    run(config, model_type)
