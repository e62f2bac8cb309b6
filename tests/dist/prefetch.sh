#!/usr/bin/env bash
# meson test dist-prefetch: FSDP's prefetch (dist::UnitGather, train's default) changes no bit and gathers what it
# announces. The model announces the unit it acquires next (ParamGate::prefetch); the gate gathers it on a thread of
# its own, on its own communicator, while the model works on the unit in hand. Checked:
#   - the traces (loss, gradient norm, the digest of every parameter's bits, every step) at 2x1, 3x1 (a rank idle in a
#     round), 2x2, on the CUDA executor's host execution at 2x1 and 2x2 (its prefetch lands the unit in a second
#     buffer), bf16 with recompute at 4x1, a mixture of experts with expert parallelism (tiny-moe, EP 2 at 2x2) and
#     context parallelism (CP 2 at 4x1, masked), each with the prefetch, with `--no-prefetch` and with the
#     negative control `--debug-prefetch-other-unit` (every prefetch gathers the wrong unit, so every acquire gathers
#     again on the spot: the fallback path), all equal to the single process's byte for byte;
#   - on cuda-host the side stream's copies run late on a worker thread; the control that skips the acquire's wait for
#     them (`--debug-prefetch-no-stream-wait`) must change the trace;
#   - on cuda-host the owners' gradient exchange and adds run on a thread of their own (with the prefetch, over MPI on
#     a device executor): 20 ms late they keep the traces at 2x1 and 2x2, and the control that reads the reduced
#     gradient before the last unit's thread ends (`--debug-exchange-no-wait`) must change the trace; the subtrees'
#     copies from their device block to the host's (a side stream of their own) 5 ms late keep the traces at 2x2, and
#     the controls whose thread sends before they land (`--debug-exchange-no-staging-wait`) or whose backward refills
#     the device block before they read it (`--debug-exchange-no-refill-wait`) must change the trace;
#   - the count of gathers (`--report-comm`): per training pass of L blocks, 2L + 3 acquires (L + 2 units forward,
#     the head and L blocks backward), of which only the first (the embedding) is gathered on the spot and every other
#     served by the prefetch; none prefetched with --no-prefetch or the control; the bytes of each collective the
#     same with and without the prefetch (what `olmoref config --time` predicts);
#   - the exchanges' host staging (Executor::allocate_staging: page-locked on a device, slow to make) is made a few
#     times a step, never per unit: at most 10 blocks a step on every rank in every run (the unit gather's two, the
#     owners' send and receive blocks (under the exchange thread one send block on the host, whose twin is on the
#     device), the replicas' two), where a block per gather would be 2 per unit acquired (2 x 11 a pass of tiny).
source "${OLMOREF_SOURCE_ROOT:?}/tests/common/shell_test.sh"
source "$SRC/tests/dist/mpi_env.sh"
python3 "$SRC/tests/make_tokens.py" "$work/tokens.u16" 13 60000
base=(--set "data.train_files=[\"$work/tokens.u16\"]" --set eval.interval=0 --steps 3 --threads 1 --quiet
      --no-checkpoint)
tiny=(--config "$SRC/configs/tiny.toml")
moe=(--config "$SRC/configs/tiny-moe.toml" --set train.global_batch_instances=8 --set train.micro_batch_instances=2)
masked=("${tiny[@]}" --set data.eos_id=511 --set data.document_masking=true --set train.seq_len=48)
bf16=("${tiny[@]}" --set 'train.precision="bf16"' --set 'train.activation_checkpointing="full"')

single() {  # single NAME ARGS...: the reference, one process
  local name=$1
  shift
  "$BIN" train "${base[@]}" "$@" --out "$work/$name" 2> "$work/$name.log" || { cat "$work/$name.log"; echo "FAIL: $name"; exit 1; }
}
ranks() {  # ranks NAME SxR ARGS...: an mpirun at that layout, --report-comm
  local name=$1 s=${2%x*} r=${2#*x}
  shift 2
  "${MPIRUN[@]}" -np $((s * r)) "$BIN" train "${base[@]}" "$@" --dp-shard "$s" --dp-replicate "$r" --report-comm \
    --out "$work/$name" --comm-timeout 60 2> "$work/$name.log" || { cat "$work/$name.log"; echo "FAIL: $name"; exit 1; }
}
same() {  # same REFERENCE RUN
  cmp "$work/$1/trace.jsonl" "$work/$2/trace.jsonl" || { echo "FAIL: $2 differs from $1"; exit 1; }
}
gathers() {  # gathers RUN: "P S" per rank, rank order (prefetched, on the spot)
  sed -nE 's/^rank ([0-9]+): FSDP unit gathers in [0-9]+ steps: ([0-9]+) prefetched, ([0-9]+) on the spot$/\1 \2 \3/p' \
    "$work/$1.log" | sort -n | cut -d' ' -f2-
}
staging() {  # staging RUN: every rank made its exchange staging at most 10 times a step (3 steps)
  local counts
  counts=$(sed -nE 's/^rank [0-9]+: exchange staging in 3 steps: ([0-9]+) blocks made, .*/\1/p' "$work/$1.log")
  [ -n "$counts" ] || { echo "FAIL: $1: no rank reported its exchange staging"; exit 1; }
  for n in $counts; do
    [ "$n" -le 30 ] ||
      { echo "FAIL: $1: $n staging blocks made in 3 steps (at most 30: made per step, not per unit)"; exit 1; }
  done
}
bytes() {  # bytes RUN: every rank's bytes per collective, sorted
  grep -E "^rank [0-9]+: sent [0-9]+ bytes in" "$work/$1.log" | sort
}
# check NAME SxR PASSES UNITS ARGS...: the three runs of one case against the single process NAME. PASSES: training
# passes per rank in the run (3 steps x rounds), UNITS: the model's blocks + 2.
check() {
  local name=$1 layout=$2 passes=$3 units=$4
  shift 4
  local want_on="" want_off="" i acquires=$(((2 * units - 1) * passes)) world=$((${layout%x*} * ${layout#*x}))
  for ((i = 0; i < world; i++)); do
    want_on+="$(((2 * units - 2) * passes)) $passes"$'\n'
    want_off+="0 $acquires"$'\n'
  done
  ranks "$name-$layout" "$layout" "$@"
  ranks "$name-$layout-off" "$layout" "$@" --no-prefetch
  ranks "$name-$layout-other" "$layout" "$@" --debug-prefetch-other-unit
  for run in "$name-$layout" "$name-$layout-off" "$name-$layout-other"; do same "$name" "$run"; staging "$run"; done
  [ "$(gathers "$name-$layout")" = "${want_on%$'\n'}" ] ||
    { gathers "$name-$layout"; echo "FAIL: $name-$layout: want per rank: ${want_on%%$'\n'*} (prefetched, on the spot)"; exit 1; }
  for run in "$name-$layout-off" "$name-$layout-other"; do
    [ "$(gathers "$run")" = "${want_off%$'\n'}" ] ||
      { gathers "$run"; echo "FAIL: $run: want per rank: 0 $acquires (prefetched, on the spot)"; exit 1; }
  done
  [ "$(bytes "$name-$layout")" = "$(bytes "$name-$layout-off")" ] ||
    { diff <(bytes "$name-$layout") <(bytes "$name-$layout-off"); echo "FAIL: $name-$layout: bytes differ"; exit 1; }
  cmp -s <(bytes "$name-$layout") <(bytes "$name-$layout-other") &&
    { echo "FAIL: $name-$layout-other: the control's wasted gathers unseen in the bytes"; exit 1; }
  echo "$name $layout: identical with the prefetch, without it and with the control; per rank $((acquires - passes)) of $acquires gathers prefetched"
}

# tiny (and tiny-moe as set here): 8 instances in micro-batches of 2 = 4 micro-batches a step; tiny has 4 blocks (6
# units).
single plain "${tiny[@]}"
check plain 2x1 6 6 "${tiny[@]}"           # 2 rounds a step
check plain 3x1 6 6 "${tiny[@]}"           # 2 rounds, a rank idle in the second (an idle pass gathers too)
check plain 2x2 3 6 "${tiny[@]}"
# The CUDA executor's host execution: its prefetch thread also lands the unit in a second unit buffer (on a device by
# the side stream's copies, dist::UnitGather::land), the buffers swapping at each hit; a miss waits for it first. Its
# side stream is a worker thread that runs each copy 200 us after it is queued, so a wait the device needs and the
# code lacks shows in the bits: the control that skips the acquire's wait must change the trace.
export OLMOREF_TEST_HOST_STREAM_DELAY_US=200
single cudahost "${tiny[@]}" --executor cuda-host
check cudahost 2x1 6 6 "${tiny[@]}" --executor cuda-host
check cudahost 2x2 3 6 "${tiny[@]}" --executor cuda-host
ranks cudahost-2x1-no-wait 2x1 "${tiny[@]}" --executor cuda-host --debug-prefetch-no-stream-wait
cmp -s "$work/cudahost/trace.jsonl" "$work/cudahost-2x1-no-wait/trace.jsonl" &&
  { echo "FAIL: the control that skips the side stream's wait kept the trace: the delayed copies are not seen"; exit 1; }
echo "cudahost 2x1: without the acquire's wait for the side stream the trace changes, as it must"
# The owners' exchange thread (dist::ExchangeOverlap, on with the prefetch over MPI on a device executor: the runs above
# took it, --no-prefetch not): a unit's all-to-alls and the owners' adds under the next unit's backward, waited for when
# that one ends, the adds' copies and tree adds on a side stream (here a worker, each task 200 us late) that the
# thread waits for before the next chunk's all-to-all refills their receive block. Each thread pausing 20 ms before
# its all-to-alls keeps the trace (at 2x2 in 3 chunks a unit); the controls that read the step's reduced gradient
# before the last unit's thread is waited for (its adds follow its start at once), and whose thread does not wait for
# its side stream, must change the trace.
export OLMOREF_TEST_EXCHANGE_DELAY_US=20000
ranks cudahost-2x1-exchange-late 2x1 "${tiny[@]}" --executor cuda-host
ranks cudahost-2x2-exchange-late 2x2 "${tiny[@]}" --executor cuda-host --debug-exchange-chunks 3
for layout in 2x1 2x2; do same cudahost "cudahost-$layout-exchange-late"; done
exchange_control() {  # exchange_control CONTROL WHAT: at 2x1, --debug-exchange-CONTROL must change the trace
  ranks "cudahost-2x1-exchange-$1" 2x1 "${tiny[@]}" --executor cuda-host "--debug-exchange-$1"
  cmp -s "$work/cudahost/trace.jsonl" "$work/cudahost-2x1-exchange-$1/trace.jsonl" &&
    { echo "FAIL: $2: the control --debug-exchange-$1 kept the trace"; exit 1; }
  return 0
}
for control in no-wait no-stream-wait; do exchange_control "$control" "the owners' exchange thread"; done
echo "cudahost 2x1 and 2x2: the owners' exchange thread 20 ms late keeps the trace; the gradient read before it ends," \
     "or a thread that does not wait for its side stream, changes it"
# Its subtrees reach the host without a blocking copy: the backward writes them to a device block, which a side stream
# of their own copies to the host's when the unit's backward ends; the thread waits for that copy before its first
# all-to-all, and the next unit's first subtree has the executor wait for it before refilling the block. Those
# copies 5 ms late (the thread on time) keep the trace (at 2x2 in 3 chunks a unit); the controls that skip either
# wait must change it.
export OLMOREF_TEST_HOST_STREAM_DELAY_US=5000 OLMOREF_TEST_EXCHANGE_DELAY_US=0
ranks cudahost-2x2-staging-late 2x2 "${tiny[@]}" --executor cuda-host --debug-exchange-chunks 3
same cudahost cudahost-2x2-staging-late
for control in no-staging-wait no-refill-wait; do exchange_control "$control" "the subtrees' copy to the host"; done
echo "cudahost 2x2: the subtrees' copies to the host 5 ms late keep the trace; a thread that sends before they land," \
     "or a backward that refills their device block before they read it, changes it"
unset OLMOREF_TEST_HOST_STREAM_DELAY_US OLMOREF_TEST_EXCHANGE_DELAY_US
single bf16 "${bf16[@]}"
check bf16 4x1 3 6 "${bf16[@]}"
single moe "${moe[@]}"
moe_units=$(($(sed -nE 's/^n_layers *= *([0-9]+).*/\1/p' "$SRC/configs/tiny-moe.toml") + 2))
check moe 2x2 3 "$moe_units" "${moe[@]}" --ep 2
single masked "${masked[@]}"
check masked 4x1 6 6 "${masked[@]}" --cp 2   # CP 2 over 4 ranks: 2 groups, each rank in all 4 micro-batches' halves
echo "PASS"
