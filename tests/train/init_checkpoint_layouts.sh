#!/usr/bin/env bash
# meson test train-init-checkpoint-layouts: a stage-2 run (init.checkpoint) gives the same trace whatever layout wrote
# the checkpoint it starts from and whatever layout it runs at: stage 1 at 1x1 and at 2x1 (identical checkpoints'
# states), stage 2 from each at 1x1, 2x1 and 1x2, all traces byte-identical; the source's manifest checksum differs
# with the layout that wrote it (the manifest records the layout), the state and the trace do not. The same for a
# mixture of experts under expert parallelism.
source "${OLMOREF_SOURCE_ROOT:?}/tests/common/shell_test.sh"
source "$SRC/tests/dist/mpi_env.sh"
python3 "$SRC/tests/make_tokens.py" "$work/a.u16" 9 120000 > /dev/null
python3 "$SRC/tests/make_tokens.py" "$work/b.u16" 10 120000 > /dev/null
cfg=(--config "$SRC/configs/tiny.toml" --quiet)
stage1=(--set "data.train_files=[\"$work/a.u16\"]" --set 'optim.kind="skip_step_adamw"' --steps 5)
stage2=(--set "data.train_files=[\"$work/b.u16\"]" --set 'optim.kind="skip_step_adamw"' --set train.global_batch_instances=6
        --set schedule.kind=\"linear_with_warmup\" --set schedule.warmup=1 --set schedule.alpha_f=0.0 --steps 4)
run() {  # run NAME SxR ARGS...: olmoref train at that layout (mpirun for more than one rank)
  local name=$1 s=${2%x*} r=${2#*x}
  shift 2
  if [ "$s$r" = 11 ]; then
    "$BIN" train "${cfg[@]}" "$@" --threads 2 --out "$work/$name" 2> "$work/$name.log" || { cat "$work/$name.log"; exit 1; }
  else
    "${MPIRUN[@]}" -np $((s * r)) "$BIN" train "${cfg[@]}" "$@" --threads 1 --dp-shard "$s" --dp-replicate "$r" \
      --comm-timeout 60 --out "$work/$name" 2> "$work/$name.log" || { echo "$name failed"; cat "$work/$name.log"; exit 1; }
  fi
}
run s1-1x1 1x1 "${stage1[@]}"
run s1-2x1 2x1 "${stage1[@]}"
cmp "$work/s1-1x1/trace.jsonl" "$work/s1-2x1/trace.jsonl"
python3 - "$work/s1-1x1/checkpoints/step00000005/manifest.json" "$work/s1-2x1/checkpoints/step00000005/manifest.json" <<'PY'
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:])
for k in ("state_digests", "model_hash", "resume_hash"):
    assert a[k] == b[k], f"FAIL: stage 1 at 1x1 and 2x1 wrote different {k}: {a[k]} vs {b[k]}"
# The manifest records the layout, so its checksum must tell the two sources apart.
assert a["data_layout"] != b["data_layout"], "FAIL: the 1x1 and 2x1 manifests record the same layout"
assert a["manifest_xxh3"] != b["manifest_xxh3"], f"FAIL: the 1x1 and 2x1 manifests have the same checksum {a['manifest_xxh3']}"
PY
for src in 1x1 2x1; do
  for layout in 1x1 2x1 1x2; do
    run "s2-from$src-at$layout" "$layout" "${stage2[@]}" \
      --set "init.checkpoint=\"$work/s1-$src/checkpoints/step00000005\""
    # The first run is the reference the other five are compared with.
    [ "$src-$layout" != 1x1-1x1 ] || continue
    cmp "$work/s2-from1x1-at1x1/trace.jsonl" "$work/s2-from$src-at$layout/trace.jsonl" ||
      { echo "FAIL: stage 2 from a $src checkpoint at $layout differs from 1x1 from 1x1"; exit 1; }
    echo "stage 2 from the $src checkpoint at $layout: trace identical"
  done
done
# Under expert parallelism: a mixture of experts written at 2x1 with EP 2, stage 2 single-process and at 1x2 with EP 2
# (each rank reads only the experts it runs).
moe=(--config "$SRC/configs/tiny-moe.toml" --quiet)
"${MPIRUN[@]}" -np 2 "$BIN" train "${moe[@]}" --set "data.train_files=[\"$work/a.u16\"]" --steps 3 --threads 1 \
  --dp-shard 2 --dp-replicate 1 --ep 2 --comm-timeout 60 --out "$work/m1" 2> "$work/m1.log" || { cat "$work/m1.log"; exit 1; }
m2=(--set "data.train_files=[\"$work/b.u16\"]" --set "init.checkpoint=\"$work/m1/checkpoints/step00000003\"" --steps 3)
"$BIN" train "${moe[@]}" "${m2[@]}" --threads 2 --out "$work/m2-1x1" 2> "$work/m2-1x1.log" || { cat "$work/m2-1x1.log"; exit 1; }
"${MPIRUN[@]}" -np 2 "$BIN" train "${moe[@]}" "${m2[@]}" --threads 1 --dp-shard 1 --dp-replicate 2 --ep 2 --comm-timeout 60 \
  --out "$work/m2-1x2-ep2" 2> "$work/m2-1x2-ep2.log" || { cat "$work/m2-1x2-ep2.log"; exit 1; }
cmp "$work/m2-1x1/trace.jsonl" "$work/m2-1x2-ep2/trace.jsonl" ||
  { echo "FAIL: MoE stage 2 at 1x2 EP 2 differs from 1x1 (source written at 2x1 EP 2)"; exit 1; }
echo "MoE stage 2 from a 2x1 EP-2 checkpoint at 1x1 and 1x2 EP 2: trace identical"
# Stage 2 is not stage 1 continued: its steps count from 1 and its losses are not those of a run from the init.
run s2-noinit 1x1 "${stage2[@]}"
python3 - "$work" <<'PY'
import json, sys
s2 = [json.loads(l) for l in open(f"{sys.argv[1]}/s2-from2x1-at1x2/trace.jsonl")]
fresh = [json.loads(l) for l in open(f"{sys.argv[1]}/s2-noinit/trace.jsonl")]
assert [r["step"] for r in s2] == [1, 2, 3, 4], [r["step"] for r in s2]
assert len(fresh) == len(s2), f"FAIL: the run from the init has {len(fresh)} steps, stage 2 {len(s2)}"
same = [r["step"] for r, f in zip(s2, fresh) if r["loss_hex"] == f["loss_hex"]]
assert not same, f"FAIL: stage 2 from the checkpoint has the losses of a run from the init at steps {same}"
PY
echo "OK"
