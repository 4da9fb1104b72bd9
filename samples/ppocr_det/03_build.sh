#!/usr/bin/env bash
# Step 3: convert (calibrate, quantize, compile) with ppocr_det.yaml. Artefacts go to
# build/samples/ppocr_det/model_output/. Needs step 2's calibration data.
set -euo pipefail
cd "$(dirname "$0")"
source ../common.sh

model_path det >/dev/null  # fetch the float model if it is missing
cd "$OUT"  # hb_mapper writes hb_mapper_makertbin.log into the current folder
hb_mapper makertbin --config "$SAMPLE_DIR/ppocr_det.yaml" --model-type onnx
ls -l "$OUT/model_output"
