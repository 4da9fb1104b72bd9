"""hb_model_modifier: delete Quantize/Dequantize/Transpose/Cast/Reshape/Softmax nodes at a model's edges."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

import click

from hbtools import __version__
from hbtools.cli.common import ToolCommand, reports_errors
from hbtools.errors import HbError
from hbtools.log import setup

if TYPE_CHECKING:
    from hbtools.runtime.binfile import BinModel

log = logging.getLogger("hbtools")


@click.command(cls=ToolCommand, log_file='hb_model_modifier.log',
               context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="hb_model_modifier")
@click.argument("model_file", type=click.Path(), required=False)
@click.option("--model_file", "--model-file", "model_option", type=click.Path(), hidden=True,
              help="MODEL_FILE given as an option, as the PTQ chapter spells it.")
@click.option("-r", "remove", multiple=True, help="Name of a node to delete; repeat for several, deleted in order.")
@click.option("-a", "--all", "types", multiple=True,
              help="Delete every deletable node of this type (e.g. Dequantize); repeat for several types.")
@click.option("-o", "output", help="Output file (default: <model>_modified.bin in the current folder).")
def main(model_file: str | None, model_option: str | None, remove: tuple[str, ...], types: tuple[str, ...],
         output: str | None) -> None:
    """List the deletable nodes of MODEL_FILE, or delete the given ones."""
    if (model_file is None) == (model_option is None):
        raise click.UsageError("give the model file once: hb_model_modifier MODEL_FILE [options] (or --model_file)")
    setup("hb_model_modifier.log")
    _run(model_file or model_option, list(remove), list(types), output)


@reports_errors("modify")
def _run(model_file: str, remove: list[str], types: list[str], output: str | None) -> None:
    # Imported here, inside the error reporting: a Ctrl-C while onnx loads is "interrupted", not a traceback.
    from hbtools.config.values import closest_names
    from hbtools.outputs import output_file
    from hbtools.runtime.binfile import read_bin, write_bin
    from hbtools.runtime.runtime_model import load
    from hbtools.tools import modifier
    from hbtools.tools.pack import warn_if_newer

    f = read_bin(model_file)
    if f.packed:
        raise HbError("pack model is not supported")
    warn_if_newer(f)
    model = f.models[0]
    load(model, f.path)
    if not remove and not types:
        names = [c.name for c in modifier.candidates(model.load_graph())]
        log.info("Nodes that can be deleted: %s", names)
        return
    # Checked before any node is deleted: a refused -o must not follow "Node ... is removed" lines.
    # Beside the model given, as the vendor's tool writes it (D-Robotics' batch_mapper.py copies it from there).
    default = Path(model_file).with_name(f"{Path(model_file).stem}_modified.bin")
    target = output_file(output or str(default), "-o", [model_file])
    deleted = 0
    for node_type in types:
        wanted = node_type.lower().removeprefix("hz")
        known = dict.fromkeys((*modifier.INPUT_SIDE, *modifier.OUTPUT_SIDE))
        if wanted not in {k.lower() for k in known}:
            raise HbError(f"-a {node_type}: hb_model_modifier does not delete {node_type} nodes in any model"
                          f"{closest_names(node_type, known)}; the deletable types are "
                          f"{', '.join(modifier.INPUT_SIDE)} right after a model input and "
                          f"{', '.join(modifier.OUTPUT_SIDE)} right before a model output")
        first = modifier.candidates(model.load_graph())
        if not any(c.type.lower() == wanted for c in first):
            # as remove_node_type in a config: the other types given are still deleted
            kinds = sorted({c.type for c in first})
            log.warning("-a %s: no deletable node of that type in %s; deletable types: %s (nodes next to the "
                        "model's inputs and outputs)", node_type, model_file, ", ".join(kinds) or "none")
            continue
        while True:
            graph = model.load_graph()
            batch = [c.name for c in modifier.candidates(graph) if c.type.lower() == wanted]
            if not batch:
                break
            for name in batch:
                model = _delete(model, name)
                deleted += 1
    for name in dict.fromkeys(remove):  # a name given twice means that node, deleted once
        model = _delete(model, name)
        deleted += 1
    if not deleted:  # a copy with no change would pass for a modified model
        names = [c.name for c in modifier.candidates(model.load_graph())]
        raise HbError(f"-a {' -a '.join(types)}: no node of {'that type' if len(types) == 1 else 'these types'} "
                      f"can be deleted in {model_file}, so nothing was written; deletable now: {names}")
    write_bin(target, [model])
    click.echo(f"modified model saved as {target}")


def _delete(model: BinModel, name: str) -> BinModel:
    from hbtools.tools import modifier

    node = modifier.find(model.load_graph(), name, model.deleted_nodes)
    click.echo(f"Node '{name}' found, its OP type is '{modifier.display_type(node)}'")
    result = modifier.delete(model, name)
    click.echo(f"Node info: {modifier.info_line(result.deleted_nodes[-1])}")
    click.echo(f"Node '{name}' is removed")
    return result
