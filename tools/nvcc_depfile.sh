#!/usr/bin/env bash
# tools/nvcc_depfile.sh NVCC ARGS...: NVCC ARGS, with a dependency file for each compile. Meson's CUDA compiler in the
# build folders tools/meson_setup.sh configures.
#
# Meson before 1.4 (Debian's is 1.0) sets ninja to read a dependency file for every .cu object but never asks nvcc to
# write one, so ninja records no header for a .cu: a changed header (kernels/*.h, core/*.h, a struct the .cu shares
# with the C++ side) leaves the old object in place, and an incremental build links translation units that disagree
# about a struct's layout. gemm_bench --dry-run segfaulted so after train/config.h grew a member; a device session
# carrying such a build (tools/gpu_carry.sh builds build-gpu/ incrementally) would run the old kernels. This writes
# the file ninja expects (OUT.d, the target named OUT as ninja runs from the build folder) unless meson already asks
# for one.
set -euo pipefail
nvcc=$1
shift
out="" compile=0 prev=""
for a in "$@"; do
  case "$a" in
    -MD | -MMD | -MF | -M | -MM) exec "$nvcc" "$@" ;;  # a newer meson's own dependency flags
    -c) compile=1 ;;
  esac
  [ "$prev" = -o ] && out=$a
  prev=$a
done
if [ "$compile" = 1 ] && [ -n "$out" ]; then exec "$nvcc" "$@" -MD -MT "$out" -MF "$out.d"; fi
exec "$nvcc" "$@"
