#!/usr/bin/env python3
"""Compare an olmoref mixture-of-experts parity bundle against ai2-olmo-core's own MoE model, fp32 on the CPU.
(Also a dense bundle under intra-document masking, against OLMo-core's dense Transformer: below.)

Usage: olmo_core_moe_parity.py --bundle DIR [--report FILE.json] [--threads N]
       olmo_core_moe_parity.py --check-kernels      (only the CPU-kernel self-check below; exit 0/1)

The bundle (`olmoref parity-dump` on a MoE config, or make_fake_moe_bundle.py; format in golden/parity/README.md,
"MoE parity") holds our step-0 weights under OLMo-core's state_dict names, the token batches, our step-1 logits,
gradients and top-k routing, and our per-step loss trace. This script builds the same model with OLMo-core's own
TransformerConfig (MoETransformer of MoEReorderedNormTransformerBlock, DroplessMoE, MoELinearRouter with softmax
gating, optional shared MLP, OLMo 3 attention: full-width QK-norm, GQA, RoPE, sliding windows with the last layer
full), loads the weights strictly (a missing, extra or mis-shaped key is a malformed bundle, exit 2, naming it),
and trains it the way OLMo-core's TransformerTrainModule.train_batch does: labels from olmo_core.data.utils
.get_labels, micro-batches from split_batch, model(..., loss_reduction="sum", z_loss_multiplier,
loss_div_factor = number of targets in the whole step batch) per micro-batch with loss.backward() accumulating,
the routers' auxiliary losses (attached to the activations by OLMo-core) flowing into the gradients; the logged
lb / router-z terms are OLMo-core's compute_auxiliary_metrics() ("load balancing loss", "router Z loss": the sum
over blocks of the per-block weight, lb_loss_weight / n_layers when scaled, times the loss accumulated over the
micro-batches). Then clip to max_grad_norm and torch AdamW at the bundle's lr per step, as hf_parity.py does, and
judge every step as hf_parity.py does: re-run in float64 from our weights after the step before
(ours_params.safetensors, hf_parity.teacher_forced), OLMo-core fp32's free run reported beside it.

What is NOT OLMo-core's code here, and why (everything else is: router, losses, DroplessMoEMLP with its own
torch fallback grouped GEMM, shared MLP, attention, blocks, LM head and loss):
  * olmo_core.ops.moe.kernels, the Triton kernels behind OLMo-core's GatherOp / ScatterOp autograd functions,
    is replaced by CPU_KERNELS: plain-torch gather / scatter / scatter_wgrad with the kernels' exact semantics
    (gather: out[i] = x[indices[i] // top_k] (* weights[indices[i]]); scatter: slot indices[i] of a [tokens,
    top_k, d] buffer gets x[i] (* weights[indices[i]]), then the sum over top_k; scatter_wgrad: wgrad[indices[i]]
    = <x[i], grad[indices[i] // top_k]>). Triton kernels cannot run on CPU tensors. OLMo-core's own GatherOp /
    ScatterOp (forward and backward) still call them, so the autograd wiring is OLMo-core's. The binned_* kernels
    (the capacity-limited MoE, not used by the dropless one) are left unimplemented and raise.
    check_cpu_kernels() proves the replacement against a dense, per-token fp64 evaluation of the same MoE
    (forward and every gradient) at the start of every run; it is a gate.
  * DroplessMoEMLP._gmm is forced to None: if the grouped_gemm package were installed OLMo-core would route the
    expert GEMMs through it in bf16; None selects OLMo-core's own fp32 per-expert matmul loop.
  * The float64 runs only (the exact-arithmetic reference of the per-step gates): OLMo-core casts router logits,
    norms, RoPE inputs and the CE input with Tensor.float() and builds its RoPE table in fp32; inside
    exact_fp64() Tensor.float() is the identity on float64 tensors and the RoPE table is computed in float64,
    so that replay is float64 throughout. The fp32 runs are untouched.

A dense bundle (no model.moe: what `olmoref parity-dump` writes for a dense config under data.document_masking,
whose other peers attend across documents) runs the same way through OLMo-core's dense Transformer of
ReorderedNormTransformerBlock: no routing, no auxiliary losses, no MoE kernels; every other gate as above.

Exit status: 0 every gate passed; 1 a gate failed (each failure is printed and listed in the report);
2 the bundle is malformed or inconsistent, or OLMo-core cannot be imported (nothing was compared).
"""
import argparse
import contextlib
import json
import os
import sys

# Gates. Same philosophy as hf_parity.py's fp32 gates: two correct fp32 implementations agree to ~1e-7 relative,
# these limits leave room for reduction-order noise but catch any real semantic difference.
THRESHOLDS = {
    "top1_agreement_pct": 100.0,   # step-1 logits: argmax agreement, near-ties excused (TIE_RTOL)
    "max_token_kl": 1e-6,          # max over positions of KL(ours||oc) and KL(oc||ours), float64
    "max_grad_rel": 1e-4,          # max over every parameter of ||g_ours - g_oc|| / ||g_oc||
    # The step-1 loss and each of its terms, relative to OLMo-core's. Every term is a sum over <= B*T fp32 terms
    # divided by N: ~1e-7 relative noise; lb and router z are ~1e-2 of the loss, so a wrong weight, divisor,
    # scale (num_experts/top_k, 1/n_layers) or granularity moves them by far more than 1e-5.
    "loss_step0_rel": 1e-5,
    "ce_step0_rel": 1e-5,
    "z_step0_rel": 1e-5,
    "lb_step0_rel": 1e-5,
    "rz_step0_rel": 1e-5,
    # Top-k routing of batches[0] at the step-0 weights, every block, every token, rank order included. A token
    # whose differing experts have OLMo-core scores within ROUTE_TIE_ATOL of the scores at those ranks is a
    # near-tie (counted and reported, not a mismatch). The limit is the number of real mismatches.
    "routing_mismatches": 0,
    # Every trained step on its own, from our weights after the step before, against OLMo-core's model in float64
    # with the same loss, clipping and torch AdamW (hf_parity.teacher_forced; the same limits as hf_parity.py).
    "step_loss_rel": 1e-5,
    "step_grad_norm_rel": 1e-4,
    "step_grad_rel": 1e-4,
    "step_update": 1.0,
    "max_step_lr_rel": 1e-6,       # the lr our trace reports vs the lr_per_step it declared
    # CPU stand-ins for OLMo-core's Triton MoE kernels vs a dense per-token fp64 evaluation (see the docstring).
    "cpu_kernel_check_max_rel": 1e-10,
}
# logits: two candidates within hf_parity.TIE_RTOL (1e-6, relative) are a tie
ROUTE_TIE_ATOL = 1e-6    # router softmax scores this close are a tie (the brief's k-th vs (k+1)-th rule)
IGNORE = -100

REQUIRED_TOP = ("model", "seq_len", "instances_per_step", "micro_batch_instances", "steps", "z_loss", "optim",
                "loss_step0", "ce_step0", "z_step0", "lb_step0", "rz_step0", "trace")
REQUIRED_MODEL = ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim", "rope_theta",
                  "norm_eps", "swa_pattern")  # and "moe" for a MoE model
REQUIRED_MOE = ("n_experts", "top_k", "hidden", "shared_hidden", "lb_loss_weight", "z_loss_weight",
                "scale_loss_by_num_layers", "lb_granularity")


# The bundle error, the relative difference, torch's fp32 set-up, the logits comparison and the verdict are
# hf_parity.py's (the dense parity check), so both peers are judged by the same code.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_parity import (BundleError, adamw, cached, compare_grads, compare_logits as _compare_logits,  # noqa: E402
                       content_key, finish, gate_steps, load_bundle_core, load_steps, logit_rows, optimizer_step,
                       peer_threads, print_training_rows, print_verdict, rel, setup_torch, steps_key, teacher_forced,
                       with_steps)
# OLMo-core's model for the bundle and the CPU stand-ins for its Triton MoE kernels, shared with the OLMo-core replay
# (make_fake_moe_bundle.py and moe_selftest.py reach them through this module).
from olmo_core_model import (CPU_KERNELS, document_inputs, install_cpu_kernels,  # noqa: E402,F401
                             install_document_mask_sdpa, is_moe, model_windows, olmo_core_config, use_torch_gmm,
                             windows)


def check_cpu_kernels(torch):
    """OLMo-core's DroplessMoE (with CPU_KERNELS) against a dense per-token evaluation of the same function, in
    float64: out_t = sum_r w_tr * E_{e_tr}(x_t) (plus the shared MLP as OLMo-core combines it), forward and the
    gradients of every parameter and of the input, for top_k 1 and 2, with and without a shared MLP.
    Returns the max relative difference."""
    import torch.nn.functional as F
    from olmo_core.nn.feed_forward import FeedForwardConfig
    from olmo_core.nn.moe import MoEConfig, MoERouterConfig, MoEType

    install_cpu_kernels()
    worst = 0.0
    g = torch.Generator().manual_seed(7)
    for top_k, shared in ((2, 12), (1, 0), (3, 0)):
        E, d, h = 5, 8, 6
        moe = MoEConfig(name=MoEType.dropless, num_experts=E, hidden_size=h, router=MoERouterConfig(top_k=top_k),
                        shared_mlp=FeedForwardConfig(hidden_size=shared, bias=False) if shared else None,
                        lb_loss_weight=None, z_loss_weight=None).build(d_model=d, n_layers=1, init_device="cpu")
        use_torch_gmm(moe)
        moe = moe.double().train()
        with torch.no_grad():
            for p in moe.parameters():
                p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * 0.5)
        x = torch.randn(3, 7, d, generator=g, dtype=torch.float64, requires_grad=True)
        params = [x] + [p for _, p in moe.named_parameters()]
        with exact_fp64():  # the router casts to fp32 otherwise; this check is in exact arithmetic
            out = moe(x)
            probe = torch.randn(out.shape, generator=g, dtype=torch.float64)
            got = [out.detach()] + list(torch.autograd.grad((out * probe).sum(), params))

        # Dense reference, written from the definition.
        wr = moe.router.weight.view(E, d)
        scores = (x @ wr.t()).softmax(dim=-1)
        w, idx = torch.topk(scores, top_k, dim=-1)
        w1 = moe.experts.mlp.w1.view(E, h, d)
        w2 = moe.experts.mlp.w2.view(E, h, d)
        w3 = moe.experts.mlp.w3.view(E, h, d)
        ref = torch.zeros_like(x)
        for e in range(E):
            y = (F.silu(x @ w1[e].t()) * (x @ w3[e].t())) @ w2[e]          # expert e on every token
            gate = (w * (idx == e)).sum(dim=-1, keepdim=True)              # its weight where routed, else 0
            ref = ref + gate * y
        if shared:
            s = moe.shared_mlp
            sh = s.w2(F.silu(s.w1(x)) * s.w3(x))
            ref = sh / (top_k + 1) + ref * (top_k / (top_k + 1))
        want = [ref.detach()] + list(torch.autograd.grad((ref * probe).sum(), params))
        for a, b in zip(got, want):
            worst = max(worst, float((a - b).norm() / max(float(b.norm()), 1e-300)))
    return worst


# ---- float64 runs -------------------------------------------------------------------------------------------

@contextlib.contextmanager
def exact_fp64():
    """Inside: Tensor.float() leaves float64 tensors alone and RoPE builds its sin/cos table in float64 (no cache),
    so OLMo-core's float64 model runs in float64 throughout (see the docstring)."""
    import torch
    from olmo_core.nn.rope import RotaryEmbedding

    orig_float = torch.Tensor.float
    orig_rope = RotaryEmbedding._get_rotary_embedding

    def float_(self, *a, **k):
        if self.dtype == torch.float64:
            return self
        return orig_float(self, *a, **k)

    def rope64(self, seq_len, device):
        if self.scaling is not None:
            raise BundleError("RoPE scaling is not part of the MoE parity model")
        dim = self.rotary_dim
        inv_freq = 1.0 / (float(self.theta) ** (torch.arange(0, dim, 2, device=device, dtype=torch.float64) / dim))
        seq = torch.arange(seq_len, device=device, dtype=torch.float64)
        freqs = torch.outer(seq, inv_freq)
        positions = torch.cat((freqs, freqs), dim=-1)
        return positions.sin(), positions.cos()

    torch.Tensor.float = float_
    RotaryEmbedding._get_rotary_embedding = rope64
    try:
        yield
    finally:
        torch.Tensor.float = orig_float
        RotaryEmbedding._get_rotary_embedding = orig_rope


# ---- bundle ------------------------------------------------------------------------------------------------

def load_bundle(d):
    import numpy as np
    from safetensors.numpy import load_file

    ours, batches, need = load_bundle_core(d, REQUIRED_TOP, "an OLMo-core parity bundle")
    m = ours["model"]
    for key in REQUIRED_MODEL:
        if key not in m:
            raise BundleError(f"{d}/ours.json: missing model.{key}")
    if is_moe(m):
        if not isinstance(m["moe"], dict):
            raise BundleError(f"{d}/ours.json: model.moe must be an object")
        for key in REQUIRED_MOE:
            if key not in m["moe"]:
                raise BundleError(f"{d}/ours.json: missing model.moe.{key}")
        if m["moe"]["lb_granularity"] not in ("instance", "local_batch"):
            raise BundleError(f"{d}/ours.json: model.moe.lb_granularity {m['moe']['lb_granularity']!r}, "
                              "expected 'instance' or 'local_batch'")
        E, k = int(m["moe"]["n_experts"]), int(m["moe"]["top_k"])
        if not 1 <= k <= E:
            raise BundleError(f"{d}/ours.json: model.moe.top_k {k} must be in 1..n_experts ({E})")
    elif ours.get("document_masking_eos") is None:
        raise BundleError(f"{d}/ours.json: a dense bundle without document masking: its peer is Hugging Face's "
                          "Olmo3 (hf_parity.py)")
    if int(ours["micro_batch_instances"]) < 1:
        raise BundleError(f"{d}/ours.json: micro_batch_instances must be >= 1 (got {ours['micro_batch_instances']})")
    for r in ours["trace"]:
        for key in ("loss", "grad_norm", "lr"):
            if key not in r:
                raise BundleError(f"{d}/ours.json: trace step {r['step']} has no '{key}'")
    if int(batches.max()) >= int(m["vocab_size"]):
        raise BundleError(f"{d}/batches.u32 holds token {int(batches.max())} >= vocab_size {m['vocab_size']}")

    try:
        weights = load_file(need(os.path.join(d, "olmo_core", "model.safetensors")))
        step0 = load_file(need(os.path.join(d, "ours_step0.safetensors")))
    except BundleError:
        raise
    except Exception as e:  # safetensors raises its own error types for a corrupt header
        raise BundleError(f"{d}: cannot read a safetensors file: {e}")
    bad = sorted(n for n, a in weights.items() if a.dtype != np.float32)
    if bad:
        raise BundleError(f"{d}/olmo_core/model.safetensors: tensors not F32: {bad[:5]}")
    if "logits" not in step0:
        raise BundleError(f"{d}/ours_step0.safetensors: no 'logits' tensor")
    return ours, batches, weights, step0


def model_dict_from_resolved(resolved):
    """The bundle's "model" dict (olmoref ModelConfig names) from `olmoref config --resolved`'s TOML, parsed."""
    m = resolved["model"]
    return {"vocab_size": m["vocab_size"], "d_model": m["d_model"], "n_layers": m["n_layers"], "n_heads": m["n_heads"],
            "n_kv_heads": m["n_kv_heads"], "head_dim": m["head_dim"], "rope_theta": m["rope_theta"],
            "norm_eps": m["norm_eps"], "swa_pattern": m["swa_pattern"],
            "moe": {"n_experts": m["moe_experts"], "top_k": m["moe_top_k"], "hidden": m["moe_hidden"],
                    "shared_hidden": m["moe_shared_hidden"], "lb_loss_weight": m["moe_lb_loss_weight"],
                    "z_loss_weight": m["moe_z_loss_weight"],
                    "scale_loss_by_num_layers": m["moe_scale_loss_by_num_layers"],
                    "lb_granularity": m["moe_lb_granularity"],
                    "normalize_expert_weights": m.get("moe_normalize_expert_weights", 0)}}


def check_weights(model, weights):
    """Every parameter of the OLMo-core model must be in model.safetensors under its name and shape, and nothing
    else; raises BundleError naming the keys."""
    sd = {n: tuple(t.shape) for n, t in model.state_dict().items()}
    missing = sorted(n for n in sd if n not in weights)
    extra = sorted(n for n in weights if n not in sd)
    shape = sorted(f"{n} {tuple(weights[n].shape)} (OLMo-core {sd[n]})" for n in sd
                   if n in weights and tuple(weights[n].shape) != sd[n])
    if missing or extra or shape:
        lines = []
        if missing:
            lines.append(f"missing (OLMo-core has them): {missing}")
        if extra:
            lines.append(f"unknown to OLMo-core: {extra}")
        if shape:
            lines.append(f"wrong shape: {shape}")
        raise BundleError("olmo_core/model.safetensors does not match OLMo-core's state_dict:\n  - "
                          + "\n  - ".join(lines))


def build_model(torch, m, weights, dtype):
    from olmo_core.nn.transformer.model import MoETransformer

    moe = is_moe(m)
    if moe:
        install_cpu_kernels()
    model = olmo_core_config(m).build(init_device="cpu")
    if isinstance(model, MoETransformer) != moe:
        raise RuntimeError(f"OLMo-core built {type(model).__name__} for a {'MoE' if moe else 'dense'} model")
    check_weights(model, weights)
    model.load_state_dict({n: torch.from_numpy(a.copy()) for n, a in weights.items()}, strict=True)
    if moe:
        use_torch_gmm(model)
    model = model.to(dtype)
    model.train()
    return model


class RoutingProbe:
    """Forward hooks on every block's router: the top-k indices it returned and its softmax scores."""

    def __init__(self, model):
        self.hooks, self.records = [], {}
        for key, block in model.blocks.items():
            self.hooks.append(block.feed_forward_moe.router.register_forward_hook(self._hook(int(key))))

    def _hook(self, idx):
        def fn(module, args, output):
            import torch

            with torch.no_grad():
                scores = module.get_expert_logits(args[0]).float().softmax(dim=-1)
            self.records.setdefault(idx, []).append((output[1].detach().clone(), scores.detach().clone()))
        return fn

    def result(self):
        import torch

        return {i: (torch.cat([r[0] for r in recs]), torch.cat([r[1] for r in recs]))
                for i, recs in sorted(self.records.items())}

    def remove(self):
        for h in self.hooks:
            h.remove()


# The bundle's document_masking_eos (olmoref's data.document_masking): None, or the EOS that ends each document, which
# every micro-batch then hands the model as OLMo-core's doc_lens (olmo_core_model.document_inputs).
DOC_EOS = None


def train_batch(torch, model, ids, M, z_mult, want_logits=False):
    """One step batch the way TransformerTrainModule.train_batch runs it (gradients accumulate in .grad).
    Returns the logged terms (each already divided by the step batch's target count) and optionally logits."""
    from olmo_core.data.utils import get_labels, split_batch

    batch = {"input_ids": ids}
    batch["labels"] = get_labels(batch, label_ignore_index=IGNORE)
    n_for_loss = (batch["labels"] != IGNORE).sum()
    ce = z = 0.0
    logits = []
    for mb in split_batch(batch, M):
        docs = document_inputs(torch, mb["input_ids"], DOC_EOS, os.environ.get("OLMOREF_TEST_PEER_DOCUMENTS")) \
            if DOC_EOS is not None else {}
        out = model(mb["input_ids"], labels=mb["labels"], ignore_index=IGNORE, loss_reduction="sum",
                    z_loss_multiplier=z_mult, loss_div_factor=n_for_loss, return_logits=want_logits, **docs)
        ce = ce + out.ce_loss.detach()
        if out.z_loss is not None:
            z = z + out.z_loss.detach()
        if want_logits:
            logits.append(out.logits.detach())
        out.loss.backward()
    metrics = model.compute_auxiliary_metrics(reset=True)
    model.post_batch()
    lb = float(metrics["load balancing loss"][0]) if "load balancing loss" in metrics else 0.0
    rz = float(metrics["router Z loss"][0]) if "router Z loss" in metrics else 0.0
    ce, z = float(ce), float(z)
    res = {"loss": ce + z + lb + rz, "ce": ce, "z": z, "lb": lb, "rz": rz}
    if want_logits:
        res["logits"] = torch.cat(logits)
    return res


def train_steps(torch, model, tokens, M, z_mult, optim, step1_hook=None):
    """Trains `model` on tokens[0..S-1]: train_batch, then OLMo-core's clipping and torch AdamW at the bundle's lr
    (hf_parity.optimizer_step). Returns one record per step. step1_hook(model, terms) runs after step 1's
    backward, before clipping."""
    opt, params = adamw(torch, model, optim)
    out = []
    for s in range(1, tokens.shape[0] + 1):
        opt.zero_grad(set_to_none=True)
        terms = train_batch(torch, model, tokens[s - 1], M, z_mult, want_logits=step1_hook is not None and s == 1)
        if s == 1 and step1_hook is not None:
            step1_hook(model, terms)
        gn, lr = optimizer_step(torch, opt, params, optim, s)
        terms.pop("logits", None)
        out.append(dict(terms, grad_norm=gn, lr=lr))
    return out


def compare_logits(torch, ours, oc):
    return _compare_logits(torch, ours, oc, peer="oc")


def compare_routing(torch, ours_routing, oc_routing, E, k):
    """ours_routing: {block: int tensor [B, T, k]}; oc_routing: {block: (indices [B, T, k], scores [B, T, E])}."""
    mismatches, near_ties, first, per_block = 0, 0, None, {}
    tie_examples = []
    for blk, (oc_idx, scores) in oc_routing.items():
        ours = ours_routing[blk].long()
        oc_idx = oc_idx.long()
        bad = (ours != oc_idx).any(dim=-1)
        n_bad, n_tie = 0, 0
        sorted_scores = scores.sort(dim=-1, descending=True).values[..., :k]
        for pos in bad.nonzero().tolist():
            b, t = pos
            o = ours[b, t]
            s = scores[b, t]
            valid = bool(((o >= 0) & (o < E)).all()) and len(set(o.tolist())) == k
            excused = valid and bool(((s[o.clamp(0, E - 1)] - sorted_scores[b, t]).abs() <= ROUTE_TIE_ATOL).all())
            if excused:
                n_tie += 1
                if len(tie_examples) < 5:
                    tie_examples.append({"block": blk, "instance": b, "position": t, "ours": o.tolist(),
                                         "oc": oc_idx[b, t].tolist()})
            else:
                n_bad += 1
                if first is None:
                    first = {"block": blk, "instance": b, "position": t, "ours": o.tolist(),
                             "oc": oc_idx[b, t].tolist(),
                             "oc_scores_of_ours": [float(s[i]) if 0 <= i < E else None for i in o.tolist()],
                             "oc_scores_of_oc": [float(s[i]) for i in oc_idx[b, t].tolist()]}
        per_block[blk] = {"tokens": int(bad.numel()), "mismatches": n_bad, "near_ties": n_tie}
        mismatches += n_bad
        near_ties += n_tie
    return {"mismatches": mismatches, "near_ties": near_ties, "first_mismatch": first, "tie_examples": tie_examples,
            "per_block": per_block}


def run(bundle, threads):
    torch = setup_torch(threads)
    import olmo_core

    try:
        from importlib.metadata import version
        oc_version = version("ai2-olmo-core")
    except Exception:
        oc_version = getattr(olmo_core, "__version__", "?")

    ours, batches, weights, step0 = load_bundle(bundle)
    S, B, T = batches.shape
    m = ours["model"]
    global DOC_EOS
    DOC_EOS = ours.get("document_masking_eos")
    if DOC_EOS is not None:
        install_document_mask_sdpa()
        # Into the cache keys below, with the TEST ONLY control, so a control never reads a correct run's cache.
        m = dict(m, document_masking_eos=int(DOC_EOS), peer_documents=os.environ.get("OLMOREF_TEST_PEER_DOCUMENTS"))
    moe = is_moe(m)
    mo = m["moe"] if moe else {"n_experts": 0, "top_k": 0, "shared_hidden": 0, "lb_granularity": None,
                                "scale_loss_by_num_layers": False}
    M = int(ours["micro_batch_instances"])
    L, V, E, k = int(m["n_layers"]), int(m["vocab_size"]), int(mo["n_experts"]), int(mo["top_k"])
    z_loss = float(ours["z_loss"])
    z_mult = z_loss if z_loss != 0 else None
    optim = ours["optim"]
    tokens = torch.from_numpy(batches.astype("int64"))

    report = {"bundle": os.path.abspath(bundle), "thresholds": THRESHOLDS,
              "versions": {"torch": torch.__version__, "ai2-olmo-core": oc_version},
              "shape": {"steps": S, "instances_per_step": B, "micro_batch_instances": M, "seq_len": T,
                        "vocab_size": V, "n_layers": L, "n_experts": E, "top_k": k,
                        "shared_hidden": int(mo["shared_hidden"]), "lb_granularity": mo["lb_granularity"],
                        "scale_loss_by_num_layers": bool(mo["scale_loss_by_num_layers"]),
                        "document_masking_eos": DOC_EOS, "moe": moe}}
    if moe:
        report["cpu_kernel_check_max_rel"] = cached(("cpu-kernel-check",), lambda: check_cpu_kernels(torch))

    model = build_model(torch, m, weights, torch.float32)
    names = [n for n, _ in model.named_parameters()]
    got_w, want_w = model_windows(model), windows(m)
    if got_w != want_w:
        raise BundleError(f"per-layer attention windows: OLMo-core built {got_w}, ours.json swa_pattern means "
                          f"{want_w} (0 = full)")
    report["windows"] = got_w
    if tuple(step0["logits"].shape) != (B, T, V):
        raise BundleError(f"ours_step0.safetensors: logits shape {step0['logits'].shape}, expected {(B, T, V)}")
    routing_keys = [f"routing.blocks.{i}" for i in range(L)] if moe else []
    missing = [n for n in names if f"grad.{n}" not in step0] + [r for r in routing_keys if r not in step0]
    extra = sorted(x for x in step0 if x != "logits" and x not in routing_keys
                   and not (x.startswith("grad.") and x[len("grad."):] in names))
    if missing or extra:
        raise BundleError(f"ours_step0.safetensors: missing {missing[:8]}, unknown tensors {extra[:8]}")
    for n, p in model.named_parameters():
        if tuple(step0[f"grad.{n}"].shape) != tuple(p.shape):
            raise BundleError(f"ours_step0.safetensors: grad.{n} shape {step0[f'grad.{n}'].shape} != {tuple(p.shape)}")
    for r in routing_keys:
        if tuple(step0[r].shape) != (B, T, k) or step0[r].dtype.kind not in "iu":
            raise BundleError(f"ours_step0.safetensors: {r} is {step0[r].dtype} {step0[r].shape}, expected I32 "
                              f"{(B, T, k)}")
    unknown_nd = [n for n in optim["no_decay"] if n not in names]
    if unknown_nd:
        raise BundleError(f"ours.json optim.no_decay names parameters OLMo-core does not have: {unknown_nd}")

    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    params_after, grads = load_steps(bundle, shapes, S)
    inputs = content_key(open(os.path.join(bundle, "olmo_core", "model.safetensors"), "rb").read(), batches, m, M,
                         z_loss, optim)

    def peer_fp32():
        """OLMo-core fp32 trained freely over the S steps; step 1's terms, logits, gradients and routing are
        captured inside its first step (after the backward, before clipping)."""
        cap = {}
        probe = RoutingProbe(model) if moe else None

        def step1_hook(mdl, terms):
            if probe:
                cap["routing"] = probe.result()
                probe.remove()
            cap["terms"] = dict(terms)
            cap["grads"] = {n: p.grad.detach().double().clone() for n, p in mdl.named_parameters()}

        cap["steps"] = train_steps(torch, model, tokens, M, z_mult, optim, step1_hook=step1_hook)
        return cap

    def peer_fp64():
        with exact_fp64():
            return teacher_forced(torch, build_model(torch, m, weights, torch.float64), params_after, grads, optim,
                                  lambda mdl, k: train_batch(torch, mdl, tokens[k - 1], M, z_mult))

    oc = cached(("olmo-core-fp32", inputs), peer_fp32)
    del model
    tf = cached(("olmo-core-fp64-teacher-forced", inputs, content_key(*steps_key(params_after, grads))), peer_fp64)

    # ---- step 1 at the step-0 weights against OLMo-core fp32 --------------------------------------------------
    terms = oc["terms"]
    report["logits"] = compare_logits(torch, torch.from_numpy(step0["logits"].copy()), terms["logits"])
    l0 = {"ours": {t: float(ours[f"{t}_step0"]) for t in ("loss", "ce", "z", "lb", "rz")},
          "oc": {t: terms[t] for t in ("loss", "ce", "z", "lb", "rz")}}
    for t in ("loss", "ce", "z", "lb", "rz"):
        l0[f"{t}_rel"] = rel(l0["ours"][t], l0["oc"][t])
    l0["trace1_vs_loss_step0_rel"] = rel(float(ours["trace"][0]["loss"]), float(ours["loss_step0"]))
    report["loss_step0"] = l0
    report["grads"] = compare_grads(torch, names, step0, oc["grads"], "oc")
    if moe:
        ours_routing = {i: torch.from_numpy(step0[f"routing.blocks.{i}"].astype("int64")) for i in range(L)}
        report["routing"] = compare_routing(torch, ours_routing, oc["routing"], E, k)

    # ---- every step from our weights against OLMo-core fp64 (gated); OLMo-core fp32's free run (reported) ----
    steps = []
    for s in range(1, S + 1):
        r, x, a = ours["trace"][s - 1], tf[s - 1], oc["steps"][s - 1]
        steps.append({
            "step": s, "loss_ours": r["loss"], "loss_fp64": x["loss"], "loss_rel": rel(r["loss"], x["loss"]),
            "ce_ours": r.get("ce"), "ce_fp64": x["ce"], "lb_ours": r.get("lb"), "lb_fp64": x["lb"],
            "rz_ours": r.get("rz"), "rz_fp64": x["rz"],
            "grad_norm_ours": r["grad_norm"], "grad_norm_fp64": x["grad_norm"],
            "grad_norm_rel": rel(r["grad_norm"], x["grad_norm"]),
            **{key: x[key] for key in ("grad_rel", "grad_worst_tensor", "update_excess", "update_worst_tensor",
                                       "update_err_rel", "update_err_ulps")},
            "lr_ours": r["lr"], "lr": x["lr"], "lr_rel": rel(r["lr"], x["lr"]),
            "loss_peer_free": a["loss"], "loss_ours_vs_peer_free": rel(r["loss"], a["loss"]),
            "grad_norm_peer_free": a["grad_norm"],
        })
    return with_steps(report, steps, "OLMo-core fp32")


def gate(report):
    """Returns [(gate, value, limit, text)] for each failed gate."""
    th = THRESHOLDS
    fails = []
    lg, g, l0, steps = report["logits"], report["grads"], report["loss_step0"], report["steps"]
    moe = report["shape"]["moe"]

    def over(name, value, limit, text):
        if not (value <= limit):  # also catches NaN
            fails.append((name, value, limit, text))

    if moe:
        over("cpu_kernel_check_max_rel", report["cpu_kernel_check_max_rel"], th["cpu_kernel_check_max_rel"],
             f"OLMo-core's DroplessMoE with the CPU kernel stand-ins differs from the dense fp64 evaluation by "
             f"{report['cpu_kernel_check_max_rel']:.3e} (the comparison itself is broken)")
    if not lg["top1_agreement_pct"] >= th["top1_agreement_pct"]:
        fails.append(("top1_agreement_pct", lg["top1_agreement_pct"], th["top1_agreement_pct"],
                      f"top-1 agreement {lg['top1_agreement_pct']:.4f}% < 100%"))
    kl = max(lg["kl_ours_oc_max"], lg["kl_oc_ours_max"])
    over("max_token_kl", kl, th["max_token_kl"], f"max per-token KL {kl:.3e} (at instance/position "
                                                 f"{lg['worst_kl_position']})")
    over("max_grad_rel", g["max_rel"], th["max_grad_rel"],
         f"gradient relative difference {g['max_rel']:.3e} in {g['worst_tensor']}")
    for t in ("loss", "ce", "z", "lb", "rz"):
        over(f"{t}_step0_rel", l0[f"{t}_rel"], th[f"{t}_step0_rel"],
             f"step-1 {t} ours {l0['ours'][t]!r} vs OLMo-core {l0['oc'][t]!r} (rel {l0[f'{t}_rel']:.3e})")
    ro = report.get("routing", {"mismatches": 0})
    if ro["mismatches"] > th["routing_mismatches"]:
        f = ro["first_mismatch"]
        fails.append(("routing_mismatches", ro["mismatches"], th["routing_mismatches"],
                      f"{ro['mismatches']} tokens routed differently ({ro['near_ties']} near-ties excused); first: "
                      f"block {f['block']} instance {f['instance']} position {f['position']}: ours {f['ours']} "
                      f"(OLMo-core scores {f['oc_scores_of_ours']}), OLMo-core {f['oc']} (scores "
                      f"{f['oc_scores_of_oc']})"))
    gate_steps(steps, over, th)
    return fails


def print_summary(report, fails):
    lg, g, l0, sh = report["logits"], report["grads"], report["loss_step0"], report["shape"]
    ro = report.get("routing")
    body = (f"{sh['n_experts']} experts top-{sh['top_k']}, shared hidden {sh['shared_hidden']}, lb "
            f"{sh['lb_granularity']}{' /n_layers' if sh['scale_loss_by_num_layers'] else ''}" if sh["moe"] else "dense")
    docs = f", documents ending at EOS {sh['document_masking_eos']}" if sh["document_masking_eos"] is not None else ""
    print(f"olmoref vs OLMo-core {'MoE' if sh['moe'] else 'Transformer'} (ai2-olmo-core "
          f"{report['versions']['ai2-olmo-core']}, torch {report['versions']['torch']}): {sh['steps']} steps x "
          f"{sh['instances_per_step']} instances (micro-batches of {sh['micro_batch_instances']}) x {sh['seq_len']} "
          f"tokens, vocab {sh['vocab_size']}, {sh['n_layers']} layers, {body}, windows {report['windows']}{docs}")
    if sh["moe"]:
        print(f"\n  CPU kernel stand-ins vs dense fp64 MoE: {report['cpu_kernel_check_max_rel']:.2e}")
    print("\nstep-1 batch at step-0 weights")
    rows = logit_rows(lg, "oc")
    for t in ("loss", "ce", "z", "lb", "rz"):
        rows.append((f"{t} ours / oc", f"{l0['ours'][t]:.9g}", f"{l0['oc'][t]:.9g}  rel {l0[f'{t}_rel']:.3e}"))
    rows.append(("grad rel diff max", f"{g['max_rel']:.3e}", g["worst_tensor"]))
    if ro:
        rows.append(("routing mismatches", f"{ro['mismatches']}",
                     f"({ro['near_ties']} near-ties excused; per block "
                     + ", ".join(f"{b}: {v['mismatches']}/{v['tokens']}" for b, v in ro["per_block"].items()) + ")"))
    print_training_rows(report, rows, "oc", "OLMo-core fp32", "OLMo-core")
    print_verdict(fails, THRESHOLDS)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bundle", help="directory written by `olmoref parity-dump` for a MoE config")
    ap.add_argument("--report", help="write the full comparison as JSON here")
    ap.add_argument("--threads", type=int, default=peer_threads(),
                    help="torch CPU threads (default: $OLMOREF_PEER_THREADS, else 2)")
    ap.add_argument("--check-kernels", action="store_true",
                    help="only check the CPU stand-ins for OLMo-core's MoE kernels against a dense fp64 MoE")
    args = ap.parse_args(argv)
    import warnings

    warnings.filterwarnings("ignore", message="Grouped GEMM not available")  # _gmm is forced to None anyway
    try:
        import olmo_core.nn.moe  # noqa: F401
        import safetensors  # noqa: F401
        import torch  # noqa: F401
    except ImportError as e:
        print(f"olmo_core_moe_parity: cannot import OLMo-core / torch / safetensors ({e}); run it with the "
              "OLMo-core venv (golden/parity/run_moe_parity.sh, or bash tools/setup_python.sh)", file=sys.stderr)
        return 2
    if args.check_kernels:
        worst = check_cpu_kernels(setup_torch(args.threads))
        ok = worst <= THRESHOLDS["cpu_kernel_check_max_rel"]
        print(f"CPU MoE kernel stand-ins vs dense fp64 MoE: max rel {worst:.3e} ({'ok' if ok else 'FAILED'})")
        return 0 if ok else 1
    if not args.bundle:
        ap.error("--bundle is required (or --check-kernels)")
    try:
        report = run(args.bundle, args.threads)
    except BundleError as e:
        print(f"olmo_core_moe_parity: bad bundle: {e}", file=sys.stderr)
        return 2
    return finish(report, gate(report), print_summary, args.report)


if __name__ == "__main__":
    sys.exit(main())
