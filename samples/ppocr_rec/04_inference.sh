#!/usr/bin/env bash
# Step 4: read the two words of the title of scikit-image's page() picture with the
# float and the quantized model, and compare the decoded text.
set -euo pipefail
cd "$(dirname "$0")"
source ../common.sh

python postprocess.py --out "$OUT" "$@"
