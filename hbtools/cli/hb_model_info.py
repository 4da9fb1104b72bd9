"""hb_model_info: dependencies and build parameters of a .bin model (seed 004 §Other Tools)."""

from __future__ import annotations

import click

from hbtools import __version__
from hbtools.cli.common import ToolCommand, reports_errors
from hbtools.log import setup


@click.command(cls=ToolCommand, log_file='hb_model_info.log', context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="hb_model_info")
@click.argument("bin_file", type=click.Path())
@click.option("-m", "model_name", help="Model to describe when BIN_FILE is a packed model (default: all).")
def main(bin_file: str, model_name: str | None) -> None:
    """Print the dependencies and build parameters of a .bin model."""
    setup("hb_model_info.log")
    _run(bin_file, model_name)


@reports_errors("model_info")
def _run(bin_file: str, model_name: str | None) -> None:
    from hbtools.outputs import write_file
    from hbtools.runtime.binfile import read_bin
    from hbtools.runtime.runtime_model import load
    from hbtools.tools.model_info import deleted_nodes_info, report

    f = read_bin(bin_file)
    models = f.selected(model_name)
    click.echo("Start hb_model_info....")
    click.echo(f"hb_model_info version {__version__}")
    if f.packed:
        click.echo(f"packed model with {len(f.models)} models: {', '.join(f.names)}")
    deleted: list[str] = []
    for model in models:
        load(model, f.path)  # a model the other tools would refuse is reported here too
        click.echo("\n".join(report(model, __version__)))
        deleted += deleted_nodes_info(model)
    if any(m.deleted_nodes for m in models):
        write_file("deleted_nodes_info.txt", "".join(line + "\n" for line in deleted))
