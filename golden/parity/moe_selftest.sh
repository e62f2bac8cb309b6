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

py="$OLMOREF_OLMO_CORE_VENV/bin/python"
required="import torch, safetensors, numpy; import olmo_core.nn.moe, olmo_core.nn.transformer, olmo_core.data.utils"
if [ ! -x "$py" ] || ! "$py" -c "$required" > /dev/null 2>&1; then
  echo "SKIPPED: golden-parity-moe-selftest: ai2-olmo-core is not installed in $OLMOREF_OLMO_CORE_VENV (bash tools/setup_python.sh)"
  exit 77
fi
export OMP_NUM_THREADS="${OLMOREF_PEER_THREADS:-2}"
exec "$py" "$here/moe_selftest.py" "$@"
