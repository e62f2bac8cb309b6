#!/usr/bin/env bash
# meson test dist-gpu-map: one rank per GPU through mpirun, on stand-in GPUs (OLMOREF_TEST_FAKE_GPUS, executor
# cuda-host: the ranks' choice of a device, the check and the manifest run as on a device, the kernels on the host):
#   - 2 ranks, 2 GPUs: rank 0 drives device 0, rank 1 device 1; the manifest records both;
#   - 2 ranks, 1 GPU: refused on every rank, naming the ranks, the GPU and --allow-shared-gpu, before anything is
#     written; with --allow-shared-gpu both run on device 0 and the manifest says sharing was allowed; under
#     --transport nccl refused even with --allow-shared-gpu (NCCL refuses two ranks of a communicator on one GPU);
#   - the trace is the same bits whichever GPUs the ranks drive, and the same as without the stand-ins.
source "${OLMOREF_SOURCE_ROOT:?}/tests/common/shell_test.sh"
source "$SRC/tests/dist/mpi_env.sh"
fail() { echo "FAIL: $*"; exit 1; }
python3 "$SRC/tests/make_tokens.py" "$work/tokens.u16" 3 40000
cfg=(--config "$SRC/configs/tiny.toml" --set "data.train_files=[\"$work/tokens.u16\"]" --set eval.interval=0
     --set train.executor=\"cuda-host\" --steps 2 --threads 1 --dp-shard 2 --comm-timeout 60)
run() {  # run NAME FAKE_GPUS EXTRA...: its exit status in $rc
  local name=$1 fake=$2
  shift 2
  rc=0
  "${MPIRUN[@]}" -np 2 -x OLMOREF_TEST_FAKE_GPUS="$fake" "$BIN" train "${cfg[@]}" --out "$work/$name" "$@" \
    > "$work/$name.log" 2>&1 || rc=$?
}
manifest_gpus() {  # the manifest's (rank, device, id) per rank, and allow_shared_gpu
  python3 -c 'import json, sys; m = json.load(open(sys.argv[1]))
print(" ".join("%s:%s:%s" % (g["rank"], g["device"], g["id"]) for g in m["gpus"]), m["allow_shared_gpu"])' "$work/$1/manifest.json"
}

run two 2
[ $rc = 0 ] || { cat "$work/two.log"; fail "2 ranks on 2 GPUs: exit $rc"; }
grep -q "gpu: rank 1 on .*: device 1 " "$work/two.log" || { cat "$work/two.log"; fail "rank 1 did not report device 1"; }
[ "$(manifest_gpus two)" = "0:0:fake-gpu-0 1:1:fake-gpu-1 False" ] || fail "manifest: $(manifest_gpus two)"
echo "ok: 2 ranks, 2 GPUs: $(manifest_gpus two)"

run shared 1
[ $rc != 0 ] || fail "2 ranks on 1 GPU ran without --allow-shared-gpu"
[ "$(grep -c "fatal: 2 ranks (0, 1) would drive one GPU on .*fake-gpu-0.*--allow-shared-gpu" "$work/shared.log")" = 2 ] ||
  { cat "$work/shared.log"; fail "2 ranks on 1 GPU: want the refusal on both ranks"; }
[ ! -e "$work/shared/manifest.json" ] && [ ! -e "$work/shared/trace.jsonl" ] || fail "a refused run wrote its records"
echo "ok: refused: $(grep -m1 -o "2 ranks (0, 1) would drive one GPU.\{0,60\}" "$work/shared.log")"

run nccl-shared 1 --allow-shared-gpu --transport nccl
[ $rc != 0 ] || fail "2 ranks on 1 GPU ran under --transport nccl"
[ "$(grep -c "fatal: 2 ranks (0, 1) would drive one GPU on .* under --transport nccl, and NCCL refuses" "$work/nccl-shared.log")" = 2 ] ||
  { cat "$work/nccl-shared.log"; fail "2 ranks on 1 GPU under nccl: want the refusal on both ranks"; }
echo "ok: refused under --transport nccl even with --allow-shared-gpu"

run allowed 1 --allow-shared-gpu
[ $rc = 0 ] || { cat "$work/allowed.log"; fail "--allow-shared-gpu: exit $rc"; }
[ "$(manifest_gpus allowed)" = "0:0:fake-gpu-0 1:0:fake-gpu-0 True" ] || fail "manifest: $(manifest_gpus allowed)"
echo "ok: --allow-shared-gpu: $(manifest_gpus allowed)"

"${MPIRUN[@]}" -np 2 "$BIN" train "${cfg[@]}" --out "$work/plain" > "$work/plain.log" 2>&1 ||
  { cat "$work/plain.log"; fail "the run without stand-ins"; }
python3 -c 'import json, sys; assert "gpus" not in json.load(open(sys.argv[1]))' "$work/plain/manifest.json" ||
  fail "a run that drives no GPU recorded GPUs"
cmp "$work/two/trace.jsonl" "$work/allowed/trace.jsonl" && cmp "$work/two/trace.jsonl" "$work/plain/trace.jsonl" ||
  fail "the trace depends on the GPUs the ranks drive"
echo "ok: the same trace on 2 GPUs, on 1 shared, and without the stand-ins"
echo "PASS: dist-gpu-map"
