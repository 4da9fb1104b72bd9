"""Whether two checkouts of hbtools return the same sensitivities: for a speed change that must not change a number.

Runs ``get_sensitivity_of_nodes`` for each node type in a fresh process per checkout (``PYTHONPATH``
set to it), on the same calibrated model and dumped samples, and compares what it returns: the
order of the nodes and every value as the returned string. Exit status 0 when all are equal.
A makertbin ``working_dir`` with ``debug_mode: dump_calibration_data`` (``benchmarks/debugger_speed.py
--work-dir W`` leaves one per model in ``W/<model>/hbtools``) is the input:

    python benchmarks/debugger_equality.py --old /tmp/old --new . --working-dir W/det/hbtools \\
        --node-types weight,activation --data-num 4

Each run's wall and CPU time are printed too; they are indicative only (one run each, in turn).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

RUN = """
import json, sys, time
import horizon_nn.debug as dbg
model, data, node_type, data_num = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
start, cpu = time.perf_counter(), time.process_time()
result = dbg.get_sensitivity_of_nodes(model_or_file=model, calibrated_data=data, node_type=node_type,
                                      data_num=data_num or None)
print(json.dumps({"order": list(result), "values": result, "wall_s": time.perf_counter() - start,
                  "cpu_s": time.process_time() - cpu}))
"""


def sensitivity(checkout: Path, working_dir: Path, node_type: str, data_num: int) -> dict:
    """What ``get_sensitivity_of_nodes`` returns with ``checkout`` first on the path (in a process of its own)."""
    model = next(working_dir.glob("*_calibrated_model.onnx"))
    env = {**os.environ, "PYTHONPATH": str(checkout.resolve())}
    proc = subprocess.run([sys.executable, "-c", RUN, str(model), str(working_dir / "calibration_data"), node_type,
                           str(data_num)], env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{checkout}: {node_type} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def differences(old: dict, new: dict) -> list[str]:
    """Each way ``new`` differs from ``old``: the node order, then the values (as returned, strings)."""
    found = []
    if old["order"] != new["order"]:
        first = next((i for i, (a, b) in enumerate(zip(old["order"], new["order"], strict=False)) if a != b),
                     min(len(old["order"]), len(new["order"])))
        found.append(f"order differs from rank {first + 1} on")
    for node, metrics in old["values"].items():
        for metric, value in metrics.items():
            other = new["values"].get(node, {}).get(metric)
            if other != value:
                found.append(f"{node} {metric}: {value} -> {other}")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", type=Path, required=True, help="the checkout to compare against")
    parser.add_argument("--new", type=Path, required=True, help="the changed checkout")
    parser.add_argument("--working-dir", type=Path, required=True, help="makertbin working_dir with calibration_data")
    parser.add_argument("--node-types", default="weight", help="comma-separated (node,weight,activation)")
    parser.add_argument("--data-num", type=int, default=0, help="samples (0: every dumped one)")
    args = parser.parse_args()
    equal = True
    for node_type in [t.strip() for t in args.node_types.split(",") if t.strip()]:
        old = sensitivity(args.old, args.working_dir, node_type, args.data_num)
        new = sensitivity(args.new, args.working_dir, node_type, args.data_num)
        found = differences(old, new)
        equal &= not found
        print(f"{node_type}: {len(old['order'])} nodes, {'equal' if not found else f'{len(found)} differences'}; "
              f"old {old['wall_s']:.1f} s wall / {old['cpu_s']:.1f} s CPU, new {new['wall_s']:.1f} / "
              f"{new['cpu_s']:.1f} s (load {os.getloadavg()[0]:.2f})")
        for line in found[:20]:
            print("   ", line)
    sys.exit(0 if equal else 1)


if __name__ == "__main__":
    main()
