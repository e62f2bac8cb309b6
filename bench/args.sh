# bench/args.sh — sourced by the training benchmarks (moe_bench.sh, moe_ep_bench.sh, vs_pytorch.sh): their flags
# all take one value, so one reader serves them, and each then needs the built binary.
#
# bench_args SCRIPT FLAG=VAR... -- ARG...: sets VAR to the value after each --FLAG in ARG... (the script's defaults
# stand for flags not given), then `bin` to $build/olmoref; exits 2 on a flag not listed, 1 when bin is missing.
# SCRIPT names the benchmark in its messages.
bench_args() {
  local script="$1"
  shift
  local -A var_of=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do
    var_of["--${1%%=*}"]="${1#*=}"
    shift
  done
  shift
  while [ $# -gt 0 ]; do
    if [ -z "${var_of[$1]:-}" ]; then
      echo "$script: unknown argument '$1' (see the header for usage)" >&2
      exit 2
    fi
    printf -v "${var_of[$1]}" '%s' "$2"
    shift 2
  done
  bin="$build/olmoref"
  [ -x "$bin" ] || { echo "$script: missing $bin: run bash tools/build.sh first" >&2; exit 1; }
}
