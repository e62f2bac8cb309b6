#!/usr/bin/env bash
# meson test train-document-masking: data.document_masking (docs/canonical/documents.md) through whole training runs
# of configs/tiny.toml on documents of 21-60 tokens ending in EOS 511 (tests/make_tokens.py), 64-token instances:
#   1. masking on changes the run (the instances hold several documents): another loss from step 1;
#   2. with an EOS id the data never holds (505), every instance is one document: the trace equals masking off, byte
#      for byte (the band and the RoPE positions reduce to the plain ones);
#   3. the trace with masking is the same on the CUDA kernels' host execution (cuda-host) as on the CPU, at 2x1 (MPI,
#      FSDP) as at 1x1, at micro-batch 1 as at 2, with activation recompute, and on a rerun;
#   4. refused with the key and the fix: masking without data.eos_id; golden export, golden logits and parity-dump of
#      a masked config (their peers attend across documents).
source "${OLMOREF_SOURCE_ROOT:?}/tests/common/shell_test.sh"
source "$SRC/tests/dist/mpi_env.sh"
fail() { echo "FAIL: $*"; exit 1; }
python3 "$SRC/tests/make_tokens.py" "$work/docs.u16" 12 40000 > /dev/null
base=(--config "$SRC/configs/tiny.toml" --set "data.train_files=[\"$work/docs.u16\"]" --set eval.interval=0
      --steps 3 --threads 1 --quiet --no-checkpoint)
masked=(--set data.eos_id=511 --set data.document_masking=true)
train() {  # train NAME ARGS...
  local name=$1
  shift
  "$BIN" train "${base[@]}" --out "$work/$name" "$@" > "$work/$name.log" 2>&1 || { cat "$work/$name.log"; fail "$name"; }
}
same() {  # same A B: the two runs' traces are byte-identical
  cmp -s "$work/$1/trace.jsonl" "$work/$2/trace.jsonl" || { diff <(head -c 600 "$work/$1/trace.jsonl") \
    <(head -c 600 "$work/$2/trace.jsonl"); fail "$1 and $2: the traces differ"; }
  echo "$1 = $2"
}
loss1() { python3 -c 'import json, sys; print(json.loads(open(sys.argv[1]).readline())["loss"])' "$work/$1/trace.jsonl"; }

train plain --set data.eos_id=511
train masked "${masked[@]}"
[ "$(loss1 plain)" != "$(loss1 masked)" ] || fail "masking on did not change step 1's loss ($(loss1 plain))"
echo "masking changes the run: step 1 loss $(loss1 plain) -> $(loss1 masked)"

train plain-505 --set data.eos_id=505
train masked-505 --set data.eos_id=505 --set data.document_masking=true
same plain-505 masked-505

train masked-rerun "${masked[@]}"
same masked masked-rerun
train masked-cuda-host "${masked[@]}" --executor cuda-host
same masked masked-cuda-host
train masked-mb1 "${masked[@]}" --set train.micro_batch_instances=1
same masked masked-mb1
train masked-recompute "${masked[@]}" --set 'train.activation_checkpointing="full"'
same masked masked-recompute
"${MPIRUN[@]}" -np 2 "$BIN" train "${base[@]}" "${masked[@]}" --dp-shard 2 --out "$work/masked-2x1" \
  > "$work/masked-2x1.log" 2>&1 || { cat "$work/masked-2x1.log"; fail "masked at 2x1"; }
same masked masked-2x1

refused() {  # refused WHAT-THE-MESSAGE-SAYS COMMAND...
  local want=$1
  shift
  if "$@" > "$work/refused.log" 2>&1; then fail "accepted: $*"; fi
  grep -q -- "$want" "$work/refused.log" || { cat "$work/refused.log"; fail "refused without '$want': $*"; }
}
refused "data.document_masking" "$BIN" train "${base[@]}" --set data.document_masking=true --out "$work/no-eos"
refused "needs data.eos_id" "$BIN" config --config "$SRC/configs/tiny.toml" --set data.document_masking=true
refused "data.document_masking is on" "$BIN" golden export --run "$work/masked" --out "$work/bundle"
refused "data.document_masking" "$BIN" golden logits --config "$SRC/configs/tiny.toml" "${masked[@]}" \
  --set "data.train_files=[\"$work/docs.u16\"]" --seq-len 64 --out "$work/logits"
refused "data.document_masking" "$BIN" parity-dump --config "$SRC/configs/tiny.toml" "${masked[@]}" \
  --set "data.train_files=[\"$work/docs.u16\"]" --out "$work/parity"
echo "OK"
