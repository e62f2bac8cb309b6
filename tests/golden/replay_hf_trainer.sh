#!/usr/bin/env bash
# meson test golden-replay-hf-trainer: Hugging Face's own Trainer replays a golden bundle of configs/small.toml
# (fp32, 10 steps, demo corpus) within golden/replay/rules-hf-trainer.toml, and fails, naming the step, on a bundle
# with two steps' batches swapped (its own IterableDataset keeps the bundle's order; replay_lib.sh). The lr and
# z-loss controls run against OLMo-core (golden-replay-olmo-core-controls) and TorchTitan, not here: each HF Trainer
# replay costs half a minute of the suite, and the pass itself needs the z-loss and every lr (rules-hf-trainer.toml).
source "${OLMOREF_SOURCE_ROOT:?}/tests/common/shell_test.sh"
set +e  # the replays' exit statuses are the verdicts: each is checked by replay_lib.sh
cd "$SRC" || exit 2
source golden/parity/venv.sh
source tests/golden/replay_lib.sh
skip() { echo "SKIPPED: golden-replay-hf-trainer: $1"; exit 77; }
olmoref_ensure_venv replay_hf_trainer
FRAMEWORK=hf-trainer PY=$py
replay_make_bundle 2
replay_same
replay_controls swapped
exit $replay_failed
