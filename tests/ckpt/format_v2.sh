#!/usr/bin/env bash
# Checkpoints written before format 3 still resume and verify. tests/ckpt/format-v2/ was written by olmoref at
# commit 1f02998 (format 2: each shard's header first, whole tensors as entries) at layout 2x1 with
#   make_tokens.py tokens.u16 7 20000; mpirun -np 2 olmoref train (the shape below) --steps 4 --dp-shard 2
# keeping its step-2 checkpoint (two shard files) and the run's trace. Here, resumed from it at 1x1, 2x1, 4x1 and
# 2x2 (ranged reads of another layout's shards, empty ranges, the optimizer range split), each resumed run's steps 3
# and 4 must be the uninterrupted trace's, bit for bit; `ckpt verify` passes on it and refuses it with a flipped
# byte, naming the shard; and the resumed run's own checkpoint is format 3.
source "${OLMOREF_SOURCE_ROOT:?}/tests/common/shell_test.sh"
source "$SRC/tests/dist/mpi_env.sh"
fixture="$SRC/tests/ckpt/format-v2"
mkdir -p "$work/data"
python3 "$SRC/tests/make_tokens.py" "$work/data/tokens.u16" 7 20000
shape=(--config "$SRC/configs/tiny.toml" --set "data.train_files=[\"$work/data/tokens.u16\"]" --set model.d_model=52
       --set model.n_heads=2 --set model.n_kv_heads=1 --set model.ffn_hidden=52 --set model.n_layers=1
       --set "model.swa_pattern=[-1]" --set train.seq_len=32 --set checkpoint.interval=2 --set checkpoint.zstd_level=19)
"$BIN" ckpt verify "$fixture/step00000002" > "$work/verify.log" || { cat "$work/verify.log"; echo "FAIL: verify"; exit 1; }
"$BIN" ckpt inspect "$fixture/step00000002" | grep -q "olmoref-checkpoint v2" || { echo "FAIL: not format 2"; exit 1; }
for layout in 1x1 2x1 4x1 2x2; do
  s=${layout%x*} r=${layout#*x}
  out="$work/run-$layout"
  mkdir -p "$out/checkpoints"
  cp -r "$fixture/step00000002" "$out/checkpoints/"
  "${MPIRUN[@]}" -np $((s * r)) "$BIN" train "${shape[@]}" --steps 4 --threads 1 --quiet --dp-shard "$s" \
    --dp-replicate "$r" --resume --new-records --out "$out" 2> "$out.log" || { cat "$out.log"; echo "FAIL: resume at $layout"; exit 1; }
  python3 - "$fixture/trace.jsonl" "$out/trace.jsonl" "$layout" <<'PY'
import json, sys
want = [json.loads(l) for l in open(sys.argv[1])][2:4]
got = [json.loads(l) for l in open(sys.argv[2])]
for g in got:
    g.pop("records_begin", None)
    g.pop("record_xxh3", None)  # the fixture's format-2 run wrote no record checksums
if got != want:
    for w, g in zip(want, got):
        for k in w:
            if w.get(k) != g.get(k):
                print(f"step {w['step']}: {k}: uninterrupted {w.get(k)!r}, resumed {g.get(k)!r}")
    sys.exit(f"FAIL: resumed from the format-2 checkpoint at {sys.argv[3]}, steps 3-4 differ")
print(f"format 2 resumed at {sys.argv[3]}: steps 3-4 identical")
PY
done
"$BIN" ckpt inspect "$work/run-2x2/checkpoints/step00000004" | grep -q "olmoref-checkpoint v3" ||
  { echo "FAIL: the resumed run did not write format 3"; exit 1; }
"$BIN" ckpt verify "$work/run-2x2/checkpoints/step00000004" > /dev/null
cp -r "$fixture/step00000002" "$work/damaged"
python3 - "$work/damaged/shard-00001.bin" <<'PY'
import sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read())
b[-100] ^= 0x40  # inside the last tensor's frame (format 2 keeps the header in front)
open(p, "wb").write(b)
PY
if "$BIN" ckpt verify "$work/damaged" > "$work/damaged.log" 2>&1; then echo "FAIL: a flipped byte verified"; exit 1; fi
grep -q "shard-00001.bin" "$work/damaged.log" || { cat "$work/damaged.log"; echo "FAIL: the shard is not named"; exit 1; }
echo "format 2: verified, resumed at 4 layouts, damage named: $(head -c 160 "$work/damaged.log")"
