#include "dist/expert_placement.h"

#include <algorithm>
#include <stdexcept>

#include "core/moe_plan.h"

namespace olmoref::dist {

StatePlacement::StatePlacement(const Layout& layout, int ep, int64_t n_experts, std::vector<ExpertSpan> spans)
    : layout_(layout), ep_(ep), n_experts_(n_experts), spans_(std::move(spans)) {
  std::sort(spans_.begin(), spans_.end(), [](const ExpertSpan& x, const ExpertSpan& y) { return x.begin < y.begin; });
  for (size_t i = 1; i < spans_.size(); ++i)
    if (spans_[i].begin < spans_[i - 1].end) throw std::logic_error("expert placement: overlapping expert spans");
  const int S = layout_.dp_shard, R = layout_.dp_replicate;
  group_holds_.assign(static_cast<size_t>(R), std::vector<char>(static_cast<size_t>(n_experts_), ep_ <= 1 ? 1 : 0));
  if (ep_ > 1)
    for (int g = 0; g < R; ++g)
      for (int r = g * S; r < (g + 1) * S; ++r) {
        const auto [first, last] = moe::ep_experts(n_experts_, ep_, r % ep_);
        for (int64_t e = first; e < last; ++e) group_holds_[static_cast<size_t>(g)][static_cast<size_t>(e)] = 1;
      }
  for (int r = 0; r < layout_.world() && !drops_any_; ++r)
    drops_any_ = held_floats(r) < layout_.end(layout_.shard_index_of(r)) - layout_.begin(layout_.shard_index_of(r));
  // Every expert must be held somewhere, or its state would be lost.
  for (int64_t e = 0; e < n_experts_; ++e) {
    bool somewhere = false;
    for (int g = 0; g < R; ++g) somewhere = somewhere || group_holds(g, e);
    if (!somewhere) throw std::logic_error("expert placement: expert " + std::to_string(e) + " is held by no rank");
  }
}

std::vector<StatePlacement::Piece> StatePlacement::pieces(int64_t a, int64_t b) const {
  std::vector<Piece> out;
  // The first span ending after a.
  auto it = std::upper_bound(spans_.begin(), spans_.end(), a, [](int64_t x, const ExpertSpan& s) { return x < s.end; });
  int64_t at = a;
  for (; it != spans_.end() && it->begin < b; ++it) {
    if (it->begin > at) out.push_back({at, it->begin, -1});
    const int64_t lo = std::max(at, it->begin), hi = std::min(b, it->end);
    if (lo < hi) out.push_back({lo, hi, it->expert});
    at = std::max(at, hi);
  }
  if (at < b) out.push_back({at, b, -1});
  return out;
}

bool StatePlacement::group_holds(int replicate_index, int64_t expert) const {
  if (expert < 0) return true;
  return group_holds_[static_cast<size_t>(replicate_index)][static_cast<size_t>(expert)] != 0;
}

Ranges StatePlacement::held(int rank) const { return held_with(rank, 0, 0); }

Ranges StatePlacement::held_parameters(int rank) const {
  return held_with(rank, layout_.optimizer_begin(rank), layout_.optimizer_end(rank));
}

Ranges StatePlacement::held_with(int rank, int64_t o0, int64_t o1) const {
  const int s = layout_.shard_index_of(rank);
  Ranges out;
  auto add = [&out](int64_t a, int64_t b) {
    if (a >= b) return;
    if (!out.empty() && out.back().second == a)
      out.back().second = b;
    else
      out.push_back({a, b});
  };
  // Pieces are in order and [o0, o1) is one run, so cutting each piece at it keeps the output sorted.
  for (const Piece& p : pieces(layout_.begin(s), layout_.end(s))) {
    if (holds(rank, p.expert)) {
      add(p.begin, p.end);
      continue;
    }
    add(std::max(p.begin, o0), std::min(p.end, o1));
  }
  return out;
}

int64_t floats_in(const Ranges& ranges) {
  int64_t n = 0;
  for (const auto& [a, b] : ranges) n += b - a;
  return n;
}

int64_t StatePlacement::held_floats(int rank) const { return floats_in(held(rank)); }

int StatePlacement::source(int shard, int64_t expert) const {
  for (int g = 0; g < layout_.dp_replicate; ++g)
    if (group_holds(g, expert)) return g * layout_.dp_shard + shard;
  throw std::logic_error("expert placement: expert " + std::to_string(expert) + " is held by no rank");
}

std::vector<int64_t> StatePlacement::hashed_chunks(int rank) const {
  const int R = layout_.dp_replicate;
  const int64_t chunks = (layout_.total + kShardAlign - 1) / kShardAlign;
  if (static_cast<int64_t>(hasher_.size()) != chunks) {
    // Once per run: every chunk of every shard, so that ranks need not redo it each digest.
    hasher_.assign(static_cast<size_t>(chunks), 0);
    std::vector<int64_t> have(static_cast<size_t>(R));
    for (int64_t chunk = 0; chunk < chunks; ++chunk) {
      const int64_t c0 = chunk * kShardAlign, c1 = std::min(layout_.total, c0 + kShardAlign);
      std::fill(have.begin(), have.end(), 0);
      for (const Piece& p : pieces(c0, c1))
        for (int q = 0; q < R; ++q)
          if (group_holds(q, p.expert)) have[static_cast<size_t>(q)] += p.end - p.begin;
      const int64_t most = *std::max_element(have.begin(), have.end());
      std::vector<int> best;
      for (int q = 0; q < R; ++q)
        if (have[static_cast<size_t>(q)] == most) best.push_back(q);
      hasher_[static_cast<size_t>(chunk)] = best[static_cast<size_t>(chunk % static_cast<int64_t>(best.size()))];
    }
  }
  const int s = layout_.shard_index_of(rank), g = layout_.replicate_index_of(rank);
  std::vector<int64_t> out;
  for (int64_t c0 = layout_.begin(s); c0 < layout_.end(s); c0 += kShardAlign)
    if (hasher_[static_cast<size_t>(c0 / kShardAlign)] == g) out.push_back(c0 / kShardAlign);
  return out;
}

}  // namespace olmoref::dist
