#include "data/leak_match.h"

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <string>

namespace olmoref::data {

int64_t HoldoutText::doc_of(int64_t pos) const {
  const auto it = std::upper_bound(begin.begin(), begin.end(), pos);
  return static_cast<int64_t>(it - begin.begin()) - 1;
}

SeedIndex::SeedIndex(const HoldoutText& text, int k, NgramSet::Kind kind, double bloom_bits_per_key, int max_postings)
    : hasher_(k),
      set_(kind, [&] {
        int64_t n = 0;
        for (int64_t d = 0; d < text.documents(); ++d) n += std::max<int64_t>(0, text.begin[d + 1] - text.begin[d] - k + 1);
        return std::max<int64_t>(n, 1);
      }(), bloom_bits_per_key),
      max_postings_(max_postings) {
  if (text.tokens.size() >= (uint64_t{1} << 32))
    throw std::invalid_argument("leakcheck: the holdout has " + std::to_string(text.tokens.size()) +
                                " tokens; the seed index addresses at most 2^32 - 1 (split the holdout)");
  std::vector<std::pair<uint64_t, uint32_t>> all;
  std::vector<uint64_t> keys, scratch;
  for (int64_t d = 0; d < text.documents(); ++d) {
    const int64_t b = text.begin[d], len = text.begin[d + 1] - b;
    if (len < k) continue;
    keys.resize(static_cast<size_t>(len));
    const size_t n = hasher_.hash_all(text.tokens.subspan(static_cast<size_t>(b), static_cast<size_t>(len)), keys.data(), scratch);
    for (size_t i = 0; i < n; ++i) {
      set_.insert(keys[i]);
      all.emplace_back(keys[i], static_cast<uint32_t>(b + static_cast<int64_t>(i)));
    }
  }
  std::sort(all.begin(), all.end());
  for (size_t i = 0; i < all.size();) {
    size_t j = i;
    while (j < all.size() && all[j].first == all[i].first) ++j;
    if (j - i > static_cast<size_t>(max_postings_)) stop_seeds_ += static_cast<int64_t>(j - i);
    i = j;
  }
  hash_.resize(all.size());
  pos_.resize(all.size());
  for (size_t i = 0; i < all.size(); ++i) {
    hash_[i] = all[i].first;
    pos_[i] = all[i].second;
  }
}

std::span<const uint32_t> SeedIndex::postings(uint64_t h) const {
  const auto [lo, hi] = std::equal_range(hash_.begin(), hash_.end(), h);
  if (hi - lo > max_postings_) return {};  // a stop seed: boilerplate or a run of one token, see the header
  return std::span<const uint32_t>(pos_.data() + (lo - hash_.begin()), static_cast<size_t>(hi - lo));
}

int64_t SeedIndex::bytes() const {
  return set_.bytes() + static_cast<int64_t>(hash_.size() * sizeof(uint64_t) + pos_.size() * sizeof(uint32_t));
}

// The longest MEM, ties to the earlier delivery and then the earlier place in the document: the same whatever
// order the scan threads found them in.
bool DocMatches::longer(int64_t len, const StreamPosition& at, int64_t doc_offset) const {
  if (len != longest) return len > longest;
  if (at.before(longest_at)) return true;
  if (longest_at.before(at)) return false;
  return doc_offset < longest_doc_offset;
}

void DocMatches::merge(const DocMatches& o) {
  if (o.first.count == 0) return;
  if (longer(o.longest, o.longest_at, o.longest_doc_offset)) {
    longest = o.longest;
    longest_doc_offset = o.longest_doc_offset;
    longest_at = o.longest_at;
  }
  first.add(o.first);
  pieces += o.pieces;
}

void MatchSink::merge(MatchSink& o) {
  if (!o.cover.empty()) {
    if (cover.empty()) cover.swap(o.cover);
    else
      for (size_t i = 0; i < cover.size(); ++i) cover[i] |= o.cover[i];
  }
  for (auto& [d, m] : o.docs) docs[d].merge(m);
  windows += o.windows;
  index_hits += o.index_hits;
  rejected += o.rejected;
  mems += o.mems;
  boundary.insert(boundary.end(), std::make_move_iterator(o.boundary.begin()), std::make_move_iterator(o.boundary.end()));
  o.boundary.clear();
  o.cover.clear();
  o.docs.clear();
}

void match_piece(const SeedIndex& index, const HoldoutText& text, int ngram, const uint32_t* tokens, int64_t len,
                 const StreamPosition& at, MatchSink& sink) {
  const int k = index.k();
  if (len < k) return;
  sink.keys.resize(static_cast<size_t>(len));
  const size_t count = index.hasher().hash_all(std::span<const uint32_t>(tokens, static_cast<size_t>(len)),
                                               sink.keys.data(), sink.hash_scratch);
  sink.windows += static_cast<int64_t>(count);
  sink.active.clear();
  sink.touched.clear();
  const uint32_t* H = text.tokens.data();
  index.set().probe(sink.keys.data(), count, [&](size_t wi) {
    ++sink.index_hits;
    const int64_t i = static_cast<int64_t>(wi);
    if (sink.active.size() > 32)  // MEMs that end before this window can hold no later seed
      std::erase_if(sink.active, [&](const auto& a) { return a.second < i + k; });
    bool verified = false;
    for (const uint32_t p32 : index.postings(sink.keys[wi])) {
      const int64_t p = p32, diag = p - i;
      bool inside = false;
      for (const auto& [d, end] : sink.active)
        if (d == diag && end >= i + k) inside = true;
      if (inside) {
        verified = true;
        continue;
      }
      if (!std::equal(tokens + i, tokens + i + k, H + p)) continue;
      verified = true;
      const int64_t doc = text.doc_of(p), db = text.begin[static_cast<size_t>(doc)], de = text.begin[static_cast<size_t>(doc) + 1];
      int64_t a = i, b = p, e = i + k, f = p + k;
      while (a > 0 && b > db && tokens[a - 1] == H[b - 1]) --a, --b;
      while (e < len && f < de && tokens[e] == H[f]) ++e, ++f;
      sink.active.emplace_back(diag, e);
      ++sink.mems;
      if (sink.cover.empty()) sink.cover.assign(text.tokens.size(), 0);
      for (int64_t q = b; q < f; ++q) sink.cover[static_cast<size_t>(q)] |= MatchSink::kCovered;
      for (int64_t q = b; q + ngram <= f; ++q) sink.cover[static_cast<size_t>(q)] |= MatchSink::kNgramStart;
      // A run does not continue into this MEM from the left, unless the left end is a cut between two instances
      // that bridge_boundaries (data/leakcheck_scan.cpp) finds was delivered on both sides; it clears the bit then.
      if (b > db) sink.cover[static_cast<size_t>(b)] |= MatchSink::kBreak;
      if (!at.file.empty() && at.token_start >= 0) {
        if (e == len && f < de) sink.boundary.push_back({f, de, true, at.file, at.token_start + len});
        if (a == 0 && b > db) sink.boundary.push_back({b, db, false, at.file, at.token_start - len});
      }
      DocMatches& m = sink.docs[doc];
      StreamPosition where = at;
      where.token_offset = a;
      if (m.first.count == 0 || m.longer(f - b, where, b - db)) {
        m.longest = f - b;
        m.longest_doc_offset = b - db;
        m.longest_at = where;
      }
      m.first.add(where);
      if (std::find(sink.touched.begin(), sink.touched.end(), doc) == sink.touched.end()) {
        sink.touched.push_back(doc);
        ++m.pieces;
      }
    }
    if (!verified) ++sink.rejected;
  });
}

}  // namespace olmoref::data
