#!/usr/bin/env python3
"""Write a parity bundle without olmoref, for testing hf_parity.py (golden-parity-selftest).

  make_fake_bundle.py --out DIR [--steps S] [--seed N]         a bundle that must pass
  make_fake_bundle.py --from DIR --out DIR2 --perturb KIND     a copy with one defect that must fail

The "ours" side is produced by HF's model itself, but the loss, gradient norm, clipping and AdamW are written out
by hand here from the spec (olmo3-spec.md §3-§4) rather than with torch.nn.functional.cross_entropy,
clip_grad_norm_ and torch.optim.AdamW as hf_parity.py uses them. A passing selftest therefore also checks that
the script's PyTorch recipe means what the spec says.

Perturbations (each must trip the named gate of hf_parity.py):
  grad        one gradient tensor off by 1e-3 relative                    -> max_grad_rel
  logit       +0.05 on the top logit of one token                        -> max_token_kl (top-1 unchanged)
  top1        the two largest logits of one token swapped                -> top1_agreement_pct
  loss0       loss_step0 off by 1e-4 relative                             -> loss_step0_rel
  trace       step-3 loss off by 1e-4 relative                            -> step_loss_rel
  gnorm       step-1 grad norm off by 1e-3 relative                       -> step_grad_norm_rel
  gnorm_late  last step's grad norm off by 1e-3 relative                  -> step_grad_norm_rel
  update      last step's update 1% too large (its lr 1% off)             -> step_update
  decay       last step also decays the no-decay embeddings (lr * wd * p) -> step_update
The state perturbations touch the last step only: an earlier one would also move the next step's loss.
"""
import argparse
import json
import os
import shutil
import sys

# Bundles made with a defect inside training (make(..., defect=KIND)), each must trip exactly the named gate:
#   grad_late   the last step's gradient of one norm weight 1e-3 too large, clipped and applied by our AdamW as it is
#               (a wrong backward at a later step; its share of the grad norm is far below that gate's limit)
MADE_DEFECTS = {"grad_late": "step_grad_rel"}
GRAD_LATE_TENSOR = "model.layers.1.post_attention_layernorm.weight"

PERTURBATIONS = {
    "grad": "max_grad_rel", "logit": "max_token_kl", "top1": "top1_agreement_pct", "loss0": "loss_step0_rel",
    "trace": "step_loss_rel", "gnorm": "step_grad_norm_rel", "gnorm_late": "step_grad_norm_rel",
    "update": "step_update", "decay": "step_update",
}

# A tiny Olmo 3 that still exercises everything: GQA (4:2), head_dim != d/heads, two sliding layers with a window
# shorter than the sequence, a forced-full last layer, non-default theta, untied embeddings.
MODEL = {"name": "parity-fake", "vocab_size": 128, "d_model": 32, "n_layers": 4, "n_heads": 4, "n_kv_heads": 2,
         "head_dim": 12, "ffn_hidden": 48, "rope_theta": 10000.0, "norm_eps": 1e-6, "swa_pattern": [8, 8, -1],
         "init_std": 0.02, "init_seed": 0}


def windows(m):
    L, pat = m["n_layers"], m["swa_pattern"]
    return [0 if (i == L - 1 or pat[i % len(pat)] <= 0) else pat[i % len(pat)] for i in range(L)]


def make(out, steps, seed, B=2, T=24, lr_peak=4e-3, defect=None):
    import numpy as np
    import torch
    from safetensors.numpy import save_file
    from transformers import Olmo3Config, Olmo3ForCausalLM

    from hf_parity import peer_threads

    torch.set_num_threads(peer_threads())
    torch.manual_seed(seed)
    m = MODEL
    w = windows(m)
    assert len({x for x in w if x}) == 1
    cfg = Olmo3Config(
        vocab_size=m["vocab_size"], hidden_size=m["d_model"], intermediate_size=m["ffn_hidden"],
        num_hidden_layers=m["n_layers"], num_attention_heads=m["n_heads"], num_key_value_heads=m["n_kv_heads"],
        head_dim=m["head_dim"], rms_norm_eps=m["norm_eps"], max_position_embeddings=T,
        rope_parameters={lt: {"rope_type": "default", "rope_theta": m["rope_theta"]}
                         for lt in ("full_attention", "sliding_attention")},
        sliding_window=max(w), layer_types=["sliding_attention" if x else "full_attention" for x in w],
        tie_word_embeddings=False, pad_token_id=None, eos_token_id=None, bos_token_id=None)
    model = Olmo3ForCausalLM(cfg).float()
    with torch.no_grad():  # norms away from 1 so a swapped or ignored norm weight shows
        for n, p in model.named_parameters():
            if p.dim() == 1:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
    os.makedirs(out, exist_ok=True)
    model.save_pretrained(os.path.join(out, "hf"))

    rng = np.random.default_rng(seed)
    batches = rng.integers(0, m["vocab_size"], size=(steps, B, T), dtype=np.uint32)
    batches.astype("<u4").tofile(os.path.join(out, "batches.u32"))
    lrs = [lr_peak * min(1.0, s / 3) for s in range(1, steps + 1)]  # a short warmup
    betas, eps, wd, z_mult = (0.9, 0.95), 1e-8, 0.1, 1e-5
    # Not OLMo's 1.0: with this model's gradient norms (~1.3-4.5) 3.0 clips some steps and not others, so both
    # sides of the clamp are exercised.
    max_grad_norm = 3.0
    no_decay = ["model.embed_tokens.weight"]

    def loss_parts(logits, ids):
        # Written from the spec, independent of F.cross_entropy: CE = lse - logit[target], z = 1e-5 lse^2.
        pred, tgt = logits[:, :-1, :], ids[:, 1:]
        lse = torch.logsumexp(pred, dim=-1)
        picked = pred.gather(-1, tgt.unsqueeze(-1)).squeeze(-1)
        n = tgt.numel()
        ce_sum, z_sum = (lse - picked).sum(), z_mult * (lse * lse).sum()
        return (ce_sum + z_sum) / n, ce_sum / n, z_sum / n

    tokens = torch.from_numpy(batches.astype(np.int64))
    named = list(model.named_parameters())
    state = {n: (torch.zeros_like(p), torch.zeros_like(p)) for n, p in named}
    trace, params_after, grads_of_step = [], {}, {}
    for s in range(1, steps + 1):
        model.zero_grad(set_to_none=True)
        logits = model(tokens[s - 1]).logits
        loss, ce, z = loss_parts(logits, tokens[s - 1])
        loss.backward()
        if s == 1:
            step0 = {"logits": logits.detach().numpy().copy()}
            step0.update({f"grad.{n}": p.grad.detach().numpy().copy() for n, p in named})
            loss0, ce0, z0 = loss.item(), ce.item(), z.item()
        lr = lrs[s - 1]
        late = GRAD_LATE_TENSOR if defect == "grad_late" and s == steps else None
        gnorm = adamw_step(torch, named, state, s, lr, (betas, eps, wd, no_decay, max_grad_norm), late,
                           grads_of_step, params_after)
        trace.append({"step": s, "loss": loss.item(), "grad_norm": gnorm, "lr": lr})

    save_file(step0, os.path.join(out, "ours_step0.safetensors"))
    save_file(params_after, os.path.join(out, "ours_params.safetensors"))
    save_file({f"step{k}.{n}": g for k, gs in grads_of_step.items() for n, g in gs.items()},
              os.path.join(out, "ours_grads.safetensors"))
    ours = {"model": m, "seq_len": T, "instances_per_step": B, "steps": steps, "z_loss": z_mult,
            "optim": {"lr_per_step": lrs, "betas": list(betas), "eps": eps, "weight_decay": wd,
                      "max_grad_norm": max_grad_norm, "no_decay": no_decay},
            "loss_step0": loss0, "ce_step0": ce0, "z_step0": z0, "trace": trace}
    with open(os.path.join(out, "ours.json"), "w") as f:
        json.dump(ours, f, indent=1)
    clipped = sum(1 for r in trace if r["grad_norm"] > max_grad_norm)
    print(f"fake bundle: {out} ({steps} steps x {B} x {T}, clipping on {clipped} of {steps} steps)")


def adamw_step(torch, named, state, s, lr, optim, grad_late, grads_of_step, params_after):
    """Step s of both fake bundles' training after its backward: records the gradients (the one of the tensor named
    grad_late, when not None, 1e-3 too large: a wrong backward applied as computed), clips them to max_grad_norm
    and applies AdamW with decoupled decay before the moments (spec §4), recording the weights after it.
    optim = (betas, eps, weight decay, no-decay names, max_grad_norm). Returns the pre-clip gradient norm."""
    betas, eps, wd, no_decay, max_grad_norm = optim
    if grad_late is not None:
        with torch.no_grad():
            dict(named)[grad_late].grad.mul_(1 + 1e-3)
    grads_of_step[s] = {n: p.grad.detach().numpy().copy() for n, p in named}
    gnorm = float(torch.sqrt(sum((p.grad.double() ** 2).sum() for _, p in named)))
    clip = min(1.0, max_grad_norm / (gnorm + 1e-6))
    with torch.no_grad():
        for n, p in named:
            g = p.grad * clip
            m1, m2 = state[n]
            p.mul_(1.0 - lr * (0.0 if n in no_decay else wd))
            m1.mul_(betas[0]).add_((1 - betas[0]) * g)
            m2.mul_(betas[1]).add_((1 - betas[1]) * g * g)
            bc1, bc2 = 1 - betas[0] ** s, 1 - betas[1] ** s
            p.sub_((lr / bc1) * m1 / (m2.sqrt() / bc2 ** 0.5 + eps))
            params_after[f"step{s}.{n}"] = p.detach().numpy().copy()
    return gnorm


def open_copy(src, out):
    """Copies bundle `src` to `out` (unless they are the same) and returns its ours.json, step-0 tensors and
    per-step parameters."""
    from safetensors.numpy import load_file

    if os.path.abspath(src) != os.path.abspath(out):
        shutil.rmtree(out, ignore_errors=True)
        shutil.copytree(src, out)
    ours = json.load(open(os.path.join(out, "ours.json")))
    step0 = {k: v.copy() for k, v in load_file(os.path.join(out, "ours_step0.safetensors")).items()}
    states = {k: v.copy() for k, v in load_file(os.path.join(out, "ours_params.safetensors")).items()}
    return ours, step0, states


def save_copy(out, ours, step0, states):
    from safetensors.numpy import save_file

    save_file(step0, os.path.join(out, "ours_step0.safetensors"))
    save_file(states, os.path.join(out, "ours_params.safetensors"))
    with open(os.path.join(out, "ours.json"), "w") as f:
        json.dump(ours, f, indent=1)


def step0_weights(out):
    """The bundle's step-0 weights under the peer's names (HF's hf/ or OLMo-core's olmo_core/)."""
    from safetensors.numpy import load_file

    for sub in ("hf", "olmo_core"):
        path = os.path.join(out, sub, "model.safetensors")
        if os.path.exists(path):
            return load_file(path)
    raise FileNotFoundError(f"{out}: no hf/ or olmo_core/ model.safetensors")


def perturb_shared(out, ours, step0, states, kind, grad_name, grad_index):
    """The defects both parity checks share (the dense and the MoE one); True when `kind` is one of them."""
    import numpy as np

    S = int(ours["steps"])
    if kind == "grad":
        g = step0[grad_name]
        g.flat[grad_index] += np.float32(1e-3 * np.linalg.norm(g.astype(np.float64)))
    elif kind in ("logit", "top1"):
        row = step0["logits"][1, 5]
        order = np.argsort(row)
        if kind == "logit":
            row[order[-1]] += np.float32(0.05)
        else:
            row[order[-1]], row[order[-2]] = row[order[-2]], row[order[-1]]
    elif kind == "loss0":
        ours["loss_step0"] *= 1 + 1e-4
    elif kind == "trace":
        ours["trace"][2]["loss"] *= 1 + 1e-4
    elif kind == "gnorm":
        ours["trace"][0]["grad_norm"] *= 1 + 1e-3
    elif kind == "gnorm_late":
        ours["trace"][-1]["grad_norm"] *= 1 + 1e-3
    elif kind in ("update", "decay"):
        before = step0_weights(out) if S == 1 else {k[len(f"step{S - 1}."):]: v for k, v in states.items()
                                                     if k.startswith(f"step{S - 1}.")}
        lr, wd = float(ours["optim"]["lr_per_step"][-1]), float(ours["optim"]["weight_decay"])
        for n, p0 in before.items():
            key = f"step{S}.{n}"
            p0 = p0.astype(np.float64)
            if kind == "update":
                states[key] = (p0 + 1.01 * (states[key].astype(np.float64) - p0)).astype(np.float32)
            elif n in ours["optim"]["no_decay"]:
                states[key] = (states[key].astype(np.float64) - lr * wd * p0).astype(np.float32)
    else:
        return False
    return True


def perturb(src, out, kind):
    if kind not in PERTURBATIONS:
        raise SystemExit(f"unknown perturbation {kind!r}; choose one of {', '.join(PERTURBATIONS)}")
    ours, step0, states = open_copy(src, out)
    perturb_shared(out, ours, step0, states, kind, "grad.model.layers.1.self_attn.k_proj.weight", 0)
    save_copy(out, ours, step0, states)


def make_or_perturb(ap, perturbations, perturb, make):
    """The command line both fake-bundle makers share: ap (holding --out and --steps) gains --from and --perturb
    (choices in the order given); either `perturb(src, out, kind)` a copy or `make(args)` a fresh bundle."""
    ap.add_argument("--from", dest="src", help="existing bundle to copy and perturb")
    ap.add_argument("--perturb", choices=perturbations)
    a = ap.parse_args()
    if a.perturb:
        if not a.src:
            ap.error("--perturb needs --from BUNDLE")
        perturb(a.src, a.out, a.perturb)
    else:
        if a.steps < 3:
            ap.error("--steps must be >= 3 (the perturbations touch step 3)")
        make(a)
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1234)
    return make_or_perturb(ap, sorted(PERTURBATIONS), perturb, lambda a: make(a.out, a.steps, a.seed))


if __name__ == "__main__":
    sys.exit(main())
