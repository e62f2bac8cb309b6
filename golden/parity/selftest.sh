#!/usr/bin/env bash
# golden-parity-selftest: run selftest.py with the parity venv, or skip (exit 77) when there is none.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/venv.sh"
olmoref_venv_python_or_skip
OMP_NUM_THREADS="${OLMOREF_PEER_THREADS:-2}" exec "$py" "$here/selftest.py" "$@"
