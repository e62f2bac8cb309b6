# tests/golden/replay_lib.sh — sourced by the framework replay tests (replay_hf_trainer.sh, olmo_core_replay.sh): the
# golden bundle they replay, one replay through `olmoref golden replay`, and the negative controls every framework
# must fail. The caller sets BIN (the build's olmoref), FRAMEWORK, PY (its Python), `work` (a scratch directory) and
# `skip REASON`.

# configs/small.toml, 10 fp32 steps (REPLAY_PRECISION=bf16: bf16) on the demo corpus, exported to $work/bundle; the
# caller's REPLAY_SET array (if any) adds `--set` arguments.
replay_make_bundle() {
  bash data/demo/make_demo_corpus.sh "$work/demo" "$BIN" > "$work/demo.log" 2>&1 ||
    skip "the demo corpus could not be built ($(grep -m1 'make_demo_corpus:' "$work/demo.log"))"
  "$BIN" train --config configs/small.toml --steps 10 --set "data.train_mix=\"$work/demo/train.mix\"" \
    --set "data.holdout_mix=\"$work/demo/holdout.mix\"" --set "train.precision=\"${REPLAY_PRECISION:-fp32}\"" --set eval.interval=0 \
    ${REPLAY_SET[@]+"${REPLAY_SET[@]}"} --threads "${1:-2}" --out "$work/run" --quiet || exit 2
  "$BIN" golden export --run "$work/run" --out "$work/bundle" > /dev/null || exit 2
}

replay() {  # replay BUNDLE NAME: the replay's exit status; its output in $work/NAME.log
  local threads=${OLMOREF_PEER_THREADS:-1}
  OMP_NUM_THREADS=$threads "$BIN" golden replay "$1" --framework "$FRAMEWORK" --threads "$threads" --python "$PY" \
    --out "$work/$2" > "$work/$2.log" 2>&1
}

# The golden bundle itself must replay within the framework's rules; prints the rules' rows.
replay_same() {
  replay "$work/bundle" same
  local rc=$?
  grep -E "^(loss|ce|z|lr|grad_norm)" "$work/same/compare.txt" || true
  [ $rc -eq 0 ] || { cat "$work/same.log"; echo "FAIL: $FRAMEWORK's replay of the golden bundle (exit $rc)"; exit 1; }
  echo "ok: $FRAMEWORK replays the golden bundle within its rules"
}

# A bf16 bundle ($work/bundle, REPLAY_PRECISION=bf16) must replay within the framework's bf16 rules RULES_FILE, in the
# framework's own mixed precision, which its report names with the text MARK (WHAT says which, for the failure).
replay_same_bf16() {  # replay_same_bf16 RULES_FILE MARK WHAT
  replay_same
  grep -q "$1" "$work/same/compare.txt" || { echo "FAIL: a bf16 bundle was not judged by $1"; exit 1; }
  grep -qF -- "$2" "$work/same/report.json" || { echo "FAIL: the replay did not run $3"; exit 1; }
}

replay_failed=0
control() {  # control NAME "FIRST FAILING TEXT" MUTATION...: a mutated bundle must fail, naming the step
  local name=$1 want=$2 rc
  shift 2
  python3 tests/golden/mutate_bundle.py "$work/bundle" "$work/$name-bundle" "$@" || exit 2
  replay "$work/$name-bundle" "$name"
  rc=$?
  if [ $rc -eq 1 ] && grep -q -- "$want" "$work/$name.log"; then
    echo "ok: $name: the replay fails: $(grep -m1 -- "$want" "$work/$name.log")"
  else
    tail -n 20 "$work/$name.log"; echo "FAIL: $name: want exit 1 and '$want', got exit $rc"; replay_failed=1
  fi
}

# Steps 4 and 7 on each other's batch, step 6's lr 1 % high, the z-loss dropped: each must fail at its step.
# replay_controls [NAME...]: those of the three (swapped, lr, no-z-loss); all three without arguments.
replay_controls() {
  local names=" ${*:-swapped lr no-z-loss} "
  [[ $names != *" swapped "* ]] || control swapped "FAIL: loss .* first at step 4" --swap-batches 4 7
  [[ $names != *" lr "* ]] || control lr "FAIL: .*first at step 6" --lr-step 6 --lr-factor 1.01
  [[ $names != *" no-z-loss "* ]] || control no-z-loss "FAIL: loss .* first at step 1" --z-loss 0
}
