"""Run many configurations over the samples and score them against the float model.

Samples are the outer loop: one float pass per sample (kept only while that sample
is evaluated), then every configuration on it. The models here have a fixed batch
of 1, so samples run one by one. A score is the mean over samples of the metric,
itself the mean over the observed tensors.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

import numpy as np
from tqdm import tqdm

from hbtools.debug.board import Switchboard
from hbtools.debug.data import Sample
from hbtools.metrics import METRICS

Config = frozenset[str]
# Called with (configuration index, float values, quantized values) of the observed tensors.
Visitor = Callable[[int, list[np.ndarray], list[np.ndarray]], None]


def sweep(board: Switchboard, samples: Sequence[Sample], configs: Sequence[Config], visit: Visitor,
          desc: str) -> None:
    bar = tqdm(total=len(samples) * len(configs), desc=desc, unit="run", disable=not sys.stderr.isatty(),
               leave=False)
    for sample in samples:
        cache = board.float_pass(sample)
        reference = [cache[t] for t in board.observe]
        for k, config in enumerate(configs):
            visit(k, reference, board.run(sample, cache, config))
            bar.update()
    bar.close()


def scores(board: Switchboard, samples: Sequence[Sample], configs: Sequence[Config], metrics: Sequence[str],
           desc: str) -> list[dict[str, float]]:
    """Per configuration, each metric between its outputs and the float outputs."""
    unique = list(dict.fromkeys(configs))  # nodes with the same switches share one run
    sums = [dict.fromkeys(metrics, 0.0) for _ in unique]

    def visit(k: int, reference: list[np.ndarray], got: list[np.ndarray]) -> None:
        for m in metrics:
            sums[k][m] += float(np.mean([METRICS[m](r, g) for r, g in zip(reference, got, strict=True)]))

    sweep(board, samples, unique, visit, desc)
    by_config = {c: {m: v / len(samples) for m, v in s.items()} for c, s in zip(unique, sums, strict=True)}
    return [by_config[c] for c in configs]


def tensor_values(board: Switchboard, samples: Sequence[Sample], quantized: Config) -> tuple[
        dict[str, list[np.ndarray]], dict[str, list[np.ndarray]]]:
    """The observed tensors per sample in the float model and with ``quantized`` enabled."""
    floats: dict[str, list[np.ndarray]] = {t: [] for t in board.observe}
    quants: dict[str, list[np.ndarray]] = {t: [] for t in board.observe}

    def visit(_: int, reference: list[np.ndarray], got: list[np.ndarray]) -> None:
        for t, r, g in zip(board.observe, reference, got, strict=True):
            floats[t].append(r)
            quants[t].append(g)

    sweep(board, samples, [quantized], visit, "distributions")
    return floats, quants
