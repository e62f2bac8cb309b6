#!/usr/bin/env bash
# meson test train-time-model: `olmoref config --layout SxR --time` (train/time_model.h) against hand-computed cases
# and against what real runs count.
#   1. By hand, configs/tiny.toml (d 64, 4 layers, 4 heads of 16, 2 KV heads, ffn 192, V 512, windows
#      [16, 16, 16, full], 8 instances of 64 tokens per step):
#      - GEMM: a token's forward runs 2 x (q 64·64 + k, v 2 x 64·32 + o 64·64 + ffn 3 x 64·192) x 4 layers
#        + 2 x the head's 64·512 = 458,752 FLOP; backward twice that: x 3 = 1,376,256 a token, x 512 tokens =
#        704,643,072 a step;
#      - attention: keys per query row summed over 64 positions: 904 in a 16-wide window, 2080 full; (3·904 + 2080)
#        x 8 instances x 4 heads = 153,344 keys, x (4 + 8) x 16 (hd) = 29,442,048 FLOP;
#      - at 2x1 rank 0 holds floats [0, 196608) (3 chunks of 65,536) of 263,104: the embedding (32,768), blocks 1-3
#        (49,376 each) and 15,712 of block 4; in each of the 2 rounds it sends that to rank 1 once for the embedding
#        (forward) and twice for each block (forward, backward): (2·32,768 + 4·(3·49,376 + 15,712)) x 4 bytes =
#        2,883,584 bytes a step;
#      - at rates set to those FLOPs per second, GEMM and attention take 1 s each;
#      - recomputing blocks 0 and 2 (selected_blocks, block_interval 2) adds their forward; the recompute table lists
#        full, block_interval 2 and 4, none, each row as `config --time` at that setting.
#   2. Every exact collective's bytes, rank by rank, equal what `train --report-comm` counts in 2 steps (÷ 2) at 2x1,
#      3x1 (an idle rank in the second round), 2x2 (the replicas' updated parameters), micro-batch 1 (more
#      subtrees), tiny-moe at 2x1 with EP 2 (each rank gathers only its own experts), and context parallelism (CP 2 at
#      2x1, CP 2 beside replicas at 2x2 with recompute: the gathers of positions and the chains' partials); and the
#      FLOPs equal what `train --profile-ops` counts (dense, MoE, with activation recompute of every block or of
#      blocks 0 and 2 (selected_blocks, by hand in 1 too), and rank 0 of a CP group:
#      its part of every instance).
#   3. A bench.json sets the GEMM rate from gemm_bench's rows and the attention's from attention_bench's rows at the
#      model's shapes (weighed by its layers), else from gpu_bench.sh's profile rows (FLOPs over seconds); bad input
#      is refused naming the flag.
source "${OLMOREF_SOURCE_ROOT:?}/tests/common/shell_test.sh"
source "$SRC/tests/dist/mpi_env.sh"
fail() { echo "FAIL: $*"; exit 1; }
python3 "$SRC/tests/make_tokens.py" "$work/tokens.u16" 3 40000 > /dev/null
data=(--set "data.train_files=[\"$work/tokens.u16\"]" --set eval.interval=0)
tiny=(--config "$SRC/configs/tiny.toml" "${data[@]}")

# The value of a `config --time` work line: `line NAME FILE`.
line() { awk -v name="$1" 'index($0, "  " name) == 1 { for (i = 1; i <= NF; ++i) if ($i ~ /^[0-9]+$/) { print $i; exit } }' "$2"; }

# 1. By hand.
"$BIN" config "${tiny[@]}" --layout 1x1 --time --rate gemm_tflops=0.000704643072 \
  --rate attention_tflops=0.000029442048 > "$work/hand.txt"
[ "$(line 'GEMM (forward' "$work/hand.txt")" = 704643072 ] || { cat "$work/hand.txt"; fail "tiny's GEMM FLOPs"; }
[ "$(line 'attention ' "$work/hand.txt")" = 29442048 ] || { cat "$work/hand.txt"; fail "tiny's attention FLOPs"; }
grep -Eq '^  GEMM +1 +1 +1 +1$' "$work/hand.txt" || { cat "$work/hand.txt"; fail "GEMM at its own rate is not 1 s"; }
grep -Eq '^  attention +1 +1 +1 +1$' "$work/hand.txt" || { cat "$work/hand.txt"; fail "attention at its own rate is not 1 s"; }
# Recomputing blocks 0 and 2 (selected_blocks, block_interval 2) adds their forward: GEMM 2 x 98,304 FLOP a token
# (2 x (64·64 + 2 x 64·32 + 64·64 + 3 x 64·192)) x 512 tokens = 100,663,296; attention 2 x 904 keys (both 16-wide
# windows) x 8 instances x 4 heads x 4 x 16 = 3,702,784.
"$BIN" config "${tiny[@]}" --layout 1x1 --time --set 'train.activation_checkpointing="selected_blocks"' \
  --set train.activation_checkpointing_block_interval=2 > "$work/hand-selected.txt"
[ "$(line 'GEMM (forward' "$work/hand-selected.txt")" = 805306368 ] &&
  [ "$(line 'attention ' "$work/hand-selected.txt")" = 33144832 ] ||
  { cat "$work/hand-selected.txt"; fail "tiny's FLOPs recomputing blocks 0 and 2"; }
# The recompute table (`config --time`'s last part): full, selected_blocks at block_interval 2 (blocks 0, 2) and 4
# (block 0), none, in that order; each row's peak and step those of `config --time` at that setting (the step over
# mpi+prefetch; tiny at 1x1 is one rank).
"$BIN" config "${tiny[@]}" --layout 1x1 --time > "$work/recompute.txt"
sed -n '/^recompute at 1x1/,$p' "$work/recompute.txt" | tail -n +2 > "$work/recompute-rows.txt"
[ "$(grep -o '[0-9]* of 4 blocks recomputed' "$work/recompute-rows.txt" | cut -d' ' -f1 | tr '\n' ' ')" = "4 2 1 0 " ] ||
  { cat "$work/recompute.txt"; fail "the recompute table's rows"; }
while read -r mode interval; do
  set_mode=(--set "train.activation_checkpointing=\"$mode\"")
  [ "$interval" = 0 ] || set_mode+=(--set "train.activation_checkpointing_block_interval=$interval")
  "$BIN" config "${tiny[@]}" --layout 1x1 --time "${set_mode[@]}" > "$work/row.txt"
  name=$mode; [ "$interval" = 0 ] || name="$mode, block_interval $interval"
  row=$(awk -v name="$name" 'substr($0, 3, length(name)) == name && substr($0, 3 + length(name), 1) == " "' "$work/recompute-rows.txt")
  peak=$(sed -n 's/^  peak  *\([0-9.]* [KMG]iB\) .*/\1/p' "$work/row.txt" | head -1)
  step=$(sed -n '/seconds per step/,$p' "$work/row.txt" | awk '$1 == "step" {print $3; exit}')  # mpi+prefetch
  [[ "$row" == *" $peak "* && "$row" == *" $step s"* ]] ||
    { echo "row: $row"; cat "$work/row.txt"; fail "recompute table row $name: peak $peak, step $step"; }
done <<< $'full 0\nselected_blocks 2\nselected_blocks 4\nnone 0'
echo "recompute table: full, block_interval 2 and 4, none, each as config --time at that setting"
"$BIN" config "${tiny[@]}" --layout 2x1 --time --rank 0 > "$work/hand2.txt"
[ "$(line 'gather parameters of a unit' "$work/hand2.txt")" = 2883584 ] ||
  { cat "$work/hand2.txt"; fail "tiny 2x1 rank 0's unit gathers"; }
# The prefetch (mpi+prefetch, train's default, and nccl+prefetch) hides the unit gathers' links up to the compute:
# rank 0's gathers, 2883584 bytes sent on its node, at 0.002883584 GB/s (host copies and NVLink alike) take 1 s; its
# compute (half of tiny's FLOPs at the rates of case 1: 0.5 + 0.5 s) hides them whole, and at twice those rates
# (0.25 + 0.25 s) half of them. Under MPI their PCIe staging too (its thread's copies on a side stream): nothing at
# 1000 GB/s; at 0.1572864 GB/s (case 4) the gathers' 2883584 + 1063936 bytes add 0.0251 s.
# The owners' exchange under the next unit's backward then hides, in what compute is left, under MPI all of it: the
# exchange's copies between the ranks (531,968 bytes sent on the node: 0.184482 s), the subtrees' copies to the host
# (the 531,968 bytes sent, on a side stream from the device block the backward fills) and its thread's copies of what
# it received back to the device (1,572,864 bytes): 2.1 us at 1000 GB/s, 0.013382 s in case 4; under NCCL its NVLink
# time (each direction at once: the larger, the 1,572,864 bytes received, 0.545455 s): none in cases 1 and 2, all of
# it at half case 1's rates (2 s of compute, 1 s of it under the gathers).
for spec in 1:0.000704643072:0.000029442048:1000:-1:-1:-0:-0 2:0.001409286144:0.000058884096:1000:-0.5:-0.5:-0:-0 \
  3:0.000352321536:0.000014721024:1000:-1:-1:-0.184484:-0.545455 \
  4:0.000352321536:0.000014721024:0.1572864:-1.0251:-1:-0.197864:-0.545455; do
  IFS=: read -r n gemm att pcie hidden nccl_hidden exchange nccl_exchange <<< "$spec"
  "$BIN" config "${tiny[@]}" --layout 2x1 --time --rank 0 --rate gemm_tflops="$gemm" --rate attention_tflops="$att" \
    --rate host_copy_gbps=0.002883584 --rate nvlink_gbps=0.002883584 --rate pcie_gbps="$pcie" > "$work/prefetch$n.txt"
  grep -Eq "^  unit gathers under compute +- +$hidden +- +$nccl_hidden\$" "$work/prefetch$n.txt" ||
    { cat "$work/prefetch$n.txt"; fail "the prefetch hides $hidden s (mpi), $nccl_hidden s (nccl)"; }
  grep -Eq "^  owners' exchange under compute +- +$exchange +- +$nccl_exchange\$" "$work/prefetch$n.txt" ||
    { cat "$work/prefetch$n.txt"; fail "the owners' exchange hides $exchange s (mpi), $nccl_exchange s (nccl)"; }
  grep -Eq '^  host copies between ranks +1\.1' "$work/prefetch$n.txt" ||
    { cat "$work/prefetch$n.txt"; fail "the host copies (1 s of gathers and the exchange's) are not there"; }
done

# `train --transport nccl` moves every collective the model counts (the unit gathers, the owners' exchange, the
# parameter all-gather, the expert rows, context parallelism's gathers and chains) on NVLink, nothing over PCIe: tiny
# at 2x1 with CP 2, rank 0, each collective at the larger of its bytes sent and received on the node: 5,767,168 (unit
# gathers) + 3,145,728 (the owners' exchange, received) + 1,347,584 (positions) + 8,419,328 (chains) = 18,679,808,
# 0.018679808 s at 1 GB/s; tiny (dense, no CP) at 2x1 and tiny-moe with EP 2 have nothing on PCIe under nccl either.
"$BIN" config "${tiny[@]}" --layout 2x1 --cp 2 --time --rank 0 --rate nvlink_gbps=1 > "$work/nccl-cp.txt"
[ "$(line 'context parallelism: all-gather positions' "$work/nccl-cp.txt")" = 1347584 ] &&
  [ "$(line 'context parallelism: a gradient chain to the next rank' "$work/nccl-cp.txt")" = 8419328 ] ||
  { cat "$work/nccl-cp.txt"; fail "tiny CP 2's exchanges"; }
grep -Eq '^  NVLink +- +- +0\.0186798 +0\.0186798$' "$work/nccl-cp.txt" ||
  { cat "$work/nccl-cp.txt"; fail "under nccl tiny CP 2's NVLink is not 0.0186798 s"; }
"$BIN" config --config "$SRC/configs/tiny-moe.toml" "${data[@]}" --layout 2x1 --ep 2 --time --rank 0 > "$work/nccl-ep.txt"
for f in hand2 nccl-ep nccl-cp; do
  grep -Eq '^  PCIe staging \(page-locked\) +[0-9.e-]+ +[0-9.e-]+ +- +-$' "$work/$f.txt" ||
    { cat "$work/$f.txt"; fail "$f: under nccl something is staged through the host"; }
done

# 2. Against real runs. compare NAME NP CONFIG-ARGS... -- TRAIN-ARGS...
compare() {
  local name=$1 np=$2
  shift 2
  local conf=() extra=()
  while [ "$1" != -- ]; do conf+=("$1"); shift; done
  shift
  extra=("$@")
  local layout
  layout=$(python3 -c 'import sys; a = sys.argv[1:]; s = int(a[a.index("--dp-shard") + 1]) if "--dp-shard" in a else 1
r = int(a[a.index("--dp-replicate") + 1]) if "--dp-replicate" in a else 1; print(f"{s}x{r}")' "${extra[@]}")
  local ep=()
  [[ " ${extra[*]} " == *" --ep "* ]] && ep=(--ep "$(python3 -c 'import sys; a = sys.argv[1:]; print(a[a.index("--ep") + 1])' "${extra[@]}")")
  [[ " ${extra[*]} " == *" --cp "* ]] && ep+=(--cp "$(python3 -c 'import sys; a = sys.argv[1:]; print(a[a.index("--cp") + 1])' "${extra[@]}")")
  "${MPIRUN[@]}" -np "$np" "$BIN" train "${conf[@]}" --steps 2 --threads 1 --quiet --no-checkpoint --report-comm \
    --out "$work/$name" "${extra[@]}" > "$work/$name.log" 2>&1 || { cat "$work/$name.log"; fail "$name: the run failed"; }
  for ((r = 0; r < np; ++r)); do
    "$BIN" config "${conf[@]}" --layout "$layout" "${ep[@]}" --ranks-per-node "$np" --time --rank "$r" \
      > "$work/$name.$r.txt"
    python3 - "$work/$name.log" "$work/$name.$r.txt" "$r" "$name" <<'EOF' || fail "$name: rank $r"
import re, sys
log, table, rank, name = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
measured = {}
for m in re.finditer(r"^rank (\d+): sent (\d+) bytes in (\d+) steps: (.+)$", open(log).read(), re.M):
    if int(m.group(1)) == rank:
        measured[m.group(4)] = int(m.group(2)) / int(m.group(3))
predicted, estimates = {}, {}
for m in re.finditer(r"^  (.+?) +(\d+) bytes sent \((\d+) on node\), (\d+) received( \(estimate.*\))?$", open(table).read(), re.M):
    (estimates if m.group(5) else predicted)[m.group(1)] = int(m.group(2))
if not predicted:
    sys.exit(f"{name}: the model predicts no exact collective:\n" + open(table).read())
# A rank that never sends on a collective (the last rank of a CP group on the chains: it only receives) reports none.
bad = [f"{w}: predicted {b}, measured {measured.get(w)}" for w, b in predicted.items() if measured.get(w, 0) != b]
# Every collective that moves more than a few scalars a step is in the model.
bad += [f"{w}: measured {b:.0f} bytes a step, not in the model" for w, b in measured.items()
        if b > 4096 and w not in predicted and w not in estimates]
for w, b in estimates.items():
    print(f"{name} rank {rank}: {w}: estimated {b}, measured {measured.get(w, 0):.0f} (routing-dependent, reported)")
if bad:
    sys.exit(f"{name} rank {rank}:\n  " + "\n  ".join(bad))
print(f"{name} rank {rank}: " + ", ".join(f"{w} {b}" for w, b in sorted(predicted.items())))
EOF
  done
  # An estimate (the expert rows at balanced routing) is judged over all ranks, where one rank's excess is another's
  # shortfall: within 10 % of what the ranks sent (this data and seed: 0.5 %; the row's hidden-width parts alone are
  # 27 % of it).
  python3 - "$work/$name" "$np" <<'EOF' || fail "$name: the estimates"
import re, sys
base, np = sys.argv[1], int(sys.argv[2])
measured, estimated = {}, {}
for m in re.finditer(r"^rank \d+: sent (\d+) bytes in (\d+) steps: (.+)$", open(base + ".log").read(), re.M):
    measured[m.group(3)] = measured.get(m.group(3), 0) + int(m.group(1)) / int(m.group(2))
for r in range(np):
    for m in re.finditer(r"^  (.+?) +(\d+) bytes sent .* \(estimate.*\)$", open(f"{base}.{r}.txt").read(), re.M):
        estimated[m.group(1)] = estimated.get(m.group(1), 0) + int(m.group(2))
for w, e in estimated.items():
    got = measured.get(w, 0)
    print(f"{base.split('/')[-1]}: {w}: estimated {e}, measured {got:.0f} over the ranks")
    if abs(e - got) > 0.1 * got:
        sys.exit(f"{w}: estimated {e} bytes a step over the ranks, measured {got:.0f}")
EOF
}
compare 2x1 2 "${tiny[@]}" -- --dp-shard 2
compare 3x1 3 "${tiny[@]}" -- --dp-shard 3
compare 2x2 4 "${tiny[@]}" -- --dp-shard 2 --dp-replicate 2
compare 2x1-mb1 2 "${tiny[@]}" --set train.micro_batch_instances=1 -- --dp-shard 2
compare moe-ep2 2 --config "$SRC/configs/tiny-moe.toml" "${data[@]}" -- --dp-shard 2 --ep 2
compare cp2 2 "${tiny[@]}" -- --dp-shard 2 --cp 2
compare cp2-2x2 4 "${tiny[@]}" --set 'train.activation_checkpointing="full"' -- --dp-shard 2 --dp-replicate 2 --cp 2

flops() {  # flops NAME CONFIG-ARGS...: the profiled run's GEMM and attention FLOPs a step against the model's
  local name=$1
  shift
  "${RUN[@]}" "$BIN" train "$@" --steps 2 --threads 1 --quiet --no-checkpoint --profile-ops --out "$work/$name" \
    "${TRAIN[@]}" > "$work/$name.log" 2>&1 || { cat "$work/$name.log"; fail "$name: the profiled run failed"; }
  local measured
  measured=$(awk '/^op \(/{on=1; next} on && NF>=6 && $NF ~ /^[0-9]+$/ {if ($1 ~ /^attention/) a += $NF; else g += $NF}
    END {printf "%.0f %.0f", g / 2, a / 2}' "$work/$name.log")
  "$BIN" config "$@" --layout "$LAYOUT" --time --rank 0 > "$work/$name.txt"
  local predicted
  predicted="$(line 'GEMM (forward' "$work/$name.txt") $(line 'attention ' "$work/$name.txt")"
  [ "$measured" = "$predicted" ] || fail "$name: FLOPs counted $measured, predicted $predicted"
  echo "$name: GEMM and attention FLOPs a step $predicted"
}
RUN=() TRAIN=() LAYOUT=1x1
flops dense "${tiny[@]}"
flops dense-recompute "${tiny[@]}" --set 'train.activation_checkpointing="full"'
flops moe-recompute --config "$SRC/configs/tiny-moe.toml" "${data[@]}" --set 'train.activation_checkpointing="full"'
flops dense-selected "${tiny[@]}" --set 'train.activation_checkpointing="selected_blocks"' \
  --set train.activation_checkpointing_block_interval=2
# Rank 0 of a CP group (the profile is the lead's): the first quarter of every instance's queries and keys.
RUN=("${MPIRUN[@]}" -np 4) TRAIN=(--dp-shard 4) LAYOUT=4x1
flops cp4-rank0 "${tiny[@]}" --set 'train.activation_checkpointing="full"' --set train.cp_degree=4

# 3. A bench.json and bad input.
echo '[{"exact_seconds": 1, "exact_tflops": 10}, {"exact_seconds": 3, "exact_tflops": 30}, {"cublas_tflops": 50}]' \
  > "$work/bench.json"
"$BIN" config "${tiny[@]}" --layout 2x1 --time --bench "$work/bench.json" > "$work/bench.txt"
grep -q "exact GEMM 25.00 TFLOP/s measured: $work/bench.json" "$work/bench.txt" ||
  { cat "$work/bench.txt"; fail "bench.json: (10·1 + 30·3) / 4 = 25 TFLOP/s"; }
# bench/gpu_bench.sh's profile rows set the attention's rate: (2e12 + 6e12) FLOP over (1 + 3) s = 2 TFLOP/s, so
# tiny's 29,442,048 attention FLOPs take 1.4721e-05 s; the GEMM's stays the data sheet's where no gemm_bench row is.
echo '[{"bench": "profile", "config": "a", "attention_seconds": 1, "attention_flops": 2e12, "gemm_seconds": 9},
       {"bench": "profile", "config": "b", "attention_seconds": 3, "attention_flops": 6e12},
       {"bench": "train", "config": "a", "tokens_per_second": 5}]' > "$work/profile.json"
"$BIN" config "${tiny[@]}" --layout 1x1 --time --bench "$work/profile.json" > "$work/profile.txt"
grep -q "exact attention 2.00 TFLOP/s measured (--profile-ops of 2 config(s)): $work/profile.json" "$work/profile.txt" &&
  grep -Eq '^  attention +1.4721e-05 ' "$work/profile.txt" && ! grep -q "exact GEMM" "$work/profile.txt" ||
  { cat "$work/profile.txt"; fail "profile rows: attention at 2 TFLOP/s, GEMM at the data sheet's"; }
# bench/attention_bench's rows at the model's own attention shapes win over the profile's: tiny (T 64, H 4, KV 2,
# hd 16) has 3 layers of window 16 and one full-causal; per layer (1e12 + 2e12) FLOP in (1 + 1) s and (2e12 + 4e12) in
# (1 + 2) s, weighed 3:1: 15e12 / 9 s = 1.67 TFLOP/s, so tiny's 29,442,048 attention FLOPs take 1.76652e-05 s. A row
# at another shape counts for nothing; without the full-causal row the profile's rate stands.
window_row='{"bench": "attention", "config": "tiny", "T": 64, "H": 4, "KV": 2, "hd": 16, "window": 16,
  "forward_flops": 1e12, "backward_flops": 2e12, "forward_seconds": 1, "backward_seconds": 1}'
full_row='{"bench": "attention", "config": "tiny", "T": 64, "H": 4, "KV": 2, "hd": 16, "window": 0,
  "forward_flops": 2e12, "backward_flops": 4e12, "forward_seconds": 1, "backward_seconds": 2}'
other_row='{"bench": "attention", "config": "big", "T": 2048, "H": 4, "KV": 2, "hd": 16, "window": 0,
  "forward_flops": 1e15, "backward_flops": 1e15, "forward_seconds": 1, "backward_seconds": 1}'
profile_row='{"bench": "profile", "config": "a", "attention_seconds": 1, "attention_flops": 2e12}'
echo "[$window_row, $full_row, $other_row, $profile_row]" > "$work/attention.json"
"$BIN" config "${tiny[@]}" --layout 1x1 --time --bench "$work/attention.json" > "$work/attention.txt"
grep -q "exact attention 1.67 TFLOP/s measured (attention_bench at this model's shapes, 2 window(s)" \
  "$work/attention.txt" && grep -Eq '^  attention +1.76652e-05 ' "$work/attention.txt" ||
  { cat "$work/attention.txt"; fail "attention_bench rows: 15e12 FLOP over 9 s weighed by tiny's layers"; }
echo "[$window_row, $other_row, $profile_row]" > "$work/attention-partial.json"
"$BIN" config "${tiny[@]}" --layout 1x1 --time --bench "$work/attention-partial.json" > "$work/attention-partial.txt"
grep -q "exact attention 2.00 TFLOP/s measured (--profile-ops of 1 config(s))" "$work/attention-partial.txt" ||
  { cat "$work/attention-partial.txt"; fail "without a row for every window the profile's attention rate stands"; }
refused() {  # refused WHAT-THE-MESSAGE-SAYS ARGS...
  local want=$1
  shift
  if "$BIN" config "${tiny[@]}" "$@" > "$work/refused.log" 2>&1; then fail "accepted: $*"; fi
  grep -q -- "$want" "$work/refused.log" || { cat "$work/refused.log"; fail "refused without '$want': $*"; }
}
refused "add --layout" --time
refused "add --time" --layout 2x1 --rate gemm_tflops=1
refused "KEY one of" --layout 2x1 --time --rate gemm=1
refused "not a number" --layout 2x1 --time --rate gemm_tflops=fast
refused "must be positive" --layout 2x1 --time --rate pcie_gbps=0
refused "cannot read" --layout 2x1 --time --bench "$work/none.json"
refused "ranks 0..1" --layout 2x1 --time --rank 2
echo '{"rows": []}' > "$work/empty.json"
refused "no gemm_bench rows (objects with exact_seconds and exact_tflops), no attention_bench rows" --layout 2x1 --time \
  --bench "$work/empty.json"
echo "OK"
