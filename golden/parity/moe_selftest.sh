#!/usr/bin/env bash
# golden/parity/moe_selftest.sh [--keep DIR] — self-test of the OLMo-core MoE parity check, no olmoref needed.
#
# Runs moe_selftest.py (its docstring lists the cases: clean bundles OLMo-core computed itself pass, each planted
# defect fails exactly its gate, a misnamed weight is refused) in OLMo-core's venv
# (${OLMOREF_OLMO_CORE_VENV:-$HOME/.cache/olmoref/venv-olmo-core}, tools/setup_python.sh).
# Exit: 0 every case behaved; 1 the comparison misjudged a case; 77 with "SKIPPED: ..." when that venv lacks
# torch / safetensors / ai2-olmo-core (never a pass); 2 usage.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/venv.sh"

olmoref_olmo_core_python_or_skip golden-parity-moe-selftest "$OLMOREF_OLMO_CORE_MOE_REQUIRED"
export OMP_NUM_THREADS="${OLMOREF_PEER_THREADS:-2}"
exec "$py" "$here/moe_selftest.py" "$@"
