#!/usr/bin/env bash
# Step 1: can the float model be converted for RDK X5 (bayes-e), and where does each
# node run? Prints the checker's node table; the log is in build/samples/ppocr_cls/.
set -euo pipefail
cd "$(dirname "$0")"
source ../common.sh

model="$(model_path cls)"
cd "$OUT"  # hb_mapper writes hb_mapper_checker.log into the current folder
hb_mapper checker --model-type onnx --march bayes-e --model "$model" --input-shape x 1x3x48x192
echo "checker log: $OUT/hb_mapper_checker.log"
