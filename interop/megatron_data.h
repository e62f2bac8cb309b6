// interop/megatron_data.h — what a Megatron-LM run trained on, from Megatron's own files (docs/formats/frameworks.md):
//
//   PREFIX.idx / PREFIX.bin   the IndexedDataset megatron.core.datasets.indexed_dataset writes: a header
//                             ("MMIDIDX\0\0", version 1, dtype code, sequence and document counts), the int32
//                             sequence lengths, int64 byte pointers, int64 document boundaries; .bin the raw tokens
//   CACHE/<md5>-GPTDataset-<split>-description.txt   the JSON that identifies the index set (dataset_path, seed,
//                             sequence_length, split, num_samples, ...; its MD5 names the files)
//   CACHE/<md5>-GPTDataset-<split>-{document,sample,shuffle}_index.npy
//                             document_index: the sequence ids of every epoch in order; sample_index [S + 1, 2]:
//                             (position in document_index, token offset) where each sample starts; shuffle_index:
//                             the sample order. Sample k of the run is sample_index row shuffle_index[k]: its
//                             sequence_length + 1 tokens (add_extra_token_to_sequence) read across the documents
//                             document_index[beg..end], from offset beg to offset end (+ 1), as GPTDataset does.
//
// Iteration i of a run with global batch G (no batch-size ramp-up, consumed samples starting at 0) trains on samples
// [(i - 1) G, i G). Every read is checked against the files: an index that points outside the documents, or a
// sample whose documents do not hold its length (the token files changed after the indices were built), is refused
// naming the file, never guessed around.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace olmoref::interop {

// A 1-D or 2-D little-endian integer array from a .npy file (format 1.0-3.0, C order; <i4 <i8 <u4 <u8 <i2 <u2).
struct NpyArray {
  std::vector<int64_t> values;
  std::vector<int64_t> shape;
  std::string descr;
};
NpyArray read_npy_integers(const std::string& path);

class MegatronIndexedDataset {
 public:
  explicit MegatronIndexedDataset(const std::string& prefix);  // PREFIX.idx and PREFIX.bin
  const std::string& prefix() const { return prefix_; }
  int64_t sequences() const { return static_cast<int64_t>(lengths_.size()); }
  int64_t sequence_length(int64_t seq) const { return lengths_[static_cast<size_t>(seq)]; }
  int dtype_size() const { return dtype_size_; }
  std::string dtype_name() const;
  // tokens [offset, offset + out.size()) of sequence `seq`, widened; throws naming the file when out of range.
  void read(int64_t seq, int64_t offset, std::span<uint32_t> out) const;

 private:
  std::string prefix_;
  int dtype_code_ = 0, dtype_size_ = 0;
  std::vector<int32_t> lengths_;
  std::vector<int64_t> pointers_;
  int64_t bin_bytes_ = 0;
  std::shared_ptr<const uint8_t> bin_;  // the mapped .bin
};

class MegatronGptSamples {
 public:
  // The index set in `cache_dir` built for dataset PREFIX and `split` ("train"): refuses none, several, a blend,
  // or one whose description names another dataset, listing what it found.
  MegatronGptSamples(const std::string& cache_dir, const std::string& prefix, const std::string& split = "train",
                     bool add_extra_token = true);
  int64_t samples() const { return static_cast<int64_t>(shuffle_.size()); }
  int64_t sample_tokens() const { return seq_len_ + (extra_ ? 1 : 0); }
  int64_t sequence_length() const { return seq_len_; }
  const nlohmann::json& description() const { return description_; }
  const std::string& base() const { return base_; }  // <md5>-GPTDataset-<split>
  const MegatronIndexedDataset& dataset() const { return *data_; }
  // The tokens of sample k of the run (after the shuffle); out.size() == sample_tokens(). Thread-safe.
  void read(int64_t k, std::span<uint32_t> out) const;

 private:
  std::shared_ptr<MegatronIndexedDataset> data_;
  std::string base_, cache_dir_;
  nlohmann::json description_;
  int64_t seq_len_ = 0;
  bool extra_ = true;
  std::vector<int64_t> doc_index_, shuffle_;
  std::vector<int64_t> sample_index_;  // [S + 1][2], row major
};

// The iteration a Megatron checkpoint directory records (latest_checkpointed_iteration.txt).
int64_t megatron_checkpoint_iteration(const std::string& checkpoint_dir);

}  // namespace olmoref::interop
