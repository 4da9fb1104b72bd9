#!/usr/bin/env bash
# Step 4: find the text lines of scikit-image's page() picture with the float and the
# quantized model, draw both sets of boxes into a PNG and compare them.
set -euo pipefail
cd "$(dirname "$0")"
source ../common.sh

python postprocess.py --out "$OUT" "$@"
