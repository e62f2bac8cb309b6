// data/leak_match.h — where holdout documents' text occurs in a token stream: seed-and-extend matching, the
// measure behind the leakage detector's levels (data/leakcheck.h, docs/formats/leakcheck.md "Levels").
//
// Seeds. Every k-gram (k = LeakLevels::seed_ngram, 8 by default) of every holdout document is indexed: an NgramSet
// for the fast "is this a holdout k-gram?" probe of each stream window, and a postings array (hash -> the holdout
// positions where that k-gram starts, sorted by hash) for the hits. Each hit is verified token by token (so the
// Bloom mode and 64-bit hash collisions cannot make a match), then extended left and right while stream and
// document agree, never past the document's ends nor the stream piece's (a training instance: text is "delivered
// together" only inside one instance). The result is a maximal exact match (MEM): a verbatim span of at least k
// tokens, with its place in the document and in the stream. Seeds inside a MEM already found on the same diagonal
// are skipped, so each delivered span is extended once.
//
// What a MEM records, per holdout document (MatchSink):
//   - cover[p] bit kCovered:   holdout token p lies in some delivered MEM (edit-tolerant coverage: a copy with a
//                              token changed every 10 tokens still has 9 of every 10 tokens in MEMs >= 8 long);
//   - cover[p] bit kNgramStart: the n-gram (n = LeakLevels::ngram, 13) starting at p lies inside one MEM (the
//                              classic "fraction of the document's 13-grams found in training");
//   - cover[p] bit kBreak:      a MEM starts at p, so a run of covered tokens through p is not one verbatim run (a
//                              copy with a token inserted every 10 tokens has every token covered but no verbatim
//                              run longer than 10), unless the MEM starts its piece and the neighbouring instance,
//                              delivered too, holds the document's previous tokens (then the bit is cleared);
//   - the longest MEM (the longest verbatim span), where it was delivered and where it sits in the document;
//   - the first delivery of any MEM, and how many MEMs and delivered pieces held one.
// A k-gram that starts at more than max_postings (64) holdout positions (a run of one token, boilerplate repeated
// across the holdout) is a stop seed: it seeds nothing, so the work per stream window stays bounded; the spans
// around it are found from their other seeds, and a document made only of such k-grams is judged by the exact
// checks alone.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "data/audit_check.h"
#include "data/ngram.h"

namespace olmoref::data {

// The first position (stream order) and the number of occurrences of something seen in the stream.
struct FirstCount {
  StreamPosition first;
  int64_t count = 0;
  void add(const StreamPosition& p) {
    if (count == 0 || p.before(first)) first = p;
    ++count;
  }
  void add(const FirstCount& o) {
    if (o.count == 0) return;
    if (count == 0 || o.first.before(first)) first = o.first;
    count += o.count;
  }
};

// The holdout as the matcher sees it: all documents' tokens back to back; document d is
// tokens[begin[d], begin[d + 1]).
struct HoldoutText {
  std::span<const uint32_t> tokens;
  std::vector<int64_t> begin;  // documents + 1 entries, begin.back() == tokens.size()
  int64_t documents() const { return static_cast<int64_t>(begin.size()) - 1; }
  int64_t doc_of(int64_t pos) const;  // the document holding token `pos`
};

class SeedIndex {
 public:
  SeedIndex(const HoldoutText& text, int k, NgramSet::Kind kind, double bloom_bits_per_key, int max_postings = 64);
  int k() const { return hasher_.n(); }
  const NgramHasher& hasher() const { return hasher_; }
  const NgramSet& set() const { return set_; }
  int64_t seeds() const { return static_cast<int64_t>(pos_.size()); }  // indexed k-gram positions
  int max_postings() const { return max_postings_; }
  int64_t stop_seeds() const { return stop_seeds_; }  // indexed positions whose k-gram is a stop seed
  // Holdout positions whose k-gram hashes to h, in increasing position order; none for a stop seed.
  std::span<const uint32_t> postings(uint64_t h) const;
  int64_t bytes() const;  // set + postings

 private:
  NgramHasher hasher_;
  NgramSet set_;
  std::vector<uint64_t> hash_;  // sorted
  std::vector<uint32_t> pos_;   // pos_[i]: a holdout position whose k-gram hashes to hash_[i]
  int max_postings_;
  int64_t stop_seeds_ = 0;
};

struct DocMatches {
  int64_t longest = 0;             // tokens of the longest delivered MEM
  int64_t longest_doc_offset = -1; // where it starts in the document
  StreamPosition longest_at;       // where it was delivered (token_offset: its first token in the piece)
  FirstCount first;                // every MEM's delivery; first = the earliest
  int64_t pieces = 0;              // delivered pieces (instances) holding at least one MEM of the document
  bool longer(int64_t len, const StreamPosition& at, int64_t doc_offset) const;
  void merge(const DocMatches& o);
};

// A MEM that reaches the end (forward) or the start of its piece while the document goes on: up to k - 1 more of
// the document's tokens may have been delivered at the start (end) of the neighbouring instance of the same file,
// too few to seed a match there. The detector checks those afterwards (data/leakcheck_scan.cpp, bridge_boundaries).
struct BoundaryMem {
  int64_t doc_pos = 0;    // forward: the first document token after the MEM; backward: the MEM's first token
  int64_t doc_limit = 0;  // forward: the document's end; backward: its start
  bool forward = true;
  std::string file;       // the piece's training file
  int64_t neighbour_start = 0;  // first token of the neighbouring instance in that file
};

struct MatchSink {
  // kBreak: a MEM starts here whose stream neighbour on the left is not the document's previous token (an edit, or
  // another place): a verbatim run of the document cannot continue into this token from the left.
  static constexpr uint8_t kCovered = 1, kNgramStart = 2, kBreak = 4;
  std::vector<uint8_t> cover;                       // per holdout token (allocated on the first MEM)
  std::unordered_map<int64_t, DocMatches> docs;     // documents with a MEM
  int64_t windows = 0;                              // k-gram windows probed
  int64_t index_hits = 0;                           // windows the set reported (candidates)
  int64_t rejected = 0;                             // candidates that were no holdout k-gram (Bloom / hash collisions)
  int64_t mems = 0;                                 // MEMs found
  std::vector<BoundaryMem> boundary;                // MEMs cut by their piece's ends
  // Scratch, reused across pieces.
  std::vector<uint64_t> keys, hash_scratch;
  std::vector<std::pair<int64_t, int64_t>> active;  // (diagonal, stream end) of this piece's MEMs
  std::vector<int64_t> touched;                     // documents with a MEM in this piece
  void merge(MatchSink& o);                         // moves o's results into this one
};

// Finds every MEM between tokens[0, len) (one delivered piece, at stream position `at`) and the holdout documents.
// `ngram` is the n of the kNgramStart bits.
void match_piece(const SeedIndex& index, const HoldoutText& text, int ngram, const uint32_t* tokens, int64_t len,
                 const StreamPosition& at, MatchSink& sink);

}  // namespace olmoref::data
