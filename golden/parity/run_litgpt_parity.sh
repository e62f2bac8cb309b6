#!/usr/bin/env bash
# golden/parity/run_litgpt_parity.sh [CONFIG] — model-level parity with litgpt's own model code.
#
# Dumps a one-step parity bundle with `olmoref parity-dump` and checks it with litgpt_parity.py: litgpt.model.GPT
# (OLMo-2 config plus its sliding window, weights through litgpt's copy_weights_olmo2) must give our step-1 logits,
# loss and every gradient. Then, in the same process, two negative controls, each of which must fail a gate, or the
# check could not tell a difference at all:
#   drop-window  litgpt built without its sliding window (every layer full attention);
#   q-norm       layer 0's q_norm weight scaled by 1.01 before litgpt's converter reads it.
#
# Environment: OLMOREF_BIN (default build/olmoref), OLMOREF_VENV, OLMOREF_THREADS (parity-dump --threads),
# OLMOREF_PEER_THREADS (torch's CPU threads, default 2), OLMOREF_PARITY_REPORT (where to write the JSON report of
# the real check), OLMOREF_KEEP_BUNDLE=1 (keep the bundle directory even on success).
# Exit: 0 parity and both controls failed as they must; 1 a gate failed or a control passed; 2 usage errors, a
# malformed bundle or a crash; 77 "SKIPPED: litgpt ..." when litgpt cannot be imported from the venv (never a pass).
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$root" || exit 2
source "$here/venv.sh"

config="${1:-configs/parity.toml}"
bin="${OLMOREF_BIN:-build/olmoref}"

py="$OLMOREF_VENV/bin/python"
if [ ! -x "$py" ] || ! "$py" -c "import litgpt.model; from litgpt.scripts.convert_hf_checkpoint import copy_weights_olmo2" >/dev/null 2>&1; then
  echo "SKIPPED: litgpt parity: litgpt 0.5.13 cannot be imported from $OLMOREF_VENV (bash tools/setup_python.sh)"
  exit 77
fi
olmoref_need_bin_and_config run_litgpt_parity "pass a config file (e.g. configs/parity.toml)"

steps=1
# The check and its negative controls in one process: importing torch and lightning twice would double the time.
checker_args=(--with-controls)
olmoref_dump_and_check run_litgpt_parity litgpt_parity.py --config "$config"
