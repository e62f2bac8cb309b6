#!/usr/bin/env bash
# golden-parity-selftest: run selftest.py with the parity venv, or skip (exit 77) when there is none.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/venv.sh"
py="$(olmoref_venv_python)"
if [ -z "$py" ]; then
  echo "SKIPPED: torch/transformers not available (no usable venv at $OLMOREF_VENV; run golden/parity/run_parity.sh once to create it)"
  exit 77
fi
OMP_NUM_THREADS="${OLMOREF_PEER_THREADS:-2}" exec "$py" "$here/selftest.py" "$@"
