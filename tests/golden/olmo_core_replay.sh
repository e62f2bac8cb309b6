#!/usr/bin/env bash
# tests/golden/olmo_core_replay.sh pass|moe|bf16 [controls] — meson tests golden-replay-olmo-core(-moe, -bf16, -bf16-controls): OLMo-core's own
# Trainer replays a golden bundle (`olmoref golden replay --framework olmo-core`, golden/replay/olmo_core_replay.py).
#
#   pass      configs/small.toml, 10 fp32 steps on the demo corpus: the replay must hold at fixed state
#             (golden/replay/rules-fixed.toml); prints the rules' rows (worst per-step relative differences).
#             Then copies of that bundle (tests/golden/mutate_bundle.py) replayed against the unchanged golden trace
#             must fail, naming the step: steps 4 and 7 on each other's batch (loss from step 4), step 6's lr 1 %
#             high (lr at step 6), the z-loss dropped (loss from step 1; z too), weight decay on the embeddings too
#             (update_err at step 2). In the same start, configs/tiny.toml and configs/parity.toml at 10
#             and 30 (replay_lib.sh's fixed_configs) must each hold at fixed state with every step judged.
#   moe       configs/tiny-moe.toml (8 experts, top-2, a shared expert, load-balancing and router z-losses) with
#             SkipStepAdamW over a 6-step window and sigma 0 (a step is skipped when its loss or grad norm is above
#             the window's mean: steps 4, 6 and 7 of 10 fp32 steps): OLMo-core's MoETransformer and SkipStepAdamW must
#             hold within the rules, moe_lb, moe_z and skipped included; then its controls: steps 4 and 7 swapped
#             (loss from step 4), the load-balancing weight set to 0 (moe_lb from step 1), sigma 6 (OLMo-core's
#             default: skipped differs at the first step olmoref skipped). A window under 6 would not do: OLMo-core
#             then judges step 2 by the deviation of one value (NaN) and skips it whatever sigma is (olmoref too).
#   bf16      configs/small.toml, 10 bf16 steps on the demo corpus, replayed in OLMo-core's own bf16 mixed precision
#             (FSDP2, param_dtype bfloat16, reduce_dtype float32) within golden/replay/rules-olmo-core-bf16.toml, then
#             the three controls of `pass`, which must fail in bf16 too (the dropped z-loss by z, since 7.6e-5 of
#             the loss is inside the bf16 loss limit; the lr 1 % high at step 2, where each bf16 step costs seconds).
# Each control is cut after the step it must fail at, and the golden bundle and its controls replay in one Python
# process (replay_lib.sh); one thread each side.
# Exit: 0 as expected; 1 otherwise; 2 an error; 77 "SKIPPED: golden-replay-olmo-core: ..." when OLMo-core's packages
# or the demo corpus cannot be had (never a pass).
source "${OLMOREF_SOURCE_ROOT:?}/tests/common/shell_test.sh"
set +e  # the replays' exit statuses are the verdicts: each is checked by replay_lib.sh
cd "$SRC" || exit 2
source golden/parity/venv.sh
source tests/golden/replay_lib.sh
skip() { echo "SKIPPED: golden-replay-olmo-core: $1"; exit 77; }
olmoref_ensure_olmo_core_venv olmo_core_replay
FRAMEWORK=olmo-core PY="$OLMOREF_OLMO_CORE_VENV/bin/python"
if [ "${1:-pass}" = moe ]; then
  python3 tests/make_tokens.py "$work/tokens.u16" 9 120000 > /dev/null || exit 2
  "$BIN" train --config configs/tiny-moe.toml --steps 10 --set "data.train_files=[\"$work/tokens.u16\"]" \
    --set 'optim.kind="skip_step_adamw"' --set optim.rolling_interval_length=6 --set optim.sigma_factor=0 \
    --threads 2 --out "$work/run" --quiet || exit 2
  "$BIN" golden export --run "$work/run" --out "$work/bundle" > /dev/null || exit 2
  # The trace must skip some steps (or the skipped rule would compare zeros only); the first one names the control.
  first_skip=$(python3 -c 'import json,sys; print(next((r["step"] for r in map(json.loads, open(sys.argv[1])) if r.get("skipped") == 1), 0))' "$work/run/trace.jsonl")
  [ "$first_skip" -gt 0 ] || { echo "FAIL: the SkipStepAdamW run skipped no step: nothing for the skipped rule to see"; exit 1; }
  control swapped "FAIL: loss .* first at step 4" 4 --swap-batches 4 7
  control no-moe-lb "moe_lb [^;]*first at step 1\b" 1 --moe-lb-weight 0
  control sigma "skipped [^;]*first at step $first_skip\b" "$first_skip" --sigma-factor 6
  replay_run
  replay_same
  grep -E "^(moe_lb|moe_z|skipped)" "$work/replays/bundle/compare.txt" || true
  replay_verdicts
  # The adapters that load Hugging Face weights and run plain AdamW refuse the bundle, naming the one that replays it.
  for fw in torch hf-trainer torchtitan; do
    "$BIN" golden replay "$work/bundle" --framework "$fw" --out "$work/refuse-$fw" > "$work/refuse-$fw.log" 2>&1
    rc=$?
    if [ $rc -eq 2 ] && grep -q -- "--framework olmo-core" "$work/refuse-$fw.log"; then
      echo "ok: $fw refuses the bundle: $(grep -m1 -- "--framework olmo-core" "$work/refuse-$fw.log")"
    else
      cat "$work/refuse-$fw.log"; echo "FAIL: $fw: want exit 2 naming --framework olmo-core, got exit $rc"; replay_failed=1
    fi
  done
  exit $replay_failed
fi
if [ "${1:-pass}" = bf16 ]; then
  replay_bf16 "${2:-}" rules-olmo-core-bf16.toml "param_dtype=bfloat16" \
    "OLMo-core's FSDP2 bf16 mixed precision"
fi
replay_make_bundle 1
replay_controls
replay_fixed_plan tiny10 tiny30 parity10 parity30
replay_run
replay_same
replay_verdicts
replay_fixed_verdicts
exit $replay_failed
