#!/usr/bin/env bash
# Checkpoint I/O per rank, before and after checkpoint format 3, next to torch.distributed.checkpoint on the same
# state. configs/olmo3-100m.toml at seq 256, 8 instances, micro-batch 1, one thread per rank, under mpirun, at each
# layout of LAYOUTS (dp_shard x dp_replicate); each rank's process measured by bench/proc_stats.py:
#   A  one step, no checkpoint                         (the step alone)
#   B  one step and its checkpoint                     write seconds = B - A, bytes written = wchar(B) - wchar(A)
#   C  a fresh process resuming it (--stop-after 1: no step)   resume seconds, bytes read (rchar), peak resident
# Then bench/ckpt_dcp_peer.py saves and loads three vectors of as many floats with torch DCP at W = 1, 2, 4.
#   bash bench/ckpt_io.sh [BEFORE_BIN] [AFTER_BIN]     (results in $OUT, default /tmp/olmoref-ckpt-io)
# BEFORE_BIN: an olmoref built from an older commit (git worktree add /work/before 1f02998; meson setup build
# --buildtype=release -Dcuda=disabled; ninja -C build olmoref). The seconds are wall times on whatever else the
# machine is doing; the bytes and the memory are the figures to trust.
set -euo pipefail
cd "$(dirname "$0")/.."
before="${1:-/work/before/build/olmoref}"
after="${2:-build/olmoref}"
out="${OUT:-/tmp/olmoref-ckpt-io}"
layouts=(${LAYOUTS:-1x1 2x1 4x1 2x2})
source tests/dist/mpi_env.sh
rm -rf "$out" && mkdir -p "$out"
python3 tests/make_tokens.py "$out/tokens.u16" 5 40000
python3 -c "
import array
a = array.array('H'); a.frombytes(open('$out/tokens.u16', 'rb').read())
open('$out/tokens.u32', 'wb').write(array.array('I', a).tobytes())"
shape=(--config configs/olmo3-100m.toml --set "data.train_files=[\"$out/tokens.u32\"]" --set train.seq_len=256
       --set train.micro_batch_instances=1 --set train.global_batch_instances=8)
echo "machine: $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p'); $(date -u '+%F %H:%M') UTC"
for which in before after; do
  bin="$before"; [ "$which" = after ] && bin="$after"
  for layout in "${layouts[@]}"; do
    s=${layout%x*} r=${layout#*x}
    run=("${MPIRUN[@]}" -np $((s * r)) python3 bench/proc_stats.py)
    args=(train "${shape[@]}" --steps 2 --stop-after 1 --threads 1 --quiet --dp-shard "$s" --dp-replicate "$r")
    d="$out/$which-$layout"
    mkdir -p "$d"
    "${run[@]}" "$d/A-%r.json" -- "$bin" "${args[@]}" --no-checkpoint --out "$d/A"
    "${run[@]}" "$d/B-%r.json" -- "$bin" "${args[@]}" --out "$d/B"
    "${run[@]}" "$d/C-%r.json" -- "$bin" "${args[@]}" --resume --out "$d/B"
    du -sb "$d/B/checkpoints/step00000001" | cut -f1 > "$d/bytes"
    [ "$which" = after ] && "$bin" config "${shape[@]}" --layout "$layout" --threads 1 > "$d/predicted.txt"
    echo "$which $layout done"
  done
done
total=$(python3 -c "import json; print(json.load(open('$out/after-${layouts[0]}/B/checkpoints/step00000001/manifest.json'))['total_params'])")
venv_py="$HOME/.cache/olmoref/venv/bin/python"
for w in 1 2 4; do
  "$venv_py" bench/ckpt_dcp_peer.py --world "$w" --floats "$total" --dir "$out/dcp-$w/ckpt" --out "$out/dcp-$w.json"
done
python3 - "$out" "${layouts[@]}" <<'PY'
import glob, json, os, re, sys
out, layouts = sys.argv[1], sys.argv[2:]
MiB = 2 ** 20
def ranks(d, phase):
    return [json.load(open(p)) for p in sorted(glob.glob(f"{d}/{phase}-*.json"))]
print("\n| binary | layout | write s (B - A) | written MiB per rank (max) | resume s (C) | read MiB per rank (max) | "
      "peak MiB, step + write (B) [/ predicted] | peak MiB, resume (C) [/ predicted] | checkpoint MiB |")
print("|---|---|---|---|---|---|---|---|---|")
for which in ("before", "after"):
    for layout in layouts:
        d = f"{out}/{which}-{layout}"
        A, B, C = ranks(d, "A"), ranks(d, "B"), ranks(d, "C")
        w = max(b["wchar"] - a["wchar"] for a, b in zip(A, B))
        pb = pc = ""
        if os.path.exists(d + "/predicted.txt"):  # the memory model's host table, --threads 1
            step, write, resume = (int(x) for x in re.search(r"\(bytes: step (\d+), write (\d+), resume (\d+)\)",
                                                             open(d + "/predicted.txt").read()).groups())
            pb = f" / {max(step, write) / MiB:.0f} ({max(b['peak_resident'] for b in B) / max(step, write):.3f})"
            pc = f" / {resume / MiB:.0f} ({max(c['peak_resident'] for c in C) / resume:.3f})"
        print(f"| {which} | {layout} | {max(b['seconds'] for b in B) - max(a['seconds'] for a in A):.1f} | {w / MiB:.1f} "
              f"| {max(c['seconds'] for c in C):.1f} | {max(c['rchar'] for c in C) / MiB:.1f} "
              f"| {max(b['peak_resident'] for b in B) / MiB:.0f}{pb} | {max(c['peak_resident'] for c in C) / MiB:.0f}{pc} "
              f"| {int(open(d + '/bytes').read()) / MiB:.0f} |")
print("\n| torch DCP | W | save s | written MiB per rank (max) | load s | read MiB per rank (max) | "
      "save peak MiB (above its baseline) | load peak MiB (above its baseline) | on disk MiB |")
print("|---|---|---|---|---|---|---|---|---|")
for w in (1, 2, 4):
    r = json.load(open(f"{out}/dcp-{w}.json"))
    s, l = r["save"], r["load"]
    print(f"| {r['torch']} | {w} | {max(x['seconds'] for x in s):.1f} | {max(x['wchar'] for x in s) / MiB:.1f} "
          f"| {max(x['seconds'] for x in l):.1f} | {max(x['rchar'] for x in l) / MiB:.1f} "
          f"| {max(x['peak_resident'] for x in s) / MiB:.0f} ({max(x['peak_resident'] - x['resident_before'] for x in s) / MiB:.0f}) "
          f"| {max(x['peak_resident'] for x in l) / MiB:.0f} ({max(x['peak_resident'] - x['resident_before'] for x in l) / MiB:.0f}) "
          f"| {r['bytes_on_disk'] / MiB:.0f} |")
PY
