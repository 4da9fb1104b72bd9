"""Interrupt makertbin (SIGINT and SIGKILL) at random moments of a `default` run on PP-OCR cls.

A conversion is a transaction (SPEC §6): whatever moment it is interrupted at, the
previous artefact set (four ONNX files, the .bin, the calibration_data dump) must stay
byte-identical, and the next run must complete a full new set.

Two config variants whose artefacts differ in every file (mean_value 127.5 / 127.0;
50 / 45 calibration samples, so the dumps differ too) alternate: each trial interrupts
one variant while the other's set is in place, checks that set byte for byte, then
runs the interrupted variant again to completion and checks its set against an
uninterrupted reference run.

    python scripts/fetch_models.py && python scripts/make_calibration_data.py --model cls
    python benchmarks/interrupt_makertbin.py --moments 20 --json benchmarks/results/interrupt_makertbin.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
STAGING = ".hbtools_staging"


def snapshot(folder: Path) -> dict[str, str]:
    """Every artefact under ``folder`` (hidden transaction files aside) with its hash."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and not p.relative_to(folder).parts[0].startswith(".")}


def variants(work: Path) -> dict[str, Path]:
    base = yaml.safe_load((REPO / "configs" / "ppocr_cls.yaml").read_text())
    cal = REPO / "build" / "calibration" / "ppocr_cls"
    subset = work / "cal_subset"
    subset.mkdir()
    for p in sorted(cal.iterdir())[:45]:
        (subset / p.name).symlink_to(p)
    out = {}
    for name, mean, folder in (("A", "127.5", cal), ("B", "127.0", subset)):
        config = yaml.safe_load(yaml.safe_dump(base))
        model = REPO / "build" / "models" / "ch_ppocr_mobile_v2.0_cls_infer.onnx"
        config["model_parameters"]["onnx_model"] = str(model)
        config["model_parameters"]["working_dir"] = str(work / "model_output")
        config["model_parameters"]["debug_mode"] = "dump_calibration_data"
        config["input_parameters"]["mean_value"] = mean
        config["calibration_parameters"]["cal_data_dir"] = str(folder)
        path = work / f"cls_{name}.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        out[name] = path
    return out


def command(config: Path) -> list[str]:
    return [sys.executable, "-c", "from hbtools.cli.hb_mapper import main; main()", "makertbin",
            "--config", str(config), "--model-type", "onnx"]


def run_full(config: Path, work: Path) -> tuple[int, float]:
    start = time.perf_counter()
    proc = subprocess.run(command(config), cwd=work, capture_output=True, text=True)
    if proc.returncode:
        print(proc.stdout[-3000:], file=sys.stderr)
    return proc.returncode, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--moments", type=int, default=20, help="random moments per signal")
    parser.add_argument("--seed", type=int, default=14)
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        configs = variants(work)
        out_dir = work / "model_output"
        reference: dict[str, dict[str, str]] = {}
        durations = []
        for name in ("B", "A"):  # ends with A's set in place
            code, seconds = run_full(configs[name], work)
            if code:
                raise SystemExit(f"reference run {name} failed")
            reference[name] = snapshot(out_dir)
            durations.append(seconds)
        models = [k for k in reference["A"] if "/" not in k]
        assert all(reference["A"][k] != reference["B"][k] for k in models), "the variants' artefacts must differ"
        assert len(reference["A"]) != len(reference["B"]), "the variants' dumps must differ"
        full = max(durations)
        current = "A"
        trials = []
        signals = [sig for sig in ("SIGINT", "SIGKILL") for _ in range(args.moments)]
        rng.shuffle(signals)
        for k, sig in enumerate(signals):
            # A moment within the last full run's duration (the machine's load changes over time).
            delay = rng.uniform(0.0, full)
            target = "B" if current == "A" else "A"
            proc = subprocess.Popen(command(configs[target]), cwd=work, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL)
            time.sleep(delay)
            if proc.poll() is None:
                proc.send_signal(getattr(signal, sig))
            code = proc.wait()
            after = snapshot(out_dir)
            # Either the previous set is untouched, or the signal came after the commit point and
            # the new set is whole (e.g. a SIGINT during interpreter shutdown); anything else is mixed.
            if after == reference[target]:
                outcome, intact = "committed before the signal took effect", True
            else:
                outcome, intact = "interrupted", after == reference[current]
            leftover = (out_dir / STAGING).exists()
            next_code, full = run_full(configs[target], work)
            next_ok = next_code == 0 and snapshot(out_dir) == reference[target] and not (out_dir / STAGING).exists()
            current = target
            trial = {"trial": k, "signal": sig, "delay_s": round(delay, 2), "exit_code": code, "outcome": outcome,
                     "set_intact": intact, "staging_left_by_kill": leftover, "next_run_complete": next_ok}
            trials.append(trial)
            print(json.dumps(trial), flush=True)
    interrupted = [t for t in trials if t["outcome"] == "interrupted"]
    committed = [t for t in trials if t["outcome"] != "interrupted"]
    result = {
        "model": "PP-OCR cls (ch_ppocr_mobile_v2.0_cls), calibration_type default, dump_calibration_data",
        "last_full_run_s": round(full, 1),
        "trials": len(trials),
        "interrupted": len(interrupted),
        "committed_before_the_signal": len(committed),
        "by_signal": {s: sum(t["signal"] == s and t["outcome"] == "interrupted" for t in trials)
                      for s in ("SIGINT", "SIGKILL")},
        "previous_set_intact": sum(t["set_intact"] for t in trials),
        "next_run_complete": sum(t["next_run_complete"] for t in trials),
        "all_passed": all(t["set_intact"] and t["next_run_complete"] for t in trials),
        "details": trials,
    }
    text = json.dumps(result, indent=1)
    print(json.dumps({k: v for k, v in result.items() if k != "details"}, indent=1))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")
    if not result["all_passed"]:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
