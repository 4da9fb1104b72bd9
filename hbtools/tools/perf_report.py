"""hb_perf output: ``hb_perf_result/<model>/`` with the main page, picture and per-subgraph pages."""

from __future__ import annotations

import html
import json
import logging
from pathlib import Path

from hbtools import __version__, outputs
from hbtools.errors import ResourceError
from hbtools.march.profiles import get_profile
from hbtools.runs.transaction import Destination, artefact_transaction
from hbtools.runtime.runtime_model import RuntimeModel
from hbtools.runtime.structure import analyse, tensor_info
from hbtools.tools import perf_model, structure_plot
from hbtools.tools.perf_model import ModelCost, SubgraphCost

log = logging.getLogger("hbtools")
PERF_FOLDER = Destination("the hb_perf result folder", "run hb_perf from another folder (it writes under "
                                                      "hb_perf_result/ in the current folder)")

_STYLE = """
body { font-family: sans-serif; margin: 2em; color: #202020; }
table { border-collapse: collapse; margin-bottom: 1.5em; }
th, td { border: 1px solid #b0b0b0; padding: 4px 10px; text-align: left; }
th { background: #e8f4f4; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.bpu { color: #008b8b; font-weight: bold; } .cpu { color: #707070; font-weight: bold; }
img { max-width: 100%; border: 1px solid #d0d0d0; }
"""


def has_layer_info(rm: RuntimeModel) -> bool:
    """Layer details are part of a model built with ``compiler_parameters.debug: True``."""
    return rm.config_group("compiler_parameters").get("debug") is True or rm.bin.perf is not None


def _check_no_file_in_the_way(root: Path, folder: Path) -> None:
    """hb_perf has no option for where it writes: a file named like its result folder must go, so say that."""
    for path in (root, folder):
        if path.exists() and not path.is_dir():
            raise ResourceError(f"cannot create the hb_perf result folder '{folder}': '{path}' is a file; remove or "
                                f"rename that file (hb_perf always writes its results to '{root}')")


def write_report(rm: RuntimeModel, root: Path, *, static: bool = False) -> Path:
    """Write every hb_perf file of one model under ``root/<model>/``; return the main page.

    ``static``: makertbin's static performance page, written straight into ``root`` (its working_dir).
    """
    folder = root if static else root / outputs.file_names([rm.name], fallback="model")[rm.name]
    if not static:  # checked before the estimate: a refusal comes first, not after the work
        _check_no_file_in_the_way(root, folder)
    if not rm.march:
        log.warning("%s: the model does not record its march; estimating for bayes-e", rm.name)
    profile = get_profile(rm.march or "bayes-e")
    cost = perf_model.estimate(rm, profile)
    if static:
        root.mkdir(parents=True, exist_ok=True)
        return _write_pages(rm, cost, root, layers=has_layer_info(rm))
    outputs.output_dir(folder, "hb_perf result")
    layers = has_layer_info(rm)
    if not layers:
        log.warning("bpu model don't have per-layer perf info.")
        log.warning("if you need per-layer perf info, please enable [compiler_parameters.debug:True] "
                    "when using makertbin.")
    # One set: a failed or interrupted run leaves the previous pages, and a model with fewer subgraphs
    # than the last one analysed here removes the pages of the ones it no longer has.
    with artefact_transaction(folder, set_name="hb_perf", folder=PERF_FOLDER) as staging:
        main = _write_pages(rm, cost, staging, layers=layers)
    return folder / main.name


def _write_pages(rm: RuntimeModel, cost: ModelCost, folder: Path, *, layers: bool) -> Path:
    """The picture, a page and a JSON per subgraph and the main page in ``folder``; returns the main page."""
    _table_type_names(rm, cost)
    structure = analyse(rm.graph, rm.bin.partition, tensor_info(rm.graph))
    # one stem per page; its picture and data take the same stem with their own (shorter) extension
    pages = outputs.file_names([rm.name, *(sub.name for sub in cost.subgraphs)], suffix=".html", fallback="model")
    main = folder / pages[rm.name]
    picture = structure_plot.draw(rm.graph, structure, rm.name, main.with_suffix(".png"))
    for sub in cost.subgraphs:
        page = folder / pages[sub.name]
        outputs.replace_atomically(page, _subgraph_page(rm, sub, layers))
        data = {**sub.summary(), "march": cost.march}
        if layers:
            data["layers"] = [layer.as_dict() for layer in sub.layers]
        outputs.replace_atomically(page.with_suffix(".json"), json.dumps(data, indent=2))
    outputs.replace_atomically(main, _main_page(rm, cost, picture.name, pages))
    return main


def _table_type_names(rm: RuntimeModel, cost: ModelCost) -> None:
    """Name each layer's type as makertbin's node table does (HzSQuantizedAdd, not the kernel's
    HzSQuantizedEltwise); the .bin records those names in its partition."""
    types = rm.bin.partition.get("node_types")
    if not isinstance(types, dict):
        return
    for sub in cost.subgraphs:
        for layer in sub.layers:
            kind = types.get(layer.name)
            if isinstance(kind, str) and kind:
                layer.op_type = kind


def _table(header: list[str], rows: list[list[str]], numeric_from: int = 1) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(f'<td class="num">{c}</td>' if i >= numeric_from else f"<td>{c}</td>"
                         for i, c in enumerate(row)) + "</tr>"
        for row in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def _page(title: str, body: str) -> str:
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"<style>{_STYLE}</style></head><body>\n{body}\n</body></html>\n")


def _main_page(rm: RuntimeModel, cost: ModelCost, picture: str, pages: dict[str, str]) -> str:
    name = html.escape(rm.name)
    summary = _table(
        ["Model Name", "Model Latency (ms)", "Total DDR (loaded+stored) bytes per frame (MB per frame)",
         "Loaded Bytes per Frame", "Stored Bytes per Frame"],
        [[name, f"{cost.latency_ms:.3f}", f"{cost.ddr_mb:.3f}", f"{cost.loaded_bytes}", f"{cost.stored_bytes}"]],
    )
    details = _table(
        ["Model Subgraph Name", "Model Subgraph Calculation Load (OPpf)", "Model Subgraph DDR Occupation (Mbpf)",
         "Model Subgraph Latency (ms)"],
        [[f'<a href="{html.escape(pages[s.name])}">{html.escape(s.name)}</a>', f"{s.ops:.0f}",
          f"{s.ddr_mb:.3f}", f"{s.latency_ms:.3f}"] for s in cost.subgraphs],
    )
    cpu = ", ".join(html.escape(f"{n} ({t})") for n, t in cost.cpu_nodes) or "none"
    body = f"""<h1>hb_perf: {name}</h1>
<h2>Model Performance Summary</h2>
{summary}
<p>Estimated by the hbtools cost model for march <b>{html.escape(cost.march)}</b>
(peak {cost.peak_int8_tops:g} int8 TOPS, DDR {cost.ddr_gbps:g} GB/s, core_num {cost.core_num}).
BPU subgraphs only: CPU nodes are not estimated. hbtools {__version__}.</p>
<h2>Details</h2>
{details}
<h2>BIN Model Structure</h2>
<p><span class="bpu">dark cyan</span>: BPU subgraph; <span class="cpu">gray</span>: CPU node.
CPU nodes: {cpu}</p>
<img src="{html.escape(picture)}" alt="structure of {name}">"""
    return _page(f"hb_perf {rm.name}", body)


def _shape(shape: list[int] | None) -> str:
    return "x".join("?" if d is None or d < 0 else str(d) for d in shape) if shape else "?"


def _subgraph_page(rm: RuntimeModel, sub: SubgraphCost, layers: bool) -> str:
    summary = _table(
        ["Subgraph", "Calculation Load (OPpf)", "Loaded Bytes per Frame", "Stored Bytes per Frame",
         "DDR Occupation (Mbpf)", "Latency (ms)"],
        [[html.escape(sub.name), f"{sub.ops:.0f}", f"{sub.loaded_bytes}", f"{sub.stored_bytes}",
          f"{sub.ddr_mb:.3f}", f"{sub.latency_ms:.3f}"]],
    )
    io = (f"<p>Inputs: {html.escape(', '.join(sub.inputs))}<br>"
          f"Outputs: {html.escape(', '.join(sub.outputs))}</p>")
    if layers:
        rows = [[html.escape(x.name), html.escape(x.op_type), _shape(x.output_shape), _shape(x.aligned_shape),
                 f"{x.macs:.0f}", f"{x.ops:.0f}", f"{x.weight_bytes}", f"{x.loaded_bytes}", f"{x.stored_bytes}",
                 f"{x.compute_ms:.5f}", f"{x.memory_ms:.5f}", f"{x.latency_ms:.5f}",
                 f"{x.start_ms:.5f} - {x.start_ms + x.latency_ms:.5f}", x.bound] for x in sub.layers]
        detail = "<h2>Layer Details</h2>" + _table(
            ["Layer", "Type", "Original Output Shape", "Aligned Output Shape", "MACs", "OPs", "Weight Bytes",
             "Loaded Bytes", "Stored Bytes", "Compute (ms)", "DDR (ms)", "Latency (ms)", "Active Time Span (ms)",
             "Bound"], rows, numeric_from=4)
    else:
        detail = ("<p>No per-layer perf info: build the model with "
                  "<code>compiler_parameters.debug: True</code> to see Layer Details.</p>")
    body = f"<h1>{html.escape(sub.name)}</h1>\n<p>Model: {html.escape(rm.name)}</p>\n{summary}\n{io}\n{detail}"
    return _page(sub.name, body)
