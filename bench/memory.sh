#!/usr/bin/env bash
# Per-rank peak memory, measured (VmHWM, `train --report-memory`, the largest over the ranks) against the memory
# model's prediction for the fullest rank (`olmoref config --layout`, train/memory_model.h), for
# configs/olmo3-100m.toml at seq 256, 8 instances per step, micro-batch 1, one thread per rank, one step and its
# checkpoint: the issue's setting (issue 31). Figures in docs/memory.md.
#   bash bench/memory.sh
# Environment: OLMOREF_BIN (default build/olmoref), LAYOUTS (default "1x1 2x1 4x1 2x2 1x4"), MODES (default
# "none full": train.activation_checkpointing).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN="${OLMOREF_BIN:-build/olmoref}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader OMPI_MCA_pml=ob1
export OMPI_MCA_btl_vader_single_copy_mechanism=none
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 tests/make_tokens.py "$work/tokens.u16" 11 200000
# The vocabulary (100352) needs uint32 token files.
python3 -c "import array, sys; a = array.array('H', open(sys.argv[1], 'rb').read()); open(sys.argv[2], 'wb').write(array.array('I', a).tobytes())" \
  "$work/tokens.u16" "$work/tokens.u32"
common=(--config configs/olmo3-100m.toml --set "data.train_files=[\"$work/tokens.u32\"]"
        --set train.seq_len=256 --set train.global_batch_instances=8 --set train.micro_batch_instances=1)
printf "%-7s %-5s %14s %15s %8s %8s  %s\n" layout mode "measured MiB" "predicted MiB" ratio "s/run" "largest part (predicted)"
for mode in ${MODES:-none full}; do
  for layout in ${LAYOUTS:-1x1 2x1 4x1 2x2 1x4}; do
    s=${layout%x*}; r=${layout#*x}
    table=$("$BIN" config "${common[@]}" --set "train.activation_checkpointing=\"$mode\"" --layout "$layout")
    predicted=$(sed -n 's/.*peak .*(\([0-9]*\) bytes).*/\1/p' <<< "$table")
    # The largest part of the rank's table (not the host table after it), its MiB and GiB alike.
    largest=$(awk '/^host memory/ {exit} /^  / && $1 != "peak" {n=$0; sub(/^  /, "", n); split(n, f, "  +");
                   split(f[2], v, " "); g = v[1] / (v[2] == "MiB" ? 1024 : 1); if (g > best) {best = g; name = f[1]}}
                   END {printf "%s %.2f GiB\n", name, best}' <<< "$table")
    t0=$(date +%s.%N)
    mpirun --oversubscribe --bind-to none -np $((s * r)) "$BIN" train "${common[@]}" \
      --set "train.activation_checkpointing=\"$mode\"" --steps 1 --threads 1 --quiet \
      --dp-shard "$s" --dp-replicate "$r" --report-memory --out "$work/$mode-$layout" 2> "$work/$mode-$layout.log" ||
      { cat "$work/$mode-$layout.log"; exit 1; }
    secs=$(python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.0f}')" "$t0" "$(date +%s.%N)")
    measured=$(sed -n 's/^memory: rank [0-9]* peak resident (VmHWM) \([0-9]*\) bytes.*/\1/p' "$work/$mode-$layout.log" |
               sort -n | tail -1)
    python3 -c "import sys; m, p = int(sys.argv[1]), int(sys.argv[2]); print(f'%-7s %-5s %14.0f %15.0f %8.3f %8s  %s' % (sys.argv[3], sys.argv[4], m / 2**20, p / 2**20, m / p, sys.argv[5], sys.argv[6]))" \
      "$measured" "$predicted" "$layout" "$mode" "$secs" "$largest"
  done
done
