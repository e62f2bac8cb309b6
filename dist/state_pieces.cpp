#include "dist/state_pieces.h"

#include <algorithm>

namespace olmoref::dist {

std::vector<float> host_copy(const Buffer<float>& b) {
  std::vector<float> out(static_cast<size_t>(b.size()));
  if (b.size() > 0) b.download(out.data(), b.size());
  return out;
}

const float* host_view(const Buffer<float>& b, const Executor& ex, std::vector<float>& staging) {
  if (ex.host_memory()) return b.data();
  staging = host_copy(b);
  return staging.data();
}

int64_t span_begin(const Layout& layout, Span span, int rank) {
  return span == Span::shard ? layout.begin(layout.shard_index_of(rank)) : layout.optimizer_begin(rank);
}

int64_t span_end(const Layout& layout, Span span, int rank) {
  return span == Span::shard ? layout.end(layout.shard_index_of(rank)) : layout.optimizer_end(rank);
}

bool holds_whole_shards(const ShardedState& s, Span span) {
  return span == Span::shard ? !s.placement.drops_any() : s.layout.dp_replicate == 1;
}

namespace {

// A wanted piece and the rank that serves it (the wanter itself when it holds it).
struct Served {
  StatePlacement::Piece piece;
  int from;
};

// Rank q's wanted pieces with who serves each: known to every rank from the layout alone.
std::vector<Served> served(const ShardedState& s, Span span, const Ranges& want, int q) {
  const Layout& layout = s.layout;
  const StatePlacement& placement = s.placement;
  const int shard = layout.shard_index_of(q);
  const int64_t base = layout.begin(shard), part = layout.optimizer_stride();
  std::vector<Served> out;
  for (const auto& [a, b] : want)
    for (const StatePlacement::Piece& p : placement.pieces(a, b)) {
      if (span == Span::shard) {
        out.push_back({p, placement.holds(q, p.expert) ? q : placement.source(shard, p.expert)});
        continue;
      }
      // Optimizer ranges split a shard among its replicas, each holding all of its own: cut at their bounds.
      for (int64_t x = p.begin; x < p.end;) {
        const int64_t replica = (x - base) / part, y = std::min(p.end, base + (replica + 1) * part);
        out.push_back({{x, y, p.expert}, layout.rank_of(shard, static_cast<int>(replica))});
        x = y;
      }
    }
  return out;
}

}  // namespace

std::vector<float> collect_pieces(const ShardedState& s, const Buffer<float>& state, Span span,
                                  const std::vector<Ranges>& want, uint64_t& pieces_sent) {
  const Layout& layout = s.layout;
  const int W = layout.world(), me = layout.rank;
  const int64_t lo = span_begin(layout, span, me);
  std::vector<int64_t> send_counts(static_cast<size_t>(W), 0), recv_counts(static_cast<size_t>(W), 0);
  std::vector<float> send;
  for (int q = 0; q < W; ++q) {
    if (q == me) continue;
    for (const Served& x : served(s, span, want[static_cast<size_t>(q)], q)) {
      if (x.from != me) continue;
      const int64_t n = x.piece.end - x.piece.begin;
      const size_t at = send.size();
      send.resize(at + static_cast<size_t>(n));
      state.download(send.data() + at, n, x.piece.begin - lo);
      send_counts[static_cast<size_t>(q)] += n;
    }
  }
  const std::vector<Served> mine = served(s, span, want[static_cast<size_t>(me)], me);
  for (const Served& x : mine)
    if (x.from != me) recv_counts[static_cast<size_t>(x.from)] += x.piece.end - x.piece.begin;
  std::vector<int64_t> recv_at(static_cast<size_t>(W), 0);
  int64_t recv_total = 0;
  for (int j = 0; j < W; ++j) recv_at[static_cast<size_t>(j)] = recv_total, recv_total += recv_counts[static_cast<size_t>(j)];
  std::vector<float> recv(static_cast<size_t>(recv_total));
  const float none = 0.0f;
  s.world.alltoallv(send.empty() ? &none : send.data(), send_counts, recv.empty() ? nullptr : recv.data(), recv_counts,
                    "all-to-all of state pieces for a digest or checkpoint");
  pieces_sent += send.size() * sizeof(float);
  // Sized once: growing it piece by piece would hold the old and the new copy at once (a shard's worth at 7B).
  std::vector<float> out;
  size_t wanted = 0;
  for (const Served& x : mine) wanted += static_cast<size_t>(x.piece.end - x.piece.begin);
  out.reserve(wanted);
  for (const Served& x : mine) {
    const int64_t n = x.piece.end - x.piece.begin;
    const size_t at = out.size();
    out.resize(at + static_cast<size_t>(n));
    if (x.from == me) {
      state.download(out.data() + at, n, x.piece.begin - lo);
    } else {
      int64_t& next = recv_at[static_cast<size_t>(x.from)];
      std::copy(recv.begin() + next, recv.begin() + next + n, out.begin() + static_cast<std::ptrdiff_t>(at));
      next += n;
    }
  }
  return out;
}

}  // namespace olmoref::dist
