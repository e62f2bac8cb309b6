#!/usr/bin/env bash
# meson test train-stage-chain: Olmo 3's three stages chained as OLMo-core runs them, at the tiny shape. Stage 1
# (pretraining: 64-token instances, cosine), stage 2 (midtraining: other data, linear decay) from stage 1's last
# checkpoint with its optimizer state, stage 3 (long context: 128-token instances, YaRN on the full-attention layer
# from the 64-token context, intra-document masking at EOS 511, its own warmup and decay) from stage 2's last
# checkpoint with its optimizer state (OLMo-core's load_optim_state=True; configs/olmo3-7b-long-context.toml):
#   1. each stage starts from the previous one's last weights (at lr 0 its step 1 leaves them as they were), across
#      the change of sequence length, RoPE scaling and masking;
#   2. the optimizer state goes down the chain: AdamW's step count runs on (6 + 4 + 4 = 14 in stage 3's manifest),
#      and stage 3 without it (init.load_optimizer = false) makes another update from the same weights and batch;
#   3. the provenance: each stage's config records its source checkpoint's manifest checksum;
#   4. stage 3 is stage 3 (masking and YaRN change it), the same at 2x1 (MPI, FSDP) as at 1x1, and stopped after
#      step 2 and resumed, identical; for SkipStepAdamW, Olmo 3's optimizer, the same chain keeps its step count.
source "${OLMOREF_SOURCE_ROOT:?}/tests/common/shell_test.sh"
source "$SRC/tests/dist/mpi_env.sh"
fail() { echo "FAIL: $*"; exit 1; }
python3 "$SRC/tests/make_tokens.py" "$work/pretrain.u16" 21 60000 > /dev/null
python3 "$SRC/tests/make_tokens.py" "$work/midtrain.u16" 22 30000 > /dev/null
python3 "$SRC/tests/make_tokens.py" "$work/long.u16" 23 30000 > /dev/null
cfg=(--config "$SRC/configs/tiny.toml" --threads 1 --quiet --set eval.interval=0)
stage1=(--set "data.train_files=[\"$work/pretrain.u16\"]" --steps 6)
stage2=(--set "data.train_files=[\"$work/midtrain.u16\"]" --set train.global_batch_instances=4
        --set schedule.kind=\"linear_with_warmup\" --set schedule.warmup=1 --set schedule.alpha_f=0.0 --steps 4)
unscaled3=(--set "data.train_files=[\"$work/long.u16\"]" --set train.seq_len=128 --set train.global_batch_instances=4
           --set train.micro_batch_instances=1 --set data.eos_id=511 --set data.document_masking=true
           --set schedule.kind=\"linear_with_warmup\" --set schedule.warmup=1 --set schedule.alpha_f=0.0 --steps 4)
stage3=("${unscaled3[@]}" --set 'model.rope_scaling="yarn"' --set model.rope_yarn_factor=2.0
        --set model.rope_yarn_old_context_len=64 --set model.rope_scaling_full_attention_only=true)
from() { echo "init.checkpoint=\"$work/$1/checkpoints/$2\""; }
train() {  # train NAME ARGS...
  local name=$1
  shift
  "$BIN" train "${cfg[@]}" --out "$work/$name" "$@" > "$work/$name.log" 2>&1 || { cat "$work/$name.log"; fail "$name"; }
}
field() {  # field FILE STEP-INDEX KEY: a trace record's field
  python3 -c 'import json, sys; print([json.loads(l) for l in open(sys.argv[1])][int(sys.argv[2])][sys.argv[3]])' "$@"
}
manifest() {  # manifest RUN STEP KEY: a checkpoint manifest's field (JSON)
  python3 -c 'import json, sys; print(json.dumps(json.load(open(sys.argv[1]))[sys.argv[2]], sort_keys=True))' \
    "$work/$1/checkpoints/$2/manifest.json" "$3"
}

chain() {  # chain KIND: stage 1, 2 and 3 with optim.kind = KIND, into $work/KIND-s1, -s2, -s3
  local k=(--set "optim.kind=\"$1\"")
  train "$1-s1" "${k[@]}" "${stage1[@]}"
  train "$1-s2" "${k[@]}" "${stage2[@]}" --set "$(from "$1-s1" step00000006)"
  train "$1-s3" "${k[@]}" "${stage3[@]}" --set "$(from "$1-s2" step00000004)"
}
chain adamw
s1=adamw-s1 s2=adamw-s2 s3=adamw-s3
k=(--set 'optim.kind="adamw"')

# 1. Each stage starts from the last weights of the one before.
train s2-lr0 "${k[@]}" "${stage2[@]}" --set "$(from $s1 step00000006)" --set optim.lr=0 --stop-after 1 --no-checkpoint
train s3-lr0 "${k[@]}" "${stage3[@]}" --set "$(from $s2 step00000004)" --set optim.lr=0 --stop-after 1 --no-checkpoint
[ "$(field "$work/s2-lr0/trace.jsonl" 0 param_digest)" = "$(field "$work/$s1/trace.jsonl" -1 param_digest)" ] ||
  fail "stage 2 does not start from stage 1's last weights"
[ "$(field "$work/s3-lr0/trace.jsonl" 0 param_digest)" = "$(field "$work/$s2/trace.jsonl" -1 param_digest)" ] ||
  fail "stage 3 does not start from stage 2's last weights"
echo "1. stage 2 starts from stage 1's last weights, stage 3 from stage 2's (128 tokens, YaRN, masking)"

# 2. The optimizer state goes down the chain.
got=$(manifest $s3 step00000004 optimizer_state)
[ "$got" = '{"adamw_step": 14}' ] || fail "stage 3's AdamW step count: $got, want 6 + 4 + 4 = 14"
train s3-noopt "${k[@]}" "${stage3[@]}" --set "$(from $s2 step00000004)" --set init.load_optimizer=false --stop-after 1 \
  --no-checkpoint
[ "$(field "$work/s3-noopt/trace.jsonl" 0 loss_hex)" = "$(field "$work/$s3/trace.jsonl" 0 loss_hex)" ] ||
  fail "same weights and batch, yet another step-1 loss without the optimizer state"
[ "$(field "$work/s3-noopt/trace.jsonl" 0 param_digest)" != "$(field "$work/$s3/trace.jsonl" 0 param_digest)" ] ||
  fail "stage 3 makes the same update with and without stage 2's optimizer state"
echo "2. AdamW's step count 6 + 4 + 4 = 14; without stage 2's moments stage 3 makes another update"

# 3. Provenance: each stage's config names its source's manifest checksum.
for pair in "$s1/step00000006 $s2" "$s2/step00000004 $s3"; do
  set -- $pair
  xxh=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["manifest_xxh3"])' "$work/${1%/*}/checkpoints/${1#*/}/manifest.json")
  python3 -c 'import json, sys; sys.exit(f"checkpoint_xxh3 = {sys.argv[2]!r}" not in json.load(open(sys.argv[1]))["config_toml"])' \
    "$work/$2/manifest.json" "$xxh" || fail "$2's manifest does not record its source $1 ($xxh)"
done
echo "3. stage 2 records stage 1's checkpoint, stage 3 stage 2's"

# 4. Stage 3 is what it says, on any layout, through a resume.
train s3-unmasked "${k[@]}" "${stage3[@]}" --set "$(from $s2 step00000004)" --set data.document_masking=false --stop-after 1 --no-checkpoint
train s3-unscaled "${k[@]}" "${unscaled3[@]}" --set "$(from $s2 step00000004)" --stop-after 1 --no-checkpoint
for other in s3-unmasked s3-unscaled; do
  [ "$(field "$work/$other/trace.jsonl" 0 loss_hex)" != "$(field "$work/$s3/trace.jsonl" 0 loss_hex)" ] ||
    fail "$other: the same step-1 loss as stage 3: masking or YaRN had no effect"
done
"${MPIRUN[@]}" -np 2 "$BIN" train "${cfg[@]}" "${k[@]}" "${stage3[@]}" --set "$(from $s2 step00000004)" --dp-shard 2 \
  --out "$work/s3-2x1" > "$work/s3-2x1.log" 2>&1 || { cat "$work/s3-2x1.log"; fail "stage 3 at 2x1"; }
cmp -s "$work/$s3/trace.jsonl" "$work/s3-2x1/trace.jsonl" || fail "stage 3 at 2x1 differs from 1x1"
train s3-cut "${k[@]}" "${stage3[@]}" --set "$(from $s2 step00000004)" --stop-after 2
"$BIN" train "${cfg[@]}" "${k[@]}" "${stage3[@]}" --resume --out "$work/s3-cut" > "$work/s3-resume.log" 2>&1 ||
  { cat "$work/s3-resume.log"; fail "stage 3 resumed"; }
cmp -s "$work/$s3/trace.jsonl" "$work/s3-cut/trace.jsonl" || fail "stage 3 stopped after step 2 and resumed differs"
echo "4. stage 3 differs without masking or YaRN; identical at 2x1 and through a resume after step 2"

chain skip_step_adamw
python3 - "$work" <<'PY'
import json, struct, sys
w = sys.argv[1]
state = [json.load(open(f"{w}/skip_step_adamw-{s}/checkpoints/{c}/manifest.json"))["optimizer_state"]
         for s, c in (("s1", "step00000006"), ("s2", "step00000004"), ("s3", "step00000004"))]
steps = [struct.unpack(">f", bytes.fromhex(s["step_hex"]))[0] for s in state]  # its fp32 state["step"]
assert steps == [6, 10, 14], f"SkipStepAdamW's step count down the chain: {steps}, want 6, 10, 14 ({state})"
print(f"4. SkipStepAdamW: the chain's step counts {steps}")
PY
echo "OK"
