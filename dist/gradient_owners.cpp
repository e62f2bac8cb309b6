#include "dist/gradient_owners.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <string>

namespace olmoref::dist {

namespace {
int64_t longest_unit(const std::vector<std::pair<int64_t, int64_t>>& units) {
  int64_t n = 0;
  for (const auto& [a, b] : units) n = std::max(n, b - a);
  return n;
}
}  // namespace

OwnerReduction::OwnerReduction(Executor& ex, Comm& comm, const Layout& layout, const BatchSplit& split,
                               std::vector<std::pair<int64_t, int64_t>> units, int chunks, NcclComm* nccl)
    : ex_(&ex),
      comm_(&comm),
      nccl_(nccl),
      layout_(layout),
      split_(split),
      units_(std::move(units)),
      local_(split.global_instances, layout.total, ex),
      owner_plan_(split.global_instances),
      send_(StagingAllocator<float>(ex, "gradient subtrees of a unit, cut by owner (sent)")),
      recv_(StagingAllocator<float>(ex, "every rank's gradient subtrees on a chunk of my slice (received)")),
      chunks_(chunks > 0 ? chunks : exchange_chunks(layout, units_)) {
  int64_t at = 0;
  for (const auto& [a, b] : units_) {
    if (a != at || b <= a) throw std::logic_error("OwnerReduction: the model's units do not tile the flat vector");
    at = b;
  }
  if (at != layout_.total) throw std::logic_error("OwnerReduction: the model's units do not cover the flat vector");
  local_.use_windows(longest_unit(units_));
}

// The slice of `unit` that rank j reduces: the unit ∩ j's optimizer range, as [lo, lo + floats).
static std::pair<int64_t, int64_t> owner_piece(const Layout& L, const std::pair<int64_t, int64_t>& unit, int j) {
  const int64_t lo = std::max(unit.first, L.optimizer_begin(j)), hi = std::min(unit.second, L.optimizer_end(j));
  return {lo, std::max<int64_t>(0, hi - lo)};
}

int exchange_chunks(const Layout& L, const std::vector<std::pair<int64_t, int64_t>>& units) {
  int64_t longest = 0;
  for (const auto& unit : units)
    for (int j = 0; j < L.world(); ++j) longest = std::max(longest, owner_piece(L, unit, j).second);
  const int64_t wanted = (longest + kExchangeChunkFloats - 1) / kExchangeChunkFloats;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>({wanted, L.world(), kMaxExchangeChunks})));
}

int64_t OwnerReduction::piece_floats(int unit, int rank) const {
  return owner_piece(layout_, units_[static_cast<size_t>(unit)], rank).second;
}

int64_t OwnerReduction::chunk_floats(int64_t piece) const { return std::max<int64_t>(1, (piece + chunks_ - 1) / chunks_); }

void OwnerReduction::begin_step() { owner_plan_ = TreePlan(split_.global_instances); }

GradientLeaves* OwnerReduction::begin_round(int64_t round) {
  const int W = layout_.world();
  const int64_t N = split_.global_instances;
  feeds_.clear();
  nodes_per_rank_.assign(static_cast<size_t>(W), 0);
  // Every rank plans the whole round from the layout alone, so no counts travel.
  for (int r = 0; r < W; ++r) {
    const int64_t m = split_.microbatch_of(r, round);
    if (m < 0) continue;
    const auto [a, b] = split_.instances_of_microbatch(m);
    const std::vector<TreeNode> nodes = maximal_subtrees(N, a, b);
    nodes_per_rank_[static_cast<size_t>(r)] = static_cast<int>(nodes.size());
    for (size_t q = 0; q < nodes.size(); ++q) feeds_.push_back({r, static_cast<int>(q), owner_plan_.feed(nodes[q])});
  }
  const int64_t len = layout_.optimizer_hi() - layout_.optimizer_lo();
  for (const OwnerFeed& f : feeds_) {
    const size_t need = static_cast<size_t>(f.step.slot) + 1;
    if (owner_slots_.size() < need) owner_slots_.resize(need);
  }
  for (size_t i = 0; i < owner_slots_.size(); ++i)
    if (len > 0 && owner_slots_[i].size() != len)
      owner_slots_[i].reset(*ex_, len, "owner instance-tree slot " + std::to_string(i) + " (the optimizer range)");

  const int64_t mine = split_.microbatch_of(layout_.rank, round);
  if (mine < 0) return nullptr;
  const auto [a, b] = split_.instances_of_microbatch(mine);
  // Subtree q of this micro-batch, tensor slice by tensor slice, into each owner's blocks of this unit's send:
  // owner j's region holds, chunk by chunk, the k subtrees' values of that chunk of its piece ([chunk][q][...]), so
  // each chunk's exchange sends one contiguous block to each owner.
  local_.reset_emitting(a, b, [this, W](int q, const float* src, int64_t off, int64_t n) {
    const auto& unit = units_[static_cast<size_t>(unit_)];
    const int64_t k = nodes_per_rank_[static_cast<size_t>(layout_.rank)];
    for (int j = 0; j < W; ++j) {
      const auto [lo, floats] = owner_piece(layout_, unit, j);
      const int64_t clen = chunk_floats(floats);
      for (int64_t x = std::max(off, lo), y = std::min(off + n, lo + floats); x < y;) {
        const int64_t c_lo = (x - lo) / clen * clen, len = std::min(clen, floats - c_lo);
        const int64_t end = std::min(y, lo + c_lo + len);
        const int64_t at = send_at_[static_cast<size_t>(j)] + c_lo * k + q * len + (x - lo - c_lo);
        const size_t bytes = static_cast<size_t>(end - x) * sizeof(float);
        if (nccl_)
          ex_->copy(send_dev_.data() + at, src + (x - off), bytes);
        else
          ex_->to_host(send_.data() + at, src + (x - off), bytes);
        x = end;
      }
    }
  });
  local_.begin_microbatch(a, b - a);
  if (local_.nodes() != maximal_subtrees(N, a, b))
    throw std::logic_error("instance tree: this micro-batch's subtrees differ from the layout's");
  return &local_;
}

void OwnerReduction::unit_backward_begins(int unit) {
  const int W = layout_.world();
  unit_ = unit;
  const auto& u = units_[static_cast<size_t>(unit)];
  const int64_t k = nodes_per_rank_[static_cast<size_t>(layout_.rank)];
  send_at_.assign(static_cast<size_t>(W) + 1, 0);
  for (int j = 0; j < W; ++j) send_at_[static_cast<size_t>(j) + 1] = send_at_[static_cast<size_t>(j)] + k * piece_floats(unit, j);
  send_floats_ = send_at_.back();
  if (!nccl_)
    send_.assign(static_cast<size_t>(send_floats_), 0.0f);  // past the capacity: a block of exactly this many
  else if (send_dev_.size() < send_floats_)
    send_dev_.reset(*ex_, send_floats_, "gradient subtrees of a unit, cut by owner (sent)");
  if (k > 0) local_.set_window(u.first, u.second);
}

void OwnerReduction::unit_backward_done(int unit) {
  if (unit != unit_) throw std::logic_error("OwnerReduction: unit " + std::to_string(unit) + " ended, not begun");
  const auto t0 = std::chrono::steady_clock::now();
  const int W = layout_.world();
  const auto& u = units_[static_cast<size_t>(unit)];
  const int64_t k = nodes_per_rank_[static_cast<size_t>(layout_.rank)];
  const int64_t mine = piece_floats(unit, layout_.rank), my_clen = chunk_floats(mine);
  const int64_t at = owner_piece(layout_, u, layout_.rank).first - layout_.optimizer_lo();
  // One all-to-all per chunk: the owner receives every rank's subtrees on one chunk of its piece at a time, so the
  // receive blocks are a chunk wide, not the piece.
  std::vector<int64_t> send_counts(static_cast<size_t>(W)), send_at(static_cast<size_t>(W)),
      recv_counts(static_cast<size_t>(W)), recv_at(static_cast<size_t>(W) + 1, 0);
  for (int c = 0; c < chunks_; ++c) {
    for (int j = 0; j < W; ++j) {
      const int64_t floats = piece_floats(unit, j), clen = chunk_floats(floats);
      const int64_t c_lo = std::min(floats, c * clen), len = std::min(clen, floats - c_lo);
      send_counts[static_cast<size_t>(j)] = k * len;
      send_at[static_cast<size_t>(j)] = send_at_[static_cast<size_t>(j)] + c_lo * k;
    }
    const int64_t my_lo = std::min(mine, c * my_clen), my_len = std::min(my_clen, mine - my_lo);
    for (int r = 0; r < W; ++r) {
      recv_counts[static_cast<size_t>(r)] = nodes_per_rank_[static_cast<size_t>(r)] * my_len;
      recv_at[static_cast<size_t>(r) + 1] = recv_at[static_cast<size_t>(r)] + recv_counts[static_cast<size_t>(r)];
    }
    recv_floats_ = std::max(recv_floats_, recv_at.back());
    const char* what = kOwnerExchange;
    if (nccl_) {
      if (recv_dev_.size() < recv_floats_)
        recv_dev_.reset(*ex_, recv_floats_, "every rank's gradient subtrees on a chunk of my slice (received)");
      ExchangePlan plan(W);
      for (int j = 0; j < W; ++j) {
        plan.send[static_cast<size_t>(j)].push_back({send_at[static_cast<size_t>(j)], send_counts[static_cast<size_t>(j)]});
        plan.recv[static_cast<size_t>(j)].push_back({recv_at[static_cast<size_t>(j)], recv_counts[static_cast<size_t>(j)]});
      }
      nccl_->exchange(send_dev_.data(), recv_dev_.data(), plan, what);
    } else {
      if (recv_.size() < static_cast<size_t>(recv_floats_)) {
        recv_.reserve(static_cast<size_t>(recv_floats_));  // exactly: growing by doubling would remake pinned memory
        recv_.resize(static_cast<size_t>(recv_floats_));
      }
      comm_->alltoallv(send_.data(), send_counts, recv_.data(), recv_counts, what, &send_at);
    }
    note_memory();
    // The owner plan's steps of this round, on this chunk of my slice of the unit: the same adds in the same order
    // as in one process.
    if (my_len == 0) continue;
    for (const OwnerFeed& f : feeds_) {
      const int64_t from = recv_at[static_cast<size_t>(f.rank)] + f.index * my_len;
      Buffer<float>& slot = owner_slots_[static_cast<size_t>(f.step.slot)];
      if (nccl_)
        ex_->copy(slot.data() + at + my_lo, recv_dev_.data() + from, static_cast<size_t>(my_len) * sizeof(float));
      else
        slot.upload(recv_.data() + from, my_len, at + my_lo);
      for (const TreePlan::Merge& mg : f.step.merges)
        ex_->tree_add(owner_slots_[static_cast<size_t>(mg.dst)].data() + at + my_lo,
                      owner_slots_[static_cast<size_t>(mg.src)].data() + at + my_lo, my_len);
    }
  }
  unit_ = -1;
  exchange_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void OwnerReduction::finish(float* shard_out) {
  const std::vector<TreeNode>& left = owner_plan_.stack();
  if (left.size() != 1 || left[0] != TreeNode{0, split_.global_instances})
    throw std::logic_error("OwnerReduction: the step's tree is not complete at the owner");
  const int64_t len = layout_.optimizer_hi() - layout_.optimizer_lo();
  if (len > 0) ex_->copy(shard_out, owner_slots_[0].data(), static_cast<size_t>(len) * sizeof(float));
}

void OwnerReduction::release() {
  local_.release();
  std::vector<Buffer<float>>().swap(owner_slots_);
  StagingVector<float>(send_.get_allocator()).swap(send_);
  StagingVector<float>(recv_.get_allocator()).swap(recv_);
  send_dev_.free(), recv_dev_.free();
  send_floats_ = recv_floats_ = 0;
}

void OwnerReduction::note_memory() {
  const int64_t len = layout_.optimizer_hi() - layout_.optimizer_lo();
  const int64_t local = local_.peak_slots() * local_.slot_floats();
  const int64_t owner = static_cast<int64_t>(owner_slots_.size()) * len;
  const int64_t send = send_floats_, recv = recv_floats_;
  peak_floats_ = std::max(peak_floats_, local + owner + send + recv);
  // One gradient value held: a local slot (a unit), an owner slot (the optimizer range), one block sent or received
  // (a unit's slice). The receive buffer holds every rank's blocks side by side; none of them is longer than a unit.
  int64_t block = 0;
  if (unit_ >= 0)
    for (int j = 0; j < layout_.world(); ++j) block = std::max(block, piece_floats(unit_, j));
  longest_buffer_ = std::max({longest_buffer_, local_.peak_slots() > 0 ? local_.slot_floats() : 0, len, block});
}

}  // namespace olmoref::dist
