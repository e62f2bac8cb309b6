// core/model_config.h — the shape of an Olmo 3 model and what follows from it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace olmoref {

// Where the load-balancing loss takes its token counts and its mean (docs/canonical/moe.md).
enum class MoELbGranularity {
  instance,     // per instance: layout-free, the same loss for every micro-batch size and data-parallel layout
  local_batch,  // OLMo-core's default: per micro-batch, so the loss depends on the layout (parity mode)
};

// The mixture-of-experts feed-forward of OLMo-core's moe_reordered_norm block (docs/canonical/moe.md).
// n_experts == 0: the block keeps its dense SwiGLU feed-forward.
struct MoEConfig {
  int64_t n_experts = 0;
  int64_t top_k = 1;
  int64_t hidden = 0;         // each routed expert's SwiGLU hidden width
  int64_t shared_hidden = 0;  // the shared expert's SwiGLU hidden width; 0: no shared expert
  double lb_loss_weight = 0.0;  // OLMo-core MoEConfig.lb_loss_weight (0: no load-balancing loss)
  double z_loss_weight = 0.0;   // OLMo-core MoEConfig.z_loss_weight (0: no router z-loss)
  bool scale_loss_by_num_layers = true;  // OLMo-core's default: both weights divided by n_layers
  double normalize_expert_weights = 0;   // OLMo-core's router option: 0 (off, its default), 1 or 2 (L1 / L2 norm)
  MoELbGranularity lb_granularity = MoELbGranularity::instance;

  bool enabled() const { return n_experts > 0; }
};

// RoPE scaling for a longer context than pretraining's (OLMo-core's RoPEConfig.scaling). Olmo 3's long-context stage
// uses YaRN with factor 8, beta_fast 32, beta_slow 1 from 8,192 tokens, on the full-attention layers only (OLMo-core's
// with_rope_scaling(full_attn_layers_only=True); Hugging Face's Olmo3 puts rope_scaling on full_attention alone too).
enum class RopeScalingKind { none, yarn };

struct RopeScaling {
  RopeScalingKind kind = RopeScalingKind::none;
  double factor = 8.0;            // context expansion: the interpolated frequencies are the base ones / factor
  int64_t beta_fast = 32;         // rotations that bound the ramp at the high-frequency end
  int64_t beta_slow = 1;          // ... and at the low-frequency end
  int64_t old_context_len = 8192; // the context the base frequencies were trained at
  bool full_attention_only = true;

  bool on() const { return kind != RopeScalingKind::none; }
  // YaRN's m-scale (its paper's section 3.4), as OLMo-core computes it: cos and sin are multiplied by it.
  double attention_factor() const;
};

struct ModelConfig {
  std::string name = "custom";
  int64_t vocab_size = 0;     // rows of the embedding and LM head (OLMo-core pads to a multiple of 128)
  int64_t d_model = 0;
  int64_t n_layers = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;     // == n_heads: MHA; smaller: GQA (n_heads must be a multiple)
  int64_t head_dim = 0;       // 0 means d_model / n_heads
  int64_t ffn_hidden = 0;     // SwiGLU hidden width
  double rope_theta = 500000.0;
  float norm_eps = 1e-6f;
  // Sliding-window pattern, repeated over layers: layer i uses swa_pattern[i % size]; <= 0 (written -1)
  // means full attention. The last layer is always full (OLMo-core force_full_attention_on_last_layer).
  // A window counts the query itself: query i sees keys j with 0 <= i - j <= window - 1.
  std::vector<int64_t> swa_pattern = {4096, 4096, 4096, -1};
  double init_std = 0.02;     // truncated normal at +-3 sigma for every weight matrix
  uint64_t init_seed = 0;
  RopeScaling rope_scaling{};  // off unless a long-context config sets model.rope_scaling
  // Last: tests write models as designated initializers ending in `.moe = {}` (tests/common/test_models.h).
  MoEConfig moe;              // routed experts in place of every block's dense feed-forward when enabled

  int64_t q_dim() const { return n_heads * head_dim; }
  int64_t kv_dim() const { return n_kv_heads * head_dim; }
  // Attention window of layer `layer` in keys, or 0 for full attention.
  int64_t window(int64_t layer) const;
  // Whether layer `layer` rotates with the scaled RoPE table.
  bool rope_scaled(int64_t layer) const {
    return rope_scaling.on() && (!rope_scaling.full_attention_only || window(layer) == 0);
  }
  // Throws std::invalid_argument naming the offending key ("model.n_heads ...") if inconsistent.
  void validate() const;
  int64_t n_params() const;
  int64_t n_params_non_embedding() const;  // excludes the input embedding only (OLMo-core convention)
  // Parameters one token's forward uses: n_params() with only top_k of each layer's routed experts (dense: all).
  int64_t n_params_active() const;
  int64_t ffn_params() const;  // one block's feed-forward (dense, or router + experts + shared expert)
  // ai2-olmo-core 3.0.0's num_flops_per_token (model_config.cpp has the terms): 6 × the parameters a token uses,
  // less the embedding and the blocks' norms, plus the causal attention pairs per layer.
  double flops_per_token(int64_t seq_len) const;
};

}  // namespace olmoref
