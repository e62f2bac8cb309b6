#!/usr/bin/env bash
# meson test tools-cuda-option: the cuda build option (meson_options.txt, kernels/meson.build) against a CUDA toolkit
# that lacks NCCL: -Dcuda=enabled, what CI and the device build use, stops at configure naming libnccl; -Dcuda=auto
# configures without the device side and says why. The NCCL libraries are hidden in a private mount namespace: every
# folder the linker or the toolkit finds one in is covered by a copy of it made of links, without them. Exit 77
# "SKIPPED: ..." without nvcc, or where a mount namespace cannot be made (not root).
source "${OLMOREF_SOURCE_ROOT:?}/tests/common/shell_test.sh"
nvcc=$(command -v nvcc || true)
[ -n "$nvcc" ] || { echo "SKIPPED: tools-cuda-option: no nvcc on PATH"; exit 77; }
unshare -m true 2> /dev/null ||
  { echo "SKIPPED: tools-cuda-option: no private mount namespace here (unshare -m)"; exit 77; }
toolkit_lib=$(readlink -f "$(dirname "$(readlink -f "$nvcc")")/../lib64")
cat > "$work/hidden.sh" <<'SH'
set -euo pipefail
work=$1/ns-$3 src=$2 option=$3 toolkit_lib=$4
mkdir -p "$work"
hide() {  # hide DIR: DIR's NCCL libraries gone in this namespace, the rest of it as it was
  local dir name
  dir=$(readlink -f "$1")
  name=$(echo "$dir" | tr / _)
  [ -d "$work/copy$name" ] && return 0
  # The original stays reachable under $work (the copy's links point there, not into the folder they cover).
  mkdir -p "$work/orig$name" "$work/copy$name"
  mount --bind "$dir" "$work/orig$name"
  cp -rs "$work/orig$name/." "$work/copy$name"
  find "$work/copy$name" -name 'libnccl*' -exec rm {} +
  mount --bind "$work/copy$name" "$dir"
}
hide "$toolkit_lib"
echo 'int main() { return 0; }' > "$work/probe.c"
for _ in 1 2 3 4 5 6; do  # wherever else the linker still finds one
  found=$(cc "$work/probe.c" -lnccl -o "$work/probe" -Wl,--trace 2> /dev/null | grep -m1 'libnccl' || true)
  [ -n "$found" ] || break
  hide "$(dirname "$found")"
done
if cc "$work/probe.c" -lnccl -o "$work/probe" 2> /dev/null; then echo "could not hide NCCL"; exit 3; fi
meson setup "$work/build" "$src" "-Dcuda=$option" -Dbenchmarks=disabled
SH
configure() {  # configure CUDA_OPTION: meson setup of the source tree with NCCL hidden; its output in $work/setup.log
  unshare -m bash "$work/hidden.sh" "$work" "$SRC" "$1" "$toolkit_lib" > "$work/setup.log" 2>&1
}
rc=0
configure enabled || rc=$?
[ $rc -ne 3 ] || { cat "$work/setup.log"; echo "FAIL: NCCL could not be hidden"; exit 1; }
[ $rc -ne 0 ] ||
  { tail -n 20 "$work/setup.log"; echo "FAIL: -Dcuda=enabled configured against a toolkit without NCCL"; exit 1; }
grep -q "ERROR: .*-Dcuda=enabled, but the CUDA toolkit .* lacks libnccl:" "$work/setup.log" ||
  { tail -n 20 "$work/setup.log"; echo "FAIL: -Dcuda=enabled did not name libnccl"; exit 1; }
echo "ok: enabled: $(grep -m1 'ERROR:' "$work/setup.log" | cut -c1-160)"
configure auto || { tail -n 20 "$work/setup.log"; echo "FAIL: -Dcuda=auto did not configure"; exit 1; }
grep -q "the device side is not built: the toolkit lacks libnccl" "$work/setup.log" ||
  { tail -n 20 "$work/setup.log"; echo "FAIL: -Dcuda=auto did not say why the device side is left out"; exit 1; }
echo "ok: auto: configured without the device side, saying why"
