#!/usr/bin/env bash
# tests/golden/replay_hf_trainer.sh [fp32|bf16 [controls]] — meson tests golden-replay-hf-trainer(-bf16, -bf16-controls): Hugging Face's own
# Trainer replays a golden bundle of configs/small.toml (10 steps, demo corpus).
#   fp32  judged at fixed state (golden/replay/rules-fixed.toml), then the four controls (replay_lib.sh), each of
#         which must fail naming the step: steps 4 and 7 on each other's batch (loss from step 4; its own
#         IterableDataset keeps the bundle's order), step 6's lr 1 % high (lr at step 6), the z-loss dropped (loss
#         from step 1), weight decay on the embeddings too (update_err at step 2); and in the same start
#         configs/tiny.toml and configs/parity.toml at 10 and 30 steps (replay_lib.sh's fixed_configs), each
#         holding at fixed state with every step judged.
#   bf16  a bf16 bundle replayed in Hugging Face's own FSDP2 mixed precision (param_dtype bfloat16, reduce_dtype
#         float32) within golden/replay/rules-hf-trainer-bf16.toml, then the three controls in bf16: the dropped
#         z-loss (z from step 1: its 7.6e-5 share of the loss is inside the bf16 loss limit), steps 4 and 7 swapped
#         (loss from step 4), step 2's lr 1 % high (lr at step 2).
# Each control is cut after its step; the golden bundle and its controls replay in one Python process (replay_lib.sh).
source "${OLMOREF_SOURCE_ROOT:?}/tests/common/shell_test.sh"
set +e  # the replays' exit statuses are the verdicts: each is checked by replay_lib.sh
cd "$SRC" || exit 2
source golden/parity/venv.sh
source tests/golden/replay_lib.sh
skip() { echo "SKIPPED: golden-replay-hf-trainer: $1"; exit 77; }
olmoref_ensure_venv replay_hf_trainer
FRAMEWORK=hf-trainer PY=$py
if [ "${1:-fp32}" = bf16 ]; then
  replay_bf16 "${2:-}" rules-hf-trainer-bf16.toml "MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)" \
    "Hugging Face's FSDP2 bf16 mixed precision"
fi
replay_make_bundle 2
replay_controls
replay_fixed_plan tiny10 tiny30 parity10 parity30
replay_run
replay_same
replay_verdicts
replay_fixed_verdicts
exit $replay_failed
