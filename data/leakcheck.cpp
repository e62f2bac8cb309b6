#include "data/leakcheck.h"

#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cctype>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <stdexcept>
#include <thread>
#include <unordered_map>

#include "data/audit_check.h"
#include "data/leak_match.h"
#include "data/ngram.h"
#include "core/parallel.h"

namespace olmoref::data {

namespace fs = std::filesystem;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

double rate(int64_t a, int64_t b) { return b > 0 ? static_cast<double>(a) / static_cast<double>(b) : 0.0; }

// ---------------------------------------------------------------------------------------------
// The holdout: every token of its files, its documents, instance and document hashes, n-grams.

struct HoldoutDoc {
  int32_t file = 0;
  int64_t file_start = 0;  // first token in the file
  int64_t begin = 0;       // first token in Holdout::tokens
  int64_t len = 0;         // tokens, EOS included
};

struct Holdout {
  std::shared_ptr<const FslDataset> ds;
  std::vector<uint32_t> tokens;     // all holdout files, concatenated
  std::vector<int64_t> file_begin;  // offset of file f in tokens
  std::vector<HoldoutDoc> docs;
  bool docs_are_instances = false;  // no EOS known: each holdout instance (and file tail) is a document
  std::unordered_map<uint64_t, int64_t> instance_hash;  // XXH3 -> holdout instance
  std::unordered_map<uint64_t, int64_t> doc_hash;       // XXH3 -> document, documents >= min_doc_tokens
  int64_t ngram_positions = 0;

  const uint32_t* instance_tokens(int64_t id) const {
    const FslDataset::Location loc = ds->locate(id);
    return tokens.data() + file_begin[static_cast<size_t>(loc.file)] + loc.token_start;
  }
};

uint64_t xxh3_u32(const uint32_t* t, int64_t n) { return XXH3_64bits(t, static_cast<size_t>(n) * sizeof(uint32_t)); }

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

// ---------------------------------------------------------------------------------------------
// Scanning the stream.

struct PartHits {
  std::unordered_map<int64_t, FirstCount> instances;  // holdout instance -> occurrences
  std::unordered_map<int64_t, FirstCount> docs;       // holdout document -> whole-document occurrences
  MatchSink matches;                                  // verbatim spans of holdout documents
  int64_t hash_mismatch = 0;
  std::vector<std::pair<uint64_t, int64_t>> delivered;  // (hash of the file path, first token) of each piece
  void merge(PartHits& o) {
    delivered.insert(delivered.end(), o.delivered.begin(), o.delivered.end());
    o.delivered.clear();
    for (auto& [k, v] : o.instances) instances[k].add(v);
    for (auto& [k, v] : o.docs) docs[k].add(v);
    matches.merge(o.matches);
    hash_mismatch += o.hash_mismatch;
    o.instances.clear();
    o.docs.clear();
  }
};

struct Chunk {
  std::vector<uint32_t> tokens;       // instances back to back
  std::vector<StreamPosition> where;  // one per instance
  void clear() {
    tokens.clear();
    where.clear();
  }
};

struct ScanContext {
  const Holdout& h;
  const HoldoutText& text;
  const SeedIndex& index;
  int ngram;
  int64_t L;             // tokens of a delivered piece
  int64_t instance_len;  // tokens of a holdout instance (the exact-instance check needs L == instance_len)
  std::optional<uint32_t> eos;
  int64_t min_doc_tokens;
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
      const auto [m0, m1] = Loader::microbatches_of_rank(rank_, b_.n_microbatches(), world_size_);
      for (int64_t m = m0; m < m1; ++m) {
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

struct StreamScan {
  PartHits hits;
  int64_t tokens = 0, instances = 0;
  double seconds = 0.0;
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

// Scans `steps` batches of the stream `base` delivers at world size W (each rank's loader in turn); rank r's audit
// log goes to audit_prefix + ".r<r>.jsonl".
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

// The same scan over another framework's stream: pieces read by ext.read.
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

// A span cut by an instance boundary leaves at most k - 1 of its tokens in the neighbouring instance, too few to seed
// a match there: when that neighbour (the same file's next or previous instance) was delivered too, its tokens are
// read and compared with the document's continuation, so the document's delivered run is not cut short by the cut.
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

// Runs `world_size` rank loaders for `steps` batches with audit logs only; returns the union.
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

struct TempDir {
  std::string path;
  bool remove = false;
  ~TempDir() {
    if (remove) {
      std::error_code ec;
      fs::remove_all(path, ec);
    }
  }
};

// Same file on both sides: the same file (canonical path), or the same bytes under another name (data/mix.h
// shared_files, the check `olmoref train` refuses such a config with).
nlohmann::json shared_files(const FslDataset& train, const FslDataset& holdout, CheckResult& res) {
  nlohmann::json list = nlohmann::json::array();
  res.checked += static_cast<int64_t>(train.n_files());
  for (const SharedFile& f : shared_files(train.mix(), holdout.mix())) {
    const std::string tp = train.file(f.a).path(), hp = holdout.file(f.b).path();
    const std::string how = f.same_path ? "same path" : "same size and XXH3";
    StreamPosition p;  // static: no stream position
    res.fail(p, "training file " + tp + " is holdout file " + hp + " (" + how + ")");
    list.push_back({{"train_file", tp}, {"train_index", f.a}, {"holdout_file", hp}, {"holdout_index", f.b},
                    {"match", how}});
  }
  return list;
}

std::string position_text(const nlohmann::json& first) {
  if (first.is_null()) return "";
  std::string s;
  if (first.contains("step") && first["step"].get<int64_t>() >= 0) s += "step " + std::to_string(first["step"].get<int64_t>());
  if (first.contains("microbatch") && first["microbatch"].get<int64_t>() >= 0)
    s += ", micro-batch " + std::to_string(first["microbatch"].get<int64_t>());
  if (first.contains("rank") && first["rank"].get<int64_t>() >= 0) s += ", rank " + std::to_string(first["rank"].get<int64_t>());
  if (first.contains("instance") && first["instance"].get<int64_t>() >= 0)
    s += ", instance " + std::to_string(first["instance"].get<int64_t>());
  if (first.contains("world_size")) s += " (W=" + std::to_string(first["world_size"].get<int>()) + ")";
  if (s.empty() && first.contains("file")) {  // a static finding: a place in a training file
    s = first["file"].get<std::string>();
    if (first.contains("token_start"))
      s += " token " + std::to_string(first["token_start"].get<int64_t>() + first.value("token_offset", int64_t{0}));
  }
  return s;
}

}  // namespace

// The accept file: holdout documents known to be in the training data, one per line as the report names them,
// "HOLDOUT_FILE TOKEN_START" (the path as in the report's `file`, the document's first token); '#' starts a comment.
std::set<std::pair<std::string, int64_t>> read_leak_accept_file(const std::string& path) {
  std::set<std::pair<std::string, int64_t>> out;
  if (path.empty()) return out;
  std::ifstream in(path);
  if (!in) throw std::runtime_error(path + ": cannot open the accept file (--accept)");
  std::string line;
  for (int64_t no = 1; std::getline(in, line); ++no) {
    if (const size_t hash = line.find('#'); hash != std::string::npos) line.erase(hash);
    while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back()))) line.pop_back();
    size_t start = 0;
    while (start < line.size() && std::isspace(static_cast<unsigned char>(line[start]))) ++start;
    line.erase(0, start);
    if (line.empty()) continue;
    const size_t sp = line.find_last_of(" \t");
    char* end = nullptr;
    const long long token = sp == std::string::npos ? -1 : std::strtoll(line.c_str() + sp + 1, &end, 10);
    if (sp == std::string::npos || token < 0 || end == line.c_str() + sp + 1 || *end != '\0')
      throw std::runtime_error(path + ":" + std::to_string(no) + ": expected 'HOLDOUT_FILE TOKEN_START' (the `file` and "
                               "`token_start` of a contaminated_documents entry), got '" + line + "'");
    std::string file = line.substr(0, sp);
    while (!file.empty() && std::isspace(static_cast<unsigned char>(file.back()))) file.pop_back();
    out.emplace(file, token);
  }
  return out;
}

LeakReport run_leakcheck(const LoaderConfig& loader_config, const LeakCheckOptions& o) {
  const auto t_start = std::chrono::steady_clock::now();
  if (!loader_config.dataset) throw std::invalid_argument("leakcheck: the loader configuration has no dataset");
  if (loader_config.holdout.kind == HoldoutKind::none) {
    throw std::invalid_argument("leakcheck: the run has no holdout (set data.holdout_mix or data.holdout_files)");
  }
  LoaderConfig base = loader_config;
  base.audit = nullptr;
  base.prefetch = true;
  const FslDataset& configured = *base.dataset;
  const int64_t G = base.global_batch_instances, mb = base.microbatch_instances, M = (G + mb - 1) / mb;
  const int64_t L = configured.sequence_length();
  const int64_t bpe = configured.size() / G;
  const ExternalStream* ext = o.external;
  if (ext && (ext->piece_tokens < 1 || ext->pieces_per_step < 1 || !ext->read))
    throw std::invalid_argument("leakcheck: the external stream has no pieces");
  if (ext && !o.audit_logs.empty())
    throw std::invalid_argument("leakcheck: --audit reads olmoref's audit logs; another framework's run is checked from its own files");
  if (o.world_size < 1 || M < o.world_size)
    throw std::invalid_argument("leakcheck: --world-size " + std::to_string(o.world_size) + " is more than the " +
                                std::to_string(M) + " micro-batches of a step (every rank computes at least one)");

  // The loader under test, once, for the dataset it serves. The holdout is opened as
  // Loader::holdout_dataset() does (the training sequence length, vocabulary and dtype), except that
  // a holdout file shorter than one instance is kept: its documents are held out all the same.
  std::unique_ptr<Loader> probe;
  if (!ext) probe = std::make_unique<Loader>(base);
  DatasetOptions holdout_opts;
  holdout_opts.sequence_length = L;
  holdout_opts.vocab_size = configured.vocab_size();
  holdout_opts.dtype = configured.dtype();
  holdout_opts.eos_id = configured.eos_id();
  holdout_opts.allow_short_files = true;
  const auto holdout_ds = std::make_shared<const FslDataset>(base.holdout.mix, holdout_opts);
  const std::optional<uint32_t> eos = o.eos_id ? o.eos_id : configured.eos_id();

  // External logs decide how far the stream must go.
  std::vector<AuditRecord> external;
  if (!o.audit_logs.empty()) external = read_audit_logs(o.audit_logs);
  int64_t steps = o.whole_epoch ? bpe : o.steps;
  if (ext) {
    if (steps > ext->steps)
      throw std::invalid_argument("leakcheck: " + std::to_string(steps) + " steps asked for, but the " + ext->framework +
                                  " files hold " + std::to_string(ext->steps) + " steps of " +
                                  std::to_string(ext->pieces_per_step) + " samples");
    if (steps <= 0) steps = ext->steps;
  }
  for (const AuditRecord& r : external) steps = std::max(steps, r.step);
  if (steps <= 0) throw std::invalid_argument("leakcheck: give the steps to check (or the whole epoch)");

  TempDir work;
  if (o.work_dir.empty()) {
    std::string templ = (fs::temp_directory_path() / "olmoref-leakcheck-XXXXXX").string();
    if (::mkdtemp(templ.data()) == nullptr) throw std::runtime_error("leakcheck: cannot create a temporary directory");
    work.path = templ;
    work.remove = true;
  } else {
    work.path = o.work_dir;
    fs::create_directories(work.path);
  }

  // ---- holdout index
  const LeakLevels& lv = o.levels;
  if (lv.seed_ngram < 4 || lv.ngram < lv.seed_ngram)
    throw std::invalid_argument("leakcheck: need 4 <= seed n-gram (" + std::to_string(lv.seed_ngram) + ") <= n-gram (" +
                                std::to_string(lv.ngram) + ")");
  if (lv.verbatim_tokens < lv.seed_ngram)
    throw std::invalid_argument("leakcheck: the verbatim span level (" + std::to_string(lv.verbatim_tokens) +
                                " tokens) is shorter than the seed n-gram (" + std::to_string(lv.seed_ngram) + ")");
  const auto t_index = std::chrono::steady_clock::now();
  const std::unique_ptr<Holdout> hold = load_holdout(holdout_ds, eos, o.min_doc_tokens);
  HoldoutText text;
  text.tokens = hold->tokens;
  for (const HoldoutDoc& d : hold->docs) text.begin.push_back(d.begin);
  text.begin.push_back(static_cast<int64_t>(hold->tokens.size()));
  for (const HoldoutDoc& d : hold->docs) {
    if (d.len >= lv.ngram) {
      hold->ngram_positions += d.len - lv.ngram + 1;
    }
  }
  const SeedIndex index(text, lv.seed_ngram, o.bloom ? NgramSet::Kind::bloom : NgramSet::Kind::exact, o.bloom_bits_per_ngram);
  const double index_seconds = seconds_since(t_index);
  const std::set<std::pair<std::string, int64_t>> accept_list = read_leak_accept_file(o.accept_file);

  // ---- the stream as the loader delivers it (W rank loaders, each scanning its micro-batches), and the reference:
  // the configured data as a correct loader delivers it over the same steps (the same stream, unless a test planted
  // a loader bug), which decides the cause of what the stream holds.
  ThreadPool pool(o.threads);
  const ScanContext ctx{*hold, text, index, lv.ngram, ext ? ext->piece_tokens : L, L, eos, o.min_doc_tokens};
  const int W = ext ? 1 : o.world_size;
  StreamScan scanned = ext ? scan_external(*ext, steps, ctx, pool, o.chunk_tokens)
                           : scan_stream(base, W, steps, work.path + "/stream.w" + std::to_string(W), ctx, pool, o.chunk_tokens);
  StreamScan reference_owned;
  // Another framework's stream is reconstructed from its own index files: what its loader delivers is what those
  // files and the data say, so the data is the cause of what it holds.
  const bool separate_reference = !ext && o.attribute && base.debug_bug != PlantedBug::none;
  if (separate_reference) {
    LoaderConfig clean = base;
    clean.debug_bug = PlantedBug::none;
    reference_owned = scan_stream(clean, 1, steps, work.path + "/reference.w1", ctx, pool, o.chunk_tokens);
  }
  if (ext) bridge_boundaries(scanned, {&configured}, text, lv.seed_ngram, ext->piece_tokens);
  else bridge_boundaries(scanned, {&probe->dataset(), &configured}, text, lv.seed_ngram, L);
  const std::vector<const FslDataset*> datasets{ext ? &configured : &probe->dataset(), &configured};
  if (separate_reference) bridge_boundaries(reference_owned, datasets, text, lv.seed_ngram, L);
  const StreamScan& reference = separate_reference ? reference_owned : scanned;
  const PartHits& hits = scanned.hits;
  const std::vector<uint8_t> no_cover;
  const std::vector<uint8_t>& cover = hits.matches.cover.empty() ? no_cover : hits.matches.cover;
  const std::vector<uint8_t>& ref_cover = reference.hits.matches.cover.empty() ? no_cover : reference.hits.matches.cover;

  // ---- every holdout document with something delivered, on every level; its cause; accepted or not
  LeakReport rep;
  nlohmann::json checks = nlohmann::json::object();
  struct LevelCheck {
    CheckResult check;
    int64_t documents = 0, accepted = 0;
    std::map<std::string, int64_t> by_cause;
  };
  const char* level_names[] = {"exact", "verbatim", "ngram_fraction", "near_duplicate"};
  const char* level_checks[] = {"exact_documents", "verbatim_spans", "ngram_fraction", "near_duplicates"};
  LevelCheck level_results[4];
  for (int i = 0; i < 4; ++i) level_results[i].check = CheckResult(level_checks[i]);
  std::map<std::string, int64_t> cause_counts;
  int64_t judged = 0, contaminated_count = 0, accepted_count = 0, since_count = 0;
  std::set<std::pair<std::string, int64_t>> accept_used;
  nlohmann::json contaminated = nlohmann::json::array(), partial = nlohmann::json::array();
  std::vector<std::pair<double, nlohmann::json>> partial_sorted;
  std::vector<int64_t> contaminated_first_steps;  // per contaminated document: its first delivery's step
  std::set<int64_t> candidate_docs;
  for (const auto& [d, m] : hits.matches.docs) candidate_docs.insert(d);
  for (const auto& [d, fc] : hits.docs) candidate_docs.insert(d);
  for (size_t di = 0; di < hold->docs.size(); ++di)
    if (hold->docs[di].len >= lv.ngram || (eos && hold->docs[di].len >= o.min_doc_tokens)) ++judged;
  for (const int64_t di : candidate_docs) {
    const HoldoutDoc& d = hold->docs[static_cast<size_t>(di)];
    const int64_t b = d.begin, e = d.begin + d.len;
    const auto mit = hits.matches.docs.find(di);
    const DocMatches* m = mit == hits.matches.docs.end() ? nullptr : &mit->second;
    const auto xit = hits.docs.find(di);
    const FirstCount* exact_fc = xit == hits.docs.end() ? nullptr : &xit->second;
    const auto rxit = reference.hits.docs.find(di);
    const bool ref_exact = rxit != reference.hits.docs.end();
    // The document's text without its EOS: what "delivered whole" means when it was spliced in without one.
    const int64_t text_len = eos && d.len > 0 && hold->tokens[static_cast<size_t>(e - 1)] == *eos ? d.len - 1 : d.len;
    const int64_t positions = std::max<int64_t>(0, d.len - lv.ngram + 1);

    // Levels over `keep`: the whole delivery, or the part the reference holds (data) or does not (loader).
    struct Reached {
      bool level[4] = {false, false, false, false};
      int64_t covered = 0, ngram_hit = 0, longest = 0;
      bool any() const { return level[0] || level[1] || level[2] || level[3]; }
    };
    auto judge = [&](int part) {  // part 0: all, 1: data (in the reference), 2: loader (not in it)
      Reached r;
      int64_t run = 0;
      for (int64_t p = b; p < e; ++p) {
        const uint8_t c = cover.empty() ? 0 : cover[static_cast<size_t>(p)];
        const uint8_t rc = ref_cover.empty() ? 0 : ref_cover[static_cast<size_t>(p)];
        auto in_part = [&](uint8_t bit) {
          if (!(c & bit)) return false;
          return part == 0 || (part == 1 ? (rc & bit) != 0 : (rc & bit) == 0);
        };
        if (in_part(MatchSink::kCovered)) {
          ++r.covered;
          run = (c & MatchSink::kBreak) ? 1 : run + 1;  // a run continues only where the stream did (or a cut)
          r.longest = std::max(r.longest, run);
        } else {
          run = 0;
        }
        if (p + lv.ngram <= e && in_part(MatchSink::kNgramStart)) ++r.ngram_hit;
      }
      if (part == 0 && m) r.longest = std::max(r.longest, m->longest);
      const bool exact = part == 0 ? exact_fc != nullptr : part == 1 ? exact_fc && ref_exact : exact_fc && !ref_exact;
      r.level[0] = exact;
      // A document shorter than the span level counts as verbatim when its whole text was delivered.
      r.level[1] = text_len >= o.min_doc_tokens && r.longest >= std::min<int64_t>(lv.verbatim_tokens, text_len);
      // The fraction levels judge documents of at least 2k tokens: in a shorter one a single common phrase of k
      // tokens would be most of it. A shorter document counts when all its text was delivered (above).
      const bool long_enough = d.len >= 2 * lv.seed_ngram;
      r.level[2] = long_enough && positions > 0 && rate(r.ngram_hit, positions) >= lv.ngram_fraction;
      r.level[3] = long_enough && rate(r.covered, d.len) >= lv.near_duplicate;
      return r;
    };
    const Reached all = judge(0);
    const double ngram_frac = rate(all.ngram_hit, positions), near_score = rate(all.covered, d.len);
    nlohmann::json j{{"document", di},
                     {"file", holdout_ds->file(static_cast<size_t>(d.file)).path()},
                     {"token_start", d.file_start},
                     {"tokens", d.len},
                     {"longest_run", all.longest},
                     {"longest_span", m ? m->longest : 0},
                     {"ngram_fraction", ngram_frac},
                     {"near_duplicate_score", near_score},
                     {"exact", exact_fc != nullptr}};
    FirstCount first;
    if (m) first.add(m->first);
    if (exact_fc) first.add(*exact_fc);
    if (first.count > 0) {
      j["first"] = first.first;
      if (!first.first.file.empty() && first.first.token_start >= 0)
        j["source"] = {{"file", first.first.file},
                       {"token_offset", first.first.token_start + std::max<int64_t>(0, first.first.token_offset)}};
    }
    j["deliveries"] = m ? m->pieces : (exact_fc ? exact_fc->count : 0);
    j["spans_delivered"] = m ? m->first.count : 0;
    j["exact_deliveries"] = exact_fc ? exact_fc->count : 0;
    if (m) {
      j["longest_span_at"] = m->longest_at;
      j["longest_span_document_offset"] = m->longest_doc_offset;
    }
    if (!all.any()) {
      partial_sorted.emplace_back(std::max(ngram_frac, near_score), std::move(j));
      continue;
    }
    std::string cause = "unknown";
    if (o.attribute && !separate_reference) {
      cause = "data";  // the scanned loader is the correct one: whatever it delivers, the configured data holds
    } else if (o.attribute) {
      const Reached in_data = judge(1), in_loader = judge(2);
      const bool data = in_data.any(), loader = in_loader.any();
      // Neither part reaches a level alone: the cause is the part that delivered anything at all, or both.
      const bool data_some = in_data.covered > 0 || in_data.level[0], loader_some = in_loader.covered > 0 || in_loader.level[0];
      cause = data && loader ? "both" : loader ? "loader" : data ? "data"
              : data_some && loader_some ? "both" : loader_some ? "loader" : "data";
      j["data_part"] = {{"longest_run", in_data.longest}, {"ngram_fraction", rate(in_data.ngram_hit, positions)},
                        {"near_duplicate_score", rate(in_data.covered, d.len)}};
      j["loader_part"] = {{"longest_run", in_loader.longest}, {"ngram_fraction", rate(in_loader.ngram_hit, positions)},
                          {"near_duplicate_score", rate(in_loader.covered, d.len)}};
    }
    const std::pair<std::string, int64_t> key{holdout_ds->file(static_cast<size_t>(d.file)).path(), d.file_start};
    const bool listed = accept_list.count(key) > 0;
    const bool accepted = cause == "data" && (o.allow_data_overlap || listed);
    if (listed) accept_used.insert(key);
    const bool counted = !accepted && (o.since <= 0 || first.first.step > o.since);
    nlohmann::json levels = nlohmann::json::array();
    for (int i = 0; i < 4; ++i) {
      if (!all.level[i]) continue;
      levels.push_back(level_names[i]);
      LevelCheck& lc = level_results[i];
      ++lc.documents;
      ++lc.by_cause[cause];
      if (accepted) ++lc.accepted;
      if (counted) {
        StreamPosition at = first.first;
        lc.check.fail(at, "holdout document " + std::to_string(di) + " (" + key.first + " token " +
                              std::to_string(key.second) + ", cause " + cause + "): " +
                              (i == 0 ? "delivered whole"
                               : i == 1 ? "a " + std::to_string(all.longest) + "-token verbatim run delivered"
                               : i == 2 ? fmt("%.3f", ngram_frac) + " of its " + std::to_string(lv.ngram) + "-grams delivered"
                                        : fmt("%.3f", near_score) + " of its tokens delivered in spans of >= " +
                                              std::to_string(lv.seed_ngram) + " tokens"));
      }
    }
    j["levels"] = levels;
    j["cause"] = cause;
    j["accepted"] = accepted;
    if (o.since > 0) j["after_since"] = first.first.step > o.since;
    ++contaminated_count;
    ++cause_counts[cause];
    if (accepted) ++accepted_count;
    if (counted) ++since_count;
    contaminated_first_steps.push_back(first.first.step);
    contaminated.push_back(std::move(j));
  }
  for (int i = 0; i < 4; ++i) {
    LevelCheck& lc = level_results[i];
    lc.check.checked = judged;
    if (lc.check.status == "pass" && lc.accepted > 0) lc.check.status = "warn";
    lc.check.details["contaminated"] = lc.documents;
    lc.check.details["accepted"] = lc.accepted;
    lc.check.details["rate"] = rate(lc.documents, judged);
    lc.check.details["by_cause"] = lc.by_cause;
  }
  level_results[0].check.details["min_doc_tokens"] = o.min_doc_tokens;
  if (!eos) level_results[0].check.skip("the EOS id is unknown (set data.eos_id or --eos), so documents cannot be delimited");
  level_results[1].check.details["level_tokens"] = lv.verbatim_tokens;
  level_results[2].check.details["n"] = lv.ngram;
  level_results[2].check.details["level"] = lv.ngram_fraction;
  level_results[3].check.details["seed_ngram"] = lv.seed_ngram;
  level_results[3].check.details["level"] = lv.near_duplicate;
  std::stable_sort(partial_sorted.begin(), partial_sorted.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  for (size_t i = 0; i < partial_sorted.size() && i < 1000; ++i) partial.push_back(std::move(partial_sorted[i].second));

  CheckResult files("shared_files");
  if (ext) {
    files.skip("another framework's token files (" + ext->source + "): not compared file by file");
  } else {
    files.details["files"] = shared_files(probe->dataset(), *holdout_ds, files);
    files.details["training_files"] = probe->dataset().n_files();
  }
  files.details["holdout_files"] = holdout_ds->n_files();
  checks["shared_files"] = files.to_json();

  CheckResult exact_inst("exact_instances");
  exact_inst.checked = scanned.instances;
  int64_t inst_occ = 0, inst_accepted = 0;
  for (const auto& [hid, fc] : hits.instances) {
    inst_occ += fc.count;
    const bool data = !o.attribute || reference.hits.instances.count(hid) > 0;
    if (data && o.attribute && o.allow_data_overlap) {
      ++inst_accepted;
      continue;
    }
    if (o.since > 0 && fc.first.step <= o.since) continue;
    exact_inst.fail(fc.first, "holdout instance " + std::to_string(hid) + " delivered for training" +
                                  (o.attribute ? std::string(data ? " (cause data)" : " (cause loader)") : ""));
  }
  exact_inst.failures = static_cast<int64_t>(hits.instances.size()) - inst_accepted;  // holdout instances, not occurrences
  if (exact_inst.status == "pass" && inst_accepted > 0) exact_inst.status = "warn";
  exact_inst.details["holdout_instances"] = holdout_ds->size();
  exact_inst.details["contaminated"] = static_cast<int64_t>(hits.instances.size());
  exact_inst.details["accepted"] = inst_accepted;
  exact_inst.details["rate"] = rate(static_cast<int64_t>(hits.instances.size()), holdout_ds->size());
  exact_inst.details["occurrences"] = inst_occ;
  exact_inst.details["training_instances_scanned"] = scanned.instances;
  exact_inst.details["hash_matches_rejected"] = hits.hash_mismatch;  // equal XXH3, different tokens (instances and documents)
  checks["exact_instances"] = exact_inst.to_json();
  for (int i = 0; i < 4; ++i) checks[level_checks[i]] = level_results[i].check.to_json();
  const MatchSink& ms = hits.matches;
  checks["near_duplicates"]["windows_scanned"] = ms.windows;
  checks["near_duplicates"]["candidates"] = ms.index_hits;
  checks["near_duplicates"]["rejected_candidates"] = ms.rejected;
  checks["near_duplicates"]["spans_found"] = ms.mems;
  nlohmann::json unused = nlohmann::json::array();
  for (const auto& k : accept_list)
    if (!accept_used.count(k)) unused.push_back({{"file", k.first}, {"token_start", k.second}});

  // ---- audit checks
  StreamExpectation expect;
  expect.global_batch_instances = G;
  expect.microbatch_instances = mb;
  expect.world_size = W;
  expect.dataset = base.dataset;
  expect.seed = base.seed;
  expect.check_content = o.content_check;
  expect.first_step = 1;
  expect.last_step = steps;
  std::vector<int> layouts_done;
  int64_t resume_points_done = 0;
  if (o.audit_checks && !ext) {
    std::vector<std::string> paths;
    for (int r = 0; r < W; ++r)
      paths.push_back(work.path + "/stream.w" + std::to_string(W) + ".r" + std::to_string(r) + ".jsonl");
    const std::vector<AuditRecord> main = read_audit_logs(paths);
    CheckResult partition = check_partition(main, expect);
    CheckResult once = check_exactly_once(main, expect);
    if (partition.first) partition.first->world_size = W;
    if (once.first) once.first->world_size = W;

    // The single-loader stream: the reference for layouts and resumes.
    std::vector<AuditRecord> single_owned;
    if (W != 1) single_owned = audit_stream(base, 1, steps, work.path, "stream.w1");
    const std::vector<AuditRecord>& single = W == 1 ? main : single_owned;
    const std::vector<DeliveredBatch> single_by_label = batches_by_label(single);
    const std::vector<DeliveredBatch> single_delivered = batches_in_delivery_order(single, 1, G);

    // Layouts.
    CheckResult layout("audit_layout");
    std::vector<int> layouts = o.layouts;
    if (layouts.empty())
      for (int w : {2, 4, 8})
        if (w <= M) layouts.push_back(w);
    if (W != 1 && std::find(layouts.begin(), layouts.end(), W) == layouts.end()) layouts.push_back(W);
    for (const int w : layouts) {
      if (w < 2) continue;
      if (w > M) throw std::invalid_argument("leakcheck: layout W=" + std::to_string(w) + " is more than the " +
                                             std::to_string(M) + " micro-batches of a step (every rank computes at least one)");
      const std::vector<AuditRecord> recs = w == W ? main : audit_stream(base, w, steps, work.path, "layout.w" + std::to_string(w));
      if (w != W) {
        StreamExpectation ew = expect;
        ew.world_size = w;
        ew.check_content = false;  // the content was checked on the scanned stream
        CheckResult p = check_partition(recs, ew);
        if (p.first) p.first->world_size = w;
        partition.merge(p);
        CheckResult e1 = check_exactly_once(recs, ew);
        if (e1.first) e1.first->world_size = w;
        once.merge(e1);
      }
      layout.merge(compare_streams(single_by_label, batches_by_label(recs), "audit_layout", 1, -1, w));
      layouts_done.push_back(w);
    }
    if (layouts_done.empty()) layout.skip("a step has " + std::to_string(M) + " micro-batch(es): no layout other than W=1 fits");
    layout.details["layouts"] = layouts_done;
    layout.details["reference"] = "W=1";

    // Resumes.
    CheckResult resume("audit_resume");
    std::vector<int64_t> points = o.resume_at;
    if (points.empty()) {
      points.push_back(steps / 2);
      for (int64_t e = 1; e * bpe < steps && points.size() < 8; ++e) {
        points.push_back(e * bpe);
        if (e * bpe + std::max<int64_t>(1, bpe / 2) < steps) points.push_back(e * bpe + std::max<int64_t>(1, bpe / 2));
      }
    }
    std::sort(points.begin(), points.end());
    points.erase(std::unique(points.begin(), points.end()), points.end());
    nlohmann::json done_points = nlohmann::json::array();
    for (const int64_t k : points) {
      if (k < 1 || k >= steps) continue;
      CheckResult one("audit_resume");
      try {
        LoaderConfig c = base;
        c.world_size = 1;
        c.rank = -1;
        LoaderState state;
        {
          Loader before(c);
          GlobalBatch b;
          for (int64_t s = 0; s < k; ++s) before.next_batch(b);
          const nlohmann::json j = before.state();  // through its JSON form, as a checkpoint stores it
          state = j.get<LoaderState>();
        }
        const std::string path = work.path + "/resume.k" + std::to_string(k) + ".jsonl";
        c.audit = std::make_shared<AuditLog>(path);
        {
          Loader after(c);
          after.restore(state);
          GlobalBatch b;
          for (int64_t s = k; s < steps; ++s) after.next_batch(b);
          c.audit->flush();
        }
        const std::vector<AuditRecord> recs = read_audit_log(path);
        one = compare_streams(single_delivered, batches_in_delivery_order(recs, k + 1, G), "audit_resume", k + 1, steps);
      } catch (const std::exception& e) {
        StreamPosition p;
        p.step = k + 1;
        one.fail(p, std::string("resuming after step ") + std::to_string(k) + " failed: " + e.what());
      }
      done_points.push_back({{"after_step", k}, {"status", one.status}, {"failures", one.failures}});
      resume.merge(one);
      ++resume_points_done;
    }
    if (resume_points_done == 0) resume.skip("no resume point inside the checked steps");
    resume.details["resume_points"] = done_points;

    checks["audit_partition"] = partition.to_json();
    checks["audit_exactly_once"] = once.to_json();
    checks["audit_resume"] = resume.to_json();
    checks["audit_layout"] = layout.to_json();

    // A real run's logs.
    if (!external.empty()) {
      CheckResult ext("external_audit");
      int max_rank = 0;
      int64_t first_step = external.front().step, last_step = external.front().step;
      for (const AuditRecord& r : external) {
        max_rank = std::max<int>(max_rank, static_cast<int>(r.rank));
        first_step = std::min(first_step, r.step);
        last_step = std::max(last_step, r.step);
      }
      StreamExpectation ee = expect;
      // A run's logs may span layouts (a resume at another world size): each step is checked against the ranks
      // that logged it.
      ee.world_size = 0;
      (void)max_rank;
      ee.first_step = first_step;
      ee.last_step = -1;
      ee.check_content = o.content_check;
      const CheckResult p = check_partition(external, ee);
      const CheckResult e1 = check_exactly_once(external, ee);
      const CheckResult eq = compare_streams(single_by_label, batches_by_label(external), "external_audit", first_step, last_step);
      // With the layout read from each step's records, a record must also be in its own rank's file (the trainer
      // writes audit.jsonl alone, or audit-rankNNNNN.jsonl per rank): a rank's records relabelled as another's
      // cannot pass as a smaller layout.
      CheckResult files("external_rank_files");
      for (const std::string& path : o.audit_logs) {
        const std::string name = fs::path(path).filename().string();
        int64_t file_rank = -1;
        if (name == "audit.jsonl") file_rank = 0;
        else if (name.rfind("audit-rank", 0) == 0 && name.size() == std::string("audit-rank00000.jsonl").size())
          file_rank = std::strtoll(name.substr(10, 5).c_str(), nullptr, 10);
        if (file_rank < 0) continue;
        for (const AuditRecord& r : read_audit_log(path)) {
          ++files.checked;
          if (r.rank == file_rank) continue;
          StreamPosition at;
          at.step = r.step, at.epoch = r.epoch, at.microbatch = r.microbatch, at.rank = r.rank;
          at.instance = r.instance, at.file = r.file, at.token_start = r.token_start;
          files.fail(at, path + " is rank " + std::to_string(file_rank) + "'s log but holds a record of rank " +
                             std::to_string(r.rank));
        }
      }
      CheckResult overlap("external_holdout");
      for (const AuditRecord& r : external) {
        ++overlap.checked;
        const auto it = hold->instance_hash.find(r.xxh3);
        if (it == hold->instance_hash.end()) continue;
        // The configured data itself delivers that holdout instance, and the user accepted data overlaps.
        if (o.allow_data_overlap && o.attribute && reference.hits.instances.count(it->second)) continue;
        StreamPosition at;
        at.step = r.step;
        at.epoch = r.epoch;
        at.microbatch = r.microbatch;
        at.rank = r.rank;
        at.instance = r.instance;
        at.file = r.file;
        at.token_start = r.token_start;
        overlap.fail(at, "the log's instance has the XXH3 of holdout instance " + std::to_string(it->second));
      }
      ext.merge(p);
      ext.merge(files);
      ext.merge(e1);
      ext.merge(eq);
      ext.merge(overlap);
      ext.checked = static_cast<int64_t>(external.size());
      ext.details["files"] = o.audit_logs;
      ext.details["records"] = static_cast<int64_t>(external.size());
      ext.details["partition"] = p.to_json();
      ext.details["rank_files"] = files.to_json();
      ext.details["exactly_once"] = e1.to_json();
      ext.details["equals_configured_stream"] = eq.to_json();
      ext.details["holdout_instances"] = overlap.to_json();
      checks["external_audit"] = ext.to_json();
    }
  } else {
    for (const char* name : {"audit_partition", "audit_exactly_once", "audit_resume", "audit_layout"}) {
      CheckResult s(name);
      s.skip(ext ? "another framework's run: olmoref's loader audit does not apply" : "audit checks turned off");
      checks[name] = s.to_json();
    }
  }

  // ---- verdict
  for (const char* name : {"shared_files", "exact_instances", "exact_documents", "verbatim_spans", "ngram_fraction", "near_duplicates"})
    if (checks[name]["status"] == "fail") rep.contaminated = true;
  for (const char* name : {"audit_partition", "audit_exactly_once", "audit_resume", "audit_layout", "external_audit"})
    if (checks.contains(name) && checks[name]["status"] == "fail") rep.audit_failed = true;
  const std::string verdict = rep.contaminated && rep.audit_failed ? "contaminated+audit-failure"
                              : rep.contaminated                   ? "contaminated"
                              : rep.audit_failed                   ? "audit-failure"
                                                                   : "clean";
  // Evaluations affected: an evaluation after step E saw a model trained on every document delivered by then.
  std::sort(contaminated_first_steps.begin(), contaminated_first_steps.end());
  nlohmann::json affected{{"since", o.since > 0 ? nlohmann::json(o.since) : nlohmann::json(nullptr)},
                          {"first_step", contaminated_first_steps.empty() ? nlohmann::json(nullptr)
                                                                          : nlohmann::json(contaminated_first_steps.front())},
                          {"eval_interval", o.eval_interval}};
  nlohmann::json evals = nlohmann::json::array();
  if (o.eval_interval > 0 && !contaminated_first_steps.empty()) {
    for (int64_t e = o.eval_interval; e <= steps && evals.size() < 1000; e += o.eval_interval) {
      if (e <= o.since) continue;
      const int64_t n = std::upper_bound(contaminated_first_steps.begin(), contaminated_first_steps.end(), e) -
                        contaminated_first_steps.begin();
      if (n > 0) evals.push_back({{"step", e}, {"documents", n}});
    }
  }
  affected["evaluations"] = evals;

  const double total_seconds = seconds_since(t_start);
  nlohmann::json& j = rep.json;
  j["format"] = "olmoref-leakcheck/2";
  j["status"] = verdict;
  j["config"] = o.config_path;
  j["run"] = {{"train_mix", ext ? ext->source : configured.mix().source},
              {"dataset_fingerprint", ext ? nlohmann::json(nullptr) : nlohmann::json(probe->dataset().fingerprint())},
              {"holdout", base.holdout.describe()},
              {"seed", base.seed},
              {"sequence_length", L},
              {"global_batch_instances", G},
              {"microbatch_instances", mb},
              {"batches_per_epoch", bpe},
              {"eos_id", eos ? nlohmann::json(*eos) : nlohmann::json(nullptr)}};
  if (base.debug_bug != PlantedBug::none) j["run"]["planted_bug"] = planted_bug_name(base.debug_bug);
  j["levels"] = {{"verbatim_tokens", lv.verbatim_tokens}, {"ngram", lv.ngram}, {"ngram_fraction", lv.ngram_fraction},
                 {"seed_ngram", lv.seed_ngram}, {"near_duplicate", lv.near_duplicate},
                 {"min_doc_tokens", o.min_doc_tokens}};
  j["stream"] = {{"steps", steps},
                 {"epochs", bpe > 0 ? (steps + bpe - 1) / bpe : 0},
                 {"world_size", W},
                 {"instances", scanned.instances},
                 {"tokens", scanned.tokens},
                 {"scan_seconds", scanned.seconds},
                 {"tokens_per_second", scanned.seconds > 0 ? static_cast<double>(scanned.tokens) / scanned.seconds : 0.0},
                 {"threads", pool.size()}};
  if (ext) {
    j["run"]["framework"] = ext->framework;
    j["run"]["global_batch_instances"] = ext->pieces_per_step;
    j["run"]["microbatch_instances"] = ext->pieces_per_microbatch > 0 ? nlohmann::json(ext->pieces_per_microbatch) : nlohmann::json(nullptr);
    j["run"]["sample_tokens"] = ext->piece_tokens;
    j["run"]["batches_per_epoch"] = nullptr;
    j["run"][ext->framework] = ext->info;
    j["stream"]["epochs"] = nullptr;
    j["stream"]["steps_available"] = ext->steps;
  }
  j["attribution"] = {{"enabled", o.attribute},
                      {"reference", !o.attribute ? "none (--no-attribution)"
                                    : ext ? "the framework's own index files: the stream its loader delivers"
                                    : separate_reference ? "a separate scan of the configured data through a correct loader"
                                                         : "the scanned stream (its loader is the correct one)"},
                      {"seconds", separate_reference ? reference.seconds : 0.0}};
  j["holdout"] = {{"files", holdout_ds->n_files()},
                  {"tokens", static_cast<int64_t>(hold->tokens.size())},
                  {"instances", holdout_ds->size()},
                  {"documents", static_cast<int64_t>(hold->docs.size())},
                  {"documents_judged", judged},
                  {"documents_are_instances", hold->docs_are_instances},
                  {"ngrams", hold->ngram_positions},
                  {"seed_ngrams", index.seeds()},
                  {"index", o.bloom ? "bloom" : "exact"},
                  {"index_bytes", index.bytes()},
                  {"index_seconds", index_seconds}};
  j["counts"] = {{"contaminated", contaminated_count},
                 {"accepted", accepted_count},
                 {"counted", since_count},
                 {"by_level", {{"exact", level_results[0].documents}, {"verbatim", level_results[1].documents},
                               {"ngram_fraction", level_results[2].documents}, {"near_duplicate", level_results[3].documents}}},
                 {"by_cause", cause_counts}};
  j["accept"] = {{"allow_data_overlap", o.allow_data_overlap},
                 {"file", o.accept_file.empty() ? nlohmann::json(nullptr) : nlohmann::json(o.accept_file)},
                 {"listed", static_cast<int64_t>(accept_list.size())},
                 {"unused", unused}};
  j["affected"] = affected;
  j["checks"] = checks;
  j["contaminated_documents"] = contaminated;
  j["partial_overlaps"] = partial;
  j["seconds"] = total_seconds;
  j["work_dir"] = work.remove ? nlohmann::json(nullptr) : nlohmann::json(work.path);

  // ---- summary
  std::string s = "olmoref leakcheck: " + std::string(verdict == "clean" ? "CLEAN" : verdict == "contaminated" ? "CONTAMINATED"
                                                                      : verdict == "audit-failure"        ? "AUDIT FAILURE"
                                                                                                          : "CONTAMINATED + AUDIT FAILURE") +
                  (accepted_count > 0 ? " (" + std::to_string(accepted_count) + " known data overlap(s) accepted)" : "") + "\n";
  s += "stream: " + std::to_string(steps) + " steps (" + std::to_string(scanned.instances) + " instances, " +
       std::to_string(scanned.tokens) + " tokens) on " + std::to_string(W) + " rank(s); scanned at " +
       fmt("%.3g", scanned.seconds > 0 ? static_cast<double>(scanned.tokens) / scanned.seconds : 0.0) + " tokens/s\n";
  s += "holdout: " + std::to_string(hold->docs.size()) + (hold->docs_are_instances ? " instance-documents, " : " documents, ") +
       std::to_string(holdout_ds->size()) + " instances, " + std::to_string(hold->tokens.size()) + " tokens (" +
       (o.bloom ? "Bloom" : "exact") + " " + std::to_string(lv.seed_ngram) + "-gram index " +
       fmt("%.1f", static_cast<double>(index.bytes()) / (1 << 20)) + " MiB)\n";
  s += "levels: verbatim span >= " + std::to_string(lv.verbatim_tokens) + " tokens, " + fmt("%.2f", lv.ngram_fraction) +
       " of " + std::to_string(lv.ngram) + "-grams, near-duplicate " + fmt("%.2f", lv.near_duplicate) + " (spans >= " +
       std::to_string(lv.seed_ngram) + ")\n";
  if (contaminated_count > 0) {
    std::string causes;
    for (const auto& [c, n] : cause_counts) causes += (causes.empty() ? "" : ", ") + std::to_string(n) + " " + c;
    s += "contaminated holdout documents: " + std::to_string(contaminated_count) + " (cause: " + causes + ")";
    if (accepted_count > 0) s += ", " + std::to_string(accepted_count) + " accepted as known data overlap";
    if (o.since > 0) s += ", " + std::to_string(since_count) + " first delivered after step " + std::to_string(o.since) + " and not accepted";
    s += "; first delivered at step " + std::to_string(contaminated_first_steps.front()) + "\n";
    int shown = 0;
    for (const nlohmann::json& d : contaminated) {
      if (++shown > 10) {
        s += "    ... " + std::to_string(contaminated_count - 10) + " more in the report\n";
        break;
      }
      std::string lvls;
      for (const auto& l : d["levels"]) lvls += (lvls.empty() ? "" : ",") + l.get<std::string>();
      s += "    " + d["file"].get<std::string>() + " token " + std::to_string(d["token_start"].get<int64_t>()) + " (" +
           std::to_string(d["tokens"].get<int64_t>()) + " tokens): " + lvls + ", cause " + d["cause"].get<std::string>() +
           (d["accepted"].get<bool>() ? " (accepted)" : "") + ", longest run " + std::to_string(d["longest_run"].get<int64_t>()) +
           ", first at " + (d.contains("first") ? position_text(d["first"]) : std::string("?")) + "\n";
    }
    if (!evals.empty())
      s += "affected evaluations: every one from step " + std::to_string(evals.front()["step"].get<int64_t>()) + " (" +
           std::to_string(evals.size()) + " of the run's evaluations" + (o.since > 0 ? " after step " + std::to_string(o.since) : "") + ")\n";
  }
  if (!unused.empty()) s += "accept file: " + std::to_string(unused.size()) + " listed document(s) not contaminated (stale entries?)\n";
  for (const char* name : {"shared_files", "exact_instances", "exact_documents", "verbatim_spans", "ngram_fraction", "near_duplicates",
                           "audit_partition", "audit_exactly_once", "audit_resume", "audit_layout", "external_audit"}) {
    if (!checks.contains(name)) continue;
    const std::string key = name;
    const nlohmann::json& c = checks[key];
    char line[96];
    std::snprintf(line, sizeof line, "  %-20s %-8s", name, c["status"].get<std::string>().c_str());
    std::string extra;
    if (c.contains("contaminated")) {
      const std::string unit = key == "exact_instances" ? " holdout instances" : " holdout documents";
      extra += std::to_string(c["contaminated"].get<int64_t>()) + unit + " (" + fmt("%.2f%%", 100.0 * c["rate"].get<double>()) + ")";
      if (c.value("accepted", int64_t{0}) > 0) extra += ", " + std::to_string(c["accepted"].get<int64_t>()) + " accepted";
    } else if (c["status"] == "fail") {
      extra += std::to_string(c["failures"].get<int64_t>()) + " failure(s)";
    } else if (c["status"] == "skipped") {
      extra += c.value("reason", "");
    }
    if (c.contains("first")) {
      const std::string pos = position_text(c["first"]);
      if (!pos.empty()) extra += (extra.empty() ? "" : "; ") + std::string("first at ") + pos;
      if (c["first"].contains("reason")) extra += ": " + c["first"]["reason"].get<std::string>();
    }
    s += line + extra + "\n";
  }
  rep.summary = s;
  return rep;
}

}  // namespace olmoref::data
