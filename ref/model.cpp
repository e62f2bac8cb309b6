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

void Olmo3::forward(const float* params, const uint32_t* tokens, int64_t n_inst, ThreadPool* pool) {
  const int64_t R = n_inst * T_;
  const int64_t d = cfg_.d_model, qd = cfg_.q_dim(), kd = cfg_.kv_dim(), F = cfg_.ffn_hidden, V = cfg_.vocab_size;
  const float eps = cfg_.norm_eps;
  for (int64_t r = 0; r < R; ++r)
    if (tokens[r] >= static_cast<uint64_t>(V))
      throw std::out_of_range("token id " + std::to_string(tokens[r]) + " >= vocab_size " + std::to_string(V));
  std::vector<float> tmp(static_cast<size_t>(R * d));
  use_unit(master_, 0, pool);
  embedding_forward(params + layout_.embeddings, tokens, acts_[0].x.data(), R, d, pool);
  drop_unit(0);
  for (int64_t l = 0; l < cfg_.n_layers; ++l) {
    LayerActs& A = acts_[static_cast<size_t>(l)];
    const BlockOffsets& o = layout_.blocks[static_cast<size_t>(l)];
    use_unit(master_, static_cast<int>(l) + 1, pool);
    // Attention sublayer.
    // round_act(...) is a no-op in fp32; in bf16 it rounds the tensor just written (docs/canonical/bf16.md).
    matmul_forward(A.x.data(), params + o.w_q, A.q_raw.data(), R, qd, d, pool);
    round_act(A.q_raw.data(), R * qd, pool);
    matmul_forward(A.x.data(), params + o.w_k, A.k_raw.data(), R, kd, d, pool);
    round_act(A.k_raw.data(), R * kd, pool);
    matmul_forward(A.x.data(), params + o.w_v, A.v.data(), R, kd, d, pool);
    round_act(A.v.data(), R * kd, pool);
    rmsnorm_forward(A.q_raw.data(), params + o.q_norm, A.q.data(), A.q_rms.data(), R, qd, eps, pool);
    round_act(A.q.data(), R * qd, pool);
    rmsnorm_forward(A.k_raw.data(), params + o.k_norm, A.k.data(), A.k_rms.data(), R, kd, eps, pool);
    round_act(A.k.data(), R * kd, pool);
    rope_forward(A.q.data(), R, cfg_.n_heads, rope_, pool);
    round_act(A.q.data(), R * qd, pool);
    rope_forward(A.k.data(), R, cfg_.n_kv_heads, rope_, pool);
    round_act(A.k.data(), R * kd, pool);
    AttentionShape as{n_inst, T_, cfg_.n_heads, cfg_.n_kv_heads, cfg_.head_dim, cfg_.window(l),
                      1.0f / std::sqrt(static_cast<float>(cfg_.head_dim))};
    as.precision = precision_;
    attention_forward(as, A.q.data(), A.k.data(), A.v.data(), A.att.data(), A.att_max.data(), A.att_sum.data(), pool);
    round_act(A.att.data(), R * qd, pool);
    matmul_forward(A.att.data(), params + o.w_out, A.ao.data(), R, d, qd, pool);
    round_act(A.ao.data(), R * d, pool);
    rmsnorm_forward(A.ao.data(), params + o.attn_norm, tmp.data(), A.ao_rms.data(), R, d, eps, pool);
    round_act(tmp.data(), R * d, pool);
    for (int64_t i = 0; i < R * d; ++i) A.h[i] = A.x[i] + tmp[i];
    round_act(A.h.data(), R * d, pool);
    // Feed-forward sublayer.
    matmul_forward(A.h.data(), params + o.w1, A.g.data(), R, F, d, pool);
    round_act(A.g.data(), R * F, pool);
    matmul_forward(A.h.data(), params + o.w3, A.u.data(), R, F, d, pool);
    round_act(A.u.data(), R * F, pool);
    if (precision_ == Precision::bf16)
      swiglu_forward_bf16(A.g.data(), A.u.data(), A.a.data(), R * F, pool);
    else
      swiglu_forward(A.g.data(), A.u.data(), A.a.data(), R * F, pool);
    matmul_forward(A.a.data(), params + o.w2, A.f.data(), R, d, F, pool);
    round_act(A.f.data(), R * d, pool);
    rmsnorm_forward(A.f.data(), params + o.ffn_norm, tmp.data(), A.f_rms.data(), R, d, eps, pool);
    round_act(tmp.data(), R * d, pool);
    float* next = l + 1 < cfg_.n_layers ? acts_[static_cast<size_t>(l + 1)].x.data() : x_final_.data();
    for (int64_t i = 0; i < R * d; ++i) next[i] = A.h[i] + tmp[i];
    round_act(next, R * d, pool);
    drop_unit(static_cast<int>(l) + 1);
  }
  use_unit(master_, n_units() - 1, pool);
  rmsnorm_forward(x_final_.data(), params + layout_.final_norm, hn_.data(), final_rms_.data(), R, d, eps, pool);
  round_act(hn_.data(), R * d, pool);
  matmul_forward(hn_.data(), params + layout_.lm_head, logits_.data(), R, V, d, pool);
  round_act(logits_.data(), R * V, pool);  // bf16 logits; the loss upcasts them (`.float()`)
  drop_unit(n_units() - 1);
}

void Olmo3::gather_only_pass() {
  if (!gate_) return;
  // forward: embedding, blocks 0..L-1, head; backward: head, blocks L-1..0 (the embedding's backward reads
  // no parameter). Must match forward() and forward_backward() below.
  for (int u = 0; u < n_units(); ++u) {
    gate_->acquire(u);
    gate_->release(u);
  }
  for (int u = n_units() - 1; u >= 1; --u) {
    gate_->acquire(u);
    gate_->release(u);
  }
}

LossSums Olmo3::forward_loss(const float* params, const uint32_t* tokens, ThreadPool* pool, float* logits_out) {
  master_ = params;
  params = working_params(params, pool);
  forward(params, tokens, B_, pool);
  if (logits_out) std::memcpy(logits_out, logits_.data(), logits_.size() * sizeof(float));
  return cross_entropy_forward_backward(logits_.data(), tokens, B_, T_, cfg_.vocab_size, 1e-5f, B_ * (T_ - 1), pool);
}

LossSums Olmo3::forward_backward(const float* params, const uint32_t* tokens, int64_t global_n_targets, float* grad,
                                 ThreadPool* pool, float* logits_out) {
  GradientTree tree(B_, layout_.total, pool);
  tree.begin_microbatch(0, B_);
  std::vector<LossSums> per(static_cast<size_t>(B_));
  forward_backward(params, tokens, B_, global_n_targets, tree, per.data(), pool, logits_out);
  std::copy(tree.slot(0), tree.slot(0) + layout_.total, grad);
  std::vector<double> ce(per.size()), z(per.size());
  LossSums sums;
  for (size_t b = 0; b < per.size(); ++b) {
    ce[b] = per[b].ce;
    z[b] = per[b].z;
    sums.n_targets += per[b].n_targets;
  }
  sums.ce = tree_sum_range(ce.data(), 0, B_);
  sums.z = tree_sum_range(z.data(), 0, B_);
  return sums;
}

void Olmo3::forward_backward(const float* params, const uint32_t* tokens, int64_t n_inst, int64_t global_n_targets,
                             GradientLeaves& grads, LossSums* per_instance, ThreadPool* pool, float* logits_out) {
  if (n_inst < 1 || n_inst > B_)
    throw std::invalid_argument("forward_backward: " + std::to_string(n_inst) + " instances for a model sized for " +
                                std::to_string(B_));
  const int64_t d = cfg_.d_model, qd = cfg_.q_dim(), kd = cfg_.kv_dim(), F = cfg_.ffn_hidden, V = cfg_.vocab_size;
  const int64_t R = n_inst * T_, T = T_;
  master_ = params;
  params = working_params(params, pool);  // bf16: the bf16 copy, for forward and backward alike
  forward(params, tokens, n_inst, pool);
  if (logits_out) std::memcpy(logits_out, logits_.data(), static_cast<size_t>(R * V) * sizeof(float));
  // The loss of each instance on its own: its fp64 totals are the leaves of the loss tree.
  for (int64_t b = 0; b < n_inst; ++b)
    per_instance[b] = cross_entropy_forward_backward(logits_.data() + b * T * V, tokens + b * T, 1, T, V, 1e-5f,
                                                     global_n_targets, pool);
  // logits_ now holds dlogits [R, V] (bf16: rounded, the gradient of the bf16 logits tensor).
  round_act(logits_.data(), R * V, pool);
  // bf16: every activation gradient is rounded once it is complete and every parameter gradient leaf once
  // it is written (round_act, a no-op in fp32); chains continued across consumers round only at their end.
  std::vector<float> dx(static_cast<size_t>(R * d)), dtmp(static_cast<size_t>(R * d));
  std::vector<float> dqd(static_cast<size_t>(R * qd)), dq(static_cast<size_t>(R * qd));
  std::vector<float> dkd(static_cast<size_t>(R * kd)), dk(static_cast<size_t>(R * kd)), dv(static_cast<size_t>(R * kd));
  std::vector<float> dF1(static_cast<size_t>(R * F)), dg(static_cast<size_t>(R * F)), du(static_cast<size_t>(R * F));
  const bool bf16 = precision_ == Precision::bf16;

  // Parameter gradients: every token-axis reduction runs over one instance's T rows (docs/canonical/step.md).
  // dW[N,K] of rows dY [R, N], X [R, K], instance by instance.
  auto weight_grad = [&](int64_t offset, const float* dY, const float* X, int64_t N, int64_t K) {
    for (int64_t b = 0; b < n_inst; ++b) {
      float* leaf = grads.leaf(b, offset, N * K);
      matmul_backward_weight(dY + b * T * N, X + b * T * K, leaf, T, N, K, false, pool);
      round_act(leaf, N * K, pool);
      grads.commit(b, offset, N * K);
    }
  };
  // RMSNorm backward instance by instance: dx rows [R, n] and the norm weight's leaf per instance.
  auto norm_backward = [&](int64_t offset, const float* x, const float* w, const float* inv_rms, const float* dy,
                           float* dxo, int64_t n) {
    for (int64_t b = 0; b < n_inst; ++b) {
      float* leaf = grads.leaf(b, offset, n);
      rmsnorm_backward(x + b * T * n, w, inv_rms + b * T, dy + b * T * n, dxo + b * T * n, leaf, T, n, pool);
      round_act(leaf, n, pool);
      grads.commit(b, offset, n);
    }
  };

  // LM head and final norm.
  use_unit(master_, n_units() - 1, pool);
  weight_grad(layout_.lm_head, logits_.data(), hn_.data(), V, d);
  matmul_backward_input(logits_.data(), params + layout_.lm_head, dtmp.data(), R, V, d, false, pool);
  round_act(dtmp.data(), R * d, pool);
  norm_backward(layout_.final_norm, x_final_.data(), params + layout_.final_norm, final_rms_.data(), dtmp.data(),
                dx.data(), d);
  round_act(dx.data(), R * d, pool);
  drop_unit(n_units() - 1);
  // dx now holds ∂loss/∂(output of the last block).
  for (int64_t l = cfg_.n_layers - 1; l >= 0; --l) {
    LayerActs& A = acts_[static_cast<size_t>(l)];
    const BlockOffsets& o = layout_.blocks[static_cast<size_t>(l)];
    use_unit(master_, static_cast<int>(l) + 1, pool);  // gathered again for backward, as FSDP does
    // out = h + RMSNorm(f):  ∂h = dx (kept in dx, accumulated into below), ∂f via the norm.
    norm_backward(o.ffn_norm, A.f.data(), params + o.ffn_norm, A.f_rms.data(), dx.data(), dtmp.data(), d);
    round_act(dtmp.data(), R * d, pool);
    weight_grad(o.w2, dtmp.data(), A.a.data(), d, F);
    matmul_backward_input(dtmp.data(), params + o.w2, dF1.data(), R, d, F, false, pool);
    round_act(dF1.data(), R * F, pool);
    if (bf16)
      swiglu_backward_bf16(A.g.data(), A.u.data(), dF1.data(), dg.data(), du.data(), R * F, pool);
    else
      swiglu_backward(A.g.data(), A.u.data(), dF1.data(), dg.data(), du.data(), R * F, pool);
    weight_grad(o.w1, dg.data(), A.h.data(), F, d);
    weight_grad(o.w3, du.data(), A.h.data(), F, d);
    // ∂h = dx + dg·W1 + du·W3: the chains continue from the residual gradient (accumulate=true).
    matmul_backward_input(dg.data(), params + o.w1, dx.data(), R, F, d, true, pool);
    matmul_backward_input(du.data(), params + o.w3, dx.data(), R, F, d, true, pool);
    round_act(dx.data(), R * d, pool);
    // h = x + RMSNorm(ao).
    norm_backward(o.attn_norm, A.ao.data(), params + o.attn_norm, A.ao_rms.data(), dx.data(), dtmp.data(), d);
    round_act(dtmp.data(), R * d, pool);
    weight_grad(o.w_out, dtmp.data(), A.att.data(), d, qd);
    matmul_backward_input(dtmp.data(), params + o.w_out, dqd.data(), R, d, qd, false, pool);  // ∂att
    round_act(dqd.data(), R * qd, pool);
    AttentionShape as{n_inst, T_, cfg_.n_heads, cfg_.n_kv_heads, cfg_.head_dim, cfg_.window(l),
                      1.0f / std::sqrt(static_cast<float>(cfg_.head_dim))};
    as.precision = precision_;  // bf16: dq, dk, dv come back rounded
    attention_backward(as, A.q.data(), A.k.data(), A.v.data(), A.att.data(), A.att_max.data(), A.att_sum.data(),
                       dqd.data(), dq.data(), dkd.data(), dv.data(), pool);
    rope_backward(dq.data(), R, cfg_.n_heads, rope_, pool);
    round_act(dq.data(), R * qd, pool);
    rope_backward(dkd.data(), R, cfg_.n_kv_heads, rope_, pool);
    round_act(dkd.data(), R * kd, pool);
    norm_backward(o.q_norm, A.q_raw.data(), params + o.q_norm, A.q_rms.data(), dq.data(), dqd.data(), qd);
    round_act(dqd.data(), R * qd, pool);
    norm_backward(o.k_norm, A.k_raw.data(), params + o.k_norm, A.k_rms.data(), dkd.data(), dk.data(), kd);
    round_act(dk.data(), R * kd, pool);
    weight_grad(o.w_q, dqd.data(), A.x.data(), qd, d);
    weight_grad(o.w_k, dk.data(), A.x.data(), kd, d);
    weight_grad(o.w_v, dv.data(), A.x.data(), kd, d);
    // ∂x = ∂h + dq·Wq + dk·Wk + dv·Wv, chains continuing in that order.
    matmul_backward_input(dqd.data(), params + o.w_q, dx.data(), R, qd, d, true, pool);
    matmul_backward_input(dk.data(), params + o.w_k, dx.data(), R, kd, d, true, pool);
    matmul_backward_input(dv.data(), params + o.w_v, dx.data(), R, kd, d, true, pool);
    round_act(dx.data(), R * d, pool);
    drop_unit(static_cast<int>(l) + 1);
  }
  for (int64_t b = 0; b < n_inst; ++b) {
    float* leaf = grads.leaf(b, layout_.embeddings, V * d);
    embedding_backward(tokens + b * T, dx.data() + b * T * d, leaf, T, V, d, pool);
    round_act(leaf, V * d, pool);
    grads.commit(b, layout_.embeddings, V * d);
  }
}

}  // namespace olmoref
