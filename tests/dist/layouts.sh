#!/usr/bin/env bash
# Layout and micro-batch invariance (tiers T3 and T6) through mpirun: the same run at any world size (1-6 and 8
# ranks, shard x replicate products such as 3x1, 1x3, 3x2, 2x3, uneven runs of micro-batches), fp32 and bf16,
# and at any micro-batch size (divisors or not), writes byte-identical traces to the single-process run;
# resumes across layouts and micro-batch sizes (resume-check, a chain of restarts, a kill -9 during a 3-rank
# checkpoint) continue identically; the replicas split the gradient and moments (the distributed optimizer) and
# together hold one copy of them; two negative controls (the old micro-batch-chain order, a float
# all-reduce) break the invariance; a rank that dies or hangs ends the job quickly, naming the rank, and
# leaves no checkpoint marked complete.
source "${OLMOREF_SOURCE_ROOT:?}/tests/common/shell_test.sh"
source "$SRC/tests/dist/mpi_env.sh"
python3 "$SRC/tests/make_tokens.py" "$work/tokens.u16" 9 120000
# 12 instances per step in 6 micro-batches of 2: runs of micro-batches differ between ranks at 4 and 5 ranks,
# and instance ranges are not whole subtrees of the instance tree at 3, 4, 5 and 6 ranks.
base=(--config "$SRC/configs/tiny.toml" --set "data.train_files=[\"$work/tokens.u16\"]"
      --set train.global_batch_instances=12 --set data.audit=true --set checkpoint.interval=2 --steps 4 --threads 1 --quiet)
cfg=("${base[@]}" --set train.micro_batch_instances=2)
bf16=(--set train.precision=\"bf16\")

"$BIN" train "${cfg[@]}" --out "$work/single"
"$BIN" train "${cfg[@]}" "${bf16[@]}" --out "$work/single-bf16"
same() {  # same REFERENCE RUN WHAT: traces byte-identical
  cmp "$work/$1/trace.jsonl" "$work/$2/trace.jsonl" || { echo "$3: trace differs from $1"; exit 1; }
  echo "$3: identical"
}
run_layout() {  # run_layout NAME SxR EXTRA...: an mpirun at that layout
  local name=$1 s=${2%x*} r=${2#*x}
  shift 2
  "${MPIRUN[@]}" -np $((s * r)) "$BIN" train "$@" --dp-shard "$s" --dp-replicate "$r" --out "$work/$name" --report-comm --comm-timeout 60 \
    2> "$work/$name.log" || { echo "$name failed"; cat "$work/$name.log"; exit 1; }
}
# T3, fp32: any world size and any shard x replicate product.
for layout in 1x1 2x1 1x2 3x1 1x3 4x1 5x1 6x1 2x2 3x2 2x3; do
  run_layout "$layout" "$layout" "${cfg[@]}"
  same single "$layout" "fp32 layout $layout (micro-batch 2)"
done
# The distributed optimizer: the replicas of a shard split its reduced gradient and AdamW moments, so the ranks
# hold one copy of them between them, not one per replica. Each rank's `--report-comm` state is its shard's
# parameters plus its part of the gradient, m and v (4 bytes each): over the ranks 4·(dp_replicate·n + 3n) bytes for n
# parameters, 1.25x the single process's 16n at 1x2, 2x2 and 3x2 (2x before), 1.5x at 1x3 (3x before).
python3 - "$work" <<'PY' || { echo "distributed optimizer: the moments are not split over the replicas"; exit 1; }
import re, sys
def states(name):
    return [float(x) for x in re.findall(r"state ([0-9.]+) MiB", open(f"{sys.argv[1]}/{name}.log").read())]
one = states("1x1")[0]
for layout, want in (("1x2", 1.25), ("2x2", 1.25), ("1x3", 1.5), ("3x2", 1.25)):
    got = sum(states(layout)) / one
    print(f"distributed optimizer: {layout} ranks hold {got:.3f}x the single process's state together (want {want})")
    if abs(got - want) > 0.01:
        sys.exit(1)
PY
# 8 ranks need 8 micro-batches: micro-batch 1 (12 over 8 ranks: 2 rounds, the second with 4 ranks idle), also 5x1
# (3 rounds, the last with 2 micro-batches) and 3x2.
for layout in 8x1 5x1 3x2; do
  run_layout "$layout-mb1" "$layout" "${base[@]}" --set train.micro_batch_instances=1
  same single "$layout-mb1" "fp32 layout $layout (micro-batch 1)"
done
# The owners' exchange in chunks (chosen automatically only for pieces over 4 MiB, so forced here; owners without a
# piece of a unit get empty chunks): the same bits.
for layout in 3x1 2x2; do
  run_layout "$layout-chunks" "$layout" "${cfg[@]}" --debug-exchange-chunks 5
  same single "$layout-chunks" "fp32 layout $layout, the gradient exchanged in 5 chunks per unit"
done
# T5 x T3: data-parallel ranks on the CUDA executor's host execution (device-memory code paths: staged
# all-to-all blocks, the owners' tree on the executor, FSDP units copied into a unit-sized device buffer) equal the CPU's
# single process. cuda-host costs about 0.5 s of CPU a step, so these runs stop after step 3, one step past the
# step-2 checkpoint (the device state read back for it).
same_start() {  # same_start REFERENCE RUN WHAT: RUN's trace is REFERENCE's first 3 steps, byte for byte
  cmp <(head -n 3 "$work/$1/trace.jsonl") "$work/$2/trace.jsonl" || { echo "$3: trace differs from $1"; exit 1; }
  echo "$3: identical (steps 1-3)"
}
for layout in 1x2 1x3 2x1 3x2; do
  run_layout "$layout-cuda-host" "$layout" "${cfg[@]}" --executor cuda-host --stop-after 3
  same_start single "$layout-cuda-host" "fp32 layout $layout on cuda-host (micro-batch 2)"
done
# bf16 under FSDP on the device paths: the unit in use is copied into one unit-sized device buffer and its bf16
# working copy into another, both read at the flat vector's offsets.
run_layout "2x1-bf16-cuda-host" 2x1 "${cfg[@]}" "${bf16[@]}" --executor cuda-host --stop-after 3
same_start single-bf16 "2x1-bf16-cuda-host" "bf16 layout 2x1 on cuda-host (micro-batch 2)"
# The tree at the owners: no rank ever holds a full-length gradient, and what a rank holds for the gradient is at
# most ceil(log2 N) + 1 slices of its optimizer range plus one unit's local slots and exchange blocks
# (docs/canonical/step.md). The bound is computed here from the config's shapes, not taken from the trainer.
python3 - "$work" "$SRC/configs/tiny.toml" <<'PY' || { echo "gradient buffers at the owners exceed their bound"; exit 1; }
import math, re, sys, tomllib
m = tomllib.load(open(sys.argv[2], "rb"))["model"]
d, V, F, H = m["d_model"], m["vocab_size"], m["ffn_hidden"], m["n_heads"]
unit = max(V * d + d, 4 * d * d + 3 * d * F + 4 * d)  # the head, or a block (q, k, v, o at most d x d; norms)
N = 12
# The cuda-host runs exchange on a thread (dist::ExchangeOverlap): their unit in flight keeps its send blocks while
# the next unit fills a second set.
later = [(l + "-cuda-host", 2) for l in ("1x2", "1x3", "2x1", "3x2")]
for name, mb in [(l, 2) for l in ("2x1", "1x2", "3x1", "1x3", "4x1", "5x1", "6x1", "2x2", "3x2", "2x3")] + \
                [(l + "-mb1", 1) for l in ("8x1", "5x1", "3x2")] + later:
    S, R = (int(x) for x in name.split("-")[0].split("x"))
    W = S * R
    lines = re.findall(r"gradient buffers peak ([0-9.]+) MiB, longest ([0-9.]+) MiB \(the flat vector ([0-9.]+) MiB\)",
                       open(f"{sys.argv[1]}/{name}.log").read())
    if len(lines) != W:
        sys.exit(f"{name}: {len(lines)} ranks reported gradient buffers, want {W}")
    for peak, longest, flat in ((float(a), float(b), float(c)) for a, b, c in lines):
        n = flat * (1 << 20) / 4
        chunks = math.ceil(n / 65536)
        ostride = math.ceil(math.ceil(chunks / S) / R) * 65536
        k = 2 * math.ceil(math.log2(mb)) if mb > 1 else 1  # maximal subtrees of one micro-batch
        local = (math.ceil(math.log2(mb)) + 1) * unit
        sends = 2 if name.endswith("cuda-host") else 1
        bound = (math.ceil(math.log2(N)) + 1) * ostride + local + sends * k * unit + W * k * min(unit, ostride)
        if longest >= flat:
            sys.exit(f"{name}: a gradient value of {longest} MiB held, the flat vector's length ({flat} MiB)")
        if peak * (1 << 20) / 4 > bound * 1.001:
            sys.exit(f"{name}: gradient buffers peak at {peak} MiB, over the bound {bound * 4 / (1 << 20):.4f} MiB")
    print(f"owners' tree at {name}: longest gradient value held {max(float(b) for _, b, _ in lines):.3f} MiB of a "
          f"{flat:.3f} MiB vector; peak {max(float(a) for a, _, _ in lines):.3f} MiB per rank (bound "
          f"{bound * 4 / (1 << 20):.3f})")
PY
# Audit logs after a resume at fewer ranks: the 2-rank logs lose their records past the checkpoint, and all the
# directory's logs together hold exactly the uninterrupted run's records (step, instance, tokens).
cp -r "$work/2x1" "$work/audit-2x1"  # the 2x1 run above is this run (the same command): not trained twice
"$BIN" train "${cfg[@]}" --out "$work/audit-2x1" --resume-from "$work/audit-2x1/checkpoints/step00000002"
python3 - "$work/single/audit.jsonl" "$work/audit-2x1" <<'PY' || { echo "audit after a 2x1 -> 1x1 resume differs"; exit 1; }
import glob, json, sys
key = lambda r: (r["step"], r["instance"], r["xxh3"])
want = sorted(key(json.loads(l)) for l in open(sys.argv[1]))
got = sorted(key(json.loads(l)) for f in glob.glob(sys.argv[2] + "/audit*.jsonl") for l in open(f))
sys.exit(0 if got == want else 1)
PY
echo "audit after a 2x1 -> 1x1 resume: the uninterrupted run's records, none stale"
# leakcheck reads the logs of a run that changed layout (each step against the ranks that logged it) and accepts
# them; a rank's records relabelled as another rank's are caught by their file.
python3 -c "import random,struct,sys; random.seed(7); open(sys.argv[1],'wb').write(struct.pack('<4000H',*[random.randrange(500) for _ in range(4000)]))" "$work/holdout.u16"
logs=(); for f in "$work"/audit-2x1/audit*.jsonl; do logs+=(--audit "$f"); done
lc=("$BIN" leakcheck --config "$SRC/configs/tiny.toml" --set "data.train_files=[\"$work/tokens.u16\"]"
    --set train.global_batch_instances=12 --set train.micro_batch_instances=2 --steps 4
    --set "data.holdout_files=[\"$work/holdout.u16\"]")
"${lc[@]}" "${logs[@]}" --report "$work/lc.json" > "$work/lc.log" 2>&1 || { cat "$work/lc.log"; echo "leakcheck refused a clean 2x1 -> 1x1 resume's audit"; exit 1; }
mkdir -p "$work/relabel"
sed 's/"rank":1/"rank":0/' "$work/audit-2x1/audit-rank00001.jsonl" > "$work/relabel/audit-rank00001.jsonl"
if "${lc[@]}" --audit "$work/audit-2x1/audit.jsonl" --audit "$work/audit-2x1/audit-rank00000.jsonl" \
     --audit "$work/relabel/audit-rank00001.jsonl" --report "$work/lc2.json" > "$work/lc2.log" 2>&1; then
  echo "leakcheck accepted relabelled rank records"; exit 1
fi
grep -q "is rank 1's log but holds a record of rank 0" "$work/lc2.log"
echo "leakcheck: the resumed run's audit accepted; relabelled records caught"
# T3, bf16.
for layout in 3x1 2x3 4x1 5x1; do
  run_layout "$layout-bf16" "$layout" "${cfg[@]}" "${bf16[@]}"
  same single-bf16 "$layout-bf16" "bf16 layout $layout (micro-batch 2)"
done
# Only shown, never checked: awk stops by itself, where `grep | head` under pipefail can die of SIGPIPE (or of no match).
awk '/sent/ { print; if (++n == 4) exit }' "$work/2x1.log" "$work/3x1.log"
# The per-rank audit logs together are exactly the single-process log (same records, rank aside).
for layout in 4x1 5x1-mb1; do
  cat "$work/$layout"/audit-rank*.jsonl | sed 's/"rank":[0-9]*,//; s/"microbatch":[0-9]*,//' | sort > "$work/audit-$layout.sorted"
  sed 's/"rank":[0-9]*,//; s/"microbatch":[0-9]*,//' "$work/single/audit.jsonl" | sort > "$work/audit-single.sorted"
  cmp "$work/audit-single.sorted" "$work/audit-$layout.sorted"
done

# T6: the micro-batch size never changes the bits (1, 2, 4, 8 and the non-divisors 5 and 8 of 12), fp32 and bf16.
for mb in 1 3 4 5 8 12; do
  "$BIN" train "${base[@]}" --set train.micro_batch_instances=$mb --out "$work/mb$mb"
  same single "mb$mb" "fp32 micro-batch $mb"
  "$BIN" train "${base[@]}" "${bf16[@]}" --set train.micro_batch_instances=$mb --out "$work/mb$mb-bf16"
  same single-bf16 "mb$mb-bf16" "bf16 micro-batch $mb"
done
# Negative control: the old order (micro-batches as chains, then a tree over micro-batch index) breaks T6.
"$BIN" train "${base[@]}" --set train.micro_batch_instances=4 --debug-tree-shape microbatch-chain --out "$work/chain4"
cmp -s "$work/single/trace.jsonl" "$work/chain4/trace.jsonl" &&
  { echo "negative control: the micro-batch-chain tree matched the instance tree (the test cannot tell)"; exit 1; }
echo "negative control: the micro-batch-chain tree differs"
# Refusals say what to change.
set +e
"${MPIRUN[@]}" -np 8 "$BIN" train "${cfg[@]}" --dp-shard 8 --out "$work/crowded" > "$work/crowded.log" 2>&1
rc=$?
set -e
[ $rc -ne 0 ] && grep -q "train.micro_batch_instances <= 1" "$work/crowded.log" ||
  { echo "8 ranks for 6 micro-batches: exit $rc"; cat "$work/crowded.log"; exit 1; }
echo "8 ranks for 6 micro-batches: refused, naming the fix"

# Resume at another layout and micro-batch size (T3 + T6 across a restart), with resume-check: a checkpoint
# written with micro-batch 8 at 4x1 (32 instances per step) resumes with micro-batch 2 at 3x1.
big=(--config "$SRC/configs/tiny.toml" --set "data.train_files=[\"$work/tokens.u16\"]" --set train.global_batch_instances=32
     --threads 1)
"$BIN" resume-check "${big[@]}" --set train.micro_batch_instances=8 --steps 4 --at 2 --layout 4x1 --resume-layout 3x1 \
  --resume-set train.micro_batch_instances=2 > "$work/rc.log" 2>&1 || { cat "$work/rc.log"; exit 1; }
grep -q "IDENTICAL" "$work/rc.log"
echo "resume-check 4x1 micro-batch 8 -> 3x1 micro-batch 2: identical"
# A chain of resumes: 1x1 mb 3 -> (after step 2) 3x2 mb 1 -> (after step 3) 5x1 mb 2; and 2x2 -> 4x1.
out="$work/chain"
"$BIN" train "${base[@]}" --set train.micro_batch_instances=3 --stop-after 2 --out "$out"
"${MPIRUN[@]}" -np 6 "$BIN" train "${base[@]}" --set train.micro_batch_instances=1 --dp-shard 3 --dp-replicate 2 \
  --stop-after 3 --out "$out" --resume --comm-timeout 60
"${MPIRUN[@]}" -np 5 "$BIN" train "${base[@]}" --set train.micro_batch_instances=2 --dp-shard 5 --stop-after 4 --out "$out" --resume --comm-timeout 60
same single chain "resume chain 1x1 mb3 -> 3x2 mb1 -> 5x1 mb2"
out="$work/reshard"
"${MPIRUN[@]}" -np 4 "$BIN" train "${cfg[@]}" --dp-shard 2 --dp-replicate 2 --stop-after 2 --out "$out"
"${MPIRUN[@]}" -np 4 "$BIN" train "${cfg[@]}" --dp-shard 4 --out "$out" --resume
same single reshard "resume 2x2 -> 4x1"
"$BIN" ckpt verify "$work/2x2/checkpoints/step00000004" > /dev/null
# kill -9 of one rank of a 3-rank run in the middle of the step-4 checkpoint (after its shard, before the
# manifest): step 2 stays the newest complete checkpoint; resuming it at 2x1 with micro-batch 4 finishes identically.
set +e
OLMOREF_TEST_CRASH_IN_SAVE=4 OLMOREF_TEST_CRASH_SHARD=2 timeout 120 "${MPIRUN[@]}" -np 3 "$BIN" train "${cfg[@]}" --dp-shard 3 \
  --comm-timeout 20 --out "$work/kill3" > "$work/kill3.log" 2>&1
rc=$?
set -e
[ $rc -ne 0 ] && [ ! -d "$work/kill3/checkpoints/step00000004" ] && [ -d "$work/kill3/checkpoints/step00000002" ] ||
  { echo "kill -9 in a 3-rank checkpoint: exit $rc"; ls -a "$work/kill3/checkpoints"; cat "$work/kill3.log"; exit 1; }
"${MPIRUN[@]}" -np 2 "$BIN" train "${base[@]}" --set train.micro_batch_instances=4 --dp-shard 2 --out "$work/kill3" --resume --comm-timeout 60
same single kill3 "kill -9 during a 3-rank checkpoint, resumed at 2x1 micro-batch 4"

# Negative control: a per-rank fp32 running sum plus MPI's float all-reduce is not layout invariant.
differ=0
for np in 1 2 3 4; do
  "${MPIRUN[@]}" -np $np "$BIN" train "${cfg[@]}" --dp-shard $np --debug-float-allreduce --out "$work/float-$np"
  cmp -s "$work/single/trace.jsonl" "$work/float-$np/trace.jsonl" || differ=$((differ + 1))
done
[ $differ -ge 1 ] || { echo "negative control: the float all-reduce matched at every layout (the test cannot tell)"; exit 1; }
echo "negative control: $differ of 4 layouts differ with a float all-reduce"

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
