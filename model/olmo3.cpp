#include "model/olmo3.h"

#include <algorithm>
#include <tuple>

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

std::vector<std::pair<int64_t, int64_t>> Olmo3::unit_reads(int unit, int ep_size, int ep_index) const {
  const auto [a, b] = unit_range(unit);
  if (ep_size <= 1 || !cfg_.moe.enabled() || unit == 0 || unit == n_units() - 1) return {{a, b}};
  const BlockOffsets& o = layout_.blocks[static_cast<size_t>(unit - 1)];
  const int64_t per = cfg_.moe.hidden * cfg_.d_model, E = cfg_.moe.n_experts;
  const auto [first, last] = moe::ep_experts(E, ep_size, ep_index);
  // The other experts' rows of w1, w2, w3 [E·h, d] are cut out of the unit.
  std::vector<std::pair<int64_t, int64_t>> cuts;
  for (const int64_t w : {o.moe_w1, o.moe_w2, o.moe_w3}) cuts.push_back({w, w + first * per}), cuts.push_back({w + last * per, w + E * per});
  std::sort(cuts.begin(), cuts.end());
  std::vector<std::pair<int64_t, int64_t>> out;
  int64_t at = a;
  for (const auto& [c0, c1] : cuts) {
    if (c0 > at) out.push_back({at, c0});
    at = std::max(at, c1);
  }
  if (at < b) out.push_back({at, b});
  return out;
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
  if (cfg_.moe.enabled() && precision_ != Precision::fp32)
    throw std::invalid_argument("config key 'train.precision': mixture-of-experts models train in fp32 only so far "
                                "(bf16 MoE is not implemented yet); set train.precision=\"fp32\"");
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
    if (!cfg_.moe.enabled()) {
      a.g.reset(e, R * F, "activation g (gate)" + at);
      a.u.reset(e, R * F, "activation u (up)" + at);
      a.a.reset(e, R * F, "activation a (SwiGLU)" + at);
    } else {
      const int64_t E = cfg_.moe.n_experts, S = R * cfg_.moe.top_k, h = cfg_.moe.hidden, Fs = cfg_.moe.shared_hidden;
      a.router_logits.reset(e, R * E, "router logits" + at);
      a.xg.reset(e, S * d, "dispatched expert inputs" + at);
      a.eg.reset(e, S * h, "expert gate" + at);
      a.eu.reset(e, S * h, "expert up" + at);
      a.ea.reset(e, S * h, "expert SwiGLU" + at);
      a.ey.reset(e, S * d, "expert outputs" + at);
      if (Fs > 0) {
        a.sg.reset(e, R * Fs, "shared expert gate" + at);
        a.su.reset(e, R * Fs, "shared expert up" + at);
        a.sa.reset(e, R * Fs, "shared expert SwiGLU" + at);
        a.sy.reset(e, R * d, "shared expert output" + at);
      }
    }
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
  int64_t ffn = 3 * R * F, ffn_bw = 2 * R * F;
  if (cfg.moe.enabled()) {
    // Router logits [R, E]; dispatched inputs and outputs [S, d]; the experts' g, u, a [S, h]; the shared expert's
    // g, u, a [R, Fs] and output [R, d]; backward: ∂logits, ∂y, ∂xg, ∂a, ∂g, ∂u and the shared expert's.
    const int64_t E = cfg.moe.n_experts, S = R * cfg.moe.top_k, h = cfg.moe.hidden, Fs = cfg.moe.shared_hidden;
    ffn = R * E + 2 * S * d + 3 * S * h + (Fs > 0 ? 3 * R * Fs + R * d : 0);
    ffn_bw = R * E + 2 * S * d + 3 * S * h + (Fs > 0 ? R * d + 2 * R * Fs : 0);
  }
  const int64_t per_layer = R * (4 * d + 3 * qd + 3 * kd + 5) + ffn + 2 * stats;
  int64_t floats = cfg.n_layers * per_layer + R * (2 * d + 1) + R * V + T * cfg.head_dim;  // + x_final, hn, logits
  floats += R * (2 * d + 2 * qd + 3 * kd) + ffn_bw;  // backward temporaries
  if (precision == Precision::bf16) floats += ParamLayout(cfg).total;
  if (kernel_scratch) floats += 2 * stats * T + 2 * stats * cfg.head_dim;  // attention P, dS, per-head dk/dv
  return floats * static_cast<int64_t>(sizeof(float)) + R * 24;  // + tokens and the loss's fp64 row terms
}

const uint32_t* Olmo3::begin_call(const uint32_t* host_tokens, int64_t n_inst, ThreadPool* pool) {
  if (own_ex_) own_ex_->set_pool(pool);
  pool_ = pool;
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
  if (cfg_.moe.enabled()) moe_inst_.assign(static_cast<size_t>(n_inst), MoEInstance{});
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
    if (cfg_.moe.enabled()) {
      moe_forward(params, A, o, n_inst);
    } else {
      e.matmul_forward(A.h.data(), params + o.w1, A.g.data(), R, F, d);
      round_act(A.g.data(), R * F);
      // u = h·W3ᵀ (bf16: rounded) and a = SwiGLU(g, u), the SwiGLU in the product's epilogue.
      e.matmul_forward_swiglu(A.h.data(), params + o.w3, A.g.data(), A.u.data(), A.a.data(), R, F, d, bf16);
      e.matmul_forward(A.a.data(), params + o.w2, A.f.data(), R, d, F);
      round_act(A.f.data(), R * d);
    }
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

void Olmo3::idle_pass(const float* params) {
  const bool ep = ep_ != nullptr && cfg_.moe.enabled();
  if (!gate_ && !ep) return;
  ep_now_ = ep ? ep_ : nullptr;
  auto unit = [&](int u, auto&& body) {
    if (gate_) gate_->acquire(u);
    body();
    if (gate_) gate_->release(u);
  };
  // forward: embedding, blocks 0..L-1, head; backward: head, blocks L-1..0 (the embedding's backward reads
  // no parameter). Must match forward() and forward_backward() below, collective for collective.
  const int head = n_units() - 1;
  unit(0, [] {});
  for (int64_t l = 0; l < cfg_.n_layers; ++l)
    unit(static_cast<int>(l) + 1, [&] {
      if (ep) ep_forward(params, layout_.blocks[static_cast<size_t>(l)], l, nullptr, nullptr, nullptr, nullptr);
    });
  unit(head, [] {});
  unit(head, [] {});
  for (int64_t l = cfg_.n_layers - 1; l >= 0; --l)
    unit(static_cast<int>(l) + 1, [&] {
      if (ep) ep_backward(params, layout_.blocks[static_cast<size_t>(l)], l, nullptr, nullptr, nullptr, nullptr, nullptr);
    });
  ep_now_ = nullptr;
}

void Olmo3::set_expert_exchange(ExpertExchange* ep) {
  if (ep && !cfg_.moe.enabled())
    throw std::invalid_argument("expert parallelism needs a mixture-of-experts model (model.moe_experts > 0)");
  if (ep && ep->size() > cfg_.moe.n_experts)
    throw std::invalid_argument("expert parallelism over " + std::to_string(ep->size()) + " ranks but model.moe_experts = " +
                                std::to_string(cfg_.moe.n_experts) + ": every rank of an EP group must own an expert");
  if (ep && precision_ != Precision::fp32) throw std::invalid_argument("expert parallelism is fp32 only (as MoE)");
  ep_ = ep;
  owned_.clear();
  if (ep) owned_.resize(static_cast<size_t>(cfg_.n_layers));
}

// Loss totals of instances [0, n) by the instance tree (fp64).
static LossSums tree_totals(const std::vector<LossSums>& per, int64_t n) {
  std::vector<double> ce(static_cast<size_t>(n)), z(static_cast<size_t>(n)), lb(static_cast<size_t>(n)),
      rz(static_cast<size_t>(n));
  LossSums sums;
  for (int64_t b = 0; b < n; ++b) {
    const LossSums& p = per[static_cast<size_t>(b)];
    ce[static_cast<size_t>(b)] = p.ce, z[static_cast<size_t>(b)] = p.z;
    lb[static_cast<size_t>(b)] = p.moe_lb, rz[static_cast<size_t>(b)] = p.moe_z;
    sums.n_targets += p.n_targets;
  }
  sums.ce = tree_sum_range(ce.data(), 0, n);
  sums.z = tree_sum_range(z.data(), 0, n);
  sums.moe_lb = tree_sum_range(lb.data(), 0, n);
  sums.moe_z = tree_sum_range(rz.data(), 0, n);
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
  for (size_t b = 0; b < moe_inst_.size() && cfg_.moe.enabled(); ++b)
    per_scratch_[b].moe_lb = moe_inst_[b].lb, per_scratch_[b].moe_z = moe_inst_[b].z;
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
  // Expert parallelism applies to this call only (forward_loss runs every expert here).
  struct EpScope {
    ExpertExchange*& now;
    ~EpScope() { now = nullptr; }
  } ep_scope{ep_now_};
  ep_now_ = cfg_.moe.enabled() ? ep_ : nullptr;
  forward(params, tokens, n_inst);
  if (logits_out) logits_.download(logits_out, R * V);
  // The loss of each instance on its own: its fp64 totals are the leaves of the loss tree.
  e.cross_entropy(logits_.data(), tokens, n_inst, T, V, 1e-5f, global_n_targets, per_instance);
  for (size_t b = 0; b < moe_inst_.size() && cfg_.moe.enabled(); ++b)
    per_instance[b].moe_lb = moe_inst_[b].lb, per_instance[b].moe_z = moe_inst_[b].z;
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
    if (!cfg_.moe.enabled()) {
      bw_.dg.reset(e, Rm * F, "gradient dg (gate)");
      bw_.du.reset(e, Rm * F, "gradient du (up)");
    } else {
      const int64_t E = cfg_.moe.n_experts, S = Rm * cfg_.moe.top_k, h = cfg_.moe.hidden, Fs = cfg_.moe.shared_hidden;
      bw_.dlogits.reset(e, Rm * E, "gradient of the router logits");
      bw_.dy.reset(e, S * d, "gradient of the expert outputs");
      bw_.dxg.reset(e, S * d, "gradient of the dispatched expert inputs");
      bw_.da.reset(e, S * h, "gradient of the expert SwiGLU");
      bw_.deg.reset(e, S * h, "gradient of the expert gate");
      bw_.deu.reset(e, S * h, "gradient of the expert up");
      if (Fs > 0) {
        bw_.dsy.reset(e, Rm * d, "gradient of the shared expert output");
        bw_.dsg.reset(e, Rm * Fs, "gradient of the shared expert gate");
        bw_.dsu.reset(e, Rm * Fs, "gradient of the shared expert up");
      }
    }
  }
  float *dx = bw_.dx.data(), *dtmp = bw_.dtmp.data(), *dqd = bw_.dqd.data(), *dq = bw_.dq.data();
  float *dkd = bw_.dkd.data(), *dk = bw_.dk.data(), *dv = bw_.dv.data();
  float *dg = bw_.dg.data(), *du = bw_.du.data();
  const bool bf16 = precision_ == Precision::bf16;

  // Parameter gradients: every token-axis reduction runs over one instance's T rows (docs/canonical/step.md).
  // dW[N,K] of rows dY [R, N], X [R, K], instance by instance.
  auto weight_grad = [&](int64_t offset, const float* dY, const float* X, int64_t N, int64_t K) {
    instance_weight_grads(grads, n_inst, offset, dY, X, N, K);
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
    if (cfg_.moe.enabled()) {
      moe_backward(params, A, o, n_inst, global_n_targets, grads, dtmp, dx);
    } else {
      weight_grad(o.w2, dtmp, A.a.data(), d, F);
      // ∂a = dtmp·W2 (bf16: rounded), then SwiGLU's backward in the product's epilogue: ∂a lives only in dg.
      e.matmul_backward_input_swiglu(dtmp, params + o.w2, A.g.data(), A.u.data(), dg, du, R, d, F, bf16);
      weight_grad(o.w1, dg, A.h.data(), F, d);
      weight_grad(o.w3, du, A.h.data(), F, d);
      // ∂h = dx + dg·W1 + du·W3: the chains continue from the residual gradient (accumulate=true).
      e.matmul_backward_input(dg, params + o.w1, dx, R, F, d, true);
      e.matmul_backward_input(du, params + o.w3, dx, R, F, d, true);
    }
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

// One weight's gradient leaf per instance: dW_b [N, K] = dY_bᵀ·X_b over the instance's T rows (dY [R, N],
// X [R, K]), rounded to bf16 under that recipe, then committed to the instance tree.
void Olmo3::instance_weight_grads(GradientLeaves& grads, int64_t n_inst, int64_t offset, const float* dY, const float* X,
                                  int64_t N, int64_t K) {
  for (int64_t b = 0; b < n_inst; ++b) {
    float* leaf = grads.leaf(b, offset, N * K);
    ex_->matmul_backward_weight(dY + b * T_ * N, X + b * T_ * K, leaf, T_, N, K, false);
    round_act(leaf, N * K);
    grads.commit(b, offset, N * K);
  }
}

// ---- Mixture of experts (docs/canonical/moe.md) ----

const float* Olmo3::host_read(const float* src, int64_t n, std::vector<float>& scratch) const {
  if (ex_->host_memory()) return src;
  scratch.resize(static_cast<size_t>(n));
  ex_->to_host(scratch.data(), src, static_cast<size_t>(n) * sizeof(float));
  return scratch.data();
}

void Olmo3::host_write(float* dst, const float* host, int64_t n) const {
  if (host != dst) ex_->to_device(dst, host, static_cast<size_t>(n) * sizeof(float));
}

// OLMo-core: lb_loss_weight (÷ n_layers when scaled) times load_balancing_loss's E/k; the z weight likewise.
double Olmo3::moe_lb_coef() const {
  const MoEConfig& m = cfg_.moe;
  const double w = m.scale_loss_by_num_layers ? m.lb_loss_weight / static_cast<double>(cfg_.n_layers) : m.lb_loss_weight;
  return w * static_cast<double>(m.n_experts) / static_cast<double>(m.top_k);
}

double Olmo3::moe_z_coef() const {
  const MoEConfig& m = cfg_.moe;
  return m.scale_loss_by_num_layers ? m.z_loss_weight / static_cast<double>(cfg_.n_layers) : m.z_loss_weight;
}

void Olmo3::set_debug_unordered_combine(bool on) {
  if (on && !cfg_.moe.enabled())
    throw std::invalid_argument("--debug-moe-unordered-combine needs a mixture-of-experts model (model.moe_experts > 0)");
  debug_unordered_combine_ = on;
}

std::vector<int64_t> Olmo3::take_expert_load() {
  std::vector<int64_t> out = std::move(expert_load_);
  expert_load_.assign(static_cast<size_t>(cfg_.n_layers * cfg_.moe.n_experts), 0);
  if (out.empty()) out.assign(expert_load_.size(), 0);
  return out;
}

void Olmo3::moe_forward(const float* params, LayerActs& A, const BlockOffsets& o, int64_t n_inst) {
  Executor& e = *ex_;
  const MoEConfig& m = cfg_.moe;
  const int64_t R = n_inst * T_, d = cfg_.d_model, E = m.n_experts, k = m.top_k, h = m.hidden, Fs = m.shared_hidden;
  const int64_t layer = &A - acts_.data();
  // Router: logits [R, E] = h·Wrᵀ on the executor, then softmax and top-k on the host.
  e.matmul_forward(A.h.data(), params + o.moe_router, A.router_logits.data(), R, E, d);
  const float* logits = host_read(A.router_logits.data(), R * E, hs_a_);
  A.scores.resize(static_cast<size_t>(R * E));
  A.lse.resize(static_cast<size_t>(R));
  A.top.resize(static_cast<size_t>(R * k));
  A.weight.resize(static_cast<size_t>(R * k));
  moe::route(logits, R, E, k, A.scores.data(), A.lse.data(), A.top.data(), A.weight.data(), pool_,
             m.normalize_expert_weights);
  A.plan = moe::make_plan(A.top.data(), R, k, E);
  if (expert_load_.size() != static_cast<size_t>(cfg_.n_layers * E))
    expert_load_.assign(static_cast<size_t>(cfg_.n_layers * E), 0);
  for (int64_t x = 0; x < E; ++x) expert_load_[static_cast<size_t>(layer * E + x)] += A.plan.count(x);

  // Auxiliary losses and the routing digest, per instance (docs/canonical/moe.md "Auxiliary losses").
  const double lb_coef = moe_lb_coef(), z_coef = moe_z_coef();
  const std::vector<int64_t> mb_counts =
      m.lb_granularity == MoELbGranularity::local_batch ? moe::counts(A.top.data(), 0, R, k, E) : std::vector<int64_t>{};
  for (int64_t b = 0; b < n_inst; ++b) {
    MoEInstance& mi = moe_inst_[static_cast<size_t>(b)];
    const int64_t r0 = b * T_, r1 = r0 + T_;
    if (m.lb_loss_weight > 0) {
      if (m.lb_granularity == MoELbGranularity::instance)
        mi.lb += moe::lb_value(A.scores.data(), r0, r1, E, moe::counts(A.top.data(), r0, r1, k, E), T_, lb_coef);
      else
        mi.lb += moe::lb_value(A.scores.data(), r0, r1, E, mb_counts, R, lb_coef);
    }
    if (m.z_loss_weight > 0) mi.z += moe::z_value(A.lse.data(), r0, r1, z_coef);
    mi.routing = moe::routing_digest(A.top.data() + r0 * k, T_, k, mi.routing ^ static_cast<uint64_t>(layer));
  }

  // Dispatch h's rows in (expert, row) order, then each expert's SwiGLU over its contiguous rows.
  const float* hrow = host_read(A.h.data(), R * d, hs_b_);
  {
    float* xg = e.host_memory() ? A.xg.data() : (hs_c_.resize(static_cast<size_t>(R * k * d)), hs_c_.data());
    moe::gather(hrow, A.plan, d, xg, pool_);
    host_write(A.xg.data(), xg, R * k * d);
    if (ep_now_) {  // the experts run on their owners; ey and ea come back in plan order
      std::vector<float> ey_host, ea_host;
      float* ey = e.host_memory() ? A.ey.data() : (ey_host.resize(static_cast<size_t>(R * k * d)), ey_host.data());
      float* ea = e.host_memory() ? A.ea.data() : (ea_host.resize(static_cast<size_t>(R * k * h)), ea_host.data());
      ep_forward(params, o, layer, &A.plan, xg, ey, ea);
      host_write(A.ey.data(), ey, R * k * d);
      host_write(A.ea.data(), ea, R * k * h);
    }
  }
  for (int64_t x = 0; x < E && !ep_now_; ++x) {
    const int64_t n = A.plan.count(x), p0 = A.plan.expert_begin[static_cast<size_t>(x)];
    if (n == 0) continue;
    const float* X = A.xg.data() + p0 * d;
    // Expert x: g = X·W1ₓᵀ, u = X·W3ₓᵀ with a = SwiGLU(g, u) in its epilogue, y = a·W2ₓ (W2ₓ is [h, d]: [in, out]).
    e.matmul_forward(X, params + o.moe_w1 + x * h * d, A.eg.data() + p0 * h, n, h, d);
    e.matmul_forward_swiglu(X, params + o.moe_w3 + x * h * d, A.eg.data() + p0 * h, A.eu.data() + p0 * h,
                            A.ea.data() + p0 * h, n, h, d, false);
    e.matmul_backward_input(A.ea.data() + p0 * h, params + o.moe_w2 + x * h * d, A.ey.data() + p0 * d, n, h, d, false);
  }
  // Combine the k choices of every row in rank order; with a shared expert, mix the two as OLMo-core does.
  const float* ey = host_read(A.ey.data(), R * k * d, hs_c_);
  float* f = e.host_memory() ? A.f.data() : (hs_d_.resize(static_cast<size_t>(R * d)), hs_d_.data());
  if (debug_unordered_combine_)
    moe::combine_unordered_for_test(ey, A.weight.data(), A.plan, d, f);
  else
    moe::combine(ey, A.weight.data(), A.plan, d, f, pool_);
  if (Fs > 0) {
    e.matmul_forward(A.h.data(), params + o.shared_w1, A.sg.data(), R, Fs, d);
    e.matmul_forward_swiglu(A.h.data(), params + o.shared_w3, A.sg.data(), A.su.data(), A.sa.data(), R, Fs, d, false);
    e.matmul_forward(A.sa.data(), params + o.shared_w2, A.sy.data(), R, d, Fs);
    const float* sy = host_read(A.sy.data(), R * d, hs_b_);
    moe::shared_combine(sy, f, k, f, R * d, pool_);
  }
  host_write(A.f.data(), f, R * d);
}

void Olmo3::moe_backward(const float* params, LayerActs& A, const BlockOffsets& o, int64_t n_inst,
                         int64_t global_n_targets, GradientLeaves& grads, const float* dtmp, float* dx) {
  Executor& e = *ex_;
  const MoEConfig& m = cfg_.moe;
  const int64_t R = n_inst * T_, d = cfg_.d_model, E = m.n_experts, k = m.top_k, h = m.hidden, Fs = m.shared_hidden;
  const moe::Plan& plan = A.plan;
  const int64_t T = T_;
  auto weight_grad = [&](int64_t offset, const float* dY, const float* X, int64_t N, int64_t K) {
    instance_weight_grads(grads, n_inst, offset, dY, X, N, K);
  };
  // ∂f splits into the shared expert's and the routed part.
  const float* dout = host_read(dtmp, R * d, hs_a_);
  std::vector<float> drouted_store;
  const float* drouted = dout;
  if (Fs > 0) {
    drouted_store.resize(static_cast<size_t>(R * d));
    float* dsy = e.host_memory() ? bw_.dsy.data() : (hs_b_.resize(static_cast<size_t>(R * d)), hs_b_.data());
    moe::shared_combine_backward(dout, k, dsy, drouted_store.data(), R * d, pool_);
    host_write(bw_.dsy.data(), dsy, R * d);
    drouted = drouted_store.data();
    weight_grad(o.shared_w2, bw_.dsy.data(), A.sa.data(), d, Fs);
    e.matmul_backward_input_swiglu(bw_.dsy.data(), params + o.shared_w2, A.sg.data(), A.su.data(), bw_.dsg.data(),
                                   bw_.dsu.data(), R, d, Fs, false);
    weight_grad(o.shared_w1, bw_.dsg.data(), A.h.data(), Fs, d);
    weight_grad(o.shared_w3, bw_.dsu.data(), A.h.data(), Fs, d);
    e.matmul_backward_input(bw_.dsg.data(), params + o.shared_w1, dx, R, Fs, d, true);
    e.matmul_backward_input(bw_.dsu.data(), params + o.shared_w3, dx, R, Fs, d, true);
  }
  // Combine backward: ∂y per slot and ∂weight per choice.
  std::vector<float> dweight(static_cast<size_t>(R * k));
  {
    const float* ey = host_read(A.ey.data(), R * k * d, hs_c_);
    std::vector<float> dy_host;
    float* dy = e.host_memory() ? bw_.dy.data() : (dy_host.resize(static_cast<size_t>(R * k * d)), dy_host.data());
    moe::combine_backward(drouted, ey, A.weight.data(), plan, d, dy, dweight.data(), pool_);
    host_write(bw_.dy.data(), dy, R * k * d);
    if (ep_now_) {  // the experts' backward runs on their owners; ∂xg, ∂g, ∂u come back in plan order
      std::vector<float> back;
      const bool hm = e.host_memory();
      if (!hm) back.resize(static_cast<size_t>(R * k * (d + 2 * h)));
      float* dxg = hm ? bw_.dxg.data() : back.data();
      float* deg = hm ? bw_.deg.data() : back.data() + R * k * d;
      float* deu = hm ? bw_.deu.data() : back.data() + R * k * (d + h);
      ep_backward(params, o, &A - acts_.data(), &plan, dy, dxg, deg, deu);
      host_write(bw_.dxg.data(), dxg, R * k * d);
      host_write(bw_.deg.data(), deg, R * k * h);
      host_write(bw_.deu.data(), deu, R * k * h);
    }
  }
  // Each expert's backward over its rows: ∂a = ∂y·W2ₓᵀ, SwiGLU backward, ∂xg = ∂g·W1ₓ + ∂u·W3ₓ.
  for (int64_t x = 0; x < E && !ep_now_; ++x) {
    const int64_t n = plan.count(x), p0 = plan.expert_begin[static_cast<size_t>(x)];
    if (n == 0) continue;
    e.matmul_forward(bw_.dy.data() + p0 * d, params + o.moe_w2 + x * h * d, bw_.da.data() + p0 * h, n, h, d);
    e.swiglu_backward(A.eg.data() + p0 * h, A.eu.data() + p0 * h, bw_.da.data() + p0 * h, bw_.deg.data() + p0 * h,
                      bw_.deu.data() + p0 * h, n * h, false);
    e.matmul_backward_input(bw_.deg.data() + p0 * h, params + o.moe_w1 + x * h * d, bw_.dxg.data() + p0 * d, n, h, d,
                            false);
    e.matmul_backward_input(bw_.deu.data() + p0 * h, params + o.moe_w3 + x * h * d, bw_.dxg.data() + p0 * d, n, h, d,
                            true);
  }
  // The experts' weight-gradient leaves: instance b's rows of expert x are one contiguous run of positions.
  auto expert_grad = [&](int64_t offset, auto&& one) {
    for (int64_t b = 0; b < n_inst; ++b) {
      float* leaf = grads.leaf(b, offset, E * h * d);
      for (int64_t x = 0; x < E; ++x) {
        const auto [q0, q1] = plan.segment(x, b * T, (b + 1) * T);
        float* dW = leaf + x * h * d;
        if (q1 == q0)
          e.zero(dW, static_cast<size_t>(h * d) * sizeof(float));
        else
          one(q0, q1 - q0, dW);
      }
      grads.commit(b, offset, E * h * d);
    }
  };
  expert_grad(o.moe_w1, [&](int64_t q, int64_t n, float* dW) {
    e.matmul_backward_weight(bw_.deg.data() + q * h, A.xg.data() + q * d, dW, n, h, d, false);
  });
  expert_grad(o.moe_w3, [&](int64_t q, int64_t n, float* dW) {
    e.matmul_backward_weight(bw_.deu.data() + q * h, A.xg.data() + q * d, dW, n, h, d, false);
  });
  expert_grad(o.moe_w2, [&](int64_t q, int64_t n, float* dW) {  // ∂W2ₓ [h, d] = aᵀ·∂y
    e.matmul_backward_weight(A.ea.data() + q * h, bw_.dy.data() + q * d, dW, n, h, d, false);
  });
  // ∂h += the dispatched rows' input gradients, each row's k choices in rank order.
  {
    const float* dxg = host_read(bw_.dxg.data(), R * k * d, hs_c_);
    float* dxh = e.host_memory() ? dx : (hs_b_.resize(static_cast<size_t>(R * d)), hs_b_.data());
    if (!e.host_memory()) e.to_host(dxh, dx, static_cast<size_t>(R * d) * sizeof(float));
    if (debug_unordered_combine_)
      moe::scatter_add_unordered_for_test(dxg, plan, d, dxh);
    else
      moe::scatter_add(dxg, plan, d, dxh, pool_);
    host_write(dx, dxh, R * d);
  }
  // Router: ∂logits from the combine's ∂weight, the load-balancing and z-loss terms; then ∂Wr and ∂h.
  {
    std::vector<float> dl_host;
    float* dl = e.host_memory() ? bw_.dlogits.data() : (dl_host.resize(static_cast<size_t>(R * E)), dl_host.data());
    const double lb_coef = m.lb_loss_weight > 0 ? moe_lb_coef() : 0.0;
    const float z_grad = m.z_loss_weight > 0
                             ? static_cast<float>(2.0 * moe_z_coef() / static_cast<double>(global_n_targets))
                             : 0.0f;
    const std::vector<float> mb_grad =
        m.lb_granularity == MoELbGranularity::local_batch
            ? moe::lb_grad(moe::counts(A.top.data(), 0, R, k, E), R, lb_coef, global_n_targets)
            : std::vector<float>{};
    for (int64_t b = 0; b < n_inst; ++b) {
      const int64_t r0 = b * T, r1 = r0 + T;
      const std::vector<float> g = m.lb_granularity == MoELbGranularity::instance
                                       ? moe::lb_grad(moe::counts(A.top.data(), r0, r1, k, E), T, lb_coef, global_n_targets)
                                       : mb_grad;
      moe::router_backward(A.scores.data(), A.lse.data(), A.top.data(), A.weight.data(), dweight.data(), g.data(),
                           z_grad, r0, r1, E, k, dl, m.normalize_expert_weights);
    }
    host_write(bw_.dlogits.data(), dl, R * E);
  }
  weight_grad(o.moe_router, bw_.dlogits.data(), A.h.data(), E, d);
  e.matmul_backward_input(bw_.dlogits.data(), params + o.moe_router, dx, R, E, d, true);
}

// ---- Expert parallelism (docs/canonical/moe.md "Expert parallelism") ----

namespace {

void grow(Buffer<float>& b, Executor& e, int64_t n, const char* what) {
  if (b.size() < n) b.reset(e, n, what);
}

// Interleaves columns of rows: out [rows, Σ widths], row r = (cols[0] row r, cols[1] row r, ...).
void pack_rows(const std::vector<std::pair<const float*, int64_t>>& cols, int64_t rows, float* out) {
  int64_t w = 0;
  for (const auto& c : cols) w += c.second;
  for (int64_t r = 0; r < rows; ++r) {
    float* dst = out + r * w;
    for (const auto& [src, cw] : cols) dst = std::copy(src + r * cw, src + (r + 1) * cw, dst);
  }
}

void unpack_rows(const float* in, int64_t rows, const std::vector<std::pair<float*, int64_t>>& cols) {
  int64_t w = 0;
  for (const auto& c : cols) w += c.second;
  for (int64_t r = 0; r < rows; ++r) {
    const float* src = in + r * w;
    for (const auto& [dst, cw] : cols) {
      std::copy(src, src + cw, dst + r * cw);
      src += cw;
    }
  }
}

// One MoE layer's exchange on one rank: which rows go where, from the all-gathered counts [n, E].
struct EpRoute {
  ExpertExchange& ep;
  const std::vector<int64_t>& counts;  // [n, E]: the slots rank s sent expert e
  const moe::Plan* plan;               // this rank's slots (nullptr in an idle pass)
  int64_t E;
  int n, me;
  int64_t first, last;                  // the experts this rank owns
  std::vector<int64_t> from_source;     // rows each source sends me
  std::vector<int64_t> to_owner;        // my rows for each owner: a contiguous slice of the plan's positions
  int64_t owned_rows = 0, my_rows = 0;

  EpRoute(ExpertExchange& x, const std::vector<int64_t>& c, const moe::Plan* p, int64_t experts)
      : ep(x), counts(c), plan(p), E(experts), n(x.size()), me(x.index()) {
    std::tie(first, last) = moe::ep_experts(E, n, me);
    from_source.assign(static_cast<size_t>(n), 0);
    to_owner.assign(static_cast<size_t>(n), 0);
    for (int j = 0; j < n; ++j) {
      for (int64_t e = first; e < last; ++e) from_source[static_cast<size_t>(j)] += counts[static_cast<size_t>(j * E + e)];
      const auto [fj, lj] = moe::ep_experts(E, n, j);
      if (plan)
        to_owner[static_cast<size_t>(j)] =
            plan->expert_begin[static_cast<size_t>(lj)] - plan->expert_begin[static_cast<size_t>(fj)];
      owned_rows += from_source[static_cast<size_t>(j)];
      my_rows += to_owner[static_cast<size_t>(j)];
    }
  }
  static std::vector<int64_t> times(std::vector<int64_t> v, int64_t w) {
    for (int64_t& x : v) x *= w;
    return v;
  }
  // My slots' rows (width w, plan order) to their owners; returns what I own, expert-major [owned_rows, w].
  std::vector<float> dispatch(const float* rows, int64_t w) const {
    std::vector<float> got(static_cast<size_t>(owned_rows * w)), out(got.size());
    const float none = 0.0f;
    ep.alltoallv(rows ? rows : &none, times(to_owner, w), got.data(), times(from_source, w));
    moe::ep_to_expert_major(got.data(), counts.data(), n, E, first, last, w, out.data());
    return out;
  }
  // The owner's results, columns of expert-major rows in executor memory ([owned_rows, width] each), back to their
  // sources as rows [col 0 | col 1 | ...]; `out` receives my rows' columns on the host, in plan order (nothing
  // without a plan: an idle pass).
  void give_back(const std::vector<std::pair<const Buffer<float>*, int64_t>>& cols,
                 const std::vector<std::pair<float*, int64_t>>& out) const {
    int64_t w = 0;
    std::vector<std::vector<float>> host;
    std::vector<std::pair<const float*, int64_t>> views;
    for (const auto& [buf, cw] : cols) {
      host.emplace_back(static_cast<size_t>(owned_rows * cw));
      if (owned_rows > 0) buf->download(host.back().data(), owned_rows * cw);
      views.push_back({host.back().data(), cw});
      w += cw;
    }
    std::vector<float> packed(static_cast<size_t>(owned_rows * w)), back(packed.size());
    pack_rows(views, owned_rows, packed.data());
    moe::ep_to_source_major(packed.data(), counts.data(), n, E, first, last, w, back.data());
    std::vector<float> mine(static_cast<size_t>(my_rows * w));
    const float none = 0.0f;
    ep.alltoallv(back.empty() ? &none : back.data(), times(from_source, w), mine.data(), times(to_owner, w));
    // The owners' blocks arrive in owner order = expert order = plan order.
    if (plan) unpack_rows(mine.data(), my_rows, out);
  }
  int64_t rows_of(int64_t e) const {
    int64_t r = 0;
    for (int s = 0; s < n; ++s) r += counts[static_cast<size_t>(s * E + e)];
    return r;
  }
};

}  // namespace

void Olmo3::ep_forward(const float* params, const BlockOffsets& o, int64_t layer, const moe::Plan* plan,
                       const float* xg, float* ey, float* ea) {
  Executor& e = *ex_;
  const int64_t E = cfg_.moe.n_experts, d = cfg_.d_model, h = cfg_.moe.hidden;
  OwnedExperts& own = owned_[static_cast<size_t>(layer)];
  // Every rank's slots per expert, so each owner knows what arrives from whom (and returns it in that order).
  std::vector<int64_t> mine(static_cast<size_t>(E), 0);
  for (int64_t x = 0; plan && x < E; ++x) mine[static_cast<size_t>(x)] = plan->count(x);
  own.counts.assign(static_cast<size_t>(ep_now_->size() * E), 0);
  ep_now_->allgather(mine.data(), E, own.counts.data());
  const EpRoute route(*ep_now_, own.counts, plan, E);
  const int64_t R = own.rows = route.owned_rows;
  const std::vector<float> xr = route.dispatch(xg, d);
  // The owned experts over their rows from every source: the same three GEMMs as moe_forward's, row for row.
  grow(own.eg, e, R * h, "expert-parallel gate of the owned experts");
  grow(own.eu, e, R * h, "expert-parallel up of the owned experts");
  grow(ep_x_, e, R * d, "expert-parallel rows received");
  grow(ep_a_, e, R * h, "expert-parallel SwiGLU of the owned experts");
  grow(ep_y_, e, R * d, "expert-parallel outputs of the owned experts");
  if (R > 0) ep_x_.upload(xr.data(), R * d);
  for (int64_t x = route.first, p0 = 0; x < route.last; p0 += route.rows_of(x), ++x) {
    const int64_t nx = route.rows_of(x);
    if (nx == 0) continue;
    const float* X = ep_x_.data() + p0 * d;
    e.matmul_forward(X, params + o.moe_w1 + x * h * d, own.eg.data() + p0 * h, nx, h, d);
    e.matmul_forward_swiglu(X, params + o.moe_w3 + x * h * d, own.eg.data() + p0 * h, own.eu.data() + p0 * h,
                            ep_a_.data() + p0 * h, nx, h, d, false);
    e.matmul_backward_input(ep_a_.data() + p0 * h, params + o.moe_w2 + x * h * d, ep_y_.data() + p0 * d, nx, h, d,
                            false);
  }
  // [y | a] per row back to its source.
  route.give_back({{&ep_y_, d}, {&ep_a_, h}}, {{ey, d}, {ea, h}});
}

void Olmo3::ep_backward(const float* params, const BlockOffsets& o, int64_t layer, const moe::Plan* plan,
                        const float* dy, float* dxg, float* deg, float* deu) {
  Executor& e = *ex_;
  const int64_t E = cfg_.moe.n_experts, d = cfg_.d_model, h = cfg_.moe.hidden;
  OwnedExperts& own = owned_[static_cast<size_t>(layer)];
  const EpRoute route(*ep_now_, own.counts, plan, E);  // forward's counts: the same rows travel again
  const int64_t R = own.rows;
  const std::vector<float> dyr = route.dispatch(dy, d);
  grow(ep_y_, e, R * d, "expert-parallel output gradients received");
  grow(ep_a_, e, R * h, "expert-parallel SwiGLU gradient");
  grow(ep_g_, e, R * h, "expert-parallel gate gradient");
  grow(ep_u_, e, R * h, "expert-parallel up gradient");
  grow(ep_x_, e, R * d, "expert-parallel input gradients");
  if (R > 0) ep_y_.upload(dyr.data(), R * d);
  // The same four ops as moe_backward's local loop, over the owned experts' rows.
  for (int64_t x = route.first, p0 = 0; x < route.last; p0 += route.rows_of(x), ++x) {
    const int64_t nx = route.rows_of(x);
    if (nx == 0) continue;
    e.matmul_forward(ep_y_.data() + p0 * d, params + o.moe_w2 + x * h * d, ep_a_.data() + p0 * h, nx, h, d);
    e.swiglu_backward(own.eg.data() + p0 * h, own.eu.data() + p0 * h, ep_a_.data() + p0 * h, ep_g_.data() + p0 * h,
                      ep_u_.data() + p0 * h, nx * h, false);
    e.matmul_backward_input(ep_g_.data() + p0 * h, params + o.moe_w1 + x * h * d, ep_x_.data() + p0 * d, nx, h, d,
                            false);
    e.matmul_backward_input(ep_u_.data() + p0 * h, params + o.moe_w3 + x * h * d, ep_x_.data() + p0 * d, nx, h, d,
                            true);
  }
  // [∂xg | ∂g | ∂u] per row back to its source.
  route.give_back({{&ep_x_, d}, {&ep_g_, h}, {&ep_u_, h}}, {{dxg, d}, {deg, h}, {deu, h}});
}

}  // namespace olmoref
