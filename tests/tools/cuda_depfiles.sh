#!/usr/bin/env bash
# meson test tools-cuda-depfiles: ninja knows the headers of every CUDA object, so a changed header rebuilds the .cu
# files that include it (tools/nvcc_depfile.sh says what went wrong without: Meson 1.0 asks nvcc for no dependency
# file, and an incremental build linked objects that disagreed about a struct's layout).
#   1. The build under test (configured by tools/meson_setup.sh, as tools/build.sh does): each .cu object's recorded
#      dependencies hold its project headers (kernels/gemm_exact.h and kernels/block.h for the GEMM, train/config.h
#      for gemm_bench, whose TrainConfig grew a member under a stale object).
#   2. A scratch project with one .cu and its header, set up by tools/meson_setup.sh: touching the header makes ninja
#      rebuild the object. Control: set up by plain `meson setup` with a Meson before 1.4, ninja does not.
# Exit 77 without nvcc, or in a build without the CUDA side.
source "${OLMOREF_SOURCE_ROOT:?}/tests/common/shell_test.sh"
BUILD="$OLMOREF_BUILD_ROOT"
command -v nvcc > /dev/null || { echo "SKIPPED: tools-cuda-depfiles: no nvcc on PATH"; exit 77; }
ninja -C "$BUILD" -t deps > "$work/deps.txt"
grep -q '\.cu\.o:' "$work/deps.txt" || { echo "SKIPPED: tools-cuda-depfiles: this build has no CUDA objects"; exit 77; }

echo "== 1. the build under test"
python3 - "$work/deps.txt" "$BUILD" "$SRC" <<'PY' || { echo "FAIL: configure the build with tools/meson_setup.sh (tools/build.sh does)"; exit 1; }
import os, re, sys
deps_txt, build, src = sys.argv[1], sys.argv[2], os.path.realpath(sys.argv[3])
deps, obj = {}, None
for line in open(deps_txt):
    m = re.match(r"(\S+\.cu\.o): #deps (\d+)", line)
    if m:
        obj = m.group(1)
        deps[obj] = []
    elif line.startswith("    ") and obj:
        # The project's headers as the source tree names them (the layers' include folders link into it).
        path = os.path.realpath(os.path.join(build, line.strip()))
        if path.startswith(src + "/"):
            deps[obj].append(os.path.relpath(path, src))
    elif line.strip() == "":
        obj = None
bad = [o for o, d in deps.items() if not any(p.endswith((".h", ".cuh")) for p in d)]
assert not bad, f"CUDA objects with no project header recorded: {bad}"
want = {"gemm_exact.cu.o": ["kernels/gemm_exact.h", "kernels/block.h", "core/hd.h"],
        "gemm_bench.cu.o": ["kernels/gemm_exact.h", "train/config.h"]}
for suffix, headers in want.items():
    objs = [o for o in deps if o.endswith("/" + suffix)]
    assert objs, f"no {suffix} in this build"
    for o in objs:
        for h in headers:
            assert h in deps[o], f"{o} does not record {h}: {deps[o][:8]}..."
print(f"{len(deps)} CUDA objects, each with its project headers recorded")
PY

echo "== 2. a scratch project"
mkdir -p "$work/proj"
cat > "$work/proj/meson.build" <<'MB'
project('depfiles', 'cpp', 'cuda')  # cpp too: Meson 1.0 cannot link a CUDA-only static library
static_library('k', 'k.cu')
MB
printf '#include "k.h"\n__global__ void k(int* x) { x[0] = kValue; }\n' > "$work/proj/k.cu"
echo 'constexpr int kValue = 1;' > "$work/proj/k.h"
rebuilds() {  # rebuilds BUILD_DIR: whether ninja would compile k.cu again after k.h changed
  ninja -C "$1" > /dev/null
  # k.h 10 s newer than the object, by the object's own mtime: no sleep, nothing hangs on the clock.
  local object
  object=$(find "$1" -name 'k.cu.o' | head -n 1)
  [ -n "$object" ] || { echo "FAIL: no k.cu.o in $1"; exit 1; }
  touch -d "@$(($(stat -c %Y "$object") + 10))" "$work/proj/k.h"
  # Captured, then searched: `ninja -n | grep -q` fails under pipefail whenever grep's early exit SIGPIPEs ninja
  # (two fresh-clone CI runs failed so, with the rebuild listed).
  ninja -C "$1" -n > "$work/dry-run.txt"
  grep -q 'k\.cu\.o' "$work/dry-run.txt"
}
(cd "$work/proj" && bash "$SRC/tools/meson_setup.sh" "$work/proj/with" > "$work/with.log" 2>&1) ||
  { cat "$work/with.log"; echo "FAIL: tools/meson_setup.sh"; exit 1; }
rebuilds "$work/proj/with" || {
  ninja -C "$work/proj/with" -n -d explain 2>&1 | head -n 20
  ninja -C "$work/proj/with" -t deps | grep -v '^    /usr' | head -n 10
  stat -c '%y %n' "$work/proj/k.h" "$(find "$work/proj/with" -name 'k.cu.o')"
  echo "FAIL: k.h changed and ninja would not rebuild k.cu (tools/meson_setup.sh)"
  exit 1
}
echo "set up by tools/meson_setup.sh: a changed header rebuilds the .cu"
version=$(meson --version)
(cd "$work/proj" && meson setup "$work/proj/plain" > "$work/plain.log" 2>&1) || { cat "$work/plain.log"; exit 1; }
if [ "$version" != 1.4.0 ] && printf '%s\n1.4.0\n' "$version" | sort -V -C; then  # before 1.4
  if rebuilds "$work/proj/plain"; then echo "FAIL: the control: Meson $version's own setup rebuilt k.cu"; exit 1; fi
  echo "control: set up by Meson $version alone, the same change leaves the old object"
else
  echo "NOTE: Meson $version writes CUDA dependency files itself; the control shows nothing here"
fi
