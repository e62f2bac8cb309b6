#!/usr/bin/env bash
# bench/vs_pytorch.sh — olmoref's CPU trainer against the PyTorch peer (Hugging Face Olmo3ForCausalLM with sdpa
# attention + torch.optim.AdamW, fp32 eager, bench/pytorch_peer.py) on the same shapes, threads and step-0
# weights, alternating olmoref, peer, olmoref, peer, ... so that machine noise hits both alike.
#
#   bash bench/vs_pytorch.sh [--threads "1 2"] [--repeats 2] [--configs "small 29m"] [--build build]
#
# Configs: `small` is configs/small.toml (1.6M parameters, seq 256, window 128, micro-batch 4, global 16);
# `29m` is d_model 512, 8 layers, 8 heads, FFN 1536, seq 512, window 256, micro-batch 2, global 8.
# Prints per config and thread count: tokens/s of each (the best step after the first, best over the repeats: on a
# shared VM other tenants only ever slow a step down (steal time), so the best is the least disturbed measurement of
# both sides; the median is printed beside it), the ratio olmoref / PyTorch of the bests, olmoref's achieved GFLOP/s (the FLOPs its profiler counts in
# GEMMs and attention, over the whole step time) and that as a share of the canonical GEMM's peak measured here
# (bench_gemm's best forward product at the same thread count); then olmoref's per-op breakdown of one
# profiled run (--profile-ops) per config at the largest thread count.
set -euo pipefail
cd "$(dirname "$0")/.."
threads_list="1 2"; repeats=2; configs="small 29m"; build=build
source bench/args.sh
bench_args bench/vs_pytorch.sh threads=threads_list repeats=repeats configs=configs build=build -- "$@"
py="${OLMOREF_VENV:-$HOME/.cache/olmoref/venv}/bin/python"
[ -x "$py" ] || { echo "bench/vs_pytorch.sh: missing $py: run bash tools/setup_python.sh first" >&2; exit 1; }
[ -f runs/demo-data/train.mix ] || bash data/demo/make_demo_corpus.sh runs/demo-data "$bin" > /dev/null
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

base=(--config configs/small.toml --set data.audit=false --set checkpoint.interval=0 --set eval.interval=0
      --set train.log_every=1)
declare -A shape steps seq micro global
shape[small]=""
seq[small]=256; micro[small]=4; global[small]=16; steps[small]=6
shape[29m]="--set model.d_model=512 --set model.n_layers=8 --set model.n_heads=8 --set model.n_kv_heads=8 \
--set model.ffn_hidden=1536 --set train.seq_len=512 --set model.swa_pattern=[256,256,256,-1] \
--set train.micro_batch_instances=2 --set train.global_batch_instances=8"
seq[29m]=512; micro[29m]=2; global[29m]=8; steps[29m]=4

median() { sort -g | awk '{a[NR]=$1} END {if (NR) print a[int((NR+1)/2)]; else print "nan"}'; }
best() { sort -g | tail -1; }
# tokens/s of each step after the first: olmoref's log lines, the peer's "step K tokens T seconds S" lines
olmoref_rates() { grep -E "^step" "$1" | tail -n +2 | awk '{for(i=1;i<=NF;i++) if($i=="tok/s") print $(i-1)}'; }
peer_rates() { grep -E "^step " "$1" | tail -n +2 | awk '{print $4 / $6}'; }

# The canonical GEMM's peak here: the best GFLOP/s bench_gemm measures for the forward product over its training
# shapes and 1024^3 at this thread count, best of 3 repetitions each.
gemm_peak() {
  local t=$1 exe="$build/bench/bench_gemm"
  [ -x "$exe" ] || { echo nan; return; }
  "$exe" --benchmark_filter="^gemm/fwd/olmoref/.*/threads:$t(/|\$)" --benchmark_repetitions=3 \
    --benchmark_min_time=0.2 --benchmark_format=json 2>/dev/null |
    "$py" -c 'import json,sys; d=json.load(sys.stdin); print(max(b["GFLOPS"] for b in d["benchmarks"] if b.get("run_type")=="iteration"))'
}

max_threads=$(echo $threads_list | tr ' ' '\n' | sort -n | tail -1)
declare -A peak_of
for t in $threads_list; do peak_of[$t]=$(gemm_peak "$t"); done  # once per thread count, not per config
printf "%-6s %-7s %-22s %-22s %-6s %-8s %-12s\n" config threads "olmoref tok/s (median)" "PyTorch tok/s (median)" ratio "GFLOP/s" "of GEMM peak"
for name in $configs; do
  hf="$work/hf-$name"
  # shellcheck disable=SC2086
  "$bin" export-hf --config configs/small.toml ${shape[$name]} --out "$hf" > /dev/null
  # FLOPs per step from one profiled run (the profiler counts GEMM and attention arithmetic; the rest is
  # elementwise and not counted), and the per-op table printed at the end.
  # shellcheck disable=SC2086
  "$bin" train "${base[@]}" ${shape[$name]} --steps "${steps[$name]}" --threads "$max_threads" --profile-ops \
    --out "$work/$name-prof" > "$work/$name-prof.log" 2>&1
  flops_per_step=$(awk -v n="${steps[$name]}" '/^op \(/{on=1; next} on && NF>=6 && $NF ~ /^[0-9]+$/ {s += $NF} END {print s / n}' \
    "$work/$name-prof.log")
  tokens_per_step=$(( ${seq[$name]} * ${global[$name]} ))
  for t in $threads_list; do
    : > "$work/o"; : > "$work/p"
    for rep in $(seq 1 "$repeats"); do
      # shellcheck disable=SC2086
      "$bin" train "${base[@]}" ${shape[$name]} --steps "${steps[$name]}" --threads "$t" \
        --out "$work/$name-$t-$rep" > "$work/run.log" 2>&1
      olmoref_rates "$work/run.log" >> "$work/o"
      rm -rf "$work/$name-$t-$rep"
      "$py" bench/pytorch_peer.py "$hf" --seq-len "${seq[$name]}" --micro-batch "${micro[$name]}" \
        --global-batch "${global[$name]}" --steps "${steps[$name]}" --threads "$t" > "$work/peer.log" 2>&1 ||
        { cat "$work/peer.log" >&2; exit 1; }
      peer_rates "$work/peer.log" >> "$work/p"
    done
    o=$(best < "$work/o"); p=$(best < "$work/p"); om=$(median < "$work/o"); pm=$(median < "$work/p")
    peak=${peak_of[$t]}
    gflops=$(awk -v f="$flops_per_step" -v r="$o" -v n="$tokens_per_step" 'BEGIN {printf "%.1f", f * r / n / 1e9}')
    share=$(awk -v g="$gflops" -v p="$peak" 'BEGIN {if (p == "nan" || p == 0) print "n/a"; else printf "%.0f%% of %.0f", 100 * g / p, p}')
    printf "%-6s %-7s %-22s %-22s %-6.2f %-8s %-12s\n" "$name" "$t" "$(printf '%.0f (%.0f)' "$o" "$om")" \
      "$(printf '%.0f (%.0f)' "$p" "$pm")" "$(awk -v a="$o" -v b="$p" 'BEGIN {print a / b}')" "$gflops" "$share"
  done
done
echo "(best and median step over $repeats alternating runs each; $(nproc) cores: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs);" \
  "torch $("$py" -c 'import torch; print(torch.__version__)'), olmoref $(git rev-parse --short HEAD 2>/dev/null || echo '?'))"
for name in $configs; do
  echo
  echo "olmoref per-op time, $name, $max_threads thread(s), ${steps[$name]} steps (the first includes allocating and zeroing every buffer):"
  sed -n '/^per-op time/,$p' "$work/$name-prof.log" | tail -n +2
done
