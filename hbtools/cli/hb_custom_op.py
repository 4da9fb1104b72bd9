"""hb_custom_op: write the Python template of a custom CPU operator."""

from __future__ import annotations

import logging

import click

from hbtools import __version__
from hbtools.cli.common import ToolGroup, reports_errors
from hbtools.log import setup
from hbtools.tools.custom_op_template import DEFAULT_FILE, DEFAULT_NAME

log = logging.getLogger("hbtools")


@click.group(cls=ToolGroup, log_file=None, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="hb_custom_op")
def main() -> None:
    """Tools for custom CPU operators implemented in Python."""


@main.command()
@click.option("-n", "--name", default=DEFAULT_NAME, show_default=True,
              help="Op type of the custom op (also its class name in the file).")
@click.option("-o", "--output", default=DEFAULT_FILE, show_default=True, type=click.Path(),
              help="Python file to write.")
@click.option("-f", "--force", is_flag=True, help="Overwrite the file if it exists.")
def create(name: str, output: str, force: bool) -> None:
    """Write a template with the compute and shape functions of a custom op."""
    setup(None)
    _create(name, output, force)


@reports_errors("create", single_line=True)
def _create(name: str, output: str, force: bool) -> None:
    from hbtools.tools.custom_op_template import create as write

    path = write(output, name, force=force)
    log.info("custom op template for %s written to %s", name, path)
    log.info("fill in compute and infer_shape, then list %s in the config's custom_op group", path.name)
