#!/usr/bin/env bash
# End to end through the binary: `olmoref train` twice at different thread counts gives byte-identical
# traces (T0 + T2), the trace and manifest have the documented fields, and bad input fails with a
# message that names the problem.
set -euo pipefail
BIN="${OLMOREF_BUILD_ROOT:?}/olmoref"
SRC="${OLMOREF_SOURCE_ROOT:?}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

python3 - "$work/tokens.u16" <<'PY'
import random, struct, sys
random.seed(3)
toks = []
while len(toks) < 60000:
    start, step = random.randrange(500), random.choice([1, 2, 3])
    toks += [(start + i * step) % 500 for i in range(random.randrange(20, 60))] + [511]
open(sys.argv[1], "wb").write(struct.pack("<%dH" % len(toks), *toks))
PY
data="data.train_files=[\"$work/tokens.u16\"]"

"$BIN" train --config "$SRC/configs/tiny.toml" --set "$data" --out "$work/a" --threads 1 --steps 6 2> "$work/a.log"
"$BIN" train --config "$SRC/configs/tiny.toml" --set "$data" --out "$work/b" --threads 2 --steps 6 --quiet
cmp "$work/a/trace.jsonl" "$work/b/trace.jsonl"
[ "$(wc -l < "$work/a/trace.jsonl")" -eq 6 ]
grep -q '"loss_hex":"' "$work/a/trace.jsonl"
grep -q '"param_digest":"' "$work/a/trace.jsonl"
grep -q '"trace_format": "olmoref-trace/1"' "$work/a/manifest.json"
grep -q '"threads": 1' "$work/a/manifest.json"
grep -q 'step     6/6' "$work/a.log"            # progress output
grep -q 'tok/s' "$work/a.log"

expect_error() {  # expect_error PATTERN -- command...
  local pattern=$1; shift 2
  if "$@" > "$work/err.log" 2>&1; then echo "expected failure: $*"; exit 1; fi
  grep -q -- "$pattern" "$work/err.log" || { echo "missing '$pattern' in:"; cat "$work/err.log"; exit 1; }
}
expect_error "model.n_kv_heads" -- "$BIN" train --config "$SRC/configs/tiny.toml" --set "$data" --set model.n_kv_heads=3 --out "$work/x"
expect_error "model.swa_pattern" -- "$BIN" config --config "$SRC/configs/tiny.toml" --set "model.swa_pattern=[0]"
expect_error "unknown config key 'train.stepz'" -- "$BIN" config --config "$SRC/configs/tiny.toml" --set train.stepz=3
expect_error "cannot open config" -- "$BIN" config --config "$work/none.toml"
printf '\x01\x02\x03' > "$work/odd.u16"
expect_error "odd.u16" -- "$BIN" train --config "$SRC/configs/tiny.toml" --set "data.train_files=[\"$work/odd.u16\"]" --out "$work/x"
expect_error "missing.u16" -- "$BIN" train --config "$SRC/configs/tiny.toml" --set "data.train_files=[\"$work/missing.u16\"]" --out "$work/x"
"$BIN" config --config "$SRC/configs/olmo3-7b.toml" | grep -q "7298617344"

# A refused resume touches nothing: the finished run's trace and audit log keep every record.
"$BIN" train --config "$SRC/configs/tiny.toml" --set "$data" --set data.audit=true --set checkpoint.interval=2 \
  --out "$work/done" --threads 1 --steps 4 --quiet
cp "$work/done/trace.jsonl" "$work/trace.before"; cp "$work/done/audit.jsonl" "$work/audit.before"
for change in "optim.lr=1e-3" "model.d_model=32"; do
  expect_error "manifest.json" -- "$BIN" train --config "$SRC/configs/tiny.toml" --set "$data" --set data.audit=true \
    --set checkpoint.interval=2 --set "$change" --out "$work/done" --threads 1 --steps 4 \
    --resume-from "$work/done/checkpoints/step00000002"
  cmp "$work/done/trace.jsonl" "$work/trace.before" || { echo "a refused resume ($change) cut the trace"; exit 1; }
  cmp "$work/done/audit.jsonl" "$work/audit.before" || { echo "a refused resume ($change) cut the audit log"; exit 1; }
done
cp "$work/tokens.u16" "$work/other.u16"; printf '\x05\x00' >> "$work/other.u16"  # one token more: other data
expect_error "fingerprint" -- "$BIN" train --config "$SRC/configs/tiny.toml" --set "data.train_files=[\"$work/other.u16\"]" \
  --set data.audit=true --set checkpoint.interval=2 --out "$work/done" --threads 1 --steps 4 \
  --resume-from "$work/done/checkpoints/step00000002"
cmp "$work/done/trace.jsonl" "$work/trace.before" && cmp "$work/done/audit.jsonl" "$work/audit.before"
echo "cli_train: ok"
