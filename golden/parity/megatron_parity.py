#!/usr/bin/env python3
"""Model-level parity of an olmoref parity bundle against Megatron-Core's own GPTModel, on the CPU.

Usage: megatron_parity.py --bundle DIR [--report FILE.json] [--control NAME]

The bundle is the one `olmoref parity-dump --steps 1` writes (golden/parity/README.md, "The parity bundle"): our step-0
weights as an HF checkpoint (hf/), the token batches, our step-1 logits and gradients (ours_step0.safetensors) and our
step-1 loss (ours.json). Megatron-Core's optimizer is CUDA-only, so only the model is checked: Megatron's GPTModel,
fed our step-0 weights and the step-1 batch, must give our logits, our loss and every parameter gradient.

What runs is Megatron-Core's code: GPTModel (its vocab embedding, RoPE, TransformerBlock, final RMSNorm, untied output
layer), TransformerConfig, TransformerLayer, SelfAttention's fused linear_qkv, GQA and RoPE application, the local
DotProductAttention with its sliding-window mask (window_size / window_attn_skip_freq), the SwiGLU MLP
(gated_linear_unit + silu, linear_fc1 = [gate; up]), Megatron's ColumnParallel/RowParallel linears and its torch
RMSNorm wrapper, parallel_state with TP = PP = 1 over a gloo world of 1.

What is added (Megatron cannot express it, or assumes CUDA), each named in the report as `additions`:
- Olmo3SelfAttention(SelfAttention): Olmo 3's QK-norm is one RMSNorm over the full q / k projection width
  ([n_heads*head_dim], [n_kv_heads*head_dim]); Megatron's q_layernorm / k_layernorm are per head ([head_dim]). The
  subclass applies Megatron's own RMSNorm (WrappedTorchNorm) over the flattened heads, and a post-norm on the
  attention output (Olmo 3's reordered norm: h = x + RMSNorm(Attn(x))).
- Olmo3MLP(MLP): the same post-norm on the MLP output (out = h + RMSNorm(MLP(h))); the layer's input and pre-MLP
  norms are IdentityOp in the spec, so TransformerLayer adds the normed output to the residual.
- CPU shims: torch.cuda.current_device() answers "cpu" (Megatron's global memory buffer and RoPE pick their device
  with it); get_sliding_window_causal_mask and the causal mask are built on the CPU with Megatron's formula (its copy
  hard-codes device="cuda"); the CUDA RNG tracker's fork around DotProductAttention's (p = 0) dropout is a no-op.
- The loss: olmoref's definition (hf_parity.olmo_loss: CE summed over targets + z_loss * logsumexp^2, divided by the
  target count); Megatron's loss has no z-loss.

Controls (--control, each must make the check fail): perhead_qknorm (Megatron's own per-head qk_layernorm),
no_window (window_size dropped: every layer full), window_off_by_one (Megatron's window one key wider),
perturb_qnorm (layer 0's q_norm weight scaled by 1.01).

Exit: 0 every gate passed; 1 a gate failed; 2 the bundle is malformed; 77 ("SKIPPED: ...") when megatron-core
cannot be imported.
"""
import argparse
import json
import math
import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
from hf_parity import THRESHOLDS, BundleError, compare_logits, load_bundle, olmo_loss, peer_threads, rel  # noqa: E402
from hf_parity import check_model_config  # noqa: E402

GATES = {k: THRESHOLDS[k] for k in ("top1_agreement_pct", "max_token_kl", "max_grad_rel", "loss_step0_rel")}
CONTROLS = ("perhead_qknorm", "no_window", "window_off_by_one", "perturb_qnorm")

ADDITIONS = [
    "Olmo3SelfAttention(SelfAttention): full-width QK-norm (Megatron's RMSNorm over [n_heads*head_dim] and "
    "[n_kv_heads*head_dim]; Megatron's qk_layernorm is per head) and the post-attention RMSNorm of the reordered "
    "block",
    "Olmo3MLP(MLP): the post-MLP RMSNorm of the reordered block (input_layernorm / pre_mlp_layernorm are IdentityOp)",
    "CPU shim: torch.cuda.current_device() -> 'cpu' (Megatron's GlobalMemoryBuffer and RotaryEmbedding.get_emb)",
    "CPU shim: tensor_parallel.get_cuda_rng_tracker() forks nothing (DotProductAttention forks the CUDA RNG for its "
    "dropout, which is 0 here)",
    "CPU shim: get_sliding_window_causal_mask and the causal attention mask built on the CPU with Megatron's formula "
    "(megatron/core/transformer/utils.py hard-codes device='cuda')",
    "loss: olmoref's CE + z-loss over the logits GPTModel returns (Megatron's loss has no z-loss)",
]


def skip(msg):
    print(f"SKIPPED: megatron parity: {msg}")
    sys.exit(77)


def setup_megatron(torch):
    """A gloo world of 1 and parallel_state with TP = PP = 1, after the CPU shims."""
    import torch.distributed as dist
    import megatron.core.fusions.fused_softmax as fused_softmax
    from megatron.core import parallel_state

    # Megatron picks its scratch buffer's and RoPE's device with torch.cuda.current_device(); on a CPU-only torch
    # that raises, so the one answer that keeps its code path intact is the CPU.
    torch.cuda.current_device = lambda: "cpu"

    def sliding_window_causal_mask_cpu(sq, skv, window_size):
        # megatron/core/transformer/utils.py get_sliding_window_causal_mask, with device="cpu".
        m = torch.ones(sq, skv, dtype=torch.bool)
        mu = torch.triu(m, diagonal=skv - sq - window_size[0])
        ml = torch.tril(mu, diagonal=skv - sq + window_size[1])
        return ~ml

    fused_softmax.get_sliding_window_causal_mask = sliding_window_causal_mask_cpu

    # DotProductAttention runs its (p = 0) dropout inside the CUDA RNG tracker's fork, which needs CUDA RNG states;
    # with no dropout there is no randomness to fork, so the fork is a no-op.
    import contextlib
    from megatron.core import tensor_parallel

    class CpuRngTracker:
        def fork(self, name=None):
            return contextlib.nullcontext()

    tensor_parallel.get_cuda_rng_tracker = lambda *a, **k: CpuRngTracker()
    tensor_parallel.random.get_cuda_rng_tracker = tensor_parallel.get_cuda_rng_tracker

    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        if "MASTER_PORT" not in os.environ:
            import socket
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                os.environ["MASTER_PORT"] = str(s.getsockname()[1])
        dist.init_process_group("gloo", rank=0, world_size=1)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=1)


def build_classes():
    from megatron.core.transformer.attention import SelfAttention
    from megatron.core.transformer.mlp import MLP
    from megatron.core.transformer.spec_utils import build_module
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    def rmsnorm(config, width):
        return build_module(WrappedTorchNorm, config=config, hidden_size=width, eps=config.layernorm_epsilon)

    class Olmo3SelfAttention(SelfAttention):
        """SelfAttention with Olmo 3's full-width QK-norm and its post-attention norm (see the module docstring)."""

        def __init__(self, config, submodules, layer_number, full_width_qk_norm=True, **kw):
            super().__init__(config, submodules, layer_number, **kw)
            self.full_width_qk_norm = full_width_qk_norm
            if full_width_qk_norm:
                self.q_norm = rmsnorm(config, self.query_projection_size)
                self.k_norm = rmsnorm(config, self.kv_projection_size)
            self.post_norm = rmsnorm(config, config.hidden_size)

        def get_query_key_value_tensors(self, hidden_states, key_value_states=None, output_gate=False,
                                        split_qkv=True):
            assert split_qkv and not output_gate, "Olmo3SelfAttention: only split q, k, v without an output gate"
            query, key, value = super().get_query_key_value_tensors(hidden_states, key_value_states)
            if self.full_width_qk_norm:
                # [sq, b, np, hn]: Megatron's query heads are in HF's order (group g holds heads g*np/ng ..), so the
                # flattened width is the q_proj output the HF weight [np*hn] was trained on.
                query = self.q_norm(query.flatten(2)).view_as(query)
                key = self.k_norm(key.flatten(2)).view_as(key)
            return query, key, value

        def forward(self, *args, **kwargs):
            out, bias = super().forward(*args, **kwargs)
            assert bias is None, "Olmo3SelfAttention: Olmo 3 has no biases"
            return self.post_norm(out), None

    class Olmo3MLP(MLP):
        """Megatron's MLP with Olmo 3's post-MLP norm."""

        def __init__(self, config, submodules, **kw):
            # MLP warns (deprecation) without ffn_hidden_size. tp_group stays None: TransformerLayer passes it only
            # to the exact MLP class, and MLP resolves None to parallel_state's TP group (the same, TP = 1).
            if kw.get("ffn_hidden_size") is None:
                kw["ffn_hidden_size"] = config.ffn_hidden_size
            super().__init__(config, submodules, **kw)
            self.post_norm = rmsnorm(config, config.hidden_size)

        def forward(self, hidden_states, *args, **kwargs):
            out, bias = super().forward(hidden_states, *args, **kwargs)
            assert bias is None, "Olmo3MLP: Olmo 3 has no biases"
            return self.post_norm(out), None

    return Olmo3SelfAttention, Olmo3MLP


def layer_spec(control):
    """Megatron's local GPT layer spec (get_gpt_layer_local_spec with RMSNorm), with the attention and MLP modules
    swapped for the two subclasses and no pre-norms."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.identity_op import IdentityOp
    from megatron.core.transformer.spec_utils import ModuleSpec

    Olmo3SelfAttention, Olmo3MLP = build_classes()
    perhead = control == "perhead_qknorm"
    spec = get_gpt_layer_local_spec(qk_layernorm=perhead, normalization="RMSNorm")
    sub = spec.submodules
    sub.input_layernorm = IdentityOp
    sub.pre_mlp_layernorm = IdentityOp
    attn = sub.self_attention
    sub.self_attention = ModuleSpec(module=Olmo3SelfAttention, params=dict(attn.params, full_width_qk_norm=not perhead),
                                    submodules=attn.submodules)
    sub.mlp = ModuleSpec(module=Olmo3MLP, params=dict(sub.mlp.params or {}), submodules=sub.mlp.submodules)
    return spec


def windows(model_cfg):
    """Per-layer window (0 = full) as ModelConfig::window defines it: the last layer is always full."""
    pat, L = model_cfg.get("swa_pattern") or [], int(model_cfg["n_layers"])
    return [0 if (i == L - 1 or not pat or pat[i % len(pat)] <= 0) else int(pat[i % len(pat)]) for i in range(L)]


def build_model(torch, m, control):
    import torch.nn.functional as F
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.transformer.transformer_config import TransformerConfig

    win = windows(m)
    sizes = sorted({w for w in win if w})
    if len(sizes) > 1:
        raise BundleError(f"ours.json: model.swa_pattern gives windows {sizes}; Megatron's TransformerConfig has one "
                          "window_size for every windowed layer")
    use_window = bool(sizes) and control != "no_window"
    head_dim = int(m.get("head_dim") or m["d_model"] // m["n_heads"])
    cfg = TransformerConfig(
        num_layers=int(m["n_layers"]), hidden_size=int(m["d_model"]), num_attention_heads=int(m["n_heads"]),
        num_query_groups=int(m["n_kv_heads"]), kv_channels=head_dim, ffn_hidden_size=int(m["ffn_hidden"]),
        normalization="RMSNorm", layernorm_epsilon=float(m["norm_eps"]),
        gated_linear_unit=True, activation_func=F.silu, add_bias_linear=False,
        hidden_dropout=0.0, attention_dropout=0.0, bias_dropout_fusion=False, masked_softmax_fusion=False,
        apply_rope_fusion=False, gradient_accumulation_fusion=False, persist_layer_norm=False,
        use_cpu_initialization=True, perform_initialization=False, params_dtype=torch.float32,
        attention_softmax_in_fp32=True,
        # HF / olmoref window W: query i sees keys i-W+1 .. i; Megatron's (left, right) counts the keys besides i.
        window_size=(sizes[0] - 1 + (control == "window_off_by_one"), 0) if use_window else None,
        window_attn_skip_freq=[1 if w else 0 for w in win] if use_window else None,
    )
    model = GPTModel(config=cfg, transformer_layer_spec=layer_spec(control), vocab_size=int(m["vocab_size"]),
                     max_sequence_length=4096, pre_process=True, post_process=True,
                     share_embeddings_and_output_weights=False, position_embedding_type="rope",
                     rotary_percent=1.0, rotary_base=int(m["rope_theta"]) if float(m["rope_theta"]).is_integer()
                     else float(m["rope_theta"]))
    return model, cfg


def name_map(m):
    """{megatron name: (hf name or names, kind)}; kind tells how the HF tensors combine."""
    out = {"embedding.word_embeddings.weight": ("model.embed_tokens.weight", "copy"),
           "decoder.final_layernorm.weight": ("model.norm.weight", "copy"),
           "output_layer.weight": ("lm_head.weight", "copy")}
    for i in range(int(m["n_layers"])):
        h, g = f"model.layers.{i}.", f"decoder.layers.{i}."
        a = h + "self_attn."
        out[g + "self_attention.linear_qkv.weight"] = ((a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"),
                                                       "qkv")
        out[g + "self_attention.linear_proj.weight"] = (a + "o_proj.weight", "copy")
        out[g + "self_attention.q_norm.weight"] = (a + "q_norm.weight", "copy")
        out[g + "self_attention.k_norm.weight"] = (a + "k_norm.weight", "copy")
        out[g + "self_attention.post_norm.weight"] = (h + "post_attention_layernorm.weight", "copy")
        out[g + "mlp.linear_fc1.weight"] = ((h + "mlp.gate_proj.weight", h + "mlp.up_proj.weight"), "cat")
        out[g + "mlp.linear_fc2.weight"] = (h + "mlp.down_proj.weight", "copy")
        out[g + "mlp.post_norm.weight"] = (h + "post_feedforward_layernorm.weight", "copy")
    return out


def qkv_pack(torch, q, k, v, ng, hn):
    """Megatron's fused linear_qkv rows: per query group g, [its np/ng q heads, k head g, v head g]."""
    d = q.shape[-1]
    per = q.shape[0] // (ng * hn)
    return torch.cat([q.view(ng, per * hn, d), k.view(ng, hn, d), v.view(ng, hn, d)], dim=1).reshape(-1, d)


def qkv_unpack(torch, w, ng, hn):
    d = w.shape[-1]
    g = w.view(ng, -1, d)
    per = g.shape[1] // hn - 2
    q, k, v = torch.split(g, [per * hn, hn, hn], dim=1)
    return q.reshape(-1, d), k.reshape(-1, d), v.reshape(-1, d)


def run(bundle, control, threads):
    try:
        import torch
        import megatron.core  # noqa: F401
        from megatron.core.models.gpt.gpt_model import GPTModel  # noqa: F401
    except Exception as e:  # an ImportError, or a megatron-core that fails while importing
        skip(f"megatron-core cannot be imported: {type(e).__name__}: {e}")
    sys.path.insert(0, os.path.join(here, "..", "replay"))
    from bundle import setup_torch
    from safetensors.torch import load_file
    from transformers import AutoConfig

    torch = setup_torch(threads)
    ours, batches, step0 = load_bundle(bundle)
    m = ours["model"]
    hf_cfg = AutoConfig.from_pretrained(os.path.join(bundle, "hf"))
    bad = check_model_config(m, hf_cfg)
    if bad:
        raise BundleError(f"{bundle}: ours.json's model does not describe hf/config.json: " + "; ".join(bad))
    hf_path = os.path.join(bundle, "hf", "model.safetensors")
    if not os.path.exists(hf_path):
        raise BundleError(f"{hf_path}: missing")
    hf = load_file(hf_path)
    if control == "perturb_qnorm":
        key = "model.layers.0.self_attn.q_norm.weight"
        hf[key] = hf[key] * 1.01

    setup_megatron(torch)
    model, cfg = build_model(torch, m, control)
    ng, hn = cfg.num_query_groups, cfg.kv_channels
    names = name_map(m)
    params = dict(model.named_parameters())
    if control == "perhead_qknorm":
        # Megatron's per-head q/k_layernorm has one [head_dim] weight; the closest it can hold of the full-width
        # weight is its first head's slice (the control exists to show the check catches per-head QK-norm).
        for i in range(int(m["n_layers"])):
            for mine, theirs in (("q_layernorm", "q_norm"), ("k_layernorm", "k_norm")):
                names[f"decoder.layers.{i}.self_attention.{mine}.weight"] = (
                    f"model.layers.{i}.self_attn.{theirs}.weight", "head0")
                del names[f"decoder.layers.{i}.self_attention.{theirs}.weight"]
    missing = sorted(set(params) - set(names))
    if missing:
        raise BundleError(f"megatron GPTModel has parameters this script does not map: {missing}")
    used = set()
    with torch.no_grad():
        for mname, (src, kind) in names.items():
            srcs = src if isinstance(src, tuple) else (src,)
            for s in srcs:
                if s not in hf:
                    raise BundleError(f"{hf_path}: missing tensor '{s}' (for Megatron's {mname})")
                used.add(s)
            if kind == "qkv":
                w = qkv_pack(torch, *(hf[s] for s in srcs), ng, hn)
            elif kind == "cat":
                w = torch.cat([hf[s] for s in srcs], dim=0)
            elif kind == "head0":
                w = hf[srcs[0]][:hn]
            else:
                w = hf[srcs[0]]
            p = params[mname]
            if tuple(w.shape) != tuple(p.shape):
                raise BundleError(f"{hf_path}: '{src}' gives {tuple(w.shape)} for Megatron's {mname} "
                                  f"{tuple(p.shape)}")
            p.copy_(w.to(torch.float32))
    unused = sorted(set(hf) - used)
    if unused:
        raise BundleError(f"{hf_path}: tensors with no Megatron parameter: {unused[:5]}")

    ids = torch.from_numpy(batches[0].astype("int64"))
    B, T = ids.shape
    if tuple(step0["logits"].shape) != (B, T, int(m["vocab_size"])):
        raise BundleError(f"{bundle}/ours_step0.safetensors: logits {tuple(step0['logits'].shape)}, expected "
                          f"{(B, T, int(m['vocab_size']))}")
    model.train()
    model.zero_grad(set_to_none=True)
    pos = torch.arange(T).unsqueeze(0).expand(B, T)
    causal = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1).view(1, 1, T, T)
    logits = model(input_ids=ids, position_ids=pos, attention_mask=causal)
    if tuple(logits.shape) != (B, T, int(m["vocab_size"])):
        raise RuntimeError(f"GPTModel returned logits {tuple(logits.shape)}, expected {(B, T, int(m['vocab_size']))}")
    loss, ce, z = olmo_loss(torch, logits, ids, float(ours["z_loss"]))
    loss.backward()

    report = {"bundle": os.path.abspath(bundle), "control": control, "thresholds": GATES,
              "megatron_core_version": megatron.core.__version__, "torch_version": torch.__version__,
              "what_runs": "Megatron-Core's GPTModel, TransformerConfig, TransformerLayer, SelfAttention (fused "
                           "linear_qkv, GQA, RoPE), local DotProductAttention with its sliding-window mask, SwiGLU "
                           "MLP, torch RMSNorm wrapper, parallel_state TP=PP=1 over gloo",
              "additions": ADDITIONS,
              "windows": windows(m), "megatron_window_size": cfg.window_size,
              "megatron_window_attn_skip_freq": cfg.window_attn_skip_freq}
    report["logits"] = compare_logits(torch, torch.from_numpy(step0["logits"]).float(), logits.detach(), peer="megatron")
    report["loss"] = {"ours": float(ours["loss_step0"]), "megatron": loss.item(), "megatron_ce": ce.item(),
                      "megatron_z": z.item(), "rel": rel(float(ours["loss_step0"]), loss.item())}
    for part, val in (("ce", ce.item()), ("z", z.item())):  # reported: the gate is on their sum
        if f"{part}_step0" in ours:
            report["loss"][f"{part}_rel"] = rel(float(ours[f"{part}_step0"]), val)
    grads, worst = {}, ("", -1.0)
    for mname, (src, kind) in names.items():
        g = params[mname].grad
        if g is None:
            raise RuntimeError(f"Megatron's {mname} got no gradient")
        srcs = src if isinstance(src, tuple) else (src,)
        if kind == "qkv":
            parts = qkv_unpack(torch, g, ng, hn)
        elif kind == "cat":
            parts = torch.split(g, [hf[s].shape[0] for s in srcs], dim=0)
        elif kind == "head0":
            continue  # a per-head weight has no counterpart gradient; the logits gate judges this control
        else:
            parts = (g,)
        for s, gm in zip(srcs, parts):
            key = "grad." + s
            if key not in step0:
                raise BundleError(f"{bundle}/ours_step0.safetensors: missing '{key}'")
            go = torch.from_numpy(step0[key]).double()
            r = float((gm.double() - go).norm() / max(float(go.norm()), 1e-30))
            grads[s] = r
            if r > worst[1]:
                worst = (s, r)
    report["grad_rel"] = grads
    report["max_grad_rel"] = worst[1]
    report["worst_grad_tensor"] = worst[0]

    checks = [("top1_agreement_pct", report["logits"]["top1_agreement_pct"], ">="),
              ("max_token_kl", max(report["logits"]["kl_ours_megatron_max"], report["logits"]["kl_megatron_ours_max"]),
               "<="),
              ("loss_step0_rel", report["loss"]["rel"], "<=")]
    if grads:
        checks.append(("max_grad_rel", worst[1], "<="))
    failures = []
    for gate, val, op in checks:
        lim = GATES[gate]
        ok = val >= lim if op == ">=" else val <= lim
        if not (ok and math.isfinite(val)):
            failures.append(f"{gate} = {val:.3e} (limit {op} {lim:g})")
    report["failures"] = failures
    report["pass"] = not failures
    return report


def summary(report):
    lg = report["logits"]
    tag = f" [control {report['control']}]" if report["control"] else ""
    return (f"megatron-core {report['megatron_core_version']}{tag}: top1 {lg['top1_agreement_pct']:.2f}%, max KL "
            f"{max(lg['kl_ours_megatron_max'], lg['kl_megatron_ours_max']):.3e}, max |dlogit| "
            f"{lg['max_abs_diff']:.3e}, loss ours {report['loss']['ours']:.9f} megatron "
            f"{report['loss']['megatron']:.9f} (rel {report['loss']['rel']:.3e}), worst grad rel "
            f"{report['max_grad_rel']:.3e} ({report['worst_grad_tensor']})")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--report")
    ap.add_argument("--control", choices=CONTROLS, help="run one control only (it passes the gates = exit 0)")
    ap.add_argument("--with-controls", action="store_true",
                    help="after the check, run every control in the same process; exit 0 only when the check passes "
                         "and every control fails a gate")
    args = ap.parse_args()
    try:
        report = run(args.bundle, args.control, peer_threads())
        print(summary(report))
        for f in report["failures"]:
            print(f"FAIL: {f}")
        ok = report["pass"]
        print("PASS: megatron parity" if ok else "FAIL: megatron parity")
        if args.with_controls:
            report["controls"] = {}
            for c in CONTROLS:
                r = run(args.bundle, c, peer_threads())
                report["controls"][c] = r
                print(summary(r))
                if r["pass"]:
                    ok = False
                    print(f"FAIL: control {c} passed every gate: the check cannot see it")
                else:
                    print(f"control {c} failed as it must: " + "; ".join(r["failures"]))
            print("PASS: every control failed" if ok and report["pass"] else "FAIL: megatron parity with controls")
    except BundleError as e:
        print(f"megatron parity: malformed bundle: {e}")
        sys.exit(2)
    if args.report:
        with open(args.report, "w") as f:
            json.dump(report, f, indent=1)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
