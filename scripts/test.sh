#!/usr/bin/env bash
# Install hbtools with its test extras and run the whole test suite (unit + integration).
# Integration tests fetch the sample models and make their data themselves.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
python -m pip install -q -e ".[test]"
# Two workers (pytest-xdist) keep the suite within 20 minutes on 2 cores; tests/conftest.py keeps the
# integration tests together in one of them (they share the fetched models and working_dirs).
python -m pytest -q -n auto --maxprocesses 2 "$@"
