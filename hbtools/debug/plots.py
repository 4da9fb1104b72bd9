"""Figures: matplotlib with the Agg backend (no display needed), saved as PNG."""

from __future__ import annotations

import logging
from pathlib import Path

from hbtools import outputs
from hbtools.plotting import plt
from hbtools.runs.transaction import final_path

log = logging.getLogger("hbtools")

DEFAULT_SAVE_DIR = "./debug_result"
DPI = 100


def output_dir(save_dir: str | Path | None) -> Path:
    """``save_dir``, created if needed; ``./debug_result`` when not given."""
    # Checked now, made when the first file is written: a refused argument leaves no folder.
    return outputs.output_dir(DEFAULT_SAVE_DIR if save_dir is None else save_dir, "save_dir", create=False)


def figure(width: float = 10.0, height: float = 6.0, cols: int = 1, *,
           bottom: float = 0.12) -> tuple[plt.Figure, list[plt.Axes]]:
    """Fixed margins (``bottom`` leaves room for rotated node names): tight_layout doubles the save time.

    The top margin holds a two-line title.
    """
    fig, axes = plt.subplots(1, cols, figsize=(width, height), squeeze=False)
    fig.subplots_adjust(left=1.0 / width, right=0.98, top=1.0 - 0.55 / height, bottom=bottom, wspace=0.2)
    return fig, list(axes[0])


def save(fig: plt.Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    try:  # through a temp file: a full disk leaves no cut picture, and the ERROR names the file
        outputs.write_file(path, lambda fh: fig.savefig(fh, format=path.suffix.lstrip(".") or "png", dpi=DPI))
    finally:
        plt.close(fig)
    log.info("saved %s", final_path(path))  # inside runall's staging folder: where it will be
    return path


def node_ticks(ax: plt.Axes, names: list[str], most: int = 30) -> None:
    """Label at most ``most`` evenly spaced positions of a per-node x axis with node names."""
    step = max(1, -(-len(names) // most))
    ticks = list(range(0, len(names), step))
    ax.set_xticks(ticks)
    ax.set_xticklabels([names[i] for i in ticks], rotation=90, fontsize=7)


def title(ax: plt.Axes, first: str, second: str = "") -> None:
    """A node name (often long) on the first line, what the plot shows on the second."""
    ax.set_title(f"{first}\n{second}" if second else first, fontsize=9)
