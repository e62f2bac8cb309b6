#!/usr/bin/env bash
# Creates (or completes) the Python environments, before any test runs: the parity, replay, Hugging Face and
# Megatron checks' venv, and OLMo-core's own (it pins an older torch). Tests that find one missing skip, and in CI a
# skip for something installable is a failure.
set -uo pipefail
cd "$(dirname "$0")/.."
source golden/parity/venv.sh
skip() { echo "setup_python: $*" >&2; exit 1; }
olmoref_ensure_venv setup_python
echo "setup_python: $py ready"
olmoref_ensure_olmo_core_venv setup_python
echo "setup_python: $OLMOREF_OLMO_CORE_VENV/bin/python ready (ai2-olmo-core)"
