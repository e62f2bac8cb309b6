#!/usr/bin/env bash
# The memory model (train/memory_model.h, `olmoref config --layout`) against what a run takes: a small dense model
# at 1x1 and 2x1 (mpirun), with and without activation recompute, at 1x1 recomputing every other block
# (selected_blocks, block_interval 2: between the two), and at 2x1 with context parallelism 2 (each rank
# half of every instance's rows, plus one layer's whole-instance attention tensors); every rank's peak resident memory
# (VmHWM, `train --report-memory`) must be within 15 % of the fullest rank's prediction, recompute and context
# parallelism must each lower both, and a run that cannot fit is refused before anything is written, naming its
# largest part and what would fit.
source "${OLMOREF_SOURCE_ROOT:?}/tests/common/shell_test.sh"
source "$SRC/tests/dist/mpi_env.sh"
# meson test sets MALLOC_PERTURB_, and glibc then fills every allocation, touching pages a run never touches (a
# growing string's spare capacity, a vector's tail): what is measured here is the run's own resident memory.
unset MALLOC_PERTURB_
python3 "$SRC/tests/make_tokens.py" "$work/tokens.u16" 5 40000
# 16 M parameters: the state, the tree's slots, the activations (12 blocks of 512 rows) and the logits all count.
shape=(--config "$SRC/configs/tiny.toml" --set "data.train_files=[\"$work/tokens.u16\"]" --set model.vocab_size=8192
       --set model.d_model=256 --set model.n_layers=12 --set model.n_heads=4 --set model.n_kv_heads=2
       --set model.ffn_hidden=1024 --set train.seq_len=256 --set train.micro_batch_instances=2
       --set train.global_batch_instances=4)
summary=""
for ac in none full sel2; do
  mode=(--set "train.activation_checkpointing=\"$ac\"")
  [ $ac = sel2 ] && mode=(--set 'train.activation_checkpointing="selected_blocks"'
                          --set train.activation_checkpointing_block_interval=2)
  for layout in 1x1 2x1 2x1cp2; do
    s=${layout%x*} cp=1
    [ "$layout" = 2x1cp2 ] && cp=2
    [ "$layout" = 2x1cp2 ] && [ $ac != none ] && continue  # recompute's own point is made above; CP's at none
    [ "$layout" != 1x1 ] && [ $ac = sel2 ] && continue      # its point needs one layout; the layouts' are made above
    predicted=$("$BIN" config "${shape[@]}" "${mode[@]}" --layout "${layout%cp2}" \
                --cp $cp | sed -n 's/.*peak .*(\([0-9]*\) bytes).*/\1/p')
    [ -n "$predicted" ] || { echo "FAIL: config --layout printed no peak"; exit 1; }
    "${MPIRUN[@]}" -np "$s" "$BIN" train "${shape[@]}" "${mode[@]}" \
      --steps 1 --threads 1 --quiet --dp-shard "$s" --cp $cp --report-memory --out "$work/$ac-$layout" \
      2> "$work/$ac-$layout.log" || { cat "$work/$ac-$layout.log"; echo "FAIL: $ac $layout"; exit 1; }
    measured=$(sed -n 's/^memory: rank [0-9]* peak resident (VmHWM) \([0-9]*\) bytes.*/\1/p' "$work/$ac-$layout.log" | sort -n | tail -1)
    [ -n "$measured" ] || { cat "$work/$ac-$layout.log"; echo "FAIL: no memory report"; exit 1; }
    python3 - "$ac" "$layout" "$measured" "$predicted" <<'PY'
import sys
ac, layout, measured, predicted = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
ratio = measured / predicted
print(f"recompute {ac:4s} {layout}: measured {measured / 2**20:7.1f} MiB, predicted {predicted / 2**20:7.1f} MiB ({ratio:.3f})")
sys.exit(0 if abs(ratio - 1) <= 0.15 else 1)
PY
    summary+="$ac $layout $measured $predicted"$'\n'
  done
done
# Recompute lowers the peak (measured and predicted), at both layouts.
python3 - <<PY
rows = [l.split() for l in """$summary""".strip().splitlines()]
by = {(r[0], r[1]): (int(r[2]), int(r[3])) for r in rows}
for layout in ("1x1", "2x1"):
    for i, what in enumerate(("measured", "predicted")):
        assert by[("full", layout)][i] < by[("none", layout)][i], (layout, what, by)
print("recompute lowers the peak at 1x1 and 2x1, measured and predicted")
for i, what in enumerate(("measured", "predicted")):
    assert by[("full", "1x1")][i] < by[("sel2", "1x1")][i] < by[("none", "1x1")][i], ("selected_blocks", what, by)
print("recomputing every other block (selected_blocks, block_interval 2): between full and none, measured and predicted")
for i, what in enumerate(("measured", "predicted")):
    assert by[("none", "2x1cp2")][i] < by[("none", "2x1")][i], ("cp", what, by)
print("context parallelism 2 lowers the peak at 2x1, measured and predicted")
PY
# A run that cannot fit: refused before its directory is written, naming the largest part and the fixes it tried.
set +e
"$BIN" train "${shape[@]}" --set model.vocab_size=2000000000 --steps 1 --out "$work/huge" > "$work/huge.log" 2>&1
rc=$?
set -e
[ $rc -ne 0 ] && grep -q "needs about" "$work/huge.log" && grep -q "the largest part is the" "$work/huge.log" &&
  grep -q "olmoref config --config FILE --layout 1x1" "$work/huge.log" && [ ! -e "$work/huge/trace.jsonl" ] ||
  { cat "$work/huge.log"; echo "FAIL: the refusal"; exit 1; }
echo "refusal: $(grep -o 'the largest part is the [a-z ]*' "$work/huge.log")"
