// data/bpe.h — a small byte-level BPE tokenizer, trained deterministically on a corpus.
//
// Ids:      0..255 the raw bytes, 256 EOS, 257 PAD (fixed whatever the vocabulary size),
//           258 + i the i-th merge. vocab_size counts all of them (ids >= 258 + n_merges unused).
// Pre-tokenization ("olmoref-bytes-v1", a byte-level cousin of GPT-2's regex): text is cut into
// chunks and merges never cross a chunk boundary. A chunk is one of
//   - an optional single leading space + a run of letters (ASCII letters and every byte >= 0x80,
//     so UTF-8 characters stay inside words),
//   - an optional single leading space + a run of digits,
//   - an optional single leading space + a run of other printable bytes (punctuation),
//   - a run of whitespace; if a space ends the run and a non-space follows, that last space
//     starts the next chunk instead (" the" is one chunk, as in GPT-2).
// Every byte belongs to exactly one chunk, so decode(encode(text)) == text for any bytes.
// Training: classic BPE over the chunk multiset. Each round merges the most frequent adjacent
// pair; ties go to the smallest (left id, right id); pairs seen fewer than min_pair_count times
// are never merged. Counts are updated incrementally, so the run is O(corpus + merges * touched
// words) and reproducible bit for bit (no hash-order dependence).
// Encoding applies merges in training order (lowest merge index first), i.e. the usual BPE rule.
//
// File format (JSON, written by save()):
//   {"format": "olmoref-bpe-v1", "vocab_size": 2048, "eos_id": 256, "pad_id": 257,
//    "pretokenizer": "olmoref-bytes-v1", "merges": [[116, 104], [32, 116], ...]}
// merges[i] = [left, right] creates id 258 + i.
//
// A Hugging Face byte-level BPE tokenizer.json whose pre-tokenizer is olmoref-bytes-v1, as interop/hf_tokenizer.h
// writes it, is read by interop::load_tokenizer (which takes either file); its ids need not follow the layout above
// (any id per byte, per merge and per special token), so a Spec carries them explicitly.
#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace olmoref::data {

// Calls emit(chunk) for each pre-tokenization chunk of `text`, in order.
template <typename Emit>
void pretokenize(std::string_view text, Emit&& emit);

class BpeTokenizer {
 public:
  static constexpr uint32_t kEos = 256;
  static constexpr uint32_t kPad = 257;
  static constexpr uint32_t kFirstMerge = 258;

  struct TrainOptions {
    int64_t vocab_size = 2048;    // including the 256 bytes and the 2 special tokens
    int64_t min_pair_count = 2;
  };
  static BpeTokenizer train(std::span<const std::string_view> documents, const TrainOptions& options);
  // olmoref-bpe-v1; throws naming the file (a Hugging Face tokenizer.json: interop::load_tokenizer).
  static BpeTokenizer load(const std::string& path);
  // The same from the parsed file (`path` names it in errors).
  static BpeTokenizer from_json(const nlohmann::json& j, const std::string& path);
  // Writes olmoref-bpe-v1; throws when the ids do not follow its layout (see has_olmoref_layout()).
  void save(const std::string& path) const;

  // Every id explicitly: what a tokenizer of another layout (a Hugging Face tokenizer.json) holds.
  struct Spec {
    int64_t vocab_size = 0;
    std::array<uint32_t, 256> byte_ids{};                 // id of each single byte
    std::vector<std::pair<uint32_t, uint32_t>> merges;    // in rank order: [left id, right id]
    std::vector<uint32_t> merge_ids;                      // the id merges[i] creates
    uint32_t eos = kEos;
    std::optional<uint32_t> pad;
    std::vector<std::pair<uint32_t, std::string>> specials;  // id -> text (never produced from text)
  };
  explicit BpeTokenizer(const Spec& spec);  // throws std::runtime_error on an inconsistent spec
  Spec spec() const;
  // Bytes are ids 0..255, EOS 256, PAD 257, merge i id 258 + i: what olmoref-bpe-v1 can hold.
  bool has_olmoref_layout() const;

  BpeTokenizer(const BpeTokenizer& other);
  BpeTokenizer& operator=(const BpeTokenizer& other);

  int64_t vocab_size() const { return vocab_size_; }
  size_t n_merges() const { return merges_.size(); }
  uint32_t eos_id() const { return eos_; }
  std::optional<uint32_t> pad_id() const { return pad_; }
  const std::vector<std::pair<uint32_t, uint32_t>>& merges() const { return merges_; }
  uint32_t merge_id(size_t i) const { return merge_ids_[i]; }
  uint32_t byte_id(unsigned char b) const { return byte_ids_[b]; }
  bool is_special(uint32_t id) const;

  // Encodes text without adding EOS (append it per document). Thread-safe.
  std::vector<uint32_t> encode(std::string_view text) const;
  void encode_append(std::string_view text, std::vector<uint32_t>& out) const;
  // Bytes of the ids; special tokens are rendered as their text (EOS <|endoftext|>, PAD <|pad|>).
  std::string decode(std::span<const uint32_t> ids) const;
  const std::string& token_bytes(uint32_t id) const;

 private:
  BpeTokenizer(int64_t vocab_size, std::vector<std::pair<uint32_t, uint32_t>> merges);
  void encode_chunk(std::string_view chunk, std::vector<uint32_t>& out) const;

  int64_t vocab_size_ = 0;
  std::vector<std::pair<uint32_t, uint32_t>> merges_;
  std::vector<uint32_t> merge_ids_;              // merge index -> the id it creates
  std::array<uint32_t, 256> byte_ids_{};
  uint32_t eos_ = kEos;
  std::optional<uint32_t> pad_ = kPad;
  std::unordered_map<uint64_t, uint32_t> rank_;  // (left << 32 | right) -> merge index
  std::vector<std::string> bytes_;               // id -> bytes
  std::vector<char> defined_, special_;          // id -> has bytes / is a special token
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<uint32_t>> cache_;  // chunk -> ids
};

// --- implementation of the template --------------------------------------------------------------

namespace pretok_detail {
enum Class { kSpace, kLetter, kDigit, kOther };
inline Class classify(unsigned char c) {
  if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f') return kSpace;
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c >= 0x80) return kLetter;
  if (c >= '0' && c <= '9') return kDigit;
  return kOther;
}
}  // namespace pretok_detail

template <typename Emit>
void pretokenize(std::string_view t, Emit&& emit) {
  using namespace pretok_detail;
  const size_t n = t.size();
  size_t i = 0;
  while (i < n) {
    if (classify(static_cast<unsigned char>(t[i])) == kSpace) {
      size_t j = i;
      while (j < n && classify(static_cast<unsigned char>(t[j])) == kSpace) ++j;
      if (j < n && t[j - 1] == ' ') {
        if (j - 1 > i) emit(t.substr(i, j - 1 - i));
        i = j - 1;  // the last space leads the following word
      } else {
        emit(t.substr(i, j - i));
        i = j;
        continue;
      }
    }
    const size_t start = i;
    if (t[i] == ' ') ++i;  // only reached when a non-space follows
    const Class cls = classify(static_cast<unsigned char>(t[i]));
    while (i < n && classify(static_cast<unsigned char>(t[i])) == cls) ++i;
    emit(t.substr(start, i - start));
  }
}

}  // namespace olmoref::data
