#!/usr/bin/env bash
# HSDP figures on this machine: step time, bytes sent per rank per step (against a ring all-reduce of
# the same fp32 gradients and against FSDP2's all-gather in forward and backward plus a reduce-scatter per
# micro-batch, and an all-reduce among replicas), the time per step in the gradient's per-unit exchange at the owners
# and per-rank persistent state, for 1x1, 2x1, 3x1, 2x2 and 3x2 (dp_shard x dp_replicate; 3 ranks get a round
# with a rank idle and micro-batches that are not nodes of the tree). "sent" and "exchange" are the largest over
# the ranks.
#   bash bench/hsdp_bench.sh [CONFIG] [STEPS]
# Environment: OLMOREF_BIN (default build/olmoref), LAYOUTS (default "1x1 2x1 3x1 2x2 3x2"), MICRO_BATCH
# (default 2, so that 6 ranks have a micro-batch each; it never changes the bits), TRAIN_ARGS (more `train` arguments,
# e.g. "--no-prefetch" to time FSDP's unit gathers on the spot against the prefetch).
# Needs the demo corpus for configs/small.toml (tools/demo.sh or data/demo/make_demo_corpus.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
config="${1:-configs/small.toml}"
steps="${2:-6}"
BIN="${OLMOREF_BIN:-build/olmoref}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader OMPI_MCA_pml=ob1
export OMPI_MCA_btl_vader_single_copy_mechanism=none
[ -f runs/demo-data/train.mix ] || bash data/demo/make_demo_corpus.sh runs/demo-data "$BIN" > /dev/null
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
common=(--config "$config" --steps "$steps" --set data.audit=false --set checkpoint.interval=0 --set train.log_every=1
        --set train.micro_batch_instances="${MICRO_BATCH:-2}" ${TRAIN_ARGS:-})
M=$("$BIN" config --config "$config" --set train.micro_batch_instances="${MICRO_BATCH:-2}" |
    sed -nE 's/.*= ([0-9]+) micro-batches.*/\1/p')
printf "%-8s %-7s %10s %14s %12s %12s %14s %14s %12s\n" layout threads "s/step" "sent MiB/step" "ring AR MiB" "FSDP2 MiB" \
  "exchange s" "state MiB/rank" "max RSS MiB"
for layout in ${LAYOUTS:-1x1 2x1 3x1 2x2 3x2}; do
  s=${layout%x*}; r=${layout#*x}; np=$((s * r))
  threads=$(( 2 / np )); [ $threads -ge 1 ] || threads=1
  /usr/bin/time -f "%M" -o "$work/$layout.rss" mpirun --oversubscribe --bind-to none -np $np \
    "$BIN" train "${common[@]}" --threads $threads --dp-shard $s --dp-replicate $r --out "$work/$layout" --report-comm \
    2> "$work/$layout.log"
  # Step time: the median of the per-step tokens/s lines after the first (warm-up) step.
  tps=$(grep -E "^step" "$work/$layout.log" | tail -n +2 | awk '{for(i=1;i<=NF;i++) if($i=="tok/s") print $(i-1)}' | sort -n |
        awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
  tokens=$(grep -oE "\(([0-9]+) tokens each\)" "$work/$layout.log" | grep -oE "[0-9]+" | head -1)
  # Each rank's per-step summary line of --report-comm (not its per-collective lines).
  summary=$(grep -E "^rank [0-9]+: sent [0-9.]+ MiB/step" "$work/$layout.log" || true)
  rank0=$(grep -E "^rank 0: " <<< "$summary" || true)
  sent=$(awk '{print $4}' <<< "$summary" | sort -g | tail -1)
  ring=$(sed -E 's/.*gradients: ([0-9.]+) MiB.*/\1/' <<< "$rank0")
  state=$(sed -E 's/.*state ([0-9.]+) MiB.*/\1/' <<< "$rank0")
  exchange=$(sed -nE 's/.*gradient exchange ([0-9.]+) s\/step.*/\1/p' <<< "$summary" | sort -g | tail -1)
  flat=$(sed -nE 's/.*the flat vector ([0-9.]+) MiB.*/\1/p' <<< "$rank0")
  # FSDP2 per rank: 3 x n(S-1)/S per micro-batch (all-gather forward and backward, reduce-scatter), and with
  # replicas one ring all-reduce of the shard's gradient, 2 x (n/S)(R-1)/R.
  fsdp2=$(python3 -c "import math, sys; n, S, R, W, M = float(sys.argv[1] or 0), *map(int, sys.argv[2:]); \
print(f'{math.ceil(M / W) * 3 * n * (S - 1) / S + 2 * n / S * (R - 1) / R:.3f}')" "$flat" "$s" "$r" "$np" "$M")
  [ -n "$sent" ] || { sent=0; ring=0; state=$(awk 'BEGIN{print "n/a"}'); }
  [ -n "$exchange" ] || exchange=0
  rss=$(( $(cat "$work/$layout.rss") / 1024 ))
  printf "%-8s %-7s %10.3f %14s %12s %12s %14s %14s %12s\n" "$layout" "$threads" "$(echo "$tokens / $tps" | bc -l)" "$sent" \
    "$ring" "$fsdp2" "$exchange" "$state" "$rss"
  cmp -s "$work/1x1/trace.jsonl" "$work/$layout/trace.jsonl" || echo "  (trace differs from 1x1!)"
done
echo "(max RSS is the largest single process; mpirun's own memory excluded)"
