// data/dataset.h — fixed-sequence-length instances over a mix, exactly as OLMo-core's NumpyFSLDataset.
//
//   file f with n_f tokens yields floor(n_f / L) instances, the chunks [i*L, (i+1)*L) of that file;
//   the tail of each file (n_f mod L tokens) is dropped; an instance never crosses a file;
//   global instance ids concatenate files in mix order: file f owns ids [offset_f, offset_f + n_f/L).
//
// With max_target_sequence_length M (a multiple of L, as the official Olmo 3 scripts set it, e.g. L 8192 and M
// 65536 for long-context reuse of the same token files) a file yields floor(n_f / M) * (M / L) instances: the tail
// is cut at a multiple of M, so the instances come in chunks of M / L consecutive ones, which the order shuffles
// as units (data/shuffle.h GlobalOrder). M unset or M == L is the plain dataset, fingerprint unchanged.
//
// One deliberate difference from OLMo-core: a file shorter than one instance is an error here
// (OLMo-core silently gives it zero instances, which usually means a wrong seq len or dtype).
// DatasetOptions::allow_short_files restores OLMo-core's behaviour.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "data/mix.h"
#include "data/token_file.h"

namespace olmoref::data {

struct DatasetOptions {
  int64_t sequence_length = 0;     // tokens per instance (OLMo-core sequence_length)
  int64_t vocab_size = 0;          // ids >= vocab_size are rejected when read
  std::optional<Dtype> dtype;      // default: dtype_for_vocab(vocab_size), as OLMo-core
  std::optional<uint32_t> eos_id;  // used to count documents; not needed to cut instances
  bool allow_short_files = false;  // OLMo-core behaviour: a file shorter than L (or M) gives 0 instances
  int64_t max_target_sequence_length = 0;  // OLMo-core's; 0 = none. A multiple of sequence_length
};

class FslDataset {
 public:
  // Opens (maps) every file of the mix. Throws, naming the file, on a missing file, a size
  // that is not a multiple of the dtype, or a file shorter than one instance.
  FslDataset(const Mix& mix, const DatasetOptions& options);

  int64_t size() const { return offsets_.back(); }  // number of instances
  int64_t sequence_length() const { return seq_len_; }
  // 0 when unset (or equal to sequence_length); else M.
  int64_t max_target_sequence_length() const { return max_target_; }
  // Consecutive instances the order keeps together: M / L, or 1 (OLMo-core's data loader chunk_size).
  int64_t chunk_instances() const { return max_target_ > 0 ? max_target_ / seq_len_ : 1; }
  int64_t vocab_size() const { return vocab_size_; }
  Dtype dtype() const { return dtype_; }
  std::optional<uint32_t> eos_id() const { return eos_id_; }
  const Mix& mix() const { return mix_; }

  size_t n_files() const { return files_.size(); }
  const TokenFile& file(size_t i) const { return files_[i]; }
  int64_t file_first_instance(size_t i) const { return offsets_[i]; }
  int64_t file_instances(size_t i) const { return offsets_[i + 1] - offsets_[i]; }
  int64_t n_tokens_total() const;  // all tokens in all files, including dropped tails

  struct Location {
    int32_t file = 0;         // index into the mix
    int64_t token_start = 0;  // first token of the instance within that file
  };
  Location locate(int64_t instance) const;

  // Tokens of one instance, widened to uint32; out.size() must be sequence_length().
  void read_instance(int64_t instance, std::span<uint32_t> out) const;
  std::vector<uint32_t> instance(int64_t instance) const;
  void prefetch_instance(int64_t instance) const;

  // "fsl-v1:" + XXH3-128 of fingerprint_text(). Like OLMo-core's fingerprint it covers file base
  // names (not directories: a moved corpus is the same corpus) and byte sizes in mix order,
  // plus the dtype and sequence length: everything that decides which tokens instance i holds.
  const std::string& fingerprint() const { return fingerprint_; }
  std::string fingerprint_text() const;

  // Reads every token of every file: ids < vocab_size, documents per file. Throws naming the
  // first file with a bad id. Optional (the loader checks ids of what it reads anyway).
  void validate_all_tokens() const;

 private:
  Mix mix_;
  int64_t seq_len_ = 0;
  int64_t max_target_ = 0;
  int64_t vocab_size_ = 0;
  Dtype dtype_ = Dtype::u32;
  std::optional<uint32_t> eos_id_;
  std::vector<TokenFile> files_;
  std::vector<int64_t> offsets_;  // offsets_[f] = first global instance of file f; back() = size
  std::string fingerprint_;
};

}  // namespace olmoref::data
