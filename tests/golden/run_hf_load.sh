#!/usr/bin/env bash
# golden-hf-load: export a tiny checkpoint with our C++ writer and load it with transformers' Olmo3ForCausalLM.
# Usage: run_hf_load.sh EXPORTER CHECK_SCRIPT. Exits 77 (skip) when the Python environment is absent; it never
# creates one (run golden/parity/run_parity.sh for that).
set -euo pipefail
exporter="$1"
check="$2"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/../../golden/parity/venv.sh"
py="$(olmoref_venv_python)"
if [ -z "$py" ]; then
  echo "SKIPPED: torch/transformers not available (no usable venv at $OLMOREF_VENV; run golden/parity/run_parity.sh once to create it)"
  exit 77
fi
tmp="$(mktemp -d "${TMPDIR:-/tmp}/olmoref-hf-load.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
"$exporter" "$tmp/hf"
OMP_NUM_THREADS="${OLMOREF_PEER_THREADS:-2}" "$py" "$check" "$tmp/hf"
