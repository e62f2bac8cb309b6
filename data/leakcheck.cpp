#include "data/leakcheck.h"

#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <map>
#include <set>
#include <stdexcept>
#include <thread>
#include <unordered_map>

#include "data/audit_check.h"
#include "data/ngram.h"
#include "ref/parallel.h"

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
  int64_t exact_docs = 0;                               // documents eligible for the exact check
  int64_t ngram_positions = 0;
  int64_t ngram_docs = 0;  // documents with at least one n-gram

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
    ++h->exact_docs;
    h->doc_hash.emplace(xxh3_u32(h->tokens.data() + doc.begin, doc.len), static_cast<int64_t>(i));
  }
  return h;
}

// ---------------------------------------------------------------------------------------------
// Scanning the stream.

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

struct Variant {
  std::vector<uint32_t> tokens;  // the n-gram as found in the stream
  FirstCount where;
  bool verified = false;
};

using CandidateMap = std::unordered_map<uint64_t, std::vector<Variant>>;  // n-gram hash -> token variants

struct PartHits {
  std::unordered_map<int64_t, FirstCount> instances;  // holdout instance -> occurrences
  std::unordered_map<int64_t, FirstCount> docs;       // holdout document -> occurrences
  CandidateMap ngrams;
  int64_t windows = 0, positives = 0, hash_mismatch = 0;
  std::vector<uint64_t> keys, scratch;
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
  const NgramSet& set;
  const NgramHasher& hasher;
  int64_t L;
  std::optional<uint32_t> eos;
  int64_t min_doc_tokens;
};

void probe_ngrams(const ScanContext& c, const uint32_t* t, int64_t len, const StreamPosition& at, PartHits& out);

void scan_instance(const ScanContext& c, const uint32_t* t, const StreamPosition& at, PartHits& out) {
  const int64_t L = c.L;
  // Exact instance.
  if (const auto it = c.h.instance_hash.find(xxh3_u32(t, L)); it != c.h.instance_hash.end()) {
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
  probe_ngrams(c, t, L, at, out);
}

void probe_ngrams(const ScanContext& c, const uint32_t* t, int64_t len, const StreamPosition& at, PartHits& out) {
  const int n = c.hasher.n();
  if (len < n) return;
  out.keys.resize(static_cast<size_t>(len));
  const size_t count = c.hasher.hash_all(std::span<const uint32_t>(t, static_cast<size_t>(len)), out.keys.data(), out.scratch);
  out.windows += static_cast<int64_t>(count);
  c.set.probe(out.keys.data(), count, [&](size_t i) {
    ++out.positives;
    std::vector<Variant>& vs = out.ngrams[out.keys[i]];
    const uint32_t* g = t + i;
    Variant* v = nullptr;
    for (Variant& x : vs)
      if (std::equal(g, g + n, x.tokens.begin())) v = &x;
    if (!v) {
      vs.push_back(Variant{std::vector<uint32_t>(g, g + n), {}, false});
      v = &vs.back();
    }
    StreamPosition where = at;
    where.token_offset = static_cast<int64_t>(i);
    v->where.add(where);
  });
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

void merge_candidates(CandidateMap& into_map, CandidateMap& from) {
  for (auto& [h, vs] : from) {
    std::vector<Variant>& into = into_map[h];
    for (Variant& v : vs) {
      auto it = std::find_if(into.begin(), into.end(), [&](const Variant& x) { return x.tokens == v.tokens; });
      if (it == into.end()) into.push_back(std::move(v));
      else it->where.add(v.where);
    }
  }
  from.clear();
}

// The static check: every token of the configured training files (tails included), in pieces of
// 1M windows that overlap by n - 1 tokens, no loader involved.
CandidateMap scan_files(const FslDataset& ds, const ScanContext& c, ThreadPool& pool, int64_t* windows, int64_t* tokens) {
  struct Piece {
    size_t file;
    int64_t start, len;
  };
  constexpr int64_t kPiece = int64_t{1} << 20;
  const int64_t n = c.hasher.n();
  std::vector<Piece> pieces;
  for (size_t f = 0; f < ds.n_files(); ++f) {
    const int64_t nt = ds.file(f).n_tokens();
    *tokens += nt;
    for (int64_t s = 0; s + n <= nt; s += kPiece) pieces.push_back({f, s, std::min(nt - s, kPiece + n - 1)});
  }
  std::vector<PartHits> parts(static_cast<size_t>(pool.size()));
  const int64_t P = static_cast<int64_t>(parts.size()), N = static_cast<int64_t>(pieces.size());
  pool.parallel_for(P, 1, [&](int64_t p0, int64_t p1) {
    std::vector<uint32_t> buf;
    for (int64_t p = p0; p < p1; ++p) {
      for (int64_t i = N * p / P; i < N * (p + 1) / P; ++i) {
        const Piece& pc = pieces[static_cast<size_t>(i)];
        const TokenFile& tf = ds.file(pc.file);
        buf.resize(static_cast<size_t>(pc.len));
        tf.read(pc.start, buf, 0);
        StreamPosition at;
        at.file = tf.path();
        at.token_start = pc.start;
        probe_ngrams(c, buf.data(), pc.len, at, parts[static_cast<size_t>(p)]);
      }
    }
  });
  CandidateMap all;
  for (PartHits& p : parts) {
    *windows += p.windows;
    merge_candidates(all, p.ngrams);
  }
  return all;
}

// Re-verification: every holdout n-gram whose hash is a candidate is compared token by token.
// hit[pos_begin[d] + i] = 1 when n-gram i of document d was found; where[d] = its first occurrence.
struct Coverage {
  std::vector<uint8_t> hit;
  std::vector<int64_t> hits;      // per document
  std::vector<FirstCount> where;  // per document
  int64_t candidates_distinct = 0, verified_distinct = 0, verified_occurrences = 0, rejected_occurrences = 0;
};

Coverage verify(const Holdout& h, const NgramHasher& hasher, const std::vector<int64_t>& pos_begin, CandidateMap& cand) {
  Coverage cov;
  const int n = hasher.n();
  cov.hit.assign(static_cast<size_t>(pos_begin.back()), 0);
  cov.hits.assign(h.docs.size(), 0);
  cov.where.assign(h.docs.size(), FirstCount{});
  if (!cand.empty()) {
    std::vector<uint64_t> keys, scratch;
    for (size_t di = 0; di < h.docs.size(); ++di) {
      const HoldoutDoc& d = h.docs[di];
      if (d.len < n) continue;
      const uint32_t* t = h.tokens.data() + d.begin;
      keys.resize(static_cast<size_t>(d.len));
      const size_t count = hasher.hash_all(std::span<const uint32_t>(t, static_cast<size_t>(d.len)), keys.data(), scratch);
      for (size_t i = 0; i < count; ++i) {
        const auto it = cand.find(keys[i]);
        if (it == cand.end()) continue;
        for (Variant& v : it->second) {
          if (!std::equal(t + i, t + i + n, v.tokens.begin())) continue;
          v.verified = true;
          cov.hit[static_cast<size_t>(pos_begin[di]) + i] = 1;
          ++cov.hits[di];
          cov.where[di].add(v.where.first);
          break;
        }
      }
    }
  }
  for (const auto& [hash, vs] : cand) {
    (void)hash;
    for (const Variant& v : vs) {
      ++cov.candidates_distinct;
      if (v.verified) {
        ++cov.verified_distinct;
        cov.verified_occurrences += v.where.count;
      } else {
        cov.rejected_occurrences += v.where.count;
      }
    }
  }
  return cov;
}

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

// Same file on both sides: same path, or same size and content.
nlohmann::json shared_files(const FslDataset& train, const FslDataset& holdout, CheckResult& res) {
  nlohmann::json list = nlohmann::json::array();
  std::map<int64_t, std::vector<size_t>> by_size;
  for (size_t j = 0; j < holdout.n_files(); ++j) by_size[holdout.file(j).size_bytes()].push_back(j);
  auto canonical = [](const std::string& p) {
    std::error_code ec;
    const fs::path c = fs::weakly_canonical(p, ec);
    return ec ? p : c.string();
  };
  auto content_hash = [](const TokenFile& f) {
    std::vector<uint32_t> t(static_cast<size_t>(f.n_tokens()));
    f.read(0, t, 0);
    return xxh3_u32(t.data(), static_cast<int64_t>(t.size()));
  };
  std::map<size_t, uint64_t> holdout_hash;
  for (size_t i = 0; i < train.n_files(); ++i) {
    ++res.checked;
    const TokenFile& tf = train.file(i);
    const auto it = by_size.find(tf.size_bytes());
    if (it == by_size.end()) continue;
    for (const size_t j : it->second) {
      const TokenFile& hf = holdout.file(j);
      bool same = canonical(tf.path()) == canonical(hf.path());
      std::string how = "same path";
      if (!same) {
        if (!holdout_hash.count(j)) holdout_hash[j] = content_hash(hf);
        same = content_hash(tf) == holdout_hash[j];
        how = "same size and XXH3";
      }
      if (!same) continue;
      StreamPosition p;  // static: no stream position
      res.fail(p, "training file " + tf.path() + " is holdout file " + hf.path() + " (" + how + ")");
      list.push_back({{"train_file", tf.path()}, {"train_index", i}, {"holdout_file", hf.path()}, {"holdout_index", j},
                      {"match", how}});
    }
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
  if (o.world_size < 1 || M < o.world_size)
    throw std::invalid_argument("leakcheck: --world-size " + std::to_string(o.world_size) + " is more than the " +
                                std::to_string(M) + " micro-batches of a step (every rank computes at least one)");

  // The loader under test, once, for the dataset it serves. The holdout is opened as
  // Loader::holdout_dataset() does (the training sequence length, vocabulary and dtype), except that
  // a holdout file shorter than one instance is kept: its documents are held out all the same.
  Loader probe_loader(base);
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
  const auto t_index = std::chrono::steady_clock::now();
  const std::unique_ptr<Holdout> hold = load_holdout(holdout_ds, eos, o.min_doc_tokens);
  const NgramHasher hasher(o.ngram);
  for (const HoldoutDoc& d : hold->docs) {
    if (d.len >= o.ngram) {
      hold->ngram_positions += d.len - o.ngram + 1;
      ++hold->ngram_docs;
    }
  }
  NgramSet set(o.bloom ? NgramSet::Kind::bloom : NgramSet::Kind::exact, hold->ngram_positions, o.bloom_bits_per_ngram);
  {
    std::vector<uint64_t> keys, scratch;
    for (const HoldoutDoc& d : hold->docs) {
      if (d.len < o.ngram) continue;
      keys.resize(static_cast<size_t>(d.len));
      const size_t n = hasher.hash_all(std::span<const uint32_t>(hold->tokens.data() + d.begin, static_cast<size_t>(d.len)),
                                       keys.data(), scratch);
      for (size_t i = 0; i < n; ++i) set.insert(keys[i]);
    }
  }
  const double index_seconds = seconds_since(t_index);

  // ---- scan the stream (the scanned layout: W rank loaders, each scanning its micro-batches)
  ThreadPool pool(o.threads);
  std::vector<PartHits> parts(static_cast<size_t>(pool.size()));
  const ScanContext ctx{*hold, set, hasher, L, eos, o.min_doc_tokens};
  const int W = o.world_size;
  int64_t scanned_tokens = 0, scanned_instances = 0;
  const auto t_scan = std::chrono::steady_clock::now();
  for (int r = 0; r < W; ++r) {
    RankStream stream(base, W, r, work.path + "/stream.w" + std::to_string(W) + ".r" + std::to_string(r) + ".jsonl", steps);
    Chunk cur, next;
    bool have = stream.fill(cur, o.chunk_tokens);
    while (have) {
      bool have_next = false;
      std::exception_ptr err;
      std::thread producer([&] {
        try {
          have_next = stream.fill(next, o.chunk_tokens);
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
      scanned_tokens += static_cast<int64_t>(cur.tokens.size());
      scanned_instances += static_cast<int64_t>(cur.where.size());
      std::swap(cur, next);
      have = have_next;
    }
  }
  const double scan_seconds = seconds_since(t_scan);

  // ---- merge and verify
  std::unordered_map<int64_t, FirstCount> inst_hits, doc_hits;
  CandidateMap cand;
  int64_t windows = 0, positives = 0, hash_mismatch = 0;
  for (PartHits& p : parts) {
    for (auto& [k, v] : p.instances) inst_hits[k].add(v);
    for (auto& [k, v] : p.docs) doc_hits[k].add(v);
    merge_candidates(cand, p.ngrams);
    windows += p.windows;
    positives += p.positives;
    hash_mismatch += p.hash_mismatch;
  }
  parts.clear();
  std::vector<int64_t> pos_begin(hold->docs.size() + 1, 0);
  for (size_t di = 0; di < hold->docs.size(); ++di)
    pos_begin[di + 1] = pos_begin[di] + std::max<int64_t>(0, hold->docs[di].len - o.ngram + 1);
  const Coverage stream_cov = verify(*hold, hasher, pos_begin, cand);
  cand.clear();

  // ---- the static check over the configured training files (what the data itself shares with the holdout)
  Coverage data_cov;
  int64_t static_windows = 0, static_tokens = 0;
  double static_seconds = 0.0;
  if (o.static_check) {
    const auto t0 = std::chrono::steady_clock::now();
    CandidateMap sc = scan_files(configured, ctx, pool, &static_windows, &static_tokens);
    data_cov = verify(*hold, hasher, pos_begin, sc);
    static_seconds = seconds_since(t0);
  }

  // ---- checks
  LeakReport rep;
  nlohmann::json checks = nlohmann::json::object();

  CheckResult files("shared_files");
  const nlohmann::json shared = shared_files(probe_loader.dataset(), *holdout_ds, files);
  files.details["files"] = shared;
  files.details["training_files"] = probe_loader.dataset().n_files();
  files.details["holdout_files"] = holdout_ds->n_files();
  checks["shared_files"] = files.to_json();

  CheckResult exact_inst("exact_instances");
  exact_inst.checked = scanned_instances;
  int64_t inst_occ = 0;
  for (const auto& [hid, fc] : inst_hits) {
    inst_occ += fc.count;
    exact_inst.fail(fc.first, "holdout instance " + std::to_string(hid) + " delivered for training");
  }
  exact_inst.failures = static_cast<int64_t>(inst_hits.size());  // holdout instances, not occurrences
  exact_inst.details["holdout_instances"] = holdout_ds->size();
  exact_inst.details["contaminated"] = static_cast<int64_t>(inst_hits.size());
  exact_inst.details["rate"] = rate(static_cast<int64_t>(inst_hits.size()), holdout_ds->size());
  exact_inst.details["occurrences"] = inst_occ;
  exact_inst.details["training_instances_scanned"] = scanned_instances;
  exact_inst.details["hash_matches_rejected"] = hash_mismatch;  // equal XXH3, different tokens (instances and documents)
  checks["exact_instances"] = exact_inst.to_json();

  CheckResult exact_doc("exact_documents");
  int64_t doc_occ = 0;
  if (!eos) {
    exact_doc.skip("the EOS id is unknown (set data.eos_id or --eos), so documents cannot be delimited");
  } else {
    exact_doc.checked = scanned_instances;
    for (const auto& [di, fc] : doc_hits) {
      doc_occ += fc.count;
      exact_doc.fail(fc.first, "holdout document " + std::to_string(di) + " found whole in a training instance");
    }
    exact_doc.failures = static_cast<int64_t>(doc_hits.size());
  }
  exact_doc.details["documents"] = hold->exact_docs;
  exact_doc.details["min_doc_tokens"] = o.min_doc_tokens;
  exact_doc.details["contaminated"] = static_cast<int64_t>(doc_hits.size());
  exact_doc.details["rate"] = rate(static_cast<int64_t>(doc_hits.size()), hold->exact_docs);
  exact_doc.details["occurrences"] = doc_occ;
  checks["exact_documents"] = exact_doc.to_json();

  CheckResult near_check("near_ngrams"), static_check("static_ngrams");
  near_check.checked = windows;
  static_check.checked = static_windows;
  if (!o.static_check) static_check.skip("turned off (--no-static)");
  int64_t docs_with_hits = 0, docs_contaminated = 0, docs_over_threshold = 0, positions_hit = 0, data_docs = 0;
  nlohmann::json contaminated = nlohmann::json::array(), data_overlaps = nlohmann::json::array(),
                 partial = nlohmann::json::array();
  std::vector<std::pair<double, nlohmann::json>> partial_sorted;
  for (size_t di = 0; di < hold->docs.size(); ++di) {
    const int64_t positions = pos_begin[di + 1] - pos_begin[di];
    const int64_t hit = stream_cov.hits[di];
    int64_t unexplained = hit, in_data = 0;
    if (o.static_check && positions > 0) {
      unexplained = 0;
      in_data = data_cov.hits[di];
      for (int64_t i = pos_begin[di]; i < pos_begin[di + 1]; ++i)
        unexplained += stream_cov.hit[static_cast<size_t>(i)] && !data_cov.hit[static_cast<size_t>(i)];
    }
    const auto exact_it = doc_hits.find(static_cast<int64_t>(di));
    const bool exact = exact_it != doc_hits.end();
    const double frac = rate(hit, positions), frac_unexplained = rate(unexplained, positions), frac_data = rate(in_data, positions);
    positions_hit += hit;
    if (hit > 0) ++docs_with_hits;
    if (hit > 0 && frac >= o.near_threshold) ++docs_over_threshold;
    // Loader-caused: n-grams the stream holds that the configured training data does not.
    const bool near_bad = positions > 0 && unexplained > 0 && frac_unexplained >= o.near_threshold;
    const bool data_bad = o.static_check && positions > 0 && in_data > 0 && frac_data >= o.near_threshold;
    if (near_bad) {
      ++docs_contaminated;
      near_check.fail(stream_cov.where[di].first,
                      "holdout document " + std::to_string(di) + ": " + fmt("%.3f", frac_unexplained) + " of its " +
                          std::to_string(o.ngram) + "-grams occur in the training stream but not in the configured training data");
    }
    if (data_bad) {
      ++data_docs;
      static_check.fail(data_cov.where[di].first, "holdout document " + std::to_string(di) + ": " + fmt("%.3f", frac_data) +
                                                      " of its " + std::to_string(o.ngram) +
                                                      "-grams occur in the configured training files");
    }
    if (!near_bad && !exact && !data_bad && hit == 0) continue;
    const HoldoutDoc& d = hold->docs[di];
    nlohmann::json j{{"document", di},
                     {"file", holdout_ds->file(static_cast<size_t>(d.file)).path()},
                     {"token_start", d.file_start},
                     {"tokens", d.len},
                     {"ngrams", positions},
                     {"ngrams_hit", hit},
                     {"hit_fraction", frac},
                     {"exact", exact}};
    if (o.static_check) {
      j["data_fraction"] = frac_data;
      j["unexplained_fraction"] = frac_unexplained;
    }
    // "loader": the stream holds n-grams the configured data does not; "data": the configured training
    // files themselves hold them (near-duplicates across the split, or a holdout file in the mix).
    j["cause"] = near_bad || (exact && (!o.static_check || unexplained > 0)) ? "loader" : exact || data_bad ? "data" : "none";
    FirstCount first = stream_cov.where[di];
    if (exact) first.add(exact_it->second);
    if (first.count > 0) j["first"] = first.first;
    if (near_bad || exact) contaminated.push_back(std::move(j));
    else if (data_bad) data_overlaps.push_back(std::move(j));
    else partial_sorted.emplace_back(frac, std::move(j));
  }
  near_check.failures = docs_contaminated;
  static_check.failures = data_docs;
  if (static_check.failed() && !o.strict) static_check.status = "warn";
  std::stable_sort(partial_sorted.begin(), partial_sorted.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  for (size_t i = 0; i < partial_sorted.size() && i < 1000; ++i) partial.push_back(std::move(partial_sorted[i].second));
  static_check.details["contaminated"] = data_docs;
  static_check.details["rate"] = rate(data_docs, hold->ngram_docs);
  static_check.details["documents"] = hold->ngram_docs;
  static_check.details["threshold"] = o.near_threshold;
  static_check.details["training_tokens"] = static_tokens;
  static_check.details["windows_scanned"] = static_windows;
  static_check.details["verified_distinct"] = data_cov.verified_distinct;
  static_check.details["seconds"] = static_seconds;
  static_check.details["note"] =
      "holdout documents whose n-grams the configured training data itself holds (near-duplicates across the "
      "split); not caused by the loader. A warning unless --strict";
  near_check.details["n"] = o.ngram;
  near_check.details["mode"] = o.bloom ? "bloom" : "exact";
  near_check.details["threshold"] = o.near_threshold;
  near_check.details["attribution"] = o.static_check ? "n-grams not in the configured training data" : "none (--no-static)";
  near_check.details["documents"] = hold->ngram_docs;
  near_check.details["documents_too_short"] = static_cast<int64_t>(hold->docs.size()) - hold->ngram_docs;
  near_check.details["documents_with_hits"] = docs_with_hits;
  near_check.details["documents_over_threshold"] = docs_over_threshold;
  near_check.details["contaminated"] = docs_contaminated;
  near_check.details["rate"] = rate(docs_contaminated, hold->ngram_docs);
  near_check.details["holdout_ngrams"] = hold->ngram_positions;
  near_check.details["holdout_ngrams_distinct"] = o.bloom ? nlohmann::json(nullptr) : nlohmann::json(set.inserted());
  near_check.details["holdout_ngrams_hit"] = positions_hit;
  near_check.details["windows_scanned"] = windows;
  near_check.details["candidates"] = positives;
  near_check.details["candidates_distinct"] = stream_cov.candidates_distinct;
  near_check.details["verified_distinct"] = stream_cov.verified_distinct;
  near_check.details["verified_occurrences"] = stream_cov.verified_occurrences;
  near_check.details["rejected_occurrences"] = stream_cov.rejected_occurrences;
  near_check.details["index_bytes"] = set.bytes();
  if (o.bloom) {
    near_check.details["bloom"] = {{"bits_per_ngram", o.bloom_bits_per_ngram},
                                   {"hashes", 16},
                                   {"block_bits", 512},
                                   {"expected_false_positive_rate", set.expected_false_positive_rate()},
                                   {"observed_false_positive_rate", rate(stream_cov.rejected_occurrences, windows)}};
  }
  checks["static_ngrams"] = static_check.to_json();
  checks["near_ngrams"] = near_check.to_json();

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
  if (o.audit_checks) {
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
      s.skip("audit checks turned off");
      checks[name] = s.to_json();
    }
  }

  // ---- verdict
  for (const char* name : {"shared_files", "exact_instances", "exact_documents", "near_ngrams", "static_ngrams"})
    if (checks[name]["status"] == "fail") rep.contaminated = true;
  for (const char* name : {"audit_partition", "audit_exactly_once", "audit_resume", "audit_layout", "external_audit"})
    if (checks.contains(name) && checks[name]["status"] == "fail") rep.audit_failed = true;
  const std::string verdict = rep.contaminated && rep.audit_failed ? "contaminated+audit-failure"
                              : rep.contaminated                   ? "contaminated"
                              : rep.audit_failed                   ? "audit-failure"
                                                                   : "clean";
  const double total_seconds = seconds_since(t_start);
  nlohmann::json& j = rep.json;
  j["format"] = "olmoref-leakcheck/1";
  j["status"] = verdict;
  j["config"] = o.config_path;
  j["run"] = {{"train_mix", configured.mix().source},
              {"dataset_fingerprint", probe_loader.dataset().fingerprint()},
              {"holdout", base.holdout.describe()},
              {"seed", base.seed},
              {"sequence_length", L},
              {"global_batch_instances", G},
              {"microbatch_instances", mb},
              {"batches_per_epoch", bpe},
              {"eos_id", eos ? nlohmann::json(*eos) : nlohmann::json(nullptr)}};
  if (base.debug_bug != PlantedBug::none) j["run"]["planted_bug"] = planted_bug_name(base.debug_bug);
  j["stream"] = {{"steps", steps},
                 {"epochs", bpe > 0 ? (steps + bpe - 1) / bpe : 0},
                 {"world_size", W},
                 {"instances", scanned_instances},
                 {"tokens", scanned_tokens},
                 {"scan_seconds", scan_seconds},
                 {"tokens_per_second", scan_seconds > 0 ? static_cast<double>(scanned_tokens) / scan_seconds : 0.0},
                 {"threads", pool.size()}};
  j["holdout"] = {{"files", holdout_ds->n_files()},
                  {"tokens", static_cast<int64_t>(hold->tokens.size())},
                  {"instances", holdout_ds->size()},
                  {"documents", static_cast<int64_t>(hold->docs.size())},
                  {"documents_are_instances", hold->docs_are_instances},
                  {"ngrams", hold->ngram_positions},
                  {"index_bytes", set.bytes()},
                  {"index_seconds", index_seconds}};
  j["checks"] = checks;
  j["contaminated_documents"] = contaminated;
  j["data_overlaps"] = data_overlaps;
  j["partial_overlaps"] = partial;
  j["seconds"] = total_seconds;
  j["work_dir"] = work.remove ? nlohmann::json(nullptr) : nlohmann::json(work.path);

  // ---- summary
  std::string s = "olmoref leakcheck: " + std::string(verdict == "clean" ? "CLEAN" : verdict == "contaminated" ? "CONTAMINATED"
                                                                      : verdict == "audit-failure"        ? "AUDIT FAILURE"
                                                                                                          : "CONTAMINATED + AUDIT FAILURE") +
                  "\n";
  s += "stream: " + std::to_string(steps) + " steps (" + std::to_string(scanned_instances) + " instances, " +
       std::to_string(scanned_tokens) + " tokens) on " + std::to_string(W) + " rank(s); scanned at " +
       fmt("%.3g", scan_seconds > 0 ? static_cast<double>(scanned_tokens) / scan_seconds : 0.0) + " tokens/s\n";
  s += "holdout: " + std::to_string(hold->docs.size()) + (hold->docs_are_instances ? " instance-documents, " : " documents, ") +
       std::to_string(holdout_ds->size()) + " instances, " + std::to_string(hold->tokens.size()) + " tokens, " +
       std::to_string(hold->ngram_positions) + " " + std::to_string(o.ngram) + "-grams (" + (o.bloom ? "Bloom" : "exact") +
       " index " + fmt("%.1f", static_cast<double>(set.bytes()) / (1 << 20)) + " MiB)\n";
  for (const char* name : {"shared_files", "static_ngrams", "exact_instances", "exact_documents", "near_ngrams", "audit_partition",
                           "audit_exactly_once", "audit_resume", "audit_layout", "external_audit"}) {
    if (!checks.contains(name)) continue;
    const std::string key = name;
    const nlohmann::json& c = checks[key];
    char line[96];
    std::snprintf(line, sizeof line, "  %-20s %-8s", name, c["status"].get<std::string>().c_str());
    std::string extra;
    if (c.contains("contaminated")) {
      const std::string unit = key == "exact_instances" ? " holdout instances" : " holdout documents";
      extra += std::to_string(c["contaminated"].get<int64_t>()) + unit + " (" + fmt("%.2f%%", 100.0 * c["rate"].get<double>()) + ")";
      if (key == "near_ngrams")
        extra += ", " + std::to_string(c["documents_with_hits"].get<int64_t>()) + " with any hit, " +
                 std::to_string(c["documents_over_threshold"].get<int64_t>()) + " over the threshold";
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
