#!/usr/bin/env bash
# tests/golden/resume_audit.sh FRAMEWORK — meson tests golden-resume-audit-FRAMEWORK: `olmoref golden resume-audit`
# drives the framework's own trainer through a bundle straight and stopped after step 4 through its own checkpoint
# save, resumed in a fresh process through its own load path (configs/tiny.toml, 8 steps), and compares every step
# exactly. The real resume must be what docs/golden.md ("Resume audits") says of the framework (identical, or its
# documented first difference), and each of the four controls (optimizer state not restored, data position reset,
# LR schedule restarted, one RNG stream not restored) must be seen at its step with its first difference. For
# hf-trainer also the refusals: --at outside the run, a framework without an audit, an unknown control, a world size
# that is no rank count or does not split the global batch, controls across world sizes (exit 2).
# tests/golden/resume_audit.sh FRAMEWORK world-size — meson tests golden-resume-audit-FRAMEWORK-world-size: the audit
# across RESUME_WS (tests/golden/meson.build) and the framework's planted loader bug, a test of its own so that
# neither half outgrows the per-test budget.
source "${OLMOREF_SOURCE_ROOT:?}/tests/common/shell_test.sh"
set +e
cd "$SRC" || exit 2
source golden/parity/venv.sh
FRAMEWORK=$1
PART=${2:-resume}  # resume: the audit, its controls (and hf-trainer's refusals); world-size: across RESUME_WS
skip() { echo "SKIPPED: golden-resume-audit-$FRAMEWORK: $1"; exit 77; }
case $FRAMEWORK in
  olmo-core) olmoref_ensure_olmo_core_venv resume_audit; py=$OLMOREF_OLMO_CORE_VENV/bin/python ;;
  maxtext) olmoref_ensure_maxtext_venv resume_audit; py=$OLMOREF_MAXTEXT_VENV/bin/python ;;
  *) olmoref_ensure_venv resume_audit ;;
esac
fail() { echo "FAIL: $*"; exit 1; }
python3 tests/make_tokens.py "$work/tokens.u16" 5 60000 || exit 2
"$BIN" train --config configs/tiny.toml --steps 8 --set "data.train_files=[\"$work/tokens.u16\"]" --set eval.interval=0 \
  --threads 2 --out "$work/run" --quiet || exit 2
"$BIN" golden export --run "$work/run" --out "$work/bundle" --states none > /dev/null || exit 2
threads=${OLMOREF_PEER_THREADS:-1}
if [ "$PART" = resume ]; then
  OMP_NUM_THREADS=$threads "$BIN" golden resume-audit "$work/bundle" --framework "$FRAMEWORK" --at 4 --controls all \
    --python "$py" --threads "$threads" --out "$work/audit" > "$work/audit.log" 2>&1
  rc=$?
  report=$work/audit/audit.txt
  [ -f "$report" ] || { tail -n 40 "$work/audit.log"; fail "the audit did not run (exit $rc)"; }
  sed -n '/^== resumed/,$p' "$report"
  # What the real resume must show: identical, unless docs/golden.md documents a difference (then exit 1 naming it).
  expected=${RESUME_EXPECT:-IDENTICAL}
  if [ "$expected" = IDENTICAL ]; then
    grep -q "^IDENTICAL: resuming changed nothing" "$report" || fail "$FRAMEWORK's resume is no longer identical"
  else
    grep -q "^DIFFERENT: first at step $expected" "$report" || fail "$FRAMEWORK's resume: want 'first at step $expected'"
  fi
  for c in "optimizer|first at step 4: optimizer state as loaded" "data|first at step 5: batch" \
           "schedule|first at step 5: lr" "rng|first at step 5: "; do
    name=${c%%|*} want=${c#*|}
    if [ "$name" = "${RESUME_NO_CONTROL:-}" ]; then  # no such restore in the framework: its adapter says why
      grep -q "^control $name: not planted: " "$report" || fail "control $name: want 'not planted' with the reason"
      continue
    fi
    grep -q "^control $name: seen: $want" "$report" || fail "control $name: want 'seen: $want'"
    # Where the real resume already differs first at the control's step in the same way, the control is judged against
    # the real resume as well, so the framework's own difference cannot pass for the control's.
    if [ "$expected" != IDENTICAL ] && grep -q "^control $name: seen: first at step $expected " "$report"; then
      grep -q "^control $name: seen: .*the control against it: first at step ${want#first at step }" "$report" ||
        fail "control $name: at the real resume's own first difference, want it judged against the real resume"
    fi
  done
  want_rc=0
  [ "$expected" = IDENTICAL ] || want_rc=1
  [ $rc = $want_rc ] || fail "exit $rc, want $want_rc"
  echo "ok: $FRAMEWORK: the resume audit and its controls"
fi

if [ "$PART" = world-size ]; then
  [ -n "${RESUME_WS:-}" ] || fail "the world-size part needs RESUME_WS (tests/golden/meson.build)"
  # Across a change of world size (RESUME_WS, e.g. 2:1: the straight run and the stop over 2 ranks, the resume over
  # 1): the batches, the lrs and the loaded state must be kept (the step's own results may change with the reduction
  # order); the framework's planted loader bug (RESUME_WS_PLANT, an environment assignment) must be caught with the
  # first difference RESUME_WS_PLANT_WANT (default: the batch of step 5).
  audit_ws() {  # audit_ws NAME [VAR=VALUE...]: the audit across $RESUME_WS into $work/NAME, its exit status in $ws_rc
    local name=$1
    shift
    ws_rc=0
    env "$@" OMP_NUM_THREADS="$threads" "$BIN" golden resume-audit "$work/bundle" --framework "$FRAMEWORK" --at 4 \
      --world-size "$RESUME_WS" --python "$py" --threads "$threads" --out "$work/$name" > "$work/$name.log" 2>&1 ||
      ws_rc=$?
    [ -f "$work/$name/audit.txt" ] || { tail -n 40 "$work/$name.log"; fail "the audit across world sizes did not run"; }
    grep "^across the change of world size" "$work/$name/audit.txt"
  }
  audit_ws ws
  [ $ws_rc = 0 ] && grep -q "^across the change of world size: kept: every batch, every lr and the loaded state" \
    "$work/ws/audit.txt" || fail "stopped and resumed across $RESUME_WS: want the data order, lr and state kept (exit $ws_rc)"
  audit_ws ws-planted "${RESUME_WS_PLANT:?RESUME_WS_PLANT: the planted loader bug of the audit across world sizes}"
  want=${RESUME_WS_PLANT_WANT:-DIFFERENT: the batch of step 5}
  [ $ws_rc = 1 ] && grep -q "^across the change of world size: $want" "$work/ws-planted/audit.txt" ||
    fail "$RESUME_WS_PLANT: want '$want' (exit $ws_rc)"
  echo "ok: $FRAMEWORK: a resume across $RESUME_WS keeps the data order, lr and state; the planted loader bug is caught"
fi

if [ "$PART" = resume ] && [ "$FRAMEWORK" = hf-trainer ]; then
  expect_refused() {  # expect_refused TEXT ARGS...: exit 2 and TEXT said
    local text=$1 rc=0
    shift
    "$BIN" golden resume-audit "$work/bundle" --python "$py" "$@" > "$work/bad.log" 2>&1 || rc=$?
    [ $rc = 2 ] && grep -qF -- "$text" "$work/bad.log" || { cat "$work/bad.log"; fail "$* exited $rc, want 2: $text"; }
    echo "ok: refused: $(grep -F -m1 -- "$text" "$work/bad.log" | cut -c1-150)"
  }
  expect_refused "outside 1..7" --framework hf-trainer --at 8 --out "$work/bad-at"
  expect_refused "no resume audit for it" --framework torch --at 4 --out "$work/bad-fw"
  expect_refused "is not a control" --framework hf-trainer --at 4 --controls memory --out "$work/bad-ctl"
  expect_refused "must split evenly over the ranks" --framework hf-trainer --at 4 --world-size 3:1 --out "$work/bad-ws"
  expect_refused "the controls judge a resume at the world size" --framework hf-trainer --at 4 --world-size 2:1 \
    --controls all --out "$work/bad-ws-ctl"
  expect_refused "each 1..64" --framework hf-trainer --at 4 --world-size 2:0 --out "$work/bad-ws-0"
  # A bundle the Trainer cannot represent (SkipStepAdamW: OLMo-core's optimizer): the adapter's reason, no verdict.
  cp -r "$work/bundle" "$work/skipstep"
  python3 -c 'import json, sys; p = sys.argv[1]; b = json.load(open(p)); b["optim"]["kind"] = "skip_step_adamw"; json.dump(b, open(p, "w"))' \
    "$work/skipstep/bundle.json"
  rc=0
  "$BIN" golden resume-audit "$work/skipstep" --python "$py" --framework hf-trainer --at 4 --out "$work/bad-skip" \
    > "$work/bad.log" 2>&1 || rc=$?
  [ $rc = 2 ] && grep -q "cannot audit: .*skip_step_adamw" "$work/bad.log" && grep -q "nothing was judged" "$work/bad.log" ||
    { cat "$work/bad.log"; fail "a SkipStepAdamW bundle through the Trainer: want exit 2 and the reason (exit $rc)"; }
  echo "ok: refused: $(grep -m1 'cannot audit' "$work/bad.log" | cut -c1-150)"
fi
