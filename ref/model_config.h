// ref/model_config.h — the shape of an Olmo 3 model and what follows from it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace olmoref {

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

  int64_t q_dim() const { return n_heads * head_dim; }
  int64_t kv_dim() const { return n_kv_heads * head_dim; }
  // Attention window of layer `layer` in keys, or 0 for full attention.
  int64_t window(int64_t layer) const;
  // Throws std::invalid_argument naming the offending key ("model.n_heads ...") if inconsistent.
  void validate() const;
  int64_t n_params() const;
  int64_t n_params_non_embedding() const;  // excludes the input embedding only (OLMo-core convention)
  // OLMo-core's num_flops_per_token: 6*(non-embedding params incl. LM head) + per layer 12*H*hd*eff_seq,
  // eff_seq = min(window, seq_len) on sliding-window layers.
  double flops_per_token(int64_t seq_len) const;
};

}  // namespace olmoref
