#!/usr/bin/env bash
# meson test train-z-loss: train.z_loss is the multiplier the loss uses, not only a key that is read and hashed.
#   1. z_loss = 0: every step's z is 0 and loss is ce to the bit (plain cross-entropy, as TorchTitan and Megatron
#      compute it); step 1 has the default run's ce (same weights) but the update differs (no z gradient);
#   2. z_loss = 1e-3: step 1's z is 100 times the default's (1e-5) at the same weights.
source "${OLMOREF_SOURCE_ROOT:?}/tests/common/shell_test.sh"
python3 "$SRC/golden/traces/make_tiny_corpus.py" "$work/tiny.u16"
run() {  # run NAME [--set ...]: two steps of configs/tiny.toml
  local name=$1; shift
  "$BIN" train --config "$SRC/configs/tiny.toml" --set "data.train_files=[\"$work/tiny.u16\"]" "$@" --steps 2 \
    --out "$work/$name" --threads 2 --quiet
}
run default
run zero --set train.z_loss=0
run big --set train.z_loss=0.001
python3 - "$work" <<'PY'
import json, sys
def trace(name):
    return [json.loads(l) for l in open(f"{sys.argv[1]}/{name}/trace.jsonl")]
default, zero, big = trace("default"), trace("zero"), trace("big")
for r in zero:
    assert r["z"] == 0.0, f"z_loss=0 but step {r['step']} has z = {r['z']}"
    assert r["loss_hex"] == r["ce_hex"], f"z_loss=0 but step {r['step']} loss {r['loss_hex']} != ce {r['ce_hex']}"
assert zero[0]["ce_hex"] == default[0]["ce_hex"], "step 1's cross-entropy must not depend on z_loss"
assert zero[0]["param_digest"] != default[0]["param_digest"], "z_loss=0 must change the update (no z gradient)"
assert default[0]["z"] > 0
ratio = big[0]["z"] / default[0]["z"]
assert abs(ratio - 100) < 1e-3, f"z_loss 1e-3 vs 1e-5: z ratio {ratio}, want 100"
print(f"z_loss 0: z 0, loss == ce at both steps; z_loss 1e-3 / 1e-5 at step 1: z ratio {ratio:.6f}")
PY
