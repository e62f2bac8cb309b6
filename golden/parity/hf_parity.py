#!/usr/bin/env python3
"""Compare an olmoref parity bundle against Hugging Face transformers' Olmo3ForCausalLM.

Usage: hf_parity.py --bundle DIR [--report FILE.json] [--precision fp32|bf16] [--attn eager|sdpa]

The bundle (written by `olmoref parity-dump`, see golden/parity/README.md) holds our step-0 weights as an HF
checkpoint, the token batches, our step-1 logits and gradients, our weights after every step and our per-step loss
trace. This script rebuilds the same model in PyTorch (fp32, eager attention, no TF32, deterministic) and compares
the step-1 batch; then it re-runs every step k in float64 from our weights after k-1 steps, with OLMo-core's loss,
clipping and torch AdamW, and checks our loss, grad norm and updated weights against it (teacher_forced: one step's
rounding, never a trajectory's amplification of it). HF fp32 also trains the steps freely, for the report.

A *logits bundle* (written by `olmoref golden logits`, train/golden_logits.h) holds our logits for long real-text
windows, at trained weights, in fp32 or bf16. For it the script loads the same weights into HF in the bundle's
precision (`--precision` must agree) and in fp32, and compares logits only: per-token KL and top-1 agreement of ours
against HF at the same precision (gated, LOGITS_THRESHOLDS), plus both against HF fp32 (reported: the bf16 noise
floor). MaxText reports KL ~1.5e-3 and 98.75% top-1 agreement in bf16; the gates require at least that.

Exit status: 0 every gate passed; 1 a gate failed (each failure is printed and listed in the report);
2 the bundle is malformed or inconsistent (nothing was compared).
"""
import argparse
import json
import math
import os
import sys

# Gates. A fp32 reimplementation in a different framework agrees to ~1e-7 relative; these leave room for
# reduction-order noise but catch any real semantic difference (a wrong mask, eps, scale or update rule moves
# these numbers by orders of magnitude more).
THRESHOLDS = {
    "top1_agreement_pct": 100.0,   # must equal (near-ties excused, see compare_logits)
    "max_token_kl": 1e-6,          # max over tokens of KL(ours||hf) and KL(hf||ours)
    "max_grad_rel": 1e-4,          # max over tensors of ||g_ours - g_hf|| / ||g_hf||
    "loss_step0_rel": 1e-5,        # |loss_ours - loss_hf| / |loss_hf| on the step-1 batch
    # The trained steps, each judged on its own (teacher_forced): step k is re-run in float64 from OUR weights
    # after k-1 steps (ours_params.safetensors), with the peer's model, loss, clipping and torch AdamW, the moments
    # carried in float64 from step 1. Every quantity is then one step's rounding away from exact arithmetic,
    # never a trajectory's amplification of it, so the limits below hold with a wide margin on any machine
    # (README.md, "Why every step is judged from our own weights").
    "step_loss_rel": 1e-5,         # max over steps of our loss vs the fp64 loss at our weights
    "step_grad_norm_rel": 1e-4,    # max over steps of our pre-clip grad norm vs the fp64 one (clipping hides it)
    "step_grad_rel": 1e-4,         # max over steps and tensors of ||g_ours - g_fp64|| / ||g_fp64||
    # Our weights after each step against torch AdamW's update in float64 of the same weights with OUR gradient of
    # that step (teacher_forced), per tensor:
    #   ||p_ours - p_fp64|| <= STEP_UPDATE_RTOL * ||p_fp64 - p_before|| + STEP_UPDATE_ULPS * ||ulp32(p_fp64)||
    # gated as the max over steps and tensors of the left side divided by the right (<= 1). With the gradient the
    # same, what remains is our fp32 AdamW's own rounding: a few roundings at the magnitude of the weights (the ulp
    # term: correct code sits at ~0.7 ulp rms) and at the magnitude of the update (the relative term). A wrong lr,
    # bias correction, eps, decay, decay order or clip exceeds the allowance by orders of magnitude wherever the
    # update is more than a few ulps of the weights (golden/parity/README.md has the figures).
    "step_update": 1.0,
    "max_step_lr_rel": 1e-6,       # the lr our trace reports vs the lr_per_step it declared
}
STEP_UPDATE_RTOL = 1e-5
STEP_UPDATE_ULPS = 4.0
# Two logits closer than this (relative) are a tie: argmax may pick either side without any real disagreement.
TIE_RTOL = 1e-6
# Logits bundles (bf16 parity): ours vs HF at the same precision, every position of every window. The bf16 gates are
# MaxText's published bf16 figures (KL ~1.5e-3, top-1 98.75% at 8192 tokens), applied to the *max* per-token KL in
# both directions and to *strict* top-1 agreement (no near-tie excuse).
LOGITS_THRESHOLDS = {
    "bf16": {"max_token_kl": 1.5e-3, "top1_strict_agreement_pct": 98.75},
    "fp32": {"max_token_kl": 1e-6, "top1_agreement_pct": 100.0},
}


class BundleError(Exception):
    pass


def rel(a, b):
    """Relative difference of `a` from the reference `b`."""
    if a == b:
        return 0.0
    return abs(a - b) / max(abs(b), 1e-30)


def peer_threads():
    """torch's CPU threads: $OLMOREF_PEER_THREADS (the suite sets 1: two tests run at once), else 2."""
    return int(os.environ.get("OLMOREF_PEER_THREADS", "2"))


# torch in true fp32 (no reduced-precision matmuls), deterministic: the replays' setup (golden/replay/bundle.py).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "replay"))
from bundle import setup_torch  # noqa: E402


REQUIRED_OPTIM = ("lr_per_step", "betas", "eps", "weight_decay", "max_grad_norm", "no_decay")


def load_bundle_core(d, required_top, what="a directory"):
    """What every parity bundle holds (this script's and olmo_core_moe_parity.py's): ours.json with the
    `required_top` keys, its optim and trace consistent with `steps`, and batches.u32 [S, B, T]. Returns
    (ours, batches, need), need(path) raising BundleError for a missing file; `what` names the bundle kind in it."""
    import numpy as np

    def need(path):
        if not os.path.exists(path):
            raise BundleError(f"{path}: missing (is {d} {what} written by `olmoref parity-dump`?)")
        return path

    try:
        ours = json.load(open(need(os.path.join(d, "ours.json"))))
    except json.JSONDecodeError as e:
        raise BundleError(f"{d}/ours.json: not valid JSON: {e}")
    for key in required_top:
        if key not in ours:
            raise BundleError(f"{d}/ours.json: missing key '{key}'")
    S, B, T = int(ours["steps"]), int(ours["instances_per_step"]), int(ours["seq_len"])
    if S < 1 or B < 1 or T < 2:
        raise BundleError(f"{d}/ours.json: need steps >= 1, instances_per_step >= 1, seq_len >= 2 (got {S}, {B}, {T})")
    optim = ours["optim"]
    for key in REQUIRED_OPTIM:
        if key not in optim:
            raise BundleError(f"{d}/ours.json: missing optim.{key}")
    if len(optim["lr_per_step"]) != S:
        raise BundleError(f"{d}/ours.json: optim.lr_per_step has {len(optim['lr_per_step'])} entries for {S} steps")
    if len(ours["trace"]) != S or [r.get("step") for r in ours["trace"]] != list(range(1, S + 1)):
        raise BundleError(f"{d}/ours.json: trace must hold steps 1..{S} in order")

    raw = np.fromfile(need(os.path.join(d, "batches.u32")), dtype="<u4")
    if raw.size != S * B * T:
        raise BundleError(f"{d}/batches.u32: {raw.size} tokens, expected steps*instances*seq_len = {S}*{B}*{T}")
    return ours, raw.reshape(S, B, T), need


def load_bundle(d):
    from safetensors.numpy import load_file

    ours, batches, need = load_bundle_core(
        d, ("model", "seq_len", "instances_per_step", "steps", "z_loss", "optim", "loss_step0", "trace"))
    step0 = load_file(need(os.path.join(d, "ours_step0.safetensors")))
    if "logits" not in step0:
        raise BundleError(f"{d}/ours_step0.safetensors: no 'logits' tensor")
    need(os.path.join(d, "hf", "config.json"))
    return ours, batches, step0


def olmo_loss(torch, logits, ids, z_loss):
    """OLMo-core's pretraining loss for one step batch (spec §3): labels are ids shifted left, the last position of
    each instance is ignored, CE and z-loss are summed and divided by the number of targets in the step batch.
    Returns (loss, ce, z) with ce + z == loss, both already divided by N (z includes the multiplier)."""
    pred = logits[:, :-1, :]
    if pred.dtype in (torch.bfloat16, torch.float16):
        pred = pred.float()
    target = ids[:, 1:]
    n = target.numel()
    ce_sum = torch.nn.functional.cross_entropy(pred.reshape(-1, pred.shape[-1]), target.reshape(-1), reduction="sum")
    z_sum = z_loss * torch.logsumexp(pred, dim=-1).pow(2).sum()
    return (ce_sum + z_sum) / n, ce_sum / n, z_sum / n


def compare_logits(torch, ours, hf, peer="hf"):
    """ours, hf: [B, T, V] fp32 (hf: the peer's logits; `peer` names it in the keys, e.g. "oc" for OLMo-core).
    KL and top-1 in float64 over every position."""
    o = ours.double()
    h = hf.double()
    lo = torch.log_softmax(o, dim=-1)
    lh = torch.log_softmax(h, dim=-1)
    kl_oh = (lo.exp() * (lo - lh)).sum(-1)
    kl_ho = (lh.exp() * (lh - lo)).sum(-1)
    ao, ah = o.argmax(-1), h.argmax(-1)
    agree = ao == ah
    # A position where both models see the two candidates within TIE_RTOL of each other is a near-tie, not a
    # disagreement: 1e-7-level noise may legitimately flip which one argmax returns.
    h_at_o = h.gather(-1, ao.unsqueeze(-1)).squeeze(-1)
    h_at_h = h.gather(-1, ah.unsqueeze(-1)).squeeze(-1)
    o_at_o = o.gather(-1, ao.unsqueeze(-1)).squeeze(-1)
    o_at_h = o.gather(-1, ah.unsqueeze(-1)).squeeze(-1)
    scale = torch.clamp(h_at_h.abs(), min=1.0)
    tie = (~agree) & ((h_at_h - h_at_o) <= TIE_RTOL * scale) & ((o_at_o - o_at_h) <= TIE_RTOL * scale)
    n = agree.numel()
    worst = int(torch.maximum(kl_oh, kl_ho).argmax())
    return {
        "positions": n,
        "max_abs_diff": float((o - h).abs().max()),
        "max_abs_logit": float(h.abs().max()),
        f"kl_ours_{peer}_max": float(kl_oh.max()),
        f"kl_ours_{peer}_mean": float(kl_oh.mean()),
        f"kl_{peer}_ours_max": float(kl_ho.max()),
        f"kl_{peer}_ours_mean": float(kl_ho.mean()),
        "worst_kl_position": [worst // ours.shape[1], worst % ours.shape[1]],
        "top1_agreement_pct": 100.0 * float((agree | tie).sum()) / n,
        "top1_strict_agreement_pct": 100.0 * float(agree.sum()) / n,
        "top1_near_ties": int(tie.sum()),
    }


def check_model_config(model_cfg, hf_cfg):
    """The bundle's ModelConfig must describe the HF checkpoint beside it; returns mismatch lines."""
    bad = []
    model_cfg = dict(model_cfg)
    if not model_cfg.get("head_dim") and model_cfg.get("n_heads"):  # ModelConfig: 0 means d_model / n_heads
        model_cfg["head_dim"] = model_cfg["d_model"] // model_cfg["n_heads"]
    pairs = [("vocab_size", "vocab_size"), ("d_model", "hidden_size"), ("n_layers", "num_hidden_layers"),
             ("n_heads", "num_attention_heads"), ("n_kv_heads", "num_key_value_heads"),
             ("head_dim", "head_dim"), ("ffn_hidden", "intermediate_size")]
    for ours_key, hf_key in pairs:
        if ours_key in model_cfg and model_cfg[ours_key] != getattr(hf_cfg, hf_key, None):
            bad.append(f"model.{ours_key} = {model_cfg[ours_key]} but HF {hf_key} = {getattr(hf_cfg, hf_key, None)}")
    if "rope_theta" in model_cfg:
        for lt, rp in hf_cfg.rope_parameters.items():
            if rel(rp["rope_theta"], model_cfg["rope_theta"]) > 1e-12:
                bad.append(f"model.rope_theta = {model_cfg['rope_theta']} but HF {lt} theta = {rp['rope_theta']}")
    if "norm_eps" in model_cfg and rel(hf_cfg.rms_norm_eps, model_cfg["norm_eps"]) > 1e-6:
        bad.append(f"model.norm_eps = {model_cfg['norm_eps']} but HF rms_norm_eps = {hf_cfg.rms_norm_eps}")
    if "swa_pattern" in model_cfg and "n_layers" in model_cfg:
        pat, L = model_cfg["swa_pattern"], model_cfg["n_layers"]
        for i in range(L):  # ModelConfig::window: the last layer is always full
            w = 0 if (i == L - 1 or not pat or pat[i % len(pat)] <= 0) else pat[i % len(pat)]
            hf_w = hf_cfg.sliding_window if hf_cfg.layer_types[i] == "sliding_attention" else 0
            if w != hf_w:
                bad.append(f"layer {i}: our window {w or 'full'} but HF {hf_cfg.layer_types[i]} "
                           f"(window {hf_w or 'full'})")
    return bad


def exact_rope(torch, model):
    """HF computes the RoPE angles and their cos/sin in fp32 whatever the model's dtype; the float64 runs must be
    exact throughout, so its rotary embedding is recomputed in float64 from the config's theta per layer type."""
    rot = model.model.rotary_emb
    cfg = model.config
    dim = cfg.head_dim
    for lt, rp in cfg.rope_parameters.items():
        if rp.get("rope_type", "default") != "default":
            raise BundleError(f"hf/config.json: rope_type {rp.get('rope_type')!r} for {lt}; the float64 runs "
                              "implement the default RoPE only")

    def forward(x, position_ids, layer_type):
        theta = float(cfg.rope_parameters[layer_type]["rope_theta"])
        inv_freq = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
        freqs = position_ids[..., None].to(torch.float64) * inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()

    rot.forward = forward


def adamw(torch, model, optim):
    """torch AdamW over `model`'s parameters in the bundle's two groups (no weight decay for optim.no_decay), as
    OLMo-core builds it; returns (optimizer, parameter list)."""
    nd = set(optim["no_decay"])
    named = list(model.named_parameters())
    groups = [{"params": [p for n, p in named if n not in nd], "weight_decay": float(optim["weight_decay"])},
              {"params": [p for n, p in named if n in nd], "weight_decay": 0.0}]
    groups = [g for g in groups if g["params"]]
    opt = torch.optim.AdamW(groups, lr=float(optim["lr_per_step"][0]), betas=tuple(float(b) for b in optim["betas"]),
                            eps=float(optim["eps"]), foreach=False, fused=False)
    return opt, [p for _, p in named]


def optimizer_step(torch, opt, params, optim, s):
    """Step s's update from the gradients in .grad: OLMo-core's clip_grad_norm_ (coef = max_norm / (norm + 1e-6),
    clamped to 1) and torch AdamW at lr_per_step[s-1]. Returns (pre-clip norm, lr)."""
    gn = torch.nn.utils.clip_grad_norm_(params, float(optim["max_grad_norm"]), foreach=False)
    lr = float(optim["lr_per_step"][s - 1])
    for g in opt.param_groups:
        g["lr"] = lr
    opt.step()
    return float(gn), lr


def train_steps(torch, model, tokens, z_loss, optim):
    """Trains `model` (in its own dtype) on tokens[0..S-1] with OLMo-core's loss, clipping and torch AdamW at the
    bundle's per-step lr; returns [(loss before the update, pre-clip grad norm, lr)] per step."""
    opt, params = adamw(torch, model, optim)
    out = []
    for s in range(1, tokens.shape[0] + 1):
        opt.zero_grad(set_to_none=True)
        loss, _, _ = olmo_loss(torch, model(tokens[s - 1]).logits, tokens[s - 1], z_loss)
        loss.backward()
        gn, lr = optimizer_step(torch, opt, params, optim, s)
        out.append((loss.item(), gn, lr))
    return out


def load_per_step(d, file, shapes, steps, what):
    """`file` (ours_params / ours_grads.safetensors): `step<k>.<name>` F32 for k = 1..steps, every parameter of
    `shapes` ({name: shape}, the peer's names) and nothing else; `what` says what they hold, for the errors.
    Returns {k: {name: array}}."""
    import numpy as np
    from safetensors.numpy import load_file

    path = os.path.join(d, file)
    if not os.path.exists(path):
        raise BundleError(f"{path}: missing ({what}; written by `olmoref parity-dump` since the per-step gates: "
                          "dump the bundle again)")
    try:
        raw = load_file(path)
    except Exception as e:  # safetensors raises its own error types for a corrupt header
        raise BundleError(f"{path}: cannot read: {e}")
    want = {f"step{k}.{n}" for k in range(1, steps + 1) for n in shapes}
    missing, extra = sorted(want - raw.keys()), sorted(raw.keys() - want)
    if missing or extra:
        raise BundleError(f"{path}: missing {missing[:5]}, unknown tensors {extra[:5]} (want step1..step{steps} of "
                          "every parameter)")
    out = {k: {} for k in range(1, steps + 1)}
    for key, a in raw.items():
        k, n = key.split(".", 1)
        if a.dtype != np.float32 or tuple(a.shape) != tuple(shapes[n]):
            raise BundleError(f"{path}: {key} is {a.dtype} {tuple(a.shape)}, expected F32 {tuple(shapes[n])}")
        out[int(k[len("step"):])][n] = a
    return out


def load_steps(d, shapes, steps):
    """Our weights after every step and every step's pre-clip gradient: (params, grads), each {k: {name: array}}."""
    return (load_per_step(d, "ours_params.safetensors", shapes, steps, "our weights after every step"),
            load_per_step(d, "ours_grads.safetensors", shapes, steps, "our pre-clip gradient of every step"))


def teacher_forced(torch, model, params_after, grads, optim, backward):
    """Every step on its own, from our weights. For k = 1..S: `model` (float64, holding the step-0 weights) is set to
    our weights after k-1 steps (params_after[k-1]; the bundle's step-0 weights for k = 1) and `backward(model, k)`
    runs step k's forward and backward in float64 and returns its logged terms ({"loss": ...}): our loss, pre-clip
    gradient and grad norm are judged against those. Then torch AdamW, its moments carried in float64 from step 1,
    is fed OUR gradient of step k (grads[k]; clipped by its norm), and its update is compared with our weights
    after step k: that isolates our optimizer's arithmetic. Feeding the fp64 gradient instead would turn the
    rounding noise of gradient elements near eps into AdamW's g / (|g| + eps) and swamp the check.

    Returns per step: the terms; grad_norm (of the fp64 gradient); the tensor whose gradient differs most
    (grad_rel = ||g_ours - g_fp64|| / ||g_fp64||); the lr; and for the tensor that uses most of its update
    allowance: update_excess = ||p_ours - p_fp64|| / (STEP_UPDATE_RTOL ||p_fp64 - p_before|| + STEP_UPDATE_ULPS
    ||ulp32(p_fp64)||), with its error relative to the update and in ulps."""
    import numpy as np

    opt, params = adamw(torch, model, optim)
    named = list(model.named_parameters())
    out = []
    for k in range(1, len(params_after) + 1):
        with torch.no_grad():
            if k > 1:
                for n, p in named:
                    p.copy_(torch.from_numpy(params_after[k - 1][n]))
            before = {n: p.detach().clone() for n, p in named}
        opt.zero_grad(set_to_none=True)
        terms = backward(model, k)
        rec = dict(terms, grad_rel=-1.0)
        total = 0.0
        with torch.no_grad():
            for n, p in named:
                g64 = p.grad.detach().numpy()
                total += float(np.dot(g64.ravel(), g64.ravel()))
                num, den = float(np.linalg.norm(grads[k][n].astype(np.float64) - g64)), float(np.linalg.norm(g64))
                r = 0.0 if num == 0 else (num / den if den > 0 else math.inf)
                if r > rec["grad_rel"]:
                    rec.update(grad_rel=r, grad_worst_tensor=n)
                p.grad.copy_(torch.from_numpy(grads[k][n]))
        rec["grad_norm"] = math.sqrt(total)
        _, rec["lr"] = optimizer_step(torch, opt, params, optim, k)
        rec["update_excess"] = -1.0
        with torch.no_grad():
            for n, p in named:
                exact = p.detach().numpy()
                err = float(np.linalg.norm(params_after[k][n].astype(np.float64) - exact))
                upd = float(np.linalg.norm(exact - before[n].numpy()))
                ulp = float(np.linalg.norm(np.spacing(np.abs(exact).astype(np.float32)).astype(np.float64)))
                allowed = STEP_UPDATE_RTOL * upd + STEP_UPDATE_ULPS * ulp
                excess = 0.0 if err == 0 else (err / allowed if allowed > 0 else math.inf)
                if excess > rec["update_excess"]:
                    rec.update(update_excess=excess, update_worst_tensor=n,
                               update_err_rel=err / upd if upd > 0 else math.inf, update_err_ulps=err / ulp)
        out.append(rec)
    return out


# The peer's results keyed by the content of their inputs, when a caller sets PEER_CACHE to a dict: the selftests
# check many bundles that share weights and batches and differ only on our side (each planted defect), and the
# peer's runs are deterministic functions of those inputs, so each is computed once per process.
PEER_CACHE = None


def content_key(*parts):
    """SHA-256 over the parts: bytes, numpy arrays (their bytes), or anything json can write."""
    import hashlib

    import numpy as np

    h = hashlib.sha256()
    for x in parts:
        if isinstance(x, np.ndarray):
            x = np.ascontiguousarray(x).tobytes()
        elif not isinstance(x, bytes):
            x = json.dumps(x, sort_keys=True).encode()
        h.update(len(x).to_bytes(8, "little"))
        h.update(x)
    return h.hexdigest()


def cached(key, compute):
    if PEER_CACHE is None:
        return compute()
    if key not in PEER_CACHE:
        PEER_CACHE[key] = compute()
    return PEER_CACHE[key]


def steps_key(*per_step):
    """Every array of our per-step tensors, in a fixed order (teacher_forced starts from them, feeds them and
    compares with them)."""
    return [d[k][n] for d in per_step for k in sorted(d) for n in sorted(d[k])]


def hf_model(torch, bundle, dtype, attn="eager"):
    from transformers import Olmo3ForCausalLM

    model = Olmo3ForCausalLM.from_pretrained(os.path.join(bundle, "hf"), dtype=dtype, attn_implementation=attn)
    # HF gives the pad row a zero gradient (nn.Embedding padding_idx); OLMo-core trains every row.
    model.model.embed_tokens.padding_idx = None
    if dtype == torch.float64:
        exact_rope(torch, model)
    model.train()
    return model


def run(bundle, threads):
    torch = setup_torch(threads)
    import transformers

    ours, batches, step0 = load_bundle(bundle)
    S, B, T = batches.shape
    z_loss = float(ours["z_loss"])
    optim = ours["optim"]

    transformers.utils.logging.disable_progress_bar()
    model = hf_model(torch, bundle, torch.float32)
    V = model.config.vocab_size
    bad_cfg = check_model_config(ours["model"], model.config)
    if bad_cfg:
        raise BundleError("ours.json model does not match hf/config.json:\n  - " + "\n  - ".join(bad_cfg))
    if int(batches.max()) >= V:
        raise BundleError(f"batches.u32 holds token {int(batches.max())} >= vocab_size {V}")
    names = [n for n, _ in model.named_parameters()]
    if tuple(step0["logits"].shape) != (B, T, V):
        raise BundleError(f"ours_step0.safetensors: logits shape {step0['logits'].shape}, expected {(B, T, V)}")
    missing = [n for n in names if f"grad.{n}" not in step0]
    extra = sorted(k for k in step0 if k != "logits" and k[len("grad."):] not in names)
    if missing or extra:
        raise BundleError(f"ours_step0.safetensors: gradients missing for {missing[:5]}, unknown tensors {extra[:5]}")
    for n, p in model.named_parameters():
        if tuple(step0[f"grad.{n}"].shape) != tuple(p.shape):
            raise BundleError(f"ours_step0.safetensors: grad.{n} shape {step0[f'grad.{n}'].shape} != {tuple(p.shape)}")
    unknown_nd = [n for n in optim["no_decay"] if n not in names]
    if unknown_nd:
        raise BundleError(f"ours.json optim.no_decay names unknown parameters {unknown_nd}")
    params_after, grads = load_steps(bundle, {n: tuple(p.shape) for n, p in model.named_parameters()}, S)

    tokens = torch.from_numpy(batches.astype("int64"))
    report = {"bundle": os.path.abspath(bundle), "thresholds": THRESHOLDS,
              "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
              "shape": {"steps": S, "instances_per_step": B, "seq_len": T, "vocab_size": V}}
    inputs = content_key(open(os.path.join(bundle, "hf", "model.safetensors"), "rb").read(), batches, z_loss, optim)

    def peer_fp32():
        """Step 1 at the step-0 weights (logits, loss, gradients), then the S steps trained freely by HF fp32."""
        model.zero_grad(set_to_none=True)
        logits = model(tokens[0]).logits
        loss, ce, z = olmo_loss(torch, logits, tokens[0], z_loss)
        loss.backward()
        out = {"logits": logits.detach(), "loss": loss.item(), "ce": ce.item(), "z": z.item(),
               "grads": {n: p.grad.double() for n, p in model.named_parameters()}}
        out["steps"] = train_steps(torch, model, tokens, z_loss, optim)
        return out

    def peer_fp64():
        def backward(mdl, k):
            loss, ce, z = olmo_loss(torch, mdl(tokens[k - 1]).logits, tokens[k - 1], z_loss)
            loss.backward()
            return {"loss": loss.item(), "ce": ce.item(), "z": z.item()}
        return teacher_forced(torch, hf_model(torch, bundle, torch.float64), params_after, grads, optim, backward)

    hf = cached(("hf-fp32", inputs), peer_fp32)
    tf = cached(("hf-fp64-teacher-forced", inputs, content_key(*steps_key(params_after, grads))), peer_fp64)

    # ---- step-1 batch at the step-0 weights: logits, loss, gradients against HF fp32 ---------------------
    report["logits"] = compare_logits(torch, torch.from_numpy(step0["logits"].copy()), hf["logits"])
    report["loss_step0"] = {
        "ours": {"loss": ours["loss_step0"], "ce": ours.get("ce_step0"), "z": ours.get("z_step0")},
        "hf": {"loss": hf["loss"], "ce": hf["ce"], "z": hf["z"]},
        "loss_rel": rel(float(ours["loss_step0"]), hf["loss"]),
        "ce_rel": rel(float(ours["ce_step0"]), hf["ce"]) if "ce_step0" in ours else None,
        "z_rel": rel(float(ours["z_step0"]), hf["z"]) if "z_step0" in ours else None,
        "trace1_vs_loss_step0_rel": rel(float(ours["trace"][0]["loss"]), float(ours["loss_step0"])),
    }
    report["grads"] = compare_grads(torch, names, step0, hf["grads"], "hf")

    # ---- every step from our weights against fp64 (gated); HF fp32's own free run beside it (reported) ------
    steps = []
    for s in range(1, S + 1):
        rec = ours["trace"][s - 1]
        x, (loss_hf, gn_hf, _) = tf[s - 1], hf["steps"][s - 1]
        steps.append({
            "step": s, "loss_ours": rec["loss"], "loss_fp64": x["loss"], "loss_rel": rel(rec["loss"], x["loss"]),
            "grad_norm_ours": rec.get("grad_norm"), "grad_norm_fp64": x["grad_norm"],
            "grad_norm_rel": rel(rec["grad_norm"], x["grad_norm"]) if "grad_norm" in rec else None,
            **{key: x[key] for key in ("grad_rel", "grad_worst_tensor", "update_excess", "update_worst_tensor",
                                       "update_err_rel", "update_err_ulps")},
            "lr_ours": rec.get("lr"), "lr": x["lr"], "lr_rel": rel(rec["lr"], x["lr"]) if "lr" in rec else None,
            "loss_peer_free": loss_hf, "loss_ours_vs_peer_free": rel(rec["loss"], loss_hf), "grad_norm_peer_free": gn_hf,
        })
    return with_steps(report, steps, "HF fp32 eager")


def compare_grads(torch, names, step0, peer_grads, peer):
    """Our step-1 gradient of each tensor in `names` (step0's grad.NAME) against the peer's (fp64): the relative
    difference of the norms per tensor, both norms (the peer's under norm_PEER) and the worst tensor."""
    per_tensor = {}
    for n in names:
        g_peer = peer_grads[n]
        g_ours = torch.from_numpy(step0[f"grad.{n}"].copy()).double()
        num, den = float((g_ours - g_peer).norm()), float(g_peer.norm())
        per_tensor[n] = {"rel": 0.0 if num == 0 else (num / den if den > 0 else math.inf),
                         f"norm_{peer}": den, "norm_ours": float(g_ours.norm())}
    worst = max(per_tensor, key=lambda k: per_tensor[k]["rel"])
    return {"max_rel": per_tensor[worst]["rel"], "worst_tensor": worst, "per_tensor": per_tensor}


def with_steps(report, steps, peer_run):
    """The report with the per-step records and the gap to the peer's free run (`peer_run` names that run)."""
    report["steps"] = steps
    report["free_run"] = {
        "what": f"{peer_run} trained freely from the step-0 weights (not gated: two fp32 trajectories part by "
                "their own amplification of rounding)",
        "max_loss_ours_vs_peer": max(r["loss_ours_vs_peer_free"] for r in steps),
    }
    return report


def gate(report):
    """Returns [(gate, value, limit, text)] for each failed gate."""
    fails = []
    lg, g, l0, steps = report["logits"], report["grads"], report["loss_step0"], report["steps"]

    def over(name, value, limit, text):
        if not (value <= limit):  # also catches NaN
            fails.append((name, value, limit, text))

    if lg["top1_agreement_pct"] < THRESHOLDS["top1_agreement_pct"]:
        fails.append(("top1_agreement_pct", lg["top1_agreement_pct"], THRESHOLDS["top1_agreement_pct"],
                      f"top-1 agreement {lg['top1_agreement_pct']:.4f}% < 100%"))
    kl = max(lg["kl_ours_hf_max"], lg["kl_hf_ours_max"])
    over("max_token_kl", kl, THRESHOLDS["max_token_kl"],
         f"max per-token KL {kl:.3e} (at instance/position {lg['worst_kl_position']})")
    over("max_grad_rel", g["max_rel"], THRESHOLDS["max_grad_rel"],
         f"gradient relative difference {g['max_rel']:.3e} in {g['worst_tensor']}")
    over("loss_step0_rel", l0["loss_rel"], THRESHOLDS["loss_step0_rel"],
         f"step-0 loss ours {l0['ours']['loss']!r} vs hf {l0['hf']['loss']!r} (rel {l0['loss_rel']:.3e})")
    gate_steps(report["steps"], over, THRESHOLDS)
    return fails


def gate_steps(steps, over, th):
    """The per-step gates both parity checks share (teacher_forced's figures in `steps`); `over(name, value, limit,
    text)` records a failure. NaN never passes."""
    nan_last = lambda key: lambda r: math.inf if r[key] is None or r[key] != r[key] else r[key]  # noqa: E731
    w = max(steps, key=nan_last("loss_rel"))
    over("step_loss_rel", w["loss_rel"], th["step_loss_rel"],
         f"step {w['step']} loss ours {w['loss_ours']!r} vs {w['loss_fp64']!r} from our weights after step "
         f"{w['step'] - 1} in fp64 (rel {w['loss_rel']:.3e})")
    w = max(steps, key=nan_last("grad_norm_rel"))
    over("step_grad_norm_rel", math.nan if w["grad_norm_rel"] is None else w["grad_norm_rel"], th["step_grad_norm_rel"],
         f"step {w['step']} pre-clip grad norm ours {w['grad_norm_ours']!r} vs {w['grad_norm_fp64']!r} from our "
         f"weights in fp64" + ("" if w["grad_norm_rel"] is None else f" (rel {w['grad_norm_rel']:.3e})"))
    w = max(steps, key=nan_last("grad_rel"))
    over("step_grad_rel", w["grad_rel"], th["step_grad_rel"],
         f"step {w['step']} gradient of {w['grad_worst_tensor']}: {w['grad_rel']:.3e} (relative) from the fp64 gradient "
         f"at our weights after step {w['step'] - 1}")
    w = max(steps, key=nan_last("update_excess"))
    over("step_update", w["update_excess"], th["step_update"],
         f"step {w['step']} update of {w['update_worst_tensor']}: our weights after the step are "
         f"{w['update_err_rel']:.3e} of the update ({w['update_err_ulps']:.3g} ulps, rms) from the fp64 update of the "
         f"same weights: {w['update_excess']:.3g}x the allowance ({STEP_UPDATE_RTOL:g} of the update + "
         f"{STEP_UPDATE_ULPS:g} ulps)")
    lr = [r for r in steps if r["lr_rel"] is not None]
    if lr:
        w = max(lr, key=lambda r: r["lr_rel"])
        over("max_step_lr_rel", w["lr_rel"], th["max_step_lr_rel"],
             f"step {w['step']} trace lr {w['lr_ours']!r} differs from optim.lr_per_step {w['lr']!r}")


def print_summary(report, fails):
    lg, g, l0 = report["logits"], report["grads"], report["loss_step0"]
    sh = report["shape"]
    print(f"olmoref vs HF Olmo3ForCausalLM (torch {report['versions']['torch']}, "
          f"transformers {report['versions']['transformers']}): {sh['steps']} steps x {sh['instances_per_step']} "
          f"instances x {sh['seq_len']} tokens, vocab {sh['vocab_size']}")
    print("\nstep-1 batch at step-0 weights")
    rows = logit_rows(lg, "hf") + [
        ("loss ours / hf", f"{l0['ours']['loss']:.9g}", f"{l0['hf']['loss']:.9g}  rel {l0['loss_rel']:.3e}"),
    ]
    if l0["ce_rel"] is not None:
        rows.append(("ce ours / hf", f"{l0['ours']['ce']:.9g}", f"{l0['hf']['ce']:.9g}  rel {l0['ce_rel']:.3e}"))
    if l0["z_rel"] is not None:
        rows.append(("z ours / hf", f"{l0['ours']['z']:.9g}", f"{l0['hf']['z']:.9g}  rel {l0['z_rel']:.3e}"))
    rows.append(("grad rel diff max", f"{g['max_rel']:.3e}", g["worst_tensor"]))
    print_training_rows(report, rows, "hf", "HF fp32 eager", "HF")
    print_verdict(fails, THRESHOLDS)


def logit_rows(lg, peer):
    """The step-1 summary's first rows (label, value, note): compare_logits' figures against `peer`."""
    return [
        ("logits max |diff|", f"{lg['max_abs_diff']:.3e}", f"(max |logit| {lg['max_abs_logit']:.3g})"),
        (f"KL(ours||{peer}) max / mean", f"{lg[f'kl_ours_{peer}_max']:.3e}", f"{lg[f'kl_ours_{peer}_mean']:.3e}"),
        (f"KL({peer}||ours) max / mean", f"{lg[f'kl_{peer}_ours_max']:.3e}", f"{lg[f'kl_{peer}_ours_mean']:.3e}"),
        ("top-1 agreement", f"{lg['top1_agreement_pct']:.4f}%",
         f"({lg['top1_near_ties']} near-ties of {lg['positions']})"),
    ]


def print_training_rows(report, rows, peer, peer_run, peer_name):
    """The body both training summaries print: the step-1 rows (label, value, note), the per-step table and the
    gap to the peer's free run (`peer_run` names that run, `peer_name` the peer)."""
    for a, b, c in rows:
        print(f"  {a:<26}{b:>16}  {c}")
    print_steps(report["steps"], peer)
    print(f"\n  {peer_run} trained freely from the same weights: loss ours vs {peer_name}, max over steps "
          f"{report['free_run']['max_loss_ours_vs_peer']:.3e} (reported, not gated)")


def print_verdict(fails, thresholds):
    """The last lines of every parity summary: each failed gate with its limit, or that all of `thresholds` held."""
    print()
    if fails:
        print(f"PARITY FAILED ({len(fails)} gate{'s' if len(fails) > 1 else ''}):")
        for name, value, limit, text in fails:
            print(f"  - {name}: {text}; limit {limit:g}")
    else:
        print("PARITY OK: every gate passed (" + ", ".join(f"{k} {v:g}" for k, v in thresholds.items()) + ")")


def print_steps(steps, peer):
    """The per-step table both parity checks print: teacher_forced's gated figures, the peer's free run beside."""
    print(f"\n  every step from our weights after the one before, in fp64 (gated); {peer} fp32 trained freely (reported)")
    print(f"  {'step':>4} {'loss ours':>14} {'loss fp64':>14} {'rel':>9} {'gnorm ours':>12} {'rel':>9} {'grad rel':>9} "
          f"{'update':>7} {'lr':>9} {'loss ' + peer + ' free':>14} {'rel':>9}")
    for r in steps:
        gno = f"{r['grad_norm_ours']:.6g}" if r["grad_norm_ours"] is not None else "-"
        gnr = f"{r['grad_norm_rel']:.2e}" if r["grad_norm_rel"] is not None else "-"
        print(f"  {r['step']:>4} {r['loss_ours']:>14.8f} {r['loss_fp64']:>14.8f} {r['loss_rel']:>9.2e} {gno:>12} "
              f"{gnr:>9} {r['grad_rel']:>9.2e} {r['update_excess']:>7.3f} {r['lr']:>9.3g} {r['loss_peer_free']:>14.8f} "
              f"{r['loss_ours_vs_peer_free']:>9.2e}")
    print("  (grad rel: the worst tensor's ||g_ours - g_fp64|| / ||g_fp64||; update: the worst tensor's error against "
          "the fp64 update, as a share of its allowance)")


def run_logits(bundle, threads, precision, attn):
    """Logits bundle: ours vs HF at the bundle's precision, and both vs HF fp32."""
    import numpy as np
    from safetensors.numpy import load_file

    torch = setup_torch(threads)
    import transformers
    from transformers import Olmo3ForCausalLM

    transformers.utils.logging.disable_progress_bar()
    ours_meta = json.load(open(os.path.join(bundle, "ours.json")))
    bp = ours_meta["precision"]
    if precision is not None and precision != bp:
        raise BundleError(f"the bundle holds {bp} logits but --precision {precision} was asked for")
    N, T, V = int(ours_meta["instances"]), int(ours_meta["seq_len"]), int(ours_meta["vocab_size"])
    raw = np.fromfile(os.path.join(bundle, "tokens.u32"), dtype="<u4")
    if raw.size != N * T:
        raise BundleError(f"tokens.u32 holds {raw.size} tokens, expected instances*seq_len = {N}*{T}")
    tokens = torch.from_numpy(raw.reshape(N, T).astype("int64"))
    ours = torch.from_numpy(load_file(os.path.join(bundle, "ours_logits.safetensors"))["logits"].copy())
    if tuple(ours.shape) != (N, T, V):
        raise BundleError(f"ours_logits.safetensors: logits shape {tuple(ours.shape)}, expected {(N, T, V)}")

    def hf_logits(dtype):
        import time
        model = Olmo3ForCausalLM.from_pretrained(os.path.join(bundle, "hf"), dtype=dtype, attn_implementation=attn)
        model.eval()
        t0 = time.time()
        with torch.no_grad():
            out = torch.cat([model(tokens[i:i + 1]).logits.float() for i in range(N)])
        return out, time.time() - t0

    report = {"bundle": os.path.abspath(bundle), "mode": "logits", "precision": bp, "attn_implementation": attn,
              "thresholds": LOGITS_THRESHOLDS[bp],
              "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
              "shape": {"instances": N, "seq_len": T, "vocab_size": V}, "ours": ours_meta}
    hf_p, secs = hf_logits(torch.bfloat16 if bp == "bf16" else torch.float32)
    report["hf_seconds"] = secs
    report["ours_vs_hf"] = compare_logits(torch, ours, hf_p)
    loss, ce, z = olmo_loss(torch, hf_p, tokens, float(ours_meta["z_loss"]))
    report["loss"] = {"ours": ours_meta["loss"], "hf": loss.item(), "rel": rel(float(ours_meta["loss"]), loss.item())}
    if bp != "fp32":
        hf_32, _ = hf_logits(torch.float32)
        report["ours_vs_hf_fp32"] = compare_logits(torch, ours, hf_32)
        report["hf_vs_hf_fp32"] = compare_logits(torch, hf_p, hf_32)
        report["loss"]["hf_fp32"] = olmo_loss(torch, hf_32, tokens, float(ours_meta["z_loss"]))[0].item()
    return report


def gate_logits(report):
    th = report["thresholds"]
    lg = report["ours_vs_hf"]
    fails = []
    kl = max(lg["kl_ours_hf_max"], lg["kl_hf_ours_max"])
    if not kl < th["max_token_kl"]:
        fails.append(("max_token_kl", kl, th["max_token_kl"],
                      f"max per-token KL {kl:.3e} (at instance/position {lg['worst_kl_position']})"))
    for key in ("top1_strict_agreement_pct", "top1_agreement_pct"):
        if key in th and not lg[key] >= th[key]:
            fails.append((key, lg[key], th[key], f"top-1 agreement {lg[key]:.4f}% < {th[key]}%"))
    return fails


def print_logits_summary(report, fails):
    sh, p = report["shape"], report["precision"]
    print(f"olmoref {p} logits vs HF Olmo3ForCausalLM (torch {report['versions']['torch']}, transformers "
          f"{report['versions']['transformers']}, attention {report['attn_implementation']}): {sh['instances']} x "
          f"{sh['seq_len']} tokens of held-out text, vocab {sh['vocab_size']}, weights {report['ours']['weights']}")
    rows = [("ours vs HF " + p + " (gated)", report["ours_vs_hf"])]
    if "ours_vs_hf_fp32" in report:
        rows += [("ours vs HF fp32", report["ours_vs_hf_fp32"]), ("HF " + p + " vs HF fp32", report["hf_vs_hf_fp32"])]
    print(f"\n  {'comparison':<26}{'KL max':>11}{'KL mean':>11}{'top-1 strict':>14}{'top-1 (ties)':>14}"
          f"{'max |dlogit|':>14}")
    for name, lg in rows:
        kl_max = max(lg["kl_ours_hf_max"], lg["kl_hf_ours_max"])
        kl_mean = max(lg["kl_ours_hf_mean"], lg["kl_hf_ours_mean"])
        print(f"  {name:<26}{kl_max:>11.3e}{kl_mean:>11.3e}{lg['top1_strict_agreement_pct']:>13.4f}%"
              f"{lg['top1_agreement_pct']:>13.4f}%{lg['max_abs_diff']:>14.4g}")
    l = report["loss"]
    print(f"\n  loss ours {l['ours']:.6f}, HF {p} {l['hf']:.6f} (rel {l['rel']:.2e})"
          + (f", HF fp32 {l['hf_fp32']:.6f}" if "hf_fp32" in l else ""))
    print_verdict(fails, report["thresholds"])


def is_logits_bundle(d):
    try:
        return json.load(open(os.path.join(d, "ours.json"))).get("format") == "olmoref-logits-bundle/1"
    except (OSError, json.JSONDecodeError):
        return False


def finish(report, fails, summary, report_path):
    """Records the verdict in the report (each fail: gate, value, limit, message), prints `summary`, writes the
    report (atomically) when asked; returns the exit status: 0 every gate passed, 1 otherwise."""
    report["pass"] = not fails
    report["failed_gates"] = [f[0] for f in fails]
    report["failures"] = [f[3] for f in fails]
    summary(report, fails)
    if report_path:
        with open(report_path + ".tmp", "w") as f:
            json.dump(report, f, indent=1, allow_nan=True)
        os.replace(report_path + ".tmp", report_path)
    return 0 if not fails else 1


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bundle", required=True, help="directory written by `olmoref parity-dump`")
    ap.add_argument("--report", help="write the full comparison as JSON here")
    ap.add_argument("--threads", type=int, default=peer_threads(),
                    help="torch CPU threads (default: $OLMOREF_PEER_THREADS, else 2)")
    ap.add_argument("--precision", choices=["fp32", "bf16"],
                    help="logits bundles: the precision to compare in (must be the bundle's); parity bundles are fp32")
    ap.add_argument("--attn", choices=["eager", "sdpa"], default="eager",
                    help="logits bundles: HF attention implementation (default eager)")
    args = ap.parse_args(argv)
    logits_mode = is_logits_bundle(args.bundle)
    try:
        if logits_mode:
            report = run_logits(args.bundle, args.threads, args.precision, args.attn)
        else:
            if args.precision not in (None, "fp32"):
                raise BundleError("a parity bundle (olmoref parity-dump) is compared in fp32; bf16 parity uses a "
                                  "logits bundle (olmoref golden logits --precision bf16)")
            report = run(args.bundle, args.threads)
    except BundleError as e:
        print(f"hf_parity: bad bundle: {e}", file=sys.stderr)
        return 2
    if logits_mode:
        return finish(report, gate_logits(report), print_logits_summary, args.report)
    return finish(report, gate(report), print_summary, args.report)


if __name__ == "__main__":
    sys.exit(main())
