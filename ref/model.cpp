#include "ref/model.h"

#include <cmath>
#include <cstring>
#include <stdexcept>

#include "ref/gemm.h"
#include "ref/parallel.h"

namespace olmoref {

std::pair<int64_t, int64_t> Olmo3::unit_range(int unit) const {
  const int64_t d = cfg_.d_model, V = cfg_.vocab_size;
  if (unit == 0) return {layout_.embeddings, layout_.embeddings + V * d};
  if (unit == n_units() - 1) return {layout_.final_norm, layout_.lm_head + V * d};
  const BlockOffsets& o = layout_.blocks[static_cast<size_t>(unit - 1)];
  return {o.w_q, o.ffn_norm + d};
}

void Olmo3::use_unit(const float* master, int unit, ThreadPool* pool) {
  if (!gate_) return;
  gate_->acquire(unit);
  // bf16 with a gate: the working copy is made unit by unit as units arrive (same bits: it is elementwise).
  if (precision_ == Precision::bf16) {
    const auto [a, b] = unit_range(unit);
    copy_round_bf16(master + a, params_bf16_.data() + a, b - a, pool);
  }
}

void Olmo3::drop_unit(int unit) {
  if (gate_) gate_->release(unit);
}

const float* Olmo3::working_params(const float* params, ThreadPool* pool) {
  if (precision_ == Precision::fp32) return params;
  if (gate_) {  // filled per unit by use_unit
    params_bf16_.resize(static_cast<size_t>(layout_.total));
    return params_bf16_.data();
  }
  // FSDP2 MixedPrecisionPolicy(param_dtype=bf16): every parameter, norms and embeddings included, is used
  // as a bf16 copy rounded from the fp32 master. The copy is a pure function of the master, so making it
  // per micro-batch gives the same bits as once per step.
  params_bf16_.resize(static_cast<size_t>(layout_.total));
  copy_round_bf16(params, params_bf16_.data(), layout_.total, pool);
  return params_bf16_.data();
}

void Olmo3::round_act(float* x, int64_t n, ThreadPool* pool) const {
  if (precision_ == Precision::bf16) round_bf16_inplace(x, n, pool);
}

Olmo3::Olmo3(const ModelConfig& cfg, int64_t micro_batch, int64_t seq_len, Precision precision)
    : cfg_(cfg), precision_(precision), layout_(cfg), B_(micro_batch), T_(seq_len), R_(micro_batch * seq_len) {
  cfg_.validate();
  if (B_ <= 0 || T_ < 2) throw std::invalid_argument("micro-batch must hold >= 1 instance of >= 2 tokens");
  rope_ = make_rope_table(T_, cfg_.head_dim, cfg_.rope_theta);
  const size_t R = static_cast<size_t>(R_), d = static_cast<size_t>(cfg_.d_model);
  const size_t qd = static_cast<size_t>(cfg_.q_dim()), kd = static_cast<size_t>(cfg_.kv_dim());
  const size_t F = static_cast<size_t>(cfg_.ffn_hidden), stats = static_cast<size_t>(B_ * cfg_.n_heads * T_);
  acts_.resize(static_cast<size_t>(cfg_.n_layers));
  for (auto& a : acts_) {
    a.x.resize(R * d);
    a.q_raw.resize(R * qd);
    a.k_raw.resize(R * kd);
    a.q_rms.resize(R);
    a.k_rms.resize(R);
    a.q.resize(R * qd);
    a.k.resize(R * kd);
    a.v.resize(R * kd);
    a.att.resize(R * qd);
    a.att_max.resize(stats);
    a.att_sum.resize(stats);
    a.ao.resize(R * d);
    a.ao_rms.resize(R);
    a.h.resize(R * d);
    a.g.resize(R * F);
    a.u.resize(R * F);
    a.a.resize(R * F);
    a.f.resize(R * d);
    a.f_rms.resize(R);
  }
  x_final_.resize(R * d);
  final_rms_.resize(R);
  hn_.resize(R * d);
  logits_.resize(R * static_cast<size_t>(cfg_.vocab_size));
}

void Olmo3::forward(const float* params, const uint32_t* tokens, ThreadPool* pool) {
  const int64_t d = cfg_.d_model, qd = cfg_.q_dim(), kd = cfg_.kv_dim(), F = cfg_.ffn_hidden, V = cfg_.vocab_size;
  const float eps = cfg_.norm_eps;
  for (int64_t r = 0; r < R_; ++r)
    if (tokens[r] >= static_cast<uint64_t>(V))
      throw std::out_of_range("token id " + std::to_string(tokens[r]) + " >= vocab_size " + std::to_string(V));
  std::vector<float> tmp(static_cast<size_t>(R_ * d));
  use_unit(master_, 0, pool);
  embedding_forward(params + layout_.embeddings, tokens, acts_[0].x.data(), R_, d, pool);
  drop_unit(0);
  for (int64_t l = 0; l < cfg_.n_layers; ++l) {
    LayerActs& A = acts_[static_cast<size_t>(l)];
    const BlockOffsets& o = layout_.blocks[static_cast<size_t>(l)];
    use_unit(master_, static_cast<int>(l) + 1, pool);
    // Attention sublayer.
    // round_act(...) is a no-op in fp32; in bf16 it rounds the tensor just written (docs/canonical/bf16.md).
    matmul_forward(A.x.data(), params + o.w_q, A.q_raw.data(), R_, qd, d, pool);
    round_act(A.q_raw.data(), R_ * qd, pool);
    matmul_forward(A.x.data(), params + o.w_k, A.k_raw.data(), R_, kd, d, pool);
    round_act(A.k_raw.data(), R_ * kd, pool);
    matmul_forward(A.x.data(), params + o.w_v, A.v.data(), R_, kd, d, pool);
    round_act(A.v.data(), R_ * kd, pool);
    rmsnorm_forward(A.q_raw.data(), params + o.q_norm, A.q.data(), A.q_rms.data(), R_, qd, eps, pool);
    round_act(A.q.data(), R_ * qd, pool);
    rmsnorm_forward(A.k_raw.data(), params + o.k_norm, A.k.data(), A.k_rms.data(), R_, kd, eps, pool);
    round_act(A.k.data(), R_ * kd, pool);
    rope_forward(A.q.data(), R_, cfg_.n_heads, rope_, pool);
    round_act(A.q.data(), R_ * qd, pool);
    rope_forward(A.k.data(), R_, cfg_.n_kv_heads, rope_, pool);
    round_act(A.k.data(), R_ * kd, pool);
    AttentionShape as{B_, T_, cfg_.n_heads, cfg_.n_kv_heads, cfg_.head_dim, cfg_.window(l),
                      1.0f / std::sqrt(static_cast<float>(cfg_.head_dim))};
    as.precision = precision_;
    attention_forward(as, A.q.data(), A.k.data(), A.v.data(), A.att.data(), A.att_max.data(), A.att_sum.data(), pool);
    round_act(A.att.data(), R_ * qd, pool);
    matmul_forward(A.att.data(), params + o.w_out, A.ao.data(), R_, d, qd, pool);
    round_act(A.ao.data(), R_ * d, pool);
    rmsnorm_forward(A.ao.data(), params + o.attn_norm, tmp.data(), A.ao_rms.data(), R_, d, eps, pool);
    round_act(tmp.data(), R_ * d, pool);
    for (int64_t i = 0; i < R_ * d; ++i) A.h[i] = A.x[i] + tmp[i];
    round_act(A.h.data(), R_ * d, pool);
    // Feed-forward sublayer.
    matmul_forward(A.h.data(), params + o.w1, A.g.data(), R_, F, d, pool);
    round_act(A.g.data(), R_ * F, pool);
    matmul_forward(A.h.data(), params + o.w3, A.u.data(), R_, F, d, pool);
    round_act(A.u.data(), R_ * F, pool);
    if (precision_ == Precision::bf16)
      swiglu_forward_bf16(A.g.data(), A.u.data(), A.a.data(), R_ * F, pool);
    else
      swiglu_forward(A.g.data(), A.u.data(), A.a.data(), R_ * F, pool);
    matmul_forward(A.a.data(), params + o.w2, A.f.data(), R_, d, F, pool);
    round_act(A.f.data(), R_ * d, pool);
    rmsnorm_forward(A.f.data(), params + o.ffn_norm, tmp.data(), A.f_rms.data(), R_, d, eps, pool);
    round_act(tmp.data(), R_ * d, pool);
    float* next = l + 1 < cfg_.n_layers ? acts_[static_cast<size_t>(l + 1)].x.data() : x_final_.data();
    for (int64_t i = 0; i < R_ * d; ++i) next[i] = A.h[i] + tmp[i];
    round_act(next, R_ * d, pool);
    drop_unit(static_cast<int>(l) + 1);
  }
  use_unit(master_, n_units() - 1, pool);
  rmsnorm_forward(x_final_.data(), params + layout_.final_norm, hn_.data(), final_rms_.data(), R_, d, eps, pool);
  round_act(hn_.data(), R_ * d, pool);
  matmul_forward(hn_.data(), params + layout_.lm_head, logits_.data(), R_, V, d, pool);
  round_act(logits_.data(), R_ * V, pool);  // bf16 logits; the loss upcasts them (`.float()`)
  drop_unit(n_units() - 1);
}

LossSums Olmo3::forward_loss(const float* params, const uint32_t* tokens, ThreadPool* pool, float* logits_out) {
  master_ = params;
  params = working_params(params, pool);
  forward(params, tokens, pool);
  if (logits_out) std::memcpy(logits_out, logits_.data(), logits_.size() * sizeof(float));
  return cross_entropy_forward_backward(logits_.data(), tokens, B_, T_, cfg_.vocab_size, 1e-5f, B_ * (T_ - 1), pool);
}

LossSums Olmo3::forward_backward(const float* params, const uint32_t* tokens, int64_t global_n_targets, float* grad,
                                 ThreadPool* pool, float* logits_out) {
  const int64_t d = cfg_.d_model, qd = cfg_.q_dim(), kd = cfg_.kv_dim(), F = cfg_.ffn_hidden, V = cfg_.vocab_size;
  master_ = params;
  params = working_params(params, pool);  // bf16: the bf16 copy, for forward and backward alike
  forward(params, tokens, pool);
  if (logits_out) std::memcpy(logits_out, logits_.data(), logits_.size() * sizeof(float));
  const LossSums sums =
      cross_entropy_forward_backward(logits_.data(), tokens, B_, T_, V, 1e-5f, global_n_targets, pool);
  // logits_ now holds dlogits [R, V] (bf16: rounded, the gradient of the bf16 logits tensor).
  round_act(logits_.data(), R_ * V, pool);
  // bf16: every activation gradient is rounded once it is complete and every parameter gradient once it is
  // written (round_act, a no-op in fp32); chains continued across consumers round only at their end.
  std::vector<float> dx(static_cast<size_t>(R_ * d)), dtmp(static_cast<size_t>(R_ * d));
  std::vector<float> dqd(static_cast<size_t>(R_ * qd)), dq(static_cast<size_t>(R_ * qd));
  std::vector<float> dkd(static_cast<size_t>(R_ * kd)), dk(static_cast<size_t>(R_ * kd)), dv(static_cast<size_t>(R_ * kd));
  std::vector<float> dF1(static_cast<size_t>(R_ * F)), dg(static_cast<size_t>(R_ * F)), du(static_cast<size_t>(R_ * F));
  const bool bf16 = precision_ == Precision::bf16;

  // LM head and final norm.
  use_unit(master_, n_units() - 1, pool);
  matmul_backward_weight(logits_.data(), hn_.data(), grad + layout_.lm_head, R_, V, d, false, pool);
  round_act(grad + layout_.lm_head, V * d, pool);
  matmul_backward_input(logits_.data(), params + layout_.lm_head, dtmp.data(), R_, V, d, false, pool);
  round_act(dtmp.data(), R_ * d, pool);
  rmsnorm_backward(x_final_.data(), params + layout_.final_norm, final_rms_.data(), dtmp.data(), dx.data(),
                   grad + layout_.final_norm, R_, d, pool);
  round_act(dx.data(), R_ * d, pool);
  round_act(grad + layout_.final_norm, d, pool);
  drop_unit(n_units() - 1);
  // dx now holds ∂loss/∂(output of the last block).
  for (int64_t l = cfg_.n_layers - 1; l >= 0; --l) {
    LayerActs& A = acts_[static_cast<size_t>(l)];
    const BlockOffsets& o = layout_.blocks[static_cast<size_t>(l)];
    use_unit(master_, static_cast<int>(l) + 1, pool);  // gathered again for backward, as FSDP does
    // out = h + RMSNorm(f):  ∂h = dx (kept in dx, accumulated into below), ∂f via the norm.
    rmsnorm_backward(A.f.data(), params + o.ffn_norm, A.f_rms.data(), dx.data(), dtmp.data(), grad + o.ffn_norm,
                     R_, d, pool);
    round_act(dtmp.data(), R_ * d, pool);
    round_act(grad + o.ffn_norm, d, pool);
    matmul_backward_weight(dtmp.data(), A.a.data(), grad + o.w2, R_, d, F, false, pool);
    round_act(grad + o.w2, d * F, pool);
    matmul_backward_input(dtmp.data(), params + o.w2, dF1.data(), R_, d, F, false, pool);
    round_act(dF1.data(), R_ * F, pool);
    if (bf16)
      swiglu_backward_bf16(A.g.data(), A.u.data(), dF1.data(), dg.data(), du.data(), R_ * F, pool);
    else
      swiglu_backward(A.g.data(), A.u.data(), dF1.data(), dg.data(), du.data(), R_ * F, pool);
    matmul_backward_weight(dg.data(), A.h.data(), grad + o.w1, R_, F, d, false, pool);
    round_act(grad + o.w1, F * d, pool);
    matmul_backward_weight(du.data(), A.h.data(), grad + o.w3, R_, F, d, false, pool);
    round_act(grad + o.w3, F * d, pool);
    // ∂h = dx + dg·W1 + du·W3: the chains continue from the residual gradient (accumulate=true).
    matmul_backward_input(dg.data(), params + o.w1, dx.data(), R_, F, d, true, pool);
    matmul_backward_input(du.data(), params + o.w3, dx.data(), R_, F, d, true, pool);
    round_act(dx.data(), R_ * d, pool);
    // h = x + RMSNorm(ao).
    rmsnorm_backward(A.ao.data(), params + o.attn_norm, A.ao_rms.data(), dx.data(), dtmp.data(), grad + o.attn_norm,
                     R_, d, pool);
    round_act(dtmp.data(), R_ * d, pool);
    round_act(grad + o.attn_norm, d, pool);
    matmul_backward_weight(dtmp.data(), A.att.data(), grad + o.w_out, R_, d, qd, false, pool);
    round_act(grad + o.w_out, d * qd, pool);
    matmul_backward_input(dtmp.data(), params + o.w_out, dqd.data(), R_, d, qd, false, pool);  // ∂att
    round_act(dqd.data(), R_ * qd, pool);
    AttentionShape as{B_, T_, cfg_.n_heads, cfg_.n_kv_heads, cfg_.head_dim, cfg_.window(l),
                      1.0f / std::sqrt(static_cast<float>(cfg_.head_dim))};
    as.precision = precision_;  // bf16: dq, dk, dv come back rounded
    attention_backward(as, A.q.data(), A.k.data(), A.v.data(), A.att.data(), A.att_max.data(), A.att_sum.data(),
                       dqd.data(), dq.data(), dkd.data(), dv.data(), pool);
    rope_backward(dq.data(), R_, cfg_.n_heads, rope_, pool);
    round_act(dq.data(), R_ * qd, pool);
    rope_backward(dkd.data(), R_, cfg_.n_kv_heads, rope_, pool);
    round_act(dkd.data(), R_ * kd, pool);
    rmsnorm_backward(A.q_raw.data(), params + o.q_norm, A.q_rms.data(), dq.data(), dqd.data(), grad + o.q_norm, R_,
                     qd, pool);
    round_act(dqd.data(), R_ * qd, pool);
    round_act(grad + o.q_norm, qd, pool);
    rmsnorm_backward(A.k_raw.data(), params + o.k_norm, A.k_rms.data(), dkd.data(), dk.data(), grad + o.k_norm, R_,
                     kd, pool);
    round_act(dk.data(), R_ * kd, pool);
    round_act(grad + o.k_norm, kd, pool);
    matmul_backward_weight(dqd.data(), A.x.data(), grad + o.w_q, R_, qd, d, false, pool);
    round_act(grad + o.w_q, qd * d, pool);
    matmul_backward_weight(dk.data(), A.x.data(), grad + o.w_k, R_, kd, d, false, pool);
    round_act(grad + o.w_k, kd * d, pool);
    matmul_backward_weight(dv.data(), A.x.data(), grad + o.w_v, R_, kd, d, false, pool);
    round_act(grad + o.w_v, kd * d, pool);
    // ∂x = ∂h + dq·Wq + dk·Wk + dv·Wv, chains continuing in that order.
    matmul_backward_input(dqd.data(), params + o.w_q, dx.data(), R_, qd, d, true, pool);
    matmul_backward_input(dk.data(), params + o.w_k, dx.data(), R_, kd, d, true, pool);
    matmul_backward_input(dv.data(), params + o.w_v, dx.data(), R_, kd, d, true, pool);
    round_act(dx.data(), R_ * d, pool);
    drop_unit(static_cast<int>(l) + 1);
  }
  embedding_backward(tokens, dx.data(), grad + layout_.embeddings, R_, V, d, pool);
  round_act(grad + layout_.embeddings, V * d, pool);
  return sums;
}

}  // namespace olmoref
