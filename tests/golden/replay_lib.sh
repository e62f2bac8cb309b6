# tests/golden/replay_lib.sh — sourced by the framework replay tests (replay_hf_trainer.sh, olmo_core_replay.sh, ...):
# the golden bundle they replay, the negative controls every framework must fail, and one `olmoref golden replay`
# that runs the golden bundle and every control in one start of the framework (its import and set-up paid once). The
# caller sets BIN (the build's olmoref), FRAMEWORK, PY (its Python), `work` (a scratch directory) and `skip REASON`.
#
# The flow: replay_make_bundle; `control ...`/`replay_controls` to plan the controls; replay_fixed_plan for the
# fixed-state bundles of other configs; replay_run; then the verdicts: replay_same (or replay_same_bf16) for the golden
# bundle, replay_verdicts for the controls, replay_fixed_verdicts for the others. Each replay's trace, report and
# comparison are in $work/replays/NAME/ (the golden bundle's NAME is "bundle", another config's "bundle-NAME"); the
# run's output in $work/replays.log. make_shared_runs.sh sources it too, for fixed_bundles_make.

# configs/small.toml, 10 fp32 steps (REPLAY_PRECISION=bf16: bf16) on the demo corpus, exported to $work/bundle; the
# caller's REPLAY_SET array (if any) adds `--set` arguments. Without one, the bundle trained once for the whole suite
# by this binary is copied when there is one (olmoref_shared_runs, golden/parity/venv.sh).
replay_make_bundle() {
  if [ -z "${REPLAY_SET+x}" ]; then
    olmoref_shared_runs "$BIN"
    # A copy whose states/ (olmoref's state after each step, what the fixed-state replay starts from) is linked.
    if [ -n "$shared" ]; then
      python3 tests/golden/mutate_bundle.py "$shared/bundle-${REPLAY_PRECISION:-fp32}" "$work/bundle" || exit 2
      return
    fi
  fi
  bash data/demo/make_demo_corpus.sh "$work/demo" "$BIN" > "$work/demo.log" 2>&1 ||
    skip "the demo corpus could not be built ($(grep -m1 'make_demo_corpus:' "$work/demo.log"))"
  "$BIN" train --config configs/small.toml --steps 10 --set "data.train_mix=\"$work/demo/train.mix\"" \
    --set "data.holdout_mix=\"$work/demo/holdout.mix\"" --set "train.precision=\"${REPLAY_PRECISION:-fp32}\"" --set eval.interval=0 \
    ${REPLAY_SET[@]+"${REPLAY_SET[@]}"} --threads "${1:-2}" --out "$work/run" --quiet || exit 2
  # The states are retrained on as many threads as the run (golden export's default, every core, only adds the
  # threads' overhead where the suite already runs two tests at once).
  "$BIN" golden export --run "$work/run" --out "$work/bundle" --threads "${1:-2}" > /dev/null || exit 2
}

# Issue 45's other configs at their own learning rates, judged at fixed state: configs/tiny.toml and
# configs/parity.toml, 10 and 30 steps each, on tests/make_tokens.py's documents (the parity config's vocabulary is
# 256: the same documents folded below it), each exported with olmoref's state after every step.
fixed_configs="tiny10:configs/tiny.toml:10:tokens.u16 tiny30:configs/tiny.toml:30:tokens.u16
  parity10:configs/parity.toml:10:tokens256.u16 parity30:configs/parity.toml:30:tokens256.u16"

# fixed_bundles_make DIR BIN THREADS: DIR/NAME (the run) and DIR/bundle-NAME (its bundle) for each of fixed_configs,
# then DIR/done (the list they were made from). Run from the source root; make_shared_runs.sh makes them once for the
# suite.
fixed_bundles_make() {
  local dir=$1 bin=$2 threads=$3 spec name config steps tokens
  mkdir -p "$dir" || return 1
  python3 tests/make_tokens.py "$dir/tokens.u16" 3 60000 > /dev/null || return 1
  python3 -c 'import sys, array; t = array.array("H", open(sys.argv[1], "rb").read()); open(sys.argv[2], "wb").write(array.array("H", (x % 256 for x in t)).tobytes())' \
    "$dir/tokens.u16" "$dir/tokens256.u16" || return 1
  for spec in $fixed_configs; do
    IFS=: read -r name config steps tokens <<< "$spec"
    "$bin" train --config "$config" --steps "$steps" --set "data.train_files=[\"$dir/$tokens\"]" --set eval.interval=0 \
      --threads "$threads" --out "$dir/$name" --quiet || return 1
    "$bin" golden export --run "$dir/$name" --out "$dir/bundle-$name" --threads "$threads" > "$dir/$name-export.log" ||
      { cat "$dir/$name-export.log"; return 1; }
    grep -q "every record equal to the trace's" "$dir/$name-export.log" || { echo "$name: the export wrote no states"; return 1; }
  done
  echo "$fixed_configs" > "$dir/done"  # what they are: a list changed since leaves them stale
}

# fixed_bundles_find: sets `fixed_dir` to the folder of fixed_bundles_make's runs and bundles: the suite's shared runs'
# (OLMOREF_SHARED_RUNS/fixed) when this very binary made them from this list (they need no demo corpus: made even
# where it cannot be built), else $work/fixed-runs, trained now on one thread. Nothing in them is changed: read or copied only.
fixed_bundles_find() {
  fixed_dir=${OLMOREF_SHARED_RUNS:-/nonexistent}/fixed
  [ "$(cat "$fixed_dir/done" 2> /dev/null)" = "$fixed_configs" ] &&
    [ "$(cat "$OLMOREF_SHARED_RUNS/olmoref.sha256" 2> /dev/null)" = "$(sha256sum "$BIN" | cut -d' ' -f1)" ] && return 0
  fixed_dir=$work/fixed-runs
  fixed_bundles_make "$fixed_dir" "$BIN" 1 > "$work/fixed-runs.log" 2>&1 ||
    { tail -n 20 "$work/fixed-runs.log"; echo "the fixed-state runs could not be trained"; exit 2; }
}

fixed_names=()
# replay_fixed_plan NAME...: those bundles of fixed_configs join the framework's one start (replay_run); each must hold
# at fixed state (replay_fixed_verdicts).
replay_fixed_plan() {
  fixed_bundles_find
  fixed_names+=("$@")
}

# replay OUT BUNDLE...: one framework start for every BUNDLE; output in $work/OUT.log, results in $work/OUT/NAME/ (NAME
# each bundle's folder name).
replay() {
  local out=$1 threads=${OLMOREF_PEER_THREADS:-1}
  shift
  # One bundle: golden replay's --out is that bundle's own folder.
  [ $# -gt 1 ] || out="$out/$(basename "$1")"
  OMP_NUM_THREADS=$threads "$BIN" golden replay "$@" --framework "$FRAMEWORK" --threads "$threads" --python "$PY" \
    --out "$work/$out" > "$work/${out%%/*}.log" 2>&1
}

control_names=() control_wants=()
# control NAME "FIRST FAILING TEXT" STEP MUTATION...: plans a copy of the golden bundle with one thing changed
# (tests/golden/mutate_bundle.py), cut after STEP, the step it must fail at: its steps before STEP must hold, STEP
# must fail with the text; no later step can change that verdict, so none is replayed.
control() {
  local name=$1 want=$2 step=$3
  shift 3
  python3 tests/golden/mutate_bundle.py "$work/bundle" "$work/controls/$name" --steps "$step" "$@" || exit 2
  control_names+=("$name")
  control_wants+=("$want")
}

# Steps 4 and 7 on each other's batch, one step's lr 1 % high, the z-loss dropped: each must fail at its step. An fp32
# bundle (with olmoref's states) is judged at fixed state, which also sees a lost parameter group at once: weight
# decay on the embeddings too fails update_err at step 2 (at step 1, Adam's first update, it is inside that step's
# limit). The lr is step 6's in fp32 and step 2's in bf16: the lr rule compares the lr the optimizer stepped with,
# exactly or to 1e-7, so every step sees a 1 % change alike, and a bf16 step without AVX-512 costs seconds.
# replay_controls [NAME...]: plans those of the four (swapped, lr, no-z-loss, decay); all without arguments (decay only
# for a bundle with states).
replay_controls() {
  local all="swapped lr no-z-loss" lr_step=6
  [ ! -d "$work/bundle/states" ] || all+=" decay"
  ! grep -q '"precision": *"bf16"' "$work/bundle/bundle.json" || lr_step=2
  local names=" ${*:-$all} "
  [[ $names != *" swapped "* ]] || control swapped "FAIL: loss .* first at step 4" 4 --swap-batches 4 7
  [[ $names != *" lr "* ]] ||
    control lr "FAIL: .*\blr [^;]*first at step $lr_step\b" $lr_step --lr-step $lr_step --lr-factor 1.01
  [[ $names != *" no-z-loss "* ]] || control no-z-loss "FAIL: loss .* first at step 1" 1 --z-loss 0
  [[ $names != *" decay "* ]] || control decay "FAIL: update_err .* first at step 2" 2 --decay-everything
}

# replay_run [--no-bundle]: the golden bundle (unless --no-bundle) and every planned control, in one framework start.
replay_run() {
  local bundles=()
  [ "${1:-}" = --no-bundle ] || bundles+=("$work/bundle")
  for name in ${control_names[@]+"${control_names[@]}"}; do bundles+=("$work/controls/$name"); done
  for name in ${fixed_names[@]+"${fixed_names[@]}"}; do bundles+=("$fixed_dir/bundle-$name"); done
  replay replays "${bundles[@]}"
  replay_rc=$?
  # 0: all hold; 1: one differs (a control's verdict is read from its comparison); 2: a bundle did not replay.
  if [ $replay_rc -ne 0 ] && [ $replay_rc -ne 1 ]; then
    tail -n 40 "$work/replays.log"; echo "FAIL: $FRAMEWORK's replay did not run (exit $replay_rc)"; exit 1
  fi
  grep -E "^$(echo "$FRAMEWORK" | tr - _)_replay.*steps through" "$work/replays.log" || true
}

# The golden bundle itself must replay within the framework's rules; prints the rules' rows.
replay_same() {
  local cmp=$work/replays/bundle/compare.txt
  grep -E "^(loss|ce|z|lr|grad_norm|grad_err|update_err)" "$cmp" 2> /dev/null || true
  grep -q "^PASS: every rule holds" "$cmp" 2> /dev/null ||
    { tail -n 40 "$work/replays.log"; echo "FAIL: $FRAMEWORK's replay of the golden bundle does not hold"; exit 1; }
  # A bundle with olmoref's states is judged one step at a time (golden replay's default for it).
  [ ! -d "$work/bundle/states" ] || grep -q "rules-fixed.toml" "$cmp" ||
    { echo "FAIL: a bundle with states was not judged at fixed state (rules-fixed.toml)"; exit 1; }
  echo "ok: $FRAMEWORK replays the golden bundle within its rules"
}

# A bf16 bundle ($work/bundle, REPLAY_PRECISION=bf16) must replay within the framework's bf16 rules RULES_FILE, in the
# framework's own mixed precision, which its report names with the text MARK (WHAT says which, for the failure).
replay_same_bf16() {  # replay_same_bf16 RULES_FILE MARK WHAT
  replay_same
  grep -q "$1" "$work/replays/bundle/compare.txt" || { echo "FAIL: a bf16 bundle was not judged by $1"; exit 1; }
  grep -qF -- "$2" "$work/replays/bundle/report.json" || { echo "FAIL: the replay did not run $3"; exit 1; }
}

# A bf16 test of a framework whose bf16 replay and three controls would not fit the per-test budget on the slowest
# machine together (docs/testing.md), in two parts: without "controls", the golden bf16 bundle within RULES_FILE in the
# framework's own mixed precision (replay_same_bf16) and the dropped z-loss, which the z rule must see (its 7.6e-5
# share of the loss is inside or near the bf16 loss limits); with "controls", the swapped batches and the changed lr.
replay_bf16() {  # replay_bf16 PART RULES_FILE MARK WHAT; exits with the verdict
  REPLAY_PRECISION=bf16 replay_make_bundle 1
  if [ "$1" = controls ]; then
    replay_controls swapped lr
    replay_run --no-bundle
  else
    control no-z-loss "FAIL: .*\bz [^;]*first at step 1\b" 1 --z-loss 0
    replay_run
    replay_same_bf16 "$2" "$3" "$4"
  fi
  replay_verdicts
  exit $replay_failed
}

replay_failed=0
# Each planned bundle of fixed_configs must hold under rules-fixed.toml, every one of its steps judged; prints the
# worst of each quantity.
replay_fixed_verdicts() {
  local name steps dir
  for name in ${fixed_names[@]+"${fixed_names[@]}"}; do
    dir=$work/replays/bundle-$name steps=${name//[a-z]/}
    if grep -q "^PASS: every rule holds" "$dir/compare.txt" 2> /dev/null && grep -q "rules-fixed.toml" "$dir/compare.txt" &&
       [ "$(grep -c '"update_err"' "$dir/replay.jsonl")" = "$steps" ]; then
      grep -E "^(loss|z|grad_norm|grad_err|update_err)" "$dir/compare.txt" | sed "s/^/$name: /"
      echo "ok: $name: $FRAMEWORK holds at fixed state, all $steps steps judged"
    else
      tail -n 20 "$dir/compare.txt" 2> /dev/null || grep -A3 "bundle-$name" "$work/replays.log" | tail -n 20
      echo "FAIL: $name: want $FRAMEWORK's replay to hold under rules-fixed.toml with all $steps steps judged"
      replay_failed=1
    fi
  done
}

# Each planned control must have failed, its comparison naming its step.
replay_verdicts() {
  local i name want cmp
  for i in ${control_names[@]+"${!control_names[@]}"}; do
    name=${control_names[$i]} want=${control_wants[$i]} cmp=$work/replays/$name/compare.txt
    if grep -q -- "$want" "$cmp" 2> /dev/null; then
      echo "ok: $name: the replay fails: $(grep -m1 -- "$want" "$cmp")"
    else
      tail -n 20 "$cmp" 2> /dev/null || grep -A3 "$name" "$work/replays.log" | tail -n 20
      echo "FAIL: $name: want its replay to fail with '$want'"; replay_failed=1
    fi
  done
}
