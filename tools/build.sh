#!/usr/bin/env bash
# Configures (once) and builds olmoref in ./build. The CUDA side: OLMOREF_CUDA=auto|enabled|disabled (meson's -Dcuda);
# CI (CI=true) builds with enabled, so a toolkit that lacks a library stops the build at configure, naming it, instead
# of giving a build without CUDA that the device would find out about.
set -euo pipefail
cd "$(dirname "$0")/.."
cuda=${OLMOREF_CUDA:-}
if [ -z "$cuda" ]; then
  case "${CI:-}" in true|1|yes) cuda=enabled ;; *) cuda=auto ;; esac
fi
configure() {  # meson's output only when it fails: its ERROR line names what is missing
  local log
  log=$("$@" 2>&1) || { echo "$log" | tail -n 20 >&2; echo "build.sh: $* failed" >&2; exit 1; }
}
if [ -f build/build.ninja ] && command -v nvcc > /dev/null && [ ! -f build/olmoref-native.ini ]; then
  # Configured before tools/meson_setup.sh (or by hand): its .cu objects track no header. Configured afresh, once.
  echo "build.sh: build/ was configured without tools/meson_setup.sh's nvcc (no header dependencies for .cu files):" \
       "configuring it afresh" >&2
  rm -rf build
fi
if [ ! -f build/build.ninja ]; then
  configure bash tools/meson_setup.sh build --buildtype=release "-Dcuda=$cuda"
elif [ "$(meson introspect build --buildoptions |
         python3 -c 'import json, sys; print(next(o["value"] for o in json.load(sys.stdin) if o["name"] == "cuda"))')" \
       != "$cuda" ]; then
  configure meson configure build "-Dcuda=$cuda"
fi
ninja -C build
