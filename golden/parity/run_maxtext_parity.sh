#!/usr/bin/env bash
# golden/parity/run_maxtext_parity.sh [CONFIG] — olmoref's weights in MaxText's own Orbax checkpoint, loaded by MaxText.
#
# Dumps a one-step parity bundle with `olmoref parity-dump` and checks it with maxtext_parity.py: the weights go through
# MaxText's own converter into Orbax (golden/replay/maxtext_export.py), MaxText's from_pretrained loads them into its
# Olmo 3 model, and its logits and step-0 loss must be olmoref's. Then, in the same process, two negative controls,
# each of which must fail a gate: MaxText's window one key wider, and layer 0's q_norm scaled by 1.01 before export.
# MaxText's Olmo 3 layer cycle is three sliding-window layers and a global one, so configs/parity.toml (three layers,
# [16, 16, -1]) runs with a fourth layer: [16, 16, 16, -1] on 48-token instances.
#
# Environment: OLMOREF_BIN (default build/olmoref), OLMOREF_MAXTEXT_VENV, OLMOREF_THREADS (parity-dump --threads),
# OLMOREF_PARITY_REPORT (where to write the JSON report), OLMOREF_KEEP_BUNDLE=1 (keep the bundle even on success).
# Exit: 0 parity and both controls failed as they must; 1 a gate failed or a control passed; 2 usage errors, a
# malformed bundle or a crash; 77 "SKIPPED: maxtext parity: ..." when MaxText's environment cannot be made.
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$root" || exit 2
source "$here/venv.sh"

config="${1:-configs/parity.toml}"
bin="${OLMOREF_BIN:-build/olmoref}"
skip() { echo "SKIPPED: maxtext parity: $1"; exit 77; }
olmoref_ensure_maxtext_venv run_maxtext_parity
py="$OLMOREF_MAXTEXT_VENV/bin/python"
olmoref_need_bin_and_config run_maxtext_parity "pass a config file (e.g. configs/parity.toml)"

steps=1
checker_args=(--with-controls)
olmoref_dump_and_check run_maxtext_parity maxtext_parity.py --config "$config" --set model.n_layers=4 \
  --set 'model.swa_pattern=[16,16,16,-1]'
