#!/usr/bin/env bash
# meson test dist-context-parallel: context parallelism (train.cp_degree, train --cp; docs/canonical/context_parallel.md)
# changes no bit. Groups of N consecutive ranks each compute 1/N of every instance's positions; the traces (loss,
# gradient norm and the digest of every parameter's bits, every step) equal the single process's byte for byte:
#   - CP 2, 3, 4 and 8 (seq_len 48: 24, 16, 12 and 6 positions a rank, so sliding windows of 16 and documents of 20-60
#     tokens cross the ranks' boundaries), alone and beside FSDP and replicas (2x2: two groups; 3x2: three groups over
#     four micro-batches, so one group idles in the second round; 4x2 with CP 8);
#   - with intra-document masking, YaRN, bf16, activation recompute and the CUDA kernels on the host (cuda-host);
#   - a mixture of experts (tiny-moe: the auxiliary losses, routing digests and expert loads in the trace, over the
#     instance's whole rows), alone, with expert parallelism in the same ranks (EP 2 = the CP group) and across
#     groups (EP 4 over two CP groups of 2), with recompute, on cuda-host, and at OLMo-core's micro-batch
#     load-balancing granularity;
#   - a checkpoint written at CP 2 resumes at CP 4, the rest of the trace identical;
#   - the data audit (data.audit) of a CP run is the data-parallel run's with one rank per group, log for log;
# and the negative control (each rank's weight-gradient partials over its own positions added rank after rank, what
# a context-parallel all-reduce does, instead of one chain over the instance) changes the trace. Bad degrees (not
# dividing seq_len or the world) are refused before any step, naming train.cp_degree.
source "${OLMOREF_SOURCE_ROOT:?}/tests/common/shell_test.sh"
source "$SRC/tests/dist/mpi_env.sh"
python3 "$SRC/tests/make_tokens.py" "$work/tokens.u16" 13 60000
base=(--config "$SRC/configs/tiny.toml" --set "data.train_files=[\"$work/tokens.u16\"]" --set train.seq_len=48
      --set train.global_batch_instances=8 --steps 3 --threads 1 --quiet --no-checkpoint)
masked=(--set data.eos_id=511 --set data.document_masking=true)
yarn=(--set 'model.rope_scaling="yarn"' --set model.rope_yarn_factor=4.0 --set model.rope_yarn_old_context_len=12)
bf16=(--set 'train.precision="bf16"')

single() {  # single NAME ARGS...: the reference, one process
  local name=$1
  shift
  "$BIN" train "${base[@]}" "$@" --out "$work/$name" 2> "$work/$name.log" || { cat "$work/$name.log"; echo "FAIL: $name"; exit 1; }
}
cp_run() {  # cp_run NAME SxR CP ARGS...: an mpirun at that layout with train --cp CP
  local name=$1 s=${2%x*} r=${2#*x} cp=$3
  shift 3
  "${MPIRUN[@]}" -np $((s * r)) "$BIN" train "${base[@]}" "$@" --dp-shard "$s" --dp-replicate "$r" --cp "$cp" \
    --out "$work/$name" --comm-timeout 60 2> "$work/$name.log" || { cat "$work/$name.log"; echo "FAIL: $name"; exit 1; }
}
same() {  # same REFERENCE RUN
  cmp "$work/$1/trace.jsonl" "$work/$2/trace.jsonl" || { echo "FAIL: $2 differs from $1"; exit 1; }
  echo "$2: identical to $1"
}
differ() {  # differ A B WHY: the variation must be seen, or identity above would prove nothing
  if cmp -s "$work/$1/trace.jsonl" "$work/$2/trace.jsonl"; then echo "FAIL: $2 equals $1: $3"; exit 1; fi
}

single plain
for spec in 2x1:2 3x1:3 4x1:4 2x2:2 1x2:2 3x2:2; do
  layout=${spec%:*} cp=${spec#*:}
  cp_run "plain-$layout-cp$cp" "$layout" "$cp"
  same plain "plain-$layout-cp$cp"
done
cp_run plain-2x1-cp2-host 2x1 2 --executor cuda-host --set 'train.activation_checkpointing="full"'
same plain plain-2x1-cp2-host

single masked "${masked[@]}"
differ plain masked "document masking unseen"
for spec in 2x1:2 3x1:3 2x2:4; do
  layout=${spec%:*} cp=${spec#*:}
  cp_run "masked-$layout-cp$cp" "$layout" "$cp" "${masked[@]}"
  same masked "masked-$layout-cp$cp"
done

single yarn "${yarn[@]}" "${masked[@]}"
differ masked yarn "YaRN unseen"
cp_run yarn-4x1-cp4 4x1 4 "${yarn[@]}" "${masked[@]}"
same yarn yarn-4x1-cp4
# OLMo-core's degree: 8 ranks of 6 positions, beside replicas (4x2: the state over 8 ranks, one group).
cp_run yarn-4x2-cp8 4x2 8 "${yarn[@]}" "${masked[@]}"
same yarn yarn-4x2-cp8

single bf16 "${bf16[@]}" "${masked[@]}"
cp_run bf16-2x1-cp2 2x1 2 "${bf16[@]}" "${masked[@]}"
same bf16 bf16-2x1-cp2
cp_run bf16-2x2-cp4-host 2x2 4 "${bf16[@]}" "${masked[@]}" --executor cuda-host
same bf16 bf16-2x2-cp4-host

# Mixture of experts: the same runs, each trace with the step's expert load, auxiliary losses and routing digest.
plain_base=("${base[@]}")
base=("${base[@]/configs\/tiny.toml/configs/tiny-moe.toml}")
single moe
differ plain moe "the MoE config unseen"
cp_run moe-2x1-cp2 2x1 2
same moe moe-2x1-cp2
cp_run moe-2x1-cp2-ep2 2x1 2 --ep 2 --set 'train.activation_checkpointing="full"'
same moe moe-2x1-cp2-ep2
cp_run moe-2x2-cp2-ep4 2x2 2 --ep 4
same moe moe-2x2-cp2-ep4
cp_run moe-4x1-cp4-host 4x1 4 --executor cuda-host "${masked[@]}"
single moe-masked "${masked[@]}"
same moe-masked moe-4x1-cp4-host
local_batch=(--set 'model.moe_lb_granularity="local_batch"')
single moe-local "${local_batch[@]}"
differ moe moe-local "the micro-batch granularity unseen"
cp_run moe-local-3x1-cp3 3x1 3 "${local_batch[@]}"
same moe-local moe-local-3x1-cp3
base=("${plain_base[@]}")

# A checkpoint at CP 2 (step 2 of 3) resumes at CP 4. The manifest records the degree it was written at.
ckpt=()
for a in "${base[@]}"; do [ "$a" = --no-checkpoint ] || ckpt+=("$a"); done
ckpt+=(--set data.audit=true)  # the resume cuts and continues one group's log
"${MPIRUN[@]}" -np 2 "$BIN" train "${ckpt[@]}" --dp-shard 2 --cp 2 --stop-after 2 --out "$work/resumed" \
  --comm-timeout 60 2> "$work/resumed.log" || { cat "$work/resumed.log"; echo "FAIL: CP 2 to step 2"; exit 1; }
grep -q '"cp": 2' "$work/resumed/checkpoints/step00000002/manifest.json" ||
  { echo "FAIL: the CP 2 checkpoint's manifest does not record cp 2"; exit 1; }
"${MPIRUN[@]}" -np 4 "$BIN" train "${ckpt[@]}" --dp-shard 4 --cp 4 --resume --out "$work/resumed" \
  --comm-timeout 60 2>> "$work/resumed.log" || { cat "$work/resumed.log"; echo "FAIL: resume at CP 4"; exit 1; }
same plain resumed
single plain-audit --set data.audit=true
cmp "$work/plain-audit/audit.jsonl" "$work/resumed/audit.jsonl" ||
  { echo "FAIL: the audit log of the CP 2 -> CP 4 run differs from the single process's"; exit 1; }
echo "resumed: its audit log is the single process's"

# The audit: one log per group, written by the rank that holds its micro-batches, as one rank per group would write.
audit=(--set data.audit=true)
"${MPIRUN[@]}" -np 2 "$BIN" train "${base[@]}" "${audit[@]}" --dp-shard 2 --out "$work/audit-dp2" --comm-timeout 60 \
  2> "$work/audit-dp2.log" || { cat "$work/audit-dp2.log"; echo "FAIL: audit-dp2"; exit 1; }
cp_run audit-2x2-cp2 2x2 2 "${audit[@]}"
same plain audit-2x2-cp2
for log in audit-rank00000.jsonl audit-rank00001.jsonl; do
  cmp "$work/audit-dp2/$log" "$work/audit-2x2-cp2/$log" || { echo "FAIL: $log differs from the 2-rank run's"; exit 1; }
done
[ "$(ls "$work/audit-2x2-cp2" | grep -c '^audit')" = 2 ] || { ls "$work/audit-2x2-cp2"; echo "FAIL: not one log a group"; exit 1; }
echo "audit at CP 2 over 2x2: the logs of the 2-rank run"

# The negative control: the same ranks, the partials added instead of one chain continued.
cp_run control-2x1-cp2 2x1 2 --debug-cp-partial-sums
differ plain control-2x1-cp2 "the partial-sums control left the trace unchanged: identity above proves nothing"
echo "control (per-rank partials added): the trace differs, as it must"

refused() {  # refused NAME NP WANT ARGS...: the run fails before any step, its message holding WANT
  local name=$1 np=$2 want=$3
  shift 3
  if "${MPIRUN[@]}" -np "$np" "$BIN" train "$@" --out "$work/$name" --comm-timeout 60 > "$work/$name.log" 2>&1; then
    echo "FAIL: $name was accepted"; exit 1
  fi
  grep -q -- "$want" "$work/$name.log" || { cat "$work/$name.log"; echo "FAIL: $name: no '$want' in the refusal"; exit 1; }
  [ ! -s "$work/$name/trace.jsonl" ] || { echo "FAIL: $name wrote a trace"; exit 1; }
  echo "$name: refused ($(grep -m1 -o "train.cp_degree[^;]*" "$work/$name.log" | head -c 110))"
}
refused bad-seq 2 "divide train.seq_len" "${base[@]}" --dp-shard 2 --cp 5
refused bad-world 3 "does not divide the 3 ranks" "${base[@]}" --dp-shard 3 --cp 2
refused bad-single 1 "does not divide the 1 ranks" "${base[@]}" --cp 2
echo "context parallelism: every trace identical"
