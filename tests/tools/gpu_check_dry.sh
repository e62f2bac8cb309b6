#!/usr/bin/env bash
# meson test tools-gpu-check-dry-run: the device check (tools/gpu_check.sh) proved here, without a GPU, so the first
# device session is not spent on the script:
#   1. what gpu_carry.sh carries loads on a machine with nothing but the C/C++ runtime (a chroot), including mpirun
#      and two processes training like one; with one carried library taken away, the check fails; a carry over its
#      size limit (with the repository, 64 MiB; a planted 5 here) is refused, naming its largest files;
#   2. `gpu_check.sh --dry-run` runs every step end to end with the kernels' host execution (executor cuda-host) and
#      passes; what lands in OUT keeps the device tool's limits (at most 8 files; names of letters, digits, '.',
#      '_', '-'); summary.json lists the steps in order; bench.json has a row per run and the profile's (and
#      gpu_bench.sh keeps the gemm_bench rows written before its own); the second step-time model takes the
#      profile's attention rate; the kernels step checked the
#      real-step shapes (a sample, through the host execution) and the bench step built gemm_bench's and
#      attention_bench's shape lists and printed the step-time model (config --time);
#   3. a planted failure in a middle step (training) still returns the logs of the steps before it, and the steps
#      after it still run (a planted run's kernels step is the decomposition alone: part 2 ran the kernels); a
#      planted failure in the preflight stops the script at once, saying why;
#   4. the device's command lines: the dry run went through the stand-ins (tools/standins/) for nvidia-smi and
#      compute-sanitizer, which accept only the lines the device run gives the real tools (the line that once wrapped
#      test_gpu_kernels as a --tool is refused), and test_gpu_kernels read each step's own arguments (--parse-only:
#      an unknown one, or an unknown family, fails the step); the step limits add up to at most the 360 s budget (a
#      start, a run and a rerun in 15 minutes); gemm_bench runs first in the bench step (a runtime without
#      compute-sanitizer is part 3's planted run: the sanitizer steps recorded as not run, 126, not counted as
#      failures).
source "${OLMOREF_SOURCE_ROOT:?}/tests/common/shell_test.sh"
BUILD="$OLMOREF_BUILD_ROOT"
cd "$SRC"

echo "== 1. the carried folder on a bare root"
if [ "$(id -u)" = 0 ] && chroot / true 2> /dev/null; then
  GPU_CARRY_DIR=$work/carry bash tools/gpu_carry.sh --build "$BUILD" --check
  rm "$work/carry/lib/libzstd.so.1"
  if GPU_CARRY_DIR=$work/carry bash tools/gpu_carry.sh --check-only > "$work/missing.log" 2>&1; then
    cat "$work/missing.log"; echo "FAIL: the check passed with libzstd taken out of the carried libraries"; exit 1
  fi
  grep -q "FAILED: /carry/olmoref cannot load a library" "$work/missing.log"
  echo "a carried library taken out: the check fails, naming the binary"
  rm -rf "$work/carry"
else
  echo "NOTE: the chroot check needs root; not checked here"
fi

# The carry's size is enforced where it can be fixed: over the limit (a planted 5 MiB) the fill fails naming the
# largest files.
if GPU_CARRY_LIMIT_MIB=5 GPU_CARRY_DIR=$work/small bash tools/gpu_carry.sh --build "$BUILD" > "$work/small.log" 2>&1; then
  cat "$work/small.log"; echo "FAIL: a carry over a 5 MiB limit was accepted"; exit 1
fi
grep -q "gpu-carry: FAILED: .* MiB is over the 5 MiB a device call carries" "$work/small.log" &&
  grep -q " MiB  olmoref$" "$work/small.log" || { cat "$work/small.log"; echo "FAIL: the size refusal"; exit 1; }
rm -rf "$work/small"
echo "a carry over its limit: refused, naming its largest files"

check_out() {  # check_out DIR: the device tool's limits on what comes back
  python3 - "$1" <<'PY'
import os, re, sys
files = sorted(os.listdir(sys.argv[1]))
assert len(files) <= 8, f"{len(files)} files under OUT: {files}"
for f in files:
    assert re.fullmatch(r"[A-Za-z0-9._-]+", f), f"bad name {f!r}"
    assert os.path.isfile(os.path.join(sys.argv[1], f)), f"{f} is not a plain file"
print("OUT:", " ".join(files))
PY
}
steps='["preflight", "kernels", "bench", "training", "memcheck", "racecheck"]'

echo "== 2. the dry run"
OUT=$work/dry GPU_CHECK_BINARIES=$BUILD bash tools/gpu_check.sh --dry-run || { cat "$work/dry/checks.log"; exit 1; }
check_out "$work/dry"
python3 - "$work/dry" "$steps" <<'PY'
import json, sys
d, steps = sys.argv[1], json.loads(sys.argv[2])
s = json.load(open(f"{d}/summary.json"))
assert [r["check"] for r in s] == steps, s
assert all(r["exit"] == 0 for r in s), s
b = json.load(open(f"{d}/bench.json"))
profile = [r for r in b if r["bench"] == "profile"]
b = [r for r in b if r["bench"] != "profile"]
assert [(r["bench"], r["config"], r["precision"]) for r in b] == [("train", "tiny", "fp32"), ("train", "tiny", "bf16")], b
assert [(r["config"], r["precision"]) for r in profile] == [("tiny", "fp32")], profile
profile = profile[0]
assert profile["attention_seconds"] > 0 and profile["attention_flops"] > 0 and profile["gemm_flops"] > 0, profile
assert all(r["tokens_per_second"] > 0 for r in b), b
# The step time with and without the parameter digest, from the progress lines' own timings.
assert all(r["steps_timed"] > 0 and len(r["digest_seconds_each"]) == r["steps_timed"] for r in b), b
assert all(0 <= r["digest_share_of_step"] < 1 and r["tokens_per_second_without_digest"] >= r["tokens_per_second"] for r in b), b
log = open(f"{d}/checks.log").read()
for step in steps:
    assert f"===== {step} " in log, step
kernels_log = log[log.index("===== kernels "):log.index("===== bench ")]
for case in ("gemm 2048x8192x2048", "lm_head dW [100352, 2048]", "attention T 2048 hd 128 window 1024",
             "attention T 8192 hd 128 full causal", "cross-entropy V 100352"):
    assert f"real shape {case}" in kernels_log, f"the kernels step did not check the real shape {case}"
if "gemm_bench: not run" not in log:
    assert "gemm_bench --dry-run: 24 shapes" in log, "the bench step did not build gemm_bench's shape list"
if "attention_bench: not run" not in log:
    # Each of olmo3-100m, -1b and -7b: its sliding window and full causal.
    assert "attention_bench --dry-run: 6 shapes" in log, "the bench step did not build attention_bench's shape list"
    assert "olmo3-7b    sliding window 4096 " in log, "attention_bench's shapes lack the 7B's sliding window"
bench_log = log[log.index("===== bench "):log.index("===== training ")]
assert "step time at 8x1, 8 ranks per node" in bench_log and "  step  " in bench_log, \
    "the bench step did not print the step-time model"
assert "exact attention " in bench_log.split("== the step-time model at the measured GEMM and attention rates")[1], \
    "the bench step's second step-time model did not take the profile's attention rate"
third = bench_log.split("== the step-time model at the 7B's own attention rate")
assert len(third) == 2 and "step time at 8x1" in third[1], "the bench step did not print the model a third time"
print("dry run: every step passed;", ", ".join(f"{r['check']} {r['seconds']}s" for r in s))
PY

# On the device gemm_bench writes its rows to bench.json first, then gpu_bench.sh adds the training runs': they must
# keep gemm_bench's (they once rewrote the file from their own rows alone). A gemm row as gemm_bench writes it, then
# gpu_bench.sh on the tiny config as the dry run runs it.
mkdir -p "$work/merge"
echo '[ {"bench": "gemm", "config": "olmo3-1b", "product": "lm_head forward", "exact_seconds": 0.05, "exact_tflops": 20}
]' > "$work/merge/bench.json"
BENCH_EXECUTOR=cuda-host BENCH_CONFIGS=configs/tiny.toml BENCH_STEPS=2 bash bench/gpu_bench.sh "$work/merge" "$BUILD/olmoref" \
  > "$work/merge.log" 2>&1 || { cat "$work/merge.log"; echo "FAIL: gpu_bench.sh after a gemm row"; exit 1; }
python3 - "$work/merge/bench.json" <<'PY'
import json, sys
b = json.load(open(sys.argv[1]))
assert [r["bench"] for r in b] == ["gemm", "train", "train", "profile"], [r.get("bench") for r in b]
assert b[0]["product"] == "lm_head forward" and b[0]["exact_tflops"] == 20, b[0]
print("gpu_bench.sh keeps the gemm rows before its own")
PY

echo "== 3. planted failures"
# Also a runtime without compute-sanitizer (GPU_CHECK_SANITIZER, TEST ONLY): the steps after the failure still run,
# the sanitizer steps recorded as not run (126), which the final count does not take for failures.
if OUT=$work/plant GPU_CHECK_BINARIES=$BUILD GPU_CHECK_PLANT=training GPU_CHECK_SANITIZER=no-such-sanitizer \
   bash tools/gpu_check.sh --dry-run; then
  echo "FAIL: a planted failure in training, and the script exits 0"; exit 1
fi
check_out "$work/plant"
python3 - "$work/plant" "$steps" <<'PY'
import json, sys
d, steps = sys.argv[1], json.loads(sys.argv[2])
s = {r["check"]: r["exit"] for r in json.load(open(f"{d}/summary.json"))}
assert list(s) == steps, s
assert s["training"] == 3 and s["memcheck"] == 126 and s["racecheck"] == 126, s
assert all(s[k] == 0 for k in steps if k not in ("training", "memcheck", "racecheck")), s
summary = open(f"{d}/summary.txt").read()
assert "not run: no-such-sanitizer is not on this runtime" in summary, summary
assert "gpu_check: 1 step(s) failed, 2 not run for want of no-such-sanitizer" in summary, summary
log = open(f"{d}/checks.log").read()
assert "planted failure (GPU_CHECK_PLANT=training)" in log
assert log.index("===== kernels ") < log.index("[doctest] Status: SUCCESS") < log.index("===== training "), \
    "the kernels' log before the failure"
assert len(json.load(open(f"{d}/bench.json"))) == 3, "the bench rows before the failure (two runs, a profile)"
print("planted training failure: the logs before it came back and the steps after it ran; no compute-sanitizer: "
      "memcheck and racecheck not run (126), not counted as failures")
PY
if OUT=$work/pre GPU_CHECK_BINARIES=$BUILD GPU_CHECK_PLANT=preflight bash tools/gpu_check.sh --dry-run; then
  echo "FAIL: a planted preflight failure, and the script exits 0"; exit 1
fi
check_out "$work/pre"
grep -q "stopped after the preflight" "$work/pre/summary.txt"
if grep -q "===== kernels" "$work/pre/checks.log"; then echo "FAIL: steps ran after a failed preflight"; exit 1; fi
echo "planted preflight failure: stopped at once, the reason in summary.txt"
echo "== 4. the device's command lines"
python3 - "$work/dry" "$BUILD/tests/gpu/test_gpu_kernels" <<'PY'
import os, re, sys
d = sys.argv[1]
log, device = open(f"{d}/checks.log").read(), open(f"{d}/device.txt").read()
assert "stand-in GPU (dry run)" in device, "the preflight did not query nvidia-smi as the device run does"
mem = log[log.index("===== memcheck "):log.index("===== racecheck ")]
race = log[log.index("===== racecheck "):]
for exe in ("test_decomposition", "test_executor", "olmoref"):
    assert f"compute-sanitizer (stand-in): --tool memcheck, running {exe}" in mem, f"memcheck did not wrap {exe}"
assert "compute-sanitizer (stand-in): --tool racecheck, running test_decomposition" in race
kern = log[log.index("===== kernels "):log.index("===== bench ")]
assert "compute-sanitizer" not in kern, "the kernels step runs its program bare"
if os.access(sys.argv[2], os.X_OK):  # test_gpu_kernels read each step's arguments (--parse-only) as the device's
    for name, part in (("kernels", kern), ("memcheck", mem), ("racecheck", race)):
        assert "test_gpu_kernels: arguments read" in part, f"the {name} step did not check test_gpu_kernels' arguments"
limits = [int(x) for x in re.findall(r"^===== \S+ \(limit (\d+)s\)", log, re.M)]
assert len(limits) == 6 and sum(limits) <= 360, limits
assert 2 * sum(limits) + 120 <= 900, "a start, a run and a rerun must fit 15 minutes"
bench = log[log.index("===== bench "):log.index("===== training ")]
assert bench.splitlines()[1].startswith("gemm_bench"), "gemm_bench, the cheapest figure, runs first: " + bench[:300]
print("device lines: nvidia-smi and compute-sanitizer stand-ins took the device's lines; limits", limits)
PY
if "$SRC/tools/standins/compute-sanitizer" --error-exitcode 9 --tool "$BUILD/olmoref" --help > "$work/bad.log" 2>&1; then
  echo "FAIL: the stand-in accepted a program given as the --tool"; exit 1
fi
grep -q "is not a sanitizer tool" "$work/bad.log"
# What that reading catches: an argument test_gpu_kernels does not take, and a family --only names that is none.
if [ -x "$BUILD/tests/gpu/test_gpu_kernels" ]; then
  for bad in "--no-hold" "--only gemm,atention"; do
    # shellcheck disable=SC2086  # the planted line's words
    if "$BUILD/tests/gpu/test_gpu_kernels" $bad --parse-only > "$work/bad.log" 2>&1; then
      echo "FAIL: test_gpu_kernels $bad --parse-only accepted a wrong argument"; exit 1
    fi
  done
  echo "test_gpu_kernels --parse-only refuses an unknown argument and an unknown family"
fi
echo "gpu check dry run: ok"
