#!/usr/bin/env bash
# HSDP layout invariance (tier T3) through mpirun: the same run at 1x1, 2x1, 1x2, 2x2, 4x1 and 8x1
# (dp_shard x dp_replicate) writes byte-identical traces to the single-process run; a checkpoint saved
# at 2x2 resumes at 4x1 and at 1x1 with an identical continuation; the float all-reduce negative
# control breaks the invariance; a rank that dies or hangs ends the job quickly, naming the rank, and
# leaves no checkpoint marked complete.
set -euo pipefail
BIN="${OLMOREF_BUILD_ROOT:?}/olmoref"
SRC="${OLMOREF_SOURCE_ROOT:?}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
# Loopback only, no high-speed transports to probe: quicker start-up and quieter logs.
export OMPI_MCA_btl=self,vader OMPI_MCA_pml=ob1 OMPI_MCA_btl_vader_single_copy_mechanism=none
MPIRUN=(mpirun --oversubscribe --bind-to none)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 - "$work/tokens.u16" <<'PY'
import random, struct, sys
random.seed(9)
toks = []
while len(toks) < 120000:
    start, step = random.randrange(500), random.choice([1, 2, 3])
    toks += [(start + i * step) % 500 for i in range(random.randrange(20, 60))] + [511]
open(sys.argv[1], "wb").write(struct.pack("<%dH" % len(toks), *toks))
PY
# 16 instances per step in 8 micro-batches of 2: up to 8 ranks, two micro-batches per rank at 4 ranks.
cfg=(--config "$SRC/configs/tiny.toml" --set "data.train_files=[\"$work/tokens.u16\"]"
     --set train.global_batch_instances=16 --set train.micro_batch_instances=2 --set data.audit=true
     --set checkpoint.interval=2 --steps 4 --threads 1 --quiet)

"$BIN" train "${cfg[@]}" --out "$work/single"
check() {  # check NAME: trace identical to the single-process run
  cmp "$work/single/trace.jsonl" "$work/$1/trace.jsonl" || { echo "layout $1: trace differs"; exit 1; }
  echo "layout $1: identical"
}
for layout in 1x1 2x1 1x2 2x2 4x1 8x1; do
  s=${layout%x*}; r=${layout#*x}
  "${MPIRUN[@]}" -np $((s * r)) "$BIN" train "${cfg[@]}" --dp-shard "$s" --dp-replicate "$r" --out "$work/$layout" --report-comm \
    2> "$work/$layout.log"
  check "$layout"
done
grep -h "sent" "$work/2x1.log" "$work/4x1.log" | head -2
# The per-rank audit logs together are exactly the single-process log (same records, rank aside).
cat "$work"/4x1/audit-rank*.jsonl | sed 's/"rank":[0-9]*,//' | sort > "$work/audit-4x1.sorted"
sed 's/"rank":[0-9]*,//' "$work/single/audit.jsonl" | sort > "$work/audit-single.sorted"
cmp "$work/audit-single.sorted" "$work/audit-4x1.sorted"

# Resume at another layout: save at 2x2 (step 2), continue at 4x1 and at 1x1 (no mpirun).
for target in 4x1 1x1; do
  out="$work/reshard-$target"
  "${MPIRUN[@]}" -np 4 "$BIN" train "${cfg[@]}" --dp-shard 2 --dp-replicate 2 --stop-after 2 --out "$out"
  [ -d "$out/checkpoints/step00000002" ]
  if [ "$target" = 4x1 ]; then
    "${MPIRUN[@]}" -np 4 "$BIN" train "${cfg[@]}" --dp-shard 4 --out "$out" --resume
  else
    "$BIN" train "${cfg[@]}" --out "$out" --resume
  fi
  cmp "$work/single/trace.jsonl" "$out/trace.jsonl" || { echo "resume 2x2 -> $target differs"; exit 1; }
  echo "resume 2x2 -> $target: identical"
done
"$BIN" ckpt verify "$work/2x2/checkpoints/step00000004" > /dev/null

# Negative control: a per-rank fp32 running sum plus MPI's float all-reduce is not layout invariant.
differ=0
for np in 1 2 4; do
  "${MPIRUN[@]}" -np $np "$BIN" train "${cfg[@]}" --dp-shard $np --debug-float-allreduce --out "$work/float-$np"
  cmp -s "$work/single/trace.jsonl" "$work/float-$np/trace.jsonl" || differ=$((differ + 1))
done
[ $differ -ge 1 ] || { echo "negative control: the float all-reduce matched at every layout (the test cannot tell)"; exit 1; }
echo "negative control: $differ of 3 layouts differ with a float all-reduce"

# A rank that dies: the job ends non-zero, quickly, naming the rank.
set +e
start=$SECONDS
OLMOREF_TEST_FAULT=1:3:die timeout 120 "${MPIRUN[@]}" -np 2 "$BIN" train "${cfg[@]}" --dp-shard 2 --out "$work/die" > "$work/die.log" 2>&1
rc=$?
set -e
[ $rc -ne 0 ] && [ $rc -ne 124 ] || { echo "dead rank: exit $rc"; cat "$work/die.log"; exit 1; }
grep -Eq "rank 1" "$work/die.log" || { echo "dead rank not named"; cat "$work/die.log"; exit 1; }
echo "dead rank: exit $rc after $((SECONDS - start)) s, named"
# A rank that hangs: the others time out and abort, naming it.
set +e
start=$SECONDS
OLMOREF_TEST_FAULT=1:3:hang timeout 120 "${MPIRUN[@]}" -np 2 "$BIN" train "${cfg[@]}" --dp-shard 2 --comm-timeout 5 --out "$work/hang" > "$work/hang.log" 2>&1
rc=$?
set -e
[ $rc -ne 0 ] && [ $rc -ne 124 ] || { echo "hung rank: exit $rc"; cat "$work/hang.log"; exit 1; }
grep -q "rank(s) 1 never arrived" "$work/hang.log" || { echo "hung rank not named"; cat "$work/hang.log"; exit 1; }
echo "hung rank: exit $rc after $((SECONDS - start)) s, named"
# A rank dying in the middle of a checkpoint: no checkpoint of that step is marked complete.
set +e
OLMOREF_TEST_CRASH_IN_SAVE=4 OLMOREF_TEST_CRASH_SHARD=1 timeout 120 "${MPIRUN[@]}" -np 2 "$BIN" train "${cfg[@]}" --dp-shard 2 \
  --comm-timeout 20 --out "$work/ckcrash" > "$work/ckcrash.log" 2>&1
rc=$?
set -e
[ $rc -ne 0 ] && [ ! -d "$work/ckcrash/checkpoints/step00000004" ] && [ -d "$work/ckcrash/checkpoints/step00000002" ] ||
  { echo "mid-checkpoint death: exit $rc"; ls -a "$work/ckcrash/checkpoints"; cat "$work/ckcrash.log"; exit 1; }
echo "mid-checkpoint death: step 4 not complete, step 2 intact"
echo "layouts: ok"
