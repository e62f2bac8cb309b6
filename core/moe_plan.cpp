#include "core/moe_plan.h"

#include <xxhash.h>

#include <algorithm>
#include <stdexcept>
#include <string>

namespace olmoref::moe {

std::pair<int64_t, int64_t> Plan::segment(int64_t e, int64_t row_begin, int64_t row_end) const {
  const auto b = row_of.begin();
  const auto first = std::lower_bound(b + expert_begin[static_cast<size_t>(e)], b + expert_begin[static_cast<size_t>(e) + 1], row_begin);
  const auto last = std::lower_bound(first, b + expert_begin[static_cast<size_t>(e) + 1], row_end);
  return {first - b, last - b};
}

Plan make_plan(const int32_t* top, int64_t R, int64_t k, int64_t E) {
  Plan p;
  p.R = R, p.k = k, p.E = E;
  p.expert_begin.assign(static_cast<size_t>(E) + 1, 0);
  for (int64_t i = 0; i < R * k; ++i) {
    if (top[i] < 0 || top[i] >= E)
      throw std::logic_error("moe::make_plan: expert index " + std::to_string(top[i]) + " outside [0, " +
                             std::to_string(E) + ")");
    ++p.expert_begin[static_cast<size_t>(top[i]) + 1];
  }
  for (int64_t e = 0; e < E; ++e) p.expert_begin[static_cast<size_t>(e) + 1] += p.expert_begin[static_cast<size_t>(e)];
  // A counting sort in slot order keeps rows ascending within each expert.
  std::vector<int64_t> next(p.expert_begin.begin(), p.expert_begin.end() - 1);
  p.row_of.resize(static_cast<size_t>(R * k));
  p.position.resize(static_cast<size_t>(R * k));
  for (int64_t r = 0; r < R; ++r)
    for (int64_t j = 0; j < k; ++j) {
      const int64_t pos = next[static_cast<size_t>(top[r * k + j])]++;
      p.row_of[static_cast<size_t>(pos)] = r;
      p.position[static_cast<size_t>(r * k + j)] = pos;
    }
  return p;
}

std::vector<int64_t> counts(const int32_t* top, int64_t row_begin, int64_t row_end, int64_t k, int64_t E) {
  std::vector<int64_t> c(static_cast<size_t>(E), 0);
  for (int64_t i = row_begin * k; i < row_end * k; ++i) ++c[static_cast<size_t>(top[i])];
  return c;
}

std::pair<int64_t, int64_t> ep_experts(int64_t E, int n, int i) {
  const int64_t base = E / n, extra = E % n;
  const int64_t first = i * base + std::min<int64_t>(i, extra);
  return {first, first + base + (i < extra ? 1 : 0)};
}

namespace {
// Walks the owner's rows in both orders at once: fn(source-major row, expert-major row, count) per block.
template <typename Fn>
void ep_blocks(const int64_t* counts, int n_src, int64_t E, int64_t first, int64_t last, Fn&& fn) {
  std::vector<int64_t> src_at(static_cast<size_t>(n_src) + 1, 0);  // where source s's rows start (source-major)
  for (int s = 0; s < n_src; ++s) {
    int64_t rows = 0;
    for (int64_t e = first; e < last; ++e) rows += counts[s * E + e];
    src_at[static_cast<size_t>(s) + 1] = src_at[static_cast<size_t>(s)] + rows;
  }
  int64_t expert_row = 0;
  for (int64_t e = first; e < last; ++e)
    for (int s = 0; s < n_src; ++s) {
      int64_t before = 0;  // source s's rows for experts first..e-1
      for (int64_t x = first; x < e; ++x) before += counts[s * E + x];
      const int64_t n = counts[s * E + e];
      fn(src_at[static_cast<size_t>(s)] + before, expert_row, n);
      expert_row += n;
    }
}
}  // namespace

void ep_to_expert_major(const float* source_major, const int64_t* counts, int n_src, int64_t E, int64_t first,
                        int64_t last, int64_t w, float* expert_major) {
  ep_blocks(counts, n_src, E, first, last, [&](int64_t s_row, int64_t e_row, int64_t n) {
    std::copy(source_major + s_row * w, source_major + (s_row + n) * w, expert_major + e_row * w);
  });
}

void ep_to_source_major(const float* expert_major, const int64_t* counts, int n_src, int64_t E, int64_t first,
                        int64_t last, int64_t w, float* source_major) {
  ep_blocks(counts, n_src, E, first, last, [&](int64_t s_row, int64_t e_row, int64_t n) {
    std::copy(expert_major + e_row * w, expert_major + (e_row + n) * w, source_major + s_row * w);
  });
}

uint64_t routing_digest(const int32_t* top, int64_t rows, int64_t k, uint64_t seed) {
  return XXH3_64bits_withSeed(top, static_cast<size_t>(rows * k) * sizeof(int32_t), seed);
}

}  // namespace olmoref::moe
