#!/usr/bin/env bash
# Zero-delta resume through the binary, in fresh processes:
#  - resume-check passes (exit 0) and each negative control (moments, loader, step left unrestored)
#    makes it fail (exit 1);
#  - a crash in the middle of writing a checkpoint (between shard and manifest) leaves the previous
#    checkpoint as the newest complete one, and resuming from it finishes identically;
#  - SIGKILL at random moments, resumed each time, ends with a trace identical to an uninterrupted run.
source "${OLMOREF_SOURCE_ROOT:?}/tests/common/shell_test.sh"
python3 "$SRC/tests/make_tokens.py" "$work/tokens.u16" 5 80000
# One thread: a pool of 2 spins waiting for its other half while another test holds the second core (5x the CPU).
cfg=(--config "$SRC/configs/tiny.toml" --set "data.train_files=[\"$work/tokens.u16\"]" --set data.audit=true --threads 1)

# resume-check and its negative controls
"$BIN" resume-check "${cfg[@]}" --steps 8 --at 2,5 > "$work/rc.log" || { cat "$work/rc.log"; exit 1; }
grep -q "IDENTICAL" "$work/rc.log"
for what in moments loader step; do
  set +e
  "$BIN" resume-check "${cfg[@]}" --steps 6 --at 3 --debug-skip-restore "$what" > "$work/neg-$what.log" 2>&1
  rc=$?
  set -e
  [ $rc -eq 1 ] || { echo "negative control '$what' gave exit $rc, expected 1"; cat "$work/neg-$what.log"; exit 1; }
done

# reference: uninterrupted, checkpoint every step
N=40
"$BIN" train "${cfg[@]}" --set checkpoint.interval=1 --steps $N --out "$work/ref" --quiet

# crash inside the save of step 5: the newest complete checkpoint must be step 4
set +e
OLMOREF_TEST_CRASH_IN_SAVE=5 "$BIN" train "${cfg[@]}" --set checkpoint.interval=1 --steps $N --out "$work/crash" --quiet
rc=$?
set -e
[ $rc -ne 0 ] || { echo "the injected crash did not happen"; exit 1; }
[ -d "$work/crash/checkpoints/step00000004" ] || { echo "FAIL: after the crash in save 5, checkpoint step 4 is missing"; exit 1; }
[ ! -d "$work/crash/checkpoints/step00000005" ] || { echo "FAIL: the save torn at step 5 left a complete-looking step00000005"; exit 1; }
[ -d "$work/crash/checkpoints/.tmp-step00000005" ] || { echo "FAIL: the save torn at step 5 left no .tmp-step00000005"; exit 1; }
"$BIN" train "${cfg[@]}" --set checkpoint.interval=1 --steps $N --out "$work/crash" --resume --quiet
cmp "$work/ref/trace.jsonl" "$work/crash/trace.jsonl"
cmp "$work/ref/audit.jsonl" "$work/crash/audit.jsonl"

# SIGKILL at random moments (seeded, so the schedule is reproducible), resume after each
RANDOM=42
out="$work/killed"
kills=0
# After a kill, what a user does: resume from the newest complete checkpoint (one with its manifest), or, killed
# before the first, delete the run's records and start over (train refuses to start over them).
start_args() {
  args=("${cfg[@]}" --set checkpoint.interval=1 --steps $N --out "$out" --quiet)
  if compgen -G "$out/checkpoints/step*/manifest.json" > /dev/null; then args+=(--resume); else rm -rf "$out"; fi
}
for attempt in $(seq 1 10); do
  start_args
  "$BIN" train "${args[@]}" &
  pid=$!
  sleep "0.$(( 1 + RANDOM % 3 ))$(( RANDOM % 10 ))"
  if kill -9 "$pid" 2>/dev/null; then kills=$((kills + 1)); fi
  wait "$pid" 2>/dev/null || true
  if [ -d "$out/checkpoints/step000000$N" ]; then break; fi
done
[ -d "$out/checkpoints/step000000$N" ] || { start_args; "$BIN" train "${args[@]}"; }
cmp "$work/ref/trace.jsonl" "$out/trace.jsonl"
cmp "$work/ref/audit.jsonl" "$out/audit.jsonl"
for d in "$out"/checkpoints/step*; do "$BIN" ckpt verify "$d" > /dev/null; done
echo "resume_faults: ok ($kills kills)"
