"""hb_eval_preprocess: preprocess evaluation images into model input files."""

from __future__ import annotations

import logging
from pathlib import Path

import click

from hbtools import __version__
from hbtools.cli.common import ToolCommand, reports_errors
from hbtools.data.eval_preprocess import RECIPES, model_names, preprocess_folder, recipe
from hbtools.errors import UsageError
from hbtools.log import setup

log = logging.getLogger("hbtools")
LOG_FILE = "hb_eval_preprocess.log"


def _epilog() -> str:
    # "\b" keeps click from re-flowing the table.
    shown = list({id(r): r for r in RECIPES.values()}.values())  # a recipe with aliases once
    rows = [f"  {' / '.join((r.name, *r.aliases)):<10} {r.summary}\n  {'':<10} -> {r.output}" for r in shown]
    return "\b\nModels (-m):\n" + "\n".join(rows)


@click.command(cls=ToolCommand, log_file=LOG_FILE, context_settings={"help_option_names": ["-h", "--help"]},
               epilog=_epilog())
@click.version_option(__version__, prog_name="hb_eval_preprocess")
@click.option("-m", "--model_name", "model_name", help="Model whose preprocessing to apply (listed below).")
@click.option("-i", "--image_dir", "image_dir", help="Folder of input images.")
@click.option("-o", "--output_dir", "output_dir", help="Folder for the preprocessed files (created).")
@click.option("-v", "--val_txt", "val_txt",
              help="Text file naming the images to process, one per line (first word); default: all.")
def main(model_name: str | None, image_dir: str | None, output_dir: str | None, val_txt: str | None) -> None:
    """Preprocess the images of IMAGE_DIR for MODEL_NAME into binary files in OUTPUT_DIR.

    Each output file, <image name>.bin (for the vendor's sample models, as its tool names them:
    <image file name>_<height>_<width>_<input height>_<input width>.bin), holds one image in the
    model's input format as raw bytes (numpy.tofile).
    """
    setup(LOG_FILE)
    _run(model_name, image_dir, output_dir, val_txt)


@reports_errors("hb_eval_preprocess", single_line=True)
def _run(model_name: str | None, image_dir: str | None, output_dir: str | None, val_txt: str | None) -> None:
    for value, flag in ((model_name, "-m/--model_name"), (image_dir, "-i/--image_dir"),
                        (output_dir, "-o/--output_dir")):
        if not value:
            raise UsageError(f"missing {flag}", hint="usage: hb_eval_preprocess -m MODEL -i IMAGE_DIR -o OUT_DIR "
                          "[-v VAL_TXT]; models: " + model_names())
    chosen = recipe(model_name)
    written = preprocess_folder(model_name, Path(image_dir), Path(output_dir),
                                Path(val_txt) if val_txt else None,
                                progress=lambda p: log.debug("preprocessed %s", p))
    log.info("%s: %d image(s) -> %s (%s each)", chosen.name, len(written), output_dir, chosen.output)
