#!/usr/bin/env bash
# meson test dist-context-parallel: context parallelism (train.cp_degree, train --cp; docs/canonical/context_parallel.md)
# changes no bit. Groups of N consecutive ranks each compute 1/N of every instance's positions; the traces (loss,
# gradient norm and the digest of every parameter's bits, every step) equal the single process's byte for byte:
#   - CP 2, 3 and 4 (seq_len 48: 24, 16 and 12 positions a rank, so sliding windows of 16 and documents of 20-60
#     tokens cross the ranks' boundaries), alone and beside FSDP and replicas (2x2: two groups; 3x2: three groups over
#     four micro-batches, so one group idles in the second round);
#   - with intra-document masking, YaRN, bf16, activation recompute and the CUDA kernels on the host (cuda-host);
#   - a checkpoint written at CP 2 resumes at CP 4, the rest of the trace identical;
# and the negative control (each rank's weight-gradient partials over its own positions added rank after rank, what
# a context-parallel all-reduce does, instead of one chain over the instance) changes the trace. Bad degrees (not
# dividing seq_len or the world, a mixture-of-experts model, the data audit) are refused before any step, naming
# train.cp_degree.
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

single bf16 "${bf16[@]}" "${masked[@]}"
cp_run bf16-2x1-cp2 2x1 2 "${bf16[@]}" "${masked[@]}"
same bf16 bf16-2x1-cp2
cp_run bf16-2x2-cp4-host 2x2 4 "${bf16[@]}" "${masked[@]}" --executor cuda-host
same bf16 bf16-2x2-cp4-host

# A checkpoint at CP 2 (step 2 of 3) resumes at CP 4. The manifest records the degree it was written at.
ckpt=()
for a in "${base[@]}"; do [ "$a" = --no-checkpoint ] || ckpt+=("$a"); done
"${MPIRUN[@]}" -np 2 "$BIN" train "${ckpt[@]}" --dp-shard 2 --cp 2 --stop-after 2 --out "$work/resumed" \
  --comm-timeout 60 2> "$work/resumed.log" || { cat "$work/resumed.log"; echo "FAIL: CP 2 to step 2"; exit 1; }
grep -q '"cp": 2' "$work/resumed/checkpoints/step00000002/manifest.json" ||
  { echo "FAIL: the CP 2 checkpoint's manifest does not record cp 2"; exit 1; }
"${MPIRUN[@]}" -np 4 "$BIN" train "${ckpt[@]}" --dp-shard 4 --cp 4 --resume --out "$work/resumed" \
  --comm-timeout 60 2>> "$work/resumed.log" || { cat "$work/resumed.log"; echo "FAIL: resume at CP 4"; exit 1; }
same plain resumed

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
refused bad-moe 2 "mixture-of-experts" --config "$SRC/configs/tiny-moe.toml" \
  --set "data.train_files=[\"$work/tokens.u16\"]" --steps 1 --threads 1 --dp-shard 2 --cp 2
refused bad-audit 2 "data.audit" "${base[@]}" --set data.audit=true --dp-shard 2 --cp 2
echo "context parallelism: every trace identical"
