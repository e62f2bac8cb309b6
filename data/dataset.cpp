#include "data/dataset.h"

#include <xxhash.h>

#include <algorithm>
#include <filesystem>
#include <stdexcept>

namespace olmoref::data {

static std::string hex128(XXH128_hash_t h) {
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, h);  // big-endian bytes: the hex reads like the number
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (unsigned char b : c.digest) {
    s += digits[b >> 4];
    s += digits[b & 15];
  }
  return s;
}

FslDataset::FslDataset(const Mix& mix, const DatasetOptions& options)
    : mix_(mix), seq_len_(options.sequence_length), vocab_size_(options.vocab_size), eos_id_(options.eos_id) {
  if (mix.empty()) {
    throw std::runtime_error("empty mix" + (mix.source.empty() ? std::string() : " '" + mix.source + "'") +
                             ": the dataset needs at least one token file");
  }
  if (seq_len_ <= 0) throw std::runtime_error("sequence_length must be positive (got " + std::to_string(seq_len_) + ")");
  if (vocab_size_ <= 0) throw std::runtime_error("vocab_size must be positive (got " + std::to_string(vocab_size_) + ")");
  if (options.max_target_sequence_length != 0 && options.max_target_sequence_length != seq_len_) {
    const int64_t m = options.max_target_sequence_length;
    if (m < seq_len_ || m % seq_len_ != 0)
      throw std::runtime_error("data.max_target_sequence_length " + std::to_string(m) +
                               " must be a multiple of the sequence length " + std::to_string(seq_len_) +
                               " (OLMo-core requires the same); e.g. " + std::to_string(seq_len_ * 8));
    max_target_ = m;
  }
  // The unit a file is cut into: M tokens (then M / L instances each) or L.
  const int64_t unit = max_target_ > 0 ? max_target_ : seq_len_;
  dtype_ = options.dtype ? *options.dtype : dtype_for_vocab(vocab_size_);
  if (dtype_ == Dtype::u16 && vocab_size_ > 65536) {
    throw std::runtime_error("vocab_size " + std::to_string(vocab_size_) + " cannot be stored as uint16; use uint32");
  }
  files_.reserve(mix.size());
  offsets_.reserve(mix.size() + 1);
  offsets_.push_back(0);
  for (const auto& e : mix.entries) {
    files_.emplace_back(e.path, dtype_);
    const TokenFile& f = files_.back();
    if (f.n_tokens() < unit && !options.allow_short_files) {
      throw std::runtime_error("token file '" + e.path + "' has " + std::to_string(f.n_tokens()) +
                               " tokens, fewer than one " +
                               (max_target_ > 0 ? "chunk of max_target_sequence_length " + std::to_string(unit)
                                                : "instance of sequence_length " + std::to_string(unit)) +
                               "; use a shorter sequence length, remove the file from the mix, or allow short "
                               "files (OLMo-core gives them zero instances)");
    }
    offsets_.push_back(offsets_.back() + f.n_tokens() / unit * (unit / seq_len_));
  }
  if (size() == 0) {
    throw std::runtime_error("mix '" + mix.source + "' yields no instance of sequence_length " +
                             std::to_string(seq_len_) + " (every file is shorter)");
  }
  fingerprint_ = "fsl-v1:" + hex128(XXH3_128bits(fingerprint_text().data(), fingerprint_text().size()));
}

std::string FslDataset::fingerprint_text() const {
  std::string s = "olmoref-fsl-dataset-v1\n";
  s += "sequence_length=" + std::to_string(seq_len_) + "\n";
  s += std::string("dtype=") + dtype_name(dtype_) + "\n";
  if (max_target_ > 0) s += "max_target_sequence_length=" + std::to_string(max_target_) + "\n";
  for (const auto& f : files_) {
    s += "file=" + std::filesystem::path(f.path()).filename().string() + ",size=" + std::to_string(f.size_bytes()) +
         "\n";
  }
  return s;
}

int64_t FslDataset::n_tokens_total() const {
  int64_t n = 0;
  for (const auto& f : files_) n += f.n_tokens();
  return n;
}

FslDataset::Location FslDataset::locate(int64_t instance) const {
  if (instance < 0 || instance >= size()) {
    throw std::out_of_range("instance " + std::to_string(instance) + " is out of range: the dataset has " +
                            std::to_string(size()) + " instances");
  }
  // offsets_ is non-decreasing; the owner is the last file whose first instance is <= id
  // (files with zero instances share their offset with the next file and are skipped by this).
  const auto it = std::upper_bound(offsets_.begin(), offsets_.end(), instance);
  const auto f = static_cast<int32_t>(it - offsets_.begin() - 1);
  return {f, (instance - offsets_[static_cast<size_t>(f)]) * seq_len_};
}

void FslDataset::read_instance(int64_t instance, std::span<uint32_t> out) const {
  if (static_cast<int64_t>(out.size()) != seq_len_) {
    throw std::invalid_argument("read_instance: output holds " + std::to_string(out.size()) +
                                " tokens, sequence_length is " + std::to_string(seq_len_));
  }
  const Location loc = locate(instance);
  files_[static_cast<size_t>(loc.file)].read(loc.token_start, out, vocab_size_);
}

std::vector<uint32_t> FslDataset::instance(int64_t instance) const {
  std::vector<uint32_t> out(static_cast<size_t>(seq_len_));
  read_instance(instance, out);
  return out;
}

void FslDataset::prefetch_instance(int64_t instance) const {
  const Location loc = locate(instance);
  files_[static_cast<size_t>(loc.file)].prefetch(loc.token_start, seq_len_);
}

void FslDataset::validate_all_tokens() const {
  for (const auto& f : files_) {
    const TokenFile::Scan s = f.scan(eos_id_.value_or(0xffffffffu), vocab_size_);
    if (s.first_bad_offset >= 0) {
      throw std::runtime_error("token file '" + f.path() + "': token id " + std::to_string(s.first_bad_id) +
                               " at token offset " + std::to_string(s.first_bad_offset) + " is >= vocab_size " +
                               std::to_string(vocab_size_) +
                               "; the file was written with a different tokenizer, or it is corrupt");
    }
  }
}

}  // namespace olmoref::data
