// model/context_parallel.cpp — context parallelism (model/olmo3.h ContextExchange, docs/canonical/context_parallel.md):
// the n ranks of a group each compute L = T / n consecutive positions of every instance. What crosses ranks is data:
// attention's whole-instance tensors gathered for the op's parts, the chains' partials passed from rank to rank, the
// loss's row terms (olmo3.cpp head_rows). Without a group (cp_ = 1) every function here is the plain call.
//
// Shapes: n instances of the call, T positions each, L = T / cp_ of them this rank's rows, R = n·L rows; H heads,
// qd = H·hd, kd = KV·hd.
#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "model/olmo3.h"

namespace olmoref {

void Olmo3::set_context_exchange(ContextExchange* cp) {
  const int64_t size = cp ? cp->size() : 1;
  if (size != cp_)
    throw std::invalid_argument("context exchange of " + std::to_string(size) + " ranks for a model built for " +
                                std::to_string(cp_) + " (train.cp_degree)");
  cp_ex_ = cp_ > 1 ? cp : nullptr;
}

// This rank's rows' tokens and RoPE positions: row b·L + i is position first_position() + i of instance b, rotated by
// that position, or under intra-document masking by its place in its document (documents_of ran first).
void Olmo3::rows_of_call(const uint32_t* host_tokens, int64_t n_inst) {
  row_pos_ = nullptr;
  if (cp_ == 1) return;
  if (!cp_ex_) throw std::logic_error("a model built for context parallelism has no exchange (set_context_exchange)");
  const int64_t R = n_inst * L_, p0 = first_position();
  cpb_.host_tokens.resize(static_cast<size_t>(R));
  cpb_.host_positions.resize(static_cast<size_t>(R));
  for (int64_t b = 0; b < n_inst; ++b)
    for (int64_t i = 0; i < L_; ++i) {
      const int64_t row = b * L_ + i, at = b * T_ + p0 + i;
      cpb_.host_tokens[static_cast<size_t>(row)] = host_tokens[at];
      cpb_.host_positions[static_cast<size_t>(row)] =
          doc_pos_ ? doc_host_[2][static_cast<size_t>(at)] : static_cast<int32_t>(p0 + i);
    }
  if (ex_->host_memory()) {
    row_pos_ = cpb_.host_positions.data();
    return;
  }
  cpb_.tokens.upload(cpb_.host_tokens.data(), R);
  cpb_.positions.upload(cpb_.host_positions.data(), R);
  row_pos_ = cpb_.positions.data();
}

void Olmo3::set_row_tokens(PassInputs& in) const {
  in.row_tokens = in.tokens, in.row_host_tokens = in.host_tokens;
  if (cp_ == 1) return;
  in.row_host_tokens = cpb_.host_tokens.data();
  in.row_tokens = ex_->host_memory() ? cpb_.host_tokens.data() : cpb_.tokens.data();
}

void ContextExchange::move_positions(const std::vector<const float*>&, const std::vector<float*>&, const ExchangePlan&) {
  throw std::logic_error("ContextExchange::move_positions: this exchange stages through the host");
}
void ContextExchange::send_next_on_device(const float*, int64_t) {
  throw std::logic_error("ContextExchange::send_next_on_device: this exchange stages through the host");
}
void ContextExchange::recv_prev_on_device(float*, int64_t) {
  throw std::logic_error("ContextExchange::recv_prev_on_device: this exchange stages through the host");
}

void Olmo3::gather_positions(const float* mine, int64_t n_inst, int64_t w, float* full) {
  const int64_t block = n_inst * L_ * w;  // one rank's rows [n, L, w]
  if (cp_ex_->device_resident()) {
    // Instance b's rows of rank r land at positions [r·L, (r+1)·L) of instance b: one piece per instance and rank.
    ExchangePlan plan(static_cast<int>(cp_));
    for (int64_t r = 0; r < cp_; ++r)
      for (int64_t b = 0; b < n_inst; ++b) {
        plan.send[static_cast<size_t>(r)].push_back({b * L_ * w, L_ * w});
        plan.recv[static_cast<size_t>(r)].push_back({(b * T_ + r * L_) * w, L_ * w});
      }
    cp_ex_->move_positions({mine}, {full}, plan);
    return;
  }
  const float* sent = host_read(mine, block, cpb_.mine);
  cpb_.all.resize(static_cast<size_t>(block * cp_));
  cp_ex_->allgather(sent, static_cast<size_t>(block) * sizeof(float), cpb_.all.data());
  float* to = host_target(full, n_inst * T_ * w, cpb_.full);
  for (int64_t r = 0; r < cp_; ++r)
    for (int64_t b = 0; b < n_inst; ++b) {
      const float* from = cpb_.all.data() + r * block + b * L_ * w;
      std::copy(from, from + L_ * w, to + (b * T_ + r * L_) * w);
    }
  host_write(full, to, n_inst * T_ * w);
}

void Olmo3::gather_statistics(float* stats, int64_t n_inst) {
  // [n, H, T]: this rank's positions are a run of L in each (instance, head) row of T.
  const int64_t rows = n_inst * cfg_.n_heads, p0 = first_position();
  if (cp_ex_->device_resident()) {
    // My run of each row to every rank and theirs into their runs of the same buffer; my run to myself lands in a
    // scratch buffer (1), so no piece is sent from and received into the same floats.
    if (cpb_.own_run.size() < rows * L_) cpb_.own_run.reset(*ex_, rows * L_, "context parallelism: my statistics (copy)");
    ExchangePlan plan(static_cast<int>(cp_));
    const int me = static_cast<int>(cp_index());
    for (int64_t r = 0; r < cp_; ++r)
      for (int64_t i = 0; i < rows; ++i) {
        plan.send[static_cast<size_t>(r)].push_back({i * T_ + p0, L_});
        if (r == me)
          plan.recv[static_cast<size_t>(r)].push_back({i * L_, L_, 1});
        else
          plan.recv[static_cast<size_t>(r)].push_back({i * T_ + r * L_, L_});
      }
    cp_ex_->move_positions({stats}, {stats, cpb_.own_run.data()}, plan);
    return;
  }
  float* host = host_target(stats, rows * T_, cpb_.full);
  if (host != stats) ex_->to_host(host, stats, static_cast<size_t>(rows * T_) * sizeof(float));
  cpb_.mine.resize(static_cast<size_t>(rows * L_));
  for (int64_t i = 0; i < rows; ++i) std::copy(host + i * T_ + p0, host + i * T_ + p0 + L_, cpb_.mine.data() + i * L_);
  cpb_.all.resize(cpb_.mine.size() * static_cast<size_t>(cp_));
  cp_ex_->allgather(cpb_.mine.data(), cpb_.mine.size() * sizeof(float), cpb_.all.data());
  for (int64_t r = 0; r < cp_; ++r)
    for (int64_t i = 0; i < rows; ++i) {
      const float* from = cpb_.all.data() + (r * rows + i) * L_;
      std::copy(from, from + L_, host + i * T_ + r * L_);
    }
  host_write(stats, host, rows * T_);
}

void Olmo3::attention_op_forward(LayerActs& A, int64_t layer, int64_t n_inst) {
  const AttentionShape shape = attention_shape(layer, n_inst);
  if (cp_ == 1) {
    ex_->attention_forward(shape, A.q.data(), A.k.data(), A.v.data(), A.att.data(), A.att_max.data(),
                           A.att_sum.data());
    return;
  }
  const int64_t qd = cfg_.q_dim(), kd = cfg_.kv_dim(), p0 = first_position();
  const auto rows_bytes = [&](int64_t w) { return static_cast<size_t>(L_ * w) * sizeof(float); };
  // Every rank's keys and values [n, T, kd]; this rank's queries at their positions of [n, T, qd] (the op reads no
  // other query).
  gather_positions(A.k.data(), n_inst, kd, cpb_.k.data());
  gather_positions(A.v.data(), n_inst, kd, cpb_.v.data());
  for (int64_t b = 0; b < n_inst; ++b)
    ex_->copy(cpb_.q.data() + (b * T_ + p0) * qd, A.q.data() + b * L_ * qd, rows_bytes(qd));
  // out [n, T, qd] and the statistics [n, H, T] at this rank's queries
  ex_->attention_forward(shape, cpb_.q.data(), cpb_.k.data(), cpb_.v.data(), cpb_.out.data(), A.att_max.data(),
                         A.att_sum.data());
  for (int64_t b = 0; b < n_inst; ++b)
    ex_->copy(A.att.data() + b * L_ * qd, cpb_.out.data() + (b * T_ + p0) * qd, rows_bytes(qd));
  // Backward's keys see later ranks' queries: every rank keeps every query's statistics (H floats a position).
  gather_statistics(A.att_max.data(), n_inst);
  gather_statistics(A.att_sum.data(), n_inst);
}

void Olmo3::attention_op_backward(LayerActs& A, int64_t layer, int64_t n_inst) {
  const AttentionShape shape = attention_shape(layer, n_inst);
  BackwardBuffers& G = bw_;
  if (cp_ == 1) {
    ex_->attention_backward(shape, A.q.data(), A.k.data(), A.v.data(), A.att.data(), A.att_max.data(),
                            A.att_sum.data(), G.datt.data(), G.dq.data(), G.dk.data(), G.dv.data());
    return;
  }
  const int64_t qd = cfg_.q_dim(), kd = cfg_.kv_dim(), p0 = first_position();
  // dq of this rank's queries reads the keys and values of earlier ranks; dk, dv of its keys read the queries,
  // outputs and ∂outputs of later ranks (attention_backward_queries): all of them, gathered whole.
  gather_positions(A.q.data(), n_inst, qd, cpb_.q.data());
  gather_positions(A.k.data(), n_inst, kd, cpb_.k.data());
  gather_positions(A.v.data(), n_inst, kd, cpb_.v.data());
  gather_positions(A.att.data(), n_inst, qd, cpb_.out.data());
  gather_positions(G.datt.data(), n_inst, qd, cpb_.dout.data());
  ex_->attention_backward(shape, cpb_.q.data(), cpb_.k.data(), cpb_.v.data(), cpb_.out.data(), A.att_max.data(),
                          A.att_sum.data(), cpb_.dout.data(), cpb_.dq.data(), cpb_.dk.data(), cpb_.dv.data());
  for (int64_t b = 0; b < n_inst; ++b) {
    const int64_t mine = b * L_, at = b * T_ + p0;
    ex_->copy(G.dq.data() + mine * qd, cpb_.dq.data() + at * qd, static_cast<size_t>(L_ * qd) * sizeof(float));
    ex_->copy(G.dk.data() + mine * kd, cpb_.dk.data() + at * kd, static_cast<size_t>(L_ * kd) * sizeof(float));
    ex_->copy(G.dv.data() + mine * kd, cpb_.dv.data() + at * kd, static_cast<size_t>(L_ * kd) * sizeof(float));
  }
}

void Olmo3::gather_host_positions(const void* mine, int64_t n_inst, size_t row_bytes, void* full) {
  const size_t run = static_cast<size_t>(L_) * row_bytes, block = static_cast<size_t>(n_inst) * run;
  cpb_.bytes.resize(block * static_cast<size_t>(cp_));
  cp_ex_->allgather(mine, block, cpb_.bytes.data());
  auto* to = static_cast<unsigned char*>(full);
  for (int64_t r = 0; r < cp_; ++r)
    for (int64_t b = 0; b < n_inst; ++b)
      std::memcpy(to + static_cast<size_t>(b * T_ + r * L_) * row_bytes,
                  cpb_.bytes.data() + static_cast<size_t>(r) * block + static_cast<size_t>(b) * run, run);
}

Olmo3::MoEInstanceRows Olmo3::whole_instance_rows(const LayerActs& A, int64_t n_inst, bool choices_only) {
  if (cp_ == 1) return {A.scores.data(), A.lse.data(), A.top.data()};
  const MoEConfig& m = cfg_.moe;
  const int64_t rows = n_inst * T_, E = m.n_experts, k = m.top_k;
  MoEInstanceRows all;
  cpb_.top.resize(static_cast<size_t>(rows * k));
  gather_host_positions(A.top.data(), n_inst, static_cast<size_t>(k) * sizeof(int32_t), cpb_.top.data());
  all.top = cpb_.top.data();
  if (choices_only) return all;
  if (m.lb_loss_weight > 0) {
    cpb_.scores.resize(static_cast<size_t>(rows * E));
    gather_host_positions(A.scores.data(), n_inst, static_cast<size_t>(E) * sizeof(float), cpb_.scores.data());
    all.scores = cpb_.scores.data();
  }
  if (m.z_loss_weight > 0) {
    cpb_.lse.resize(static_cast<size_t>(rows));
    gather_host_positions(A.lse.data(), n_inst, sizeof(float), cpb_.lse.data());
    all.lse = cpb_.lse.data();
  }
  return all;
}

float* Olmo3::leaf_begin(GradientLeaves& grads, int64_t b, int64_t offset, int64_t n) {
  const bool last = cp_index() == cp_ - 1;
  float* at = last ? grads.leaf(b, offset, n) : nullptr;
  if (!last) {
    if (cpb_.partial.size() < n) cpb_.partial.reset(*ex_, n, "context parallelism: a gradient chain's partial");
    at = cpb_.partial.data();
  }
  if (leaf_continues() && cp_ex_->device_resident()) {
    cp_ex_->recv_prev_on_device(at, n);
  } else if (leaf_continues()) {
    float* host = host_target(at, n, cpb_.partial_host);
    cp_ex_->recv_prev(host, n);
    host_write(at, host, n);
  }
  return at;
}

void Olmo3::leaf_end(GradientLeaves& grads, int64_t b, int64_t offset, int64_t n, float* at) {
  if (debug_cp_partial_sums_ && cp_index() > 0) {  // TEST ONLY: the sum of the ranks' partials, not one chain
    if (!ex_->host_memory()) throw std::logic_error("the partial-sums negative control runs on host-memory executors");
    cpb_.partial_host.resize(static_cast<size_t>(n));
    cp_ex_->recv_prev(cpb_.partial_host.data(), n);
    for (int64_t i = 0; i < n; ++i) at[i] = cpb_.partial_host[static_cast<size_t>(i)] + at[i];
  }
  if (cp_index() == cp_ - 1) {
    // bf16: the leaf is rounded once the chain is whole, as in one call over the instance.
    round_act(at, n);
    grads.commit(b, offset, n);
    return;
  }
  if (cp_ex_->device_resident())
    cp_ex_->send_next_on_device(at, n);
  else
    cp_ex_->send_next(host_read(at, n, cpb_.partial_host), n);
}

}  // namespace olmoref
