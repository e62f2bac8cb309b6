// data/token_file.h — OLMo-core token files: headerless little-endian uint16/uint32 streams.
//
// A token file is nothing but token ids back to back, each document ending in EOS (OLMo-core
// writes them with a `.npy` name but no numpy header). Files can be hundreds of GB, so they are
// memory-mapped read-only and never loaded whole; every offset is int64 (token units unless the
// name says bytes). Token ids are always handed out widened to uint32 so everything downstream
// (hashes, batches, the audit log) is the same whichever dtype the file uses.
#pragma once

#include <bit>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace olmoref::data {

static_assert(std::endian::native == std::endian::little,
              "token files are little-endian and are mapped without byte swapping");

enum class Dtype : uint8_t { u16 = 2, u32 = 4 };

inline int64_t dtype_size(Dtype d) { return static_cast<int64_t>(d); }
const char* dtype_name(Dtype d);             // "uint16" / "uint32" (numpy spelling)
Dtype parse_dtype(std::string_view name);    // accepts uint16/u16/uint32/u32; throws otherwise
// OLMo-core's get_dtype: the smallest unsigned type that holds vocab_size-1 (uint8 is not
// supported here; a vocabulary that small gets uint16).
Dtype dtype_for_vocab(int64_t vocab_size);

class TokenFile {
 public:
  // Maps `path`. Throws, naming the file, if it is missing, unreadable, or its size is not a
  // multiple of the dtype size (a sign of the wrong dtype or a truncated write).
  TokenFile(std::string path, Dtype dtype);
  ~TokenFile();
  TokenFile(TokenFile&& other) noexcept;
  TokenFile& operator=(TokenFile&& other) noexcept;
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;

  const std::string& path() const { return path_; }
  Dtype dtype() const { return dtype_; }
  int64_t size_bytes() const { return size_bytes_; }
  int64_t n_tokens() const { return size_bytes_ / dtype_size(dtype_); }

  uint32_t token(int64_t i) const {
    return dtype_ == Dtype::u16 ? static_cast<const uint16_t*>(base_)[i]
                                : static_cast<const uint32_t*>(base_)[i];
  }

  // Copies tokens [start, start + out.size()) widened to uint32. When vocab_size > 0 every id is
  // checked and an id >= vocab_size throws with the file name and token offset: this is where a
  // corrupt file or a wrong tokenizer is caught without a separate full scan.
  void read(int64_t start, std::span<uint32_t> out, int64_t vocab_size) const;

  // Asks the kernel to start reading [start, start + count) tokens (MADV_WILLNEED). The loader
  // calls it for a whole batch before copying, so cold-cache random reads overlap.
  void prefetch(int64_t start, int64_t count) const;

  struct Scan {
    int64_t n_documents = 0;       // EOS count, plus one if the file does not end in EOS
    bool ends_with_eos = true;     // false for a non-empty file whose last token is not EOS
    uint32_t max_id = 0;
    int64_t first_bad_offset = -1; // first token offset with id >= vocab_size, or -1
    uint32_t first_bad_id = 0;
  };
  // One sequential pass over the whole file (the only code that reads everything).
  Scan scan(uint32_t eos_id, int64_t vocab_size) const;

 private:
  void check_contents() const;  // refuses .npy files and uint32 tokens read as uint16, naming the file
  void unmap();

  std::string path_;
  Dtype dtype_ = Dtype::u32;
  int64_t size_bytes_ = 0;
  const void* base_ = nullptr;  // nullptr for an empty file (mmap cannot map 0 bytes)
};

// Buffered writer for token files. It writes to `path + ".tmp"` and renames on close(), so a
// crash never leaves a half-written file under the final name. Ids that do not fit the dtype
// throw instead of being truncated.
class TokenFileWriter {
 public:
  TokenFileWriter(std::string path, Dtype dtype);
  ~TokenFileWriter();  // without close(): removes the temporary file
  TokenFileWriter(const TokenFileWriter&) = delete;
  TokenFileWriter& operator=(const TokenFileWriter&) = delete;

  void write(std::span<const uint32_t> tokens);
  void close();
  int64_t n_tokens() const { return n_tokens_; }
  const std::string& path() const { return path_; }

 private:
  void flush_buffer();

  std::string path_;
  std::string tmp_path_;
  Dtype dtype_;
  std::FILE* f_ = nullptr;
  std::vector<unsigned char> buffer_;
  int64_t n_tokens_ = 0;
};

// Writes documents into numbered files `dir/prefix-00000.npy`, `-00001`, ... starting a new file
// once the current one holds max_tokens_per_file tokens; documents are never split across
// files, so every file ends in EOS (when documents do). The `.npy` name follows OLMo-core's
// mixes even though, as there, the files carry no numpy header.
class ShardedTokenWriter {
 public:
  ShardedTokenWriter(std::string dir, std::string prefix, Dtype dtype, int64_t max_tokens_per_file);
  void add_document(std::span<const uint32_t> tokens);  // tokens include the trailing EOS
  std::vector<std::string> finish();                     // closes; returns the file paths in order
  int64_t n_documents() const { return n_documents_; }
  int64_t n_tokens() const { return n_tokens_; }

 private:
  std::string dir_, prefix_;
  Dtype dtype_;
  int64_t max_tokens_per_file_;
  std::unique_ptr<TokenFileWriter> current_;
  std::vector<std::string> paths_;
  int64_t n_documents_ = 0, n_tokens_ = 0;
};

}  // namespace olmoref::data
