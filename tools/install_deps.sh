#!/usr/bin/env bash
# Installs what olmoref needs to build and test, from Debian's packages (idempotent: quick when present).
# The CUDA toolkit (nvcc, cuBLAS, CUB, NCCL) is expected on PATH already; without it the CUDA target is skipped.
set -euo pipefail
packages=(meson ninja-build pkg-config g++ python3 python3-venv
          libxxhash-dev libzstd-dev zstd libssl-dev doctest-dev libbenchmark-dev libopenmpi-dev openmpi-bin
          libcli11-dev nlohmann-json3-dev libtomlplusplus-dev libopenblas-dev gnuplot-nox
          fortunes bible-kjv)
missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install_deps: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
