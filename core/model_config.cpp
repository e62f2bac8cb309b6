#include "core/model_config.h"

#include <cmath>

#include <algorithm>
#include <stdexcept>

#include "core/mathfn.h"

namespace olmoref {

double RopeScaling::attention_factor() const { return 0.1 * det::log(factor) + 1.0; }

int64_t ModelConfig::window(int64_t layer) const {
  if (layer == n_layers - 1 || swa_pattern.empty()) return 0;
  const int64_t w = swa_pattern[static_cast<size_t>(layer) % swa_pattern.size()];
  return w > 0 ? w : 0;
}

static void require(bool ok, const std::string& key, const std::string& why) {
  if (!ok) throw std::invalid_argument("config key '" + key + "': " + why);
}

void ModelConfig::validate() const {
  require(vocab_size > 0, "model.vocab_size", "must be > 0");
  require(d_model > 0, "model.d_model", "must be > 0");
  require(n_layers > 0, "model.n_layers", "must be > 0");
  require(n_heads > 0, "model.n_heads", "must be > 0");
  require(n_kv_heads > 0, "model.n_kv_heads", "must be > 0");
  require(n_heads % n_kv_heads == 0, "model.n_kv_heads",
          "n_heads (" + std::to_string(n_heads) + ") must be a multiple of n_kv_heads (" + std::to_string(n_kv_heads) + ")");
  require(head_dim > 0, "model.head_dim", "must be > 0 (or leave it out to use d_model / n_heads)");
  require(head_dim % 2 == 0, "model.head_dim", "must be even for rotary embeddings (got " + std::to_string(head_dim) + ")");
  require(ffn_hidden > 0, "model.ffn_hidden", "must be > 0");
  require(rope_theta > 0 && std::isfinite(rope_theta), "model.rope_theta", "must be finite and > 0");
  require(norm_eps > 0 && std::isfinite(norm_eps), "model.norm_eps", "must be finite and > 0");
  require(init_std > 0 && std::isfinite(init_std), "model.init_std", "must be finite and > 0");
  // Shapes whose parameter count overflows the 64-bit element indices (and any memory) are refused here; what
  // does not fit this machine's memory is refused before allocation (train/trainer.cpp).
  const double d = static_cast<double>(d_model), approx_params =
      2.0 * static_cast<double>(vocab_size) * d +
      static_cast<double>(n_layers) * (4.0 * static_cast<double>(n_heads) * static_cast<double>(head_dim) * d +
                                       3.0 * static_cast<double>(ffn_hidden) * d);
  require(approx_params < 1e14, "model", "the shape has about " + std::to_string(approx_params) +
                                              " parameters, beyond anything trainable (check d_model, vocab_size, ffn_hidden)");
  if (moe.enabled()) {
    require(moe.top_k >= 1 && moe.top_k <= moe.n_experts, "model.moe_top_k",
            "must be between 1 and model.moe_experts (" + std::to_string(moe.n_experts) + "); got " +
                std::to_string(moe.top_k));
    require(moe.hidden > 0, "model.moe_hidden", "must be > 0 (each expert's SwiGLU hidden width)");
    require(moe.shared_hidden >= 0, "model.moe_shared_hidden", "must be >= 0 (0: no shared expert)");
    require(moe.lb_loss_weight >= 0 && std::isfinite(moe.lb_loss_weight), "model.moe_lb_loss_weight",
            "must be finite and >= 0 (0: no load-balancing loss)");
    require(moe.z_loss_weight >= 0 && std::isfinite(moe.z_loss_weight), "model.moe_z_loss_weight",
            "must be finite and >= 0 (0: no router z-loss)");
    require(moe.n_experts <= 4096, "model.moe_experts", "must be <= 4096");
    require(moe.normalize_expert_weights == 0 || moe.normalize_expert_weights == 1 || moe.normalize_expert_weights == 2,
            "model.moe_normalize_expert_weights",
            "must be 0 (off, OLMo-core's default), 1 (the top-k weights divided by their sum) or 2 (by their L2 norm); "
            "other norms are not implemented");
  } else {
    require(moe.n_experts == 0, "model.moe_experts", "must be >= 0 (0: the dense feed-forward)");
  }
  if (rope_scaling.on()) {
    require(std::isfinite(rope_scaling.factor) && rope_scaling.factor >= 1, "model.rope_yarn_factor",
            "must be finite and >= 1 (the context expansion; 8 in Olmo 3's long-context stage)");
    require(rope_scaling.beta_slow >= 1 && rope_scaling.beta_fast > rope_scaling.beta_slow, "model.rope_yarn_beta_fast",
            "must be > model.rope_yarn_beta_slow >= 1 (YaRN's ramp runs from beta_fast rotations down to beta_slow; "
            "32 and 1 in Olmo 3)");
    require(rope_scaling.old_context_len >= 1, "model.rope_yarn_old_context_len",
            "must be >= 1 (the context length the base RoPE was trained at; 8192 in Olmo 3)");
  }
  require(!swa_pattern.empty(), "model.swa_pattern", "must not be empty (use [-1] for full attention everywhere)");
  for (int64_t w : swa_pattern)
    require(w > 0 || w == -1, "model.swa_pattern",
            "each window must be > 0 (keys, counting the query itself) or -1 for full attention; got " + std::to_string(w));
}

int64_t ModelConfig::n_params() const {
  const int64_t d = d_model;
  const int64_t per_layer = q_dim() * d + 2 * kv_dim() * d + d * q_dim()  // w_q, w_k, w_v, w_out
                            + q_dim() + kv_dim()                           // q_norm, k_norm
                            + d + d                                         // attention_norm, feed_forward_norm
                            + ffn_params();
  return vocab_size * d + n_layers * per_layer + d + vocab_size * d;
}

int64_t ModelConfig::ffn_params() const {
  const int64_t d = d_model;
  if (!moe.enabled()) return 3 * ffn_hidden * d;  // w1, w3, w2
  return moe.n_experts * d                          // router
         + moe.n_experts * 3 * moe.hidden * d       // experts' w1, w3, w2
         + 3 * moe.shared_hidden * d;               // shared expert
}

int64_t ModelConfig::n_params_active() const {
  if (!moe.enabled()) return n_params();
  return n_params() - n_layers * (moe.n_experts - moe.top_k) * 3 * moe.hidden * d_model;
}

int64_t ModelConfig::n_params_non_embedding() const { return n_params() - vocab_size * d_model; }

double ModelConfig::flops_per_token(int64_t seq_len) const {
  // ai2-olmo-core 3.0.0's Transformer.num_flops_per_token, term for term: per block 6 × the attention module's
  // parameters (q/k norms included, the block's two norms not) + 12·H·hd·positions / T (integer division), where
  // positions counts the causal (query, key) pairs, capped by the window on sliding-window layers; + 6 × the
  // feed-forward's parameters (MoE: router, shared expert and int(experts' parameters · top_k / E)); + 6 × the LM
  // head's (final norm included). Earlier OLMo-core releases counted 12·H·hd·min(window, T), no causal halving.
  const int64_t d = d_model, T = seq_len;
  const int64_t attn_params = q_dim() * d + 2 * kv_dim() * d + d * q_dim() + q_dim() + kv_dim();
  int64_t ffn = 3 * ffn_hidden * d;
  if (moe.enabled()) {
    const int64_t experts = moe.n_experts * 3 * moe.hidden * d;
    ffn = moe.n_experts * d + 3 * moe.shared_hidden * d +
          static_cast<int64_t>(static_cast<double>(experts) * static_cast<double>(moe.top_k) /
                               static_cast<double>(moe.n_experts));
  }
  double flops = 6.0 * static_cast<double>(vocab_size * d + d);
  for (int64_t l = 0; l < n_layers; ++l) {
    const int64_t w = window(l);
    const int64_t positions = (w <= 0 || w >= T) ? T * (T + 1) / 2 : w * (w + 1) / 2 + (T - w) * w;
    flops += 6.0 * static_cast<double>(attn_params + ffn) +
             static_cast<double>(12 * n_heads * head_dim * positions / T);
  }
  return flops;
}

}  // namespace olmoref
