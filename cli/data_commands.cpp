#include "cli/data_commands.h"

#include <limits>
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "data/audit.h"
#include "data/bpe.h"
#include "data/dataset.h"
#include "data/holdout.h"
#include "data/loader.h"
#include "data/mix.h"
#include "data/shuffle.h"
#include "data/token_file.h"
#include "interop/hf_tokenizer.h"
#include "interop/olmo_core_data.h"

namespace olmoref::data {

namespace fs = std::filesystem;

namespace {

// Library errors carry the file name and the fix; print them as they are and exit 1.
template <typename F>
void guarded(F&& f) {
  try {
    f();
  } catch (const CLI::Error&) {
    throw;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    throw CLI::RuntimeError(1);
  }
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::string human(double v) {
  char buf[32];
  if (v >= 1e9) std::snprintf(buf, sizeof buf, "%.2fG", v / 1e9);
  else if (v >= 1e6) std::snprintf(buf, sizeof buf, "%.2fM", v / 1e6);
  else if (v >= 1e4) std::snprintf(buf, sizeof buf, "%.1fk", v / 1e3);
  else std::snprintf(buf, sizeof buf, "%.0f", v);
  return buf;
}

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("text input '" + path + "': cannot open");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Leading blank lines and trailing whitespace are not part of a document; leading spaces on
// the first line are (indentation matters in verse and ASCII art).
std::string_view trim_document(std::string_view d) {
  while (!d.empty() && (d.front() == '\n' || d.front() == '\r')) d.remove_prefix(1);
  while (!d.empty() && (d.back() == '\n' || d.back() == '\r' || d.back() == ' ' || d.back() == '\t')) d.remove_suffix(1);
  return d;
}

bool blank(std::string_view line) { return line.find_first_not_of(" \t\r") == std::string_view::npos; }

// Splits `text` into documents; views point into `text`.
void split_documents_text(std::string_view text, const std::string& format, const std::string& separator,
                          std::vector<std::string_view>& out) {
  auto push = [&](std::string_view d) {
    d = trim_document(d);
    if (!d.empty()) out.push_back(d);
  };
  if (format == "file") {
    push(text);
    return;
  }
  size_t doc_start = 0, pos = 0;
  while (pos <= text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string_view::npos) eol = text.size();
    std::string_view line = text.substr(pos, eol - pos);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    const bool ends_doc = format == "separator" ? line == separator : blank(line);
    if (ends_doc) {
      push(text.substr(doc_start, pos - doc_start));
      doc_start = eol + 1;
    }
    if (eol == text.size()) break;
    pos = eol + 1;
  }
  if (doc_start < text.size()) push(text.substr(doc_start));
}

// OLMo-core's mix files: paths relative to a base directory, with a {TOKENIZER} placeholder (data/mix.h).
struct MixArgs {
  MixResolve resolve;
  void add(CLI::App* c) {
    c->add_option("--mix-base-dir", resolve.base_dir,
                  "an OLMo-core mix file's base directory (its paths are relative to it; data.mix_base_dir)");
    c->add_option("--mix-tokenizer", resolve.tokenizer,
                  "what replaces {TOKENIZER} in an OLMo-core mix file, e.g. allenai/dolma3-tokenizer "
                  "(data.mix_tokenizer)");
  }
};

// Mix from positional arguments: one *.mix / *.txt file, or token files in order.
Mix mix_from_args(const std::vector<std::string>& paths, const MixResolve& resolve = {}) {
  if (paths.size() == 1) {
    const std::string ext = fs::path(paths[0]).extension().string();
    if (ext == ".mix" || ext == ".txt") return Mix::parse_file(paths[0], resolve);
  }
  return Mix::from_paths(paths);
}

struct VocabArgs {
  int64_t vocab_size = 0;
  std::string tokenizer;
  std::string dtype;
  int64_t eos = -1;

  void add(CLI::App* c) {
    c->add_option("--vocab-size", vocab_size, "vocabulary size (ids >= it are errors; sets the dtype)")
        ->check(CLI::Range(int64_t{1}, int64_t{1} << 32));
    c->add_option("--tokenizer", tokenizer,
                  "olmoref BPE tokenizer JSON, or a Hugging Face tokenizer.json as export-hf writes it (gives vocab "
                  "size and EOS)");
    c->add_option("--dtype", dtype, "uint16 or uint32 (default: from the vocabulary size)");
    c->add_option("--eos", eos, "EOS token id (default: the tokenizer's, 256)")
        ->check(CLI::Range(int64_t{0}, (int64_t{1} << 32) - 1));
  }
  std::optional<BpeTokenizer> resolve() {
    std::optional<BpeTokenizer> tok;
    if (!tokenizer.empty()) {
      tok = interop::load_tokenizer(tokenizer);
      if (vocab_size == 0) vocab_size = tok->vocab_size();
      if (eos < 0) eos = tok->eos_id();
    }
    if (vocab_size <= 0 && dtype.empty()) {
      throw std::runtime_error("give --vocab-size, --tokenizer or --dtype so the token dtype is known");
    }
    // An EOS no token can be would make every file one document, silently.
    if (vocab_size > 0 && eos >= vocab_size)
      throw std::runtime_error("--eos " + std::to_string(eos) + " is not an id of the vocabulary (--vocab-size " +
                               std::to_string(vocab_size) + ")");
    return tok;
  }
  Dtype file_dtype() const { return dtype.empty() ? dtype_for_vocab(vocab_size) : parse_dtype(dtype); }
};

// ---- tokenize ----------------------------------------------------------------------------------

struct TokenizeArgs {
  std::vector<std::string> inputs;
  std::string format = "separator";
  std::string separator = "%";
  std::string tokenizer;
  int64_t vocab_size = 0;
  std::string out_dir;
  double holdout_fraction = 0.0;
  uint64_t seed = kOlmoCoreDefaultSeed;
  int64_t tokens_per_file = int64_t{1} << 28;
  std::string dtype;
  std::string prefix = "part";
};

// A dataset is never written over another: files of an earlier one left beside it (a holdout/ and holdout.mix that
// the new split does not write) would be read with it, the old holdout's documents then inside the new train split.
void refuse_earlier_dataset(const std::string& dir, const char* flag) {
  std::error_code ec;
  if (fs::exists(dir, ec) && !fs::is_directory(dir, ec))
    throw std::runtime_error(std::string(flag) + " " + dir + " is a file: give a directory");
  for (const char* name : {"train", "holdout", "train.mix", "holdout.mix", "split.json"})
    if (fs::exists(fs::path(dir) / name, ec))
      throw std::runtime_error(std::string(flag) + " " + dir + " already holds a dataset (" + name + "): write the " +
                               "new one to another directory, or delete the old one's train/, holdout/, *.mix and " +
                               "split.json first");
}

// The prefix names files inside the output directory, never a path out of it.
void check_prefix(const std::string& prefix) {
  if (prefix.empty() || prefix.find('/') != std::string::npos || prefix == "." || prefix == "..")
    throw std::runtime_error("--prefix '" + prefix + "': a file-name prefix (no '/'), e.g. part");
}

void run_tokenize(const TokenizeArgs& a) {
  const auto t0 = std::chrono::steady_clock::now();
  refuse_earlier_dataset(a.out_dir, "--out-dir");
  check_prefix(a.prefix);
  // Training a tokenizer over one that exists would orphan the token files encoded with it.
  if (a.vocab_size > 0 && fs::exists(a.tokenizer))
    throw std::runtime_error("--tokenizer " + a.tokenizer + " exists, and --vocab-size would train a new one over it "
                             "(the token files encoded with it would then have none): give a new path, or drop "
                             "--vocab-size to encode with it");
  std::vector<std::string> texts;
  texts.reserve(a.inputs.size());
  std::vector<std::string_view> docs;
  int64_t text_bytes = 0;
  for (const auto& p : a.inputs) {
    texts.push_back(read_text_file(p));
    text_bytes += static_cast<int64_t>(texts.back().size());
    const size_t before = docs.size();
    split_documents_text(texts.back(), a.format, a.separator, docs);
    if (docs.size() == before) {
      std::cerr << "warning: text input '" << p << "' holds no document (format " << a.format << ")\n";
    } else if (a.format == "separator" && texts.back().find(a.separator) == std::string::npos) {
      // The default format: a file of other text becomes one document without a word otherwise.
      std::cerr << "warning: text input '" << p << "' holds no separator '" << a.separator << "' (--format separator): "
                << "it is one document; pass --format paragraph for blank-line separated text, or --separator\n";
    }
  }
  if (docs.empty()) throw std::runtime_error("the text inputs hold no documents; check --format and --separator");

  // Split first, on the text, so the tokenizer never sees a holdout document.
  SplitOptions split;
  split.fraction = a.holdout_fraction;
  split.seed = a.seed;
  split.max_tokens_per_file = a.tokens_per_file;
  split.prefix = a.prefix;
  std::vector<char> is_holdout(docs.size(), 0);
  std::vector<std::string_view> train_docs;
  for (size_t i = 0; i < docs.size(); ++i) {
    is_holdout[i] = a.holdout_fraction > 0 && is_holdout_document(docs[i].data(), docs[i].size(), a.seed, a.holdout_fraction);
    if (!is_holdout[i]) train_docs.push_back(docs[i]);
  }

  if (train_docs.empty()) {
    throw std::runtime_error("--holdout-fraction " + std::to_string(a.holdout_fraction) + " held out all " +
                             std::to_string(docs.size()) + " documents; lower it");
  }
  std::optional<BpeTokenizer> tok;
  const auto t_train = std::chrono::steady_clock::now();
  if (a.vocab_size > 0) {
    BpeTokenizer::TrainOptions o;
    o.vocab_size = a.vocab_size;
    tok = BpeTokenizer::train(train_docs, o);
    fs::path tp(a.tokenizer);
    if (tp.has_parent_path()) fs::create_directories(tp.parent_path());
    tok->save(a.tokenizer);
    std::printf("tokenizer: trained %zu merges (vocab %lld) on %zu train documents in %.2f s -> %s\n",
                tok->n_merges(), static_cast<long long>(tok->vocab_size()), train_docs.size(), seconds_since(t_train),
                a.tokenizer.c_str());
  } else {
    tok = interop::load_tokenizer(a.tokenizer);
    std::printf("tokenizer: loaded %s (vocab %lld, %zu merges)\n", a.tokenizer.c_str(),
                static_cast<long long>(tok->vocab_size()), tok->n_merges());
  }

  const Dtype dtype = a.dtype.empty() ? dtype_for_vocab(tok->vocab_size()) : parse_dtype(a.dtype);
  const fs::path out(a.out_dir);
  fs::create_directories(out / "train");
  ShardedTokenWriter train((out / "train").string(), a.prefix, dtype, a.tokens_per_file);
  std::unique_ptr<ShardedTokenWriter> hold;
  if (a.holdout_fraction > 0) {
    fs::create_directories(out / "holdout");
    hold = std::make_unique<ShardedTokenWriter>((out / "holdout").string(), a.prefix, dtype, a.tokens_per_file);
  }
  const auto t_enc = std::chrono::steady_clock::now();
  std::vector<uint32_t> ids;
  for (size_t i = 0; i < docs.size(); ++i) {
    ids.clear();
    tok->encode_append(docs[i], ids);
    ids.push_back(tok->eos_id());  // OLMo-core convention: every document ends in EOS, no BOS
    (is_holdout[i] ? *hold : train).add_document(ids);
  }
  SplitReport r;
  r.train_documents = train.n_documents();
  r.train_tokens = train.n_tokens();
  r.train = Mix::from_paths(train.finish(), "");
  r.train.source = (out / "train.mix").string();
  r.train.write_file(r.train.source);
  if (hold) {
    r.holdout_documents = hold->n_documents();
    r.holdout_tokens = hold->n_tokens();
    const std::vector<std::string> hp = hold->finish();
    if (hp.empty()) {
      throw std::runtime_error("--holdout-fraction " + std::to_string(a.holdout_fraction) + " held out no document of " +
                               std::to_string(docs.size()) + "; raise the fraction or add text");
    }
    r.holdout = Mix::from_paths(hp, "");
    r.holdout.source = (out / "holdout.mix").string();
    r.holdout.write_file(r.holdout.source);
    r.manifest_path = (out / "split.json").string();
    nlohmann::json extra;
    extra["tokenizer"] = fs::absolute(a.tokenizer).string();
    extra["eos_id"] = tok->eos_id();
    extra["dtype"] = dtype_name(dtype);
    extra["text_format"] = a.format;
    extra["inputs"] = a.inputs;
    write_split_manifest(r.manifest_path, r, split, "utf8-text", extra);
  }
  const double enc_s = seconds_since(t_enc);
  const int64_t total_tokens = r.train_tokens + r.holdout_tokens;
  std::printf("text: %zu inputs, %s bytes, %zu documents (format %s)\n", a.inputs.size(), human(double(text_bytes)).c_str(),
              docs.size(), a.format.c_str());
  std::printf("train:   %lld documents, %lld tokens in %zu files (%s) -> %s\n",
              static_cast<long long>(r.train_documents), static_cast<long long>(r.train_tokens), r.train.size(),
              dtype_name(dtype), r.train.source.c_str());
  if (hold) {
    std::printf("holdout: %lld documents, %lld tokens in %zu files (%s) -> %s  [document-split, fraction %g, seed %llu, %s]\n",
                static_cast<long long>(r.holdout_documents), static_cast<long long>(r.holdout_tokens), r.holdout.size(),
                dtype_name(dtype), r.holdout.source.c_str(), a.holdout_fraction, static_cast<unsigned long long>(a.seed),
                r.manifest_path.c_str());
  }
  std::printf("encoded %s tokens in %.2f s (%.2f bytes/token); total %.2f s\n", human(double(total_tokens)).c_str(), enc_s,
              total_tokens ? double(text_bytes) / double(total_tokens) : 0.0, seconds_since(t0));
}

// ---- data inspect --------------------------------------------------------------------------------

struct InspectArgs {
  std::vector<std::string> paths;
  VocabArgs vocab;
  MixArgs mix;
  int64_t max_target_sequence_length = 0;
  int64_t pad = -1, bos = -1;
  int64_t seq_len = 0;
  int64_t show_instance = -1;
};

void run_inspect(InspectArgs& a) {
  const std::optional<BpeTokenizer> tok = a.vocab.resolve();
  if (tok && a.pad < 0 && tok->pad_id()) a.pad = static_cast<int64_t>(*tok->pad_id());
  const Mix mix = mix_from_args(a.paths, a.mix.resolve);
  const Dtype dtype = a.vocab.file_dtype();
  const uint32_t eos = a.vocab.eos >= 0 ? static_cast<uint32_t>(a.vocab.eos) : 0xffffffffu;
  std::printf("mix: %s (%zu files, dtype %s", mix.source.c_str(), mix.size(), dtype_name(dtype));
  if (a.vocab.vocab_size > 0) std::printf(", vocab %lld", static_cast<long long>(a.vocab.vocab_size));
  if (a.vocab.eos >= 0) std::printf(", eos %lld", static_cast<long long>(a.vocab.eos));
  std::printf(")\n");
  std::printf("%-6s %-14s %-12s %-10s %-8s %-10s %s\n", "index", "tokens", "documents", "max_id", "eos_end",
              a.seq_len > 0 ? "instances" : "", "file");
  int64_t tokens = 0, documents = 0, instances = 0;
  bool bad = false;
  for (size_t i = 0; i < mix.size(); ++i) {
    const TokenFile f(mix.entries[i].path, dtype);
    const TokenFile::Scan s = f.scan(eos, a.vocab.vocab_size);
    tokens += f.n_tokens();
    documents += s.n_documents;
    const int64_t inst = a.seq_len > 0 ? f.n_tokens() / a.seq_len : 0;
    instances += inst;
    std::printf("%-6zu %-14lld %-12s %-10u %-8s %-10s %s%s%s\n", i, static_cast<long long>(f.n_tokens()),
                a.vocab.eos >= 0 ? std::to_string(s.n_documents).c_str() : "?", s.max_id,
                a.vocab.eos >= 0 ? (s.ends_with_eos ? "yes" : "NO") : "?",
                a.seq_len > 0 ? std::to_string(inst).c_str() : "", f.path().c_str(),
                mix.entries[i].label.empty() ? "" : ("  [" + mix.entries[i].label + "]").c_str(),
                s.first_bad_offset >= 0 ? "  BAD ID" : "");
    if (s.first_bad_offset >= 0) {
      bad = true;
      std::printf("       first id >= vocab: %u at token offset %lld\n", s.first_bad_id,
                  static_cast<long long>(s.first_bad_offset));
    }
  }
  std::printf("total: %lld tokens", static_cast<long long>(tokens));
  if (a.vocab.eos >= 0) std::printf(", %lld documents", static_cast<long long>(documents));
  std::printf("\n");
  if (a.seq_len > 0 && a.vocab.vocab_size > 0) {
    DatasetOptions o;
    o.sequence_length = a.seq_len;
    o.vocab_size = a.vocab.vocab_size;
    o.dtype = dtype;
    o.allow_short_files = true;  // inspecting, not training: report rather than refuse
    o.max_target_sequence_length = a.max_target_sequence_length;
    if (a.vocab.eos >= 0) o.eos_id = static_cast<uint32_t>(a.vocab.eos);
    const FslDataset ds(mix, o);
    std::printf("instances of %lld tokens: %lld (%lld tokens dropped in file tails)\n", static_cast<long long>(a.seq_len),
                static_cast<long long>(ds.size()), static_cast<long long>(tokens - ds.size() * a.seq_len));
    std::printf("fingerprint: %s\n", ds.fingerprint().c_str());
    // OLMo-core's own (NumpyFSLDataset v2.0), which its checkpoints record: it also hashes the pad and bos ids.
    if (a.vocab.eos >= 0 && a.pad >= 0)
      std::printf("OLMo-core fingerprint (v2.0): %s\n", interop::olmo_core_fingerprint_of(ds, a.pad, a.bos).c_str());
    else
      std::printf("OLMo-core fingerprint (v2.0): give --eos and --pad (OLMo-core hashes them)\n");
    if (a.show_instance >= 0) {
      const std::vector<uint32_t> ids = ds.instance(a.show_instance);
      const auto loc = ds.locate(a.show_instance);
      std::printf("instance %lld = %s tokens [%lld, %lld), xxh3 %s\n", static_cast<long long>(a.show_instance),
                  ds.file(static_cast<size_t>(loc.file)).path().c_str(), static_cast<long long>(loc.token_start),
                  static_cast<long long>(loc.token_start + a.seq_len), hex64(xxh3_tokens(ids)).c_str());
      if (tok) std::printf("----\n%s\n----\n", tok->decode(ids).c_str());
    }
  }
  if (bad) throw std::runtime_error("some files hold token ids >= vocab_size (see BAD ID above)");
}

// ---- data order ------------------------------------------------------------------------------------

struct OrderArgs {
  uint64_t seed = kOlmoCoreDefaultSeed;
  int64_t epoch = 1;
  int64_t n = 0;
  int64_t global_batch = 0;
  int64_t count = 16;
  std::optional<uint64_t> rng_seed;
  std::string out;
};

void run_order(const OrderArgs& a) {
  std::vector<uint32_t> idx;
  std::string what;
  if (a.rng_seed) {
    idx = numpy_permutation(*a.rng_seed, a.n);
    what = "Generator(PCG64(" + std::to_string(*a.rng_seed) + ")).shuffle(arange(" + std::to_string(a.n) + "))";
  } else {
    if (a.epoch < 1) throw std::runtime_error("--epoch is 1-based, as in OLMo-core");
    idx = numpy_permutation(a.seed + static_cast<uint64_t>(a.epoch), a.n);
    what = "OLMo-core global order, seed " + std::to_string(a.seed) + " epoch " + std::to_string(a.epoch) + " = PCG64(" +
           std::to_string(a.seed + static_cast<uint64_t>(a.epoch)) + "), n " + std::to_string(a.n);
  }
  if (a.global_batch > 0) {
    idx.resize(static_cast<size_t>(a.n / a.global_batch * a.global_batch));
    what += ", cropped to " + std::to_string(a.n / a.global_batch) + " batches of " + std::to_string(a.global_batch);
  }
  std::fprintf(stderr, "%s\n", what.c_str());
  if (!a.out.empty()) {
    std::FILE* f = std::fopen(a.out.c_str(), "wb");
    if (f == nullptr || std::fwrite(idx.data(), 4, idx.size(), f) != idx.size() || std::fclose(f) != 0) {
      throw std::runtime_error("cannot write '" + a.out + "'");
    }
    std::fprintf(stderr, "wrote %zu uint32 (little-endian, no header) to %s\n", idx.size(), a.out.c_str());
    return;
  }
  const size_t shown = a.count < 0 ? idx.size() : std::min(idx.size(), static_cast<size_t>(a.count));
  for (size_t i = 0; i < shown; ++i) std::printf(i ? " %u" : "%u", idx[i]);
  std::printf("\n");
}

// ---- data batches ----------------------------------------------------------------------------------

struct MixCmdArgs {
  std::vector<std::string> paths;
  MixArgs mix;
  std::string out, label;
  bool olmo_core = false;
};

void run_mix(MixCmdArgs& a) {
  if (a.olmo_core && !a.out.empty()) {
    std::string missing;
    if (a.mix.resolve.base_dir.empty()) missing = "--mix-base-dir DIR (the directory its paths are relative to)";
    if (a.mix.resolve.tokenizer.empty())
      missing += std::string(missing.empty() ? "" : " and ") +
                 "--mix-tokenizer NAME (the tokenizer's directory in the paths, written as {TOKENIZER})";
    if (!missing.empty())
      throw std::invalid_argument("data mix --olmo-core: give " + missing + "; OLMo-core's mix format writes every "
                                  "path relative to a base directory with its tokenizer part as {TOKENIZER}");
  }
  Mix mix = mix_from_args(a.paths, a.mix.resolve);
  if (!a.label.empty())
    for (auto& e : mix.entries)
      if (e.label.empty()) e.label = a.label;
  if (a.out.empty()) {
    if (a.olmo_core) throw std::invalid_argument("--olmo-core writes a file: give --out FILE");
    for (const auto& e : mix.entries) std::printf("%s,%s\n", e.label.c_str(), e.path.c_str());
    return;
  }
  if (a.olmo_core) mix.write_olmo_core_file(a.out, a.mix.resolve);
  else mix.write_file(a.out);
  std::printf("wrote %s (%zu token files, %s format)\n", a.out.c_str(), mix.size(), a.olmo_core ? "OLMo-core's" : "olmoref's");
}

struct BatchesArgs {
  std::vector<std::string> paths;
  VocabArgs vocab;
  MixArgs mix;
  int64_t seq_len = 0;
  int64_t global_batch = 0;
  int64_t microbatch = 0;
  uint64_t seed = kOlmoCoreDefaultSeed;
  int64_t steps = 1;
  int64_t skip = 0;
  int64_t max_target_sequence_length = 0;
  std::string olmo_core_state;
  int64_t pad = -1, bos = -1;
  std::string tokens_out;
  std::string audit;
};

void run_batches(BatchesArgs& a) {
  a.vocab.resolve();
  if (a.vocab.vocab_size <= 0) throw std::runtime_error("give --vocab-size or --tokenizer");
  DatasetOptions o;
  o.sequence_length = a.seq_len;
  o.vocab_size = a.vocab.vocab_size;
  o.dtype = a.vocab.file_dtype();
  o.max_target_sequence_length = a.max_target_sequence_length;
  if (a.vocab.eos >= 0) o.eos_id = static_cast<uint32_t>(a.vocab.eos);
  auto ds = std::make_shared<FslDataset>(mix_from_args(a.paths, a.mix.resolve), o);
  LoaderConfig c;
  c.dataset = ds;
  c.seed = a.seed;
  c.global_batch_instances = a.global_batch;
  c.microbatch_instances = a.microbatch > 0 ? a.microbatch : a.global_batch;
  if (!a.audit.empty()) c.audit = std::make_shared<AuditLog>(a.audit);
  Loader loader(c);
  if (a.skip > 0) {
    LoaderState s = loader.state();
    s.epoch = 1 + a.skip / loader.batches_per_epoch();
    s.batches_processed = a.skip % loader.batches_per_epoch();
    loader.restore(s);
  }
  if (!a.olmo_core_state.empty()) {
    if (a.skip > 0) throw std::invalid_argument("--skip and --olmo-core-state both set the start: give one");
    const LoaderState s = interop::olmo_core_loader_state(interop::read_olmo_core_checkpoint(a.olmo_core_state), *ds,
                                                          a.global_batch, a.pad, a.bos);
    std::fprintf(stderr, "continuing OLMo-core's order: epoch %lld, %lld batches of %lld instances done (%lld tokens)\n",
                 static_cast<long long>(s.epoch), static_cast<long long>(s.batches_processed),
                 static_cast<long long>(a.global_batch), static_cast<long long>(s.tokens_processed));
    loader.restore(s);
  }
  std::FILE* tf = nullptr;
  if (!a.tokens_out.empty() && (tf = std::fopen(a.tokens_out.c_str(), "wb")) == nullptr) {
    throw std::runtime_error("cannot write '" + a.tokens_out + "'");
  }
  std::fprintf(stderr, "dataset %s: %lld instances, %lld batches/epoch, seed %llu\n", ds->fingerprint().c_str(),
               static_cast<long long>(ds->size()), static_cast<long long>(loader.batches_per_epoch()),
               static_cast<unsigned long long>(a.seed));
  GlobalBatch b;
  for (int64_t s = 0; s < a.steps; ++s) {
    loader.next_batch(b);
    nlohmann::json j;
    j["step"] = b.step;
    j["epoch"] = b.epoch;
    j["batch"] = b.batch;
    j["instances"] = b.instance_ids;
    j["xxh3"] = hex64(xxh3_tokens(b.tokens));
    std::printf("%s\n", j.dump().c_str());
    if (tf != nullptr && std::fwrite(b.tokens.data(), 4, b.tokens.size(), tf) != b.tokens.size()) {
      std::fclose(tf);
      throw std::runtime_error("write to '" + a.tokens_out + "' failed");
    }
  }
  if (tf != nullptr) std::fclose(tf);
  if (c.audit) c.audit->flush();
}

// ---- data split -------------------------------------------------------------------------------------

struct SplitArgs {
  std::vector<std::string> paths;
  VocabArgs vocab;
  std::string out_dir;
  SplitOptions options;
};

void run_split(SplitArgs& a) {
  refuse_earlier_dataset(a.out_dir, "--out-dir");
  check_prefix(a.options.prefix);
  a.vocab.resolve();
  if (a.vocab.eos < 0) throw std::runtime_error("give --eos (or --tokenizer): documents are delimited by EOS");
  const Dtype dtype = a.vocab.file_dtype();
  const Mix mix = mix_from_args(a.paths);
  // Ids past the vocabulary are refused here, where the files are, not copied into a split that training then stops
  // on when it reaches them.
  if (a.vocab.vocab_size > 0)
    for (const auto& entry : mix.entries)
      if (const TokenFile::Scan s = TokenFile(entry.path, dtype).scan(static_cast<uint32_t>(a.vocab.eos),
                                                                      a.vocab.vocab_size);
          s.first_bad_offset >= 0)
        throw std::runtime_error("token file '" + entry.path + "': token id " + std::to_string(s.first_bad_id) +
                                 " at token offset " + std::to_string(s.first_bad_offset) + " is >= --vocab-size " +
                                 std::to_string(a.vocab.vocab_size) + ": the file is not of this vocabulary (check "
                                 "--vocab-size, --dtype or the tokenizer it was encoded with)");
  const SplitReport r = split_documents(mix, dtype, static_cast<uint32_t>(a.vocab.eos), dtype, a.out_dir, a.options);
  std::printf("train:   %lld documents, %lld tokens -> %s\n", static_cast<long long>(r.train_documents),
              static_cast<long long>(r.train_tokens), r.train.source.c_str());
  std::printf("holdout: %lld documents, %lld tokens -> %s\n", static_cast<long long>(r.holdout_documents),
              static_cast<long long>(r.holdout_tokens), r.holdout.source.c_str());
  std::printf("manifest: %s\n", r.manifest_path.c_str());
}

// The token files (or a mix) as positionals and the vocabulary flags: what inspect, batches and split all read.
template <class Args>
void add_corpus_options(CLI::App* c, Args& a) {
  c->add_option("paths", a.paths, "a mix file (*.mix, *.txt) or token files")->required();
  a.vocab.add(c);
}

}  // namespace

void register_data_commands(CLI::App& app) {
  // tokenize
  {
    auto a = std::make_shared<TokenizeArgs>();
    CLI::App* c = app.add_subcommand("tokenize", "Tokenize text into OLMo-core token files (+ train/holdout mixes)");
    c->add_option("--input,-i", a->inputs, "text files, in order")->required()->check(CLI::ExistingFile);
    c->add_option("--format", a->format,
                  "separator: documents end at a line equal to --separator (fortune's %); paragraph: documents are "
                  "separated by blank lines; file: each input is one document")
        ->check(CLI::IsMember({"separator", "paragraph", "file"}));
    c->add_option("--separator", a->separator, "document separator line for --format separator");
    c->add_option("--tokenizer", a->tokenizer,
                  "tokenizer JSON: written when --vocab-size trains one, read otherwise (olmoref's format, or a "
                  "Hugging Face tokenizer.json as export-hf writes it; other pre-tokenizers are refused)")
        ->required();
    c->add_option("--vocab-size", a->vocab_size, "train a byte-level BPE of this size (incl. 256 bytes, EOS, PAD)");
    c->add_option("--out-dir,-o", a->out_dir, "writes train/, train.mix and (with a holdout) holdout/, holdout.mix, "
                                              "split.json")
        ->required();
    c->add_option("--holdout-fraction", a->holdout_fraction, "share of documents held out (document-split; 0 = none)")
        ->check(CLI::Range(0.0, 1.0));
    c->add_option("--seed", a->seed, "seed of the document split hash");
    c->add_option("--tokens-per-file", a->tokens_per_file, "start a new token file after this many tokens");
    c->add_option("--dtype", a->dtype, "uint16 or uint32 (default: from the vocabulary size)");
    c->add_option("--prefix", a->prefix, "token file name prefix");
    c->callback([a] { guarded([&] { run_tokenize(*a); }); });
  }

  CLI::App* data = app.add_subcommand("data", "Inspect token files, the global order, batches; split holdouts");
  data->require_subcommand(1);
  {
    auto a = std::make_shared<InspectArgs>();
    CLI::App* c = data->add_subcommand("inspect", "Files, tokens, documents, instances and fingerprint of a mix");
    add_corpus_options(c, *a);
    c->add_option("--seq-len", a->seq_len, "sequence length: count instances and compute the fingerprint")
        ->check(CLI::Range(int64_t{1}, std::numeric_limits<int64_t>::max()));
    c->add_option("--show-instance", a->show_instance, "print (and decode, with --tokenizer) this instance")
        ->check(CLI::Range(int64_t{0}, std::numeric_limits<int64_t>::max()));
    c->add_option("--max-target-seq-len", a->max_target_sequence_length, "OLMo-core's max_target_sequence_length");
    c->add_option("--pad", a->pad, "pad token id, for OLMo-core's fingerprint (default: the tokenizer's, 257)");
    c->add_option("--bos", a->bos, "bos token id, for OLMo-core's fingerprint (default: none)");
    a->mix.add(c);
    c->callback([a] { guarded([&] { run_inspect(*a); }); });
  }
  {
    auto a = std::make_shared<MixCmdArgs>();
    CLI::App* c = data->add_subcommand(
        "mix", "Print a mix as its token files resolve (label,path per line), or write it as a mix file: olmoref's "
               "format, or OLMo-core's (--olmo-core: label,path relative to --mix-base-dir with {TOKENIZER})");
    c->add_option("paths", a->paths, "a mix file (*.mix, *.txt, olmoref's or OLMo-core's) or token files")->required();
    a->mix.add(c);
    c->add_option("--out", a->out, "write the mix here instead of printing it");
    c->add_flag("--olmo-core", a->olmo_core,
                "with --out: OLMo-core's format (every line label,path; paths relative to --mix-base-dir, the "
                "--mix-tokenizer part written as {TOKENIZER})");
    c->add_option("--label", a->label, "label for entries that have none (default: olmoref: none; OLMo-core: the file stem)");
    c->callback([a] { guarded([&] { run_mix(*a); }); });
  }
  {
    auto a = std::make_shared<OrderArgs>();
    CLI::App* c = data->add_subcommand("order", "OLMo-core's global shuffle: PCG64(seed + epoch) over arange(n)");
    c->add_option("--n", a->n, "number of instances")->required();
    c->add_option("--seed", a->seed, "data loader seed (OLMo-core default 34521)");
    c->add_option("--epoch", a->epoch, "1-based epoch");
    c->add_option("--rng-seed", a->rng_seed, "seed PCG64 with this value directly (instead of seed + epoch)");
    c->add_option("--global-batch", a->global_batch, "crop to whole global batches of this many instances");
    c->add_option("--count", a->count, "entries to print (-1: all)");
    c->add_option("--out", a->out, "write the whole order as raw little-endian uint32 instead");
    c->callback([a] { guarded([&] { run_order(*a); }); });
  }
  {
    auto a = std::make_shared<BatchesArgs>();
    CLI::App* c = data->add_subcommand("batches", "Instance ids (JSON lines) of the first global batches");
    add_corpus_options(c, *a);
    c->add_option("--seq-len", a->seq_len, "sequence length")
        ->required()
        ->check(CLI::Range(int64_t{1}, std::numeric_limits<int64_t>::max()));
    c->add_option("--global-batch", a->global_batch, "global batch in instances")->required();
    c->add_option("--microbatch", a->microbatch, "micro-batch in instances (default: the global batch)")
        ->check(CLI::Range(int64_t{1}, std::numeric_limits<int64_t>::max()));
    c->add_option("--seed", a->seed, "data loader seed (OLMo-core default 34521)");
    c->add_option("--steps", a->steps, "number of batches to print")->check(CLI::Range(int64_t{0}, std::numeric_limits<int64_t>::max()));
    c->add_option("--skip", a->skip, "start after this many batches (resumes through restore())")
        ->check(CLI::Range(int64_t{0}, std::numeric_limits<int64_t>::max()));
    a->mix.add(c);
    c->add_option("--olmo-core-state", a->olmo_core_state,
                  "start where an OLMo-core run's data loader stopped: its checkpoint (save folder or stepN); the "
                  "position is tokens_processed // this global batch, as OLMo-core resumes (needs --eos, --pad)");
    c->add_option("--pad", a->pad, "pad token id (OLMo-core's fingerprint hashes it)");
    c->add_option("--bos", a->bos, "bos token id (default: none)");
    c->add_option("--max-target-seq-len", a->max_target_sequence_length,
                  "OLMo-core's max_target_sequence_length: files cut at multiples of it, instances shuffled in chunks "
                  "of max_target / seq_len (data.max_target_sequence_length)");
    c->add_option("--tokens-out", a->tokens_out, "also write the batches' tokens as raw uint32");
    c->add_option("--audit", a->audit, "write the audit log (JSON lines) here");
    c->callback([a] { guarded([&] { run_batches(*a); }); });
  }
  {
    auto a = std::make_shared<SplitArgs>();
    CLI::App* c = data->add_subcommand("split", "Deterministic document-level train/holdout split of token files");
    add_corpus_options(c, *a);
    c->add_option("--out-dir,-o", a->out_dir, "writes train/, holdout/, train.mix, holdout.mix, split.json")->required();
    c->add_option("--fraction", a->options.fraction, "share of documents held out")->check(CLI::Range(0.0, 1.0));
    c->add_option("--seed", a->options.seed, "seed of the document hash");
    c->add_option("--tokens-per-file", a->options.max_tokens_per_file, "start a new file after this many tokens");
    c->callback([a] { guarded([&] { run_split(*a); }); });
  }
}

}  // namespace olmoref::data
