#include "dist/gradient_owners.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <thread>

#if OLMOREF_HAVE_NCCL
#include "kernels/device_memory.h"
#endif

namespace olmoref::dist {

namespace {
int64_t longest_unit(const std::vector<std::pair<int64_t, int64_t>>& units) {
  int64_t n = 0;
  for (const auto& [a, b] : units) n = std::max(n, b - a);
  return n;
}
}  // namespace

OwnerReduction::OwnerReduction(Executor& ex, Comm& comm, const Layout& layout, const BatchSplit& split,
                               std::vector<std::pair<int64_t, int64_t>> units, int chunks, NcclComm* nccl,
                               ExchangeOverlap overlap)
    : ex_(&ex),
      comm_(&comm),
      nccl_(nccl),
      layout_(layout),
      split_(split),
      units_(std::move(units)),
      longest_unit_(longest_unit(units_)),
      local_(split.global_instances, layout.total, ex),
      owner_plan_(split.global_instances),
      spare_send_(StagingAllocator<float>(ex, "gradient subtrees of a unit, cut by owner (sent)")),
      spare_recv_(StagingAllocator<float>(ex, "every rank's gradient subtrees on my slice of a unit (received)")),
      chunks_(chunks > 0 ? chunks : exchange_chunks(layout, units_)),
      overlap_(overlap) {
  int64_t at = 0;
  for (const auto& [a, b] : units_) {
    if (a != at || b <= a) throw std::logic_error("OwnerReduction: the model's units do not tile the flat vector");
    at = b;
  }
  if (at != layout_.total) throw std::logic_error("OwnerReduction: the model's units do not cover the flat vector");
  local_.use_windows(longest_unit_);
  for (int u = 0; u < static_cast<int>(units_.size()); ++u)
    widest_mine_ = std::max(widest_mine_, piece_floats(u, layout_.rank));
  filling_.send = StagingVector<float>(spare_send_.get_allocator());
  flight_.send = StagingVector<float>(spare_send_.get_allocator());
  filling_.recv = StagingVector<float>(spare_recv_.get_allocator());
  flight_.recv = StagingVector<float>(spare_recv_.get_allocator());
  if (overlap_ != ExchangeOverlap::off && ex.name() != "cuda" && ex.name() != "cuda-host")
    throw std::logic_error("OwnerReduction: the overlapped exchange drives executor " + ex.name() +
                           " beside the main thread: only cuda and cuda-host are safe to share so");
  if (overlap_ != ExchangeOverlap::off && nccl_) {
    side_ = make_side_stream(ex, SideWork::nccl_groups);
  } else if (overlap_ != ExchangeOverlap::off) {
    side_ = make_side_stream(ex, SideWork::copies);
    staging_ = make_side_stream(ex, SideWork::copies);
    overlap_comm_ = comm.split(0, comm.rank());
    if (const char* d = std::getenv("OLMOREF_TEST_EXCHANGE_DELAY_US")) delay_us_ = std::atoll(d);
#if OLMOREF_HAVE_NCCL
    if (ex.name() == "cuda") device_ = kernels::current_device();
#endif
  }
}

OwnerReduction::~OwnerReduction() {
  // A thread in flight reads and writes flight_'s blocks, and its peers are in its all-to-all; so do NCCL's groups on
  // the side stream with the device blocks.
  if (in_flight_.valid()) in_flight_.wait();
  if (side_) side_->synchronize();
  if (staging_) staging_->synchronize();
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

void OwnerReduction::begin_step() {
  owner_plan_ = TreePlan(split_.global_instances);
  if (overlap_ == ExchangeOverlap::off) return;
  // The overlapped exchange adds into the owner slots while the main thread plans the next round: the slots the whole
  // step needs are made now (the owner plan walked ahead, as begin_round walks it), so no round grows them under it;
  // so are NCCL's device blocks, for the step's largest unit and round (a unit's groups and adds read them while the
  // next unit's backward runs).
  const int64_t N = split_.global_instances;
  TreePlan ahead(N);
  size_t slots = 0;
  int64_t most_sent = 0, most_received = 0;  // subtrees: this rank's in a round, every rank's in a round
  for (int64_t t = 0; t < split_.n_rounds(); ++t) {
    int64_t received = 0;
    for (int r = 0; r < layout_.world(); ++r)
      if (const int64_t m = split_.microbatch_of(r, t); m >= 0) {
        const auto [a, b] = split_.instances_of_microbatch(m);
        const std::vector<TreeNode> nodes = maximal_subtrees(N, a, b);
        for (const TreeNode& node : nodes) slots = std::max(slots, static_cast<size_t>(ahead.feed(node).slot) + 1);
        received += static_cast<int64_t>(nodes.size());
        if (r == layout_.rank) most_sent = std::max(most_sent, static_cast<int64_t>(nodes.size()));
      }
    most_received = std::max(most_received, received);
  }
  grow_owner_slots(slots);
  if (nccl_) {
    size_device_blocks(most_sent, most_received);
  } else if (const int64_t send = most_sent * longest_unit_; staging_ && send_dev_.size() < send) {
    // Over MPI the backward's block only: the one in flight is the host's.
    staging_->synchronize();  // a copy out of the block about to go
    send_dev_.reset(*ex_, send, "gradient subtrees of a unit, cut by owner (sent; copied to the host's)");
  }
}

void OwnerReduction::size_device_blocks(int64_t most_sent, int64_t most_received) {
  const int64_t send = most_sent * longest_unit_, recv = most_received * chunk_floats(widest_mine_);
  if (send_dev_.size() < send) send_dev_.reset(*ex_, send, "gradient subtrees of a unit, cut by owner (sent)");
  if (send_dev_flight_.size() < send)
    send_dev_flight_.reset(*ex_, send, "gradient subtrees of the unit before, cut by owner (sent, in flight)");
  if (recv_dev_.size() < recv)
    recv_dev_.reset(*ex_, recv, "every rank's gradient subtrees on a chunk of my slice (received)");
}

void OwnerReduction::grow_owner_slots(size_t slots) {
  const int64_t len = layout_.optimizer_hi() - layout_.optimizer_lo();
  if (owner_slots_.size() < slots) {
    if (in_flight_.valid() || device_in_flight_)
      throw std::logic_error("OwnerReduction: owner slots grown under the exchange in flight");
    owner_slots_.resize(slots);
  }
  for (size_t i = 0; i < owner_slots_.size(); ++i)
    if (len > 0 && owner_slots_[i].size() != len)
      owner_slots_[i].reset(*ex_, len, "owner instance-tree slot " + std::to_string(i) + " (the optimizer range)");
}

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
  size_t slots = 0;
  for (const OwnerFeed& f : feeds_) slots = std::max(slots, static_cast<size_t>(f.step.slot) + 1);
  grow_owner_slots(slots);

  const int64_t mine = split_.microbatch_of(layout_.rank, round);
  if (mine < 0) return nullptr;
  const auto [a, b] = split_.instances_of_microbatch(mine);
  // Subtree q of this micro-batch, tensor slice by tensor slice, into each owner's blocks of this unit's send:
  // owner j's region holds, chunk by chunk, the k subtrees' values of that chunk of its piece ([chunk][q][...]), so
  // each chunk's exchange sends one contiguous block to each owner.
  local_.reset_emitting(a, b, [this, W](int q, const float* src, int64_t off, int64_t n) {
    const auto& unit = units_[static_cast<size_t>(unit_)];
    const int64_t k = nodes_per_rank_[static_cast<size_t>(layout_.rank)];
    if (refill_waits_) {
      // The unit before's copy to the host reads the block this subtree refills: the executor waits for it here, not
      // when the unit begins, so that the copy runs under this unit's backward up to its first finished subtree.
      if (overlap_ != ExchangeOverlap::no_refill_wait) staging_->default_waits();
      refill_waits_ = false;
    }
    for (int j = 0; j < W; ++j) {
      const auto [lo, floats] = owner_piece(layout_, unit, j);
      const int64_t clen = chunk_floats(floats);
      for (int64_t x = std::max(off, lo), y = std::min(off + n, lo + floats); x < y;) {
        const int64_t c_lo = (x - lo) / clen * clen, len = std::min(clen, floats - c_lo);
        const int64_t end = std::min(y, lo + c_lo + len);
        const int64_t at = filling_.send_at[static_cast<size_t>(j)] + c_lo * k + q * len + (x - lo - c_lo);
        const size_t bytes = static_cast<size_t>(end - x) * sizeof(float);
        if (nccl_ || staging_)
          ex_->copy(send_dev_.data() + at, src + (x - off), bytes);
        else
          ex_->to_host(filling_.send.data() + at, src + (x - off), bytes);
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
  std::vector<int64_t>& send_at = filling_.send_at;
  send_at.assign(static_cast<size_t>(W) + 1, 0);
  for (int j = 0; j < W; ++j) send_at[static_cast<size_t>(j) + 1] = send_at[static_cast<size_t>(j)] + k * piece_floats(unit, j);
  const int64_t floats = send_at.back();
  if (staging_) {
    if (send_dev_.size() < floats) throw std::logic_error("OwnerReduction: the device send block is short (begin_step)");
  } else if (!nccl_) {
    // The spare block (the last unit's, or under overlap the one before it: the last is in flight), made at the step's
    // first unit as long as the longest unit's subtrees need, so later units grow nothing.
    if (filling_.send.capacity() == 0) filling_.send.swap(spare_send_);
    if (filling_.send.capacity() < static_cast<size_t>(floats)) {
      filling_.send = StagingVector<float>(spare_send_.get_allocator());
      filling_.send.reserve(static_cast<size_t>(k * longest_unit_));
    }
    filling_.send.assign(static_cast<size_t>(floats), 0.0f);
  } else if (send_dev_.size() < floats) {
    if (side_) throw std::logic_error("OwnerReduction: the send block grown under NCCL's overlap (size_device_blocks)");
    send_dev_.reset(*ex_, floats, "gradient subtrees of a unit, cut by owner (sent)");
  }
  if (k > 0) local_.set_window(u.first, u.second);
}

OwnerReduction::ChunkPlan OwnerReduction::chunk_plan(const UnitExchange& e, int c) const {
  const int W = layout_.world();
  const int64_t k = e.nodes_per_rank[static_cast<size_t>(layout_.rank)];
  ChunkPlan p;
  p.send_counts.resize(static_cast<size_t>(W)), p.send_at.resize(static_cast<size_t>(W));
  p.recv_counts.resize(static_cast<size_t>(W)), p.recv_at.resize(static_cast<size_t>(W));
  for (int j = 0; j < W; ++j) {
    const int64_t floats = piece_floats(e.unit, j), clen = chunk_floats(floats);
    const int64_t c_lo = std::min(floats, c * clen), len = std::min(clen, floats - c_lo);
    p.send_counts[static_cast<size_t>(j)] = k * len;
    p.send_at[static_cast<size_t>(j)] = e.send_at[static_cast<size_t>(j)] + c_lo * k;
  }
  const int64_t mine = piece_floats(e.unit, layout_.rank), my_clen = chunk_floats(mine);
  p.my_lo = std::min(mine, c * my_clen), p.my_len = std::min(my_clen, mine - p.my_lo);
  for (int r = 0; r < W; ++r) {
    p.recv_at[static_cast<size_t>(r)] = p.received;
    p.recv_counts[static_cast<size_t>(r)] = e.nodes_per_rank[static_cast<size_t>(r)] * p.my_len;
    p.received += p.recv_counts[static_cast<size_t>(r)];
  }
  return p;
}

// A chunk's all-to-all as NCCL's plan: one piece to and from each rank, at the chunk's offsets in the send block and
// the receive block.
ExchangePlan OwnerReduction::nccl_plan(const ChunkPlan& p) const {
  const int W = layout_.world();
  ExchangePlan plan(W);
  for (size_t j = 0; j < static_cast<size_t>(W); ++j) {
    plan.send[j].push_back({p.send_at[j], p.send_counts[j]});
    plan.recv[j].push_back({p.recv_at[j], p.recv_counts[j]});
  }
  return plan;
}

void OwnerReduction::owner_adds(const UnitExchange& e, int c, const float* recv, bool recv_on_device) {
  const ChunkPlan p = chunk_plan(e, c);
  if (p.my_len == 0) return;
  const int64_t at = owner_piece(layout_, units_[static_cast<size_t>(e.unit)], layout_.rank).first - layout_.optimizer_lo();
  // The same adds in the same order as in one process.
  for (const OwnerFeed& f : e.feeds) {
    const int64_t from = p.recv_at[static_cast<size_t>(f.rank)] + f.index * p.my_len;
    Buffer<float>& slot = owner_slots_[static_cast<size_t>(f.step.slot)];
    if (recv_on_device)
      ex_->copy(slot.data() + at + p.my_lo, recv + from, static_cast<size_t>(p.my_len) * sizeof(float));
    else
      slot.upload(recv + from, p.my_len, at + p.my_lo);
    for (const TreePlan::Merge& mg : f.step.merges)
      ex_->tree_add(owner_slots_[static_cast<size_t>(mg.dst)].data() + at + p.my_lo,
                    owner_slots_[static_cast<size_t>(mg.src)].data() + at + p.my_lo, p.my_len);
  }
}

void OwnerReduction::unit_backward_done(int unit) {
  if (unit != unit_) throw std::logic_error("OwnerReduction: unit " + std::to_string(unit) + " ended, not begun");
  const auto t0 = std::chrono::steady_clock::now();
  // Under overlap over MPI the thread of the unit before this one, so that its blocks serve the next unit (over NCCL
  // exchange_on_side orders the side stream's work itself).
  if (!nccl_) settle();
  UnitExchange e = std::move(filling_);
  filling_ = UnitExchange{};
  filling_.send = StagingVector<float>(spare_send_.get_allocator());
  filling_.recv = StagingVector<float>(spare_recv_.get_allocator());
  e.unit = unit;
  e.nodes_per_rank = nodes_per_rank_;
  e.feeds = feeds_;
  if (nccl_ && side_) {
    exchange_on_side(e);
  } else if (nccl_) {
    // One group per chunk, on the default stream, the adds queued after it.
    for (int c = 0; c < chunks_; ++c) {
      const ChunkPlan p = chunk_plan(e, c);
      if (recv_dev_.size() < p.received)
        recv_dev_.reset(*ex_, p.received, "every rank's gradient subtrees on a chunk of my slice (received)");
      nccl_->exchange(send_dev_.data(), recv_dev_.data(), nccl_plan(p), kOwnerExchange);
      note_memory(nullptr);
      owner_adds(e, c, recv_dev_.data(), true);
    }
  } else {
    // The receive block, one chunk wide: each chunk's adds follow its all-to-all.
    int64_t widest = 0;
    for (int c = 0; c < chunks_; ++c) widest = std::max(widest, chunk_plan(e, c).received);
    e.recv.swap(spare_recv_);
    if (e.recv.capacity() < static_cast<size_t>(widest)) {
      // Made as long as the round's widest chunk of a unit needs, so later units grow nothing: page-locked memory is
      // slow to make.
      int64_t subtrees = 0;
      for (const int n : e.nodes_per_rank) subtrees += n;
      e.recv = StagingVector<float>(spare_recv_.get_allocator());
      e.recv.reserve(static_cast<size_t>(std::max(widest, subtrees * chunk_floats(widest_mine_))));
    }
    e.recv.resize(static_cast<size_t>(widest));
    if (overlap_ != ExchangeOverlap::off) {
      // The host's block, which the device's is copied to: the spare, made at the step's first unit as long as the
      // longest unit's subtrees need, so later units grow nothing.
      const int64_t floats = e.send_at.back();
      e.send.swap(spare_send_);
      if (e.send.capacity() < static_cast<size_t>(floats)) {
        e.send = StagingVector<float>(spare_send_.get_allocator());
        e.send.reserve(static_cast<size_t>(std::max(floats, send_dev_.size())));
      }
      // Kept at its longest (resize would write zeros the copy overwrites): the all-to-alls send by offsets.
      if (e.send.size() < static_cast<size_t>(floats)) e.send.resize(static_cast<size_t>(floats));
      flight_ = std::move(e);
      note_memory(nullptr);
      // After the backward's copies into the device block (on the default stream: queued, and on a device maybe not
      // yet run), beside the next unit's backward.
      staging_->wait_for_default();
      if (floats > 0)
        staging_->copy(flight_.send.data(), send_dev_.data(), static_cast<size_t>(floats) * sizeof(float));
      refill_waits_ = true;
      // The executor's ops of the adds (the blocks' copies to the device and the tree adds) run on a side stream of
      // their own, beside the main thread's on the default stream, and touch only this unit's slice of the owner
      // slots, which nothing else reads before settle(). They start after what the executor has queued so far (the
      // owner slots' zeroing at the step's start among it): a device's side stream is not ordered otherwise.
      side_->wait_for_default();
      in_flight_ = std::async(std::launch::async, [this, geometry = geometry_of(flight_)] {
#if OLMOREF_HAVE_NCCL
        if (device_ >= 0) kernels::use_device(device_);  // a new thread starts on device 0
#endif
        if (delay_us_ > 0) std::this_thread::sleep_for(std::chrono::microseconds(delay_us_));
        if (overlap_ != ExchangeOverlap::no_staging_wait) staging_->synchronize();  // the subtrees, on the host
        const float* recv = flight_.recv.data();
        for (int c = 0; c < chunks_; ++c) {
          const ChunkPlan p = chunk_plan(flight_, c);
          overlap_comm_->alltoallv(flight_.send.data(), p.send_counts, flight_.recv.data(), p.recv_counts,
                                   kOwnerExchange, &p.send_at);
          side_->run([this, geometry, c, recv] { owner_adds(*geometry, c, recv, false); });
          // The next chunk's all-to-all refills the receive block they read (but in the TEST ONLY control).
          if (overlap_ != ExchangeOverlap::no_stream_wait) side_->synchronize();
        }
      });
    } else {
      for (int c = 0; c < chunks_; ++c) {
        const ChunkPlan p = chunk_plan(e, c);
        comm_->alltoallv(e.send.data(), p.send_counts, e.recv.data(), p.recv_counts, kOwnerExchange, &p.send_at);
        note_memory(&e);
        owner_adds(e, c, e.recv.data(), false);
      }
      spare_send_.swap(e.send), spare_recv_.swap(e.recv);
    }
  }
  unit_ = -1;
  exchange_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The adds' geometry of a unit's exchange, for the side stream's work, which may outlive the members (the next round
// replans; under the TEST ONLY no_stream_wait nothing waits for that work).
std::shared_ptr<const OwnerReduction::UnitExchange> OwnerReduction::geometry_of(const UnitExchange& e) {
  auto g = std::make_shared<UnitExchange>();
  g->unit = e.unit, g->nodes_per_rank = e.nodes_per_rank, g->feeds = e.feeds, g->send_at = e.send_at;
  return g;
}

void OwnerReduction::exchange_on_side(const UnitExchange& e) {
  // The unit before's groups and adds read the other send block, which the next unit's backward fills: the executor
  // waits for them first (but in the TEST ONLY control).
  if (device_in_flight_ && overlap_ != ExchangeOverlap::no_stream_wait) side_->default_waits();
  // This unit's work starts after everything the executor has queued: the backward's copies into its send block.
  side_->wait_for_default();
  // Chunk by chunk, a group and then the owners' adds, in stream order: the next chunk's group overwrites the receive
  // block only after the adds that read it.
  const std::shared_ptr<const UnitExchange> geometry = geometry_of(e);
  for (int c = 0; c < chunks_; ++c) {
    const ChunkPlan p = chunk_plan(*geometry, c);
    if (p.received > recv_dev_.size())
      throw std::logic_error("OwnerReduction: the receive block is shorter than a chunk (size_device_blocks)");
    nccl_->exchange(send_dev_.data(), recv_dev_.data(), nccl_plan(p), kOwnerExchange, side_->stream());
    side_->run([this, geometry, c] { owner_adds(*geometry, c, recv_dev_.data(), true); });
  }
  device_in_flight_ = true;
  // The next unit's subtrees go to the other block while this unit's groups read this one.
  std::swap(send_dev_, send_dev_flight_);
  note_memory(nullptr);
}

void OwnerReduction::settle() {
  if (device_in_flight_) {
    // NCCL's groups and the owners' adds of the unit in flight: the executor waits for them (but in the TEST ONLY
    // control).
    if (overlap_ != ExchangeOverlap::no_stream_wait) side_->default_waits();
    device_in_flight_ = false;
    return;
  }
  if (!in_flight_.valid()) return;
  in_flight_.get();  // rethrows what the thread threw (which waited for its side stream, but in the TEST ONLY control)
  spare_send_.swap(flight_.send), spare_recv_.swap(flight_.recv);
  flight_.send.clear(), flight_.recv.clear();
  flight_.unit = -1;
}

void OwnerReduction::finish(float* shard_out) {
  const auto t0 = std::chrono::steady_clock::now();
  if (overlap_ != ExchangeOverlap::no_wait) settle();  // the last unit's adds
  exchange_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::vector<TreeNode>& left = owner_plan_.stack();
  if (left.size() != 1 || left[0] != TreeNode{0, split_.global_instances})
    throw std::logic_error("OwnerReduction: the step's tree is not complete at the owner");
  const int64_t len = layout_.optimizer_hi() - layout_.optimizer_lo();
  if (len > 0) ex_->copy(shard_out, owner_slots_[0].data(), static_cast<size_t>(len) * sizeof(float));
  settle();
}

void OwnerReduction::release() {
  settle();
  if (side_) side_->synchronize();  // the side stream's groups and adds read and write what goes below
  if (staging_) staging_->synchronize();  // and its copies to the host read the device send block
  local_.release();
  std::vector<Buffer<float>>().swap(owner_slots_);
  for (StagingVector<float>* v : {&filling_.send, &spare_send_, &flight_.send})
    StagingVector<float>(v->get_allocator()).swap(*v);
  for (StagingVector<float>* v : {&filling_.recv, &spare_recv_, &flight_.recv})
    StagingVector<float>(v->get_allocator()).swap(*v);
  send_dev_.free(), recv_dev_.free(), send_dev_flight_.free();
}

void OwnerReduction::note_memory(const UnitExchange* in_hand) {
  const int64_t len = layout_.optimizer_hi() - layout_.optimizer_lo();
  const int64_t local = local_.peak_slots() * local_.slot_floats();
  const int64_t owner = static_cast<int64_t>(owner_slots_.size()) * len;
  // The exchange's blocks as made (their capacity): NCCL's on the device, else the staging, wherever it is now.
  int64_t send = send_dev_.size() + send_dev_flight_.size(), recv = recv_dev_.size();
  for (const UnitExchange* e : std::initializer_list<const UnitExchange*>{&filling_, &flight_, in_hand})
    if (e) send += static_cast<int64_t>(e->send.capacity()), recv += static_cast<int64_t>(e->recv.capacity());
  send += static_cast<int64_t>(spare_send_.capacity()), recv += static_cast<int64_t>(spare_recv_.capacity());
  peak_floats_ = std::max(peak_floats_, local + owner + send + recv);
  // One gradient value held: a local slot (a unit), an owner slot (the optimizer range), one block sent or received
  // (a unit's slice). The receive buffer holds every rank's blocks side by side; none of them is longer than a unit.
  int64_t block = 0;
  if (unit_ >= 0)
    for (int j = 0; j < layout_.world(); ++j) block = std::max(block, piece_floats(unit_, j));
  longest_buffer_ = std::max({longest_buffer_, local_.peak_slots() > 0 ? local_.slot_floats() : 0, len, block});
}

}  // namespace olmoref::dist
