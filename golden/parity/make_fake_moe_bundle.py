#!/usr/bin/env python3
"""Write a MoE parity bundle without olmoref, from OLMo-core's own model, for testing olmo_core_moe_parity.py.

  make_fake_moe_bundle.py --out DIR [--variant base|alt] [--steps S] [--seed N] [--lr LR]   a bundle that must pass
  make_fake_moe_bundle.py --from DIR --out DIR2 --perturb KIND                              a copy with one defect

The "ours" side is OLMo-core's MoE model (random step-0 weights, OLMo-core's init, then norms moved away from 1
and a router / embedding scale that makes routing decisive), built through a different config path than the
parity script (TransformerConfig.llama_like_moe), with the CPU stand-ins for OLMo-core's Triton MoE kernels
(olmo_core_moe_parity.CPU_KERNELS). Everything around the model is written out here by hand from the bundle
definitions rather than with OLMo-core's train-module helpers the parity script uses: labels and micro-batches by
slicing, CE and z-loss from the logits (lse - logit[target], z * lse^2, over positions 0..T-2, divided by
N = B*(T-1)), the routers' lb and z terms read from each router's accumulators times its weight, the gradient
norm as a float64 sum of squares, clipping and AdamW (decoupled decay first). A passing selftest therefore also
checks that the script's recipe means what the bundle format says.

Variants (both must pass):
  base  2 layers, 4 experts top-2, shared MLP 24, head_dim 12 != d/heads, GQA 4:2, full attention,
        lb "local_batch" scaled by 1/n_layers, router z-loss on, 4 instances in micro-batches of 2
  alt   3 layers, 4 experts top-1, no shared MLP, sliding window 8 on layer 0, lb "instance" unscaled,
        router z-loss off, 3 instances in micro-batches of 2 (an uneven split)

Perturbations (each must trip exactly the named gate, "exit2" must be refused as malformed):
  grad      one expert-weight gradient off by 1e-3 relative        -> max_grad_rel
  logit     +0.05 on the top logit of one token                    -> max_token_kl
  top1      the two largest logits of one token swapped            -> top1_agreement_pct (KL too)
  loss0     loss_step0 off by 1e-4 relative                        -> loss_step0_rel
  ce0       ce_step0 off by 1e-4 relative                          -> ce_step0_rel
  lb        lb_step0 off by 1e-3 relative                          -> lb_step0_rel
  rz        rz_step0 off by 1e-3 relative                          -> rz_step0_rel
  route     one token's rank-1 and rank-2 experts swapped (block 1) -> routing_mismatches
  trace     step-3 loss off by 1e-4 relative                       -> step_loss_rel
  gnorm     step-1 grad norm off by 1e-3 relative                  -> step_grad_norm_rel
  gnorm_late  last step's grad norm off by 1e-3 relative           -> step_grad_norm_rel
  update    last step's update 1% too large (its lr 1% off)        -> step_update
  decay     last step also decays the no-decay embeddings          -> step_update
  badkey    router weight of block 0 renamed in model.safetensors  -> exit 2 naming the key
"""
import argparse
import json
import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

# Bundles made with a defect inside training (make(..., defect=KIND)), each must trip exactly the named gate:
#   grad_late   the last step's gradient of one norm weight 1e-3 too large, clipped and applied by our AdamW as it is
#               (a wrong backward at a later step; its share of the grad norm is far below that gate's limit)
MADE_DEFECTS = {"grad_late": "step_grad_rel"}
GRAD_LATE_TENSOR = "blocks.1.attention_norm.weight"

PERTURBATIONS = {
    "grad": "max_grad_rel", "logit": "max_token_kl", "top1": "top1_agreement_pct", "loss0": "loss_step0_rel",
    "ce0": "ce_step0_rel", "lb": "lb_step0_rel", "rz": "rz_step0_rel", "route": "routing_mismatches",
    "trace": "step_loss_rel", "gnorm": "step_grad_norm_rel", "gnorm_late": "step_grad_norm_rel",
    "update": "step_update", "decay": "step_update", "badkey": "exit2",
}

VARIANTS = {
    "base": {
        "model": {"name": "moe-parity-fake", "vocab_size": 128, "d_model": 32, "n_layers": 2, "n_heads": 4,
                  "n_kv_heads": 2, "head_dim": 12, "ffn_hidden": 0, "rope_theta": 10000.0, "norm_eps": 1e-6,
                  "swa_pattern": [-1], "init_std": 0.02, "init_seed": 0,
                  "moe": {"n_experts": 4, "top_k": 2, "hidden": 16, "shared_hidden": 24, "lb_loss_weight": 0.01,
                          "z_loss_weight": 0.001, "scale_loss_by_num_layers": True, "lb_granularity": "local_batch"}},
        "B": 4, "T": 16, "M": 2,
    },
    "alt": {
        "model": {"name": "moe-parity-fake-alt", "vocab_size": 96, "d_model": 24, "n_layers": 3, "n_heads": 3,
                  "n_kv_heads": 3, "head_dim": 0, "ffn_hidden": 0, "rope_theta": 500000.0, "norm_eps": 1e-5,
                  "swa_pattern": [8, -1], "init_std": 0.02, "init_seed": 0,
                  "moe": {"n_experts": 4, "top_k": 1, "hidden": 20, "shared_hidden": 0, "lb_loss_weight": 0.02,
                          "z_loss_weight": 0.0, "scale_loss_by_num_layers": False, "lb_granularity": "instance"}},
        "B": 3, "T": 20, "M": 2,
    },
}


def build(m):
    """OLMo-core's model for the olmoref ModelConfig `m`, through llama_like_moe (the parity script uses
    llama_like with an explicit MoEConfig)."""
    from olmo_core.nn.attention import SlidingWindowAttentionConfig
    from olmo_core.nn.attention.backend import AttentionBackendName
    from olmo_core.nn.moe.loss import MoELoadBalancingLossGranularity
    from olmo_core.nn.transformer.config import TransformerConfig

    import olmo_core_moe_parity as P

    mo = m["moe"]
    cfg = TransformerConfig.llama_like_moe(
        d_model=m["d_model"], vocab_size=m["vocab_size"], n_layers=m["n_layers"], n_heads=m["n_heads"],
        num_experts=mo["n_experts"], top_k=mo["top_k"], expert_hidden_size=mo["hidden"],
        shared_expert_hidden_size=mo["shared_hidden"] or None, dropless=True,
        lb_loss_weight=mo["lb_loss_weight"] or None, z_loss_weight=mo["z_loss_weight"] or None,
        reordered_norm=True, n_kv_heads=m["n_kv_heads"], head_dim=m["head_dim"] or None,
        layer_norm_eps=m["norm_eps"], rope_theta=int(m["rope_theta"]), attn_backend=AttentionBackendName.torch,
        sliding_window=SlidingWindowAttentionConfig(pattern=m["swa_pattern"], force_full_attention_on_first_layer=False,
                                                    force_full_attention_on_last_layer=True))
    cfg.block.feed_forward_moe.lb_loss_granularity = MoELoadBalancingLossGranularity(mo["lb_granularity"])
    cfg.block.feed_forward_moe.scale_loss_by_num_layers = mo["scale_loss_by_num_layers"]
    P.install_cpu_kernels()
    model = cfg.build(init_device="cpu")
    P.use_torch_gmm(model)
    return model


def make(out, steps=6, seed=1234, variant="base", lr_peak=4e-3, defect=None):
    import numpy as np
    import torch
    from safetensors.numpy import save_file

    from hf_parity import peer_threads
    from make_fake_bundle import adamw_step

    torch.set_num_threads(peer_threads())
    torch.manual_seed(seed)
    v = VARIANTS[variant]
    m, B, T, M = v["model"], v["B"], v["T"], v["M"]
    mo = m["moe"]
    L, E, k = m["n_layers"], mo["n_experts"], mo["top_k"]
    model = build(m)
    model.init_weights(device=torch.device("cpu"))
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.dim() == 1 and n.endswith("norm.weight"):  # norms away from 1 so a swapped or ignored norm shows
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif n.endswith("router.weight"):  # decisive routing: score gaps far above fp32 noise
                p.copy_(0.4 * torch.randn_like(p))
            elif n == "embeddings.weight":
                p.copy_(torch.randn_like(p))
    model.train()
    os.makedirs(os.path.join(out, "olmo_core"), exist_ok=True)
    save_file({n: t.detach().contiguous().numpy().copy() for n, t in model.state_dict().items()},
              os.path.join(out, "olmo_core", "model.safetensors"))

    rng = np.random.default_rng(seed)
    batches = rng.integers(0, m["vocab_size"], size=(steps, B, T), dtype=np.uint32)
    batches.astype("<u4").tofile(os.path.join(out, "batches.u32"))
    lrs = [lr_peak * min(1.0, s / 3) for s in range(1, steps + 1)]
    betas, eps, wd, z_mult = (0.9, 0.95), 1e-8, 0.1, 1e-5
    # Not OLMo's 1.0: with these models' gradient norms (~1.4-2.1 for base) 1.6 clips some steps and not
    # others, so both sides of the clamp are exercised.
    max_grad_norm = 1.6
    no_decay = ["embeddings.weight"]

    routers = [model.blocks[str(i)].feed_forward_moe.router for i in range(L)]
    routed = {}

    def hook(i):
        def fn(module, args, output):
            routed.setdefault(i, []).append(output[1].detach().clone())
        return fn

    hooks = [r.register_forward_hook(hook(i)) for i, r in enumerate(routers)]
    tokens = torch.from_numpy(batches.astype(np.int64))
    named = list(model.named_parameters())
    state = {n: (torch.zeros_like(p), torch.zeros_like(p)) for n, p in named}
    trace, params_after, grads_of_step = [], {}, {}
    n_tgt = B * (T - 1)
    for s in range(1, steps + 1):
        model.zero_grad(set_to_none=True)
        for r in routers:
            r.reset_metrics()
        ce_sum = z_sum = 0.0
        logits_all = []
        for lo in range(0, B, M):  # micro-batches of M instances (the last may be short)
            ids = tokens[s - 1, lo:lo + M]
            logits = model(ids, loss_div_factor=torch.tensor(n_tgt))  # the routers divide by N too
            pred, tgt = logits[:, :-1, :], ids[:, 1:]
            lse = torch.logsumexp(pred, dim=-1)
            picked = pred.gather(-1, tgt.unsqueeze(-1)).squeeze(-1)
            ce_mb, z_mb = (lse - picked).sum(), z_mult * (lse * lse).sum()
            ((ce_mb + z_mb) / n_tgt).backward()  # the routers' aux losses ride along on the activations
            ce_sum += ce_mb.item()
            z_sum += z_mb.item()
            logits_all.append(logits.detach())
        lb = sum(float(r.lb_loss_weight * r.load_balancing_loss) for r in routers if r.lb_loss_weight is not None)
        rz = sum(float(r.z_loss_weight * r.z_loss) for r in routers if r.z_loss_weight is not None)
        ce, z = ce_sum / n_tgt, z_sum / n_tgt
        loss = ce + z + lb + rz
        if s == 1:
            for h in hooks:
                h.remove()
            step0 = {"logits": torch.cat(logits_all).numpy().copy()}
            step0.update({f"grad.{n}": p.grad.detach().numpy().copy() for n, p in named})
            for i in range(L):
                step0[f"routing.blocks.{i}"] = torch.cat(routed[i]).numpy().astype(np.int32)
                assert step0[f"routing.blocks.{i}"].shape == (B, T, k)
            first = {"loss_step0": loss, "ce_step0": ce, "z_step0": z, "lb_step0": lb, "rz_step0": rz}
        lr = lrs[s - 1]
        late = GRAD_LATE_TENSOR if defect == "grad_late" and s == steps else None
        gnorm = adamw_step(torch, named, state, s, lr, (betas, eps, wd, no_decay, max_grad_norm), late,
                           grads_of_step, params_after)
        trace.append({"step": s, "loss": loss, "ce": ce, "lb": lb, "rz": rz, "grad_norm": gnorm, "lr": lr})

    save_file(step0, os.path.join(out, "ours_step0.safetensors"))
    save_file(params_after, os.path.join(out, "ours_params.safetensors"))
    save_file({f"step{k}.{n}": g for k, gs in grads_of_step.items() for n, g in gs.items()},
              os.path.join(out, "ours_grads.safetensors"))
    ours = {"model": m, "seq_len": T, "instances_per_step": B, "micro_batch_instances": M, "steps": steps,
            "z_loss": z_mult,
            "optim": {"lr_per_step": lrs, "betas": list(betas), "eps": eps, "weight_decay": wd,
                      "max_grad_norm": max_grad_norm, "no_decay": no_decay}}
    ours.update(first)
    ours["trace"] = trace
    with open(os.path.join(out, "ours.json"), "w") as f:
        json.dump(ours, f, indent=1)
    clipped = sum(1 for r in trace if r["grad_norm"] > max_grad_norm)
    print(f"fake MoE bundle ({variant}): {out} ({steps} steps x {B} x {T}, micro-batches of {M}, clipping on "
          f"{clipped} of {steps} steps, step-1 lb {first['lb_step0']:.6g} rz {first['rz_step0']:.6g})")


def perturb(src, out, kind):
    from safetensors.numpy import load_file, save_file
    from make_fake_bundle import open_copy, perturb_shared, save_copy

    if kind not in PERTURBATIONS:
        raise SystemExit(f"unknown perturbation {kind!r}; choose one of {', '.join(PERTURBATIONS)}")
    ours, step0, states = open_copy(src, out)
    if perturb_shared(out, ours, step0, states, kind, "grad.blocks.1.feed_forward_moe.experts.mlp.w2", 7):
        pass
    elif kind == "ce0":
        ours["ce_step0"] *= 1 + 1e-4
    elif kind in ("lb", "rz"):
        ours[f"{kind}_step0"] *= 1 + 1e-3
    elif kind == "route":
        r = step0["routing.blocks.1"]
        if r.shape[-1] >= 2:
            r[2, 3, 0], r[2, 3, 1] = r[2, 3, 1], r[2, 3, 0]
        else:
            r[2, 3, 0] = (r[2, 3, 0] + 1) % ours["model"]["moe"]["n_experts"]
    elif kind == "badkey":
        w = load_file(os.path.join(out, "olmo_core", "model.safetensors"))
        w["blocks.0.feed_forward_moe.router.w"] = w.pop("blocks.0.feed_forward_moe.router.weight")
        save_file(w, os.path.join(out, "olmo_core", "model.safetensors"))
    save_copy(out, ours, step0, states)


def main():
    import warnings

    warnings.filterwarnings("ignore", message="Grouped GEMM not available")
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--variant", choices=sorted(VARIANTS), default="base")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--lr", type=float, default=4e-3, help="peak lr (3-step warmup)")
    from make_fake_bundle import make_or_perturb

    return make_or_perturb(ap, list(PERTURBATIONS), perturb, lambda a: make(a.out, a.steps, a.seed, a.variant, a.lr))


if __name__ == "__main__":
    sys.exit(main())
