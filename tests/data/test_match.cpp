// tests/data/test_match.cpp — seed-and-extend matching (data/leak_match.h) on hand-built cases: what a verbatim
// copy, an edited copy, a copy that crosses documents and a repetitive document each leave in the cover bits.
#include <doctest.h>

#include <random>

#include "data/leak_match.h"

using namespace olmoref::data;

namespace {

struct Case {
  std::vector<uint32_t> holdout;
  HoldoutText text;
  explicit Case(const std::vector<std::vector<uint32_t>>& docs) {
    for (const auto& d : docs) {
      text.begin.push_back(static_cast<int64_t>(holdout.size()));
      holdout.insert(holdout.end(), d.begin(), d.end());
    }
    text.begin.push_back(static_cast<int64_t>(holdout.size()));
    text.tokens = holdout;
  }
  MatchSink run(const std::vector<uint32_t>& piece, NgramSet::Kind kind = NgramSet::Kind::exact, int k = 8) const {
    const SeedIndex index(text, k, kind, 32.0);
    MatchSink sink;
    StreamPosition at;
    at.step = 3;
    at.file = "train.u16";
    at.token_start = 512;
    match_piece(index, text, 13, piece.data(), static_cast<int64_t>(piece.size()), at, sink);
    return sink;
  }
};

std::vector<uint32_t> random_tokens(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint32_t> t(n);
  for (auto& x : t) x = rng() % 50000;
  return t;
}

int64_t count_bits(const MatchSink& s, int64_t b, int64_t e, uint8_t bit) {
  int64_t n = 0;
  for (int64_t p = b; p < e; ++p) n += !s.cover.empty() && (s.cover[static_cast<size_t>(p)] & bit) ? 1 : 0;
  return n;
}

int64_t longest_run(const MatchSink& s, int64_t b, int64_t e) {
  int64_t run = 0, best = 0;
  for (int64_t p = b; p < e; ++p) {
    const uint8_t c = s.cover.empty() ? 0 : s.cover[static_cast<size_t>(p)];
    run = (c & MatchSink::kCovered) ? ((c & MatchSink::kBreak) ? 1 : run + 1) : 0;
    best = std::max(best, run);
  }
  return best;
}

}  // namespace

TEST_CASE("a verbatim copy inside other text: one MEM, every token and n-gram covered, its place recorded") {
  const std::vector<uint32_t> doc = random_tokens(100, 1);
  const Case c({random_tokens(50, 2), doc});
  std::vector<uint32_t> piece = random_tokens(30, 3);
  piece.insert(piece.end(), doc.begin(), doc.end());
  const std::vector<uint32_t> after = random_tokens(20, 4);
  piece.insert(piece.end(), after.begin(), after.end());
  for (const auto kind : {NgramSet::Kind::exact, NgramSet::Kind::bloom}) {
    const MatchSink s = c.run(piece, kind);
    REQUIRE(s.docs.count(1) == 1);
    CHECK(s.docs.count(0) == 0);
    const DocMatches& m = s.docs.at(1);
    CHECK(m.longest == 100);
    CHECK(m.longest_doc_offset == 0);
    CHECK(m.longest_at.token_offset == 30);
    CHECK(m.longest_at.step == 3);
    CHECK(m.pieces == 1);
    CHECK(m.first.count == 1);  // seeds inside the MEM are not extended again
    CHECK(s.mems == 1);
    CHECK(count_bits(s, 50, 150, MatchSink::kCovered) == 100);
    CHECK(count_bits(s, 50, 150, MatchSink::kNgramStart) == 100 - 13 + 1);
    CHECK(count_bits(s, 0, 50, MatchSink::kCovered) == 0);
    CHECK(s.boundary.empty());
  }
}

TEST_CASE("edited copies: a token changed every 10 leaves 90% covered; inserted tokens cover all but break the run") {
  const std::vector<uint32_t> doc = random_tokens(200, 5);
  const Case c({doc});
  std::vector<uint32_t> sub = doc, ins, del;
  for (size_t i = 9; i < sub.size(); i += 10) sub[i] = 60000 + static_cast<uint32_t>(i);
  for (size_t i = 0; i < doc.size(); ++i) {
    ins.push_back(doc[i]);
    if (i % 10 == 9) ins.push_back(70000 + static_cast<uint32_t>(i));
    if (i % 10 != 9) del.push_back(doc[i]);
  }
  const MatchSink s = c.run(sub);
  CHECK(count_bits(s, 0, 200, MatchSink::kCovered) == 180);
  CHECK(count_bits(s, 0, 200, MatchSink::kNgramStart) == 0);  // no 13 tokens in a row survive
  CHECK(longest_run(s, 0, 200) == 9);
  const MatchSink i = c.run(ins);
  CHECK(count_bits(i, 0, 200, MatchSink::kCovered) == 200);
  CHECK(longest_run(i, 0, 200) == 10);  // adjacent in the document, not in the stream
  CHECK(i.docs.at(0).longest == 10);
  const MatchSink d = c.run(del);
  CHECK(count_bits(d, 0, 200, MatchSink::kCovered) == 180);
  CHECK(longest_run(d, 0, 200) == 9);
  // Every 7 tokens: no 8 tokens in a row survive, nothing is seen.
  std::vector<uint32_t> sub7 = doc;
  for (size_t k = 6; k < sub7.size(); k += 7) sub7[k] = 80000;
  CHECK(c.run(sub7).docs.empty());
}

TEST_CASE("a match never crosses a document boundary; a piece boundary is recorded for the neighbour check") {
  const std::vector<uint32_t> a = random_tokens(40, 6), b = random_tokens(40, 7);
  const Case c({a, b});
  std::vector<uint32_t> piece(a.begin() + 10, a.end());  // a's last 30 tokens, then b's first 25, then the piece ends
  piece.insert(piece.end(), b.begin(), b.begin() + 25);
  const MatchSink s = c.run(piece);
  REQUIRE(s.docs.count(0) == 1);
  REQUIRE(s.docs.count(1) == 1);
  CHECK(s.docs.at(0).longest == 30);
  CHECK(s.docs.at(1).longest == 25);
  // a's MEM starts the piece with a's start before it; b's ends the piece with b going on: both recorded.
  REQUIRE(s.boundary.size() == 2);
  bool back = false, fwd = false;
  for (const BoundaryMem& m : s.boundary) {
    CHECK(m.file == "train.u16");
    if (!m.forward) back = m.doc_pos == 10 && m.doc_limit == 0 && m.neighbour_start == 512 - 55;
    else fwd = m.doc_pos == 40 + 25 && m.doc_limit == 80 && m.neighbour_start == 512 + 55;
  }
  CHECK(back);
  CHECK(fwd);
}

TEST_CASE("a repetitive document: its one k-gram is a stop seed (no work), a mixed one is found around it") {
  const std::vector<uint32_t> rep(300, 7);
  std::vector<uint32_t> mixed = random_tokens(60, 8);
  mixed.insert(mixed.end(), 100, 7);  // a run the stop seed covers, between two seedable stretches
  const std::vector<uint32_t> tail = random_tokens(60, 9);
  mixed.insert(mixed.end(), tail.begin(), tail.end());
  const Case c({rep, mixed});
  const SeedIndex index(c.text, 8, NgramSet::Kind::exact, 32.0);
  CHECK(index.stop_seeds() >= 293);
  CHECK(c.run(std::vector<uint32_t>(120, 7)).docs.empty());
  const MatchSink s = c.run(mixed);
  REQUIRE(s.docs.count(1) == 1);
  CHECK(s.docs.at(1).longest == 220);  // extension runs through the stop seeds
  CHECK(s.mems == 1);
}

TEST_CASE("merging sinks: union of covers, longest and earliest kept") {
  const std::vector<uint32_t> doc = random_tokens(100, 9);
  const Case c({doc});
  MatchSink a = c.run(std::vector<uint32_t>(doc.begin(), doc.begin() + 40));
  MatchSink b = c.run(std::vector<uint32_t>(doc.begin() + 50, doc.end()));
  a.merge(b);
  CHECK(count_bits(a, 0, 100, MatchSink::kCovered) == 90);
  CHECK(a.docs.at(0).longest == 50);
  CHECK(a.docs.at(0).pieces == 2);
  CHECK(a.docs.at(0).first.count == 2);
}
