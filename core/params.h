// core/params.h — the canonical flat parameter vector.
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
//   (a mixture-of-experts block, model.moe_experts = E > 0, has in place of feed_forward.*, as OLMo-core's
//    MoELinearRouter and DroplessMoEMLP hold them; docs/canonical/moe.md):
//     blocks.N.feed_forward_moe.router.weight            [E*d]    (row e: expert e's logit weights)
//     blocks.N.feed_forward_moe.experts.mlp.w1           [E*h, d] (expert e: rows e*h.., [out, in])
//     blocks.N.feed_forward_moe.experts.mlp.w2           [E*h, d] (expert e: rows e*h.., [in, out])
//     blocks.N.feed_forward_moe.experts.mlp.w3           [E*h, d] (expert e: rows e*h.., [out, in])
//     blocks.N.feed_forward_moe.shared_mlp.w1.weight     [Fs, d]  (only with a shared expert)
//     blocks.N.feed_forward_moe.shared_mlp.w3.weight     [Fs, d]
//     blocks.N.feed_forward_moe.shared_mlp.w2.weight     [d, Fs]
//   lm_head.norm.weight                     [d]
//   lm_head.w_out.weight                    [V, d]
// Matrices are row-major in PyTorch's [out, in] layout. Gradients and AdamW moments use the same
// layout, and whole-model scalars (gradient norm, digests) are defined over fixed chunks of it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/model_config.h"

namespace olmoref {

enum class ParamKind { embedding, matrix, norm };

struct ParamInfo {
  std::string name;     // OLMo-core name
  std::string hf_name;  // Hugging Face Olmo3ForCausalLM name ("" for MoE tensors: Olmo3 has none)
  std::vector<int64_t> shape;
  int64_t offset = 0;   // into the flat vector, in floats
  int64_t numel = 0;
  ParamKind kind = ParamKind::matrix;
  bool weight_decay = true;  // OLMo-core: everything but embeddings.weight
};

// Offsets of one block's tensors inside the flat vector.
// Offsets of one block's tensors inside the flat vector; -1 for tensors the block does not have (a dense block has
// no moe_*, a MoE block no w1/w3/w2, and shared_* only with a shared expert).
struct BlockOffsets {
  int64_t w_q, w_k, w_v, w_out, q_norm, k_norm, attn_norm, w1, w3, w2, ffn_norm;
  int64_t moe_router = -1, moe_w1 = -1, moe_w2 = -1, moe_w3 = -1;
  int64_t shared_w1 = -1, shared_w3 = -1, shared_w2 = -1;
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
