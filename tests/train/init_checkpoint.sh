#!/usr/bin/env bash
# meson test train-init-checkpoint: init.checkpoint, a new run from another run's checkpoint (Olmo 3's stage 2).
#   1. stage 2 starts from stage 1's last weights (at lr 0 its step 1 leaves them as they were: the same
#      param_digest), numbers its steps from 1, and draws its data and lr as a fresh run of its own config does
#      (same data_digest and lr per step, other loss);
#   2. with the optimizer state, stage 2 on stage 1's data and constant lr is, step for step, stage 1 resumed with
#      its loader restarted (--debug-skip-restore loader): the same m, v and AdamW step count (bias correction
#      continues from step 6), for AdamW and SkipStepAdamW; init.load_optimizer = false is not;
#   3. the source's manifest checksum is in the new run's config (manifest, resume_hash): another source, another
#      hash; a plain AdamW stage 2 records its step count; a resume of stage 2 continues it bit for bit;
#   4. refused with the key and the fix: a missing directory, a corrupted shard, another model, other optimizer
#      betas with the optimizer state, init.hf_dir and init.checkpoint together.
source "${OLMOREF_SOURCE_ROOT:?}/tests/common/shell_test.sh"
python3 "$SRC/tests/make_tokens.py" "$work/a.u16" 9 120000 > /dev/null
python3 "$SRC/tests/make_tokens.py" "$work/b.u16" 10 120000 > /dev/null
cfg=(--config "$SRC/configs/tiny.toml" --threads 2 --quiet)
a=(--set "data.train_files=[\"$work/a.u16\"]")
b=(--set "data.train_files=[\"$work/b.u16\"]")
digest() { python3 -c "import json,sys; print([json.loads(l) for l in open(sys.argv[1])][int(sys.argv[2])]['param_digest'])" "$@"; }

# Stage 1: 6 steps of tiny on a.u16 (cosine schedule, batch 8).
"$BIN" train "${cfg[@]}" "${a[@]}" --steps 6 --out "$work/s1"
src="$work/s1/checkpoints/step00000006"
init=(--set "init.checkpoint=\"$src\"")
# Stage 2's own recipe: other data, batch 4, warmup 2, linear decay to 0 over 4 steps.
stage2=("${b[@]}" --set train.global_batch_instances=4 --set schedule.kind=\"linear_with_warmup\"
        --set schedule.warmup=2 --set schedule.alpha_f=0.0 --steps 4)

# 1. The weights at the start are stage 1's last.
"$BIN" train "${cfg[@]}" "${stage2[@]}" "${init[@]}" --set optim.lr=0 --stop-after 1 --out "$work/lr0"
want=$(digest "$work/s1/trace.jsonl" -1)
got=$(digest "$work/lr0/trace.jsonl" 0)
[ "$got" = "$want" ] || { echo "FAIL: stage 2 at lr 0 ends step 1 at $got, not stage 1's last weights $want"; exit 1; }
echo "1. stage 2 starts from stage 1's weights ($want)"
"$BIN" train "${cfg[@]}" "${stage2[@]}" "${init[@]}" --out "$work/s2"
"$BIN" train "${cfg[@]}" "${stage2[@]}" --out "$work/fresh"
python3 - "$work" <<'PY'
import json, sys
def trace(n): return [json.loads(l) for l in open(f"{sys.argv[1]}/{n}/trace.jsonl")]
s2, fresh = trace("s2"), trace("fresh")
assert [r["step"] for r in s2] == [1, 2, 3, 4], f"stage 2's steps are {[r['step'] for r in s2]}, not 1..4"
assert s2[0]["tokens"] == 4 * 64, f"stage 2's token count starts over: step 1 has {s2[0]['tokens']}"
for x, y in zip(s2, fresh):
    assert x["data_digest"] == y["data_digest"], f"step {x['step']}: not the fresh loader's batch"
    assert x["lr_hex"] == y["lr_hex"], f"step {x['step']}: lr {x['lr']} is not the new schedule's {y['lr']}"
    assert x["loss_hex"] != y["loss_hex"], f"step {x['step']}: the loss of the init's weights"
assert s2[-1]["lr"] == 0.0, "the linear decay ends at 0"
print("1. steps 1..4, the fresh loader's batches and the new schedule's lr, other losses")
PY

# 2. The optimizer state continues: stage 2 on stage 1's own data, batch and a constant lr equals stage 1 resumed
# with its loader restarted at the first batch.
for kind in adamw skip_step_adamw; do
  k=(--set "optim.kind=\"$kind\"" --set schedule.kind=\"constant\" --set schedule.warmup=0)
  "$BIN" train "${cfg[@]}" "${a[@]}" "${k[@]}" --steps 10 --stop-after 6 --out "$work/c1-$kind"
  cp -r "$work/c1-$kind" "$work/resumed-$kind"
  "$BIN" train "${cfg[@]}" "${a[@]}" "${k[@]}" --steps 10 --resume --debug-skip-restore loader --out "$work/resumed-$kind"
  c=(--set "init.checkpoint=\"$work/c1-$kind/checkpoints/step00000006\"")
  "$BIN" train "${cfg[@]}" "${a[@]}" "${k[@]}" "${c[@]}" --steps 4 --out "$work/c2-$kind"
  "$BIN" train "${cfg[@]}" "${a[@]}" "${k[@]}" "${c[@]}" --set init.load_optimizer=false --steps 4 --out "$work/c2-noopt-$kind"
  python3 - "$work" "$kind" <<'PY'
import json, sys
w, kind = sys.argv[1], sys.argv[2]
def trace(n): return [json.loads(l) for l in open(f"{w}/{n}-{kind}/trace.jsonl")]
resumed, c2, noopt = trace("resumed")[6:], trace("c2"), trace("c2-noopt")
assert [r["step"] for r in resumed] == [7, 8, 9, 10]
for x, y in zip(c2, resumed):
    for key in ("data_digest", "loss_hex", "grad_norm_hex", "param_digest"):
        assert x[key] == y[key], (f"{kind}: stage 2's step {x['step']} {key} {x[key]} is not stage 1's step {y['step']} "
                                  f"resumed ({y[key]}): the optimizer state (m, v or the step count) did not carry over")
assert noopt[0]["loss_hex"] == c2[0]["loss_hex"], "same weights, same batch: same step-1 loss"
assert noopt[0]["param_digest"] != c2[0]["param_digest"], f"{kind}: init.load_optimizer=false gives the same update"
print(f"2. {kind}: stage 2 = stage 1 resumed (steps 7..10) with the loader restarted; without the optimizer state not")
PY
done

# 3. Which checkpoint a run started from is part of its config and hash.
xxh=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['manifest_xxh3'])" "$src/manifest.json")
grep -q "checkpoint_xxh3 = '$xxh'" <(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['config_toml'])" "$work/s2/manifest.json") ||
  { echo "FAIL: stage 2's manifest does not record init.checkpoint_xxh3 = $xxh"; exit 1; }
pinned=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['resume_hash'])" "$work/s2/checkpoints/step00000004/manifest.json")
# Stage 2 from the other stage-1 checkpoint, with stage 2's recipe: only the source differs.
"$BIN" train "${cfg[@]}" "${stage2[@]}" --set "init.checkpoint=\"$work/c1-adamw/checkpoints/step00000006\"" \
  --set optim.kind=\"adamw\" --out "$work/s2-other"
h1=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['resume_hash'])" "$work/s2-other/checkpoints/step00000004/manifest.json")
[ "$h1" != "$pinned" ] || { echo "FAIL: two stage-2 runs from different checkpoints have one resume_hash"; exit 1; }
python3 - "$work" <<'PY'
import json, sys
m = json.load(open(f"{sys.argv[1]}/s2/checkpoints/step00000004/manifest.json"))
assert m.get("optimizer_state") == {"adamw_step": 10}, f"stage 2's AdamW step count: {m.get('optimizer_state')}"
print("3. source recorded (init.checkpoint_xxh3), hashed, AdamW step count 6 + 4 = 10 recorded")
PY
# A resume of stage 2 continues it bit for bit; the source need not be named again (nor exist any more): its
# checksum comes from stage 2's checkpoint.
"$BIN" train "${cfg[@]}" "${stage2[@]}" "${init[@]}" --stop-after 2 --out "$work/s2-cut"
mv "$work/s1" "$work/s1-moved"
"$BIN" train "${cfg[@]}" "${stage2[@]}" --resume --out "$work/s2-cut"
mv "$work/s1-moved" "$work/s1"
cmp "$work/s2/trace.jsonl" "$work/s2-cut/trace.jsonl" || { echo "FAIL: stage 2 resumed at step 2 differs"; exit 1; }
echo "3. stage 2 stopped at step 2 and resumed: trace identical"

# 4. Refusals: each names the key, the checkpoint and the fix.
refused() {  # refused NAME PATTERN ARGS...: the run fails and its message matches PATTERN
  local name=$1 pattern=$2
  shift 2
  if "$BIN" train "${cfg[@]}" "$@" --out "$work/bad-$name" > "$work/$name.log" 2>&1; then
    echo "FAIL: $name was accepted"; exit 1
  fi
  grep -qE "$pattern" "$work/$name.log" || { cat "$work/$name.log"; echo "FAIL: $name: message lacks /$pattern/"; exit 1; }
  [ ! -e "$work/bad-$name/trace.jsonl" ] || { echo "FAIL: $name wrote a trace"; exit 1; }
  echo "4. $name refused: $(head -c 300 "$work/$name.log")"
}
refused missing "config key 'init.checkpoint': $work/nothing: no such directory; point it at a checkpoint" \
  "${stage2[@]}" --set "init.checkpoint=\"$work/nothing\""
refused root "is not a checkpoint \(no manifest.json\).*newest here is .*step00000006" \
  "${stage2[@]}" --set "init.checkpoint=\"$work/s1/checkpoints\""
refused model "config key 'init.checkpoint': .* holds another model: model.n_layers = 2 here but 4 in the checkpoint; set the \[model\] section" \
  "${stage2[@]}" "${init[@]}" --set model.n_layers=2 --set "model.swa_pattern=[16, -1]"
refused betas "optim.beta2 = 0.98999+ here but 0.9499+6 in the checkpoint .*init.load_optimizer = false" \
  "${stage2[@]}" "${init[@]}" --set optim.beta2=0.99
refused both "config key 'init.checkpoint': is set together with init.hf_dir / init.hf_sha256.*not both" \
  "${stage2[@]}" "${init[@]}" --set "init.hf_dir=\"$work\""
# init.load_optimizer=false takes only the weights: other betas are fine then.
"$BIN" train "${cfg[@]}" "${stage2[@]}" "${init[@]}" --set optim.beta2=0.99 --set init.load_optimizer=false --stop-after 1 --out "$work/betas-ok"
# A corrupted shard: one byte of the checkpoint flipped.
cp -r "$work/s1" "$work/s1-bad"
python3 - "$work/s1-bad/checkpoints/step00000006/shard-00000.bin" <<'PY'
import sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read())
b[len(b) // 2] ^= 0x40
open(p, "wb").write(bytes(b))
PY
refused corrupt "config key 'init.checkpoint' = .*s1-bad.*: restore that checkpoint, or point init.checkpoint at another" \
  "${stage2[@]}" --set "init.checkpoint=\"$work/s1-bad/checkpoints/step00000006\""
grep -q "s1-bad/checkpoints/step00000006/shard-00000.bin: .*checksum mismatch" "$work/corrupt.log" ||
  { cat "$work/corrupt.log"; echo "FAIL: corrupt: the message does not name the shard and the checksum"; exit 1; }
# A golden bundle starts from the init: a stage-2 run is refused, naming the key.
if "$BIN" golden export --run "$work/s2" --out "$work/bundle" > "$work/export.log" 2>&1; then
  echo "FAIL: golden export of a stage-2 run was accepted"; exit 1
fi
grep -q "started from init.checkpoint = .*a bundle starts from the init" "$work/export.log" ||
  { cat "$work/export.log"; echo "FAIL: golden export's refusal does not name init.checkpoint"; exit 1; }
# export-hf --config of a stage-2 config exports the source's weights: the same files as export-hf of the source.
"$BIN" export-hf --checkpoint "$src" --out "$work/hf-src" > /dev/null
"$BIN" export-hf --config "$SRC/configs/tiny.toml" "${init[@]}" --out "$work/hf-cfg" > /dev/null
python3 - "$work/hf-src/model.safetensors" "$work/hf-cfg/model.safetensors" <<'PY' ||
import json, struct, sys
def tensors(p):  # the header's tensor entries and the data, without __metadata__ (which names the source)
    b = open(p, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    h.pop("__metadata__", None)
    return h, b[8 + n:]
assert tensors(sys.argv[1]) == tensors(sys.argv[2])
PY
  { echo "FAIL: export-hf --config with init.checkpoint does not export the checkpoint's weights"; exit 1; }
echo "golden export refused; export-hf --config takes the checkpoint's weights"
echo "OK"
