"""vec_diff: compare the vectors two models dumped (files, or folders matched by file name)."""

from __future__ import annotations

import logging
from pathlib import Path

import click

from hbtools import __version__
from hbtools.cli.common import ToolCommand, reports_errors
from hbtools.log import setup
from hbtools.outputs import output_file

log = logging.getLogger("hbtools")


@click.command(cls=ToolCommand, log_file='vec_diff.log', context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="vec_diff")
@click.argument("left", type=click.Path())
@click.argument("right", type=click.Path())
@click.option("-o", "--output-file", "output", default="vec_diff_out.csv", show_default=True,
              help="CSV file for the results.")
def main(left: str, right: str, output: str) -> None:
    """Compare LEFT and RIGHT (two vector files, or two folders of same-named files).

    Files are raw float32 (numpy.tofile, as `hb_mapper infer` writes), .npy or .txt.
    """
    setup("vec_diff.log")
    _run(Path(left), Path(right), Path(output))


@reports_errors("vec_diff")
def _run(left: Path, right: Path, output: Path) -> None:
    from hbtools.tools.vec_diff import compare, table, write_csv

    output_file(output, "-o/--output-file", [left, right])
    rows = compare(left, right)
    click.echo(table(rows))
    write_csv(rows, output)
    log.info("%d comparison(s) written to %s", len(rows), output)
