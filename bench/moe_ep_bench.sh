#!/usr/bin/env bash
# bench/moe_ep_bench.sh — expert parallelism (train --ep) on the CPU: tokens/s and bytes sent per rank per step of
# the same MoE training run at EP 1, 2 and 4 over one world of ranks, under FSDP (dp_shard = world: the state is
# split, parameter units are gathered) and under DDP (dp_replicate = world: every rank holds everything), next to
# olmoref's dense model with the same active parameters per token at the same layout. Every EP run's trace is
# checked to be the EP 1 trace, byte for byte, so the figures compare runs that computed the same bits.
#
#   bash bench/moe_ep_bench.sh [--world 4] [--repeats 2] [--configs "tiny-moe small-moe"] [--build build]
#
# Configs as bench/moe_bench.sh (bench/moe_shapes.sh): tiny-moe (8 experts of 32, top-2, shared 64) and small-moe
# (smallmoe's proportions at d 128: 32 experts of 64, top-4, shared 256; micro-batches of 2 here). One thread per
# rank; with more ranks than cores the ranks share them, so tokens/s then measures the work and the waiting, not a
# speed-up. Per run: the best step after the first (median beside it) of rank 0, and from `--report-comm` the
# largest per-rank figures: MiB sent per step (all collectives), of which the expert all-to-all and the state pieces
# moved for the steps' digests and for the checkpoint at the end (spread over the run's steps), and the state held
# per rank (fp32 parameters, gradient shard, AdamW moments: under DDP with EP only the experts the rank runs,
# docs/canonical/moe.md), declared and resident (mincore).
set -euo pipefail
cd "$(dirname "$0")/.."
world=4; repeats=2; configs="tiny-moe small-moe"; build=build
source bench/args.sh
bench_args bench/moe_ep_bench.sh world=world repeats=repeats configs=configs build=build -- "$@"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl=self,vader OMPI_MCA_pml=ob1 OMPI_MCA_btl_vader_single_copy_mechanism=none
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
source bench/moe_shapes.sh
# Every rank needs a micro-batch: 8 instances in micro-batches of 2 feed 4 ranks.
declare -A ep_extra=([tiny-moe]="" [small-moe]="--set train.micro_batch_instances=2")
steps[tiny-moe]=6; steps[small-moe]=5
# The largest per-rank value of a --report-comm field: "sent X MiB/step", "state X MiB", "all-to-all X MiB/step".
worst() { grep -E "^rank [0-9]+: sent" "$1" | sed -E "s/.*$2 ([0-9.]+).*/\1/" | sort -g | tail -1; }
# The largest per-rank state resident in memory (mincore of the state buffers): "(X MiB resident)".
resident() { grep -E "^rank [0-9]+: sent" "$1" | sed -E "s/.*\(([0-9.]+) MiB resident\).*/\1/" | sort -g | tail -1; }

# run NAME KIND(moe|dense) CONFIG SHARD REPLICATE EP: appends tok/s to $work/NAME.rates, keeps the last log.
run() {
  local name=$1 kind=$2 cfg=$3 s=$4 r=$5 ep=$6
  local spec
  if [ "$kind" = moe ]; then spec=${moe[$cfg]}; else spec=${dense[$cfg]}; fi
  spec="$spec ${ep_extra[$cfg]}"
  rm -rf "$work/out-$name"
  # shellcheck disable=SC2086
  mpirun --bind-to none -np "$world" "$bin" train $spec "${common[@]}" --steps "${steps[$cfg]}" --threads 1 \
    --dp-shard "$s" --dp-replicate "$r" --ep "$ep" --report-comm --out "$work/out-$name" > "$work/$name.log" 2>&1 ||
    { cat "$work/$name.log" >&2; exit 1; }
  olmoref_rates "$work/$name.log" >> "$work/$name.rates"
}

printf "%-10s %-7s %-4s %-18s %-12s %-16s %-14s %-14s %-12s %-14s %-9s\n" config layout ep "tok/s best (med)" \
  "MiB sent/rk" "of which expert" "digest pieces" "ckpt pieces" "state MiB/rk" "resident MiB/rk" "trace"
for cfg in $configs; do
  for layout in "$world 1" "1 $world"; do
    read -r s r <<< "$layout"
    for rep in $(seq 1 "$repeats"); do
      for ep in 1 2 4; do
        [ "$ep" -le "$world" ] && [ $((world % ep)) -eq 0 ] || continue
        run "$cfg-$s-$r-ep$ep" moe "$cfg" "$s" "$r" "$ep"
      done
      run "$cfg-$s-$r-dense" dense "$cfg" "$s" "$r" 1
    done
    for ep in 1 2 4 dense; do
      name="$cfg-$s-$r-ep$ep"; [ "$ep" = dense ] && name="$cfg-$s-$r-dense"
      [ -f "$work/$name.rates" ] || continue
      verdict="-"
      if [ "$ep" != dense ] && [ "$ep" != 1 ]; then
        if cmp -s "$work/out-$cfg-$s-$r-ep1/trace.jsonl" "$work/out-$name/trace.jsonl"; then verdict="= EP 1"; else
          echo "bench/moe_ep_bench.sh: $name's trace differs from EP 1's" >&2; exit 1; fi
      fi
      ex=$(worst "$work/$name.log" "all-to-all"); dp=$(worst "$work/$name.log" "step digests")
      cp=$(worst "$work/$name.log" "for checkpoints and evals")
      if [ "$ep" = 1 ] || [ "$ep" = dense ]; then ex=0 dp=0 cp=0; fi
      printf "%-10s %-7s %-4s %-18s %-12.3f %-16.3f %-14.3f %-14.3f %-12.2f %-14.2f %-9s\n" "$cfg" "${s}x$r" "$ep" \
        "$(printf '%.0f (%.0f)' "$(best < "$work/$name.rates")" "$(median < "$work/$name.rates")")" \
        "$(worst "$work/$name.log" sent)" "$ex" "$dp" "$cp" "$(worst "$work/$name.log" state)" \
        "$(resident "$work/$name.log")" "$verdict"
    done
  done
done
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'); world $world ranks, 1 thread each"
