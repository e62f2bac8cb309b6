#!/usr/bin/env python3
"""Replay an olmoref golden bundle in PyTorch + transformers and write the per-step losses.

Usage: replay.py --bundle DIR --out REPLAY.jsonl [--steploss REPLAY.txt] [--steps N] [--threads N]

The bundle (written by `olmoref golden export`, docs/formats/golden-bundle.md) holds the step-0 weights as a Hugging
Face Olmo3ForCausalLM checkpoint, the per-step batches as instance ranges in the token files, the hyperparameters
and the golden trace. This script knows nothing about olmoref beyond that format: it loads the weights into
transformers (fp32, eager attention, no TF32, deterministic algorithms), reads each step's tokens from the token
files, and trains exactly as OLMo-core does:

  loss  = (sum of cross-entropy + z_loss * sum of logsumexp^2) over each instance's positions 0..T-2 (targets are
          the tokens shifted left), divided by the *global* target count, accumulated over micro-batches;
  clip  = min(1, max_grad_norm / (total_norm + 1e-6)) on the global gradient norm;
  AdamW = torch.optim.AdamW, lr = optim.lr_per_step[s-1] set before the step, weight decay on every parameter but
          model.embed_tokens.weight.

It writes one JSON line per step ({"step", "loss", "grad_norm", "lr"}) and optionally TorchTitan-style "step loss"
lines; `olmoref trace compare BUNDLE/trace.jsonl REPLAY.jsonl --rules golden/replay/rules-fp32.toml` then judges.
Exit status: 0 replayed; 2 the bundle is malformed or its data does not match its checksums.
"""
import argparse
import json
import os
import sys
import time


class BundleError(Exception):
    pass


def setup_torch(threads):
    import torch

    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
    if hasattr(torch.backends, "fp32_precision"):
        torch.backends.fp32_precision = "ieee"
        torch.backends.cuda.matmul.fp32_precision = "ieee"
        torch.backends.cudnn.fp32_precision = "ieee"
    else:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    return torch


def open_token_files(bundle, meta):
    import numpy as np

    dtype = {"uint16": "<u2", "uint32": "<u4"}.get(meta["data"]["dtype"])
    if dtype is None:
        raise BundleError(f"bundle.json: data.dtype {meta['data']['dtype']!r} (expected uint16 or uint32)")
    files = []
    for f in meta["data"]["files"]:
        path = os.path.join(bundle, f["bundle_path"]) if f.get("bundle_path") else f["path"]
        if not os.path.exists(path):
            raise BundleError(f"token file {path} not found (the bundle references it by path; export with "
                              f"--copy-data to carry the files, or place them there)")
        if os.path.getsize(path) != f["bytes"]:
            raise BundleError(f"{path}: {os.path.getsize(path)} bytes, the bundle says {f['bytes']}: another file")
        files.append(np.memmap(path, dtype=dtype, mode="r"))
    return files


def step_tokens(files, rec, T):
    """The global batch of one batches.jsonl record as int64 [G, T], checked against its checksums."""
    import numpy as np

    rows = []
    for inst in rec["instances"]:
        a, b = inst["token_start"], inst["token_end"]
        if b - a != T:
            raise BundleError(f"step {rec['step']}: instance {inst['instance']} spans {b - a} tokens, seq_len is {T}")
        rows.append(np.asarray(files[inst["file"]][a:b], dtype=np.uint64))
    flat = np.concatenate(rows)
    with np.errstate(over="ignore"):
        s = int(flat.sum(dtype=np.uint64))
        ws = int((flat * np.arange(1, flat.size + 1, dtype=np.uint64)).sum(dtype=np.uint64))
    if s != rec["token_sum"] or ws != rec["token_wsum"]:
        raise BundleError(f"step {rec['step']}: the tokens read from the files do not match the bundle's checksums "
                          f"(sum {s} vs {rec['token_sum']}): the token files differ from the run's")
    return np.stack(rows).astype(np.int64)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bundle", required=True, help="directory written by `olmoref golden export`")
    ap.add_argument("--out", required=True, help="replayed trace, JSON Lines {step, loss, grad_norm, lr}")
    ap.add_argument("--steploss", help="also write TorchTitan-style 'step loss' lines here")
    ap.add_argument("--report", help="also write what this replay is (olmoref golden replay's adapter contract) here")
    ap.add_argument("--steps", type=int, help="replay only the first N steps")
    ap.add_argument("--threads", type=int, default=int(os.environ.get("OLMOREF_PEER_THREADS", "2")),
                    help="torch CPU threads (default: $OLMOREF_PEER_THREADS, else 2)")
    args = ap.parse_args(argv)

    try:
        meta = json.load(open(os.path.join(args.bundle, "bundle.json")))
    except (OSError, json.JSONDecodeError) as e:
        print(f"replay: bad bundle: {args.bundle}/bundle.json: {e}", file=sys.stderr)
        return 2
    if meta.get("format") != "olmoref-golden-bundle/1":
        print(f"replay: bad bundle: format {meta.get('format')!r}, expected olmoref-golden-bundle/1", file=sys.stderr)
        return 2
    if meta["precision"] != "fp32":
        print(f"replay: note: the run used precision {meta['precision']}; this replay computes in fp32, so expect "
              f"bf16-sized differences", file=sys.stderr)

    torch = setup_torch(args.threads)
    import transformers
    from transformers import Olmo3ForCausalLM

    transformers.utils.logging.disable_progress_bar()

    S = meta["steps"] if args.steps is None else min(args.steps, meta["steps"])
    G, mb, T = meta["global_batch_instances"], meta["micro_batch_instances"], meta["seq_len"]
    N = meta["loss"]["targets_per_step"]
    z_loss = float(meta["loss"]["z_loss"])
    optim = meta["optim"]
    if N != G * (T - 1) or G % mb:
        print(f"replay: bad bundle: targets_per_step {N}, instances {G}, micro-batch {mb}, seq_len {T} disagree",
              file=sys.stderr)
        return 2
    try:
        files = open_token_files(args.bundle, meta)
        batches = [json.loads(l) for l in open(os.path.join(args.bundle, meta["data"]["batches"])) if l.strip()]
        if [b["step"] for b in batches[:S]] != list(range(1, S + 1)):
            raise BundleError("batches.jsonl must hold steps 1, 2, ... in order")
    except BundleError as e:
        print(f"replay: bad bundle: {e}", file=sys.stderr)
        return 2

    model = Olmo3ForCausalLM.from_pretrained(os.path.join(args.bundle, meta["hf_dir"]), dtype=torch.float32,
                                             attn_implementation="eager")
    model.model.embed_tokens.padding_idx = None  # HF zeroes the pad row's gradient; OLMo-core trains every row
    model.train()
    nd = set(optim["no_decay"])
    params = [p for _, p in model.named_parameters()]
    groups = [{"params": [p for n, p in model.named_parameters() if n not in nd], "weight_decay": optim["weight_decay"]},
              {"params": [p for n, p in model.named_parameters() if n in nd], "weight_decay": 0.0}]
    opt = torch.optim.AdamW([g for g in groups if g["params"]], lr=optim["lr_per_step"][0],
                            betas=tuple(optim["betas"]), eps=optim["eps"], foreach=False, fused=False)

    print(f"replay: {S} steps x {G} instances x {T} tokens (micro-batches of {mb}), torch {torch.__version__}, "
          f"transformers {transformers.__version__}, {args.threads} threads", file=sys.stderr)
    out = open(args.out + ".tmp", "w")
    lines = []
    t0 = time.time()
    for s in range(1, S + 1):
        try:
            tokens = torch.from_numpy(step_tokens(files, batches[s - 1], T))
        except BundleError as e:
            print(f"replay: bad bundle: {e}", file=sys.stderr)
            return 2
        opt.zero_grad(set_to_none=True)
        ce_total = z_total = 0.0
        for i in range(0, G, mb):
            ids = tokens[i:i + mb]
            logits = model(ids).logits[:, :-1, :].float()
            target = ids[:, 1:]
            ce = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1),
                                                   reduction="sum")
            z = z_loss * torch.logsumexp(logits, dim=-1).pow(2).sum()
            ((ce + z) / N).backward()
            ce_total += ce.item()
            z_total += z.item()
        gn = torch.nn.utils.clip_grad_norm_(params, optim["max_grad_norm"], foreach=False).item()
        lr = optim["lr_per_step"][s - 1]
        for g in opt.param_groups:
            g["lr"] = lr
        opt.step()
        loss = (ce_total + z_total) / N
        rec = {"step": s, "loss": loss, "ce": ce_total / N, "z": z_total / N, "grad_norm": gn, "lr": lr}
        out.write(json.dumps(rec) + "\n")
        out.flush()
        lines.append(f"{s} {loss!r}\n")
        if s % 10 == 0 or s == S:
            print(f"replay: step {s}/{S} loss {loss:.6f} grad_norm {gn:.4f} ({time.time() - t0:.1f} s)", file=sys.stderr)
    out.close()
    os.replace(args.out + ".tmp", args.out)
    if args.steploss:
        with open(args.steploss, "w") as f:
            f.writelines(lines)
    if args.report:
        report = {"framework": "torch", "version": torch.__version__, "steps": S,
                  "native": ["transformers Olmo3ForCausalLM (eager attention, fp32)", "torch.optim.AdamW",
                             "torch.nn.utils.clip_grad_norm_"],
                  "added": ["the loss: cross-entropy + z_loss * logsumexp^2 over the global target count (a plain "
                            "loop, no trainer)", "lr set per step from the bundle's lr_per_step"]}
        with open(args.report, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
