# Sourced by every sample script after `cd "$(dirname "$0")"` (the sample's folder).
# Sets SAMPLE (the folder's name), REPO (the checkout) and OUT (build/samples/$SAMPLE,
# where every script writes), and defines model_path.

SAMPLE="$(basename "$PWD")"
SAMPLE_DIR="$PWD"
REPO="$(cd ../.. && pwd)"
OUT="$REPO/build/samples/$SAMPLE"
mkdir -p "$OUT"

# model_path cls|det|rec: the float ONNX model, fetched from PyPI (the
# rapidocr_onnxruntime wheel) by scripts/fetch_models.py if it is not there yet.
model_path() {
    local path
    path="$(python "$REPO/scripts/fetch_models.py" | sed -n "s/^$1: //p")"
    if [[ -z "$path" ]]; then
        echo "ERROR could not fetch the $1 model; run: python scripts/fetch_models.py" >&2
        exit 1
    fi
    echo "$path"
}
