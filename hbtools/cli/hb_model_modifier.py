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

MAX_LISTED = 12  # deletable nodes named in a refusal; more are left to the listing command


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
    known = dict.fromkeys((*modifier.INPUT_SIDE, *modifier.OUTPUT_SIDE))
    unknown = [t for t in dict.fromkeys(types) if t.lower().removeprefix("hz") not in {k.lower() for k in known}]
    if unknown:  # all of them, before anything is deleted
        raise HbError(f"{', '.join(f'-a {t}' for t in unknown)}: hb_model_modifier does not delete "
                      f"{' or '.join(unknown)} nodes in any model"
                      f"{''.join(closest_names(t, known) for t in unknown)}; the deletable types are "
                      f"{', '.join(modifier.INPUT_SIDE)} right after a model input and "
                      f"{', '.join(modifier.OUTPUT_SIDE)} right before a model output")
    first = modifier.candidates(model.load_graph())
    # Names a mistyped -r is compared with: every node deletable at some point of the run.
    deletable = dict.fromkeys(c.name for c in first)
    # Printed only once every deletion succeeded and the file is written: a run that fails announces nothing.
    lines: list[str] = []
    deleted = 0
    for node_type in types:
        wanted = node_type.lower().removeprefix("hz")
        now = modifier.candidates(model.load_graph())
        if not any(c.type.lower() == wanted for c in now):
            # as remove_node_type in a config: the other types given are still deleted
            kinds = sorted({c.type for c in now})
            graph = model.load_graph()
            kind_of = {n.name: modifier.display_type(n).lower() for n in graph.graph.node}
            sizeless = {name: end for name, end in modifier.unsized(graph).items() if kind_of.get(name) == wanted}
            why = "".join(f"; {name} is not: {modifier.unsized_reason(end)}" for name, end in sizeless.items())
            log.warning("-a %s: no deletable node of that type in %s%s; deletable types: %s (nodes next to the "
                        "model's inputs and outputs)", node_type, model_file, why, ", ".join(kinds) or "none")
            continue
        while True:
            graph = model.load_graph()
            batch = [c.name for c in modifier.candidates(graph) if c.type.lower() == wanted]
            if not batch:
                break
            for name in batch:
                model = _delete(model, name, lines)
                deleted += 1
        deletable.update(dict.fromkeys(c.name for c in modifier.candidates(model.load_graph())))
    refused = []
    for name in dict.fromkeys(remove):  # a name given twice means that node, deleted once
        reason = modifier.refusal(model.load_graph(), name, model.deleted_nodes, list(deletable))
        if reason is None:
            try:
                model = _delete(model, name, lines)
            except HbError as e:  # the deletion would leave a model the tools cannot load
                reason = str(e)
            else:
                deleted += 1
                deletable.update(dict.fromkeys(c.name for c in modifier.candidates(model.load_graph())))
        if reason is not None:
            refused.append(reason)  # the later names are still checked, so one ERROR names every bad one
    if refused:
        listing = list(deletable)
        known_names = (f"deletable nodes (in the model given, or once the nodes before them are deleted): {listing}"
                       if len(listing) <= MAX_LISTED else
                       f"run hb_model_modifier {model_file} to list the {len(listing)} deletable nodes")
        raise HbError(f"{'; '.join(refused)}. Nothing was deleted and no file was written: correct "
                      f"{'this -r name' if len(refused) == 1 else f'these {len(refused)} -r names'} (nodes are "
                      f"deleted in the order given, each from the model the previous deletion left); {known_names}")
    if not deleted:  # a copy with no change would pass for a modified model
        names = [c.name for c in modifier.candidates(model.load_graph())]
        raise HbError(f"-a {' -a '.join(types)}: no node of {'that type' if len(types) == 1 else 'these types'} "
                      f"can be deleted in {model_file}, so nothing was written; deletable now: {names}")
    write_bin(target, [model])
    for line in lines:
        click.echo(line)
    click.echo(f"modified model saved as {target}")


def _delete(model: BinModel, name: str, lines: list[str]) -> BinModel:
    """``model`` without node ``name``; the vendor's three lines about it are appended to ``lines``."""
    from hbtools.tools import modifier

    node = modifier.find(model.load_graph(), name, model.deleted_nodes)
    result = modifier.delete(model, name)
    lines += [f"Node '{name}' found, its OP type is '{modifier.display_type(node)}'",
              f"Node info: {modifier.info_line(result.deleted_nodes[-1])}",
              f"Node '{name}' is removed"]
    return result
