// model/dense_block.cpp — the attention sublayer every block has and the dense SwiGLU feed-forward, forward and
// backward (docs/canonical/README.md lists each op's order). The walk over blocks and the residual around the
// feed-forward are model/olmo3.cpp's; the mixture-of-experts feed-forward is model/moe_block.cpp.
//
// Shapes: R = n_inst·T rows, d the model width, H·hd = qd query width, KV·hd = kd key/value width, F the SwiGLU
// hidden width. round_act(...) is a no-op in fp32; in bf16 it rounds the tensor just written (docs/canonical/bf16.md).
#include <cmath>

#include "model/olmo3.h"

namespace olmoref {

AttentionShape Olmo3::attention_shape(int64_t layer, int64_t n_inst) const {
  AttentionShape as{n_inst, T_, cfg_.n_heads, cfg_.n_kv_heads, cfg_.head_dim, cfg_.window(layer),
                    1.0f / std::sqrt(static_cast<float>(cfg_.head_dim))};
  as.precision = precision_;  // bf16: dq, dk, dv come back rounded
  as.doc_start = doc_start_, as.doc_end = doc_end_;  // null without intra-document masking
  // Context parallelism: this rank's queries and keys (the whole instance without it).
  if (cp_ > 1) as.q_begin = as.k_begin = first_position(), as.q_end = as.k_end = first_position() + L_;
  return as;
}

void Olmo3::attention_forward(const float* params, LayerActs& A, const BlockOffsets& o, int64_t layer, int64_t n_inst) {
  Executor& e = *ex_;
  const int64_t R = n_inst * L_, d = cfg_.d_model, qd = cfg_.q_dim(), kd = cfg_.kv_dim();
  const float eps = cfg_.norm_eps;
  const bool bf16 = precision_ == Precision::bf16;
  // q_raw [R, qd] = x [R, d] · Wqᵀ [d, qd]
  e.matmul_forward(A.x.data(), params + o.w_q, A.q_raw.data(), R, qd, d);
  round_act(A.q_raw.data(), R * qd);
  // k_raw [R, kd] = x [R, d] · Wkᵀ [d, kd]
  e.matmul_forward(A.x.data(), params + o.w_k, A.k_raw.data(), R, kd, d);
  round_act(A.k_raw.data(), R * kd);
  // v [R, kd] = x [R, d] · Wvᵀ [d, kd]
  e.matmul_forward(A.x.data(), params + o.w_v, A.v.data(), R, kd, d);
  round_act(A.v.data(), R * kd);
  // q [R, qd] = RoPE(RMSNorm(q_raw)), k [R, kd] likewise: QK-norm then RoPE, each result rounded in bf16 (the
  // fused op keeps both rounding points).
  e.rmsnorm_rope_forward(A.q_raw.data(), params + o.q_norm, A.q.data(), A.q_rms.data(), R, cfg_.n_heads, rope_of(layer), eps,
                         bf16);
  e.rmsnorm_rope_forward(A.k_raw.data(), params + o.k_norm, A.k.data(), A.k_rms.data(), R, cfg_.n_kv_heads, rope_of(layer), eps,
                         bf16);
  // att [R, qd] = softmax(q·kᵀ·scale + causal window) · v, per head; statistics [B, H, T]
  attention_op_forward(A, layer, n_inst);
  round_act(A.att.data(), R * qd);
  // ao [R, d] = att [R, qd] · Woᵀ [qd, d]
  e.matmul_forward(A.att.data(), params + o.w_out, A.ao.data(), R, d, qd);
  round_act(A.ao.data(), R * d);
  // h [R, d] = x [R, d] + RMSNorm(ao [R, d]), the normed value and the sum each rounded in bf16.
  e.rmsnorm_residual_forward(A.x.data(), A.ao.data(), params + o.attn_norm, A.h.data(), A.ao_rms.data(), R, d, eps,
                             bf16);
}

void Olmo3::dense_ffn_forward(const float* params, LayerActs& A, const BlockOffsets& o, int64_t n_inst) {
  Executor& e = *ex_;
  const int64_t R = n_inst * L_, d = cfg_.d_model, F = cfg_.ffn_hidden;
  // g [R, F] = h [R, d] · W1ᵀ [d, F]
  e.matmul_forward(A.h.data(), params + o.w1, A.g.data(), R, F, d);
  round_act(A.g.data(), R * F);
  // u [R, F] = h [R, d] · W3ᵀ [d, F] (bf16: rounded) and a [R, F] = SwiGLU(g, u), the SwiGLU in the product's epilogue.
  e.matmul_forward_swiglu(A.h.data(), params + o.w3, A.g.data(), A.u.data(), A.a.data(), R, F, d,
                          precision_ == Precision::bf16);
  // f [R, d] = a [R, F] · W2ᵀ [F, d]
  e.matmul_forward(A.a.data(), params + o.w2, A.f.data(), R, d, F);
  round_act(A.f.data(), R * d);
}

void Olmo3::dense_ffn_backward(const float* params, LayerActs& A, const BlockOffsets& o, int64_t n_inst,
                               GradientLeaves& grads) {
  Executor& e = *ex_;
  const int64_t R = n_inst * L_, d = cfg_.d_model, F = cfg_.ffn_hidden;
  float *df = bw_.df.data(), *dx = bw_.dx.data(), *dg = bw_.dg.data(), *du = bw_.du.data();
  // ∂W2_b [d, F] = ∂f_bᵀ · a_b
  instance_weight_grads(grads, n_inst, o.w2, df, A.a.data(), d, F);
  // ∂a [R, F] = ∂f [R, d] · W2 [d, F] (bf16: rounded), then SwiGLU's backward in the product's epilogue: ∂a lives
  // only in dg, which it leaves holding ∂g [R, F]; ∂u [R, F] into du.
  e.matmul_backward_input_swiglu(df, params + o.w2, A.g.data(), A.u.data(), dg, du, R, d, F,
                                 precision_ == Precision::bf16);
  // ∂W1_b, ∂W3_b [F, d] = ∂g_bᵀ · h_b, ∂u_bᵀ · h_b
  instance_weight_grads(grads, n_inst, o.w1, dg, A.h.data(), F, d);
  instance_weight_grads(grads, n_inst, o.w3, du, A.h.data(), F, d);
  // ∂h [R, d] = dx + ∂g·W1 + ∂u·W3: the chains continue from the residual gradient (accumulate=true).
  e.matmul_backward_input(dg, params + o.w1, dx, R, F, d, true);
  e.matmul_backward_input(du, params + o.w3, dx, R, F, d, true);
}

void Olmo3::attention_backward(const float* params, LayerActs& A, const BlockOffsets& o, int64_t layer, int64_t n_inst,
                               GradientLeaves& grads) {
  Executor& e = *ex_;
  const int64_t R = n_inst * L_, d = cfg_.d_model, qd = cfg_.q_dim(), kd = cfg_.kv_dim();
  BackwardBuffers& G = bw_;
  // h = x + RMSNorm(ao): ∂x starts as ∂h (kept in dx), ∂ao [R, d] via the norm.
  instance_norm_grads(grads, n_inst, o.attn_norm, A.ao.data(), params + o.attn_norm, A.ao_rms.data(), G.dx.data(),
                      G.dao.data(), d);
  round_act(G.dao.data(), R * d);
  // ∂Wo_b [d, qd] = ∂ao_bᵀ · att_b
  instance_weight_grads(grads, n_inst, o.w_out, G.dao.data(), A.att.data(), d, qd);
  // ∂att [R, qd] = ∂ao [R, d] · Wo [d, qd]
  e.matmul_backward_input(G.dao.data(), params + o.w_out, G.datt.data(), R, d, qd, false);
  round_act(G.datt.data(), R * qd);
  // ∂q [R, qd], ∂k, ∂v [R, kd] from ∂att and the saved statistics
  attention_op_backward(A, layer, n_inst);
  // RoPE backward (∂q, ∂k rotated back in place, rounded) and the QK-norm backward, fused: ∂q_raw [R, qd],
  // ∂k_raw [R, kd] and the norm weights' leaves.
  instance_rope_norm_grads(grads, n_inst, o.q_norm, rope_of(layer), A.q_raw.data(), params + o.q_norm, A.q_rms.data(), G.dq.data(),
                           G.dq_raw.data(), cfg_.n_heads);
  round_act(G.dq_raw.data(), R * qd);
  instance_rope_norm_grads(grads, n_inst, o.k_norm, rope_of(layer), A.k_raw.data(), params + o.k_norm, A.k_rms.data(), G.dk.data(),
                           G.dk_raw.data(), cfg_.n_kv_heads);
  round_act(G.dk_raw.data(), R * kd);
  // ∂Wq_b [qd, d], ∂Wk_b, ∂Wv_b [kd, d] = ∂(q_raw, k_raw, v)_bᵀ · x_b
  instance_weight_grads(grads, n_inst, o.w_q, G.dq_raw.data(), A.x.data(), qd, d);
  instance_weight_grads(grads, n_inst, o.w_k, G.dk_raw.data(), A.x.data(), kd, d);
  instance_weight_grads(grads, n_inst, o.w_v, G.dv.data(), A.x.data(), kd, d);
  // ∂x [R, d] = ∂h + ∂q_raw·Wq + ∂k_raw·Wk + ∂v·Wv, chains continuing in that order.
  e.matmul_backward_input(G.dq_raw.data(), params + o.w_q, G.dx.data(), R, qd, d, true);
  e.matmul_backward_input(G.dk_raw.data(), params + o.w_k, G.dx.data(), R, kd, d, true);
  e.matmul_backward_input(G.dv.data(), params + o.w_v, G.dx.data(), R, kd, d, true);
  round_act(G.dx.data(), R * d);
}

}  // namespace olmoref
