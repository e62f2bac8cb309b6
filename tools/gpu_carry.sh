#!/usr/bin/env bash
# tools/gpu_carry.sh — builds what a bare device machine runs tools/gpu_check.sh with, into one folder, gpu-carry/
# (ignored by git; the device call names it: `carry: ["gpu-carry"]`, then `bash tools/gpu_check.sh`):
#
#   gpu-carry/olmoref, gpu-carry/tests/gpu/test_gpu_{kernels,smoke}, gpu-carry/bench/{gemm,attention}_bench
#       built in build-gpu/ for an explicit x86-64 level (cpu_isa=x86-64-v3, AVX2: any x86 server of the last ten
#       years), so a binary built here cannot stop with an illegal instruction there; results are bitwise the same
#       for every level (tier T4);
#   gpu-carry/lib/   every shared library they load except the C/C++ runtime (the device machine has glibc,
#       libstdc++, libgcc_s and the CUDA driver; its CUDA runtime need not be on the loader path, so libcudart is
#       carried); cuBLAS is not: libcublas (54 MB) and libcublasLt (541 MB) are ten times what a device call carries,
#       so bench/gemm_bench loads it at run time where the device machine has one and runs without it elsewhere;
#   gpu-carry/mpi/   Open MPI as Debian installs it (mpirun, plugins, help texts, PMIx) and the libraries they load,
#       under its installed paths, relocated at run time (OPAL_PREFIX and friends in gpu-carry/env.sh): the checks
#       with two processes need mpirun there. Without ssh, mpirun launches through its `isolated` starter.
#   gpu-carry/env.sh sourced by gpu_check.sh: the loader path, the MPI relocation, the MPI transport settings.
#
#   bash tools/gpu_carry.sh [--build DIR] [--check | --check-only]
#     --build DIR  carry DIR's binaries instead of building build-gpu/ (the suite's check uses ./build)
#     --check-only check the folder as it is (GPU_CARRY_DIR, default gpu-carry/), without filling it
#     --check      then prove the folder works on a machine with nothing but the C/C++ runtime: in a chroot that
#                  holds only those, bash and gpu-carry/, every carried binary's libraries resolve and two MPI
#                  processes train the tiny run to the trace one process gives (needs root, as chroot does)
set -euo pipefail
cd "$(dirname "$0")/.."
build=""
check=0
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --check) check=1; shift ;;
    --check-only) check=2; shift ;;
    *) echo "usage: tools/gpu_carry.sh [--build DIR] [--check | --check-only]" >&2; exit 2 ;;
  esac
done
carry=${GPU_CARRY_DIR:-$PWD/gpu-carry}
# What a device machine has without us: the C and C++ runtimes and the CUDA driver.
runtime='^(linux-vdso|ld-linux|libc\.|libm\.|libdl\.|libpthread\.|librt\.|libstdc\+\+|libgcc_s|libcuda\.)'
libs_of() {  # libs_of FILE...: "name path" of each library the loader resolves for them, the runtime left out
  for f in "$@"; do ldd "$f" 2> /dev/null | awk '$3 ~ /^\// {print $1, $3}'; done | sort -u |
    while read -r name path; do [[ "$name" =~ $runtime ]] || echo "$name $path"; done
}
fill() {
  if [ -z "$build" ]; then
    build=build-gpu
    # A build-gpu/ configured before tools/meson_setup.sh tracks no header of a .cu: configured afresh, once.
    [ -f build-gpu/olmoref-native.ini ] || rm -rf build-gpu
    [ -f build-gpu/build.ninja ] ||
      bash tools/meson_setup.sh build-gpu --buildtype=release -Dcpu_isa=x86-64-v3 -Dbenchmarks=disabled -Dcuda=enabled \
        > /dev/null
    ninja -C build-gpu olmoref tests/gpu/test_gpu_kernels tests/gpu/test_gpu_smoke bench/gemm_bench \
      bench/attention_bench > /dev/null
  fi
  rm -rf "$carry"
  mkdir -p "$carry/tests/gpu" "$carry/bench" "$carry/lib" "$carry/mpi"
  cp "$build/olmoref" "$carry/"
  local t f name path
  for t in test_gpu_kernels test_gpu_smoke; do
    [ -x "$build/tests/gpu/$t" ] && cp "$build/tests/gpu/$t" "$carry/tests/gpu/"
  done
  for t in gemm_bench attention_bench; do
    [ -x "$build/bench/$t" ] && cp "$build/bench/$t" "$carry/bench/"
  done
  libs_of "$carry/olmoref" "$carry"/tests/gpu/* "$carry"/bench/* | while read -r name path; do cp -L "$path" "$carry/lib/$name"; done

  # Open MPI: the packages whose libmpi the binaries link, every file but docs, Java and static libraries.
  local mpi_files
  mpi_files=$(dpkg -L libopenmpi3 openmpi-bin openmpi-common libpmix2 |
    while read -r f; do [ -f "$f" ] || [ -L "$f" ] && echo "$f"; done | grep -v -e '/doc/' -e '/man/' -e java -e '\.a$')
  for f in $mpi_files; do
    mkdir -p "$carry/mpi$(dirname "$f")"
    cp -P "$f" "$carry/mpi$f"
  done
  # The libraries its programs and plugins load (fabric, UCX, hwloc, libevent, ...), beside its own.
  local mpi_lib=$carry/mpi/usr/lib/x86_64-linux-gnu
  # shellcheck disable=SC2046
  libs_of $(echo "$mpi_files" | grep -e '\.so' -e '/bin/orte') | while read -r name path; do
    [ -e "$mpi_lib/$name" ] || cp -L "$path" "$mpi_lib/$name"
  done
  ln -sf orterun "$carry/mpi/usr/bin/mpirun"
  cat > "$carry/env.sh" << 'EOF'
# gpu-carry/env.sh (written by tools/gpu_carry.sh): run the carried binaries and the carried Open MPI from here.
carry_dir=$(cd "${BASH_SOURCE[0]%/*}" && pwd)
mpi_usr=$carry_dir/mpi/usr
export PATH=$mpi_usr/bin:$PATH
export LD_LIBRARY_PATH=$carry_dir/lib:$mpi_usr/lib/x86_64-linux-gnu:$mpi_usr/lib/x86_64-linux-gnu/openmpi/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# Open MPI finds its plugins and help texts under OPAL_PREFIX; PMIx under its own plugin path.
export OPAL_PREFIX=$mpi_usr
export PMIX_MCA_mca_base_component_path=$mpi_usr/lib/x86_64-linux-gnu/pmix2/lib/pmix
# One machine: shared memory between processes, started without ssh.
export OMPI_MCA_plm=isolated OMPI_MCA_btl=self,vader OMPI_MCA_pml=ob1 OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
EOF
  # A device call carries at most 64 MiB, this folder and the repository's files together: the binaries and libraries
  # without their symbols (a backtrace there still names the functions exported), and the total enforced here, where
  # it can be fixed, not found out on the device.
  strip --strip-unneeded "$carry/olmoref" "$carry"/tests/gpu/* "$carry"/bench/* "$carry"/lib/* 2> /dev/null || true
  local carried repo limit_mib=${GPU_CARRY_LIMIT_MIB:-64}
  carried=$(du -sb "$carry" | cut -f1)
  repo=$(git ls-files -z 2> /dev/null | du -cb --files0-from=- 2> /dev/null | tail -n 1 | cut -f1)
  repo=${repo:-0}
  echo "gpu-carry: $((carried >> 20)) MiB, the repository's files $((repo >> 20)) MiB: $(((carried + repo) >> 20)) of the" \
    "$limit_mib MiB a device call carries"
  if [ $((carried + repo)) -gt $((limit_mib << 20)) ]; then
    echo "gpu-carry: FAILED: $(((carried + repo) >> 20)) MiB is over the $limit_mib MiB a device call carries; the" \
      "largest carried files:" >&2
    find "$carry" -type f -printf '%s %P\n' | sort -rn | head -n 5 | awk '{printf "  %6.1f MiB  %s\n", $1 / 1048576, $2}' >&2
    exit 1
  fi
}
[ $check = 2 ] || fill
[ $check != 0 ] || exit 0
# A root holding the C/C++ runtime, bash and the carried folder: what a bare device machine has, and no more.
jail=$(mktemp -d)
cleanup() {
  umount "$jail/proc" 2> /dev/null || true
  umount "$jail/sys" 2> /dev/null || true
  # Never delete through a mount that is still there.
  if grep -q " $jail/" /proc/mounts; then echo "gpu_carry: $jail still has mounts; left in place" >&2; else rm -rf "$jail"; fi
}
trap cleanup EXIT
mkdir -p "$jail/tmp" "$jail/proc" "$jail/sys" "$jail/dev/shm" "$jail/work"
chmod 1777 "$jail/tmp" "$jail/dev/shm"
# bash and cmp with everything they load; of what the binaries load, only the runtime.
for f in /bin/bash /bin/cmp $(ldd /bin/bash /bin/cmp | awk '$3 ~ /^\// {print $3} /ld-linux/ {print $1}') \
  $(ldd "$carry/olmoref" | awk '$3 ~ /^\// {print $1 ":" $3}' | grep -E "$runtime" | cut -d: -f2); do
  mkdir -p "$jail$(dirname "$f")"
  cp -L "$f" "$jail$f"
done
cp -a "$carry" "$jail/carry"
python3 golden/traces/make_tiny_corpus.py "$jail/work/tiny.u16"
cp configs/tiny.toml "$jail/work/"
mount -t proc proc "$jail/proc"
mount -t sysfs sysfs "$jail/sys" 2> /dev/null || true  # hwloc reads the topology there; it works without
cat > "$jail/work/check.sh" << 'EOF'
set -uo pipefail
source /carry/env.sh
cd /work
for b in /carry/olmoref /carry/tests/gpu/* /carry/bench/*; do
  [ -e "$b" ] || continue
  libs=$(LD_TRACE_LOADED_OBJECTS=1 "$b")
  if [[ "$libs" == *"not found"* ]]; then echo "$libs"; echo "FAILED: $b cannot load a library"; exit 1; fi
  echo "$b: every library resolves"
done
run=(--config tiny.toml --steps 3 --set 'data.train_files=["/work/tiny.u16"]' --threads 1 --quiet)
/carry/olmoref train "${run[@]}" --out one || exit 1
mpirun -np 2 /carry/olmoref train "${run[@]}" --dp-replicate 2 --out two || exit 1
cmp one/trace.jsonl two/trace.jsonl || { echo "FAILED: 2 processes differ from one"; exit 1; }
echo "mpirun from gpu-carry/: 2 processes give the trace of one"
EOF
chroot "$jail" /bin/bash /work/check.sh
