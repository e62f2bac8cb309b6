#!/usr/bin/env bash
# A run's records and its checkpoints agree, or the resume says why not:
#  - a resume whose trace was deleted, whose audit log was cut short, or that copies a checkpoint alone into a new
#    directory is refused naming the file and the steps it lacks; with --new-records it goes on, says on stderr where
#    the records begin, and its first trace record carries "records_begin"; a later resume accepts that marker;
#  - a trace of another run (same shapes, other data order) is refused by its step-K data digest;
#  - a manifest edited and re-hashed (batches_processed, step, tokens, seed, epoch) fails `ckpt verify` naming the key,
#    and a resume from it is refused;
#  - the audit switched off on resume is noted; switched on for a run that had none, the missing records refuse.
source "${OLMOREF_SOURCE_ROOT:?}/tests/common/shell_test.sh"
REHASH="${OLMOREF_BUILD_ROOT:?}/tests/cli/rehash_manifest"
# ~41 instances of 64 tokens: 5 global batches of 8 per epoch, so step 6 is the first of epoch 2.
python3 "$SRC/tests/make_tokens.py" "$work/tokens.u16" 29 2640
cfg=(--config "$SRC/configs/tiny.toml" --set "data.train_files=[\"$work/tokens.u16\"]" --set data.audit=true --threads 2
     --set checkpoint.interval=2)

# must_refuse NAME PATTERN... -- COMMAND: the command fails and its stderr holds every pattern.
must_refuse() {
  local name=$1; shift
  local pats=()
  while [ "$1" != "--" ]; do pats+=("$1"); shift; done
  shift
  if "$@" > "$work/$name.out" 2> "$work/$name.err"; then
    echo "FAIL ($name): accepted"; cat "$work/$name.err"; exit 1
  fi
  for p in "${pats[@]}"; do
    grep -qF -- "$p" "$work/$name.err" "$work/$name.out" || { echo "FAIL ($name): no '$p' in:"; cat "$work/$name.err" "$work/$name.out"; exit 1; }
  done
}

"$BIN" train "${cfg[@]}" --steps 8 --out "$work/ref" --quiet                   # uninterrupted: steps 1..8
"$BIN" train "${cfg[@]}" --steps 8 --out "$work/run" --quiet --stop-after 6    # checkpoints 2, 4, 6
ckpt="$work/run/checkpoints/step00000006"
"$BIN" ckpt verify "$ckpt" > /dev/null
fresh() { rm -rf "$work/$1"; cp -r "$work/run" "$work/$1"; }
# steps 7..8 of the reference, as a resumed run must write them (after the marker is taken off)
# The records' fields: the marker off, and the checksum, which covers it (each file's own lines are checked where a
# resume reads them).
strip() { sed -E 's/,"records_begin":[0-9]+//; s/,"record_xxh3":"[0-9a-f]{16}"}$/}/' "$@"; }
tail -n 2 "$work/ref/trace.jsonl" | strip > "$work/ref-7-8.jsonl"

# A plain resume: nothing missing, nothing said, the reference's records.
fresh ok
"$BIN" train "${cfg[@]}" --steps 8 --out "$work/ok" --resume --quiet 2> "$work/ok.err"
cmp "$work/ok/trace.jsonl" "$work/ref/trace.jsonl"
cmp "$work/ok/audit.jsonl" "$work/ref/audit.jsonl"
if grep -q "records_begin\|new-records" "$work/ok.err" "$work/ok/trace.jsonl"; then echo "FAIL: a complete resume mentions new records"; exit 1; fi
echo "ok: a resume with complete records continues them as before"

# 1. The trace deleted.
fresh notrace
rm "$work/notrace/trace.jsonl"
cp "$work/notrace/audit.jsonl" "$work/audit.before"
must_refuse notrace "notrace/trace.jsonl: missing" "steps 1..6" "--new-records" -- \
  "$BIN" train "${cfg[@]}" --steps 8 --out "$work/notrace" --resume
[ ! -e "$work/notrace/trace.jsonl" ] || { echo "FAIL: the refused resume recreated notrace/trace.jsonl"; exit 1; }
cmp "$work/notrace/audit.jsonl" "$work/audit.before" || { echo "FAIL: the refused resume changed notrace/audit.jsonl"; exit 1; }
"$BIN" train "${cfg[@]}" --steps 8 --out "$work/notrace" --resume --new-records --stop-after 7 --quiet \
  2> "$work/notrace-new.err"
grep -q "records begin again at step 7" "$work/notrace-new.err" || { cat "$work/notrace-new.err"; exit 1; }
[ "$(strip "$work/notrace/trace.jsonl")" = "$(sed -n 7p "$work/ref/trace.jsonl" | strip)" ] ||
  { echo "FAIL: the record of step 7 after --new-records is not the reference's"; exit 1; }
grep -Eq ',"records_begin":7,"record_xxh3":"[0-9a-f]{16}"}$' "$work/notrace/trace.jsonl" ||
  { echo "FAIL: the record of step 7 lacks the marker before its checksum"; exit 1; }
# The marker stands for the steps before it: the next resume needs no flag, and adds no marker.
"$BIN" train "${cfg[@]}" --steps 8 --out "$work/notrace" --resume --quiet
[ "$(grep -c records_begin "$work/notrace/trace.jsonl")" -eq 1 ]
strip "$work/notrace/trace.jsonl" | cmp - "$work/ref-7-8.jsonl"
cmp "$work/notrace/audit.jsonl" "$work/ref/audit.jsonl"
echo "ok: deleted trace refused; --new-records begins the trace at step 7 with \"records_begin\":7; the next resume takes it"

# 2. The audit log cut short: steps 3..6 gone.
fresh shortaudit
python3 - "$work/shortaudit/audit.jsonl" <<'PY'
import json, sys
lines = [l for l in open(sys.argv[1]) if json.loads(l)["step"] <= 2]
open(sys.argv[1], "w").writelines(lines)
PY
must_refuse shortaudit "shortaudit/audit.jsonl: no record of steps 3..6 (it holds records of steps 1..2" -- \
  "$BIN" train "${cfg[@]}" --steps 8 --out "$work/shortaudit" --resume
# Cut inside a step, as a torn write would leave it: the part of step 3 it lacks is named too.
fresh tornaudit
head -n 21 "$work/run/audit.jsonl" > "$work/tornaudit/audit.jsonl"
head -c 100 <(sed -n 22p "$work/run/audit.jsonl") >> "$work/tornaudit/audit.jsonl"
must_refuse tornaudit "tornaudit/audit.jsonl: no record of steps 4..6, only 5 of the 8 instances of step 3" -- \
  "$BIN" train "${cfg[@]}" --steps 8 --out "$work/tornaudit" --resume
"$BIN" train "${cfg[@]}" --steps 8 --out "$work/shortaudit" --resume --new-records --quiet 2> "$work/shortaudit-new.err"
grep -q "audit.jsonl: no record of steps 3..6" "$work/shortaudit-new.err"
grep -q "records begin again at step 7" "$work/shortaudit-new.err"
[ "$(python3 -c "import json,sys; print(sorted({json.loads(l)['step'] for l in open(sys.argv[1])}))" "$work/shortaudit/audit.jsonl")" = "[1, 2, 7, 8]" ]
sed -n 7p "$work/shortaudit/trace.jsonl" | grep -Eq '"step":7,.*,"records_begin":7,"record_xxh3":"[0-9a-f]{16}"}$'
echo "ok: short audit log refused naming it and steps 3..6 (a log torn inside step 3 too); --new-records continues with steps 7, 8 and the marker"

# 3. A checkpoint copied alone into a new directory.
mkdir -p "$work/copied"
cp -r "$ckpt" "$work/copied/"
must_refuse copy "elsewhere/trace.jsonl: missing" "elsewhere/audit.jsonl: missing" "steps 1..6" -- \
  "$BIN" train "${cfg[@]}" --steps 8 --out "$work/elsewhere" --resume-from "$work/copied/step00000006"
"$BIN" train "${cfg[@]}" --steps 8 --out "$work/elsewhere" --resume-from "$work/copied/step00000006" --new-records --quiet \
  2> "$work/copy-new.err"
grep -q "records begin again at step 7" "$work/copy-new.err"
head -n 1 "$work/elsewhere/trace.jsonl" | grep -Eq '"records_begin":7,"record_xxh3":"[0-9a-f]{16}"}$'
strip "$work/elsewhere/trace.jsonl" | cmp - "$work/ref-7-8.jsonl"
echo "ok: a checkpoint copied into a new directory is refused; --new-records starts its records at step 7"

# 4. A trace of another run: the same shapes and steps, another data order (data.seed). Its step 6 drew another
#    batch than the checkpoint's loader state gives, and --new-records does not excuse that.
"$BIN" train "${cfg[@]}" --steps 8 --set data.seed=7 --out "$work/other" --quiet --stop-after 6
fresh wrongtrace
cp "$work/other/trace.jsonl" "$work/wrongtrace/trace.jsonl"
must_refuse wrongtrace "wrongtrace/trace.jsonl:6: step 6 has data_digest" "not of one run" -- \
  "$BIN" train "${cfg[@]}" --steps 8 --out "$work/wrongtrace" --resume --new-records
cmp "$work/wrongtrace/trace.jsonl" "$work/other/trace.jsonl"
echo "ok: another run's trace is refused by step 6's data digest"

# 5. Manifests edited with their checksum recomputed: ckpt verify names the key, a resume refuses.
edit() {  # NAME POINTER DELTA: adds DELTA to the integer at POINTER of the step-6 manifest and re-hashes it
  fresh "$1"
  local m="$work/$1/checkpoints/step00000006/manifest.json"
  local v
  v=$(python3 -c "import json,sys; d=json.load(open(sys.argv[1]))
for k in sys.argv[2].strip('/').split('/'): d = d[k]
print(d + int(sys.argv[3]))" "$m" "$2" "$3")
  "$REHASH" "$m" "$2" "$v"
}
for spec in "bp /loader_state/batches_processed 1 loader_state.batches_processed" "step /step 1 step" \
            "tokens /tokens 512 tokens" "seed /loader_state/seed 1 loader_state.seed" \
            "epoch /loader_state/epoch 1 loader_state.epoch"; do
  read -r name ptr delta key <<< "$spec"
  edit "edit-$name" "$ptr" "$delta"
  m="$work/edit-$name/checkpoints/step00000006"
  must_refuse "verify-$name" "FAILED: $m/manifest.json: key '$key' is" "contradicts itself" -- "$BIN" ckpt verify "$m"
  cp "$work/edit-$name/trace.jsonl" "$work/trace.before"
  must_refuse "resume-$name" "$m/manifest.json: key '$key' is" -- "$BIN" train "${cfg[@]}" --steps 8 --out "$work/edit-$name" --resume
  cmp "$work/edit-$name/trace.jsonl" "$work/trace.before"
  echo "ok: $key edited and re-hashed: ckpt verify and the resume refuse it ($(grep -m1 -o "key '$key' is [^(]*" "$work/verify-$name.out"))"
done

# 6. The audit off on resume: noted. A run without audit logs resumed with the audit on: refused, then --new-records.
fresh auditoff
"$BIN" train "${cfg[@]}" --steps 8 --set data.audit=false --out "$work/auditoff" --resume 2> "$work/auditoff.err" > /dev/null
grep -q "data.audit is off in this run: the audit logs of $work/auditoff get no records after step 6" "$work/auditoff.err"
"$BIN" train "${cfg[@]}" --steps 8 --set data.audit=false --out "$work/noaudit" --quiet --stop-after 2
must_refuse auditon "noaudit/audit.jsonl: missing" "steps 1..2" -- "$BIN" train "${cfg[@]}" --steps 8 --out "$work/noaudit" --resume
echo "ok: the audit switched off is noted; switched on over a run without audit logs it needs --new-records"
echo "records: ok"
