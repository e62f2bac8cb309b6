#!/usr/bin/env bash
# tests/golden/replay_torchtitan.sh [fp32|bf16 [controls]] — meson tests golden-replay-torchtitan(-bf16, -bf16-controls): TorchTitan's own
# Trainer replays a golden bundle (`olmoref golden replay --framework torchtitan`, golden/replay/torchtitan_replay.py).
#
#   1. configs/small.toml, 10 fp32 steps on the demo corpus: the replay must hold at fixed state
#      (golden/replay/rules-fixed.toml); prints the rules' rows (worst per-step relative differences).
#      bf16: 10 bf16 steps, replayed in TorchTitan's own bf16 mixed precision (mixed_precision_param bfloat16,
#      mixed_precision_reduce float32: FSDP2's MixedPrecisionPolicy), within golden/replay/rules-torchtitan-bf16.toml.
#   2. copies of that bundle (tests/golden/mutate_bundle.py) replayed against the unchanged golden trace must fail,
#      naming the step: the z-loss dropped (loss from step 1; in bf16 z from step 1), which also runs TorchTitan's
#      own CrossEntropyLoss rather than the added ZLossCrossEntropy; steps 4 and 7 on each other's batch (loss from
#      step 4); step 6's lr 1 % high (lr at step 6; bf16: step 2's); fp32: weight decay on the embeddings too
#      (update_err at step 2). Each control is cut after its step.
#   3. fp32: configs/tiny.toml and configs/parity.toml at 10 and 30 steps (replay_lib.sh's fixed_configs)
#      must each hold at fixed state with every step judged.
#   The golden bundle, the controls and the bundles of 3 are replayed by one Python process, each a full Trainer
#   build (replay_lib.sh).
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
if [ "${1:-fp32}" = bf16 ]; then
  replay_bf16 "${2:-}" rules-torchtitan-bf16.toml "mixed_precision_param bfloat16" \
    "TorchTitan's bf16 mixed precision"
fi
replay_make_bundle 1
replay_controls
replay_fixed_plan tiny10 tiny30 parity10 parity30
replay_run
replay_same
replay_verdicts
replay_fixed_verdicts
exit $replay_failed
