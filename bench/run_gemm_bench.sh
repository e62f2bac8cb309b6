#!/usr/bin/env bash
# bench/run_gemm_bench.sh — run bench_gemm and print olmoref / OpenBLAS GFLOP/s ratios per product, shape and
# thread count. The acceptance bar is ratio >= 0.9 everywhere.
#
# usage: bench/run_gemm_bench.sh [build-dir] [extra benchmark args...]
#   e.g. bench/run_gemm_bench.sh build --benchmark_filter=threads:2
# Each benchmark runs 5 repetitions (override with --benchmark_repetitions=N), interleaved in random order
# across all benchmarks, and the table keeps the best GFLOP/s of each: a burst of other load on a small
# machine then hits both sides of a ratio alike and does not decide it.
# OpenBLAS picks its kernel by CPU model (printed as openblas_core); OPENBLAS_CORETYPE=SkylakeX forces its
# AVX-512 kernels where the installed version does not know the CPU.
set -euo pipefail
build="${1:-build}"
[[ $# -gt 0 ]] && shift
exe="$build/bench/bench_gemm"
[[ -x "$exe" ]] || { echo "missing $exe: build with benchmark and openblas found (ninja -C $build)" >&2; exit 1; }
json="$(mktemp)"
trap 'rm -f "$json"' EXIT
"$exe" --benchmark_repetitions=5 --benchmark_min_time=0.1 --benchmark_enable_random_interleaving=true \
  --benchmark_format=json --benchmark_out_format=json \
  --benchmark_out="$json" "$@" >/dev/null
python3 - "$json" <<'PY'
import json, re, sys
doc = json.load(open(sys.argv[1]))
ctx = doc.get("context", {})
rows = {}
for b in doc["benchmarks"]:
    if b.get("run_type") != "iteration":
        continue
    m = re.match(r"gemm/(\w+)/(\w+)/M:(\d+)/N:(\d+)/K:(\d+)/threads:(\d+)", b["name"])
    if not m:
        continue
    prod, impl, M, N, K, t = m.groups()
    r = rows.setdefault((int(t), int(M), int(N), int(K), prod), {})
    r[impl] = max(r.get(impl, 0.0), b["GFLOPS"])  # GFLOPS counter: 2*M*N*K per call over wall time
print(f"olmoref path: {ctx.get('olmoref_gemm_isa', '?')}   OpenBLAS core: {ctx.get('openblas_core', '?')}   "
      f"host: {ctx.get('host_name', '?')}, {ctx.get('num_cpus', '?')} cpus")
print("GFLOP/s = best of the repetitions; ratio = olmoref / OpenBLAS (bar: >= 0.9)")
print(f"{'thr':>3} {'M':>5} {'N':>5} {'K':>5} {'product':<7} {'olmoref GF/s':>12} {'OpenBLAS GF/s':>13} {'ratio':>6}")
worst = None
for key in sorted(rows):
    t, M, N, K, prod = key
    r = rows[key]
    if "olmoref" not in r or "openblas" not in r:
        continue
    ratio = r["olmoref"] / r["openblas"]
    worst = ratio if worst is None else min(worst, ratio)
    flag = "" if ratio >= 0.9 else "  < 0.9"
    print(f"{t:>3} {M:>5} {N:>5} {K:>5} {prod:<7} {r['olmoref']:>12.1f} {r['openblas']:>13.1f} {ratio:>6.2f}{flag}")
if worst is not None:
    print(f"worst ratio: {worst:.2f} ({'meets' if worst >= 0.9 else 'misses'} the 0.9x bar)")
PY
