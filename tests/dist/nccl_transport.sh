#!/usr/bin/env bash
# meson test dist-nccl-transport: the NCCL transport (`train --transport nccl`, dist/nccl_comm.h) changes no bit and
# issues the MPI transport's plan. CI has no GPU, so a stand-in NCCL over MPI (tests/dist/nccl_standin.cpp, argument
# 1, preloaded) moves the buffers of the CUDA executor's host execution (cuda-host), and olmoref's NCCL path runs
# whole: its bootstrap, its plans, its groups of sends and receives straight between executor buffers. Checked, at
# 2x1, 3x1 (a rank idle in a round), 2x2 (replicas: the parameter all-gather), context parallelism (CP 2 at 2x1,
# masked: attention's gathers and the chains' partials) and a mixture of experts under expert
# parallelism with expert-resident state (tiny-moe, EP 2 at 2x2: partial units, held pieces, the expert rows; and at
# 2x2 with a rank idle beside a busy one in its EP group):
#   - the traces (loss, gradient norm, the digest of every parameter's bits, every step) of the NCCL run, the MPI run
#     and the single process, byte for byte (both without the prefetch, so that the exchanges keep their order);
#   - the plan: every rank's exchanges in the order issued, each with its bytes to and from every peer (the stand-in
#     records NCCL's groups and, through MPI's profiling interface, the MPI all-to-alls and all-gathers), the same
#     lines in the NCCL run as in the MPI run; NCCL carried the FSDP gathers, the owners' exchange, (2x2) the
#     parameter all-gather and (EP) the expert rows; `--report-comm`'s bytes per collective the same;
#   - NCCL's prefetch (the default; a second unit buffer, a stream of its own on a device): the same traces and the
#     same exchanges (sorted), every acquire but each pass's first served by it; its control all on the spot; its
#     groups run 200 us late on the stand-in's side stream, and the control whose acquire skips the wait for that
#     stream (--debug-prefetch-no-stream-wait) changes the trace;
#   - the owners' exchange under the next unit's backward (on with the prefetch: dist::ExchangeOverlap): every group
#     of the world communicator on a side stream (on the default one without the prefetch), the owners' adds queued
#     after them there, 200 us late; the same traces (also in 3 chunks a unit, and beside CP 2's groups); the controls
#     whose executor does not wait for that stream (--debug-exchange-no-stream-wait) or reads the reduced gradient
#     before it (--debug-exchange-no-wait) change the trace;
#   - NCCL groups cut under a limit of 2 operations (--debug-nccl-group-ops; NCCL's own is 2048): the same traces;
#   - a control: the NCCL run with the owners' exchange in other chunks (--debug-exchange-chunks) keeps the traces and
#     fails the plan check, so the check sees a plan that differs;
#   - the memory model puts the exchange's blocks on the device under nccl and on the host under mpi;
#   - refusals: --transport nccl with the CPU executor, and with cuda-host without the stand-in, name the fix.
source "${OLMOREF_SOURCE_ROOT:?}/tests/common/shell_test.sh"
source "$SRC/tests/dist/mpi_env.sh"
standin=${1:?the stand-in NCCL library}
[ -f "$standin" ] || { echo "FAIL: no stand-in NCCL at $standin"; exit 1; }
python3 "$SRC/tests/make_tokens.py" "$work/tokens.u16" 13 60000
common=(--set "data.train_files=[\"$work/tokens.u16\"]" --set eval.interval=0 --steps 3 --threads 1 --quiet
        --no-checkpoint)
base=("${common[@]}" --executor cuda-host)
tiny=(--config "$SRC/configs/tiny.toml")
moe=(--config "$SRC/configs/tiny-moe.toml" --set train.global_batch_instances=8 --set train.micro_batch_instances=2)

single() {  # single NAME ARGS...: the reference, one process
  local name=$1
  shift
  "$BIN" train "${base[@]}" "$@" --out "$work/$name" 2> "$work/$name.log" || { cat "$work/$name.log"; echo "FAIL: $name"; exit 1; }
}
ranks() {  # ranks NAME SxR ARGS...: an mpirun at that layout with the stand-in loaded, its records in NAME.plan/
  local name=$1 s=${2%x*} r=${2#*x}
  shift 2
  mkdir -p "$work/$name.plan"
  "${MPIRUN[@]}" -np $((s * r)) env LD_PRELOAD="$standin" OLMOREF_NCCL_STANDIN_LOG="$work/$name.plan" \
    "$BIN" train "${base[@]}" "$@" --dp-shard "$s" --dp-replicate "$r" --report-comm --out "$work/$name" \
    --comm-timeout 60 2> "$work/$name.log" || { cat "$work/$name.log"; echo "FAIL: $name"; exit 1; }
}
same_trace() {  # same_trace REFERENCE RUN
  cmp "$work/$1/trace.jsonl" "$work/$2/trace.jsonl" || { echo "FAIL: $2's trace differs from $1's"; exit 1; }
}
bytes() {  # bytes RUN: every rank's bytes per collective, sorted (but NCCL's bootstrap: its unique id, handed out once)
  grep -E "^rank [0-9]+: sent [0-9]+ bytes in" "$work/$1.log" | grep -v ": NCCL: the group's unique id$" | sort
}
same_plan() {  # same_plan MPI_RUN NCCL_RUN WORLD: 0 when every rank issued the same exchanges
  local r
  for ((r = 0; r < $3; r++)); do
    cmp -s "$work/$1.plan/rank$r.log" "$work/$2.plan/rank$r.log" || return 1
  done
}
nccl_groups() {  # nccl_groups RUN WORLD: NCCL groups per rank, one line
  local r out=""
  for ((r = 0; r < $2; r++)); do out+="$(cat "$work/$1.plan/rank$r.nccl" 2> /dev/null | wc -l) "; done
  echo "${out% }"
}
# check NAME SxR ARGS...: the MPI and NCCL runs of one case against the single process NAME.
check() {
  local name=$1 layout=$2 world=$((${2%x*} * ${2#*x}))
  shift 2
  ranks "$name-$layout-mpi" "$layout" "$@" --transport mpi --no-prefetch
  ranks "$name-$layout-nccl" "$layout" "$@" --transport nccl --no-prefetch
  same_trace "$name" "$name-$layout-mpi"
  same_trace "$name" "$name-$layout-nccl"
  ! grep -q " stream side " "$work/$name-$layout-nccl.plan/"rank*.nccl ||
    { echo "FAIL: $name $layout: with --no-prefetch a group ran on a side stream"; exit 1; }
  same_plan "$name-$layout-mpi" "$name-$layout-nccl" "$world" || {
    diff "$work/$name-$layout-mpi.plan/rank0.log" "$work/$name-$layout-nccl.plan/rank0.log" | head -20
    echo "FAIL: $name $layout: the NCCL run's exchanges differ from the MPI run's"; exit 1; }
  local groups
  groups=$(nccl_groups "$name-$layout-nccl" "$world")
  [[ " $groups " != *" 0 "* ]] || { echo "FAIL: $name $layout: a rank issued no NCCL group ($groups)"; exit 1; }
  [ "$(nccl_groups "$name-$layout-mpi" "$world")" = "$(printf '0 %.0s' $(seq "$world") | sed 's/ $//')" ] ||
    { echo "FAIL: $name $layout: the MPI run issued NCCL groups"; exit 1; }
  [ "$(bytes "$name-$layout-mpi")" = "$(bytes "$name-$layout-nccl")" ] || {
    diff <(bytes "$name-$layout-mpi") <(bytes "$name-$layout-nccl")
    echo "FAIL: $name $layout: bytes per collective differ"; exit 1; }
  grep -q '"transport": "nccl"' "$work/$name-$layout-nccl/manifest.json" ||
    { echo "FAIL: $name $layout: the manifest does not record the transport"; exit 1; }
  echo "$name $layout: NCCL and MPI transports identical to the single process; the same exchanges on every rank" \
       "($(wc -l < "$work/$name-$layout-mpi.plan/rank0.log") on rank 0; NCCL groups per rank: $groups)"
}

# NCCL's own buffers, 0.5 GiB a communicator: the memory model counts the communicators the trainer made in a run
# (every communicator a rank's stand-in log names), at 2x2 and under expert parallelism.
comms_check() {  # comms_check RUN LAYOUT CONFIG_ARGS...
  local run=$1 layout=$2 made counted
  shift 2
  made=$(awk '/^comm /{print $2}' "$work/$run.plan/rank0.nccl" | sort -u | wc -l)
  counted=$("$BIN" config "$@" --layout "$layout" --executor cuda --transport nccl |
    sed -nE 's/^  NCCL communicators +[0-9.]+ GiB +([0-9]+) x 0\.5 GiB.*/\1/p')
  [ "$made" -gt 0 ] && [ "$counted" = "$made" ] ||
    { echo "FAIL: $run: the memory model counts '${counted}' NCCL communicators, the run made $made"; exit 1; }
  echo "memory model: $run's $made NCCL communicators counted"
}

single tiny "${tiny[@]}"
check tiny 2x1 "${tiny[@]}"
check tiny 3x1 "${tiny[@]}"
check tiny 2x2 "${tiny[@]}"
# What NCCL carried, by the communicator the trainer made (world, replicate group, replicas of the shard; the stand-in
# numbers them in that order): the owners' exchange, the FSDP gathers and, once a step, the parameter all-gather.
for r in 0 1 2 3; do
  counts=$(for k in 0 1 2; do grep -c "^comm $k ranks" "$work/tiny-2x2-nccl.plan/rank$r.nccl" || true; done | xargs)
  read -r world_groups shard_groups replica_groups <<< "$counts"
  [ "$world_groups" -gt 0 ] && [ "$shard_groups" -gt 0 ] && [ "$replica_groups" = 3 ] ||
    { echo "FAIL: tiny 2x2 rank $r: NCCL groups on the world, replicate group, replicas: $counts (want >0 >0 3)"; exit 1; }
done
echo "tiny 2x2: NCCL groups per communicator on every rank: $counts (world, replicate group, the shard's replicas)"
# NCCL takes at most 2048 operations in a group; an exchange with more is cut into rounds that both ends of every pair
# cut alike (dist::nccl_rounds). At a limit of 2 (TEST ONLY --debug-nccl-group-ops) every exchange here is cut: the
# same trace, and no group over 2 operations.
split_check() {  # split_check NAME SxR REFERENCE ARGS...
  local name=$1 layout=$2 reference=$3 world=$((${2%x*} * ${2#*x}))
  shift 3
  ranks "$name" "$layout" "$@" --transport nccl --debug-nccl-group-ops 2
  same_trace "$reference" "$name"
  local most
  most=$(cat "$work/$name.plan"/rank*.nccl | awk '{print $NF}' | sort -n | tail -1)
  [ "$most" -le 2 ] || { echo "FAIL: $name: a group of $most operations over the limit of 2"; exit 1; }
  echo "$name: groups of at most 2 operations: the same trace (NCCL groups per rank: $(nccl_groups "$name" "$world"))"
}
split_check tiny-2x2-split 2x2 tiny "${tiny[@]}"

# NCCL's prefetch (train's default): the next unit gathered into a second unit buffer (on a stream of its own on a
# device) while the model works on this one. The same trace; the same exchanges as the MPI run, in another order (a
# unit's gather now comes before the work on the one in hand); per training pass of L blocks 2L + 3 acquires, all but
# the embedding's served by the prefetch; and its control, which prefetches the wrong unit, every acquire on the spot.
prefetch_check() {  # prefetch_check NAME SxR PASSES UNITS WORLD_COMM ARGS... (WORLD_COMM: the world's number)
  local name=$1 layout=$2 passes=$3 units=$4 world_comm=$5 world=$((${2%x*} * ${2#*x}))
  shift 5
  ranks "$name-$layout-pf" "$layout" "$@" --transport nccl
  ranks "$name-$layout-pf-other" "$layout" "$@" --transport nccl --debug-prefetch-other-unit
  same_trace "$name" "$name-$layout-pf"
  same_trace "$name" "$name-$layout-pf-other"
  local r want_on="" want_off="" acquires=$(((2 * units - 1) * passes))
  for ((r = 0; r < world; r++)); do
    cmp -s <(sort "$work/$name-$layout-mpi.plan/rank$r.log") <(sort "$work/$name-$layout-pf.plan/rank$r.log") ||
      { echo "FAIL: $name $layout: rank $r's exchanges with NCCL's prefetch differ from the MPI run's"; exit 1; }
    want_on+="$(((2 * units - 2) * passes)) $passes"$'\n'
    want_off+="0 $acquires"$'\n'
  done
  [ "$(gathers "$name-$layout-pf")" = "${want_on%$'\n'}" ] ||
    { gathers "$name-$layout-pf"; echo "FAIL: $name $layout: want per rank ${want_on%%$'\n'*} (prefetched, on the spot)"; exit 1; }
  [ "$(gathers "$name-$layout-pf-other")" = "${want_off%$'\n'}" ] ||
    { gathers "$name-$layout-pf-other"; echo "FAIL: $name $layout: the control: want per rank 0 $acquires"; exit 1; }
  # The owners' exchange, the world communicator's only work: every group on the side stream, on every rank.
  local groups on_side on_default
  groups=$(cat "$work/$name-$layout-pf.plan"/rank*.nccl | grep "^comm $world_comm ranks " || true)
  on_side=$(grep -c " stream side " <<< "$groups" || true)
  on_default=$(grep -c " stream default " <<< "$groups" || true)
  [ "$on_side" -gt 0 ] && [ "$on_default" = 0 ] ||
    { echo "FAIL: $name $layout: the owners' exchange: $on_side groups on the side stream, $on_default on the default"
      exit 1; }
  echo "$name $layout: NCCL's prefetch: the same trace and exchanges; per rank $((acquires - passes)) of $acquires" \
       "gathers prefetched; the control's all on the spot; the owners' exchange's $on_side groups on the side stream"
}
gathers() {  # gathers RUN: "P S" per rank, rank order (prefetched, on the spot)
  sed -nE 's/^rank ([0-9]+): FSDP unit gathers in [0-9]+ steps: ([0-9]+) prefetched, ([0-9]+) on the spot$/\1 \2 \3/p' \
    "$work/$1.log" | sort -n | cut -d' ' -f2-
}
# The stand-in runs the prefetch's groups on a worker thread of its side stream, each 200 us after it is queued (as a
# device's stream would run them later), so every wait the device needs runs here: the control whose acquire does not
# wait for the side stream must change the trace.
export OLMOREF_TEST_HOST_STREAM_DELAY_US=200
# tiny: 4 blocks (6 units); 3 steps of 2 rounds at 2x1, of 1 round at 2x2.
prefetch_check tiny 2x1 6 6 0 "${tiny[@]}"
prefetch_check tiny 2x2 3 6 0 "${tiny[@]}"
ranks tiny-2x1-pf-no-wait 2x1 "${tiny[@]}" --transport nccl --debug-prefetch-no-stream-wait
cmp -s "$work/tiny/trace.jsonl" "$work/tiny-2x1-pf-no-wait/trace.jsonl" &&
  { echo "FAIL: NCCL's prefetch without the acquire's wait for its side stream kept the trace: the late groups unseen"; exit 1; }
echo "tiny 2x1: NCCL's prefetch without the acquire's wait for its side stream changes the trace, as it must"
# The owners' exchange on its side stream: in 3 chunks a unit (a group and its adds per chunk, through one receive
# block) the same trace; its controls change it.
ranks tiny-2x2-exchange-chunks 2x2 "${tiny[@]}" --transport nccl --debug-exchange-chunks 3
same_trace tiny tiny-2x2-exchange-chunks
for control in --debug-exchange-no-stream-wait --debug-exchange-no-wait; do
  ranks "tiny-2x1$control" 2x1 "${tiny[@]}" --transport nccl "$control"
  cmp -s "$work/tiny/trace.jsonl" "$work/tiny-2x1$control/trace.jsonl" &&
    { echo "FAIL: the owners' exchange on its side stream: the control $control kept the trace"; exit 1; }
done
echo "tiny 2x2: the owners' exchange on its side stream in 3 chunks a unit keeps the trace; without the executor's" \
     "wait for that stream, or with the gradient read before it, the trace changes, as it must"
# Context parallelism (CP 2): attention's gathers of positions and the chains' partials by NCCL too (the small host-side
# gathers stay on MPI: the same lines in both runs); masked, so that documents cut the instances.
masked=("${tiny[@]}" --set data.eos_id=511 --set data.document_masking=true --set train.seq_len=48)
single masked "${masked[@]}"
check masked 2x1 "${masked[@]}" --cp 2
# With the prefetch and its overlapped owners' exchange beside context parallelism's groups (the CP group is the
# first communicator, the world the second): the same trace, every owners' exchange group on the side stream (200 us
# late, as above).
ranks masked-2x1-pf 2x1 "${masked[@]}" --cp 2 --transport nccl
same_trace masked masked-2x1-pf
grep -q "^comm 1 ranks .* stream side " "$work/masked-2x1-pf.plan/rank0.nccl" &&
  ! grep -q "^comm 1 ranks .* stream default " "$work/masked-2x1-pf.plan/rank0.nccl" ||
  { echo "FAIL: masked 2x1 CP 2: the owners' exchange did not run on its side stream"; exit 1; }
echo "masked 2x1 CP 2: with the prefetch and the owners' exchange on its side stream, the same trace"
single moe "${moe[@]}"
check moe 2x2 "${moe[@]}" --ep 2
# Communicators in the order the trainer makes them: the EP group, the world, the replicate group, the replicas.
for r in 0 1 2 3; do
  counts=$(for k in 0 1 2 3; do grep -c "^comm $k ranks" "$work/moe-2x2-nccl.plan/rank$r.nccl" || true; done | xargs)
  read -r ep_groups world_groups shard_groups replica_groups <<< "$counts"
  [ "$ep_groups" -gt 0 ] && [ "$world_groups" -gt 0 ] && [ "$shard_groups" -gt 0 ] && [ "$replica_groups" = 3 ] ||
    { echo "FAIL: moe 2x2 rank $r: NCCL groups on the EP group, world, replicate group, replicas: $counts"; exit 1; }
done
echo "moe 2x2: NCCL groups per communicator on every rank: $counts (the expert rows, the world, replicate group, replicas)"
comms_check moe-2x2-nccl 2x2 "${moe[@]}" --ep 2
split_check moe-2x2-split 2x2 moe "${moe[@]}" --ep 2
prefetch_check moe 2x2 3 6 1 "${moe[@]}" --ep 2
# An idle rank beside a busy one in an EP group: 5 micro-batches on 4 ranks, so in the second round rank 1 runs the
# idle pass in the EP group (0, 1), moving no rows of its own and receiving its experts' rows from rank 0.
moe5=("${moe[@]}" --set train.global_batch_instances=10)
single moe5 "${moe5[@]}"
check moe5 2x2 "${moe5[@]}" --ep 2

# The control: a plan that differs (the owners' exchange in 2 chunks instead of 1) moves the same values, and the
# plan check must see it.
ranks tiny-2x1-chunks 2x1 "${tiny[@]}" --transport nccl --debug-exchange-chunks 2
same_trace tiny tiny-2x1-chunks
if same_plan tiny-2x1-mpi tiny-2x1-chunks 2; then
  echo "FAIL: the control: exchanges in other chunks passed the plan check"; exit 1
fi
echo "control: the owners' exchange in 2 chunks: the same trace, and the plan check fails as it must"

# The memory model (`config --layout --transport`, what train checks a run against): under nccl the owners' exchange
# blocks are device memory and nothing of the exchanges is staged on the host; under mpi the receive blocks are the
# host's and the send blocks both's (with the prefetch, config's case: the backward fills one on the device, which a
# side stream copies to the host's, where the unit in flight keeps it).
for t in mpi nccl; do
  "$BIN" config "${tiny[@]}" --layout 2x2 --executor cuda --transport "$t" > "$work/memory-$t.txt"
  device=$(sed -n '/^memory per rank/,/^  peak/p' "$work/memory-$t.txt")
  host=$(sed -n '/^host memory per rank/,$p' "$work/memory-$t.txt")
  for spec in "unit send blocks:1:$([ "$t" = nccl ] && echo 0 || echo 1)" \
              "unit receive blocks:$([ "$t" = nccl ] && echo 1 || echo 0):$([ "$t" = nccl ] && echo 0 || echo 1)"; do
    IFS=: read -r part on_device on_host <<< "$spec"
    [ "$(grep -c "^  $part " <<< "$device")" = "$on_device" ] && [ "$(grep -c "^  $part " <<< "$host")" = "$on_host" ] ||
      { cat "$work/memory-$t.txt"; echo "FAIL: --transport $t: '$part' not where the exchange keeps it"; exit 1; }
  done
  [ "$t" = mpi ] || ! grep -Eq "^  (FSDP gather buffers|parameter all-gather) " <<< "$host" ||
    { cat "$work/memory-$t.txt"; echo "FAIL: --transport nccl: host staging counted"; exit 1; }
  [ "$t" = nccl ] || ! grep -q "^  NCCL communicators " <<< "$device" ||
    { cat "$work/memory-$t.txt"; echo "FAIL: --transport mpi: NCCL's buffers counted"; exit 1; }
done
comms_check tiny-2x2-nccl 2x2 "${tiny[@]}"
for t in mpi nccl; do
  "$BIN" config "${tiny[@]}" --layout 2x1 --cp 2 --executor cuda --transport "$t" > "$work/memory-cp-$t.txt"
done
grep -q "^  context parallelism staging " "$work/memory-cp-mpi.txt" &&
  ! grep -q "^  context parallelism staging " "$work/memory-cp-nccl.txt" ||
  { cat "$work/memory-cp-nccl.txt"; echo "FAIL: context parallelism's host staging: want it under mpi only"; exit 1; }
echo "memory model: the exchange's blocks on the device under nccl, on the host under mpi (and CP's staging)"

# Refusals, with the fix named. meson puts the stand-in's folder on LD_LIBRARY_PATH (it is a dependency of this
# test), where olmoref's dlopen("libnccl.so.2") would find it: these runs go without it, so they load NCCL's own.
without_standin=$(tr ':' '\n' <<< "${LD_LIBRARY_PATH:-}" | grep -vxF "$(dirname "$standin")" | paste -sd: || true)
for ex in cpu cuda-host; do
  if LD_LIBRARY_PATH=$without_standin "${MPIRUN[@]}" -np 2 "$BIN" train "${common[@]}" "${tiny[@]}" --executor "$ex" --dp-shard 2 --transport nccl \
       --out "$work/refused-$ex" --comm-timeout 60 > "$work/refused-$ex.log" 2>&1; then
    echo "FAIL: --transport nccl with --executor $ex (no stand-in) ran"; exit 1
  fi
  grep -q "run it with --executor cuda, or use --transport mpi" "$work/refused-$ex.log" ||
    { cat "$work/refused-$ex.log"; echo "FAIL: --executor $ex: the refusal does not name the fix"; exit 1; }
done
echo "refused: --transport nccl with the CPU executor and with cuda-host without the stand-in, naming the fix"
