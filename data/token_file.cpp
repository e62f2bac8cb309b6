#include "data/token_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <utility>

namespace olmoref::data {

const char* dtype_name(Dtype d) { return d == Dtype::u16 ? "uint16" : "uint32"; }

Dtype parse_dtype(std::string_view name) {
  if (name == "uint16" || name == "u16") return Dtype::u16;
  if (name == "uint32" || name == "u32") return Dtype::u32;
  throw std::runtime_error("unknown token dtype '" + std::string(name) +
                           "': use uint16 or uint32 (OLMo-core token files are one of the two)");
}

Dtype dtype_for_vocab(int64_t vocab_size) {
  if (vocab_size <= 0) throw std::runtime_error("vocab_size must be positive to choose a token dtype");
  if (vocab_size - 1 <= 0xffff) return Dtype::u16;
  if (vocab_size - 1 <= 0xffffffffLL) return Dtype::u32;
  throw std::runtime_error("vocab_size " + std::to_string(vocab_size) + " does not fit uint32 token ids");
}

TokenFile::TokenFile(std::string path, Dtype dtype) : path_(std::move(path)), dtype_(dtype) {
  int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    throw std::runtime_error("token file '" + path_ + "': cannot open (" + std::strerror(errno) +
                             "); check the path (mix file line or file list)");
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    throw std::runtime_error("token file '" + path_ + "': cannot stat (" + std::strerror(e) + ")");
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw std::runtime_error("token file '" + path_ + "': not a regular file");
  }
  size_bytes_ = static_cast<int64_t>(st.st_size);
  if (size_bytes_ % dtype_size(dtype_) != 0) {
    ::close(fd);
    throw std::runtime_error("token file '" + path_ + "': size " + std::to_string(size_bytes_) +
                             " bytes is not a multiple of " + std::to_string(dtype_size(dtype_)) +
                             " (" + dtype_name(dtype_) +
                             "); the file is truncated or the dtype is wrong (set it explicitly, or "
                             "check vocab_size, from which the dtype is derived)");
  }
  if (size_bytes_ > 0) {
    void* p = ::mmap(nullptr, static_cast<size_t>(size_bytes_), PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      int e = errno;
      ::close(fd);
      throw std::runtime_error("token file '" + path_ + "': mmap failed (" + std::strerror(e) + ")");
    }
    // Instances are read at random offsets; the kernel's default read-around would pull in
    // neighbouring pages that the next batch almost never needs. prefetch() asks for exactly
    // the instance ranges instead.
    ::madvise(p, static_cast<size_t>(size_bytes_), MADV_RANDOM);
    base_ = p;
  }
  ::close(fd);  // the mapping keeps the file alive
  check_contents();
}

// Two mistakes that would otherwise train on garbage without a word: a NumPy .npy file (its header read as tokens)
// and uint32 tokens read as uint16 (every second 16-bit value is a zero high half). The first 64 KiB decide.
void TokenFile::check_contents() const {
  const auto* bytes = static_cast<const unsigned char*>(base_);
  if (size_bytes_ >= 6 && std::memcmp(bytes, "\x93NUMPY", 6) == 0) {
    throw std::runtime_error("token file '" + path_ + "': a NumPy .npy file (it starts with the .npy header), "
                             "not a raw token array; write the tokens with array.astype(numpy.uint16 or uint32)"
                             ".tofile(path), as OLMo-core's files are, and point the config at that file");
  }
  if (dtype_ != Dtype::u16) return;
  const int64_t n = std::min<int64_t>(size_bytes_ / 2, 32768) / 2 * 2;  // whole (low, high) pairs
  if (n < 128) return;
  int64_t high_zero = 0, low_nonzero = 0;
  for (int64_t i = 0; i < n; i += 2) {
    const uint16_t lo = static_cast<uint16_t>(bytes[2 * i] | bytes[2 * i + 1] << 8);
    const uint16_t hi = static_cast<uint16_t>(bytes[2 * i + 2] | bytes[2 * i + 3] << 8);
    high_zero += hi == 0;
    low_nonzero += lo != 0;
  }
  const int64_t pairs = n / 2;
  if (high_zero == pairs && low_nonzero * 2 > pairs)
    throw std::runtime_error("token file '" + path_ + "': read as uint16, every second value of its first " +
                             std::to_string(n) + " is 0: these are uint32 tokens (the zeros are their high halves); "
                             "set data.dtype = \"u32\" (\"auto\" picks uint16 for a vocabulary below 65536)");
}

TokenFile::~TokenFile() { unmap(); }

void TokenFile::unmap() {
  if (base_ != nullptr) ::munmap(const_cast<void*>(base_), static_cast<size_t>(size_bytes_));
  base_ = nullptr;
}

TokenFile::TokenFile(TokenFile&& other) noexcept
    : path_(std::move(other.path_)), dtype_(other.dtype_), size_bytes_(other.size_bytes_), base_(other.base_) {
  other.base_ = nullptr;
  other.size_bytes_ = 0;
}

TokenFile& TokenFile::operator=(TokenFile&& other) noexcept {
  if (this != &other) {
    unmap();
    path_ = std::move(other.path_);
    dtype_ = other.dtype_;
    size_bytes_ = other.size_bytes_;
    base_ = other.base_;
    other.base_ = nullptr;
    other.size_bytes_ = 0;
  }
  return *this;
}

[[noreturn]] static void throw_bad_id(const std::string& path, int64_t offset, uint32_t id, int64_t vocab_size) {
  throw std::runtime_error("token file '" + path + "': token id " + std::to_string(id) + " at token offset " +
                           std::to_string(offset) + " is >= vocab_size " + std::to_string(vocab_size) +
                           "; the file was written with a different tokenizer, or it is corrupt");
}

void TokenFile::read(int64_t start, std::span<uint32_t> out, int64_t vocab_size) const {
  const int64_t count = static_cast<int64_t>(out.size());
  if (start < 0 || start + count > n_tokens()) {
    throw std::runtime_error("token file '" + path_ + "': read of tokens [" + std::to_string(start) + ", " +
                             std::to_string(start + count) + ") is past its end (" + std::to_string(n_tokens()) +
                             " tokens); did the file change while in use?");
  }
  if (count == 0) return;
  uint32_t max_id = 0;
  if (dtype_ == Dtype::u16) {
    const uint16_t* src = static_cast<const uint16_t*>(base_) + start;
    for (int64_t i = 0; i < count; ++i) {
      out[i] = src[i];
      max_id = std::max<uint32_t>(max_id, src[i]);
    }
  } else {
    const uint32_t* src = static_cast<const uint32_t*>(base_) + start;
    std::memcpy(out.data(), src, static_cast<size_t>(count) * 4);
    for (int64_t i = 0; i < count; ++i) max_id = std::max(max_id, out[i]);
  }
  // The max is folded into the copy loop (vectorises); only a failing read pays for locating the id.
  if (vocab_size > 0 && static_cast<int64_t>(max_id) >= vocab_size) {
    for (int64_t i = 0; i < count; ++i) {
      if (static_cast<int64_t>(out[i]) >= vocab_size) throw_bad_id(path_, start + i, out[i], vocab_size);
    }
  }
}

void TokenFile::prefetch(int64_t start, int64_t count) const {
  if (base_ == nullptr || count <= 0) return;
  static const int64_t page = ::sysconf(_SC_PAGESIZE);
  const int64_t b0 = start * dtype_size(dtype_);
  const int64_t b1 = std::min(size_bytes_, (start + count) * dtype_size(dtype_));
  const int64_t aligned = b0 / page * page;
  ::madvise(static_cast<char*>(const_cast<void*>(base_)) + aligned, static_cast<size_t>(b1 - aligned),
            MADV_WILLNEED);
}

TokenFile::Scan TokenFile::scan(uint32_t eos_id, int64_t vocab_size) const {
  Scan s;
  const int64_t n = n_tokens();
  // A full pass is the one sequential access pattern; let the kernel read ahead for it.
  if (base_ != nullptr) ::madvise(const_cast<void*>(base_), static_cast<size_t>(size_bytes_), MADV_SEQUENTIAL);
  int64_t eos = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t t = token(i);
    eos += (t == eos_id);
    if (t > s.max_id) s.max_id = t;
    if (vocab_size > 0 && s.first_bad_offset < 0 && static_cast<int64_t>(t) >= vocab_size) {
      s.first_bad_offset = i;
      s.first_bad_id = t;
    }
  }
  if (base_ != nullptr) ::madvise(const_cast<void*>(base_), static_cast<size_t>(size_bytes_), MADV_RANDOM);
  s.ends_with_eos = (n == 0) || token(n - 1) == eos_id;
  s.n_documents = eos + (s.ends_with_eos ? 0 : 1);
  return s;
}

TokenFileWriter::TokenFileWriter(std::string path, Dtype dtype)
    : path_(std::move(path)), tmp_path_(path_ + ".tmp"), dtype_(dtype) {
  f_ = std::fopen(tmp_path_.c_str(), "wb");
  if (f_ == nullptr) {
    throw std::runtime_error("token file '" + path_ + "': cannot create '" + tmp_path_ + "' (" +
                             std::strerror(errno) + "); does the directory exist and is it writable?");
  }
  buffer_.reserve(1 << 20);
}

TokenFileWriter::~TokenFileWriter() {
  if (f_ != nullptr) {
    std::fclose(f_);
    std::remove(tmp_path_.c_str());
  }
}

void TokenFileWriter::write(std::span<const uint32_t> tokens) {
  if (f_ == nullptr) throw std::runtime_error("token file '" + path_ + "': write after close");
  for (uint32_t t : tokens) {
    if (dtype_ == Dtype::u16) {
      if (t > 0xffff) {
        throw std::runtime_error("token file '" + path_ + "': id " + std::to_string(t) +
                                 " does not fit uint16; write uint32 files for this vocabulary");
      }
      buffer_.push_back(static_cast<unsigned char>(t & 0xff));
      buffer_.push_back(static_cast<unsigned char>(t >> 8));
    } else {
      for (int k = 0; k < 4; ++k) buffer_.push_back(static_cast<unsigned char>((t >> (8 * k)) & 0xff));
    }
    if (buffer_.size() >= (1u << 20)) flush_buffer();
  }
  n_tokens_ += static_cast<int64_t>(tokens.size());
}

void TokenFileWriter::flush_buffer() {
  if (!buffer_.empty() && std::fwrite(buffer_.data(), 1, buffer_.size(), f_) != buffer_.size()) {
    throw std::runtime_error("token file '" + path_ + "': write failed (" + std::strerror(errno) +
                             "); is the disk full?");
  }
  buffer_.clear();
}

void TokenFileWriter::close() {
  if (f_ == nullptr) return;
  flush_buffer();
  const bool ok = std::fflush(f_) == 0 && ::fsync(::fileno(f_)) == 0;
  std::fclose(f_);
  f_ = nullptr;
  if (!ok || std::rename(tmp_path_.c_str(), path_.c_str()) != 0) {
    std::remove(tmp_path_.c_str());
    throw std::runtime_error("token file '" + path_ + "': could not finish the write (" + std::strerror(errno) + ")");
  }
}

ShardedTokenWriter::ShardedTokenWriter(std::string dir, std::string prefix, Dtype dtype, int64_t max_tokens_per_file)
    : dir_(std::move(dir)), prefix_(std::move(prefix)), dtype_(dtype), max_tokens_per_file_(max_tokens_per_file) {
  if (max_tokens_per_file_ <= 0) throw std::invalid_argument("max_tokens_per_file must be positive");
}

void ShardedTokenWriter::add_document(std::span<const uint32_t> tokens) {
  if (current_ && current_->n_tokens() >= max_tokens_per_file_) {
    current_->close();
    current_.reset();
  }
  if (!current_) {
    char name[32];
    std::snprintf(name, sizeof name, "-%05zu.npy", paths_.size());
    paths_.push_back(dir_ + "/" + prefix_ + name);
    current_ = std::make_unique<TokenFileWriter>(paths_.back(), dtype_);
  }
  current_->write(tokens);
  ++n_documents_;
  n_tokens_ += static_cast<int64_t>(tokens.size());
}

std::vector<std::string> ShardedTokenWriter::finish() {
  if (current_) current_->close();
  current_.reset();
  return paths_;
}

}  // namespace olmoref::data
