#!/usr/bin/env bash
# `ckpt verify` and `export-hf` at a scale this machine cannot train: a checkpoint of CONFIG's model (default
# olmo3-1b, 1.48 B parameters, 17.8 GB of fp32 state) written by bench_ckpt_synthetic without holding the state, then
# each tool's wall time and peak resident memory, and the damage the test suite plants (a flipped byte in a frame, a
# truncated shard, an edited manifest) refused with the file named. Needs about 2.2 x the state's size on disk.
#   bash bench/ckpt_verify.sh [CONFIG] [OUT]
set -euo pipefail
cd "$(dirname "$0")/.."
config="${1:-configs/olmo3-1b.toml}"
out="${2:-/tmp/olmoref-ckpt-verify}"
bin=build/olmoref
rm -rf "$out" && mkdir -p "$out"
trap 'rm -rf "$out"' EXIT
measure() {  # LABEL CMD...: wall seconds, peak resident memory, exit status
  python3 - "$@" <<'PY'
import resource, subprocess, sys, time
label, cmd = sys.argv[1], sys.argv[2:]
t = time.monotonic()
r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
s = time.monotonic() - t
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
last = (r.stdout.strip().splitlines() or [""])[-1][:200]
print(f"| {label} | {s:.1f} | {peak:.1f} | {r.returncode} | {last} |")
PY
}
echo "machine: $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p'), $(date -u +%F)"
build/bench/bench_ckpt_synthetic "$config" "$out/ckpt" 3 "$(nproc)"
ckpt="$out/ckpt/step00000000"
du -sh "$ckpt"
echo "| what | seconds | peak MiB | exit | last line |"
echo "|---|---|---|---|---|"
measure "ckpt verify (intact)" "$bin" ckpt verify "$ckpt"
measure "export-hf" "$bin" export-hf --checkpoint "$ckpt" --out "$out/hf"
rm -rf "$out/hf"
shard="$ckpt/$(cd "$ckpt" && ls shard-*)"  # the one shard file
size=$(stat -c %s "$shard")
# A flipped byte half-way through the frames.
python3 -c "
import sys
with open('$shard', 'r+b') as f:
    f.seek($size // 2); b = f.read(1); f.seek($size // 2); f.write(bytes([b[0] ^ 0x40]))"
measure "ckpt verify (a flipped byte at the middle)" "$bin" ckpt verify "$ckpt"
python3 -c "
with open('$shard', 'r+b') as f:
    f.seek($size // 2); b = f.read(1); f.seek($size // 2); f.write(bytes([b[0] ^ 0x40]))"
truncate -s $((size - 1)) "$shard"
measure "ckpt verify (the shard one byte short)" "$bin" ckpt verify "$ckpt"
truncate -s "$size" "$shard"  # the byte is now zero, not the trailer's last magic byte
measure "ckpt verify (the last byte zeroed)" "$bin" ckpt verify "$ckpt"
python3 -c "
import json
p = '$ckpt/manifest.json'; m = json.load(open(p)); m['step'] = 1; open(p, 'w').write(json.dumps(m, indent=2))"
measure "ckpt verify (the manifest's step edited)" "$bin" ckpt verify "$ckpt"
