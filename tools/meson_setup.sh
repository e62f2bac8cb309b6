#!/usr/bin/env bash
# tools/meson_setup.sh DIR [MESON ARGS...]: `meson setup DIR ARGS`, with nvcc behind tools/nvcc_depfile.sh so ninja
# learns the headers of every .cu (Meson before 1.4 does not ask nvcc for them; that script says why it matters).
# The native file naming it is written into DIR, where meson keeps reading it on a reconfigure. Without nvcc on PATH,
# plain `meson setup` (the CUDA side is then meson.build's business: -Dcuda=auto builds without it).
set -euo pipefail
dir=$1
shift
root=$(cd "$(dirname "$0")/.." && pwd)
native=()
if nvcc=$(command -v nvcc); then
  mkdir -p "$dir"
  printf "[binaries]\ncuda = ['%s', '%s']\n" "$root/tools/nvcc_depfile.sh" "$nvcc" > "$dir/olmoref-native.ini"
  native=(--native-file "$dir/olmoref-native.ini")
fi
exec meson setup "$dir" "${native[@]}" "$@"
