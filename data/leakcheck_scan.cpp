#include "data/leakcheck_scan.h"

#include <algorithm>
#include <exception>
#include <filesystem>
#include <functional>
#include <span>
#include <thread>

namespace olmoref::data::leak {

std::unique_ptr<Holdout> load_holdout(std::shared_ptr<const FslDataset> ds, std::optional<uint32_t> eos,
                                      int64_t min_doc_tokens) {
  auto h = std::make_unique<Holdout>();
  h->ds = std::move(ds);
  const FslDataset& d = *h->ds;
  const int64_t L = d.sequence_length();
  int64_t total = 0;
  for (size_t f = 0; f < d.n_files(); ++f) {
    h->file_begin.push_back(total);
    total += d.file(f).n_tokens();
  }
  h->tokens.resize(static_cast<size_t>(total));
  for (size_t f = 0; f < d.n_files(); ++f) {
    const TokenFile& tf = d.file(f);
    tf.read(0, std::span<uint32_t>(h->tokens).subspan(static_cast<size_t>(h->file_begin[f]), static_cast<size_t>(tf.n_tokens())),
            d.vocab_size());
  }
  for (int64_t i = 0; i < d.size(); ++i) h->instance_hash.emplace(xxh3_u32(h->instance_tokens(i), L), i);
  h->docs_are_instances = !eos.has_value();
  for (size_t f = 0; f < d.n_files(); ++f) {
    const int64_t n = d.file(f).n_tokens(), base = h->file_begin[f];
    auto add = [&](int64_t start, int64_t len) {
      if (len > 0) h->docs.push_back({static_cast<int32_t>(f), start, base + start, len});
    };
    if (eos) {
      int64_t prev = 0;
      for (int64_t i = 0; i < n; ++i) {
        if (h->tokens[static_cast<size_t>(base + i)] == *eos) {
          add(prev, i - prev + 1);
          prev = i + 1;
        }
      }
      add(prev, n - prev);
    } else {
      for (int64_t s = 0; s < n; s += L) add(s, std::min(L, n - s));
    }
  }
  for (size_t i = 0; i < h->docs.size(); ++i) {
    const HoldoutDoc& doc = h->docs[i];
    if (!eos || doc.len < min_doc_tokens) continue;
    h->doc_hash.emplace(xxh3_u32(h->tokens.data() + doc.begin, doc.len), static_cast<int64_t>(i));
  }
  return h;
}

namespace {

struct Chunk {
  std::vector<uint32_t> tokens;       // instances back to back
  std::vector<StreamPosition> where;  // one per instance
  void clear() {
    tokens.clear();
    where.clear();
  }
};

void scan_instance(const ScanContext& c, const uint32_t* t, const StreamPosition& at, PartHits& out) {
  const int64_t L = c.L;
  // Exact instance.
  if (const auto it = L == c.instance_len ? c.h.instance_hash.find(xxh3_u32(t, L)) : c.h.instance_hash.end();
      it != c.h.instance_hash.end()) {
    if (std::equal(t, t + L, c.h.instance_tokens(it->second))) out.instances[it->second].add(at);
    else ++out.hash_mismatch;
  }
  // Complete documents inside the instance (a document starts after an EOS, or at the file start).
  if (c.eos && !c.h.doc_hash.empty()) {
    int64_t prev = at.token_start == 0 ? 0 : -1;
    const uint32_t eos = *c.eos;
    for (const uint32_t* p = std::find(t, t + L, eos); p != t + L; p = std::find(p + 1, t + L, eos)) {
      const int64_t i = p - t;
      const int64_t len = i - prev + 1;
      if (prev >= 0 && len >= c.min_doc_tokens) {
        if (const auto it = c.h.doc_hash.find(xxh3_u32(t + prev, len)); it != c.h.doc_hash.end()) {
          const HoldoutDoc& d = c.h.docs[static_cast<size_t>(it->second)];
          if (d.len == len && std::equal(t + prev, t + i + 1, c.h.tokens.data() + d.begin)) {
            StreamPosition where = at;
            where.token_offset = prev;
            out.docs[it->second].add(where);
          } else {
            ++out.hash_mismatch;
          }
        }
      }
      prev = i + 1;
    }
  }
  match_piece(c.index, c.text, c.ngram, t, L, at, out.matches);
  if (!at.file.empty()) out.delivered.emplace_back(std::hash<std::string>{}(at.file), at.token_start);
}


void scan_chunk(const ScanContext& c, const Chunk& chunk, ThreadPool& pool, std::vector<PartHits>& parts) {
  const int64_t n = static_cast<int64_t>(chunk.where.size());
  const int64_t P = static_cast<int64_t>(parts.size());
  pool.parallel_for(P, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t b = n * p / P, e = n * (p + 1) / P;
      for (int64_t i = b; i < e; ++i)
        scan_instance(c, chunk.tokens.data() + i * c.L, chunk.where[static_cast<size_t>(i)], parts[static_cast<size_t>(p)]);
    }
  });
}


// ---------------------------------------------------------------------------------------------
// One rank's view of the stream: its loader (with its own audit log), its micro-batches.
class RankStream {
 public:
  RankStream(const LoaderConfig& base, int world_size, int rank, const std::string& audit_path, int64_t steps)
      : world_size_(world_size), rank_(rank), steps_left_(steps) {
    LoaderConfig c = base;
    c.world_size = world_size;
    c.rank = world_size == 1 ? -1 : rank;
    c.audit = std::make_shared<AuditLog>(audit_path);
    loader_ = std::make_unique<Loader>(std::move(c));
  }
  // Appends whole steps until the chunk holds at least max_tokens; false when nothing was added.
  bool fill(Chunk& c, int64_t max_tokens) {
    c.clear();
    const FslDataset& ds = loader_->dataset();
    while (steps_left_ > 0 && static_cast<int64_t>(c.tokens.size()) < max_tokens) {
      loader_->next_batch(b_);
      --steps_left_;
      ++steps_done_;
      for (const int64_t m : Loader::microbatches_of_rank(rank_, b_.n_microbatches(), world_size_)) {
        const auto toks = b_.microbatch_tokens(m);
        c.tokens.insert(c.tokens.end(), toks.begin(), toks.end());
        const auto ids = b_.microbatch_ids(m);
        for (size_t k = 0; k < ids.size(); ++k) {
          StreamPosition p;
          p.step = b_.step;
          p.epoch = b_.epoch;
          p.microbatch = m;
          p.rank = rank_;
          p.instance = ids[k];
          p.index = static_cast<int64_t>(k);
          if (ids[k] >= 0 && ids[k] < ds.size()) {
            const FslDataset::Location loc = ds.locate(ids[k]);
            p.file = ds.file(static_cast<size_t>(loc.file)).path();
            p.token_start = loc.token_start;
          }
          p.world_size = world_size_;
          c.where.push_back(std::move(p));
        }
      }
    }
    if (steps_left_ == 0 && loader_->config().audit) loader_->config().audit->flush();
    return !c.where.empty();
  }
  int64_t steps_done() const { return steps_done_; }
  int64_t last_epoch() const { return b_.epoch; }

 private:
  int world_size_, rank_;
  int64_t steps_left_, steps_done_ = 0;
  std::unique_ptr<Loader> loader_;
  GlobalBatch b_;
};


// Scans the chunks `fill` produces (false: no more), reading the next chunk in a second thread while the current
// one is scanned; `fill` is never called twice at once.
void scan_chunks(const std::function<bool(Chunk&)>& fill, const ScanContext& ctx, ThreadPool& pool,
                 std::vector<PartHits>& parts, StreamScan& out) {
  Chunk cur, next;
  bool have = fill(cur);
  while (have) {
    bool have_next = false;
    std::exception_ptr err;
    std::thread producer([&] {
      try {
        have_next = fill(next);
      } catch (...) {
        err = std::current_exception();
      }
    });
    try {
      scan_chunk(ctx, cur, pool, parts);
    } catch (...) {
      producer.join();
      throw;
    }
    producer.join();
    if (err) std::rethrow_exception(err);
    out.tokens += static_cast<int64_t>(cur.tokens.size());
    out.instances += static_cast<int64_t>(cur.where.size());
    std::swap(cur, next);
    have = have_next;
  }
}

}  // namespace

StreamScan scan_stream(const LoaderConfig& base, int W, int64_t steps, const std::string& audit_prefix,
                       const ScanContext& ctx, ThreadPool& pool, int64_t chunk_tokens) {
  StreamScan out;
  std::vector<PartHits> parts(static_cast<size_t>(pool.size()));
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < W; ++r) {
    RankStream stream(base, W, r, audit_prefix + ".r" + std::to_string(r) + ".jsonl", steps);
    scan_chunks([&](Chunk& c) { return stream.fill(c, chunk_tokens); }, ctx, pool, parts, out);
  }
  out.seconds = seconds_since(t0);
  for (PartHits& p : parts) out.hits.merge(p);
  return out;
}


StreamScan scan_external(const ExternalStream& ext, int64_t steps, const ScanContext& ctx, ThreadPool& pool,
                         int64_t chunk_tokens) {
  StreamScan out;
  std::vector<PartHits> parts(static_cast<size_t>(pool.size()));
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t total = steps * ext.pieces_per_step, P = ext.piece_tokens;
  const int64_t per_chunk = std::max<int64_t>(1, chunk_tokens / P);
  int64_t at = 0;
  auto fill = [&](Chunk& c) {
    c.clear();
    const int64_t n = std::min(per_chunk, total - at);
    if (n <= 0) return false;
    c.tokens.resize(static_cast<size_t>(n * P));
    for (int64_t i = 0; i < n; ++i) {
      const int64_t piece = at + i;
      ext.read(piece, std::span<uint32_t>(c.tokens).subspan(static_cast<size_t>(i * P), static_cast<size_t>(P)));
      StreamPosition p;
      p.step = piece / ext.pieces_per_step + 1;
      const int64_t k = piece % ext.pieces_per_step;
      p.microbatch = ext.pieces_per_microbatch > 0 ? k / ext.pieces_per_microbatch : 0;
      p.index = ext.pieces_per_microbatch > 0 ? k % ext.pieces_per_microbatch : k;
      p.instance = piece;
      if (ext.steps_per_epoch > 0) p.epoch = (p.step - 1) / ext.steps_per_epoch + 1;
      if (ext.locate) {
        auto [file, start] = ext.locate(piece);
        p.file = std::move(file);
        p.token_start = start;
      } else {
        p.file = ext.source;
      }
      c.where.push_back(std::move(p));
    }
    at += n;
    return true;
  };
  scan_chunks(fill, ctx, pool, parts, out);
  out.seconds = seconds_since(t0);
  for (PartHits& p : parts) out.hits.merge(p);
  return out;
}


void bridge_boundaries(StreamScan& scan, const std::vector<const FslDataset*>& datasets, const HoldoutText& text,
                       int k, int64_t L) {
  std::vector<std::pair<uint64_t, int64_t>>& delivered = scan.hits.delivered;
  std::sort(delivered.begin(), delivered.end());
  delivered.erase(std::unique(delivered.begin(), delivered.end()), delivered.end());
  MatchSink& sink = scan.hits.matches;
  std::unordered_map<std::string, const TokenFile*> file_of;
  for (const FslDataset* ds : datasets)
    for (size_t f = 0; f < ds->n_files(); ++f) file_of.emplace(ds->file(f).path(), &ds->file(f));
  // Bits are collected and applied after every record, breaks first and then the verified joins, so the result does
  // not depend on the order the scan threads recorded the cuts in.
  std::vector<int64_t> breaks, joins;
  std::vector<uint32_t> buf;
  for (const BoundaryMem& bm : sink.boundary) {
    if (bm.neighbour_start < 0 ||
        !std::binary_search(delivered.begin(), delivered.end(), std::make_pair(std::hash<std::string>{}(bm.file), bm.neighbour_start)))
      continue;
    const auto it = file_of.find(bm.file);
    const TokenFile* tf = it == file_of.end() ? nullptr : it->second;
    if (!tf || bm.neighbour_start + L > tf->n_tokens()) continue;
    // Forward: up to k - 1 tokens (k or more would have seeded a MEM of their own). Backward: up to k, to see whether
    // the tokens before the bridged ones continue the document too (then the previous instance holds a MEM of its
    // own that reaches its end) or not (then a run must not join across them: the bit at the bridge's start).
    const int64_t room = bm.forward ? bm.doc_limit - bm.doc_pos : bm.doc_pos - bm.doc_limit;
    const int64_t n = std::min<int64_t>(bm.forward ? k - 1 : k, room);
    if (n <= 0) continue;
    buf.resize(static_cast<size_t>(n));
    tf->read(bm.forward ? bm.neighbour_start : bm.neighbour_start + L - n, buf, 0);
    int64_t j = 0;
    if (bm.forward) {
      while (j < n && buf[static_cast<size_t>(j)] == text.tokens[static_cast<size_t>(bm.doc_pos + j)]) ++j;
      for (int64_t q = bm.doc_pos; q < bm.doc_pos + j; ++q) sink.cover[static_cast<size_t>(q)] |= MatchSink::kCovered;
      if (j > 0) joins.push_back(bm.doc_pos);
    } else {
      while (j < n && buf[static_cast<size_t>(n - 1 - j)] == text.tokens[static_cast<size_t>(bm.doc_pos - 1 - j)]) ++j;
      if (j == 0) continue;
      const int64_t bridged = std::min<int64_t>(j, k - 1);
      for (int64_t q = bm.doc_pos - bridged; q < bm.doc_pos; ++q) sink.cover[static_cast<size_t>(q)] |= MatchSink::kCovered;
      joins.push_back(bm.doc_pos);
      if (j < k && bm.doc_pos - j > bm.doc_limit) breaks.push_back(bm.doc_pos - j);
    }
  }
  for (const int64_t p : breaks) sink.cover[static_cast<size_t>(p)] |= MatchSink::kBreak;
  for (const int64_t p : joins) sink.cover[static_cast<size_t>(p)] &= static_cast<uint8_t>(~MatchSink::kBreak);
}


std::vector<AuditRecord> audit_stream(const LoaderConfig& base, int world_size, int64_t steps, const std::string& dir,
                                      const std::string& tag) {
  std::vector<AuditRecord> all;
  for (int r = 0; r < world_size; ++r) {
    const std::string path = dir + "/" + tag + ".r" + std::to_string(r) + ".jsonl";
    {
      LoaderConfig c = base;
      c.world_size = world_size;
      c.rank = world_size == 1 ? -1 : r;
      c.audit = std::make_shared<AuditLog>(path);
      Loader loader(c);
      GlobalBatch b;
      for (int64_t s = 0; s < steps; ++s) loader.next_batch(b);
      c.audit->flush();
    }
    std::vector<AuditRecord> recs = read_audit_log(path);
    all.insert(all.end(), std::make_move_iterator(recs.begin()), std::make_move_iterator(recs.end()));
  }
  return all;
}

TempDir::~TempDir() {
  if (remove) {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
}

}  // namespace olmoref::data::leak
