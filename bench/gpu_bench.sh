#!/usr/bin/env bash
# bench/gpu_bench.sh — exact-mode training throughput on the GPU (run by tools/gpu_check.sh).
#
#   bash bench/gpu_bench.sh OUT_DIR [BIN]
#
# For configs/olmo3-100m.toml and configs/olmo3-1b.toml (OLMo-core's olmo3_100M and olmo3_1B shapes, context
# 2048), fp32 and bf16: `olmoref train --executor cuda` on random tokens for BENCH_STEPS steps (default 4; the first
# is left out as warm-up), tokens/s from the progress lines (the trace holds no times: its bytes are the contract), achieved FLOP/s = tokens/s x FLOPs/token (`olmoref
# config`: OLMo-core's formula, 6 x non-embedding params + the LM head + attention at the full context, so the
# sliding-window layers count more than they compute) and its share of the H200's fp32 SIMT peak (67 TFLOP/s, the
# datasheet figure; BENCH_PEAK_TFLOPS to change it), and the same steps without the parameter digest (each progress
# line times the step and the digest inside it; issue 33 asked for the step with and without it). Then one --profile-ops run per config (fp32, 2 steps) for each
# kernel's share of step time and the GEMMs' own GFLOP/s. Writes OUT_DIR/bench.json and OUT_DIR/bench.txt.
set -euo pipefail
out=${1:?usage: gpu_bench.sh OUT_DIR [BIN]}
bin=${2:-build/olmoref}
steps=${BENCH_STEPS:-4}
peak=${BENCH_PEAK_TFLOPS:-67}
cd "$(dirname "$0")/.."
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
rows=()
failed=0
: > "$out/bench.txt"
# Rewrites bench.json from the rows so far (called after every run, so a run cut short still leaves the rows
# before it) and prints the newest row's line. Rows another bench wrote there first (bench/gemm_bench's, in
# tools/gpu_check.sh's bench step) are kept ahead of this script's, which say "bench": "train".
write_rows() {
  printf '%s\n' "${rows[@]}" | python3 -c '
import json, os, sys
rows = [json.loads(l) for l in sys.stdin if l.strip()]
out = []
if os.path.exists(sys.argv[1]):
    out = [r for r in json.load(open(sys.argv[1])) if r.get("bench") != "train"]
for r in rows:
    t = r["tokens_per_second_each"]
    if t:
        r["tokens_per_second"] = len(t) / sum(1.0 / x for x in t)  # the mean step time, as tokens/s
        r["achieved_tflops"] = r["tokens_per_second"] * r["flops_per_token"] / 1e12
        r["share_of_fp32_simt_peak"] = r["achieved_tflops"] / r["peak_tflops"]
        # The same steps without the parameter digest (the Merkle root of the fingerprint, timed inside each step).
        step, digest = sum(r["step_seconds_each"]), sum(r["digest_seconds_each"])
        r["digest_share_of_step"] = digest / step
        r["tokens_per_second_without_digest"] = r["tokens_per_second"] * step / (step - digest)
    out.append(r)
json.dump(out, open(sys.argv[1] + ".tmp", "w"), indent=1)
r = out[-1]
if "tokens_per_second" in r:
    print("%-11s %-5s %9.0f tok/s %7.2f TFLOP/s  %5.1f%% of the %g TFLOP/s fp32 SIMT peak; without the digest %9.0f tok/s "
          "(digest %.1f%% of the step)" % (r["config"], r["precision"], r["tokens_per_second"], r["achieved_tflops"],
          100 * r["share_of_fp32_simt_peak"], r["peak_tflops"], r["tokens_per_second_without_digest"],
          100 * r["digest_share_of_step"]))
' "$out/bench.json" | tee -a "$out/bench.txt"
  mv "$out/bench.json.tmp" "$out/bench.json"
}
executor=${BENCH_EXECUTOR:-cuda}  # another executor only to try the script where there is no GPU
for config in ${BENCH_CONFIGS:-configs/olmo3-100m.toml configs/olmo3-1b.toml}; do
  name=$(basename "$config" .toml)
  flops=$("$bin" config --config "$config" | awk '/^FLOPs\/token/ {print $2}')
  vocab=$("$bin" config --config "$config" | sed -n 's/^shape .*vocab \([0-9]*\).*/\1/p')
  python3 - "$work/tokens.u32" "$vocab" <<'PY'
import random, struct, sys
random.seed(5)
n = 1 << 20  # enough instances for every benchmark run
v = int(sys.argv[2])
open(sys.argv[1], "wb").write(struct.pack("<%dI" % n, *(random.randrange(v) for _ in range(n))))
PY
  for precision in fp32 bf16; do
    run="$work/$name-$precision"
    "$bin" train --config "$config" --executor "$executor" --steps "$steps" --set "train.precision=\"$precision\"" \
      --set train.log_every=1 --set "data.train_files=[\"$work/tokens.u32\"]" --set data.dtype=\"u32\" --out "$run" --no-checkpoint \
      2> "$run.err" || { echo "$name $precision: train failed: $(tail -n 3 "$run.err")" | tee -a "$out/bench.txt"; failed=1; continue; }
    # Progress lines: "step     2/4  loss ...  1234 tok/s  step 0.5120 s  digest 0.0310 s  <digest>"; step 1 (allocation,
    # first launches) is left out.
    rows+=("$(python3 - "$run.err" "$name" "$precision" "$flops" "$peak" <<'PY'
import json, re, sys
err, name, precision, flops, peak = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), float(sys.argv[5])
lines = [m for m in (re.match(r"step\s+(\d+)/\d+ .* (\d+) tok/s  step ([0-9.]+) s  digest ([0-9.]+) s", l) for l in open(err))
         if m and int(m.group(1)) > 1]
tps = [float(m.group(2)) for m in lines]
print(json.dumps({"bench": "train", "config": name, "precision": precision, "steps_timed": len(tps), "tokens_per_second_each": tps,
                  "step_seconds_each": [float(m.group(3)) for m in lines],
                  "digest_seconds_each": [float(m.group(4)) for m in lines], "flops_per_token": flops, "peak_tflops": peak}))
PY
)")
    write_rows
  done
  "$bin" train --config "$config" --executor "$executor" --steps 2 --set "data.train_files=[\"$work/tokens.u32\"]" --set data.dtype=\"u32\" \
    --out "$work/$name-profile" --no-checkpoint --quiet --profile-ops 2> "$work/$name-profile.err" || true
  { echo "== $name fp32, per-op time (--profile-ops, 2 steps)"; sed -n '/^per-op time/,$p' "$work/$name-profile.err"; } >> "$out/bench.txt"
  # The profile's attention and GEMM seconds and FLOPs as a bench.json row ("bench": "profile"): `olmoref config
  # --time --bench` takes the exact attention's rate from these rows (gemm_bench measures no attention).
  python3 - "$work/$name-profile.err" "$out/bench.json" "$name" <<'PY' || { echo "$name: no per-op table to record"; failed=1; }
import json, os, sys
err, path, name = sys.argv[1:]
lines = open(err).read().split("per-op time", 1)[1].splitlines()[2:]
sums = {"attention": [0.0, 0.0], "gemm": [0.0, 0.0]}
for l in lines:
    f = l.split()
    if len(f) < 6 or not f[-1].isdigit():
        continue
    kind = "attention" if f[0].startswith("attention_") else "gemm" if f[0].startswith("matmul") else None
    if kind:
        sums[kind][0] += float(f[2])  # seconds (op, calls, seconds, share, GFLOP/s, FLOP)
        sums[kind][1] += float(f[-1])
assert sums["attention"][0] > 0 and sums["gemm"][0] > 0, sums
rows = json.load(open(path)) if os.path.exists(path) else []
rows.append({"bench": "profile", "config": name, "precision": "fp32", "steps": 2,
             "attention_seconds": sums["attention"][0], "attention_flops": sums["attention"][1],
             "gemm_seconds": sums["gemm"][0], "gemm_flops": sums["gemm"][1]})
json.dump(rows, open(path + ".tmp", "w"), indent=1)
os.replace(path + ".tmp", path)
PY
done
exit $failed
