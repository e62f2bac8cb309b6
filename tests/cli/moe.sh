#!/usr/bin/env bash
# Mixture of experts (configs/tiny-moe.toml, docs/canonical/moe.md) through the binary: with the layout-free
# "instance" load-balancing granularity the trace (loss, aux losses, routing digest, expert load, parameter digest)
# is byte-identical across reruns, thread counts, the scalar and SIMD CPU paths, micro-batch sizes, the cuda-host
# executor, data-parallel layouts and expert-parallel layouts (--ep), and a stop + resume (also at another
# micro-batch size, DP layout or EP layout) changes nothing, while an atomic-style unordered combine (test only)
# changes it, with and without EP; under EP a rank keeps only the experts its replicate group runs, and its state
# falls with EP; the
# "local_batch" granularity (OLMo-core's default) must differ across micro-batch sizes, as documented; bad MoE
# keys are refused by name.
source "${OLMOREF_SOURCE_ROOT:?}/tests/common/shell_test.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl=self,vader OMPI_MCA_pml=ob1 OMPI_MCA_btl_vader_single_copy_mechanism=none
python3 "$SRC/tests/make_tokens.py" "$work/tokens.u16" 3 60000
base=(--config "$SRC/configs/tiny-moe.toml" --set "data.train_files=[\"$work/tokens.u16\"]")
cfg=("${base[@]}" --steps 6 --quiet)
run() { local name=$1; shift; "$BIN" train "${cfg[@]}" "$@" --out "$work/$name"; }
same() {
  cmp "$work/$1/trace.jsonl" "$work/$2/trace.jsonl" || { echo "FAIL: $2 differs from $1"; exit 1; }
  echo "$2: identical"
}
# One thread for every single-process run but the thread-count check (t2): a pool of 2 threads spins waiting for
# its other half while another test holds the second core, at 8x the CPU of 1 thread here.
run ref --threads 1
python3 - "$work/ref/trace.jsonl" <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
for r in recs:
    assert len(r["routing_digest"]) == 16, r
    assert len(r["expert_load"]) == 4 and all(len(l) == 8 for l in r["expert_load"]), r
    assert all(sum(l) == 8 * 64 * 2 for l in r["expert_load"]), "each token counts top_k times"
    assert r["moe_lb"] > 0 and r["moe_z"] > 0
    assert abs(r["loss"] - (r["ce"] + r["z"] + r["moe_lb"] + r["moe_z"])) < 1e-5, r
    flat = [c for l in r["expert_load"] for c in l]
    assert (r["expert_load_min"], r["expert_load_max"]) == (min(flat), max(flat)), r
    assert r["expert_imbalance"] == max(max(l) * len(l) / sum(l) for l in r["expert_load"]), r
assert len({r["routing_digest"] for r in recs}) == len(recs), "routing digests must change as the weights train"
print("trace fields: ok")
PY
run again --threads 1; same ref again
run t2 --threads 2; same ref t2
run scalar --threads 1 --cpu-isa scalar; same ref scalar
run mb1 --threads 1 --set train.micro_batch_instances=1; same ref mb1
run mb8 --threads 1 --set train.micro_batch_instances=8; same ref mb8
run host --threads 1 --set train.executor=cuda-host; same ref host
for layout in 2x1 1x2 3x1 2x2; do
  s=${layout%x*} r=${layout#*x}
  mpirun --oversubscribe --bind-to none -np $((s * r)) "$BIN" train "${cfg[@]}" --threads 1 --dp-shard "$s" \
    --dp-replicate "$r" --report-comm --out "$work/L$layout" 2> "$work/L$layout.log" || { cat "$work/L$layout.log"; exit 1; }
  same ref "L$layout"
done
# Expert parallelism (--ep): tiny-moe's 8 experts over EP groups of 2 (4 + 4), 4 (2 each) and 3 (3 + 3 + 2,
# uneven), inside DP layouts; at 3 ranks the step's 4 micro-batches split 2 + 1 + 1, so two ranks serve their
# experts in the second pass without instances of their own. Every trace must be the single-process one.
for spec in 2x1:2 1x2:2 2x2:4 2x2:2 3x1:3; do
  layout=${spec%:*} ep=${spec#*:} s=${spec%%x*} r=${layout#*x}
  mpirun --oversubscribe --bind-to none -np $((s * r)) "$BIN" train "${cfg[@]}" --threads 1 --dp-shard "$s" \
    --dp-replicate "$r" --ep "$ep" --report-comm --out "$work/EP$layout-$ep" 2> "$work/EP$layout-$ep.log" ||
    { cat "$work/EP$layout-$ep.log"; exit 1; }
  grep -q "expert all-to-all" "$work/EP$layout-$ep.log" || { cat "$work/EP$layout-$ep.log"; echo "FAIL: no EP bytes"; exit 1; }
  same ref "EP$layout-$ep"
done
# Expert-resident state: under DDP (1x4) a rank keeps the parameters and AdamW moments of the experts it runs and
# no others, so the state per rank falls with EP, as declared (state) and as measured (resident pages); the traces
# and the checkpoint's files are those of EP 1 (each rank writes its own optimizer range; EP changes no file).
for ep in 1 2 4; do
  mpirun --oversubscribe --bind-to none -np 4 "$BIN" train "${cfg[@]}" --threads 1 --dp-replicate 4 --ep "$ep" \
    --report-comm --out "$work/DDP-$ep" 2> "$work/DDP-$ep.log" || { cat "$work/DDP-$ep.log"; exit 1; }
  same ref "DDP-$ep"
done
# Every rank writes its own optimizer range, so the files follow the layout, never EP: EP 4's are EP 1's, byte for byte.
for f in "$work"/DDP-1/checkpoints/*/shard-*.bin; do
  cmp "$f" "$work/DDP-4/checkpoints/$(basename "$(dirname "$f")")/$(basename "$f")" ||
    { echo "FAIL: the EP 4 checkpoint's $(basename "$f") differs from EP 1's"; exit 1; }
done
python3 - "$work"/DDP-{1,2,4}.log <<'PY2'
import re, sys
def state(path):
    declared = resident = 0.0
    for line in open(path):
        m = re.search(r"^rank \d+: .*state ([0-9.]+) MiB \(([0-9.]+) MiB resident\)", line)
        if m:
            declared, resident = max(declared, float(m.group(1))), max(resident, float(m.group(2)))
    assert declared > 0, path + ": no --report-comm state"
    # Resident pages: the held parts rounded out to whole pages, never the whole range.
    assert declared - 0.01 <= resident <= declared * 1.1, (path, declared, resident)
    return declared, resident
(d1, r1), (d2, r2), (d4, r4) = (state(p) for p in sys.argv[1:])
assert d4 < d2 < d1 and r4 < r2 < r1, ((d1, r1), (d2, r2), (d4, r4))
print(f"state per rank under DDP 1x4: {d1:.2f} / {d2:.2f} / {d4:.2f} MiB (resident {r1:.2f} / {r2:.2f} / {r4:.2f}) at EP 1 / 2 / 4")
PY2
# The [eval] backstop reads every parameter: under DDP with EP 2 rank 0 holds only its experts and receives the
# rest when an evaluation is due, so eval.jsonl is the single process's (all but its timing) and the trace unchanged.
python3 "$SRC/tests/make_tokens.py" "$work/holdout.u16" 5 6000
python3 "$SRC/tests/make_tokens.py" "$work/fresh.u16" 7 6000
ev=(--set "data.holdout_files=[\"$work/holdout.u16\"]" --set "eval.fresh_files=[\"$work/fresh.u16\"]"
    --set eval.interval=3 --set eval.instances=8 --set eval.bootstrap=200)
run eval1 --threads 1 "${ev[@]}"
mpirun --oversubscribe --bind-to none -np 2 "$BIN" train "${cfg[@]}" --threads 1 --dp-replicate 2 --ep 2 "${ev[@]}" \
  --out "$work/eval2" 2> "$work/eval2.log" || { cat "$work/eval2.log"; exit 1; }
same ref eval2
python3 - "$work/eval1/eval.jsonl" "$work/eval2/eval.jsonl" <<'PY2'
import json, sys
def records(path):
    out = [json.loads(l) for l in open(path) if l.strip()]
    for r in out:
        r.pop("seconds")
    return out
one, two = (records(p) for p in sys.argv[1:])
assert len(one) == 2 and len(two) == 2, (len(one), len(two))
assert one == two, "eval.jsonl differs at steps " + str([a["step"] for a, b in zip(one, two) if a != b])
print("eval backstop under DDP + EP 2: eval.jsonl identical to one process's (steps 3 and 6)")
PY2
# EP groups that cut across shard groups (3x2 with EP 2: ranks {0,1} {2,3} {4,5}, shard groups {0,1,2} {3,4,5}),
# 8 micro-batches of 1 over 6 ranks (runs 2, 2, 1, 1, 1, 1).
mpirun --oversubscribe --bind-to none -np 6 "$BIN" train "${cfg[@]}" --threads 1 --dp-shard 3 --dp-replicate 2 --ep 2 \
  --set train.micro_batch_instances=1 --out "$work/EP3x2-2" 2> "$work/EP3x2-2.log" || { cat "$work/EP3x2-2.log"; exit 1; }
same ref EP3x2-2
# Replicate groups that run different, overlapping subsets of the experts (2x3 with EP 3: groups {0,1} {2,3} {4,5}
# run EP ranks 0+1, 2+0, 1+2), so each holds two thirds of the experts' state and digests gather the rest.
mpirun --oversubscribe --bind-to none -np 6 "$BIN" train "${cfg[@]}" --threads 1 --dp-shard 2 --dp-replicate 3 --ep 3 \
  --set train.micro_batch_instances=1 --out "$work/EP2x3-3" 2> "$work/EP2x3-3.log" || { cat "$work/EP2x3-3.log"; exit 1; }
same ref EP2x3-3
# The same through the CUDA kernels on the host (device memory stand-in: the exchanges' host round trips and the
# FSDP device view).
mpirun --oversubscribe --bind-to none -np 2 "$BIN" train "${cfg[@]}" --threads 1 --dp-shard 2 --ep 2 \
  --set train.executor=cuda-host --out "$work/EPhost" 2> "$work/EPhost.log" || { cat "$work/EPhost.log"; exit 1; }
same ref EPhost
# Expert-resident state through a device executor's memory (the state comes to the host piece by piece).
mpirun --oversubscribe --bind-to none -np 2 "$BIN" train "${cfg[@]}" --threads 1 --dp-replicate 2 --ep 2 \
  --set train.executor=cuda-host --out "$work/EPhost-ddp" 2> "$work/EPhost-ddp.log" || { cat "$work/EPhost-ddp.log"; exit 1; }
same ref EPhost-ddp
# Under FSDP a rank gathers only the experts it runs: at 2x2 the bytes each rank sends besides the expert all-to-all
# (parameter gathers, gradient pieces, scalars) must be fewer at EP 2 and fewer still at EP 4 than without EP.
python3 - "$work/L2x2.log" "$work/EP2x2-2.log" "$work/EP2x2-4.log" <<'PY'
import re, sys
def non_expert(path):
    worst = 0.0
    for line in open(path):
        m = re.match(r"rank \d+: sent ([0-9.]+) MiB/step.*?(?:step digests ([0-9.]+) MiB/step, for checkpoints and "
                     r"evals ([0-9.]+) MiB/step; expert all-to-all ([0-9.]+) MiB/step)?$", line.strip())
        if m:
            worst = max(worst, float(m.group(1)) - sum(float(m.group(i) or 0) for i in (2, 3, 4)))
    assert worst > 0, path + ": no --report-comm line"
    return worst
ep1, ep2, ep4 = (non_expert(p) for p in sys.argv[1:])
assert ep4 < ep2 < ep1, (ep1, ep2, ep4)
print(f"gathers under EP: {ep1:.3f} / {ep2:.3f} / {ep4:.3f} MiB per rank per step at EP 1 / 2 / 4 (2x2)")
PY
# Resumed at another expert-parallel layout: EP 2 over 2x1 up to the stop, EP 4 over 2x2 after it.
"$BIN" resume-check "${base[@]}" --steps 6 --at 3 --threads 1 --layout 2x1 --ep 2 --resume-layout 2x2 --resume-ep 4 \
  > "$work/resume-ep.log" 2>&1 || { cat "$work/resume-ep.log"; exit 1; }
grep -q IDENTICAL "$work/resume-ep.log" || { cat "$work/resume-ep.log"; echo "FAIL: resume-check across EP"; exit 1; }
echo "resume-check: identical from EP 2 (2x1) to EP 4 (2x2)"
# From expert-resident state (EP 4 under DDP: no rank holds every expert) to a layout without EP.
"$BIN" resume-check "${base[@]}" --steps 6 --at 3 --threads 1 --layout 1x4 --ep 4 --resume-layout 2x1 --resume-ep 1 \
  > "$work/resume-ep-ddp.log" 2>&1 || { cat "$work/resume-ep-ddp.log"; exit 1; }
grep -q IDENTICAL "$work/resume-ep-ddp.log" || { cat "$work/resume-ep-ddp.log"; echo "FAIL: resume-check from EP 4 1x4"; exit 1; }
echo "resume-check: identical from EP 4 (1x4, expert-resident state) to 2x1 without EP"
# The negative control holds under expert parallelism too: arrival-order combining changes the trace.
mpirun --oversubscribe --bind-to none -np 2 "$BIN" train "${cfg[@]}" --threads 1 --dp-shard 2 --ep 2 \
  --debug-moe-unordered-combine --out "$work/EPctl" 2> "$work/EPctl.log" || { cat "$work/EPctl.log"; exit 1; }
if cmp -s "$work/ref/trace.jsonl" "$work/EPctl/trace.jsonl"; then echo "FAIL: EP + unordered combine matched"; exit 1; fi
echo "expert parallelism: every EP layout identical; the unordered combine under EP differs"
"$BIN" resume-check "${base[@]}" --steps 6 --at 3 --threads 1 > "$work/resume.log" 2>&1 || { cat "$work/resume.log"; exit 1; }
grep -q IDENTICAL "$work/resume.log" || { cat "$work/resume.log"; echo "FAIL: resume-check"; exit 1; }
# Resumed at another micro-batch size, and at another data-parallel layout.
"$BIN" resume-check "${base[@]}" --steps 6 --at 2 --threads 1 --resume-set train.micro_batch_instances=4 \
  > "$work/resume-mb.log" 2>&1 || { cat "$work/resume-mb.log"; exit 1; }
"$BIN" resume-check "${base[@]}" --steps 6 --at 4 --threads 1 --layout 2x1 --resume-layout 1x2 \
  > "$work/resume-layout.log" 2>&1 || { cat "$work/resume-layout.log"; exit 1; }
grep -q IDENTICAL "$work/resume-mb.log" || { cat "$work/resume-mb.log"; echo "FAIL: resume-check at micro-batch 4"; exit 1; }
grep -q IDENTICAL "$work/resume-layout.log" || { cat "$work/resume-layout.log"; echo "FAIL: resume-check from layout 2x1 to 1x2"; exit 1; }
echo "resume-check: identical (also resumed at micro-batch 4, and from layout 2x1 to 1x2)"
# Negative control: the same model with an atomic-style combine (each token's experts added in arrival order, not
# rank order) must not give the reference trace; `trace compare` must say so, from step 1.
run ctl --threads 1 --debug-moe-unordered-combine
if cmp -s "$work/ref/trace.jsonl" "$work/ctl/trace.jsonl"; then echo "FAIL: the unordered combine left the trace unchanged"; exit 1; fi
if "$BIN" trace compare "$work/ref/trace.jsonl" "$work/ctl/trace.jsonl" > "$work/cmp-ctl.log"; then
  echo "FAIL: trace compare accepted the unordered combine"; exit 1
fi
grep -q "first differing step: 1" "$work/cmp-ctl.log" || { cat "$work/cmp-ctl.log"; exit 1; }
"$BIN" trace compare "$work/ref/trace.jsonl" "$work/L2x2/trace.jsonl" > "$work/cmp-same.log" || { cat "$work/cmp-same.log"; exit 1; }
grep -q "routing: identical at every compared step" "$work/cmp-same.log" || { cat "$work/cmp-same.log"; exit 1; }
echo "negative control: the unordered combine changes the trace from step 1; trace compare reports it"
# OLMo-core's local_batch granularity takes its statistics per micro-batch: the loss depends on the layout.
lb=("$BIN" train "${base[@]}" --steps 2 --quiet --threads 1 --set model.moe_lb_granularity=local_batch)
"${lb[@]}" --out "$work/lbA"
"${lb[@]}" --set train.micro_batch_instances=4 --out "$work/lbB"
if cmp -s "$work/lbA/trace.jsonl" "$work/lbB/trace.jsonl"; then echo "FAIL: local_batch ignored the micro-batch"; exit 1; fi
echo "local_batch: differs across micro-batch sizes, as documented"
expect_error() {
  local want=$1; shift
  if "$@" > "$work/err.log" 2>&1; then echo "FAIL: accepted: $*"; exit 1; fi
  grep -q "$want" "$work/err.log" || { echo "FAIL: message lacks '$want':"; cat "$work/err.log"; exit 1; }
}
expect_error "model.moe_top_k" "$BIN" config "${base[@]}" --set model.moe_top_k=9
expect_error "model.moe_lb_granularity" "$BIN" config "${base[@]}" --set model.moe_lb_granularity=global
expect_error "model.moe_experts" "$BIN" config --config "$SRC/configs/tiny.toml" --set model.moe_top_k=2
expect_error "model.moe_normalize_expert_weights" "$BIN" config "${base[@]}" --set model.moe_normalize_expert_weights=3
expect_error "train.precision" "$BIN" train "${cfg[@]}" --set 'train.precision="bf16"' --out "$work/bf"
# No Hugging Face form: export and HF init refuse by name, writing nothing; a golden bundle carries the weights
# under OLMo-core's names instead (olmo_core/, for OLMo-core's replay: tests/golden/olmo_core_replay.sh moe).
expect_error "model.moe_experts" "$BIN" export-hf "${base[@]}" --out "$work/hf"
[ ! -e "$work/hf/model.safetensors" ] || { echo "FAIL: export-hf wrote weights for a MoE model"; exit 1; }
"$BIN" golden export --run "$work/ref" --out "$work/gx" > /dev/null
[ -s "$work/gx/olmo_core/model.safetensors" ] && [ ! -e "$work/gx/hf" ] ||
  { echo "FAIL: a MoE golden bundle must hold olmo_core/model.safetensors and no hf/"; ls -R "$work/gx"; exit 1; }
python3 - "$work/gx/bundle.json" <<'PY' || exit 1
import json, sys
b = json.load(open(sys.argv[1]))
assert b["hf_dir"] is None and b["olmo_core_dir"] == "olmo_core", (b["hf_dir"], b["olmo_core_dir"])
assert b["model"]["moe"]["n_experts"] > 0 and b["optim"]["no_decay"] == ["embeddings.weight"], b["model"]
PY
"$BIN" export-hf --config "$SRC/configs/tiny.toml" --out "$work/dense-hf" > /dev/null
expect_error "model.moe_experts" "$BIN" train "${cfg[@]}" --init-from-hf "$work/dense-hf" --out "$work/init"
expect_error "does not divide" "$BIN" train "${cfg[@]}" --ep 2 --out "$work/ep-one"
expect_error "model.moe_experts" mpirun --oversubscribe --bind-to none -np 2 "$BIN" train --config "$SRC/configs/tiny.toml" \
  --set "data.train_files=[\"$work/tokens.u16\"]" --steps 1 --quiet --dp-shard 2 --ep 2 --out "$work/ep-dense"
expect_error "must own at least one expert" mpirun --oversubscribe --bind-to none -np 2 "$BIN" train "${cfg[@]}" \
  --set model.moe_experts=1 --set model.moe_top_k=1 --dp-shard 2 --ep 2 --out "$work/ep-few"
expect_error "must divide" "$BIN" resume-check "${base[@]}" --steps 2 --at 1 --ep 2
echo "refusals: ok"
