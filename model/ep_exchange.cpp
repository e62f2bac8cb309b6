// model/ep_exchange.cpp — expert parallelism (docs/canonical/moe.md "Expert parallelism"): one MoE layer's
// exchange on one rank. The rank's dispatched slots travel to their experts' owners, the owners run the experts'
// forward and input-gradient products (model/moe_block.cpp's experts_forward / experts_backward, the very ops of the
// local loop) on what arrives, and the results travel back in plan order. Data movement only: every float is
// computed by the same op on the same inputs as in one process.
//
// Shapes: d the model width, h an expert's hidden width, E experts, n ranks in the EP group.
#include <algorithm>
#include <stdexcept>
#include <string>
#include <tuple>

#include "model/olmo3.h"

namespace olmoref {

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

  // The device-resident exchange (ExpertExchange::device_resident): the same rows, peer for peer and in the same
  // order, as pieces moved straight between executor buffers, so nothing is staged and no reorder runs on the host.
  // A source's rows for one owner are its plan positions of that owner's experts, expert after expert; the owner
  // keeps expert e's rows expert-major, source after source (moe::ep_to_expert_major's order): its row of source s's
  // first slot of e is expert_row(s, e).
  int64_t expert_row(int s, int64_t e) const {
    int64_t row = 0;
    for (int64_t x = first; x < e; ++x) row += rows_of(x);
    for (int q = 0; q < s; ++q) row += counts[static_cast<size_t>(q * E + e)];
    return row;
  }
  // My slots' rows [S, w] (plan order, executor memory) to their owners, into expert_major [owned_rows, w].
  void dispatch_on_device(const float* rows, int64_t w, float* expert_major) const {
    ExchangePlan x(n);
    for (int j = 0; j < n && plan; ++j) {
      const auto [fj, lj] = moe::ep_experts(E, n, j);
      for (int64_t e = fj; e < lj; ++e)
        x.send[static_cast<size_t>(j)].push_back({plan->expert_begin[static_cast<size_t>(e)] * w, plan->count(e) * w});
    }
    for (int s = 0; s < n; ++s)
      for (int64_t e = first; e < last; ++e)
        x.recv[static_cast<size_t>(s)].push_back({expert_row(s, e) * w, counts[static_cast<size_t>(s * E + e)] * w});
    ep.move({rows}, {expert_major}, x);
  }
  // The owner's results, columns of expert-major rows [owned_rows, width] in executor memory, back to their sources'
  // columns out [S, width] in plan order (executor memory; nothing without a plan): expert after expert, each
  // expert's columns one after another, which is the host path's [col 0 | col 1 | ...] rows, byte for byte per peer.
  void give_back_on_device(const std::vector<std::pair<const Buffer<float>*, int64_t>>& cols,
                           const std::vector<std::pair<float*, int64_t>>& out) const {
    ExchangePlan x(n);
    std::vector<const float*> src;
    std::vector<float*> dst;
    for (const auto& [buf, cw] : cols) src.push_back(buf->data());
    for (const auto& [p, cw] : out) dst.push_back(p);
    for (int s = 0; s < n; ++s)
      for (int64_t e = first; e < last; ++e)
        for (size_t c = 0; c < cols.size(); ++c) {
          const int64_t cw = cols[c].second;
          x.send[static_cast<size_t>(s)].push_back(
              {expert_row(s, e) * cw, counts[static_cast<size_t>(s * E + e)] * cw, static_cast<int>(c)});
        }
    for (int j = 0; j < n && plan; ++j) {
      const auto [fj, lj] = moe::ep_experts(E, n, j);
      for (int64_t e = fj; e < lj; ++e)
        for (size_t c = 0; c < out.size(); ++c) {
          const int64_t cw = out[c].second;
          x.recv[static_cast<size_t>(j)].push_back(
              {plan->expert_begin[static_cast<size_t>(e)] * cw, plan->count(e) * cw, static_cast<int>(c)});
        }
    }
    ep.move(src, dst, x);
  }
};

}  // namespace

void ExpertExchange::move(const std::vector<const float*>&, const std::vector<float*>&, const ExchangePlan&) {
  throw std::logic_error("ExpertExchange::move: this exchange stages rows through the host (device_resident() is false)");
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

// Expert-major rows of the experts this rank owns, as the route delivers them.
static ExpertRows owned_rows(const EpRoute& route) {
  ExpertRows rows{route.first, route.last, {}, {}};
  for (int64_t x = route.first, p0 = 0; x < route.last; ++x) {
    rows.count.push_back(route.rows_of(x)), rows.begin.push_back(p0);
    p0 += rows.count.back();
  }
  return rows;
}

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
  grow(own.eg, e, R * h, "expert-parallel gate of the owned experts");
  grow(own.eu, e, R * h, "expert-parallel up of the owned experts");
  grow(ep_x_, e, R * d, "expert-parallel rows received");
  grow(ep_a_, e, R * h, "expert-parallel SwiGLU of the owned experts");
  grow(ep_y_, e, R * d, "expert-parallel outputs of the owned experts");
  // ep_x_ [R, d]: the rows every source sent the owned experts, expert-major
  if (ep_now_->device_resident()) {
    route.dispatch_on_device(xg, d, ep_x_.data());
  } else {
    const std::vector<float> xr = route.dispatch(xg, d);
    if (R > 0) ep_x_.upload(xr.data(), R * d);
  }
  // g, u, a [R, h], y [R, d] from the received rows [R, d]: the same three GEMMs as the local loop, row for row.
  experts_forward(params, o, owned_rows(route), ep_x_.data(), own.eg.data(), own.eu.data(), ep_a_.data(),
                  ep_y_.data());
  // [y | a] [R, d + h] per row back to its source.
  if (ep_now_->device_resident())
    route.give_back_on_device({{&ep_y_, d}, {&ep_a_, h}}, {{ey, d}, {ea, h}});
  else
    route.give_back({{&ep_y_, d}, {&ep_a_, h}}, {{ey, d}, {ea, h}});
}

void Olmo3::ep_backward(const float* params, const BlockOffsets& o, int64_t layer, const moe::Plan* plan,
                        const float* dy, float* dxg, float* deg, float* deu) {
  Executor& e = *ex_;
  const int64_t E = cfg_.moe.n_experts, d = cfg_.d_model, h = cfg_.moe.hidden;
  OwnedExperts& own = owned_[static_cast<size_t>(layer)];
  const EpRoute route(*ep_now_, own.counts, plan, E);  // forward's counts: the same rows travel again
  const int64_t R = own.rows;
  grow(ep_y_, e, R * d, "expert-parallel output gradients received");
  grow(ep_a_, e, R * h, "expert-parallel SwiGLU gradient");
  grow(ep_g_, e, R * h, "expert-parallel gate gradient");
  grow(ep_u_, e, R * h, "expert-parallel up gradient");
  grow(ep_x_, e, R * d, "expert-parallel input gradients");
  // ep_y_ [R, d]: ∂y of the owned experts' rows, expert-major
  if (ep_now_->device_resident()) {
    route.dispatch_on_device(dy, d, ep_y_.data());
  } else {
    const std::vector<float> dyr = route.dispatch(dy, d);
    if (R > 0) ep_y_.upload(dyr.data(), R * d);
  }
  // ∂a, ∂g, ∂u [R, h], ∂x [R, d]: the same four ops as the local loop, over the owned experts' rows.
  experts_backward(params, o, owned_rows(route), ep_y_.data(), own.eg.data(), own.eu.data(), ep_a_.data(),
                   ep_g_.data(), ep_u_.data(), ep_x_.data());
  // [∂xg | ∂g | ∂u] [R, d + 2h] per row back to its source.
  if (ep_now_->device_resident())
    route.give_back_on_device({{&ep_x_, d}, {&ep_g_, h}, {&ep_u_, h}}, {{dxg, d}, {deg, h}, {deu, h}});
  else
    route.give_back({{&ep_x_, d}, {&ep_g_, h}, {&ep_u_, h}}, {{dxg, d}, {deg, h}, {deu, h}});
}

}  // namespace olmoref
