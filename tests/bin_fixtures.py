"""Small ``.bin`` models for the simulator and tool tests, built by the real pipeline in well under a second."""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builders import MODELS, FloatModel, make_project
from click.testing import CliRunner, Result

from hbtools.cli import hb_perf, hrt_model_exec
from hbtools.log import setup
from hbtools.pipeline.runner import makertbin
from hbtools.runtime.binfile import read_bin
from hbtools.runtime.runtime_model import open_model
from hbtools.runtime.structure import analyse, tensor_info
from hbtools.tools.structure_plot import boxes_and_arrows


@dataclass
class Built:
    bin: Path
    quantized: Path
    name: str


def build_bin(root: Path, model: str | FloatModel = "resnet_like", *, march: str = "bayes-e",
              prefix: str = "small", **groups: dict[str, Any]) -> Built:
    """makertbin on one of builders.MODELS (or a FloatModel), with ``{group: {key: value}}`` config overrides."""
    project = make_project(root, MODELS[model]() if isinstance(model, str) else model, march=march)
    groups["model_parameters"] = {"output_model_file_prefix": prefix, **groups.get("model_parameters", {})}
    project.write(**groups)
    with logger_restored():
        setup(None, console_level=logging.WARNING)
        paths = makertbin(project.config_path, "onnx")
    return Built(paths["bin"], paths["quantized"], prefix)


def invoke(command: Any, args: list[str]) -> Result:
    """Run a click command in-process; stdout (log lines included) is ``result.output``."""
    with logger_restored():
        return CliRunner().invoke(command, [str(a) for a in args], catch_exceptions=False)


@contextlib.contextmanager
def logger_restored() -> Iterator[None]:
    """Undo what a tool's ``hbtools.log.setup`` did to the ``hbtools`` logger: its handlers write to
    streams that close with the command, and it stops propagation that pytest's caplog relies on."""
    logger = logging.getLogger("hbtools")
    handlers, level, propagate = list(logger.handlers), logger.level, logger.propagate
    try:
        yield
    finally:
        for h in logger.handlers:
            if h not in handlers:
                h.close()
        logger.handlers[:] = handlers
        logger.setLevel(level)
        logger.propagate = propagate


def subgraph_counts(bin_path: Path, folder: Path) -> dict[str, int]:
    """The number of BPU subgraphs as each .bin tool reports it (hb_perf and the profiler write into ``folder``)."""
    rm = open_model(bin_path)
    structure = analyse(rm.graph, rm.bin.partition, tensor_info(rm.graph))
    perf = invoke(hb_perf.main, [bin_path])
    assert perf.exit_code == 0, perf.output
    pages = list((folder / "hb_perf_result" / rm.name).glob(f"{rm.name}_subgraph_*.json"))
    profile = invoke(hrt_model_exec.main, ["perf", f"--model_file={bin_path}", "--frame_count=1",
                                           f"--profile_path={folder / 'prof'}"])
    assert profile.exit_code == 0, profile.output
    latency = json.loads((folder / "prof" / "profiler.log").read_text())["model_latency"]
    boxes, _ = boxes_and_arrows(rm.graph, structure, rm.name)
    return {
        "bin": len(read_bin(bin_path).model().partition["subgraphs"]),
        "hb_perf": len(pages),
        "profiler": len([k for k in latency if k.startswith("BPU_")]),
        "picture": len([b for b in boxes if b.kind == "bpu"]),
        "structure": len(structure.subgraphs),
    }


def mutate_bytes(data: bytes, ops: list[tuple[str, int, int]]) -> bytes:
    """Apply (op, position, value) edits: flip/set a byte, cut the tail, insert or delete bytes."""
    b = bytearray(data)
    for op, pos, val in ops:
        if not b:
            break
        pos %= len(b)
        if op == "flip":
            b[pos] ^= val
        elif op == "set":
            b[pos] = val
        elif op == "cut":
            del b[pos:]
        elif op == "insert":
            b[pos:pos] = bytes([val])
        else:
            del b[pos : pos + min(val, 40)]
    return bytes(b)
