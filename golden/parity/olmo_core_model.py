"""OLMo-core's own Olmo 3 model for an olmoref bundle's "model" dict, on the CPU in fp32/fp64.

Shared by golden/parity/olmo_core_moe_parity.py (the MoE parity check) and golden/replay/olmo_core_replay.py (the
replay through OLMo-core's Trainer), so both build the same TransformerConfig from the same olmoref ModelConfig
fields and run the same CPU stand-ins for OLMo-core's Triton MoE kernels.

The "model" dict uses olmoref's ModelConfig names (vocab_size, d_model, n_layers, n_heads, n_kv_heads, head_dim,
rope_theta, norm_eps, swa_pattern and, for a mixture of experts, "moe": {n_experts, top_k, hidden, shared_hidden,
lb_loss_weight, z_loss_weight, scale_loss_by_num_layers, lb_granularity, normalize_expert_weights}); a dense model
also needs ffn_hidden. A long-context model has "rope_scaling": {kind "yarn", factor, beta_fast, beta_slow,
old_context_len, full_attention_only}, applied with OLMo-core's own with_rope_scaling.
"""
import types


def windows(m):
    """Per-layer window as olmoref's ModelConfig::window defines it (0 = full, the last layer always full)."""
    L, pat = int(m["n_layers"]), m["swa_pattern"]
    return [0 if (i == L - 1 or not pat or pat[i % len(pat)] <= 0) else int(pat[i % len(pat)]) for i in range(L)]


def model_windows(model):
    """The window OLMo-core built into each block (keys per query incl. itself; 0 = full), to check windows()."""
    out = []
    for _, block in model.blocks.items():
        w = getattr(block.attention, "window_size", None)
        out.append(0 if w is None else int(w))
    return out


def is_moe(m):
    return isinstance(m.get("moe"), dict)


def _moe_config(mo):
    from olmo_core.nn.feed_forward import FeedForwardConfig
    from olmo_core.nn.moe import MoEConfig, MoERouterConfig, MoEType
    from olmo_core.nn.moe.loss import MoELoadBalancingLossGranularity

    return MoEConfig(
        name=MoEType.dropless,
        num_experts=int(mo["n_experts"]),
        hidden_size=int(mo["hidden"]),
        # Softmax gating, no jitter or bias; normalize_expert_weights 0 (absent in older bundles) is OLMo-core's None.
        router=MoERouterConfig(top_k=int(mo["top_k"]),
                               normalize_expert_weights=float(mo.get("normalize_expert_weights", 0)) or None),
        shared_mlp=(FeedForwardConfig(hidden_size=int(mo["shared_hidden"]), bias=False)
                    if int(mo["shared_hidden"]) > 0 else None),
        lb_loss_weight=float(mo["lb_loss_weight"]) if float(mo["lb_loss_weight"]) != 0 else None,
        z_loss_weight=float(mo["z_loss_weight"]) if float(mo["z_loss_weight"]) != 0 else None,
        lb_loss_granularity=MoELoadBalancingLossGranularity(mo["lb_granularity"]),
        scale_loss_by_num_layers=bool(mo["scale_loss_by_num_layers"]),
    )


def olmo_core_config(m):
    """OLMo-core's TransformerConfig for the bundle's model: OLMo 3's reordered-norm blocks (or their MoE twin),
    full-width QK-norm, GQA, RoPE, sliding windows with the last layer full, torch SDPA attention (the CPU one)."""
    from olmo_core.nn.attention import SlidingWindowAttentionConfig
    from olmo_core.nn.attention.backend import AttentionBackendName
    from olmo_core.nn.feed_forward import FeedForwardConfig
    from olmo_core.nn.transformer.config import TransformerBlockType, TransformerConfig, TransformerType

    theta = float(m["rope_theta"])
    pat = [int(w) if int(w) > 0 else -1 for w in (m["swa_pattern"] or [-1])]
    if is_moe(m):
        body = dict(block_name=TransformerBlockType.moe_reordered_norm, feed_forward_moe=_moe_config(m["moe"]),
                    name=TransformerType.moe)
    else:
        # The FFN width is the bundle's, not llama_like's derivation from d_model (which may round differently).
        body = dict(block_name=TransformerBlockType.reordered_norm,
                    feed_forward=FeedForwardConfig(hidden_size=int(m["ffn_hidden"]), bias=False))
    config = TransformerConfig.llama_like(
        d_model=int(m["d_model"]), vocab_size=int(m["vocab_size"]), n_layers=int(m["n_layers"]),
        n_heads=int(m["n_heads"]), n_kv_heads=int(m["n_kv_heads"]),
        head_dim=int(m["head_dim"]) if int(m["head_dim"]) else None,
        qk_norm=True, use_head_qk_norm=False,              # OLMo 3: one RMSNorm over the full q (k) width
        layer_norm_eps=float(m["norm_eps"]),
        rope_theta=int(theta) if theta.is_integer() else theta,
        attn_backend=AttentionBackendName.torch,
        sliding_window=SlidingWindowAttentionConfig(pattern=pat, force_full_attention_on_first_layer=False,
                                                    force_full_attention_on_last_layer=True),
        **body,
    )
    rs = m.get("rope_scaling")
    if rs is not None:
        from olmo_core.nn.rope import YaRNRoPEScalingConfig

        if rs.get("kind") != "yarn":
            raise ValueError(f"model.rope_scaling kind {rs.get('kind')!r}: only \"yarn\" is known")
        config = config.with_rope_scaling(
            YaRNRoPEScalingConfig(factor=float(rs["factor"]), beta_fast=int(rs["beta_fast"]),
                                  beta_slow=int(rs["beta_slow"]), old_context_len=int(rs["old_context_len"])),
            full_attn_layers_only=bool(rs["full_attention_only"]))
    return config


# ---- CPU stand-ins for olmo_core.ops.moe.kernels (Triton) -----------------------------------------------------
# Called by OLMo-core's GatherOp / ScatterOp forward and backward (grad mode is off there), on the dropless path
# where bins == padded_bins, so every one of the tokens*top_k slots is written exactly once.

def _k_gather(x, indices, bin_ids, weights, bins, top_k):
    import torch

    idx = indices.long()
    out = x.index_select(0, torch.div(idx, top_k, rounding_mode="floor"))
    if weights is not None:
        out = out * weights.index_select(0, idx).unsqueeze(1).to(out.dtype)
    return out


def _k_scatter(x, indices, bin_ids, weights, bins, top_k):
    idx = indices.long()
    tokens = idx.shape[0] // top_k
    vals = x if weights is None else x * weights.index_select(0, idx).unsqueeze(1).to(x.dtype)
    out = x.new_zeros((tokens * top_k, x.shape[1]))
    out.index_copy_(0, idx, vals)
    return out.view(tokens, top_k, x.shape[1]).sum(dim=1) if top_k > 1 else out


def _k_scatter_wgrad(x, grad, indices, bin_ids, bins, top_k):
    import torch

    idx = indices.long()
    out = x.new_zeros(idx.shape[0])
    rows = grad.index_select(0, torch.div(idx, top_k, rounding_mode="floor"))
    out.index_copy_(0, idx, (x * rows).sum(dim=1))
    return out


def _k_unsupported(*_a, **_k):
    raise NotImplementedError("binned (capacity-limited) MoE kernels have no CPU stand-in; the parity model is "
                              "the dropless MoE")


CPU_KERNELS = types.SimpleNamespace(gather=_k_gather, scatter=_k_scatter, scatter_wgrad=_k_scatter_wgrad,
                                    padded_scatter=_k_unsupported, binned_gather=_k_unsupported,
                                    binned_scatter=_k_unsupported, binned_scatter_wgrad=_k_unsupported)


def install_cpu_kernels():
    import olmo_core.ops.moe as ops

    ops.kernels = CPU_KERNELS


def use_torch_gmm(model):
    """If the grouped_gemm package were installed OLMo-core would run the expert GEMMs through it in bf16; None
    selects OLMo-core's own fp32 per-expert matmul loop."""
    from olmo_core.nn.moe.mlp import DroplessMoEMLP

    for m in model.modules():
        if isinstance(m, DroplessMoEMLP):
            m._gmm = None


def install_document_mask_sdpa():
    """Intra-document masking for OLMo-core's torch SDPA backend, which refuses it (ai2-olmo-core 3.0.0 runs these
    instances through flash-attn's varlen kernels, each document its own sequence; there is none on the CPU). Given
    cu_doc_lens, the stand-in masks every key outside the query's document on top of OLMo-core's own causal and
    sliding-window mask (its _build_sliding_window_mask), then runs the very SDPA call of its forward. Everything
    else in the model, RoPE's per-document positions (RotaryEmbedding with cu_doc_lens) included, is OLMo-core's."""
    import torch
    import torch.nn.functional as F
    from olmo_core.nn.attention import backend as oc_backend

    cls = oc_backend.TorchAttentionBackend
    if getattr(cls, "_olmoref_documents", False):
        return
    original = cls.forward

    def forward(self, qkv, cu_doc_lens=None, cu_doc_lens_q=None, cu_doc_lens_k=None, max_doc_len=None,
                max_doc_len_q=None, max_doc_len_k=None, local_k_slice=None, kv_cache_manager=None, sinks=None):
        if cu_doc_lens is None:
            return original(self, qkv, local_k_slice=local_k_slice, kv_cache_manager=kv_cache_manager, sinks=sinks)
        if cu_doc_lens_q is not None or cu_doc_lens_k is not None or sinks is not None or self.cp_enabled:
            raise RuntimeError("olmoref's document-mask stand-in: cu_doc_lens only (no q/k lengths, sinks or CP)")
        q, k, v = qkv
        B, T = q.shape[0], q.shape[1]
        flat = torch.arange(B * T, device=q.device, dtype=cu_doc_lens.dtype)
        doc = torch.bucketize(flat, cu_doc_lens[1:], right=True).view(B, T)  # as OLMo-core's RoPE finds documents
        same_doc = doc[:, :, None] == doc[:, None, :]
        band = self._build_sliding_window_mask(seq_len_q=T, seq_len_kv=T, device=q.device,
                                               window_size=self.window_size)
        mask = (band[None] & same_doc)[:, None]  # [B, 1, T, T]
        n_rep = self.n_heads // self.n_kv_heads
        k, v = oc_backend._repeat_kv(k, n_rep), oc_backend._repeat_kv(v, n_rep)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        att = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=self.dropout_p, scale=self.scale)
        return att.transpose(1, 2).contiguous()

    cls.forward = forward
    cls._olmoref_documents = True


def document_inputs(torch, ids, eos, control=None):
    """OLMo-core's doc_lens and max_doc_lens for a batch of instances ids [B, T]: get_document_lengths per instance
    (NumpyFSLDataset's generate_doc_lengths), zero-padded to one width as its collator pads them. TEST ONLY
    negative controls: control "shifted" moves every document's first boundary one token earlier (the EOS taken as
    the next document's first token), "off" gives no documents at all."""
    from olmo_core.data.utils import get_document_lengths

    if control == "off":
        return {}
    lens = [get_document_lengths(row, eos) for row in ids]
    if control == "shifted":
        for x in lens:
            if len(x) > 1 and x[0] > 1:
                x[0] -= 1
                x[1] += 1
    width = max(len(x) for x in lens)
    doc_lens = torch.stack([torch.nn.functional.pad(x, (0, width - len(x))) for x in lens])
    return {"doc_lens": doc_lens, "max_doc_lens": [int(x.max()) for x in lens]}
