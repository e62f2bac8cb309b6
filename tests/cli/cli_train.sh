#!/usr/bin/env bash
# End to end through the binary: `olmoref train` twice at different thread counts gives byte-identical
# traces (T0 + T2), the trace and manifest have the documented fields, and bad input fails with a
# message that names the problem.
source "${OLMOREF_SOURCE_ROOT:?}/tests/common/shell_test.sh"

python3 "$SRC/tests/make_tokens.py" "$work/tokens.u16" 3 60000
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
expect_error "a directory, not a config file" -- "$BIN" config --config "$work"
# Numbers and flags no run can take are refused before anything starts, naming the flag or key.
expect_error "train.steps is 0: a run trains at least one step" -- "$BIN" train --config "$SRC/configs/tiny.toml" \
  --set "$data" --set train.steps=0 --out "$work/s0"
[ ! -e "$work/s0" ] || { echo "FAIL: a run of no steps created its directory"; exit 1; }
expect_error "^--steps: Value 0 not in range" -- "$BIN" train --config "$SRC/configs/tiny.toml" --set "$data" --steps 0 --out "$work/s0"
expect_error "^--dp-shard: Value 0 not in range" -- "$BIN" train --config "$SRC/configs/tiny.toml" --set "$data" --dp-shard 0 --out "$work/s0"
expect_error "excludes --resume" -- "$BIN" train --config "$SRC/configs/tiny.toml" --set "$data" --resume --resume-from "$work" --out "$work/s0"
expect_error "--at 2,4: step 4 is outside 1..3" -- "$BIN" resume-check --config "$SRC/configs/tiny.toml" --set "$data" --steps 4 --at 2,4
expect_error "^--steps: Value 1 not in range 2" -- "$BIN" resume-check --config "$SRC/configs/tiny.toml" --set "$data" --steps 1 --at 1
# An EOS no token can be would make every file (or the holdout) one document.
expect_error "--eos 600 is not an id of the vocabulary (--vocab-size 512)" -- "$BIN" data inspect "$work/tokens.u16" \
  --vocab-size 512 --eos 600
expect_error "--eos 99999 is not an id of the vocabulary (model.vocab_size 512)" -- "$BIN" leakcheck \
  --config "$SRC/configs/tiny.toml" --set "$data" --set "data.holdout_files=[\"$work/tokens.u16\"]" --eos 99999 --steps 2
# Text without the separator is one document: tokenize says so.
printf 'a paragraph\n\nanother one\n' > "$work/paragraphs.txt"
"$BIN" tokenize -i "$work/paragraphs.txt" --tokenizer "$work/tok/t.json" --vocab-size 260 -o "$work/tok/out" \
  > /dev/null 2> "$work/tok.err"
grep -q "holds no separator '%' (--format separator): it is one document; pass --format paragraph" "$work/tok.err" ||
  { cat "$work/tok.err"; echo "FAIL: tokenize took text without its separator as one document silently"; exit 1; }
# A model Hugging Face cannot hold (two sliding windows) is refused naming the config file and the key, and nothing
# is written; so is a bundle for the parity script, which loads the same export.
expect_error "configs/tiny.toml: Hugging Face export: config key 'model.swa_pattern'" -- "$BIN" export-hf \
  --config "$SRC/configs/tiny.toml" --set "model.swa_pattern=[8, 16, 16, -1]" --out "$work/hf2"
[ ! -e "$work/hf2" ] || { echo "a refused export-hf left output"; exit 1; }
expect_error "configs/tiny.toml: Hugging Face export: config key 'model.swa_pattern'" -- "$BIN" parity-dump \
  --config "$SRC/configs/tiny.toml" --set "model.swa_pattern=[8, 16, 16, -1]" --set "$data" --out "$work/pd2" --steps 1
[ ! -e "$work/pd2" ] || { echo "a refused parity-dump left output"; exit 1; }
printf '\x01\x02\x03' > "$work/odd.u16"
expect_error "odd.u16" -- "$BIN" train --config "$SRC/configs/tiny.toml" --set "data.train_files=[\"$work/odd.u16\"]" --out "$work/x"
python3 - "$work/tokens.u16" "$work/wide.u16" "$work/np.u16" <<'PY'
import struct, sys
toks = struct.unpack("<%dH" % (len(open(sys.argv[1], "rb").read()) // 2), open(sys.argv[1], "rb").read())
open(sys.argv[2], "wb").write(struct.pack("<%dI" % len(toks), *toks))              # uint32 tokens, named .u16
hdr = b"\x93NUMPY\x01\x00" + struct.pack("<H", 118) + b"{'descr': '<u2', 'fortran_order': False, 'shape': (%d,), }" % len(toks)
hdr = hdr.ljust(128 - 1, b" ") + b"\n"
open(sys.argv[3], "wb").write(hdr + struct.pack("<%dH" % len(toks), *toks))       # np.save output
PY
expect_error "wide.u16': read as uint16, every second value" -- "$BIN" train --config "$SRC/configs/tiny.toml" --set "data.train_files=[\"$work/wide.u16\"]" --out "$work/x"
expect_error "np.u16': a NumPy .npy file" -- "$BIN" train --config "$SRC/configs/tiny.toml" --set "data.train_files=[\"$work/np.u16\"]" --out "$work/x"
"$BIN" train --config "$SRC/configs/tiny.toml" --set "data.train_files=[\"$work/wide.u16\"]" --set 'data.dtype="u32"' \
  --out "$work/wide" --steps 1 --quiet  # the same file, read as what it is
expect_error "missing.u16" -- "$BIN" train --config "$SRC/configs/tiny.toml" --set "data.train_files=[\"$work/missing.u16\"]" --out "$work/x"
"$BIN" config --config "$SRC/configs/olmo3-7b.toml" | grep -q "7298617344"

# Every value is validated, naming the key (or flag) and the allowed range.
tiny=(--config "$SRC/configs/tiny.toml" --set "$data" --out "$work/v" --threads 1 --quiet)
for bad in "optim.max_grad_norm=0" "optim.max_grad_norm=-1" "optim.max_grad_norm=nan" "optim.lr=inf" "optim.lr=nan" \
           "data.eos_id=512" "data.eos_id=-7" "model.init_seed=-1" "model.rope_theta=inf" "optim.eps=0"; do
  expect_error "'${bad%%=*}'" -- "$BIN" train "${tiny[@]}" --set "$bad" --steps 1
done
expect_error "--steps" -- "$BIN" train "${tiny[@]}" --steps -5
expect_error "--threads" -- "$BIN" train "${tiny[@]}" --threads -2 --steps 1
expect_error "needs about" -- "$BIN" train "${tiny[@]}" --set model.vocab_size=2000000000 --steps 1
expect_error "'model'" -- "$BIN" config --config "$SRC/configs/tiny.toml" --set model.d_model=100000000 --set model.ffn_hidden=100000000
# An absurd global batch is refused at once: past 32-bit instance ids by the config (every command), then against
# the data (this file's instances) and against host memory (a sparse token file, so the data could hold it, of 1.5x
# MemAvailable / 4 bytes a token), before anything that grows with it is built: a timeout of 20 s catches the memory
# model's or the loader's O(G) work.
for command in "train --out $work/v" config; do
  # shellcheck disable=SC2086  # the command and its own arguments
  expect_error "'train.global_batch_instances'.*must be at most 4294967295 (instance ids are 32-bit)" -- \
    timeout 20 "$BIN" $command --config "$SRC/configs/tiny.toml" --set "$data" \
    --set train.global_batch_instances=1000000000000
done
expect_error "train.global_batch_instances = 1000000 is more than the training data holds: the 1 file(s) of \
data.train_files give [0-9]* instances of seq_len 64" -- timeout 20 "$BIN" train "${tiny[@]}" \
  --set train.global_batch_instances=1000000 --steps 1
avail_kib=$(awk '/^MemAvailable:/ {print $2}' /proc/meminfo)
huge_tokens=$((avail_kib * 1024 / 4 * 3 / 2 / 4096 * 4096))
truncate -s $((huge_tokens * 2)) "$work/huge.u16"
expect_error "train.global_batch_instances = $((huge_tokens / 64)): one global batch of .* of host memory on every \
rank" -- timeout 20 "$BIN" train "${tiny[@]}" --set "data.train_files=[\"$work/huge.u16\"]" \
  --set "train.global_batch_instances=$((huge_tokens / 64))" --steps 1
rm -f "$work/huge.u16"
[ ! -e "$work/v" ] || { echo "a refused run created its directory"; exit 1; }
"$BIN" train "${tiny[@]}" --set optim.max_grad_norm=inf --steps 2  # inf: no clipping, explicitly
grep -q '"clip":1,' "$work/v/trace.jsonl"
# parity-dump: nothing written for a refused bundle.
expect_error "--steps" -- "$BIN" parity-dump --config "$SRC/configs/tiny.toml" --out "$work/pd" --steps 0
expect_error "train.precision" -- "$BIN" parity-dump --config "$SRC/configs/tiny.toml" --set 'train.precision="bf16"' --out "$work/pd" --steps 1
[ ! -e "$work/pd" ] || { echo "a refused parity-dump left output"; exit 1; }

# A diverged run (NaN loss) writes valid JSON; compare, plot and the reader take it.
"$BIN" train --config "$SRC/configs/tiny.toml" --set "$data" --threads 1 --quiet --out "$work/nan" --set optim.lr=1e6 --set optim.max_grad_norm=inf --set schedule.warmup=0 --steps 4
python3 -c 'import json,sys; [json.loads(l, parse_constant=lambda c: sys.exit("bare " + c)) for l in open(sys.argv[1])]' "$work/nan/trace.jsonl"
grep -q '"loss":null,"loss_hex":"7fc00000"' "$work/nan/trace.jsonl"
"$BIN" trace compare "$work/nan" "$work/nan" > /dev/null
"$BIN" trace plot "$work/nan" --out "$work/nan.svg" > /dev/null

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
expect_error "already holds a run" -- "$BIN" train --config "$SRC/configs/tiny.toml" --set "$data" --set data.audit=true \
  --out "$work/done" --threads 1 --steps 4  # a fresh run would overwrite it: --resume or another --out
cmp "$work/done/trace.jsonl" "$work/trace.before" || { echo "FAIL: a refused fresh run into a used --out changed the trace"; exit 1; }
cmp "$work/done/audit.jsonl" "$work/audit.before" || { echo "FAIL: a refused fresh run into a used --out changed the audit log"; exit 1; }
cp "$work/tokens.u16" "$work/other.u16"; printf '\x05\x00' >> "$work/other.u16"  # one token more: other data
expect_error "fingerprint" -- "$BIN" train --config "$SRC/configs/tiny.toml" --set "data.train_files=[\"$work/other.u16\"]" \
  --set data.audit=true --set checkpoint.interval=2 --out "$work/done" --threads 1 --steps 4 \
  --resume-from "$work/done/checkpoints/step00000002"
cmp "$work/done/trace.jsonl" "$work/trace.before" || { echo "FAIL: a resume refused for other data changed the trace"; exit 1; }
cmp "$work/done/audit.jsonl" "$work/audit.before" || { echo "FAIL: a resume refused for other data changed the audit log"; exit 1; }
# A trace that does not hold exactly steps 1..K of the checkpoint at K is refused, saying which steps; nothing is cut.
head -n 1 "$work/trace.before" > "$work/done/trace.jsonl"
expect_error "trace.jsonl: no record of step 2 (the checkpoint is at step 2)" -- "$BIN" train --config "$SRC/configs/tiny.toml" --set "$data" --set data.audit=true \
  --set checkpoint.interval=2 --out "$work/done" --threads 1 --steps 4 --resume-from "$work/done/checkpoints/step00000002"
[ "$(wc -l < "$work/done/trace.jsonl")" -eq 1 ]
{ head -n 1 "$work/trace.before"; head -n 1 "$work/trace.before"; } > "$work/done/trace.jsonl"
expect_error "step 1 where step 2 belongs" -- "$BIN" train --config "$SRC/configs/tiny.toml" --set "$data" \
  --set data.audit=true --set checkpoint.interval=2 --out "$work/done" --threads 1 --steps 4 \
  --resume-from "$work/done/checkpoints/step00000002"
cp "$work/trace.before" "$work/done/trace.jsonl"  # intact again: the resume goes through and rewrites steps 3, 4
"$BIN" train --config "$SRC/configs/tiny.toml" --set "$data" --set data.audit=true --set checkpoint.interval=2 \
  --out "$work/done" --threads 1 --steps 4 --quiet --resume-from "$work/done/checkpoints/step00000002"
cmp "$work/done/trace.jsonl" "$work/trace.before"

# One writer per run directory: a second run on a directory in use is refused naming the holder; the lock dies
# with its process (kill -9), and the run then resumes.
"$BIN" train --config "$SRC/configs/tiny.toml" --set "$data" --set checkpoint.interval=1 --out "$work/busy" --threads 1 \
  --steps 100000 --quiet &
holder=$!
for _ in $(seq 100); do [ -d "$work/busy/checkpoints/step00000001" ] && break; sleep 0.1; done
expect_error "in use by another run (olmoref train pid $holder" -- "$BIN" train --config "$SRC/configs/tiny.toml" \
  --set "$data" --set checkpoint.interval=1 --out "$work/busy" --threads 1 --steps 100000 --resume
kill -9 $holder; wait $holder 2>/dev/null || true
last=$(ls "$work/busy/checkpoints" | grep '^step' | tail -n 1)
k=$((10#${last#step}))
"$BIN" train --config "$SRC/configs/tiny.toml" --set "$data" --set checkpoint.interval=1 --out "$work/busy" --threads 1 \
  --steps 100000 --stop-after $((k + 1)) --resume --quiet
[ "$(wc -l < "$work/busy/trace.jsonl")" -eq $((k + 1)) ]

echo "cli_train: ok"
