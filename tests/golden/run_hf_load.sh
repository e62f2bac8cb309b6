#!/usr/bin/env bash
# golden-hf-load: export a tiny checkpoint with our C++ writer and load it with transformers' Olmo3ForCausalLM.
# Usage: run_hf_load.sh EXPORTER CHECK_SCRIPT. Exits 77 (skip) when the Python environment is absent; it never
# creates one (run golden/parity/run_parity.sh for that).
set -euo pipefail
exporter="$1"
check="$2"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/../../golden/parity/venv.sh"
olmoref_venv_python_or_skip
tmp="$(mktemp -d "${TMPDIR:-/tmp}/olmoref-hf-load.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
"$exporter" "$tmp/hf"
OMP_NUM_THREADS="${OLMOREF_PEER_THREADS:-2}" "$py" "$check" "$tmp/hf"
