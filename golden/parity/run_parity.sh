#!/usr/bin/env bash
# golden/parity/run_parity.sh [CONFIG] — the one command for Hugging Face parity.
#
# Dumps a parity bundle with `olmoref parity-dump` (step-0 weights, batches, our step-1 logits and gradients, our
# loss trace) and checks it against transformers' Olmo3ForCausalLM with hf_parity.py. The Python environment lives
# at ${OLMOREF_VENV:-$HOME/.cache/olmoref/venv}, outside the clone; it is created on first use.
#
# Environment: OLMOREF_BIN (default build/olmoref), OLMOREF_VENV, OLMOREF_PARITY_STEPS (default 10),
# OLMOREF_THREADS (passed to parity-dump --threads), OLMOREF_PEER_THREADS (torch's CPU threads, default 2), OLMOREF_PARITY_REPORT (where to write the JSON report),
# OLMOREF_KEEP_BUNDLE=1 (keep the bundle directory even on success).
# Exit: hf_parity.py's status (0 parity, 1 a gate failed, 2 malformed bundle); 77 with a line starting
# "SKIPPED: parity" when the Python packages cannot be installed (never reported as a pass); 2 for usage errors.
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$root" || exit 2
source "$here/venv.sh"

config="${1:-configs/parity.toml}"
bin="${OLMOREF_BIN:-build/olmoref}"
steps="${OLMOREF_PARITY_STEPS:-10}"

skip() {
  echo "SKIPPED: parity: $1"
  exit 77
}

olmoref_ensure_venv run_parity

olmoref_need_bin_and_config run_parity "pass a config file (e.g. configs/parity.toml)"

olmoref_dump_and_check run_parity hf_parity.py --config "$config"
