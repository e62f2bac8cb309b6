# bench/moe_shapes.sh — sourced by bench/moe_bench.sh and bench/moe_ep_bench.sh: the two MoE shapes they measure,
# the dense model with the same active parameters per token beside each, the common run settings, and the
# helpers that read tokens/s from the logs. Expects $work (a scratch folder) and the repository root as cwd.
python3 tests/make_tokens.py "$work/tokens.u16" 11 400000
# shellcheck disable=SC2034  # read by the scripts that source this file
common=(--set "data.train_files=[\"$work/tokens.u16\"]" --set data.audit=false --set checkpoint.interval=0
        --set eval.interval=0 --set train.log_every=1)
declare -A moe dense steps
# tiny-moe: configs/tiny-moe.toml (8 experts of 32, top-2, shared 64; seq 64, micro-batch 2, global 8).
moe[tiny-moe]="--config configs/tiny-moe.toml"
dense[tiny-moe]="--config configs/tiny.toml --set model.n_kv_heads=2 --set model.swa_pattern=[-1] --set model.ffn_hidden=131"
steps[tiny-moe]=8
# small-moe: smallmoe's proportions at d 128 (4 layers, 32 experts of 64, top-4, shared 256; seq 128, micro-batch
# 4, global 8).
small_shape="--set model.d_model=128 --set model.n_layers=4 --set model.n_heads=4 --set model.n_kv_heads=4
--set train.seq_len=128 --set train.micro_batch_instances=4 --set train.global_batch_instances=8"
moe[small-moe]="--config configs/tiny-moe.toml $small_shape --set model.moe_experts=32 --set model.moe_top_k=4
--set model.moe_hidden=64 --set model.moe_shared_hidden=256"
# (32·d + 3·256·d + 4·3·64·d) / (3·d) = 10.7 + 256 + 256
dense[small-moe]="--config configs/tiny.toml $small_shape --set model.swa_pattern=[-1] --set model.ffn_hidden=523"
steps[small-moe]=6

median() { sort -g | awk '{a[NR]=$1} END {if (NR) print a[int((NR+1)/2)]; else print "nan"}'; }
best() { sort -g | tail -1; }
# tok/s of every step after the first, from olmoref train's progress lines.
olmoref_rates() { grep -E "^step" "$1" | tail -n +2 | awk '{for(i=1;i<=NF;i++) if($i=="tok/s") print $(i-1)}'; }
