"""The "BIN Model Structure" picture of hb_perf: BPU subgraphs and CPU nodes as a flow chart.

Each BPU subgraph is one dark cyan box, each CPU node a gray box, model inputs
and outputs white boxes; arrows follow the tensors between them. Boxes are placed
in layers by longest path from the inputs, ordered within a layer by the mean
position of their predecessors, which keeps chains straight.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from matplotlib.patches import FancyBboxPatch
from onnx import ModelProto

from hbtools.outputs import replace_atomically
from hbtools.plotting import plt
from hbtools.runtime.structure import Structure

BPU_COLOUR = "#008b8b"  # dark cyan, as in the vendor's pictures
CPU_COLOUR = "#a9a9a9"
IO_COLOUR = "#ffffff"
BOX_W, BOX_H, GAP_X, GAP_Y = 2.6, 0.55, 0.5, 0.5
MAX_LABEL = 30  # characters per line of a box label
MAX_LINES = 4  # lines per box label
LANE = 0.15  # spacing of the vertical lanes that arrows skipping rows run in
# A model with hundreds of CPU nodes (an LSTM unrolled by its exporter, on the CPU) drew a 16225x20152 picture:
# 1.5 GB and a minute to write. Its boxes' text is then too small to read anyway; the shape of the graph shows.
MAX_SIDE = 30000  # pixels
MAX_PIXELS = 32_000_000


@dataclass
class Box:
    key: str
    label: str
    kind: str  # input | bpu | cpu | output


def boxes_and_arrows(graph: ModelProto, structure: Structure,
                     model_name: str) -> tuple[list[Box], set[tuple[str, str]]]:
    nodes = list(graph.graph.node)
    inits = {t.name for t in graph.graph.initializer}
    boxes: dict[str, Box] = {}
    owner: dict[str, str] = {}  # tensor -> box that produces it
    for vi in graph.graph.input:
        if vi.name not in inits:
            boxes[f"in:{vi.name}"] = Box(f"in:{vi.name}", vi.name, "input")
            owner[vi.name] = f"in:{vi.name}"
    for i, node in enumerate(nodes):
        k = structure.subgraph_of.get(i)
        if k is None:
            key = f"cpu:{i}"
            boxes[key] = Box(key, f"{node.name or node.op_type}\n({node.op_type})", "cpu")
        else:
            key = f"bpu:{k}"
            size = len(structure.subgraphs[k])
            boxes.setdefault(key, Box(key, f"{structure.subgraph_name(model_name, k)}\n({size} BPU nodes)", "bpu"))
        for o in node.output:
            owner[o] = key
    arrows: set[tuple[str, str]] = set()
    for i, node in enumerate(nodes):
        k = structure.subgraph_of.get(i)
        dst = f"cpu:{i}" if k is None else f"bpu:{k}"
        arrows.update((owner[t], dst) for t in node.input if t in owner and owner[t] != dst)
    for vi in graph.graph.output:
        boxes[f"out:{vi.name}"] = Box(f"out:{vi.name}", vi.name, "output")
        if vi.name in owner:
            arrows.add((owner[vi.name], f"out:{vi.name}"))
    return list(boxes.values()), arrows


def _layout(boxes: list[Box], arrows: set[tuple[str, str]]) -> dict[str, tuple[float, float]]:
    """Centre of every box: one row per layer of the longest path from the inputs."""
    preds: dict[str, list[str]] = {b.key: [] for b in boxes}
    for a, b in arrows:
        preds[b].append(a)
    depth: dict[str, int] = {}
    for box in boxes:  # boxes come in graph (topological) order, inputs first, outputs last
        depth[box.key] = 1 + max((depth.get(p, 0) for p in preds[box.key]), default=-1)
    layers: dict[int, list[str]] = {}
    for box in boxes:
        layers.setdefault(depth[box.key], []).append(box.key)
    pos: dict[str, tuple[float, float]] = {}
    for d in sorted(layers):
        keys = layers[d]
        centre = {k: sum(pos[p][0] for p in preds[k] if p in pos) / max(1, sum(p in pos for p in preds[k]))
                  for k in keys}
        keys.sort(key=lambda k: centre[k])
        width = len(keys) * (BOX_W + GAP_X)
        for j, k in enumerate(keys):
            pos[k] = (j * (BOX_W + GAP_X) - width / 2 + BOX_W / 2, -d * (BOX_H + GAP_Y))
    return pos


def _short(label: str) -> str:
    """Long names wrap onto more lines (a box holds MAX_LINES); only what is beyond them is cut."""
    lines = [line[k:k + MAX_LABEL] for line in label.split("\n") for k in range(0, max(len(line), 1), MAX_LABEL)]
    if len(lines) > MAX_LINES:  # keep the last line: it says what the box is (the type, the node count)
        lines = [*lines[:MAX_LINES - 2], lines[MAX_LINES - 2][:-1] + "…", lines[-1]]
    return "\n".join(lines)


def draw(graph: ModelProto, structure: Structure, model_name: str, path: Path) -> Path:
    boxes, arrows = boxes_and_arrows(graph, structure, model_name)
    pos = _layout(boxes, arrows)
    row = BOX_H + GAP_Y
    short = sorted((a, b) for a, b in arrows if pos[a][1] - pos[b][1] <= row + 1e-6)
    long = sorted(((a, b) for a, b in arrows if (a, b) not in set(short)), key=lambda e: pos[e[0]][1] - pos[e[1]][1])
    xs = [p[0] for p in pos.values()]
    ys = [p[1] for p in pos.values()]
    right = max(xs) + BOX_W / 2 + GAP_X / 2 + LANE * len(long)
    span_x = right - min(xs) + BOX_W / 2 + GAP_X
    span_y = max(ys) - min(ys) + BOX_H + 2 * GAP_Y
    fig = plt.figure(figsize=(max(4.0, span_x * 1.1), max(3.0, span_y * 1.1)))
    ax = fig.add_axes([0, 0, 1, 1])
    ax.set_xlim(min(xs) - BOX_W / 2 - GAP_X, right + GAP_X / 2)
    ax.set_ylim(min(ys) - BOX_H / 2 - GAP_Y, max(ys) + BOX_H / 2 + GAP_Y)
    ax.axis("off")
    style = {"arrowstyle": "-|>", "color": "#404040", "lw": 0.8}
    for a, b in short:
        (x1, y1), (x2, y2) = pos[a], pos[b]
        ax.annotate("", xy=(x2, y2 + BOX_H / 2), xytext=(x1, y1 - BOX_H / 2), arrowprops=style)
    for lane, (a, b) in enumerate(long):
        # rows skipped: out of the right side, down a lane of its own right of every box, back in from the right
        (x1, y1), (x2, y2) = pos[a], pos[b]
        between = [x for k, (x, y) in pos.items() if y2 <= y <= y1]
        x_lane = max(between) + BOX_W / 2 + GAP_X / 2 + LANE * lane
        ax.plot([x1 + BOX_W / 2, x_lane, x_lane], [y1, y1, y2], color="#404040", lw=0.8)
        ax.annotate("", xy=(x2 + BOX_W / 2, y2), xytext=(x_lane, y2), arrowprops=style)
    fill = {"bpu": BPU_COLOUR, "cpu": CPU_COLOUR, "input": IO_COLOUR, "output": IO_COLOUR}
    for box in boxes:
        x, y = pos[box.key]
        ax.add_patch(FancyBboxPatch((x - BOX_W / 2, y - BOX_H / 2), BOX_W, BOX_H,
                                    boxstyle="round,pad=0.02,rounding_size=0.08",
                                    facecolor=fill[box.kind], edgecolor="#303030", linewidth=0.8))
        ax.text(x, y, _short(box.label), ha="center", va="center", fontsize=7,
                color="white" if box.kind == "bpu" else "black")
    path.parent.mkdir(parents=True, exist_ok=True)
    # about 100 px per inch, fewer where the picture would be longer than MAX_SIDE or larger than MAX_PIXELS
    width, height = fig.get_size_inches()
    dpi = min(100.0, MAX_SIDE / max(width, height), (MAX_PIXELS / (width * height)) ** 0.5)
    try:  # through a temp file: a full disk leaves no cut picture (an OSError naming ``path``)
        replace_atomically(path, lambda fh: fig.savefig(fh, format="png", dpi=dpi))
    finally:
        plt.close(fig)
    return path
