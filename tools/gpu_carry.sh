#!/usr/bin/env bash
# tools/gpu_carry.sh — prepares what a bare device machine needs to run tools/gpu_check.sh on this machine's build:
# the shared libraries olmoref and the GPU tests link that a machine without this project's Debian packages lacks
# (MPI, zstd, xxHash, toml++, hwloc, libevent, ...) are copied into build/gpu-libs, which gpu_check.sh puts on
# LD_LIBRARY_PATH. Prints the `carry` list for the device call (the binaries and the libraries, not all of build/:
# the device tool carries at most 64 MiB). mpirun itself is not carried: the 2-process check needs Open MPI there.
set -euo pipefail
cd "$(dirname "$0")/.."
bins=(build/olmoref build/tests/gpu/test_gpu_kernels build/tests/gpu/test_gpu_smoke)
for b in "${bins[@]}"; do [ -x "$b" ] || { echo "gpu_carry: $b missing: bash tools/build.sh first" >&2; exit 1; }; done
rm -rf build/gpu-libs
mkdir -p build/gpu-libs
# The C/C++ runtime and the CUDA runtime and driver come with the device machine.
skip='^(linux-vdso|ld-linux|libc\.|libm\.|libdl\.|libpthread\.|librt\.|libstdc\+\+|libgcc_s|libcuda\.|libcudart)'
for b in "${bins[@]}"; do
  ldd "$b" | awk '$3 ~ /^\// {print $1, $3}' | while read -r name path; do
    [[ "$name" =~ $skip ]] && continue
    cp -L "$path" "build/gpu-libs/$name"
  done
done
du -sh build/gpu-libs >&2
printf 'carry: ["build/olmoref", "build/tests/gpu/test_gpu_kernels", "build/tests/gpu/test_gpu_smoke", "build/gpu-libs"]\n'
