#!/usr/bin/env bash
# Checkpoint I/O and host memory that shrink with the ranks, measured against the memory model (docs/memory.md,
# "Host memory"). A 36 M-parameter dense model whose state outweighs its activations (vocabulary 4096, d 512, 8
# blocks, FFN 2048, seq 32, 4 instances in micro-batches of 1), one thread per rank, at 1x1, 2x1, 4x1 and 2x2: each rank's peak
# of a step that writes a checkpoint, of the write alone (a fresh VmHWM around it) and of a resume in a fresh process
# (`train --report-memory`) within 15 % of `olmoref config --layout`'s host table; each resuming rank reads (rchar) at
# most 1.1 x the frames overlapping what it keeps, the shard headers and the manifest, also when the checkpoint was
# written at another layout (1x1, resumed at 4x1); the resume peak per rank at 4x1 at most 0.4 x 1x1's. The resumed
# runs' traces are the uninterrupted ones. `ckpt verify` and `export-hf` of the 1x1 checkpoint peak below 96 MiB (the
# state is 0.4 GiB). A node whose ranks would not fit its MemAvailable is refused up front.
source "${OLMOREF_SOURCE_ROOT:?}/tests/common/shell_test.sh"
source "$SRC/tests/dist/mpi_env.sh"
# meson test sets MALLOC_PERTURB_, and glibc then fills every allocation (tests/train/memory.sh says why it matters).
unset MALLOC_PERTURB_
python3 "$SRC/tests/make_tokens.py" "$work/tokens.u16" 11 20000
shape=(--config "$SRC/configs/tiny.toml" --set "data.train_files=[\"$work/tokens.u16\"]" --set model.vocab_size=4096
       --set model.d_model=512 --set model.n_layers=8 --set model.n_heads=8 --set model.n_kv_heads=4
       --set model.ffn_hidden=2048 --set train.seq_len=32 --set train.micro_batch_instances=1
       --set train.global_batch_instances=4)
layouts=(1x1 2x1 4x1 2x2)
for layout in "${layouts[@]}"; do
  s=${layout%x*} r=${layout#*x}
  "$BIN" config "${shape[@]}" --layout "$layout" --threads 1 > "$work/pred-$layout.txt"
  run=("${MPIRUN[@]}" -np $((s * r)) "$BIN" train "${shape[@]}" --steps 2 --threads 1 --quiet --dp-shard "$s"
       --dp-replicate "$r" --report-memory --out "$work/run-$layout")
  "${run[@]}" --stop-after 1 2> "$work/first-$layout.log" || { cat "$work/first-$layout.log"; echo "FAIL: $layout"; exit 1; }
  # The resumed runs write no checkpoint of their own (0.5 GB each): only step 1's are read and measured.
  "${run[@]}" --resume --no-checkpoint 2> "$work/resume-$layout.log" ||
    { cat "$work/resume-$layout.log"; echo "FAIL: resume $layout"; exit 1; }
done
# The 1x1 checkpoint resumed at 4x1: reads cut across another layout's frames.
mkdir -p "$work/run-4x1-from-1x1/checkpoints"
cp -r "$work/run-1x1/checkpoints/step00000001" "$work/run-4x1-from-1x1/checkpoints/"
"${MPIRUN[@]}" -np 4 "$BIN" train "${shape[@]}" --steps 2 --threads 1 --quiet --dp-shard 4 --report-memory --resume \
  --no-checkpoint --new-records --out "$work/run-4x1-from-1x1" 2> "$work/resume-4x1-from-1x1.log" ||
  { cat "$work/resume-4x1-from-1x1.log"; echo "FAIL: 1x1's checkpoint at 4x1"; exit 1; }
for layout in 2x1 4x1 2x2; do cmp "$work/run-1x1/trace.jsonl" "$work/run-$layout/trace.jsonl"; done
tail -1 "$work/run-1x1/trace.jsonl" | python3 -c "
import json, sys
want = json.loads(sys.stdin.read()); got = json.loads(open('$work/run-4x1-from-1x1/trace.jsonl').read().splitlines()[-1])
got.pop('records_begin', None)
# The record's checksum covers records_begin: compared are the fields.
got.pop('record_xxh3', None), want.pop('record_xxh3', None)
sys.exit(0 if got == want else 'FAIL: step 2 resumed at 4x1 from the 1x1 checkpoint differs')"
python3 "$SRC/tests/ckpt/io_memory.py" "$work" "${layouts[@]}"
# The single-process tools stream: `ckpt verify` (every frame, the whole-state digests) and `export-hf` (tensor by
# tensor into model.safetensors) peak far below the state they read (0.4 GiB here; 12n bytes once held whole).
peak() {  # peak resident memory of a command, bytes
  python3 -c 'import resource, subprocess, sys
subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)' "$@"
}
ckpt1="$work/run-1x1/checkpoints/step00000001"
verify_peak=$(peak "$BIN" ckpt verify "$ckpt1")
export_peak=$(peak "$BIN" export-hf --checkpoint "$ckpt1" --out "$work/hf")
state=$(python3 -c "import json; print(12 * json.load(open('$ckpt1/manifest.json'))['total_params'])")
python3 - "$verify_peak" "$export_peak" "$state" <<'PY'
import sys
verify, export, state = (int(x) for x in sys.argv[1:])
for what, peak in (("ckpt verify", verify), ("export-hf", export)):
    print(f"{what}: peak {peak / 2**20:.1f} MiB for a state of {state / 2**20:.1f} MiB ({peak / state:.3f})")
    assert peak < 96 << 20, f"FAIL: {what} peaked at {peak / 2**20:.1f} MiB, above 96 MiB"
PY
# A node whose ranks cannot all hold their host memory: refused before the run directory is written, naming the
# phase, the largest part and how many ranks fit (the launcher's count of ranks on the node, here claimed 100000).
set +e
OMPI_COMM_WORLD_LOCAL_SIZE=100000 "$BIN" train "${shape[@]}" --steps 1 --threads 1 --out "$work/crowded" > "$work/crowded.log" 2>&1
rc=$?
set -e
[ $rc -ne 0 ] && grep -q "of host memory on this node at its" "$work/crowded.log" &&
  grep -q "the largest part is the" "$work/crowded.log" && grep -q "rank(s) of this run fit on this node" "$work/crowded.log" &&
  grep -q -- "--ranks-per-node 100000" "$work/crowded.log" && [ ! -e "$work/crowded" ] ||
  { cat "$work/crowded.log"; echo "FAIL: a crowded node was not refused as it should be"; exit 1; }
echo "crowded node: $(grep -o 'needs about .* is available' "$work/crowded.log")"
