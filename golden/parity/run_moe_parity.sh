#!/usr/bin/env bash
# golden/parity/run_moe_parity.sh CONFIG [KEY=VALUE ...] — the one command for mixture-of-experts parity against OLMo-core
# (and for a dense config under intra-document masking, data.document_masking=true, against OLMo-core's Transformer).
#
# Dumps a MoE parity bundle with `olmoref parity-dump` (step-0 weights under OLMo-core's names, batches, our
# step-1 logits, gradients and routing, our loss trace) and checks it against ai2-olmo-core's own MoE model with
# olmo_core_moe_parity.py, in OLMo-core's environment (${OLMOREF_OLMO_CORE_VENV:-$HOME/.cache/olmoref/venv-olmo-core},
# created on first use: ai2-olmo-core 3.0.0 pins torch < 2.14, so it is not the parity venv). CONFIG must be a MoE (or, with
# data.document_masking=true, a dense) model config in fp32 precision; each KEY=VALUE is passed to parity-dump as --set KEY=VALUE (e.g.
# model.moe_lb_granularity=\"local_batch\" for OLMo-core's default granularity).
#
# Environment: OLMOREF_BIN (default build/olmoref), OLMOREF_OLMO_CORE_VENV, OLMOREF_PARITY_STEPS (default 10),
# OLMOREF_THREADS (passed to parity-dump --threads), OLMOREF_PEER_THREADS (torch's CPU threads, default 2), OLMOREF_PARITY_REPORT (where to write the JSON report),
# OLMOREF_KEEP_BUNDLE=1 (keep the bundle directory even on success).
# Exit: olmo_core_moe_parity.py's status (0 parity, 1 a gate failed, 2 malformed bundle); 77 with a line starting
# "SKIPPED: moe parity" when OLMo-core's packages cannot be installed (never reported as a pass); 2 for usage errors.
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$root" || exit 2
source "$here/venv.sh"

if [ $# -lt 1 ]; then
  echo "usage: run_moe_parity.sh CONFIG [KEY=VALUE ...]   (a MoE model config, fp32 precision)" >&2
  exit 2
fi
config="$1"
shift
sets=()
for kv in "$@"; do sets+=(--set "$kv"); done
bin="${OLMOREF_BIN:-build/olmoref}"
steps="${OLMOREF_PARITY_STEPS:-10}"

skip() {
  echo "SKIPPED: moe parity: $1"
  exit 77
}

olmoref_ensure_olmo_core_venv run_moe_parity
py="$OLMOREF_OLMO_CORE_VENV/bin/python"
olmoref_py_runs "$py" "$OLMOREF_OLMO_CORE_MOE_REQUIRED" ||
  skip "ai2-olmo-core is installed in $OLMOREF_OLMO_CORE_VENV but '$OLMOREF_OLMO_CORE_MOE_REQUIRED' fails"

olmoref_need_bin_and_config run_moe_parity "pass a MoE config file"

olmoref_dump_and_check run_moe_parity olmo_core_moe_parity.py --config "$config" "${sets[@]}"
