#!/usr/bin/env bash
# Single-process step time of two olmoref binaries on the same runs, alternating A, B, A, B, ... so that
# machine noise hits both alike: the price of a change in the step (e.g. per-instance gradient leaves).
#   bash bench/step_time.sh A_BIN B_BIN [REPEATS] [THREADS]
# Runs configs/small.toml on the demo corpus (6 steps) and a 29M-parameter config (d_model 512, 8 layers,
# FFN 1536, seq 512, window 256, micro-batch 2, global batch 8; 3 steps) and prints the median s/step of
# the steps after the first of each run, per binary, and the ratio B/A.
set -euo pipefail
cd "$(dirname "$0")/.."
A="${1:?usage: bench/step_time.sh A_BIN B_BIN [REPEATS] [THREADS]}"
B="${2:?usage: bench/step_time.sh A_BIN B_BIN [REPEATS] [THREADS]}"
repeats="${3:-3}"
threads="${4:-2}"
[ -f runs/demo-data/train.mix ] || bash data/demo/make_demo_corpus.sh runs/demo-data "$B" > /dev/null
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
base=(--config configs/small.toml --set data.audit=false --set checkpoint.interval=0 --set train.log_every=1 --threads "$threads")
declare -A runs
runs[small]="--steps 6"
runs[29m]="--steps 3 --set model.d_model=512 --set model.n_layers=8 --set model.n_heads=8 --set model.n_kv_heads=8 \
--set model.ffn_hidden=1536 --set train.seq_len=512 --set model.swa_pattern=[256,256,256,-1] \
--set train.micro_batch_instances=2 --set train.global_batch_instances=8"
# seconds per step of one run: tokens per step / tokens/s, median over the steps after the first
step_seconds() {
  local log=$1 tokens
  tokens=$(grep -oE "\(([0-9]+) tokens each\)" "$log" | grep -oE "[0-9]+" | head -1)
  grep -E "^step" "$log" | tail -n +2 | awk '{for(i=1;i<=NF;i++) if($i=="tok/s") print $(i-1)}' |
    awk -v t="$tokens" '{print t / $1}' | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'
}
printf "%-6s %-10s %-10s %-8s\n" config "A s/step" "B s/step" "B/A"
for name in small 29m; do
  : > "$work/$name.A"; : > "$work/$name.B"
  for rep in $(seq 1 "$repeats"); do
    for which in A B; do
      bin=$A; [ $which = B ] && bin=$B
      # shellcheck disable=SC2086
      "$bin" train "${base[@]}" ${runs[$name]} --out "$work/$name-$which-$rep" 2> "$work/$name-$which-$rep.log"
      step_seconds "$work/$name-$which-$rep.log" >> "$work/$name.$which"
    done
  done
  a=$(sort -g "$work/$name.A" | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
  b=$(sort -g "$work/$name.B" | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
  printf "%-6s %-10.4f %-10.4f %-8.3f\n" "$name" "$a" "$b" "$(echo "$b / $a" | bc -l)"
done
echo "(median of $repeats alternating runs each; $threads thread(s); $(nproc) cores: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs))"
