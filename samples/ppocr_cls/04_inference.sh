#!/usr/bin/env bash
# Step 4: run the float and the quantized model on a text line from scikit-image's
# page() picture, upright and upside down, and compare their answers.
set -euo pipefail
cd "$(dirname "$0")"
source ../common.sh

python postprocess.py --out "$OUT" "$@"
