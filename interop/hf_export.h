// interop/hf_export.h — our flat parameter vector <-> a Hugging Face `Olmo3ForCausalLM` checkpoint directory.
//
// Export writes DIR/model.safetensors (every parameter under its HF name, fp32, PyTorch [out, in] layout, which is
// already our layout), DIR/config.json and DIR/generation_config.json, so that `Olmo3ForCausalLM.from_pretrained(DIR)`
// rebuilds the model and `generate` knows when to stop; given a tokenizer, also its Hugging Face files
// (interop/hf_tokenizer.h), so that AutoTokenizer.from_pretrained(DIR) loads it.
// Import reads such a directory back (fp32, bf16 or fp16 tensors; a single file or HF's sharded
// model.safetensors.index.json) and refuses anything that does not match the ModelConfig exactly.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "core/model_config.h"
#include "core/params.h"

namespace olmoref {

namespace data {
class BpeTokenizer;
}

struct HfExportOptions {
  // HF uses it only as the nominal context length; 0 writes 8192 (the Olmo 3 pretraining length).
  int64_t max_position_embeddings = 0;
  // Token ids for config.json and generation_config.json. Unset: the tokenizer's (olmoref's BPE: eos 256, pad 257,
  // no BOS) when one is given, else dolma2's eos 100257 / pad 100277 when they fit in the vocabulary, else null.
  // A set id must lie in [0, vocab_size), because HF builds nn.Embedding(padding_idx=pad_token_id).
  std::optional<int64_t> eos_token_id, pad_token_id, bos_token_id;
  // Written as tokenizer.json + tokenizer_config.json + special_tokens_map.json when set; every id it defines must
  // lie below the model's vocab_size.
  const data::BpeTokenizer* tokenizer = nullptr;
  // Extra entries for the safetensors __metadata__ (e.g. the run name or step); "format": "pt" is always written.
  std::map<std::string, std::string> metadata;
};

// Throws std::invalid_argument ("WHAT: config key '...': ...") when the model has no Hugging Face Olmo3 form: a
// mixture of experts, or sliding layers with different windows. Callers that know the config file prefix it
// (train/weights.h require_hf_form), so the error names the file as config errors do.
void check_hf_representable(const ModelConfig& cfg, const char* what);

// The config.json content for `cfg` (exposed for tests and for tools that only need the config).
// Throws std::invalid_argument when HF cannot represent the model: the sliding-window layers use different
// window sizes (HF Olmo3Config has one `sliding_window`), or a token id is out of range.
std::string hf_config_json(const ModelConfig& cfg, const HfExportOptions& opts = {});
// generation_config.json: the same eos/pad/bos ids as config.json (GenerationConfig stops on eos and pads with pad).
std::string hf_generation_config_json(const ModelConfig& cfg, const HfExportOptions& opts = {});

// Floats [a, b) of a flat parameter vector into out, from wherever it lives; the writers below call it in order.
using FlatReader = std::function<void(int64_t a, int64_t b, float* out)>;

// Creates `dir` if needed and writes dir/model.safetensors, dir/config.json, dir/generation_config.json and (with
// opts.tokenizer) the tokenizer files, each atomically.
void export_hf_checkpoint(const std::string& dir, const ModelConfig& cfg, const ParamLayout& layout,
                          const float* params, const HfExportOptions& opts = {});
// The same, reading the weights piece by piece (at most 16 MiB at a time, in the flat vector's order) as the file is
// written: a tool's peak does not grow with the model.
void export_hf_checkpoint(const std::string& dir, const ModelConfig& cfg, const ParamLayout& layout,
                          const FlatReader& read, const HfExportOptions& opts = {});

// Fills params[0 .. layout.total) from dir. Requires every parameter of `layout` present under its HF name with
// exactly its shape, and no other tensor (a leftover tensor usually means more layers than `cfg`). When
// dir/config.json exists, its architecture fields (sizes, heads, head_dim, rope theta, eps, layer types and
// window) must match `cfg` too. Throws std::runtime_error naming the file and the fix.
void import_hf_checkpoint(const std::string& dir, const ModelConfig& cfg, const ParamLayout& layout, float* params);

// The same checks, made once when opened (headers only); then any range of the flat vector is read from the
// tensors' bytes alone: a rank of a sharded run reads only its slices of the safetensors files.
class HfWeights {
 public:
  HfWeights(const std::string& dir, const ModelConfig& cfg, const ParamLayout& layout);
  ~HfWeights();
  HfWeights(const HfWeights&) = delete;
  HfWeights& operator=(const HfWeights&) = delete;
  void read(int64_t a, int64_t b, float* out) const;  // floats [a, b) of the flat vector

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Where imported weights came from, as `sha256sum` would check it: the SHA-256 of dir/model.safetensors, or for a
// sharded checkpoint the SHA-256 of the lines "<sha256>  <shard file>\n" of its shards in file-name order (what
// `sha256sum model-*.safetensors | sha256sum` prints). Throws naming the directory when it holds neither.
std::string hf_weights_sha256(const std::string& dir);

// export_hf_checkpoint's list of the files it wrote and their SHA-256, as `sha256sum` writes it (so `sha256sum -c
// SHA256SUMS` checks an export anywhere), written last. Loaders of Hugging Face checkpoints ignore it.
inline constexpr const char* kExportChecksums = "SHA256SUMS";
// Checks every file dir/SHA256SUMS lists against its SHA-256, throwing naming the file, both digests and the fix
// (model.safetensors against weights_sha256 when given: a caller that hashed it already); does nothing when dir has
// no SHA256SUMS (a checkpoint from save_pretrained).
void verify_export_checksums(const std::string& dir, const std::string& weights_sha256 = "");

// Writes `text` to `path` through a temporary file, fsync and rename, so the file is never half written.
void write_text_file_atomic(const std::string& path, const std::string& text);

}  // namespace olmoref
