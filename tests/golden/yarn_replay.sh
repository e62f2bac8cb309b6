#!/usr/bin/env bash
# meson test golden-replay-yarn: long-context RoPE scaling (model.rope_scaling = "yarn", Olmo 3's stage-3 recipe) as
# the peers compute it. configs/small.toml (3 sliding-window layers of 128, then full attention; head_dim 16) with
# YaRN factor 4 from a 64-token context, 10 fp32 steps: OLMo-core's own Trainer (YaRNRoPEScalingConfig through its
# with_rope_scaling(full_attn_layers_only=True)) and Hugging Face's Trainer (Olmo3's rope_parameters, YaRN on
# full_attention only) each replay the bundle within their rules; so olmoref scales the same layers with the same
# frequencies and attention factor as both. The bundle with the scaling dropped must fail at step 1, so the
# scaling is seen by the comparison.
source "${OLMOREF_SOURCE_ROOT:?}/tests/common/shell_test.sh"
set +e  # the replays' exit statuses are the verdicts: each is checked here or by replay_lib.sh
cd "$SRC" || exit 2
source golden/parity/venv.sh
source tests/golden/replay_lib.sh
skip() { echo "SKIPPED: golden-replay-yarn: $1"; exit 77; }
olmoref_ensure_venv yarn_replay
hf_py=$py
olmoref_ensure_olmo_core_venv yarn_replay
REPLAY_SET=(--set 'model.rope_scaling="yarn"' --set model.rope_yarn_factor=4.0 --set model.rope_yarn_old_context_len=64)
replay_make_bundle 1
grep -q '"rope_type": "yarn"' "$work/bundle/hf/config.json" || { echo "FAIL: the bundle's hf/config.json has no YaRN"; exit 1; }

FRAMEWORK=olmo-core PY="$OLMOREF_OLMO_CORE_VENV/bin/python"
replay_run
replay_same
FRAMEWORK=hf-trainer PY="$hf_py"
control no-yarn "FAIL: loss .* first at step 1" 1 --drop-rope-scaling
replay_run
replay_same
replay_verdicts
exit $replay_failed
