"""Where one sensitivity call of the debugger spends its CPU: the board, the float passes, the runs' parts.

Wraps the switchboard's parts to sum, per kind, the thread CPU and wall time of their
onnxruntime runs (over both workers): the float passes, the stages run in switchable form,
the float stages, the float tails; the rest of the sweep is Python around the runs
(metrics, the all-zero check). Thread CPU is less sensitive than wall time to other
processes on the machine, but two workers sharing memory bandwidth still slow each other:
compare with ``--workers 1``.

    python benchmarks/debugger_parts.py --working-dir W/det/hbtools --node-type weight --data-num 4
"""

from __future__ import annotations

import argparse
import collections
import os
import threading
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--working-dir", type=Path, required=True, help="makertbin working_dir with calibration_data")
    parser.add_argument("--node-type", default="weight")
    parser.add_argument("--data-num", type=int, default=4)
    parser.add_argument("--workers", type=int, help="side-by-side runs (default: the debugger's)")
    args = parser.parse_args()

    from hbtools.debug import switchboard as board_module
    from hbtools.debug.data import load_samples
    from hbtools.debug.model import load_calibrated
    from hbtools.debug.sensitivity import measure

    if args.workers:
        board_module.WORKERS = args.workers
    spent: collections.Counter = collections.Counter()
    lock = threading.Lock()
    kinds: dict[int, str] = {}
    run_part = board_module._Part.__call__

    def timed(part: board_module._Part, values: dict) -> None:
        cpu, wall = time.thread_time(), time.perf_counter()
        run_part(part, values)
        with lock:
            kind = kinds.get(id(part), "float stage")
            spent[kind, "cpu"] += time.thread_time() - cpu
            spent[kind, "wall"] += time.perf_counter() - wall
            spent[kind, "runs"] += 1

    board_module._Part.__call__ = timed
    cm = load_calibrated(next(args.working_dir.glob("*_calibrated_model.onnx")))
    samples = load_samples(args.working_dir / "calibration_data", cm, args.data_num)
    cpu, wall = time.process_time(), time.perf_counter()
    board = board_module.shared_switchboard(cm)
    print(f"board: {time.process_time() - cpu:.2f} s CPU, {time.perf_counter() - wall:.2f} s wall, "
          f"{board.stage_count} stages, tails after {sorted(board._tails)}")
    kinds[id(board._float_model)] = "float pass"
    kinds.update({id(p): "tail" for p in board._tails.values()})
    kinds.update({id(p): "switchable stage" for p in board._stages})
    load = os.getloadavg()[0]
    cpu, wall = time.process_time(), time.perf_counter()
    rows = measure(cm, samples, ["cosine-similarity"], args.node_type).rows
    sweep_cpu, sweep_wall = time.process_time() - cpu, time.perf_counter() - wall
    print(f"{args.node_type}: {len(rows)} nodes x {len(samples)} samples, {board.workers} workers: "
          f"{sweep_cpu:.2f} s CPU, {sweep_wall:.2f} s wall (load {load:.2f} -> {os.getloadavg()[0]:.2f})")
    parts_cpu = 0.0
    for kind in ("float pass", "switchable stage", "float stage", "tail"):
        runs = spent[kind, "runs"]
        parts_cpu += spent[kind, "cpu"]
        print(f"  {kind:17s} {spent[kind, 'cpu']:7.2f} s CPU {spent[kind, 'wall']:7.2f} s wall {runs:5d} runs"
              + (f" ({spent[kind, 'cpu'] / runs * 1e3:.1f} ms CPU each)" if runs else ""))
    print(f"  {'the rest':17s} {sweep_cpu - parts_cpu:7.2f} s CPU (Python around the runs, the metrics)")


if __name__ == "__main__":
    main()
