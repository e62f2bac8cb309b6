#!/usr/bin/env bash
# tests/golden/megatron_parity.sh — meson test golden-parity-megatron: Megatron-Core's own GPTModel (its local layer
# spec on the CPU, golden/parity/megatron_parity.py) fed a parity bundle of configs/parity.toml (GQA, windows [16, 16,
# full] shorter than the 48-token sequence) must give our step-1 logits, loss and every gradient within hf_parity.py's
# fp32 gates; in the same process four controls must each fail a gate: Megatron's per-head qk_layernorm instead of
# the full-width QK-norm, the sliding window dropped, the window one key wider, and layer 0's q_norm weight scaled by
# 1.01. Exit: 0 as expected; 1 otherwise; 2 an error; 77 "SKIPPED: megatron parity: ..." when the venv or
# megatron-core is missing (never a pass).
source "${OLMOREF_SOURCE_ROOT:?}/tests/common/shell_test.sh"
set +e  # megatron_parity.py's exit status is the verdict
cd "$SRC" || exit 2
source golden/parity/venv.sh
skip() { echo "SKIPPED: megatron parity: $1"; exit 77; }
olmoref_venv_python_or_skip
"$BIN" parity-dump --config configs/parity.toml --out "$work/bundle" --steps 1 > "$work/dump.log" 2>&1 || {
  cat "$work/dump.log"
  echo "megatron_parity.sh: olmoref parity-dump failed"
  exit 2
}
"$py" golden/parity/megatron_parity.py --bundle "$work/bundle" --report "$work/report.json" --with-controls \
  > "$work/check.log" 2>&1
rc=$?
grep -E "^(SKIPPED|megatron|PASS|FAIL|control)" "$work/check.log"
[ "$rc" -eq 0 ] || [ "$rc" -eq 77 ] || tail -n 30 "$work/check.log"
exit $rc
