#!/usr/bin/env bash
# tests/kernels/ptxas_budget.sh — every CUDA kernel as the build compiles it, through ptxas's report: no spills.
#
#   bash ptxas_budget.sh SOURCE_ROOT NVCC [NVCC_ARGS...] -- KERNEL.cu...
#
# The kernels' speed rests on their register budgets: the GEMM and the attention forward and backward kernels are
# bounded to two blocks an SM (__launch_bounds__(256, 2): 128 registers), and ptxas meets a bound by spilling to local
# memory without a word at build time. A spill changes no bit, so no bitwise test sees it; this one does, with the
# toolkit CI and the device build share (nvcc 13.0). Prints each kernel's registers, shared memory and spills; fails
# naming any kernel that spills. Its control: the planted spill of tests/kernels/ptxas_spill_control.cu must be
# reported.
set -euo pipefail
root=$1 nvcc=$2
shift 2
args=()
while [ "$1" != "--" ]; do args+=("$1"); shift; done
shift
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The device code alone (-cubin: the same ptxas report, half the time of a whole -c compile) where the build targets
# one architecture; a cubin holds one, so several take the whole compile.
output=(-cubin)
[ "$(printf '%s\n' "${args[@]}" | grep -c '^-gencode$')" = 1 ] || output=(-c)

# The report of one source: "kernel registers smem_bytes spill_stores spill_loads" per entry function.
report() {  # SOURCE [extra nvcc args...]
  local src=$1
  shift
  "$nvcc" "${args[@]}" "$@" -I"$root" -Xptxas -v "${output[@]}" "$src" -o "$work/$(basename "$src").o" > "$work/log" 2>&1 || {
    cat "$work/log" >&2; echo "FAILED: nvcc $src" >&2; exit 1; }  # stderr: stdout is the rows
  python3 - "$work/log" <<'PY'
import re, subprocess, sys
kernel, spill = None, (0, 0)
for line in open(sys.argv[1]):
    m = re.search(r"Compiling entry function '([^']+)'", line)
    if m:
        name = subprocess.run(["c++filt", m.group(1)], capture_output=True, text=True).stdout.strip()
        name = re.sub(r"olmoref::kernels::|\(anonymous namespace\)::|^void ", "", name)
        kernel = re.sub(r"\(.*$", "", name).replace(" ", "")[:60]
        continue
    m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
    if m and kernel:
        spill = (int(m.group(1)), int(m.group(2)))
        continue
    m = re.search(r"Used (\d+) registers.*?(?:(\d+) bytes smem)?$", line.strip())
    if m and kernel:
        print(kernel, m.group(1), m.group(2) or 0, spill[0], spill[1])
        kernel, spill = None, (0, 0)
PY
}

failed=0
printf '%-62s %9s %9s %14s\n' kernel registers smem spills
for src in "$@"; do
  # Into a file first: a loop reading a process substitution never sees its exit status, so a failed compile would
  # pass with no rows.
  report "$src" > "$work/rows" || { echo "FAILED: no ptxas report for $src"; failed=1; continue; }
  [ -s "$work/rows" ] || { cat "$work/log"; echo "FAILED: $src: no entry function in ptxas's report"; failed=1; }
  while read -r kernel regs smem stores loads; do
    printf '%-62s %9s %9s %7s/%-6s %s\n' "$kernel" "$regs" "$smem" "$stores" "$loads" "$(basename "$src")"
    if [ "$stores" != 0 ] || [ "$loads" != 0 ]; then
      echo "FAILED: $kernel ($src) spills $stores bytes to local memory and loads $loads back: give it the registers" \
           "(its __launch_bounds__) or cut what its loops keep live (docs/executors.md)"
      failed=1
    fi
  done < "$work/rows"
done
control=$(report "$root/tests/kernels/ptxas_spill_control.cu") || { echo "FAILED: no ptxas report for the control"; exit 1; }
[ -n "$(awk '$4 > 0' <<< "$control")" ] || {
  echo "FAILED: control: tests/kernels/ptxas_spill_control.cu's planted spill is not reported (the parse misses spills)"
  failed=1; }
exit $failed
