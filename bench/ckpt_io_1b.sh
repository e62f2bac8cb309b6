#!/usr/bin/env bash
# The resume of an olmo3-1b checkpoint (1.48 B parameters, 17.8 GB of state) at 1x1 and 2x1, per rank: seconds, bytes
# read, peak resident memory against the memory model. A 1B step does not fit this kind of machine (the model: 45 GiB
# at 1x1, 27.6 GiB per rank at 2x1), so the checkpoint is bench_ckpt_synthetic's (the init and made-up moments, the
# loader at its start) and the resume runs no step (--stop-after 0). Needs about 17 GB of disk and 20 GiB of memory.
#   bash bench/ckpt_io_1b.sh [OUT]
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-/tmp/olmoref-ckpt-io-1b}"
source tests/dist/mpi_env.sh
rm -rf "$out" && mkdir -p "$out"
trap 'rm -rf "$out/ckpt"' EXIT
python3 tests/make_tokens.py "$out/tokens.u16" 5 40000
python3 -c "
import array
a = array.array('H'); a.frombytes(open('$out/tokens.u16', 'rb').read())
open('$out/tokens.u32', 'wb').write(array.array('I', a).tobytes())"
sets=("data.train_files=[\"$out/tokens.u32\"]" train.seq_len=256 train.micro_batch_instances=1 train.global_batch_instances=8)
args=(--config configs/olmo3-1b.toml)
for s in "${sets[@]}"; do args+=(--set "$s"); done
echo "machine: $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p'), $(free -g | awk '/Mem:/ {print $2}') GiB; $(date -u '+%F %H:%M') UTC"
build/bench/bench_ckpt_synthetic configs/olmo3-1b.toml "$out/ckpt" 3 "$(nproc)" "${sets[@]}"
for layout in 1x1 2x1; do
  s=${layout%x*}
  build/olmoref config "${args[@]}" --layout "$layout" --threads 1 > "$out/predicted-$layout.txt"
  "${MPIRUN[@]}" -np "$s" python3 bench/proc_stats.py "$out/resume-$layout-%r.json" -- build/olmoref train "${args[@]}" \
    --resume-from "$out/ckpt/step00000000" --stop-after 0 --threads 1 --quiet --dp-shard "$s" --report-memory \
    --out "$out/run-$layout" 2> "$out/resume-$layout.log" || { cat "$out/resume-$layout.log"; exit 1; }
done
python3 - "$out" <<'PY'
import glob, json, re, sys
out = sys.argv[1]
MiB = 2 ** 20
print("| layout | rank | resume s | read MiB (rchar) | peak MiB / predicted |")
print("|---|---|---|---|---|")
for layout in ("1x1", "2x1"):
    resume = int(re.search(r"resume (\d+)\)", open(f"{out}/predicted-{layout}.txt").read()).group(1))
    for p in sorted(glob.glob(f"{out}/resume-{layout}-*.json")):
        r = json.load(open(p))
        print(f"| {layout} | {r['rank']} | {r['seconds']:.1f} | {r['rchar'] / MiB:.0f} | "
              f"{r['peak_resident'] / MiB:.0f} / {resume / MiB:.0f} ({r['peak_resident'] / resume:.3f}) |")
PY
