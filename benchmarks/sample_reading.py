"""CPU time of reading a config's calibration samples as makertbin reads them (file -> int8 intermediate data).

    python benchmarks/sample_reading.py --config configs/ppocr_det.yaml [--passes 3]

Prints the samples read, wall and process CPU seconds per pass (the best of ``--passes``) and per sample. Session 55
used it on PP-OCRv4 det's 50 calibration files before and after uint8 samples skipped the float64 colour products
(results/session55_measurements.md).
"""

from __future__ import annotations

import argparse
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--passes", type=int, default=3)
    args = parser.parse_args()

    from hbtools.config.loader import load_config
    from hbtools.data.calibration import FolderCalibrationSource

    config = load_config(args.config, "onnx")
    source = FolderCalibrationSource(config.inputs, config.calibration.preprocess_on)
    best = None
    for _ in range(args.passes):
        wall, cpu = time.perf_counter(), time.process_time()
        count = sum(1 for _ in source)
        spent = (time.perf_counter() - wall, time.process_time() - cpu)
        best = spent if best is None or spent[1] < best[1] else best
    print(f"{count} samples: wall {best[0]:.2f} s, CPU {best[1]:.2f} s a pass; "
          f"{1000 * best[1] / max(count, 1):.1f} ms CPU a sample")


if __name__ == "__main__":
    main()
