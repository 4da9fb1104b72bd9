#!/usr/bin/env bash
# Install hbtools with its test extras and run the whole test suite (unit + integration).
# Integration tests fetch the sample models and make their data themselves.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
python -m pip install -q -e ".[test]"
python -m pytest -q "$@"
