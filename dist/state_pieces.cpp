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

std::vector<float> collect_pieces(const ShardedState& s, const Buffer<float>& state, const std::vector<Ranges>& want,
                                  uint64_t& pieces_sent) {
  const Layout& layout = s.layout;
  const StatePlacement& placement = s.placement;
  const int W = layout.world(), me = layout.rank;
  const int64_t lo = layout.lo();
  // Every rank's wanted pieces with who serves each (the rank itself when it holds it): known to all from the layout.
  struct Served {
    StatePlacement::Piece piece;
    int from;
  };
  auto served = [&](int q) {
    std::vector<Served> out;
    const int shard = layout.shard_index_of(q);
    for (const auto& [a, b] : want[static_cast<size_t>(q)])
      for (const StatePlacement::Piece& p : placement.pieces(a, b))
        out.push_back({p, placement.holds(q, p.expert) ? q : placement.source(shard, p.expert)});
    return out;
  };
  std::vector<int64_t> send_counts(static_cast<size_t>(W), 0), recv_counts(static_cast<size_t>(W), 0);
  std::vector<float> send;
  for (int q = 0; q < W; ++q) {
    if (q == me) continue;
    for (const Served& x : served(q)) {
      if (x.from != me) continue;
      const int64_t n = x.piece.end - x.piece.begin;
      const size_t at = send.size();
      send.resize(at + static_cast<size_t>(n));
      state.download(send.data() + at, n, x.piece.begin - lo);
      send_counts[static_cast<size_t>(q)] += n;
    }
  }
  const std::vector<Served> mine = served(me);
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
  std::vector<float> out;
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
