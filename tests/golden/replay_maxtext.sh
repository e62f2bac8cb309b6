#!/usr/bin/env bash
# tests/golden/replay_maxtext.sh [fp32|fixed|bf16] — meson tests golden-replay-maxtext(-fixed, -bf16): MaxText's own
# trainer (JAX on
# the CPU) replays a golden bundle (`olmoref golden replay --framework maxtext`, golden/replay/maxtext_replay.py), its
# weights converted into an Orbax checkpoint by MaxText's own converter (golden/replay/maxtext_export.py).
#
# bf16: configs/small.toml, 10 bf16 steps, replayed in MaxText's own bf16 mixed precision within
# golden/replay/rules-maxtext-bf16.toml, then the three controls (the dropped z-loss by the z rule, the lr 1 % high at
# step 2). fp32:
#
#   1. configs/small.toml, 10 fp32 steps on the demo corpus: the replay must hold at fixed state
#      (golden/replay/rules-fixed.toml); prints the rules' rows (worst per-step relative differences).
#   2. copies of that bundle (tests/golden/mutate_bundle.py) replayed against the unchanged golden trace must fail,
#      naming the step: steps 4 and 7 on each other's batch (loss from step 4), step 6's lr 1 % high (lr at step 6).
#      Each control is cut after its step.
#      The golden bundle and the controls replay in one Python process (replay_lib.sh).
# fixed (a test of its own, so that neither part nears the per-test budget on the slowest machine, where the JAX
# compilation cache starts cold: each bundle compiles MaxText's step anew):
#   1. configs/tiny.toml at 10 and 30 steps (replay_lib.sh's fixed_configs) must hold at fixed state with every step
#      judged, and the small bundle's other two controls must fail naming their step: the z-loss dropped (loss from
#      step 1), weight decay on the embeddings too (update_err at step 2); in one Python process;
#   2. bundles MaxText's Olmo 3 block cannot express are refused with exit 2, naming the key, in one process:
#      configs/parity.toml's three layers [16, 16, -1] at 10 and 30 steps, and a 2:1 window pattern.
# One thread each side (OLMOREF_PEER_THREADS). Exit: 0 as expected; 1 otherwise; 2 an error; 77 "SKIPPED:
# golden-replay-maxtext: ..." when MaxText's environment or the demo corpus cannot be had (never a pass).
source "${OLMOREF_SOURCE_ROOT:?}/tests/common/shell_test.sh"
set +e  # the replays' exit statuses are the verdicts: each is checked by replay_lib.sh
cd "$SRC" || exit 2
source golden/parity/venv.sh
source tests/golden/replay_lib.sh
skip() { echo "SKIPPED: golden-replay-maxtext: $1"; exit 77; }
olmoref_ensure_maxtext_venv replay_maxtext
FRAMEWORK=maxtext PY="$OLMOREF_MAXTEXT_VENV/bin/python"
if [ "${1:-fp32}" = bf16 ]; then
  REPLAY_PRECISION=bf16 replay_make_bundle 1
  replay_controls swapped lr
  # The dropped z-loss (7.6e-5 of the loss) hides inside the bf16 loss limit; the z rule must see it.
  control no-z-loss "FAIL: .*\bz [^;]*first at step 1\b" 1 --z-loss 0
  replay_run
  replay_same_bf16 rules-maxtext-bf16.toml "dtype=bfloat16, weight_dtype=float32" "MaxText's bf16 mixed precision"
  replay_verdicts
  exit $replay_failed
fi
# MaxText's Olmo 3 layer cycle is fixed at three sliding-window layers and a global one: another pattern must be
# refused before anything runs, not replayed on the wrong attention. refused BUNDLE|PATTERN...: one start for them all.
refused() {
  local bundles=() c
  for c in "$@"; do bundles+=("${c%%|*}"); done
  replay pattern "${bundles[@]}"
  local rc=$?
  for c in "$@"; do
    local name want
    name=$(basename "${c%%|*}") want="$name/bundle.json: model.swa_pattern [${c#*|}]; MaxText's Olmo 3 block runs"
    if [ $rc -eq 2 ] && grep -qF "$want" "$work/pattern.log" && [ ! -e "$work/pattern/$name/replay.jsonl" ]; then
      echo "ok: $name: refused: $(grep -m1 -F "$want" "$work/pattern.log" | sed 's/.*bad bundle: //')"
    else
      tail -n 20 "$work/pattern.log"; echo "FAIL: $name: want exit 2 naming model.swa_pattern, got exit $rc"; replay_failed=1
    fi
  done
}
replay_make_bundle 1
if [ "${1:-fp32}" = fixed ]; then
  # Two of the small bundle's controls beside the fixed configs, in their start (each bundle compiles MaxText's step
  # anew: 8 s each on a cold compilation cache, which a fresh machine has).
  replay_controls no-z-loss decay
  replay_fixed_plan tiny10 tiny30
  replay_run --no-bundle
  replay_fixed_verdicts
  replay_verdicts
  python3 - "$work/bundle" "$work/pattern-bundle" <<'PY' || exit 2
import json, shutil, sys
src, dst = sys.argv[1:]
shutil.copytree(src, dst)
meta = json.load(open(f"{dst}/bundle.json"))
meta["model"]["swa_pattern"] = [128, 128, -1, -1]
json.dump(meta, open(f"{dst}/bundle.json", "w"))
PY
  # configs/parity.toml's three layers [16, 16, -1] (its bundles of fixed_configs) and a 2:1 pattern, in one start.
  refused "$fixed_dir/bundle-parity10|16, 16, -1" "$fixed_dir/bundle-parity30|16, 16, -1" \
    "$work/pattern-bundle|128, 128, -1, -1"
  exit $replay_failed
fi
replay_controls swapped lr
replay_run
replay_same
replay_verdicts
exit $replay_failed
