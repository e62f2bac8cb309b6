// data/holdout.h — where held-out (evaluation) data comes from, and how a split is made.
//
// Two kinds, and the loader says which one a run uses (Loader::holdout_kind()):
//  - separate-mix:   the holdout is its own mix of token files (the usual case: a sealed set).
//  - document-split: one corpus was split by document. The split is *materialised*: train and
//    holdout documents are written to different token files, so the training side is an ordinary
//    mix and its instances are cut exactly as OLMo-core would cut them. A document is held out iff
//        XXH3_64bits_withSeed(document bytes, seed) < floor(fraction * 2^64)
//    The key is the document's *content*, not its position, so the split does not depend on file
//    order and exact duplicate documents always land on the same side (an index-based rule would
//    put copies on both sides and leak them). For token files the bytes are the uint32
//    little-endian ids including the trailing EOS; `olmoref tokenize` splits before tokenizing and
//    hashes the UTF-8 text (so the tokenizer is trained on the training side only).
// A split writes `split.json` (the manifest: rule, seed, fraction, counts, mixes) beside
// train.mix and holdout.mix; HoldoutSpec::from_manifest reads it back.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "data/mix.h"
#include "data/token_file.h"

namespace olmoref::data {

enum class HoldoutKind { none, separate_mix, document_split };
const char* holdout_kind_name(HoldoutKind k);  // "none", "separate-mix", "document-split"

struct HoldoutSpec {
  HoldoutKind kind = HoldoutKind::none;
  Mix mix;                    // the holdout token files (both kinds)
  double fraction = 0.0;      // document-split: share of documents held out
  uint64_t seed = 0;          // document-split: hash seed
  std::string manifest_path;  // document-split: the split.json it was read from

  static HoldoutSpec separate(Mix holdout_mix);
  static HoldoutSpec from_manifest(const std::string& split_json_path);
  std::string describe() const;  // one line for logs and run manifests
};

uint64_t holdout_threshold(double fraction);  // floor(fraction * 2^64), saturating at 1
bool is_holdout_document(const void* bytes, size_t n_bytes, uint64_t seed, double fraction);
inline bool is_holdout_document(std::span<const uint32_t> tokens, uint64_t seed, double fraction) {
  return is_holdout_document(tokens.data(), tokens.size() * sizeof(uint32_t), seed, fraction);
}

struct SplitOptions {
  double fraction = 0.05;
  uint64_t seed = 34521;
  int64_t max_tokens_per_file = int64_t{1} << 28;  // 1 GiB of uint32 per output file
  std::string prefix = "part";
};

struct SplitReport {
  Mix train, holdout;
  int64_t train_documents = 0, holdout_documents = 0;
  int64_t train_tokens = 0, holdout_tokens = 0;
  std::string manifest_path;
};

// Splits the documents (EOS-terminated; a final unterminated run counts as a document) of
// `input`'s token files into out_dir/train/ and out_dir/holdout/, and writes out_dir/train.mix,
// out_dir/holdout.mix and out_dir/split.json. Output files use `dtype`.
SplitReport split_documents(const Mix& input, Dtype input_dtype, uint32_t eos_id, Dtype dtype,
                            const std::string& out_dir, const SplitOptions& options);

// Writes split.json for a finished split (shared by split_documents and `olmoref tokenize`).
// `hashed` names the bytes the rule hashed ("uint32-le-token-ids" or "utf8-text"); `extra` is merged in.
void write_split_manifest(const std::string& path, const SplitReport& report, const SplitOptions& options,
                          const std::string& hashed, const nlohmann::json& extra);

}  // namespace olmoref::data
