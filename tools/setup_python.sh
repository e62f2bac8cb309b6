#!/usr/bin/env bash
# Creates (or completes) the Python environment the parity, replay and Hugging Face checks use, before any
# test runs: tests that find it missing skip, and in CI a skip for something installable is a failure.
set -uo pipefail
cd "$(dirname "$0")/.."
source golden/parity/venv.sh
skip() { echo "setup_python: $*" >&2; exit 1; }
olmoref_ensure_venv setup_python
echo "setup_python: $py ready"
