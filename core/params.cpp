#include "core/params.h"

namespace olmoref {

ParamLayout::ParamLayout(const ModelConfig& cfg) {
  const int64_t d = cfg.d_model, V = cfg.vocab_size, F = cfg.ffn_hidden, qd = cfg.q_dim(), kd = cfg.kv_dim();
  auto add = [&](std::string name, std::string hf, std::vector<int64_t> shape, ParamKind kind) {
    ParamInfo p;
    p.name = std::move(name);
    p.hf_name = std::move(hf);
    p.shape = std::move(shape);
    p.numel = 1;
    for (int64_t s : p.shape) p.numel *= s;
    p.offset = total;
    p.kind = kind;
    p.weight_decay = kind != ParamKind::embedding;
    total += p.numel;
    params.push_back(std::move(p));
    return params.back().offset;
  };
  embeddings = add("embeddings.weight", "model.embed_tokens.weight", {V, d}, ParamKind::embedding);
  for (int64_t l = 0; l < cfg.n_layers; ++l) {
    const std::string oc = "blocks." + std::to_string(l) + ".";
    const std::string hf = "model.layers." + std::to_string(l) + ".";
    BlockOffsets b{};
    b.w_q = add(oc + "attention.w_q.weight", hf + "self_attn.q_proj.weight", {qd, d}, ParamKind::matrix);
    b.w_k = add(oc + "attention.w_k.weight", hf + "self_attn.k_proj.weight", {kd, d}, ParamKind::matrix);
    b.w_v = add(oc + "attention.w_v.weight", hf + "self_attn.v_proj.weight", {kd, d}, ParamKind::matrix);
    b.w_out = add(oc + "attention.w_out.weight", hf + "self_attn.o_proj.weight", {d, qd}, ParamKind::matrix);
    b.q_norm = add(oc + "attention.q_norm.weight", hf + "self_attn.q_norm.weight", {qd}, ParamKind::norm);
    b.k_norm = add(oc + "attention.k_norm.weight", hf + "self_attn.k_norm.weight", {kd}, ParamKind::norm);
    b.attn_norm = add(oc + "attention_norm.weight", hf + "post_attention_layernorm.weight", {d}, ParamKind::norm);
    if (!cfg.moe.enabled()) {
      b.w1 = add(oc + "feed_forward.w1.weight", hf + "mlp.gate_proj.weight", {F, d}, ParamKind::matrix);
      b.w3 = add(oc + "feed_forward.w3.weight", hf + "mlp.up_proj.weight", {F, d}, ParamKind::matrix);
      b.w2 = add(oc + "feed_forward.w2.weight", hf + "mlp.down_proj.weight", {d, F}, ParamKind::matrix);
    } else {
      b.w1 = b.w3 = b.w2 = -1;
      const int64_t E = cfg.moe.n_experts, h = cfg.moe.hidden, Fs = cfg.moe.shared_hidden;
      const std::string moe = oc + "feed_forward_moe.";
      b.moe_router = add(moe + "router.weight", "", {E * d}, ParamKind::matrix);
      b.moe_w1 = add(moe + "experts.mlp.w1", "", {E * h, d}, ParamKind::matrix);
      b.moe_w2 = add(moe + "experts.mlp.w2", "", {E * h, d}, ParamKind::matrix);
      b.moe_w3 = add(moe + "experts.mlp.w3", "", {E * h, d}, ParamKind::matrix);
      if (Fs > 0) {
        b.shared_w1 = add(moe + "shared_mlp.w1.weight", "", {Fs, d}, ParamKind::matrix);
        b.shared_w3 = add(moe + "shared_mlp.w3.weight", "", {Fs, d}, ParamKind::matrix);
        b.shared_w2 = add(moe + "shared_mlp.w2.weight", "", {d, Fs}, ParamKind::matrix);
      }
    }
    b.ffn_norm = add(oc + "feed_forward_norm.weight", hf + "post_feedforward_layernorm.weight", {d}, ParamKind::norm);
    blocks.push_back(b);
  }
  final_norm = add("lm_head.norm.weight", "model.norm.weight", {d}, ParamKind::norm);
  lm_head = add("lm_head.w_out.weight", "lm_head.weight", {V, d}, ParamKind::matrix);
}

const ParamInfo* ParamLayout::find(const std::string& name) const {
  for (const auto& p : params)
    if (p.name == name || (!p.hf_name.empty() && p.hf_name == name)) return &p;
  return nullptr;
}

}  // namespace olmoref
