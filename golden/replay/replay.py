#!/usr/bin/env python3
"""Replay an olmoref golden bundle in PyTorch + transformers and write the per-step losses.

Usage: replay.py --bundle DIR --out REPLAY.jsonl [--report REPORT.json] [--steploss REPLAY.txt] [--steps N] [--threads N]
       replay.py (--bundle DIR --out REPLAY.jsonl --report REPORT.json)... [--steps N] [--threads N]: several bundles
       one after another in one process (bundle.adapter_args' contract)

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
lines. With --fixed-state it judges each step from olmoref's state after the step before (the bundle's states/):
before step k the model and AdamW get olmoref's parameters, moments and step count, and the line of each judged step
adds grad_err and update_err (bundle.gradient_error, bundle.update_error); `olmoref trace compare BUNDLE/trace.jsonl REPLAY.jsonl --rules golden/replay/rules-fp32.toml` then judges.
Exit status: 0 replayed; 2 a bundle is malformed or its data does not match its checksums (the other bundles are still
replayed).
"""
import json
import os
import sys
import time


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bundle import (Bundle, BundleError, adapter_args, adapter_jobs, gradient_error, hand_state, load_state,  # noqa: E402
                    recipe_loss_sums, setup_torch, update_error)


def main(argv=None):
    args = adapter_args(
        __doc__, argv, "also write what this replay is (olmoref golden replay's adapter contract) here",
        report_required=False, threads_default=int(os.environ.get("OLMOREF_PEER_THREADS", "2")),
        more_args=lambda ap: ap.add_argument("--steploss", help="also write TorchTitan-style 'step loss' lines here "
                                                                "(one bundle only)"))
    if args.steploss and len(args.jobs) > 1:
        print("replay: --steploss writes one bundle's losses: give one --bundle", file=sys.stderr)
        return 2
    # Several bundles replay one after another in this process: torch and transformers are imported once (the start
    # is most of a small replay's time).
    return adapter_jobs(args, "replay", lambda path, out, report, tag: replay_one(args, path, out, report, tag))


def replay_one(args, path, out_path, report_path, tag):
    try:
        bundle = Bundle(path, args.steps)
        bundle.require_hf_adamw("the PyTorch replay")
        if args.fixed_state and not bundle.judged:
            raise BundleError("--fixed-state needs olmoref's states and bundle.json lists none (export with "
                              "`olmoref golden export --states all`)")
    except BundleError as e:
        print(f"{tag}: bad bundle: {e}", file=sys.stderr)
        return 2
    meta = bundle.meta
    if meta["precision"] != "fp32":
        print(f"{tag}: note: the run used precision {meta['precision']}; this replay computes in fp32, so expect "
              f"bf16-sized differences", file=sys.stderr)

    torch = setup_torch(args.threads)
    import transformers

    transformers.utils.logging.disable_progress_bar()
    S, G, mb, T, N, z_loss, optim = bundle.S, bundle.G, bundle.mb, bundle.T, bundle.N, bundle.z_loss, bundle.optim
    # Another valid summation order over the same batches (the envelope of `golden replay --mode both`).
    mb_text = os.environ.get("OLMOREF_TORCH_MICROBATCH") or str(mb)
    if not mb_text.isdigit() or int(mb_text) < 1 or G % int(mb_text):
        print(f"{tag}: OLMOREF_TORCH_MICROBATCH={mb_text!r}: a divisor of the global batch {G}", file=sys.stderr)
        return 2
    mb = int(mb_text)
    model = bundle.hf_model(torch)
    named = dict(model.named_parameters())
    params = list(named.values())
    opt = torch.optim.AdamW(bundle.adamw_groups(model), lr=optim["lr_per_step"][0],
                            betas=tuple(optim["betas"]), eps=optim["eps"], foreach=False, fused=False)

    print(f"{tag}: {S} steps x {G} instances x {T} tokens (micro-batches of {mb}), torch {torch.__version__}, "
          f"transformers {transformers.__version__}, {args.threads} threads", file=sys.stderr)
    out = open(out_path + ".tmp", "w")
    lines = []
    t0 = time.time()
    judged = set(bundle.judged) if args.fixed_state else set()
    before = None  # olmoref's state after the step before a judged step
    for s in range(1, S + 1):
        try:
            tokens = torch.from_numpy(bundle.tokens(s))
            if s in judged:
                before = load_state(bundle, s - 1)
                if s > 1:
                    hand_state(torch, before, named, opt, s - 1)
        except BundleError as e:
            print(f"{tag}: bad bundle: {e}", file=sys.stderr)
            return 2
        opt.zero_grad(set_to_none=True)
        ce_total = z_total = 0.0
        for i in range(0, G, mb):
            ids = tokens[i:i + mb]
            ce, z = recipe_loss_sums(torch, model(ids).logits, ids, z_loss)
            ((ce + z) / N).backward()
            ce_total += ce.item()
            z_total += z.item()
        grads = {n: p.grad.detach().clone() for n, p in named.items()} if s in judged else None
        gn = torch.nn.utils.clip_grad_norm_(params, optim["max_grad_norm"], foreach=False).item()
        lr = optim["lr_per_step"][s - 1]
        for g in opt.param_groups:
            g["lr"] = lr
        opt.step()
        loss = (ce_total + z_total) / N
        rec = {"step": s, "loss": loss, "ce": ce_total / N, "z": z_total / N, "grad_norm": gn, "lr": lr}
        if args.fixed_state:
            if s not in judged:
                continue  # a step between sampled ones: it runs (to keep the trainer's counters) but is not judged
            after = load_state(bundle, s)
            rec["grad_err"], _ = gradient_error(torch, after["grad"], grads)
            rec["update_err"], _ = update_error(torch, before["param"], after["param"], named)
        out.write(json.dumps(rec) + "\n")
        out.flush()
        lines.append(f"{s} {loss!r}\n")
        if s % 10 == 0 or s == S:
            print(f"{tag}: step {s}/{S} loss {loss:.6f} grad_norm {gn:.4f} ({time.time() - t0:.1f} s)", file=sys.stderr)
    out.close()
    os.replace(out_path + ".tmp", out_path)
    if args.steploss:
        with open(args.steploss, "w") as f:
            f.writelines(lines)
    if report_path:
        report = {"framework": "torch", "version": torch.__version__, "steps": S,
                  "mode": "fixed-state" if args.fixed_state else "free",
                  "native": ["transformers Olmo3ForCausalLM (eager attention, fp32)", "torch.optim.AdamW",
                             "torch.nn.utils.clip_grad_norm_"],
                  "added": ["the loss: cross-entropy + z_loss * logsumexp^2 over the global target count (a plain "
                            "loop, no trainer)", "lr set per step from the bundle's lr_per_step"]}
        with open(report_path, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
