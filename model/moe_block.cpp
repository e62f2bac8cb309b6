// model/moe_block.cpp — the mixture-of-experts feed-forward of a block, forward and backward, as
// docs/canonical/moe.md defines it: router, top-k, dispatch in (expert, row) order, the experts' SwiGLUs, the combine
// in each row's rank order, the optional shared expert, the auxiliary losses and the router's backward.
//
// Shapes: R = n_inst·T rows, d the model width, E experts, k choices per row, S = R·k dispatched slots, h an expert's
// hidden width, Fs the shared expert's. Every float tensor op is an executor op (routing, dispatch, combine and its
// backward, input-gradient gather, shared-expert mix, router backward), so on `cuda` the [R, d] and [S, d] tensors
// stay on the device. The host keeps only the bookkeeping that is its job: the expert choices top [R, k] (the
// dispatch plan, the expert loads, the routing digest) and what the fp64 auxiliary losses read (lse [R] and scores
// [R, E]; E is small next to d, so these are a few floats per row against the d or more an [R, d] tensor moves).
// Two paths still stage rows on the host (mirror_, the executor's page-locked staging on a device): expert parallelism
// over the MPI transport, whose exchange is host memory (model/ep_exchange.cpp; the NCCL transport moves the rows
// between executor buffers), and the TEST-ONLY unordered-combine negative control.
#include <stdexcept>
#include <string>

#include "model/olmo3.h"

namespace olmoref {

// Grown to exactly n (page-locked memory is slow to make; doubling would make more of it than asked).
const float* Olmo3::host_read(const float* src, int64_t n, StagingVector<float>& mirror) const {
  if (ex_->host_memory()) return src;
  mirror.reserve(static_cast<size_t>(n));
  mirror.resize(static_cast<size_t>(n));
  ex_->to_host(mirror.data(), src, static_cast<size_t>(n) * sizeof(float));
  return mirror.data();
}

float* Olmo3::host_target(float* dst, int64_t n, StagingVector<float>& mirror) const {
  if (ex_->host_memory()) return dst;
  mirror.reserve(static_cast<size_t>(n));
  mirror.resize(static_cast<size_t>(n));
  return mirror.data();
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

// Every expert of a plan, each over its contiguous run of positions.
static ExpertRows all_experts(const moe::Plan& plan) {
  ExpertRows rows{0, plan.E, {}, {}};
  for (int64_t x = 0; x < plan.E; ++x)
    rows.count.push_back(plan.count(x)), rows.begin.push_back(plan.expert_begin[static_cast<size_t>(x)]);
  return rows;
}

void Olmo3::experts_forward(const float* params, const BlockOffsets& o, const ExpertRows& rows, const float* X,
                            float* g, float* u, float* a, float* y) {
  Executor& e = *ex_;
  const int64_t d = cfg_.d_model, h = cfg_.moe.hidden;
  for (int64_t x = rows.first; x < rows.last; ++x) {
    const int64_t n = rows.count[static_cast<size_t>(x - rows.first)], p0 = rows.begin[static_cast<size_t>(x - rows.first)];
    if (n == 0) continue;
    const float* Xx = X + p0 * d;
    // g [n, h] = Xₓ [n, d] · W1ₓᵀ [d, h]
    e.matmul_forward(Xx, params + o.moe_w1 + x * h * d, g + p0 * h, n, h, d);
    // u [n, h] = Xₓ · W3ₓᵀ, with a [n, h] = SwiGLU(g, u) in its epilogue
    e.matmul_forward_swiglu(Xx, params + o.moe_w3 + x * h * d, g + p0 * h, u + p0 * h, a + p0 * h, n, h, d, false);
    // y [n, d] = a [n, h] · W2ₓ [h, d] (W2ₓ is [in, out], so the product is the input-gradient form)
    e.matmul_backward_input(a + p0 * h, params + o.moe_w2 + x * h * d, y + p0 * d, n, h, d, false);
  }
}

void Olmo3::experts_backward(const float* params, const BlockOffsets& o, const ExpertRows& rows, const float* dy,
                             const float* g, const float* u, float* da, float* dg, float* du, float* dX) {
  Executor& e = *ex_;
  const int64_t d = cfg_.d_model, h = cfg_.moe.hidden;
  for (int64_t x = rows.first; x < rows.last; ++x) {
    const int64_t n = rows.count[static_cast<size_t>(x - rows.first)], p0 = rows.begin[static_cast<size_t>(x - rows.first)];
    if (n == 0) continue;
    // ∂a [n, h] = ∂y [n, d] · W2ₓᵀ [d, h]
    e.matmul_forward(dy + p0 * d, params + o.moe_w2 + x * h * d, da + p0 * h, n, h, d);
    // ∂g, ∂u [n, h] = SwiGLU backward of (g, u, ∂a)
    e.swiglu_backward(g + p0 * h, u + p0 * h, da + p0 * h, dg + p0 * h, du + p0 * h, n * h, false);
    // ∂X [n, d] = ∂g · W1ₓ [h, d] + ∂u · W3ₓ [h, d], one chain
    e.matmul_backward_input(dg + p0 * h, params + o.moe_w1 + x * h * d, dX + p0 * d, n, h, d, false);
    e.matmul_backward_input(du + p0 * h, params + o.moe_w3 + x * h * d, dX + p0 * d, n, h, d, true);
  }
}

// A buffer of at least n elements in executor memory, made at its first use.
template <class T>
static T* sized(Executor& e, Buffer<T>& b, int64_t n, const std::string& what) {
  if (b.size() < n) b.reset(e, n, what);
  return b.data();
}

// Host copy n elements of executor memory into `host` (resized).
template <class T>
static void download(Executor& e, std::vector<T>& host, const T* src, int64_t n) {
  host.resize(static_cast<size_t>(n));
  e.to_host(host.data(), src, static_cast<size_t>(n) * sizeof(T));
}

void Olmo3::place_route_outputs(LayerActs& A, int64_t R) {
  Executor& e = *ex_;
  const int64_t E = cfg_.moe.n_experts, k = cfg_.moe.top_k;
  if (e.host_memory()) {
    A.scores.resize(static_cast<size_t>(R * E));
    A.lse.resize(static_cast<size_t>(R));
    A.top.resize(static_cast<size_t>(R * k));
    A.weight.resize(static_cast<size_t>(R * k));
    A.route = {A.scores.data(), A.lse.data(), A.top.data(), A.weight.data()};
    return;
  }
  const std::string at = " of block " + std::to_string(&A - acts_.data());
  A.route = {sized(e, A.route_scores, R_ * E, "router scores" + at), sized(e, A.route_lse, R_, "router lse" + at),
             sized(e, A.route_top, R_ * k, "expert choices" + at), A.weight_copy.data()};
}

void Olmo3::routing_to_host(LayerActs& A, int64_t R) {
  if (ex_->host_memory()) return;
  const MoEConfig& m = cfg_.moe;
  const int64_t E = m.n_experts, k = m.top_k;
  download(*ex_, A.top, A.route.top, R * k);
  if (m.lb_loss_weight > 0) download(*ex_, A.scores, A.route.scores, R * E);
  if (m.z_loss_weight > 0) download(*ex_, A.lse, A.route.lse, R);
  if (debug_unordered_combine_) download(*ex_, A.weight, A.route.weight, R * k);
}

void Olmo3::place_routing(LayerActs& A) {
  if (ex_->host_memory()) {
    A.dispatch = moe::dispatch_of(A.plan);
    return;
  }
  const int64_t S = A.plan.R * A.plan.k;
  A.plan_row_of.upload(A.plan.row_of.data(), S);
  A.plan_position.upload(A.plan.position.data(), S);
  A.dispatch = {A.plan.R, A.plan.k, A.plan_row_of.data(), A.plan_position.data()};
}

void Olmo3::moe_forward(const float* params, LayerActs& A, const BlockOffsets& o, int64_t n_inst) {
  Executor& e = *ex_;
  const MoEConfig& m = cfg_.moe;
  const int64_t R = n_inst * L_, d = cfg_.d_model, E = m.n_experts, k = m.top_k, h = m.hidden, Fs = m.shared_hidden;
  const int64_t S = R * k, layer = &A - acts_.data();
  // router_logits [R, E] = h [R, d] · Wrᵀ [d, E]
  e.matmul_forward(A.h.data(), params + o.moe_router, A.router_logits.data(), R, E, d);
  // scores [R, E], lse [R], top, weight [R, k] = route(router_logits)
  place_route_outputs(A, R);
  e.moe_route(A.router_logits.data(), R, E, k, static_cast<int>(m.normalize_expert_weights), A.route.scores,
              A.route.lse, A.route.top, A.route.weight);
  routing_to_host(A, R);
  A.plan = moe::make_plan(A.top.data(), R, k, E);
  place_routing(A);
  if (expert_load_.size() != static_cast<size_t>(cfg_.n_layers * E))
    expert_load_.assign(static_cast<size_t>(cfg_.n_layers * E), 0);
  // A recomputed forward (activation checkpointing) routes the same rows again: the first forward counted them.
  for (int64_t x = 0; x < E && !recomputing_; ++x) expert_load_[static_cast<size_t>(layer * E + x)] += A.plan.count(x);

  // Auxiliary losses and the routing digest, per instance (docs/canonical/moe.md "Auxiliary losses"), over the
  // instances' whole rows (context parallelism: every rank's, gathered).
  if (!recomputing_) {
    const MoEInstanceRows all = whole_instance_rows(A, n_inst);
    const int64_t Rw = n_inst * T_;
    const double lb_coef = moe_lb_coef(), z_coef = moe_z_coef();
    const std::vector<int64_t> mb_counts =
        m.lb_granularity == MoELbGranularity::local_batch ? moe::counts(all.top, 0, Rw, k, E) : std::vector<int64_t>{};
    for (int64_t b = 0; b < n_inst; ++b) {
      MoEInstance& mi = moe_inst_[static_cast<size_t>(b)];
      const int64_t r0 = b * T_, r1 = r0 + T_;
      if (m.lb_loss_weight > 0) {
        if (m.lb_granularity == MoELbGranularity::instance)
          mi.lb += moe::lb_value(all.scores, r0, r1, E, moe::counts(all.top, r0, r1, k, E), T_, lb_coef);
        else
          mi.lb += moe::lb_value(all.scores, r0, r1, E, mb_counts, Rw, lb_coef);
      }
      if (m.z_loss_weight > 0) mi.z += moe::z_value(all.lse, r0, r1, z_coef);
      mi.routing = moe::routing_digest(all.top + r0 * k, T_, k, mi.routing ^ static_cast<uint64_t>(layer));
    }
  }

  // xg [S, d] = h [R, d]'s rows in (expert, row) order; then each expert's SwiGLU over its contiguous rows.
  e.moe_dispatch(A.dispatch, A.h.data(), A.xg.data(), d);
  if (ep_now_ && ep_now_->device_resident()) {  // the same, the rows moved between executor buffers
    ep_forward(params, o, layer, &A.plan, A.xg.data(), A.ey.data(), A.ea.data());
  } else if (ep_now_) {  // the experts run on their owners; ey [S, d] and ea [S, h] come back in plan order
    const float* xg = host_read(A.xg.data(), S * d, mirror_.xg);
    float* ey = host_target(A.ey.data(), S * d, mirror_.ey);
    float* ea = host_target(A.ea.data(), S * h, mirror_.ea);
    ep_forward(params, o, layer, &A.plan, xg, ey, ea);
    host_write(A.ey.data(), ey, S * d);
    host_write(A.ea.data(), ea, S * h);
  } else {
    // eg, eu, ea [S, h], ey [S, d] from xg [S, d], expert by expert
    experts_forward(params, o, all_experts(A.plan), A.xg.data(), A.eg.data(), A.eu.data(), A.ea.data(), A.ey.data());
  }
  // f [R, d] = Σ_j weight[r, j] · ey[position(r, j)], each row's k choices in rank order; with a shared expert,
  // mixed with it as OLMo-core does.
  if (debug_unordered_combine_) {
    float* f = host_target(A.f.data(), R * d, mirror_.f);
    moe::combine_unordered_for_test(host_read(A.ey.data(), S * d, mirror_.ey), A.weight.data(), A.plan, d, f);
    host_write(A.f.data(), f, R * d);
  } else {
    e.moe_combine(A.dispatch, A.ey.data(), A.route.weight, A.f.data(), d);
  }
  if (Fs > 0) {
    // sg [R, Fs] = h · Ws1ᵀ; su [R, Fs] = h · Ws3ᵀ with sa = SwiGLU(sg, su); sy [R, d] = sa · Ws2ᵀ
    e.matmul_forward(A.h.data(), params + o.shared_w1, A.sg.data(), R, Fs, d);
    e.matmul_forward_swiglu(A.h.data(), params + o.shared_w3, A.sg.data(), A.su.data(), A.sa.data(), R, Fs, d, false);
    e.matmul_forward(A.sa.data(), params + o.shared_w2, A.sy.data(), R, d, Fs);
    // f [R, d] = sy / (k+1) + f · fl(k/(k+1))
    e.moe_shared_combine(A.sy.data(), A.f.data(), k, A.f.data(), R * d);
  }
}

void Olmo3::moe_backward(const float* params, LayerActs& A, const BlockOffsets& o, int64_t n_inst,
                         int64_t global_n_targets, GradientLeaves& grads) {
  Executor& e = *ex_;
  const MoEConfig& m = cfg_.moe;
  const int64_t R = n_inst * L_, d = cfg_.d_model, E = m.n_experts, k = m.top_k, h = m.hidden, Fs = m.shared_hidden;
  const int64_t S = R * k;
  const moe::Plan& plan = A.plan;
  float* dx = bw_.dx.data();
  // ∂f [R, d] splits into the shared expert's ∂sy [R, d] and the routed part ∂routed [R, d] (∂f itself without one).
  const float* drouted = bw_.df.data();
  if (Fs > 0) {
    e.moe_shared_combine_backward(bw_.df.data(), k, bw_.dsy.data(), bw_.drouted.data(), R * d);
    drouted = bw_.drouted.data();
    // ∂Ws2_b [d, Fs] = ∂sy_bᵀ · sa_b
    instance_weight_grads(grads, n_inst, o.shared_w2, bw_.dsy.data(), A.sa.data(), d, Fs);
    // ∂sa [R, Fs] = ∂sy · Ws2, then the SwiGLU backward into ∂sg, ∂su [R, Fs]
    e.matmul_backward_input_swiglu(bw_.dsy.data(), params + o.shared_w2, A.sg.data(), A.su.data(), bw_.dsg.data(),
                                   bw_.dsu.data(), R, d, Fs, false);
    // ∂Ws1_b, ∂Ws3_b [Fs, d] = ∂sg_bᵀ · h_b, ∂su_bᵀ · h_b
    instance_weight_grads(grads, n_inst, o.shared_w1, bw_.dsg.data(), A.h.data(), Fs, d);
    instance_weight_grads(grads, n_inst, o.shared_w3, bw_.dsu.data(), A.h.data(), Fs, d);
    // ∂h [R, d] += ∂sg · Ws1 + ∂su · Ws3
    e.matmul_backward_input(bw_.dsg.data(), params + o.shared_w1, dx, R, Fs, d, true);
    e.matmul_backward_input(bw_.dsu.data(), params + o.shared_w3, dx, R, Fs, d, true);
  }
  // ∂y [S, d] per slot and ∂weight [R, k] per choice.
  float* dweight = sized(e, bw_.dweight, R_ * k, "gradient of the expert weights");
  e.moe_combine_backward(A.dispatch, drouted, A.ey.data(), A.route.weight, bw_.dy.data(), dweight, d);
  if (ep_now_ && ep_now_->device_resident()) {  // the same, the rows moved between executor buffers
    ep_backward(params, o, &A - acts_.data(), &plan, bw_.dy.data(), bw_.dxg.data(), bw_.deg.data(), bw_.deu.data());
  } else if (ep_now_) {  // the experts' backward runs on their owners; ∂xg, ∂g, ∂u come back in plan order
    const float* dy = host_read(bw_.dy.data(), S * d, mirror_.dy);
    float* dxg = host_target(bw_.dxg.data(), S * d, mirror_.dxg);
    float* deg = host_target(bw_.deg.data(), S * h, mirror_.deg);
    float* deu = host_target(bw_.deu.data(), S * h, mirror_.deu);
    ep_backward(params, o, &A - acts_.data(), &plan, dy, dxg, deg, deu);
    host_write(bw_.dxg.data(), dxg, S * d);
    host_write(bw_.deg.data(), deg, S * h);
    host_write(bw_.deu.data(), deu, S * h);
  } else {
    // da, deg, deu [S, h], dxg [S, d] from dy [S, d], expert by expert
    experts_backward(params, o, all_experts(plan), bw_.dy.data(), A.eg.data(), A.eu.data(), bw_.da.data(),
                     bw_.deg.data(), bw_.deu.data(), bw_.dxg.data());
  }
  expert_weight_grads(A, o, n_inst, grads);
  // ∂h [R, d] += the dispatched rows' input gradients ∂xg [S, d], each row's k choices in rank order.
  if (debug_unordered_combine_) {
    const float* dxg = host_read(bw_.dxg.data(), S * d, mirror_.dxg);
    float* dh = host_target(dx, R * d, mirror_.dh);
    if (!e.host_memory()) e.to_host(dh, dx, static_cast<size_t>(R * d) * sizeof(float));
    moe::scatter_add_unordered_for_test(dxg, plan, d, dh);
    host_write(dx, dh, R * d);
  } else {
    e.moe_scatter_add(A.dispatch, bw_.dxg.data(), dx, d);
  }
  moe_router_backward(A, dweight, n_inst, global_n_targets);
  // ∂Wr_b [E, d] = ∂logits_bᵀ · h_b; ∂h [R, d] += ∂logits [R, E] · Wr [E, d]
  instance_weight_grads(grads, n_inst, o.moe_router, bw_.dlogits.data(), A.h.data(), E, d);
  e.matmul_backward_input(bw_.dlogits.data(), params + o.moe_router, dx, R, E, d, true);
}

// The experts' weight-gradient leaves from ∂g, ∂u [S, h] and ∂y [S, d] of the backward buffers: instance b's rows of
// expert x are one contiguous run of positions, so each leaf is one product over that run (zero where it is empty).
// Under context parallelism the run is this rank's rows of the instance and the product continues the previous rank's
// chain (leaf_begin): a rank without rows of the expert passes the partial on as it came.
void Olmo3::expert_weight_grads(const LayerActs& A, const BlockOffsets& o, int64_t n_inst, GradientLeaves& grads) {
  Executor& e = *ex_;
  const int64_t d = cfg_.d_model, E = cfg_.moe.n_experts, h = cfg_.moe.hidden, L = L_;
  const moe::Plan& plan = A.plan;
  const bool continues = leaf_continues();
  auto expert_grad = [&](int64_t offset, auto&& one) {
    for (int64_t b = 0; b < n_inst; ++b) {
      float* leaf = leaf_begin(grads, b, offset, E * h * d);
      for (int64_t x = 0; x < E; ++x) {
        const auto [q0, q1] = plan.segment(x, b * L, (b + 1) * L);
        float* dW = leaf + x * h * d;
        if (q1 > q0)
          one(q0, q1 - q0, dW, continues);
        else if (!continues)
          e.zero(dW, static_cast<size_t>(h * d) * sizeof(float));
      }
      leaf_end(grads, b, offset, E * h * d, leaf);
    }
  };
  expert_grad(o.moe_w1, [&](int64_t q, int64_t n, float* dW, bool acc) {  // ∂W1ₓ [h, d] = ∂gᵀ · xg over the run
    e.matmul_backward_weight(bw_.deg.data() + q * h, A.xg.data() + q * d, dW, n, h, d, acc);
  });
  expert_grad(o.moe_w3, [&](int64_t q, int64_t n, float* dW, bool acc) {  // ∂W3ₓ [h, d] = ∂uᵀ · xg
    e.matmul_backward_weight(bw_.deu.data() + q * h, A.xg.data() + q * d, dW, n, h, d, acc);
  });
  expert_grad(o.moe_w2, [&](int64_t q, int64_t n, float* dW, bool acc) {  // ∂W2ₓ [h, d] = aᵀ · ∂y
    e.matmul_backward_weight(A.ea.data() + q * h, bw_.dy.data() + q * d, dW, n, h, d, acc);
  });
}

void Olmo3::moe_router_backward(LayerActs& A, const float* dweight, int64_t n_inst, int64_t global_n_targets) {
  const MoEConfig& m = cfg_.moe;
  const int64_t R = n_inst * L_, E = m.n_experts, k = m.top_k;
  // The load-balancing gradient of each unit of rows [units, E], from the expert counts over the unit's whole rows
  // (host bookkeeping; context parallelism: every rank's choices, gathered): one row per instance, or one for the
  // micro-batch. unit_rows counts them whole, local_rows as this rank holds them.
  const double lb_coef = m.lb_loss_weight > 0 ? moe_lb_coef() : 0.0;
  const bool per_instance = m.lb_granularity == MoELbGranularity::instance;
  const int64_t unit_rows = per_instance ? T_ : n_inst * T_, local_rows = per_instance ? L_ : R, units = R / local_rows;
  const int32_t* top = m.lb_loss_weight > 0 ? whole_instance_rows(A, n_inst, /*choices_only=*/true).top : nullptr;
  std::vector<float> lb_grad;
  for (int64_t u = 0; u < units; ++u) {
    const std::vector<float> g =
        m.lb_loss_weight > 0
            ? moe::lb_grad(moe::counts(top, u * unit_rows, (u + 1) * unit_rows, k, E), unit_rows, lb_coef, global_n_targets)
            : std::vector<float>(static_cast<size_t>(E), 0.0f);
    lb_grad.insert(lb_grad.end(), g.begin(), g.end());
  }
  float* lb_grad_ex = sized(*ex_, bw_.lb_grad, B_ * E, "load-balancing gradient");
  ex_->to_device(lb_grad_ex, lb_grad.data(), lb_grad.size() * sizeof(float));
  MoERouterBackward a;
  a.R = R, a.E = E, a.k = k, a.normalize_p = static_cast<int>(m.normalize_expert_weights);
  a.scores = A.route.scores, a.lse = A.route.lse, a.top = A.route.top, a.weight = A.route.weight, a.dweight = dweight;
  a.lb_grad = lb_grad_ex, a.lb_rows = local_rows;
  a.z_grad = m.z_loss_weight > 0 ? static_cast<float>(2.0 * moe_z_coef() / static_cast<double>(global_n_targets)) : 0.0f;
  // ∂logits [R, E] from the combine's ∂weight, the load-balancing and z-loss terms.
  ex_->moe_router_backward(a, bw_.dlogits.data());
}

}  // namespace olmoref
