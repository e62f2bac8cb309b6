#!/usr/bin/env bash
# A resume that changes the global batch size, as OLMo-core allows: with --allow-config-change the data order
# continues at tokens seen // the new global batch (data/loader.h rebatched_state), deterministically. Checks: the
# resumed run is refused without the flag; with it, two resumes write byte-identical traces and audit logs; the
# first resumed step trains exactly the rows `olmoref data batches` gives at that position of the same order, for a
# batch that divides the tokens seen (8 -> 4) and one that does not (8 -> 3: the position rounds down).
source "${OLMOREF_SOURCE_ROOT:?}/tests/common/shell_test.sh"
cd "$SRC"
python3 golden/traces/make_tiny_corpus.py "$work/tiny.u16" > /dev/null
data=(--set "data.train_files=[\"$work/tiny.u16\"]" --set data.audit=true --threads 2 --quiet)

# 8 steps of 8 instances, checkpoints at 4 and 8.
"$BIN" train --config configs/tiny.toml --steps 8 "${data[@]}" --set checkpoint.interval=4 --out "$work/a"
ckpt="$work/a/checkpoints/step00000004"

if "$BIN" train --config configs/tiny.toml --steps 8 "${data[@]}" --set train.global_batch_instances=4 \
     --resume-from "$ckpt" --out "$work/refused" 2> "$work/refused.err"; then
  echo "FAIL: a resume with another global batch was accepted without --allow-config-change"; exit 1
fi
grep -q -- "--allow-config-change" "$work/refused.err" || { cat "$work/refused.err"; exit 1; }
echo "ok: another global batch is refused without --allow-config-change"

# The instance ids of the first step a resumed run's audit log holds (its first row of the order), one per line.
# The audit's "step" is the loader's position in the new batches (batch + 1), not the trainer's step.
first_step_ids() { python3 -c "
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
print('\n'.join(str(r['instance']) for r in recs if r['batch'] == recs[0]['batch'] and r['epoch'] == recs[0]['epoch']))" "$1"; }

for g in 4 3; do
  for copy in 1 2; do
    "$BIN" train --config configs/tiny.toml --steps 8 "${data[@]}" --set train.global_batch_instances=$g \
      --set train.micro_batch_instances=1 --allow-config-change --resume-from "$ckpt" --out "$work/g$g-$copy" \
      --new-records  # a new directory: its records begin at step 5
  done
  cmp "$work/g$g-1/trace.jsonl" "$work/g$g-2/trace.jsonl"
  cmp "$work/g$g-1/audit.jsonl" "$work/g$g-2/audit.jsonl"
  # 4 steps x 8 instances seen; the order cut into batches of g continues at batch 32 // g.
  skip=$(( 32 / g ))
  "$BIN" data batches "$work/tiny.u16" --vocab-size 512 --seq-len 64 --global-batch $g --skip $skip --steps 1 \
    2> /dev/null | python3 -c "import json, sys; print('\n'.join(str(i) for i in json.loads(sys.stdin.readline())['instances']))" \
    > "$work/want$g.txt"
  first_step_ids "$work/g$g-1/audit.jsonl" > "$work/got$g.txt"
  if ! cmp -s "$work/want$g.txt" "$work/got$g.txt"; then
    echo "FAIL: global batch 8 -> $g: step 5 trained $(tr '\n' ' ' < "$work/got$g.txt"), the order's batch $skip of $g is $(tr '\n' ' ' < "$work/want$g.txt")"
    exit 1
  fi
  [ "$(head -c 9 "$work/g$g-1/trace.jsonl")" = '{"step":5' ] || { echo "FAIL: the resumed trace does not start at step 5"; exit 1; }
  echo "ok: global batch 8 -> $g at step 4: two resumes byte-identical; step 5 trains batch $skip of the order cut in $g's ($(tr '\n' ' ' < "$work/got$g.txt"))"
  # The checkpoint after the change records both batch sizes (data_history) and verifies; resumed in place, its audit
  # records, which the loader numbers by its batches of g (batch 32 // g + 1 on), are matched to steps 5..8 and kept.
  "$BIN" ckpt verify "$work/g$g-1/checkpoints/step00000008" > /dev/null
  cp "$work/g$g-1/audit.jsonl" "$work/audit-g$g.before"
  "$BIN" train --config configs/tiny.toml --steps 10 "${data[@]}" --set train.global_batch_instances=$g \
    --set train.micro_batch_instances=1 --allow-config-change --resume --out "$work/g$g-1"
  cmp -n "$(stat -c %s "$work/audit-g$g.before")" "$work/audit-g$g.before" "$work/g$g-1/audit.jsonl" || {
    echo "FAIL: global batch $g: the resume at step 8 cut audit records of steps 5..8"; exit 1; }
  [ "$(wc -l < "$work/g$g-1/audit.jsonl")" -eq $(( 6 * g )) ]  # steps 5..10: the records began at step 5
  echo "ok: global batch $g: the checkpoint at step 8 verifies; a resume from it keeps the audit records of steps 5..8"
done
