#!/usr/bin/env bash
# bench/moe_bench.sh — olmoref's mixture-of-experts training step on the CPU against the OLMo-core peer (its own
# MoETransformer, fp32 eager, bench/olmo_core_moe_peer.py) on the same shapes and threads, alternating the two so
# machine noise hits both alike, and next to olmoref's dense model with the same active parameters per token (its
# FFN width chosen so that 3·F·d equals the router, shared expert and top-k experts' 3·k·h·d).
#
#   bash bench/moe_bench.sh [--threads "1 2"] [--repeats 2] [--configs "tiny-moe small-moe"] [--build build]
#
# Configs: `tiny-moe` is configs/tiny-moe.toml (8 experts of 32, top-2, shared 64; seq 64, micro-batch 2, global 8);
# `small-moe` is smallmoe's proportions at d 128 (4 layers, 32 experts of 64, top-4, shared 256; seq 128,
# micro-batch 4, global 8). Prints tokens/s of each side (best step after the first over the repeats, median beside
# it) and the ratios. Expert parallelism (train --ep) has its own benchmark: bench/moe_ep_bench.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
threads_list="1 2"; repeats=2; configs="tiny-moe small-moe"; build=build
source bench/args.sh
bench_args bench/moe_bench.sh threads=threads_list repeats=repeats configs=configs build=build -- "$@"
py="${OLMOREF_OLMO_CORE_VENV:-$HOME/.cache/olmoref/venv-olmo-core}/bin/python"
[ -x "$py" ] || { echo "bench/moe_bench.sh: missing $py (OLMo-core's venv): run bash tools/setup_python.sh first" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
source bench/moe_shapes.sh
peer_rates() { grep -E "^step " "$1" | tail -n +2 | awk '{print $4 / $6}'; }
active() { "$bin" config "$@" | awk '/^active\/token/ {print $2; f=1} /^parameters/ {p=$2} END {if (!f) print p}'; }

printf "%-10s %-7s %-14s %-22s %-22s %-7s %-22s %-8s\n" config threads "active params" "olmoref MoE tok/s" \
  "OLMo-core MoE tok/s" ratio "olmoref dense tok/s" "MoE/dense"
for name in $configs; do
  # shellcheck disable=SC2086
  "$bin" config ${moe[$name]} "${common[@]}" --resolved > "$work/$name.toml"
  # shellcheck disable=SC2086
  a_moe=$(active ${moe[$name]}); a_dense=$(active ${dense[$name]})
  for t in $threads_list; do
    : > "$work/o"; : > "$work/p"; : > "$work/d"
    for rep in $(seq 1 "$repeats"); do
      # shellcheck disable=SC2086
      "$bin" train ${moe[$name]} "${common[@]}" --steps "${steps[$name]}" --threads "$t" --no-checkpoint \
        --out "$work/m" > "$work/run.log" 2>&1 || { cat "$work/run.log" >&2; exit 1; }
      olmoref_rates "$work/run.log" >> "$work/o"; rm -rf "$work/m"
      "$py" bench/olmo_core_moe_peer.py "$work/$name.toml" --steps "${steps[$name]}" --threads "$t" \
        > "$work/peer.log" 2>&1 || { cat "$work/peer.log" >&2; exit 1; }
      peer_rates "$work/peer.log" >> "$work/p"
      # shellcheck disable=SC2086
      "$bin" train ${dense[$name]} "${common[@]}" --steps "${steps[$name]}" --threads "$t" --no-checkpoint \
        --out "$work/dn" > "$work/run.log" 2>&1 || { cat "$work/run.log" >&2; exit 1; }
      olmoref_rates "$work/run.log" >> "$work/d"; rm -rf "$work/dn"
    done
    o=$(best < "$work/o"); p=$(best < "$work/p"); d=$(best < "$work/d")
    printf "%-10s %-7s %-14s %-22s %-22s %-7.2f %-22s %-8.2f\n" "$name" "$t" "$a_moe / $a_dense" \
      "$(printf '%.0f (%.0f)' "$o" "$(median < "$work/o")")" "$(printf '%.0f (%.0f)' "$p" "$(median < "$work/p")")" \
      "$(awk -v a="$o" -v b="$p" 'BEGIN {print a / b}')" "$(printf '%.0f (%.0f)' "$d" "$(median < "$work/d")")" \
      "$(awk -v a="$o" -v b="$d" 'BEGIN {print a / b}')"
  done
done
echo "(active params: MoE / its dense twin; best and median step over $repeats alternating runs each; $(nproc) cores:" \
  "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); torch $("$py" -c 'import torch; print(torch.__version__)' 2>/dev/null)," \
  "olmoref $(git rev-parse --short HEAD 2>/dev/null || echo '?'))"
