"""hb_perf: estimated BPU performance of a .bin model, written to hb_perf_result/<model>/."""

from __future__ import annotations

import logging
from pathlib import Path

import click

from hbtools import __version__
from hbtools.cli.common import ToolCommand, reports_errors
from hbtools.log import setup

log = logging.getLogger("hbtools")
RESULT_DIR = "hb_perf_result"


@click.command(cls=ToolCommand, log_file='hb_perf.log', context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="hb_perf")
@click.argument("bin_file", type=click.Path())
@click.option("-m", "model_name", help="Model to analyse when BIN_FILE is a packed model (default: all).")
@click.option("-p", "--pack", is_flag=True, help="Accepted for older scripts; packed files are detected.")
def main(bin_file: str, model_name: str | None, pack: bool) -> None:
    """Estimate latency and DDR traffic of BIN_FILE and write an HTML report."""
    del pack
    setup("hb_perf.log")
    _run(bin_file, model_name)


@reports_errors("perf")
def _run(bin_file: str, model_name: str | None) -> None:
    from hbtools.runtime.binfile import read_bin
    from hbtools.runtime.runtime_model import load
    from hbtools.tools.perf_report import write_report

    f = read_bin(bin_file)
    models = f.selected(model_name)
    for model in models:
        page = write_report(load(model, f.path), Path(RESULT_DIR))
        log.info("%s: performance report written to %s", model.name, page)
