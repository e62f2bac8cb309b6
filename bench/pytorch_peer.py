"""The PyTorch peer of bench/vs_pytorch.sh: Hugging Face Olmo3ForCausalLM (sdpa attention) + torch.optim.AdamW,
fp32 eager on the CPU, trained on random tokens with the shapes of an olmoref run.

usage: pytorch_peer.py HF_DIR --seq-len L --micro-batch M --global-batch G --steps S --threads N [--lr LR]

HF_DIR is what `olmoref export-hf --config CFG` writes for the same run (so the model's shape, windows and
step-0 weights are olmoref's). Prints one line per step, `step K tokens T seconds S`, and a final JSON line with
the median tokens/s over the steps after the first (the first pays for allocation and thread start-up, as
olmoref's does). Gradient accumulation over G/M micro-batches, clipping at 1.0, as olmoref's step.
"""
import argparse
import json
import statistics
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("hf_dir")
    ap.add_argument("--seq-len", type=int, required=True)
    ap.add_argument("--micro-batch", type=int, required=True)
    ap.add_argument("--global-batch", type=int, required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--compile", action="store_true", help="torch.compile the model (default: eager)")
    args = ap.parse_args()
    if args.global_batch % args.micro_batch:
        print(f"pytorch_peer: --global-batch {args.global_batch} is not a multiple of --micro-batch "
              f"{args.micro_batch}", file=sys.stderr)
        return 2

    import torch
    from transformers import Olmo3ForCausalLM

    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    torch.manual_seed(0)
    model = Olmo3ForCausalLM.from_pretrained(args.hf_dir, dtype=torch.float32, attn_implementation="sdpa")
    model.train()
    vocab = model.config.vocab_size
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1, eps=1e-8)
    step_model = torch.compile(model) if args.compile else model
    n_micro = args.global_batch // args.micro_batch
    tokens_per_step = args.global_batch * args.seq_len
    gen = torch.Generator().manual_seed(1)
    rates = []
    for step in range(1, args.steps + 1):
        batch = torch.randint(0, vocab, (n_micro, args.micro_batch, args.seq_len), generator=gen)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        for m in range(n_micro):
            out = step_model(input_ids=batch[m], labels=batch[m])
            (out.loss / n_micro).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        dt = time.perf_counter() - t0
        print(f"step {step} tokens {tokens_per_step} seconds {dt:.4f}", flush=True)
        if step > 1:
            rates.append(tokens_per_step / dt)
    print(json.dumps({"peer": "hf-olmo3-sdpa+adamw" + ("-compiled" if args.compile else "-eager"),
                      "torch": torch.__version__, "threads": args.threads,
                      "tokens_per_s": statistics.median(rates) if rates else None}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
