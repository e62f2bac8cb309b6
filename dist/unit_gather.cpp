#include "dist/unit_gather.h"

#include <algorithm>
#include <cstring>
#include <future>
#include <stdexcept>
#include <utility>

namespace olmoref::dist {

UnitGather::UnitGather(const Olmo3& model, const Layout& layout, int ep, Executor& ex, const Buffer<float>& params,
                       Comm& shard_group, Prefetch prefetch, NcclComm* nccl)
    : model_(model), layout_(layout), ep_(ep), ex_(ex), params_(params), shard_group_(shard_group),
      spare_send_(StagingAllocator<float>(ex, "FSDP unit gather: my part of the unit (sent)")),
      spare_recv_(StagingAllocator<float>(ex, "FSDP unit gather: the unit's pieces (received)")),
      prefetch_(prefetch), nccl_(nccl), land_in_thread_(prefetch != Prefetch::off && !nccl && ex.name() != "cpu") {
  if (prefetch_ != Prefetch::off && !nccl_) prefetch_comm_ = shard_group.split(0, shard_group.rank());
  if (!nccl_)
    for (int u = 0; u < model_.n_units(); ++u) {
      const Pieces p = pieces_of(u);
      most_sent_ = std::max(most_sent_, send_block(p).total);
      int64_t received = 0;
      for (const Ranges& from : p.recv)
        for (const auto& [p0, p1] : from) received += p1 - p0;
      most_received_ = std::max(most_received_, received);
    }
  // On the device the prefetch runs on a stream of its own (NCCL's groups, or the staged prefetch's copies). The host
  // execution's staged prefetch copies on a worker thread in its place, and NCCL's prefetch queues its groups on a
  // stream of the tests' stand-in NCCL, which runs them on a worker thread.
  if (prefetch_ != Prefetch::off && (ex.name() == "cuda" || ex.name() == "cuda-host"))
    side_ = make_side_stream(ex, nccl_ ? SideWork::nccl_groups : SideWork::copies);
}

UnitGather::~UnitGather() {
  // A gather in flight finishes first: its thread reads and writes vectors the future owns, and its peers are in it;
  // then its copies on the side stream.
  if (next_.valid()) next_.wait();
  side_wait();
}

void UnitGather::side_wait() {
  if (side_) side_->synchronize();
}

// The unit's range [a, b) gathered within the replicate group by one all-to-all: shard s sends rank q the pieces
// of its part that q reads (Olmo3::unit_reads: the whole unit, except that under expert parallelism a rank
// reads only its own experts). Exact pieces, no padding; what a rank never reads of the unit buffer is never
// written. As flat ranges: send[q] the pieces of my part q reads, recv[s] the pieces of s's part I read.
UnitGather::Pieces UnitGather::pieces_of(int unit) const {
  const auto [a, b] = model_.unit_range(unit);
  const Layout& L = layout_;
  const int S = L.dp_shard, me = L.shard_index();
  std::vector<Ranges> reads(static_cast<size_t>(S));
  for (int q = 0; q < S; ++q) {
    const int world_rank = L.replicate_index() * S + q;
    reads[static_cast<size_t>(q)] = model_.unit_reads(unit, ep_, world_rank % ep_);
  }
  // The pieces of shard s's part of the unit that rank q reads, in order.
  auto pieces = [&](int s, int q) {
    const int64_t lo = std::max(a, L.begin(s)), hi = std::min(b, L.end(s));
    Ranges out;
    for (const auto& [r0, r1] : reads[static_cast<size_t>(q)])
      if (std::max(lo, r0) < std::min(hi, r1)) out.push_back({std::max(lo, r0), std::min(hi, r1)});
    return out;
  };
  Pieces p;
  for (int q = 0; q < S; ++q) {
    p.send.push_back(pieces(me, q));
    p.recv.push_back(pieces(q, me));
  }
  return p;
}

UnitGather::SendBlock UnitGather::send_block(const Pieces& p) {
  SendBlock b;
  for (const Ranges& mine : p.send) {
    int64_t n = 0;
    for (const auto& [p0, p1] : mine) n += p1 - p0;
    b.counts.push_back(n);
    const auto same = std::find(b.lists.begin(), b.lists.end(), mine);
    if (same != b.lists.end()) {
      b.at.push_back(b.lists_at[static_cast<size_t>(same - b.lists.begin())]);
      continue;
    }
    b.at.push_back(b.total);
    b.lists.push_back(mine);
    b.lists_at.push_back(b.total);
    b.total += n;
  }
  return b;
}

// The MPI transport's gather: my pieces staged on the host (the executor's reads), for one all-to-all. The staging is
// made once, as long as the longest unit's blocks, and recycled from gather to gather (page-locked memory is slow to
// make, and a vector grown on the way would remake it).
UnitGather::Gather UnitGather::pack(int unit, bool on_side) {
  const Pieces p = pieces_of(unit);
  const int S = layout_.dp_shard;
  Gather g;
  g.unit = unit, g.send = std::move(spare_send_), g.recv = std::move(spare_recv_);
  g.send.clear(), g.recv.clear();
  g.send.reserve(static_cast<size_t>(most_sent_)), g.recv.reserve(static_cast<size_t>(most_received_));
  SendBlock b = send_block(p);
  g.send_counts = std::move(b.counts), g.send_at = std::move(b.at);
  g.send.resize(static_cast<size_t>(b.total));
  for (size_t d = 0; d < b.lists.size(); ++d) {
    int64_t at = b.lists_at[d];
    for (const auto& [p0, p1] : b.lists[d]) {
      float* dst = g.send.data() + at;
      const float* src = params_.data() + (p0 - layout_.lo());
      const size_t bytes = static_cast<size_t>(p1 - p0) * sizeof(float);
      if (on_side && side_)
        side_->copy(dst, src, bytes);
      else
        ex_.to_host(dst, src, bytes);
      at += p1 - p0;
    }
  }
  g.recv_counts.assign(static_cast<size_t>(S), 0);
  int64_t total = 0;
  for (int s = 0; s < S; ++s)
    for (const auto& [p0, p1] : p.recv[static_cast<size_t>(s)]) {
      g.recv_counts[static_cast<size_t>(s)] += p1 - p0;
      g.recv_pieces.push_back({p0, p1});
      total += p1 - p0;
    }
  g.recv.resize(static_cast<size_t>(total));
  return g;
}

void UnitGather::recycle(Gather& g) {
  spare_send_ = std::move(g.send);
  spare_recv_ = std::move(g.recv);
}

void UnitGather::release_staging() {
  if (next_.valid()) {
    Gather dropped = next_.get();  // its peers are in it too: every rank's walk announced the same unit
  }
  side_wait();  // the staged prefetch's copies, which read the staging
  spare_send_ = StagingVector<float>(spare_send_.get_allocator());
  spare_recv_ = StagingVector<float>(spare_recv_.get_allocator());
}

// The NCCL transport's gather: the same pieces, from the parameter shard straight into a unit buffer, on `stream`
// (nullptr: the default stream).
const float* UnitGather::gather_on_device(int unit, Buffer<float>& into, void* stream) {
  grow_unit_buffer();
  const int64_t a = model_.unit_range(unit).first;
  const Pieces p = pieces_of(unit);
  ExchangePlan plan(layout_.dp_shard);
  for (size_t q = 0; q < p.send.size(); ++q) {
    for (const auto& [p0, p1] : p.send[q]) plan.send[q].push_back({p0 - layout_.lo(), p1 - p0});
    for (const auto& [p0, p1] : p.recv[q]) plan.recv[q].push_back({p0 - a, p1 - p0});
  }
  nccl_->exchange(params_.data(), into.data(), plan, kUnitGather, stream);
  return unit_at_flat_offsets(into.data(), a);
}

void UnitGather::grow_unit_buffer() {
  // Allocated by the first step, not with the trainer: a process that only resumes (or a tool) never holds it.
  if (unit_.size() == 0) unit_.reset(ex_, model_.largest_unit(), "FSDP unit buffer (the unit in use, gathered)");
  // NCCL's prefetch and the staged one gather the next unit into a second buffer while the model reads the first.
  if (((nccl_ && prefetch_ != Prefetch::off) || land_in_thread_) && next_unit_.size() == 0)
    next_unit_.reset(ex_, model_.largest_unit(), "FSDP unit buffer (the next unit, prefetched)");
}

void UnitGather::land(Gather& g, Executor& ex, SideStream* side) {
  const float* next = g.recv.data();
  for (const auto& [p0, p1] : g.recv_pieces) {
    float* dst = g.land + (p0 - g.land_at);
    const size_t bytes = static_cast<size_t>(p1 - p0) * sizeof(float);
    if (side)
      side->copy(dst, next, bytes);
    else
      ex.to_device(dst, next, bytes);
    next += p1 - p0;
  }
}

void UnitGather::exchange(Gather& g, Comm& comm) {
  const float none = 0.0f;
  comm.alltoallv(g.send.empty() ? &none : g.send.data(), g.send_counts, g.recv.data(), g.recv_counts,
                 kUnitGather, &g.send_at);
}

// The received pieces, back to back in the order pack listed them, into the unit buffer at their offsets. The copies
// are synchronous (from page-locked memory too), so the staging is free again when they return.
const float* UnitGather::unpack(Gather& g) {
  grow_unit_buffer();
  const int64_t a = model_.unit_range(g.unit).first;
  const float* next = g.recv.data();
  for (const auto& [p0, p1] : g.recv_pieces) {
    unit_.upload(next, p1 - p0, p0 - a);
    next += p1 - p0;
  }
  recycle(g);
  return unit_at_flat_offsets(unit_.data(), a);
}

const float* UnitGather::acquire(int unit) {
  if (next_.valid()) {
    Gather g = next_.get();  // rethrows what the thread threw
    if (g.unit == unit) {
      ++hits_;
      if (!land_in_thread_) return unpack(g);
      // The thread landed it in next_unit_ (on a device its copies queued on the side stream, which the model's work
      // now waits for); the staging is free again once the side stream has read it, which the next user of the
      // staging waits for (the next prefetch queues behind on the side stream, a gather on the spot waits).
      if (side_ && prefetch_ != Prefetch::no_stream_wait) side_->default_waits();
      recycle(g);
      std::swap(unit_, next_unit_);
      return unit_at_flat_offsets(unit_.data(), model_.unit_range(unit).first);
    }
    // Announced but not asked for: every rank's walk is the same, so every rank drops it alike.
    recycle(g);
  }
  if (nccl_) return acquire_on_device(unit);
  ++misses_;
  side_wait();  // a staged prefetch's copies may still read the staging
  Gather g = pack(unit);
  exchange(g, shard_group_);
  return unpack(g);
}

// The NCCL transport: the announced unit's gather was queued into next_unit_ (on the side stream on a device); the
// default stream waits for it either way, so that buffer is whole before the model or the next prefetch touches it.
const float* UnitGather::acquire_on_device(int unit) {
  if (pending_unit_ >= 0) {
    if (side_ && prefetch_ != Prefetch::no_stream_wait) side_->default_waits();
    const int got = std::exchange(pending_unit_, -1);
    if (got == unit) {
      ++hits_;
      std::swap(unit_, next_unit_);
      return unit_at_flat_offsets(unit_.data(), model_.unit_range(unit).first);
    }
  }
  ++misses_;
  // On the default stream, after the kernels that read the previous unit from this buffer.
  return gather_on_device(unit, unit_, nullptr);
}

void UnitGather::prefetch(int unit) {
  if (nccl_ && prefetch_ != Prefetch::off) {
    const int target = prefetch_ == Prefetch::other_unit ? (unit + 1) % model_.n_units() : unit;
    grow_unit_buffer();
    void* stream = nullptr;
    // next_unit_ was last read by the kernels of the unit before the one just acquired, all queued by now: the side
    // stream starts after them (and after the optimizer's writes of the shard).
    if (side_) side_->wait_for_default(), stream = side_->stream();
    gather_on_device(target, next_unit_, stream);
    pending_unit_ = target;
    return;
  }
  if (!prefetch_comm_) return;
  if (next_.valid()) {  // one unit ahead at most (an announcement not yet acquired is dropped here)
    Gather dropped = next_.get();
    recycle(dropped);
  }
  const int target = prefetch_ == Prefetch::other_unit ? (unit + 1) % model_.n_units() : unit;
  Comm* comm = prefetch_comm_.get();
  if (!land_in_thread_) {
    Gather g = pack(target);
    next_ = std::async(std::launch::async, [g = std::move(g), comm]() mutable {
      exchange(g, *comm);
      return std::move(g);
    });
    return;
  }
  grow_unit_buffer();
  // On the side stream: the pieces' copies to the host after everything queued so far (the optimizer's writes of the
  // shard; the kernels that last read next_unit_, the unit before the one just acquired), the landing after them.
  if (side_) side_->wait_for_default();
  Gather g = pack(target, true);
  g.land = next_unit_.data(), g.land_at = model_.unit_range(target).first;
  next_ = std::async(std::launch::async, [g = std::move(g), comm, ex = &ex_, side = side_.get()]() mutable {
    if (side) side->enter_thread(), side->synchronize();  // the pieces are on the host
    exchange(g, *comm);
    land(g, *ex, side);
    return std::move(g);
  });
}

void CommExpertExchange::allgather(const int64_t* mine, int64_t n, int64_t* all) {
  group_.allgather(mine, static_cast<size_t>(n) * sizeof(int64_t), all, "all-gather expert row counts");
}

void CommExpertExchange::alltoallv(const float* send, const std::vector<int64_t>& send_counts, float* recv,
                                   const std::vector<int64_t>& recv_counts) {
  group_.alltoallv(send, send_counts, recv, recv_counts, kExpertRows);
}

void CommExpertExchange::move(const std::vector<const float*>& src, const std::vector<float*>& dst,
                              const ExchangePlan& plan) {
  if (!nccl_) ExpertExchange::move(src, dst, plan);
  nccl_->exchange(src, dst, plan, kExpertRows);
}

void CommContextExchange::allgather(const void* mine, size_t bytes, void* all) {
  group_.allgather(mine, bytes, all, kContextGather);
}

void CommContextExchange::send_next(const float* partial, int64_t n) {
  group_.send(partial, static_cast<size_t>(n) * sizeof(float), group_.rank() + 1, kContextChain);
}

void CommContextExchange::recv_prev(float* partial, int64_t n) {
  group_.recv(partial, static_cast<size_t>(n) * sizeof(float), group_.rank() - 1,
              "context parallelism: a gradient chain from the previous rank");
}

void CommContextExchange::move_positions(const std::vector<const float*>& src, const std::vector<float*>& dst,
                                         const ExchangePlan& plan) {
  if (!nccl_) ContextExchange::move_positions(src, dst, plan);
  nccl_->exchange(src, dst, plan, kContextGather);
}

// A chain's partial as a one-piece exchange with the neighbour: NCCL pairs the i-th send to a peer with its i-th
// receive from us, as MPI pairs the messages of one pair in order.
void CommContextExchange::send_next_on_device(const float* partial, int64_t n) {
  if (!nccl_) ContextExchange::send_next_on_device(partial, n);
  ExchangePlan plan(group_.size());
  plan.send[static_cast<size_t>(group_.rank() + 1)].push_back({0, n});
  nccl_->exchange(partial, nullptr, plan, kContextChain);
}

void CommContextExchange::recv_prev_on_device(float* partial, int64_t n) {
  if (!nccl_) ContextExchange::recv_prev_on_device(partial, n);
  ExchangePlan plan(group_.size());
  plan.recv[static_cast<size_t>(group_.rank() - 1)].push_back({0, n});
  nccl_->exchange(nullptr, partial, plan, kContextChain);
}

}  // namespace olmoref::dist
