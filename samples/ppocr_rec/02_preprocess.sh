#!/usr/bin/env bash
# Step 2: calibration data. Cuts text lines out of pictures bundled with scikit-image
# and prepares them as the model's input, one file each.
# Extra arguments go to preprocess.py, e.g. --read_mode opencv (needs OpenCV).
set -euo pipefail
cd "$(dirname "$0")"
source ../common.sh

python preprocess.py --out "$OUT" "$@"
