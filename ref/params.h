// ref/params.h — the canonical flat parameter vector.
//
// Every parameter lives in one contiguous fp32 buffer in this order (OLMo-core names):
//   embeddings.weight                       [V, d]
//   for each block N = 0..L-1:
//     blocks.N.attention.w_q.weight         [H*hd, d]
//     blocks.N.attention.w_k.weight         [KV*hd, d]
//     blocks.N.attention.w_v.weight         [KV*hd, d]
//     blocks.N.attention.w_out.weight       [d, H*hd]
//     blocks.N.attention.q_norm.weight      [H*hd]
//     blocks.N.attention.k_norm.weight      [KV*hd]
//     blocks.N.attention_norm.weight        [d]
//     blocks.N.feed_forward.w1.weight       [F, d]   (gate)
//     blocks.N.feed_forward.w3.weight       [F, d]   (up)
//     blocks.N.feed_forward.w2.weight       [d, F]   (down)
//     blocks.N.feed_forward_norm.weight     [d]
//   lm_head.norm.weight                     [d]
//   lm_head.w_out.weight                    [V, d]
// Matrices are row-major in PyTorch's [out, in] layout. Gradients and AdamW moments use the same
// layout, and whole-model scalars (gradient norm, digests) are defined over fixed chunks of it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ref/model_config.h"

namespace olmoref {

enum class ParamKind { embedding, matrix, norm };

struct ParamInfo {
  std::string name;     // OLMo-core name
  std::string hf_name;  // Hugging Face Olmo3ForCausalLM name
  std::vector<int64_t> shape;
  int64_t offset = 0;   // into the flat vector, in floats
  int64_t numel = 0;
  ParamKind kind = ParamKind::matrix;
  bool weight_decay = true;  // OLMo-core: everything but embeddings.weight
};

// Offsets of one block's tensors inside the flat vector.
struct BlockOffsets {
  int64_t w_q, w_k, w_v, w_out, q_norm, k_norm, attn_norm, w1, w3, w2, ffn_norm;
};

struct ParamLayout {
  std::vector<ParamInfo> params;
  std::vector<BlockOffsets> blocks;
  int64_t embeddings = 0, final_norm = 0, lm_head = 0;
  int64_t total = 0;

  explicit ParamLayout(const ModelConfig& cfg);
  const ParamInfo* find(const std::string& name) const;
};

}  // namespace olmoref
