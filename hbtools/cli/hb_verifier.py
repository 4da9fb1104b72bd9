"""hb_verifier / hb_model_verifier: the quantized ONNX model against the .bin on the x86 simulator."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

import click

from hbtools import __version__
from hbtools.cli.common import ToolCommand, reports_errors
from hbtools.errors import HbError, UsageError
from hbtools.log import setup

if TYPE_CHECKING:
    from hbtools.tools.verifier import Comparison

log = logging.getLogger("hbtools")
DUMP_DIR = "hb_verifier_dump"
_BOOL = click.BOOL


@click.command(cls=ToolCommand, log_file='hb_verifier.log', context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="hb_verifier")
@click.option("-m", "--model", "models", required=True, help="Quantized ONNX model and .bin model: Q.onnx,M.bin")
@click.option("-b", "--board-ip", help="Board address (no board runs here: the x86 simulator is used).")
@click.option("-s", "--run-sim", type=_BOOL, default=False, show_default=True,
              help="Run the .bin on the x86 simulator (always done when no board is given).")
@click.option("-i", "--input-img", help="Input files: img1,img2 or name1:img1,name2:img2 (default: random data).")
@click.option("-c", "--compare_digits", "digits", type=click.IntRange(0, 15), default=5, show_default=True,
              help="Decimal places to compare.")
@click.option("-r", "--dump-all-nodes-results", "dump_all", type=_BOOL, default=False, show_default=True,
              help="Compare (and save) every intermediate tensor both runs share.")
@click.option("-u", "--username", default="root", help="Board user (unused without a board).")
@click.option("-p", "--password", help="Board password (unused without a board).")
def main(models: str, board_ip: str | None, run_sim: bool, input_img: str | None, digits: int, dump_all: bool,
         username: str, password: str | None) -> None:
    """Verify that the .bin model computes what the quantized ONNX model computes."""
    del username, password
    setup("hb_verifier.log")
    _run(models, board_ip, run_sim, input_img, digits, dump_all)


@click.command(cls=ToolCommand, log_file='hb_verifier.log', context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="hb_model_verifier")
@click.option("-q", "--quanti_model", "-quanti_model", required=True, help="Quantized ONNX model.")
@click.option("-b", "--bin_model", required=True, help=".bin model.")
@click.option("-a", "--arm-board-ip", help="Board address (no board runs here: the x86 simulator is used).")
@click.option("-i", "--input-img", help="Input files, comma separated (default: random data).")
@click.option("-d", "--compare_digits", "digits", type=click.IntRange(0, 15), default=5, show_default=True,
              help="Decimal places to compare.")
def model_verifier(quanti_model: str, bin_model: str, arm_board_ip: str | None, input_img: str | None,
                   digits: int) -> None:
    """Verify that the .bin model computes what the quantized ONNX model computes (older name)."""
    setup("hb_verifier.log")
    _run(f"{quanti_model},{bin_model}", arm_board_ip, True, input_img, digits, False, counted="line")


@reports_errors("verifier")
def _run(models: str, board_ip: str | None, run_sim: bool, input_img: str | None, digits: int,
         dump_all: bool, counted: str = "result") -> None:
    """``counted``: what the mismatch statistics count, as each tool's manual words it (hb_verifier: results,
    hb_model_verifier: lines)."""
    from hbtools.runs.transaction import check_inputs_outside
    from hbtools.tools.verifier import DUMP_FOLDER, DUMP_SIDES, given_files, save_dumps, verify

    parts = [p.strip() for p in models.split(",") if p.strip()]
    onnx_files = [p for p in parts if p.lower().endswith(".onnx")]
    bin_files = [p for p in parts if not p.lower().endswith(".onnx")]
    if len(onnx_files) != 1 or len(bin_files) != 1:
        raise UsageError(f"--model needs one quantized .onnx and one .bin, got {parts}",
                      hint="hb_verifier -m model_quantized_model.onnx,model.bin -s True")
    if board_ip:
        log.warning("board runs are not available in hbtools; comparing with the x86 simulator instead")
    elif not run_sim:
        log.info("no board given: comparing the quantized model with the x86 simulator")
    images = [p.strip() for p in input_img.split(",")] if input_img else None
    # the files the run reads: the dump replaces its folders whole, so none of them may lie there
    inputs = [Path(onnx_files[0]), Path(bin_files[0]), *given_files(images)]
    if dump_all:
        check_inputs_outside(Path(DUMP_DIR), DUMP_SIDES, inputs, DUMP_FOLDER)
    result = verify(onnx_files[0], bin_files[0], images, digits, dump_all)
    if dump_all:
        failed = [c for c in result.nodes if not c.passed]
        log.info("compared %d shared tensors, %d differ", len(result.nodes), len(failed))
        for c in failed:
            log.info("  %s: mismatch %d of %d, max abs error %g", c.name, c.mismatch, c.total, c.max_abs)
        log.info("%d tensors of each run saved under %s", len(result.sim_values),
                 save_dumps(result, Path(DUMP_DIR), inputs))
    bad = [c for c in result.outputs if not c.passed]
    for c in bad:
        _statistics(c, counted)
    if bad:
        other = result.other_weights
        hint = (f"the .bin holds other constants than {onnx_files[0]} ({len(other)}, e.g. '{other[0]}'): were the two "
                f"built by the same makertbin run?") if other else None
        raise HbError(f"Quanti onnx and Sim result Strict check FAILED ({', '.join(c.name for c in bad)})",
                      hint=hint)
    log.info("Quanti onnx and Sim result Strict check PASSED")


def _statistics(c: Comparison, counted: str) -> None:
    log.info("output %s:", c.name)
    log.info("mismatch %s num: %d", counted, c.mismatch)
    log.info("****************************")
    log.info("mismatch.line_miss num: %d", c.miss)
    log.info("mismatch.line_diff num: %d", c.diff)
    log.info("mismatch.line_nan num: %d", c.nan)
    log.info("****************************")
    log.info("total %s num: %d", counted, c.total)
    log.info("mismatch rate: %s", c.rate)
    log.info("relative mismatch ratio: %s", c.max_rel)
    log.info("max abs error: %s", c.max_abs)
