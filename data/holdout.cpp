#include "data/holdout.h"

#include <xxhash.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <vector>

#include "data/json_file.h"

namespace olmoref::data {

namespace fs = std::filesystem;

const char* holdout_kind_name(HoldoutKind k) {
  switch (k) {
    case HoldoutKind::none: return "none";
    case HoldoutKind::separate_mix: return "separate-mix";
    case HoldoutKind::document_split: return "document-split";
  }
  return "?";
}

HoldoutSpec HoldoutSpec::separate(Mix holdout_mix) {
  if (holdout_mix.empty()) throw std::runtime_error("holdout mix '" + holdout_mix.source + "' lists no token files");
  HoldoutSpec s;
  s.kind = HoldoutKind::separate_mix;
  s.mix = std::move(holdout_mix);
  return s;
}

HoldoutSpec HoldoutSpec::from_manifest(const std::string& path) {
  const nlohmann::json j = read_json_file(path, "split manifest", " (it is written by a document split)");
  if (j.value("format", "") != "olmoref-split-v1" || j.value("kind", "") != "document-split") {
    throw std::runtime_error("split manifest '" + path + "': expected format olmoref-split-v1, kind document-split");
  }
  HoldoutSpec s;
  s.kind = HoldoutKind::document_split;
  s.fraction = j.at("fraction").get<double>();
  s.seed = j.at("seed").get<uint64_t>();
  s.manifest_path = path;
  const fs::path dir = fs::path(path).parent_path();
  const std::string holdout_mix = j.at("holdout_mix").get<std::string>();
  s.mix = Mix::parse_file(fs::path(holdout_mix).is_absolute() || dir.empty() ? holdout_mix
                                                                             : (dir / holdout_mix).string());
  return s;
}

std::string HoldoutSpec::describe() const {
  switch (kind) {
    case HoldoutKind::none: return "holdout: none";
    case HoldoutKind::separate_mix:
      return "holdout: separate-mix '" + mix.source + "' (" + std::to_string(mix.size()) + " files)";
    case HoldoutKind::document_split: {
      char frac[32];
      std::snprintf(frac, sizeof frac, "%g", fraction);
      return "holdout: document-split (fraction " + std::string(frac) + ", seed " + std::to_string(seed) +
             ", manifest '" + manifest_path + "', mix '" + mix.source + "')";
    }
  }
  return "holdout: ?";
}

uint64_t holdout_threshold(double fraction) {
  if (!(fraction >= 0.0 && fraction <= 1.0)) {
    throw std::invalid_argument("holdout fraction must lie in [0, 1]");
  }
  if (fraction >= 1.0) return UINT64_MAX;
  // ldexp is exact and fraction < 1, so the product is < 2^64 and the conversion is defined.
  return static_cast<uint64_t>(std::ldexp(fraction, 64));
}

bool is_holdout_document(const void* bytes, size_t n_bytes, uint64_t seed, double fraction) {
  return XXH3_64bits_withSeed(bytes, n_bytes, seed) < holdout_threshold(fraction);
}

SplitReport split_documents(const Mix& input, Dtype input_dtype, uint32_t eos_id, Dtype dtype,
                            const std::string& out_dir, const SplitOptions& options) {
  if (input.empty()) throw std::runtime_error("empty mix '" + input.source + "': nothing to split");
  const uint64_t threshold = holdout_threshold(options.fraction);
  fs::create_directories(fs::path(out_dir) / "train");
  fs::create_directories(fs::path(out_dir) / "holdout");
  ShardedTokenWriter train((fs::path(out_dir) / "train").string(), options.prefix, dtype, options.max_tokens_per_file);
  ShardedTokenWriter hold((fs::path(out_dir) / "holdout").string(), options.prefix, dtype, options.max_tokens_per_file);
  std::vector<uint32_t> doc;
  auto emit = [&] {
    if (doc.empty()) return;
    const bool h = XXH3_64bits_withSeed(doc.data(), doc.size() * sizeof(uint32_t), options.seed) < threshold;
    (h ? hold : train).add_document(doc);
    doc.clear();
  };
  for (const auto& e : input.entries) {
    const TokenFile f(e.path, input_dtype);
    for (int64_t i = 0; i < f.n_tokens(); ++i) {
      const uint32_t t = f.token(i);
      doc.push_back(t);
      if (t == eos_id) emit();
    }
    emit();  // a file that does not end in EOS: its last run is a document of its own
  }
  SplitReport r;
  r.train_documents = train.n_documents();
  r.holdout_documents = hold.n_documents();
  r.train_tokens = train.n_tokens();
  r.holdout_tokens = hold.n_tokens();
  const std::vector<std::string> train_paths = train.finish();
  const std::vector<std::string> hold_paths = hold.finish();
  if (train_paths.empty() || hold_paths.empty()) {
    throw std::runtime_error("document split of '" + input.source + "' left the " +
                             (train_paths.empty() ? std::string("train") : std::string("holdout")) +
                             " side empty (" + std::to_string(r.train_documents + r.holdout_documents) +
                             " documents, fraction " + std::to_string(options.fraction) +
                             "); use more documents or another fraction");
  }
  r.train = Mix::from_paths(train_paths, "train");
  r.holdout = Mix::from_paths(hold_paths, "holdout");
  r.train.write_file((fs::path(out_dir) / "train.mix").string());
  r.holdout.write_file((fs::path(out_dir) / "holdout.mix").string());
  r.train.source = (fs::path(out_dir) / "train.mix").string();
  r.holdout.source = (fs::path(out_dir) / "holdout.mix").string();
  r.manifest_path = (fs::path(out_dir) / "split.json").string();
  nlohmann::json extra;
  extra["source"] = input.source;
  extra["eos_id"] = eos_id;
  extra["dtype"] = dtype_name(dtype);
  write_split_manifest(r.manifest_path, r, options, "uint32-le-token-ids", extra);
  return r;
}

void write_split_manifest(const std::string& path, const SplitReport& report, const SplitOptions& options,
                          const std::string& hashed, const nlohmann::json& extra) {
  nlohmann::json j;
  j["format"] = "olmoref-split-v1";
  j["kind"] = "document-split";
  j["rule"] = "holdout iff XXH3_64bits_withSeed(document bytes, seed) < floor(fraction * 2^64)";
  j["hashed_bytes"] = hashed;
  j["fraction"] = options.fraction;
  j["seed"] = options.seed;
  const fs::path dir = fs::path(path).parent_path();
  j["train_mix"] = fs::path(report.train.source).lexically_relative(dir).string();
  j["holdout_mix"] = fs::path(report.holdout.source).lexically_relative(dir).string();
  j["documents"] = {{"train", report.train_documents}, {"holdout", report.holdout_documents}};
  j["tokens"] = {{"train", report.train_tokens}, {"holdout", report.holdout_tokens}};
  j.update(extra);
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    if (!out) throw std::runtime_error("split manifest '" + path + "': cannot write");
    out << j.dump(2) << "\n";
    if (!out.flush()) throw std::runtime_error("split manifest '" + path + "': write failed");
  }
  fs::rename(tmp, path);
}

}  // namespace olmoref::data
