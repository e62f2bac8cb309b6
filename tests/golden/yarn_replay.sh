#!/usr/bin/env bash
# meson test golden-replay-yarn: long-context RoPE scaling (model.rope_scaling = "yarn", Olmo 3's stage-3 recipe) as
# the peers compute it. configs/tiny.toml (3 sliding-window layers of 16, then full attention; head_dim 16, theta 5e5,
# 64-token sequences) with YaRN factor 4 from a 48-token context, 10 fp32 steps: OLMo-core's own Trainer
# (YaRNRoPEScalingConfig through its with_rope_scaling(full_attn_layers_only=True)) and Hugging Face's Trainer (Olmo3's
# rope_parameters, YaRN on full_attention only) each replay the bundle within their rules; so olmoref scales the same
# layers with the same frequencies and attention factor as both. The bundle with the scaling dropped must fail at
# step 1, so the scaling is seen by the comparison.
# Why 48 and not 64 / 4 = 16: the old context L enters YaRN only through the ramp's ends, floor(dim(32)) and
# ceil(dim(1)) with dim(n) = 16 ln(L / 2 pi n) / (2 ln 5e5), and every L from 33 to 63 gives (0, 2), the ends of
# configs/small.toml at 64 (4 x 64 = its 256 tokens). So the full-attention layer gets small's table: frequency 0
# unscaled, frequency 1 halfway along the ramp (0.625 of its own), 2 to 7 divided by 4, attention factor 1.139. An L of
# 32 or less (the 16 of 4 x 16 = 64, the 32 of 2 x 32) leaves no frequency partway along the ramp, so a wrong blend
# there would pass; 48 still puts the last 16 positions, one window, past the old context. Small costs 3.6 times the CPU
# (the demo corpus it trains on built first).
source "${OLMOREF_SOURCE_ROOT:?}/tests/common/shell_test.sh"
set +e  # the replays' exit statuses are the verdicts: each is checked here or by replay_lib.sh
cd "$SRC" || exit 2
source golden/parity/venv.sh
source tests/golden/replay_lib.sh
skip() { echo "SKIPPED: golden-replay-yarn: $1"; exit 77; }
olmoref_ensure_venv yarn_replay
hf_py=$py
olmoref_ensure_olmo_core_venv yarn_replay
# replay_make_bundle trains configs/small.toml only: the tiny bundle is made as it makes one (states included, so
# judged at fixed state), on one thread.
python3 tests/make_tokens.py "$work/tokens.u16" 3 20000 > /dev/null || exit 2
"$BIN" train --config configs/tiny.toml --steps 10 --set "data.train_files=[\"$work/tokens.u16\"]" \
  --set 'train.precision="fp32"' --set eval.interval=0 --set 'model.rope_scaling="yarn"' \
  --set model.rope_yarn_factor=4.0 --set model.rope_yarn_old_context_len=48 \
  --threads 1 --out "$work/run" --quiet || exit 2
"$BIN" golden export --run "$work/run" --out "$work/bundle" --threads 1 > /dev/null || exit 2
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
