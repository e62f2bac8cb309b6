#include "model/olmo3.h"

#include <cmath>
#include <cstring>
#include <stdexcept>

namespace olmoref {

std::pair<int64_t, int64_t> Olmo3::unit_range(int unit) const {
  const int64_t d = cfg_.d_model, V = cfg_.vocab_size;
  if (unit == 0) return {layout_.embeddings, layout_.embeddings + V * d};
  if (unit == n_units() - 1) return {layout_.final_norm, layout_.lm_head + V * d};
  const BlockOffsets& o = layout_.blocks[static_cast<size_t>(unit - 1)];
  return {o.w_q, o.ffn_norm + d};
}

void Olmo3::use_unit(const float* master, int unit) {
  if (!gate_) return;
  gate_->acquire(unit);
  // bf16 with a gate: the working copy is made unit by unit as units arrive (same bits: it is elementwise).
  if (precision_ == Precision::bf16) {
    const auto [a, b] = unit_range(unit);
    ex_->copy_round_bf16(master + a, params_bf16_.data() + a, b - a);
  }
}

void Olmo3::drop_unit(int unit) {
  if (gate_) gate_->release(unit);
}

const float* Olmo3::working_params(const float* params) {
  if (precision_ == Precision::fp32) return params;
  if (params_bf16_.size() != layout_.total) params_bf16_.reset(*ex_, layout_.total, "bf16 working copy of the parameters");
  if (gate_) return params_bf16_.data();  // filled per unit by use_unit
  // FSDP2 MixedPrecisionPolicy(param_dtype=bf16): every parameter, norms and embeddings included, is used
  // as a bf16 copy rounded from the fp32 master. The copy is a pure function of the master, so making it
  // per micro-batch gives the same bits as once per step.
  ex_->copy_round_bf16(params, params_bf16_.data(), layout_.total);
  return params_bf16_.data();
}

void Olmo3::round_act(float* x, int64_t n) const {
  if (precision_ == Precision::bf16) ex_->round_bf16(x, n);
}

Olmo3::Olmo3(const ModelConfig& cfg, int64_t micro_batch, int64_t seq_len, Precision precision, Executor* ex)
    : cfg_(cfg),
      precision_(precision),
      own_ex_(ex ? nullptr : std::make_unique<CpuExecutor>()),
      ex_(ex ? ex : own_ex_.get()),
      layout_(cfg),
      B_(micro_batch),
      T_(seq_len),
      R_(micro_batch * seq_len) {
  cfg_.validate();
  if (B_ <= 0 || T_ < 2) throw std::invalid_argument("micro-batch must hold >= 1 instance of >= 2 tokens");
  Executor& e = *ex_;
  const RopeTable table = make_rope_table(T_, cfg_.head_dim, cfg_.rope_theta);
  rope_cos_.reset(e, static_cast<int64_t>(table.cos.size()), "RoPE cos table");
  rope_sin_.reset(e, static_cast<int64_t>(table.sin.size()), "RoPE sin table");
  rope_cos_.upload(table.cos.data(), rope_cos_.size());
  rope_sin_.upload(table.sin.data(), rope_sin_.size());
  rope_ = {T_, cfg_.head_dim, rope_cos_.data(), rope_sin_.data()};
  const int64_t R = R_, d = cfg_.d_model, qd = cfg_.q_dim(), kd = cfg_.kv_dim(), F = cfg_.ffn_hidden;
  const int64_t stats = B_ * cfg_.n_heads * T_;
  if (!e.host_memory()) tokens_.reset(e, R, "tokens of a micro-batch");
  acts_.resize(static_cast<size_t>(cfg_.n_layers));
  for (size_t l = 0; l < acts_.size(); ++l) {
    LayerActs& a = acts_[l];
    const std::string at = " of block " + std::to_string(l);
    a.x.reset(e, R * d, "activation x" + at);
    a.q_raw.reset(e, R * qd, "activation q_raw" + at);
    a.k_raw.reset(e, R * kd, "activation k_raw" + at);
    a.q_rms.reset(e, R, "activation q_rms" + at);
    a.k_rms.reset(e, R, "activation k_rms" + at);
    a.q.reset(e, R * qd, "activation q" + at);
    a.k.reset(e, R * kd, "activation k" + at);
    a.v.reset(e, R * kd, "activation v" + at);
    a.att.reset(e, R * qd, "activation att" + at);
    a.att_max.reset(e, stats, "attention row max" + at);
    a.att_sum.reset(e, stats, "attention row sum" + at);
    a.ao.reset(e, R * d, "activation ao" + at);
    a.ao_rms.reset(e, R, "activation ao_rms" + at);
    a.h.reset(e, R * d, "activation h" + at);
    a.g.reset(e, R * F, "activation g (gate)" + at);
    a.u.reset(e, R * F, "activation u (up)" + at);
    a.a.reset(e, R * F, "activation a (SwiGLU)" + at);
    a.f.reset(e, R * d, "activation f" + at);
    a.f_rms.reset(e, R, "activation f_rms" + at);
  }
  x_final_.reset(e, R * d, "final block output");
  final_rms_.reset(e, R, "final norm statistics");
  hn_.reset(e, R * d, "final norm output");
  logits_.reset(e, R * cfg_.vocab_size, "logits [micro-batch tokens, vocabulary]");
}

int64_t olmo3_memory_bytes(const ModelConfig& cfg, int64_t B, int64_t T, Precision precision, bool kernel_scratch) {
  const int64_t R = B * T, d = cfg.d_model, qd = cfg.q_dim(), kd = cfg.kv_dim(), F = cfg.ffn_hidden;
  const int64_t V = cfg.vocab_size, stats = B * cfg.n_heads * T;
  // Per layer: x, ao, h, f [R, d]; q_raw, q, att [R, qd]; k_raw, k, v [R, kd]; g, u, a [R, F]; five row statistics.
  const int64_t per_layer = R * (4 * d + 3 * qd + 3 * kd + 3 * F + 5) + 2 * stats;
  int64_t floats = cfg.n_layers * per_layer + R * (2 * d + 1) + R * V + T * cfg.head_dim;  // + x_final, hn, logits
  floats += R * (2 * d + 2 * qd + 3 * kd + 2 * F);  // backward temporaries
  if (precision == Precision::bf16) floats += ParamLayout(cfg).total;
  if (kernel_scratch) floats += 2 * stats * T + 2 * stats * cfg.head_dim;  // attention P, dS, per-head dk/dv
  return floats * static_cast<int64_t>(sizeof(float)) + R * 24;  // + tokens and the loss's fp64 row terms
}

const uint32_t* Olmo3::begin_call(const uint32_t* host_tokens, int64_t n_inst, ThreadPool* pool) {
  if (own_ex_) own_ex_->set_pool(pool);
  const int64_t R = n_inst * T_, V = cfg_.vocab_size;
  for (int64_t r = 0; r < R; ++r)
    if (host_tokens[r] >= static_cast<uint64_t>(V))
      throw std::out_of_range("token id " + std::to_string(host_tokens[r]) + " >= vocab_size " + std::to_string(V));
  if (ex_->host_memory()) return host_tokens;
  tokens_.upload(host_tokens, R);
  return tokens_.data();
}

void Olmo3::forward(const float* params, const uint32_t* tokens, int64_t n_inst) {
  Executor& e = *ex_;
  const int64_t R = n_inst * T_;
  const int64_t d = cfg_.d_model, qd = cfg_.q_dim(), kd = cfg_.kv_dim(), F = cfg_.ffn_hidden, V = cfg_.vocab_size;
  const float eps = cfg_.norm_eps;
  const bool bf16 = precision_ == Precision::bf16;
  use_unit(master_, 0);
  e.embedding_forward(params + layout_.embeddings, tokens, acts_[0].x.data(), R, d);
  drop_unit(0);
  for (int64_t l = 0; l < cfg_.n_layers; ++l) {
    LayerActs& A = acts_[static_cast<size_t>(l)];
    const BlockOffsets& o = layout_.blocks[static_cast<size_t>(l)];
    use_unit(master_, static_cast<int>(l) + 1);
    // Attention sublayer.
    // round_act(...) is a no-op in fp32; in bf16 it rounds the tensor just written (docs/canonical/bf16.md).
    e.matmul_forward(A.x.data(), params + o.w_q, A.q_raw.data(), R, qd, d);
    round_act(A.q_raw.data(), R * qd);
    e.matmul_forward(A.x.data(), params + o.w_k, A.k_raw.data(), R, kd, d);
    round_act(A.k_raw.data(), R * kd);
    e.matmul_forward(A.x.data(), params + o.w_v, A.v.data(), R, kd, d);
    round_act(A.v.data(), R * kd);
    // QK-norm then RoPE, each result rounded in bf16 (the fused op keeps both rounding points).
    e.rmsnorm_rope_forward(A.q_raw.data(), params + o.q_norm, A.q.data(), A.q_rms.data(), R, cfg_.n_heads, rope_, eps,
                           bf16);
    e.rmsnorm_rope_forward(A.k_raw.data(), params + o.k_norm, A.k.data(), A.k_rms.data(), R, cfg_.n_kv_heads, rope_,
                           eps, bf16);
    AttentionShape as{n_inst, T_, cfg_.n_heads, cfg_.n_kv_heads, cfg_.head_dim, cfg_.window(l),
                      1.0f / std::sqrt(static_cast<float>(cfg_.head_dim))};
    as.precision = precision_;
    e.attention_forward(as, A.q.data(), A.k.data(), A.v.data(), A.att.data(), A.att_max.data(), A.att_sum.data());
    round_act(A.att.data(), R * qd);
    e.matmul_forward(A.att.data(), params + o.w_out, A.ao.data(), R, d, qd);
    round_act(A.ao.data(), R * d);
    // h = x + RMSNorm(ao), the normed value and the sum each rounded in bf16.
    e.rmsnorm_residual_forward(A.x.data(), A.ao.data(), params + o.attn_norm, A.h.data(), A.ao_rms.data(), R, d, eps,
                               bf16);
    // Feed-forward sublayer.
    e.matmul_forward(A.h.data(), params + o.w1, A.g.data(), R, F, d);
    round_act(A.g.data(), R * F);
    // u = h·W3ᵀ (bf16: rounded) and a = SwiGLU(g, u), the SwiGLU in the product's epilogue.
    e.matmul_forward_swiglu(A.h.data(), params + o.w3, A.g.data(), A.u.data(), A.a.data(), R, F, d, bf16);
    e.matmul_forward(A.a.data(), params + o.w2, A.f.data(), R, d, F);
    round_act(A.f.data(), R * d);
    float* next = l + 1 < cfg_.n_layers ? acts_[static_cast<size_t>(l + 1)].x.data() : x_final_.data();
    e.rmsnorm_residual_forward(A.h.data(), A.f.data(), params + o.ffn_norm, next, A.f_rms.data(), R, d, eps, bf16);
    drop_unit(static_cast<int>(l) + 1);
  }
  use_unit(master_, n_units() - 1);
  e.rmsnorm_forward(x_final_.data(), params + layout_.final_norm, hn_.data(), final_rms_.data(), R, d, eps);
  round_act(hn_.data(), R * d);
  e.matmul_forward(hn_.data(), params + layout_.lm_head, logits_.data(), R, V, d);
  round_act(logits_.data(), R * V);  // bf16 logits; the loss upcasts them (`.float()`)
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

// Loss totals of instances [0, n) by the instance tree (fp64).
static LossSums tree_totals(const std::vector<LossSums>& per, int64_t n) {
  std::vector<double> ce(static_cast<size_t>(n)), z(static_cast<size_t>(n));
  LossSums sums;
  for (int64_t b = 0; b < n; ++b) {
    ce[static_cast<size_t>(b)] = per[static_cast<size_t>(b)].ce;
    z[static_cast<size_t>(b)] = per[static_cast<size_t>(b)].z;
    sums.n_targets += per[static_cast<size_t>(b)].n_targets;
  }
  sums.ce = tree_sum_range(ce.data(), 0, n);
  sums.z = tree_sum_range(z.data(), 0, n);
  return sums;
}

LossSums Olmo3::forward_loss(const float* params, const uint32_t* host_tokens, ThreadPool* pool, float* logits_out) {
  const uint32_t* tokens = begin_call(host_tokens, B_, pool);
  master_ = params;
  params = working_params(params);
  forward(params, tokens, B_);
  if (logits_out) logits_.download(logits_out, logits_.size());
  per_scratch_.assign(static_cast<size_t>(B_), LossSums{});
  ex_->cross_entropy(logits_.data(), tokens, B_, T_, cfg_.vocab_size, 1e-5f, B_ * (T_ - 1), per_scratch_.data());
  return tree_totals(per_scratch_, B_);
}

LossSums Olmo3::forward_backward(const float* params, const uint32_t* tokens, int64_t global_n_targets, float* grad,
                                 ThreadPool* pool, float* logits_out) {
  if (own_ex_) own_ex_->set_pool(pool);
  GradientTree tree(B_, layout_.total, *ex_);
  tree.begin_microbatch(0, B_);
  std::vector<LossSums> per(static_cast<size_t>(B_));
  forward_backward(params, tokens, B_, global_n_targets, tree, per.data(), pool, logits_out);
  ex_->copy(grad, tree.slot(0), static_cast<size_t>(layout_.total) * sizeof(float));
  return tree_totals(per, B_);
}

void Olmo3::forward_backward(const float* params, const uint32_t* host_tokens, int64_t n_inst,
                             int64_t global_n_targets, GradientLeaves& grads, LossSums* per_instance, ThreadPool* pool,
                             float* logits_out) {
  if (n_inst < 1 || n_inst > B_)
    throw std::invalid_argument("forward_backward: " + std::to_string(n_inst) + " instances for a model sized for " +
                                std::to_string(B_));
  Executor& e = *ex_;
  const uint32_t* tokens = begin_call(host_tokens, n_inst, pool);
  const int64_t d = cfg_.d_model, qd = cfg_.q_dim(), kd = cfg_.kv_dim(), F = cfg_.ffn_hidden, V = cfg_.vocab_size;
  const int64_t R = n_inst * T_, T = T_;
  master_ = params;
  params = working_params(params);  // bf16: the bf16 copy, for forward and backward alike
  forward(params, tokens, n_inst);
  if (logits_out) logits_.download(logits_out, R * V);
  // The loss of each instance on its own: its fp64 totals are the leaves of the loss tree.
  e.cross_entropy(logits_.data(), tokens, n_inst, T, V, 1e-5f, global_n_targets, per_instance);
  // logits_ now holds dlogits [R, V] (bf16: rounded, the gradient of the bf16 logits tensor).
  round_act(logits_.data(), R * V);
  // bf16: every activation gradient is rounded once it is complete and every parameter gradient leaf once
  // it is written (round_act, a no-op in fp32); chains continued across consumers round only at their end.
  if (bw_.dx.size() == 0) {
    const int64_t Rm = R_;
    bw_.dx.reset(e, Rm * d, "gradient dx");
    bw_.dtmp.reset(e, Rm * d, "gradient dtmp");
    bw_.dqd.reset(e, Rm * qd, "gradient dq (before RoPE)");
    bw_.dq.reset(e, Rm * qd, "gradient dq");
    bw_.dkd.reset(e, Rm * kd, "gradient dk (before RoPE)");
    bw_.dk.reset(e, Rm * kd, "gradient dk");
    bw_.dv.reset(e, Rm * kd, "gradient dv");
    bw_.dg.reset(e, Rm * F, "gradient dg (gate)");
    bw_.du.reset(e, Rm * F, "gradient du (up)");
  }
  float *dx = bw_.dx.data(), *dtmp = bw_.dtmp.data(), *dqd = bw_.dqd.data(), *dq = bw_.dq.data();
  float *dkd = bw_.dkd.data(), *dk = bw_.dk.data(), *dv = bw_.dv.data();
  float *dg = bw_.dg.data(), *du = bw_.du.data();
  const bool bf16 = precision_ == Precision::bf16;

  // Parameter gradients: every token-axis reduction runs over one instance's T rows (docs/canonical/step.md).
  // dW[N,K] of rows dY [R, N], X [R, K], instance by instance.
  auto weight_grad = [&](int64_t offset, const float* dY, const float* X, int64_t N, int64_t K) {
    for (int64_t b = 0; b < n_inst; ++b) {
      float* leaf = grads.leaf(b, offset, N * K);
      e.matmul_backward_weight(dY + b * T * N, X + b * T * K, leaf, T, N, K, false);
      round_act(leaf, N * K);
      grads.commit(b, offset, N * K);
    }
  };
  // RMSNorm backward instance by instance: dx rows [R, n] and the norm weight's leaf per instance.
  auto norm_backward = [&](int64_t offset, const float* x, const float* w, const float* inv_rms, const float* dy,
                           float* dxo, int64_t n) {
    for (int64_t b = 0; b < n_inst; ++b) {
      float* leaf = grads.leaf(b, offset, n);
      e.rmsnorm_backward(x + b * T * n, w, inv_rms + b * T, dy + b * T * n, dxo + b * T * n, leaf, T, n);
      round_act(leaf, n);
      grads.commit(b, offset, n);
    }
  };
  // The same for QK-norm + RoPE over n_heads heads: dy [R, n_heads·hd] rotated back in place first.
  auto rope_norm_backward = [&](int64_t offset, const float* x, const float* w, const float* inv_rms, float* dy,
                                float* dxo, int64_t n_heads) {
    const int64_t n = n_heads * cfg_.head_dim;
    for (int64_t b = 0; b < n_inst; ++b) {
      float* leaf = grads.leaf(b, offset, n);
      e.rope_rmsnorm_backward(x + b * T * n, w, inv_rms + b * T, dy + b * T * n, dxo + b * T * n, leaf, T, n_heads,
                              rope_, bf16);
      round_act(leaf, n);
      grads.commit(b, offset, n);
    }
  };

  // LM head and final norm.
  use_unit(master_, n_units() - 1);
  weight_grad(layout_.lm_head, logits_.data(), hn_.data(), V, d);
  e.matmul_backward_input(logits_.data(), params + layout_.lm_head, dtmp, R, V, d, false);
  round_act(dtmp, R * d);
  norm_backward(layout_.final_norm, x_final_.data(), params + layout_.final_norm, final_rms_.data(), dtmp, dx, d);
  round_act(dx, R * d);
  drop_unit(n_units() - 1);
  // dx now holds ∂loss/∂(output of the last block).
  for (int64_t l = cfg_.n_layers - 1; l >= 0; --l) {
    LayerActs& A = acts_[static_cast<size_t>(l)];
    const BlockOffsets& o = layout_.blocks[static_cast<size_t>(l)];
    use_unit(master_, static_cast<int>(l) + 1);  // gathered again for backward, as FSDP does
    // out = h + RMSNorm(f):  ∂h = dx (kept in dx, accumulated into below), ∂f via the norm.
    norm_backward(o.ffn_norm, A.f.data(), params + o.ffn_norm, A.f_rms.data(), dx, dtmp, d);
    round_act(dtmp, R * d);
    weight_grad(o.w2, dtmp, A.a.data(), d, F);
    // ∂a = dtmp·W2 (bf16: rounded), then SwiGLU's backward in the product's epilogue: ∂a lives only in dg.
    e.matmul_backward_input_swiglu(dtmp, params + o.w2, A.g.data(), A.u.data(), dg, du, R, d, F, bf16);
    weight_grad(o.w1, dg, A.h.data(), F, d);
    weight_grad(o.w3, du, A.h.data(), F, d);
    // ∂h = dx + dg·W1 + du·W3: the chains continue from the residual gradient (accumulate=true).
    e.matmul_backward_input(dg, params + o.w1, dx, R, F, d, true);
    e.matmul_backward_input(du, params + o.w3, dx, R, F, d, true);
    round_act(dx, R * d);
    // h = x + RMSNorm(ao).
    norm_backward(o.attn_norm, A.ao.data(), params + o.attn_norm, A.ao_rms.data(), dx, dtmp, d);
    round_act(dtmp, R * d);
    weight_grad(o.w_out, dtmp, A.att.data(), d, qd);
    e.matmul_backward_input(dtmp, params + o.w_out, dqd, R, d, qd, false);  // ∂att
    round_act(dqd, R * qd);
    AttentionShape as{n_inst, T_, cfg_.n_heads, cfg_.n_kv_heads, cfg_.head_dim, cfg_.window(l),
                      1.0f / std::sqrt(static_cast<float>(cfg_.head_dim))};
    as.precision = precision_;  // bf16: dq, dk, dv come back rounded
    e.attention_backward(as, A.q.data(), A.k.data(), A.v.data(), A.att.data(), A.att_max.data(), A.att_sum.data(), dqd,
                         dq, dkd, dv);
    // RoPE backward (dq, dkd in place, rounded) and the QK-norm backward, fused.
    rope_norm_backward(o.q_norm, A.q_raw.data(), params + o.q_norm, A.q_rms.data(), dq, dqd, cfg_.n_heads);
    round_act(dqd, R * qd);
    rope_norm_backward(o.k_norm, A.k_raw.data(), params + o.k_norm, A.k_rms.data(), dkd, dk, cfg_.n_kv_heads);
    round_act(dk, R * kd);
    weight_grad(o.w_q, dqd, A.x.data(), qd, d);
    weight_grad(o.w_k, dk, A.x.data(), kd, d);
    weight_grad(o.w_v, dv, A.x.data(), kd, d);
    // ∂x = ∂h + dq·Wq + dk·Wk + dv·Wv, chains continuing in that order.
    e.matmul_backward_input(dqd, params + o.w_q, dx, R, qd, d, true);
    e.matmul_backward_input(dk, params + o.w_k, dx, R, kd, d, true);
    e.matmul_backward_input(dv, params + o.w_v, dx, R, kd, d, true);
    round_act(dx, R * d);
    drop_unit(static_cast<int>(l) + 1);
  }
  for (int64_t b = 0; b < n_inst; ++b) {
    float* leaf = grads.leaf(b, layout_.embeddings, V * d);
    e.embedding_backward(host_tokens + b * T, dx + b * T * d, leaf, T, V, d);
    round_act(leaf, V * d);
    grads.commit(b, layout_.embeddings, V * d);
  }
}

}  // namespace olmoref
