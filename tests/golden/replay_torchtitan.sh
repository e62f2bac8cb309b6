#!/usr/bin/env bash
# tests/golden/replay_torchtitan.sh — meson test golden-replay-torchtitan: TorchTitan's own Trainer replays a golden
# bundle (`olmoref golden replay --framework torchtitan`, golden/replay/torchtitan_replay.py).
#
#   1. configs/small.toml, 10 fp32 steps on the demo corpus: the replay must hold within
#      golden/replay/rules-torchtitan.toml; prints the rules' rows (worst per-step relative differences).
#   2. one copy of that bundle (tests/golden/mutate_bundle.py) replayed against the unchanged golden trace must fail,
#      naming the step: the z-loss dropped (loss from step 1), which also runs TorchTitan's own CrossEntropyLoss
#      rather than the added ZLossCrossEntropy. The olmo-core controls run all three; each TorchTitan replay costs a
#      full Trainer start, so one is enough here.
# One thread each side (OLMOREF_PEER_THREADS). Exit: 0 as expected; 1 otherwise; 2 an error; 77 "SKIPPED:
# golden-replay-torchtitan: ..." when the venv, TorchTitan's Trainer or the demo corpus cannot be had (never a pass).
source "${OLMOREF_SOURCE_ROOT:?}/tests/common/shell_test.sh"
set +e  # the replays' exit statuses are the verdicts: each is checked by replay_lib.sh
cd "$SRC" || exit 2
source golden/parity/venv.sh
source tests/golden/replay_lib.sh
skip() { echo "SKIPPED: golden-replay-torchtitan: $1"; exit 77; }
olmoref_ensure_venv replay_torchtitan
# The venv's torchtitan is installed without its dependencies; its Trainer imports torchdata (its data loader base)
# and datasets (its validator's text loaders).
"$py" -c "import torchtitan.trainer" > "$work/import.log" 2>&1 ||
  skip "TorchTitan's Trainer cannot be imported from $OLMOREF_VENV ($(tail -n1 "$work/import.log")): it needs \
torchdata and datasets beside torchtitan (docs/golden.md, section 8; bash tools/setup_python.sh)"
FRAMEWORK=torchtitan PY=$py
replay_make_bundle 1
replay_same
grep -E "^torchtitan_replay:" "$work/same.log" || true
control no-z-loss "FAIL: loss .* first at step 1" --z-loss 0
exit $replay_failed
