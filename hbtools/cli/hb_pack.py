"""hb_pack: pack several .bin models into one file."""

from __future__ import annotations

import logging

import click

from hbtools import __version__
from hbtools.cli.common import ToolCommand, reports_errors
from hbtools.log import setup
from hbtools.outputs import output_file

log = logging.getLogger("hbtools")


@click.command(cls=ToolCommand, log_file='hb_pack.log', context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="hb_pack")
@click.argument("bin_files", nargs=-1, type=click.Path())
@click.option("-o", "--output_name", "output", required=True, help="File name of the packed model.")
def main(bin_files: tuple[str, ...], output: str) -> None:
    """Pack BIN_FILES (unpacked .bin models) into one model file."""
    setup("hb_pack.log")
    _run(list(bin_files), output)


@reports_errors("pack")
def _run(bin_files: list[str], output: str) -> None:
    from hbtools.tools.pack import pack

    output_file(output, "-o/--output_name", bin_files)
    path = pack(bin_files, output)
    log.info("packed %d models into %s", len(bin_files), path)
