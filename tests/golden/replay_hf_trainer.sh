#!/usr/bin/env bash
# meson test golden-replay-hf-trainer: Hugging Face's own Trainer replays a golden bundle of configs/small.toml
# (fp32, 10 steps, demo corpus) within golden/replay/rules-hf-trainer.toml, and fails, naming the step, on a bundle
# with two steps' batches swapped, one step's lr changed by 1 %, and the z-loss silently dropped.
source "${OLMOREF_SOURCE_ROOT:?}/tests/common/shell_test.sh"
set +e  # the replays' exit statuses are the verdicts: each is checked below
cd "$SRC" || exit 2
source golden/parity/venv.sh
skip() { echo "SKIPPED: golden-replay-hf-trainer: $1"; exit 77; }
olmoref_ensure_venv replay_hf_trainer
bash data/demo/make_demo_corpus.sh "$work/demo" "$BIN" > "$work/demo.log" 2>&1 ||
  skip "the demo corpus could not be built ($(grep -m1 'make_demo_corpus:' "$work/demo.log"))"
"$BIN" train --config configs/small.toml --steps 10 --set "data.train_mix=\"$work/demo/train.mix\"" \
  --set "data.holdout_mix=\"$work/demo/holdout.mix\"" --set train.precision=\"fp32\" --set eval.interval=0 \
  --threads 2 --out "$work/run" --quiet || exit 2
"$BIN" golden export --run "$work/run" --out "$work/bundle" > /dev/null || exit 2
threads=${OLMOREF_PEER_THREADS:-1}
replay() {  # replay BUNDLE NAME: the replay's exit status; its output in $work/NAME.log
  OMP_NUM_THREADS=$threads "$BIN" golden replay "$1" --framework hf-trainer --threads "$threads" --python "$py" \
    --out "$work/$2" > "$work/$2.log" 2>&1
}
replay "$work/bundle" same
rc=$?
grep -E "^(loss|lr|grad_norm)" "$work/same/compare.txt" || true
[ $rc -eq 0 ] || { cat "$work/same.log"; echo "FAIL: the Trainer's replay of the golden bundle (exit $rc)"; exit 1; }
echo "ok: the Trainer replays the golden bundle within rules-hf-trainer.toml"

failed=0
control() {  # control NAME "FIRST FAILING TEXT" MUTATION...
  local name=$1 want=$2 rc
  shift 2
  python3 tests/golden/mutate_bundle.py "$work/bundle" "$work/$name-bundle" "$@" || exit 2
  replay "$work/$name-bundle" "$name"
  rc=$?
  if [ $rc -eq 1 ] && grep -q -- "$want" "$work/$name.log"; then
    echo "ok: $name: the replay fails: $(grep -m1 -- "$want" "$work/$name.log")"
  else
    tail -n 20 "$work/$name.log"; echo "FAIL: $name: want exit 1 and '$want', got exit $rc"; failed=1
  fi
}
control swapped "FAIL: loss .* first at step 4" --swap-batches 4 7
control lr "FAIL: .*first at step 6" --lr-step 6 --lr-factor 1.01
control no-z-loss "FAIL: loss .* first at step 1" --z-loss 0
exit $failed
