#!/usr/bin/env bash
# meson test golden-replay-fixed: a correct framework's verdict no longer depends on the config's learning rate. A
# replay is judged one step at a time from olmoref's own state (`golden export` writes the states, `golden replay`
# hands them to the framework's trainer before each step), here through the PyTorch reference replay (replay.py):
#   1. configs/tiny.toml, 30 steps (lr 3e-3): --mode both judges every step at fixed state and holds, and reports the
#      free trajectory beside the framework's own spread between two micro-batch sizes; that free trajectory breaks
#      rules-fp32.toml (loss, from about step 13: fp32 noise amplified about 3x a step);
#   2. configs/parity.toml, 10 and 30 steps at its own lr: holds at fixed state;
#   3. sampled states (--states 5,20): only steps 5 and 20 are judged, and they hold;
#   4. controls at fixed state: weight decay on the embeddings too fails update_err at step 2; steps 4 and 7 swapped
#      fail the loss at step 4 (2-4 in one `golden replay` of their five bundles);
# The runs and bundles of 1 and 2 are the suite's shared ones (replay_lib.sh's fixed_configs, made by
# make_shared_runs.sh), which every framework's fp32 replay test replays too, or trained here when there are none.
#   5. bad input: --mode fixed on a bundle without states, --states outside the run or not a step, a judged state
#      without its gradients, a nonzero states.adam_step_offset: exit 2 naming the fix.
source "${OLMOREF_SOURCE_ROOT:?}/tests/common/shell_test.sh"
set +e
cd "$SRC" || exit 2
source golden/parity/venv.sh
source tests/golden/replay_lib.sh
skip() { echo "SKIPPED: golden-replay-fixed: $1"; exit 77; }
olmoref_ensure_venv replay_fixed
threads=${OLMOREF_PEER_THREADS:-1}
fail() { echo "FAIL: $*"; exit 1; }

# The runs and bundles (states: every step) of tiny at 30 steps and parity at 10 and 30 (replay_lib.sh's
# fixed_configs): the suite's shared ones, which the frameworks' fp32 replay tests replay too, else trained here.
# Read only: every export and copy below writes into $work.
fixed_bundles_find
tiny=$fixed_dir/tiny30
replay() {  # replay OUT BUNDLE ARGS...: exit status of golden replay through the PyTorch replay
  local out=$1 bundle=$2
  shift 2
  OMP_NUM_THREADS=$threads "$BIN" golden replay "$bundle" --framework torch --threads "$threads" --python "$py" \
    --out "$work/$out" "$@" > "$work/$out.log" 2>&1
}

# 1. tiny, 30 steps: fixed holds; the free trajectory, which --mode both replays and judges beside it under
# rules-fp32.toml (the same replay and the same rules as --mode free), breaks them.
replay tiny-both "$fixed_dir/bundle-tiny30" --mode both ||
  { tail -n 40 "$work/tiny-both.log"; fail "tiny: the fixed-state replay must hold"; }
cmp=$work/tiny-both/compare.txt
grep -E "^(loss|grad_norm|grad_err|update_err)" "$cmp"
grep -q "rules-fixed.toml" "$cmp" && grep -q "^PASS: every rule holds" "$cmp" || fail "tiny: not judged at fixed state"
[ "$(grep -c '"update_err"' "$work/tiny-both/replay.jsonl")" = 30 ] || fail "tiny: not every step judged"
[ "$(grep -c '"loss"' "$work/tiny-both/free/replay.jsonl")" = 30 ] || fail "tiny: the free trajectory is not 30 steps"
grep -q "under rules-fp32.toml the free trajectory breaks loss (first at step" "$cmp" ||
  { sed -n '/free trajectory/,$p' "$cmp"; fail "tiny's free trajectory was expected to break rules-fp32.toml (loss)"; }
echo "ok: the free trajectory of a correct replay breaks the fixed-rtol rules: $(grep -o 'breaks loss (first at step [0-9]*)' "$cmp")"
grep -q "free trajectory (reported, not gated)" "$cmp" && grep -q "OLMOREF_TORCH_MICROBATCH=1" "$cmp" ||
  fail "tiny: --mode both must report the free trajectory with the framework's own spread"
sed -n '/free trajectory/,$p' "$cmp"
echo "ok: tiny, 30 steps: every step holds at fixed state"

# 2.-4. Every fixed-state bundle below in one `golden replay` (an adapter that takes several bundles replays them in
# one process; each is judged on its own, in $work/fixed/BUNDLE/compare.txt).
# 2. the parity config at its own lr, 10 and 30 steps.
# 3. sampled states: steps 5 and 20 only (the states after 4, 5, 19 and 20).
"$BIN" golden export --run "$tiny" --out "$work/sampled" --states 5,20 > /dev/null || exit 2
[ "$(ls "$work/sampled/states" | wc -l)" = 4 ] || fail "--states 5,20 must write 4 states: $(ls "$work/sampled/states")"
# 4. controls at fixed state.
python3 tests/golden/mutate_bundle.py "$fixed_dir/bundle-tiny30" "$work/decay" --steps 2 --decay-everything || exit 2
python3 tests/golden/mutate_bundle.py "$fixed_dir/bundle-tiny30" "$work/swapped" --steps 4 --swap-batches 4 7 || exit 2
replay fixed "$fixed_dir/bundle-parity10" "$fixed_dir/bundle-parity30" "$work/sampled" "$work/decay" "$work/swapped"
rc=$?
# 1: some bundle's replay differs (the controls'); 0 or 2 (a bundle not replayed) is wrong either way.
[ $rc = 1 ] || { tail -n 40 "$work/fixed.log"; fail "the fixed-state replays: want exit 1 (the controls differ), got $rc"; }
holds() { grep -q "^PASS: every rule holds" "$work/fixed/$1/compare.txt" 2> /dev/null; }
for steps in 10 30; do
  holds bundle-parity$steps || { tail -n 30 "$work/fixed/bundle-parity$steps/compare.txt"; fail "parity, $steps steps"; }
  echo "ok: parity, $steps steps: $(grep -E '^update_err ' "$work/fixed/bundle-parity$steps/compare.txt" | tr -s ' ' | cut -c1-80)"
done
holds sampled || { tail -n 30 "$work/fixed/sampled/compare.txt"; fail "sampled states"; }
[ "$(cut -d, -f1 "$work/fixed/sampled/replay.jsonl" | tr -d '{"step: ' | tr '\n' ' ')" = "5 20 " ] ||
  fail "sampled: judged $(cut -d, -f1 "$work/fixed/sampled/replay.jsonl" | tr '\n' ' ')"
echo "ok: sampled states: steps 5 and 20 judged and hold"
for c in "decay|FAIL: update_err .* first at step 2" "swapped|FAIL: loss .* first at step 4"; do
  name=${c%%|*} want=${c#*|}
  grep -q -- "$want" "$work/fixed/$name/compare.txt" 2> /dev/null ||
    { tail -n 20 "$work/fixed/$name/compare.txt"; fail "control $name: want its replay to differ with '$want'"; }
  echo "ok: control $name: $(grep -m1 -- "$want" "$work/fixed/$name/compare.txt")"
done

# 5. bad input.
"$BIN" golden export --run "$tiny" --out "$work/nostates" --states none > /dev/null || exit 2
expect_fail() {  # expect_fail TEXT COMMAND...: exit 2 and TEXT said
  local text=$1 rc=0
  shift
  "$@" > "$work/bad.log" 2>&1 || rc=$?
  [ $rc = 2 ] && grep -qF -- "$text" "$work/bad.log" || { cat "$work/bad.log"; fail "'$*' exited $rc, want 2 and: $text"; }
  echo "ok: refused: $(grep -F -m1 -- "$text" "$work/bad.log" | cut -c1-160)"
}
expect_fail "golden export --states all" "$BIN" golden replay "$work/nostates" --framework torch --python "$py" \
  --mode fixed --out "$work/bad"
expect_fail "outside the bundle's steps 1..30" "$BIN" golden export --run "$tiny" --out "$work/b1" --states 31
expect_fail "is not a step" "$BIN" golden export --run "$tiny" --out "$work/b2" --states 3,x
[ ! -e "$work/b1/bundle.json" ] && [ ! -e "$work/b2/bundle.json" ] || fail "a refused export left a bundle"
# A bundle whose judged state lost its gradients, and one that says its AdamW step counts run ahead of the steps.
cp -r "$work/sampled" "$work/nograd"
"$py" -c 'import sys; from safetensors.numpy import load_file, save_file
p = sys.argv[1]; t = load_file(p); save_file({k: v for k, v in t.items() if not k.startswith("grad.")}, p)' \
  "$(ls "$work"/nograd/states/*00000005.safetensors)" || exit 2
expect_fail "holds no gradient (grad.*)" "$BIN" golden replay "$work/nograd" --framework torch --python "$py" \
  --mode fixed --out "$work/bad-nograd"
cp -r "$work/sampled" "$work/offset"
python3 -c 'import json, sys; p = sys.argv[1]; b = json.load(open(p)); b["states"]["adam_step_offset"] = 3; json.dump(b, open(p, "w"))' \
  "$work/offset/bundle.json"
expect_fail "states.adam_step_offset is 3" "$BIN" golden replay "$work/offset" --framework torch --python "$py" \
  --mode fixed --out "$work/bad-offset"
echo "PASS: golden-replay-fixed"
