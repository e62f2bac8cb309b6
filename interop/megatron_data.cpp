#include "interop/megatron_data.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>

namespace olmoref::interop {

namespace fs = std::filesystem;

namespace {

std::string slurp(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path + ": cannot open " + what);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The value of 'key' in a .npy header dict ("{'descr': '<i8', 'fortran_order': False, 'shape': (3, 2), }").
std::string header_value(const std::string& header, const std::string& key, const std::string& path) {
  const size_t k = header.find("'" + key + "'");
  if (k == std::string::npos) throw std::runtime_error(path + ": .npy header has no '" + key + "': " + header);
  size_t v = header.find(':', k);
  if (v == std::string::npos) throw std::runtime_error(path + ": malformed .npy header: " + header);
  ++v;
  while (v < header.size() && header[v] == ' ') ++v;
  if (v < header.size() && header[v] == '(') {
    const size_t e = header.find(')', v);
    if (e == std::string::npos) throw std::runtime_error(path + ": malformed .npy shape: " + header);
    return header.substr(v, e - v + 1);
  }
  if (v < header.size() && header[v] == '\'') {
    const size_t e = header.find('\'', v + 1);
    if (e == std::string::npos) throw std::runtime_error(path + ": malformed .npy header: " + header);
    return header.substr(v + 1, e - v - 1);
  }
  size_t e = v;
  while (e < header.size() && header[e] != ',' && header[e] != '}') ++e;
  return header.substr(v, e - v);
}

}  // namespace

NpyArray read_npy_integers(const std::string& path) {
  const std::string bytes = slurp(path, "the .npy file");
  if (bytes.size() < 10 || bytes.compare(0, 6, "\x93NUMPY") != 0)
    throw std::runtime_error(path + ": not a .npy file (no \\x93NUMPY magic)");
  const int major = static_cast<uint8_t>(bytes[6]);
  size_t header_len = 0, start = 0;
  if (major == 1) {
    header_len = static_cast<uint8_t>(bytes[8]) | static_cast<size_t>(static_cast<uint8_t>(bytes[9])) << 8;
    start = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) throw std::runtime_error(path + ": truncated .npy header");
    for (int i = 0; i < 4; ++i) header_len |= static_cast<size_t>(static_cast<uint8_t>(bytes[8 + i])) << (8 * i);
    start = 12;
  } else {
    throw std::runtime_error(path + ": .npy format version " + std::to_string(major) + " is not supported (1-3 are)");
  }
  if (start + header_len > bytes.size()) throw std::runtime_error(path + ": truncated .npy header");
  const std::string header = bytes.substr(start, header_len);
  NpyArray a;
  a.descr = header_value(header, "descr", path);
  if (header_value(header, "fortran_order", path).find("False") == std::string::npos)
    throw std::runtime_error(path + ": a Fortran-order array; expected C order as numpy.save writes by default");
  const std::string shape = header_value(header, "shape", path);
  int64_t count = 1;
  for (size_t i = 1; i < shape.size();) {
    while (i < shape.size() && (shape[i] == ' ' || shape[i] == ',')) ++i;
    if (i >= shape.size() || shape[i] == ')') break;
    char* end = nullptr;
    const long long d = std::strtoll(shape.c_str() + i, &end, 10);
    if (end == shape.c_str() + i || d < 0) throw std::runtime_error(path + ": malformed .npy shape " + shape);
    a.shape.push_back(d);
    count *= d;
    i = static_cast<size_t>(end - shape.c_str());
  }
  int size = 0;
  bool is_signed = true;
  if (a.descr == "<i8") size = 8;
  else if (a.descr == "<i4") size = 4;
  else if (a.descr == "<i2") size = 2;
  else if (a.descr == "<u8") size = 8, is_signed = false;
  else if (a.descr == "<u4") size = 4, is_signed = false;
  else if (a.descr == "<u2") size = 2, is_signed = false;
  else throw std::runtime_error(path + ": dtype '" + a.descr + "' is not a little-endian integer type Megatron writes");
  const size_t data = start + header_len;
  if (bytes.size() - data != static_cast<size_t>(count) * static_cast<size_t>(size))
    throw std::runtime_error(path + ": " + std::to_string(bytes.size() - data) + " data bytes for shape " + shape + " of " +
                             a.descr + " (expected " + std::to_string(count * size) + "; truncated or changed?)");
  a.values.resize(static_cast<size_t>(count));
  const uint8_t* p = reinterpret_cast<const uint8_t*>(bytes.data()) + data;
  for (int64_t i = 0; i < count; ++i, p += size) {
    uint64_t u = 0;
    for (int b = 0; b < size; ++b) u |= static_cast<uint64_t>(p[b]) << (8 * b);
    if (is_signed && size < 8 && (u >> (8 * size - 1)) & 1) u |= ~uint64_t{0} << (8 * size);  // sign extension
    a.values[static_cast<size_t>(i)] = static_cast<int64_t>(u);
  }
  return a;
}

MegatronIndexedDataset::MegatronIndexedDataset(const std::string& prefix) : prefix_(prefix) {
  const std::string idx_path = prefix + ".idx", bin_path = prefix + ".bin";
  const std::string idx = slurp(idx_path, "the Megatron index (PREFIX.idx; give --megatron-data the prefix, without .bin/.idx)");
  if (idx.size() < 34 || idx.compare(0, 9, std::string("MMIDIDX\0\0", 9)) != 0)
    throw std::runtime_error(idx_path + ": not a Megatron IndexedDataset index (no MMIDIDX header)");
  auto u64 = [&](size_t at) {
    uint64_t v = 0;
    std::memcpy(&v, idx.data() + at, 8);
    return v;
  };
  if (u64(9) != 1) throw std::runtime_error(idx_path + ": index version " + std::to_string(u64(9)) + " (only 1 is known)");
  dtype_code_ = static_cast<uint8_t>(idx[17]);
  static const int sizes[] = {0, 1, 1, 2, 4, 8, 8, 4, 2};
  if (dtype_code_ < 1 || dtype_code_ > 8 || dtype_code_ == 6 || dtype_code_ == 7)
    throw std::runtime_error(idx_path + ": token dtype code " + std::to_string(dtype_code_) + " is not an integer type");
  dtype_size_ = sizes[dtype_code_];
  const uint64_t n_seq = u64(18), n_doc = u64(26);
  const size_t need = 34 + n_seq * 4 + n_seq * 8 + n_doc * 8;
  if (idx.size() < need)
    throw std::runtime_error(idx_path + ": " + std::to_string(idx.size()) + " bytes, but its header promises " +
                             std::to_string(n_seq) + " sequences and " + std::to_string(n_doc) + " documents (" +
                             std::to_string(need) + " bytes)");
  lengths_.resize(n_seq);
  pointers_.resize(n_seq);
  std::memcpy(lengths_.data(), idx.data() + 34, n_seq * 4);
  std::memcpy(pointers_.data(), idx.data() + 34 + n_seq * 4, n_seq * 8);
  const int fd = ::open(bin_path.c_str(), O_RDONLY);
  if (fd < 0) throw std::runtime_error(bin_path + ": cannot open the Megatron token file");
  struct stat st {};
  ::fstat(fd, &st);
  bin_bytes_ = st.st_size;
  void* m = bin_bytes_ > 0 ? ::mmap(nullptr, static_cast<size_t>(bin_bytes_), PROT_READ, MAP_PRIVATE, fd, 0) : nullptr;
  ::close(fd);
  if (bin_bytes_ > 0 && m == MAP_FAILED) throw std::runtime_error(bin_path + ": cannot map the token file");
  const int64_t bytes = bin_bytes_;
  bin_ = std::shared_ptr<const uint8_t>(static_cast<const uint8_t*>(m), [bytes](const uint8_t* p) {
    if (p) ::munmap(const_cast<uint8_t*>(p), static_cast<size_t>(bytes));
  });
  for (uint64_t s = 0; s < n_seq; ++s)
    if (lengths_[s] < 0 || pointers_[s] < 0 || pointers_[s] + int64_t{lengths_[s]} * dtype_size_ > bin_bytes_)
      throw std::runtime_error(idx_path + ": sequence " + std::to_string(s) + " (" + std::to_string(lengths_[s]) +
                               " tokens at byte " + std::to_string(pointers_[s]) + ") lies outside " + bin_path + " (" +
                               std::to_string(bin_bytes_) + " bytes): .bin and .idx do not belong together");
}

std::string MegatronIndexedDataset::dtype_name() const {
  static const char* names[] = {"?", "uint8", "int8", "int16", "int32", "int64", "float64", "float32", "uint16"};
  return names[dtype_code_];
}

void MegatronIndexedDataset::read(int64_t seq, int64_t offset, std::span<uint32_t> out) const {
  const int64_t n = static_cast<int64_t>(out.size());
  if (seq < 0 || seq >= sequences() || offset < 0 || offset + n > lengths_[static_cast<size_t>(seq)])
    throw std::runtime_error(prefix_ + ".idx: tokens [" + std::to_string(offset) + ", " + std::to_string(offset + n) +
                             ") of sequence " + std::to_string(seq) + " asked for, but it has " +
                             (seq >= 0 && seq < sequences() ? std::to_string(lengths_[static_cast<size_t>(seq)]) + " tokens"
                                                            : std::string("only ") + std::to_string(sequences()) + " sequences exist"));
  const uint8_t* p = bin_.get() + pointers_[static_cast<size_t>(seq)] + offset * dtype_size_;
  for (int64_t i = 0; i < n; ++i, p += dtype_size_) {
    uint64_t u = 0;
    std::memcpy(&u, p, static_cast<size_t>(dtype_size_));
    out[static_cast<size_t>(i)] = static_cast<uint32_t>(u);
  }
}

MegatronGptSamples::MegatronGptSamples(const std::string& cache_dir, const std::string& prefix, const std::string& split,
                                       bool add_extra_token)
    : cache_dir_(cache_dir), extra_(add_extra_token) {
  if (!fs::is_directory(cache_dir)) throw std::runtime_error(cache_dir + ": not a directory (--megatron-cache: the index cache)");
  const std::string tail = "-GPTDataset-" + split + "-description.txt";
  std::vector<std::string> matches, others;
  bool blend = false;
  auto same_prefix = [](const std::string& a, const std::string& b) {
    std::error_code e1, e2;
    const fs::path ca = fs::weakly_canonical(a, e1), cb = fs::weakly_canonical(b, e2);
    return a == b || (!e1 && !e2 && ca == cb);
  };
  for (const auto& entry : fs::directory_iterator(cache_dir)) {
    const std::string name = entry.path().filename().string();
    if (name.find("-BlendedDataset-") != std::string::npos) blend = true;
    if (name.size() <= tail.size() || name.compare(name.size() - tail.size(), tail.size(), tail) != 0) continue;
    nlohmann::json d;
    try {
      d = nlohmann::json::parse(slurp(entry.path().string(), "the index description"));
    } catch (const nlohmann::json::exception& e) {
      throw std::runtime_error(entry.path().string() + ": not the JSON Megatron writes as an index description: " + e.what());
    }
    const std::string path = d.value("dataset_path", "");
    if (same_prefix(path, prefix)) matches.push_back(entry.path().string());
    else others.push_back(path + " (" + name + ")");
  }
  if (matches.empty()) {
    std::string found;
    for (const auto& o : others) found += "\n  " + o;
    throw std::runtime_error(cache_dir + ": no GPTDataset " + split + " indices for dataset '" + prefix + "'" +
                             (others.empty() ? std::string(" (no *") + tail + " at all)" : "; found indices for:" + found) +
                             (blend ? "\n(a blended dataset's indices are there: blends are not read yet; give one dataset)" : ""));
  }
  if (matches.size() > 1) {
    std::string found;
    for (const auto& m : matches) found += "\n  " + m;
    throw std::runtime_error(cache_dir + ": several GPTDataset " + split + " index sets for '" + prefix +
                             "' (different seeds, lengths or sample counts); remove the stale ones or give a cache with one:" + found);
  }
  const std::string desc_path = matches.front();
  description_ = nlohmann::json::parse(slurp(desc_path, "the index description"));
  base_ = fs::path(desc_path).filename().string();
  base_ = base_.substr(0, base_.size() - std::string("-description.txt").size());
  if (description_.value("class", "GPTDataset") != "GPTDataset")
    throw std::runtime_error(desc_path + ": class '" + description_.value("class", "") + "' (only GPTDataset is read)");
  if (!description_.contains("sequence_length") || !description_["sequence_length"].is_number_integer())
    throw std::runtime_error(desc_path + ": no integer 'sequence_length'");
  seq_len_ = description_["sequence_length"].get<int64_t>();
  data_ = std::make_shared<MegatronIndexedDataset>(prefix);
  const std::string stem = (fs::path(cache_dir) / base_).string();
  const NpyArray di = read_npy_integers(stem + "-document_index.npy");
  const NpyArray si = read_npy_integers(stem + "-sample_index.npy");
  const NpyArray sh = read_npy_integers(stem + "-shuffle_index.npy");
  if (si.shape.size() != 2 || si.shape[1] != 2 || si.shape[0] < 1)
    throw std::runtime_error(stem + "-sample_index.npy: shape must be [samples + 1, 2]");
  doc_index_ = di.values;
  sample_index_ = si.values;
  shuffle_ = sh.values;
  const int64_t n_samples = si.shape[0] - 1;
  for (const int64_t d : doc_index_)
    if (d < 0 || d >= data_->sequences())
      throw std::runtime_error(stem + "-document_index.npy: sequence " + std::to_string(d) + ", but " + prefix + ".idx has " +
                               std::to_string(data_->sequences()) + ": the token files are not the ones the indices were built from");
  for (const int64_t s : shuffle_)
    if (s < 0 || s >= n_samples)
      throw std::runtime_error(stem + "-shuffle_index.npy: sample " + std::to_string(s) + " of " + std::to_string(n_samples));
  for (int64_t r = 0; r <= n_samples; ++r) {
    const int64_t pos = sample_index_[static_cast<size_t>(2 * r)], off = sample_index_[static_cast<size_t>(2 * r + 1)];
    if (pos < 0 || pos >= static_cast<int64_t>(doc_index_.size()) || off < 0 ||
        off > data_->sequence_length(doc_index_[static_cast<size_t>(pos)]))
      throw std::runtime_error(stem + "-sample_index.npy: row " + std::to_string(r) + " (" + std::to_string(pos) + ", " +
                               std::to_string(off) + ") points outside the documents of " + prefix +
                               ": the token files changed since the indices were built");
  }
}

void MegatronGptSamples::read(int64_t k, std::span<uint32_t> out) const {
  if (k < 0 || k >= samples()) throw std::runtime_error(base_ + ": sample " + std::to_string(k) + " of " + std::to_string(samples()));
  if (static_cast<int64_t>(out.size()) != sample_tokens()) throw std::invalid_argument("MegatronGptSamples::read: wrong size");
  const int64_t idx = shuffle_[static_cast<size_t>(k)];
  const int64_t beg = sample_index_[static_cast<size_t>(2 * idx)], beg_off = sample_index_[static_cast<size_t>(2 * idx + 1)];
  const int64_t end = sample_index_[static_cast<size_t>(2 * idx + 2)], end_off = sample_index_[static_cast<size_t>(2 * idx + 3)];
  const int64_t extra = extra_ ? 1 : 0;
  size_t at = 0;
  auto take = [&](int64_t pos, int64_t offset, int64_t len) {
    const int64_t doc = doc_index_[static_cast<size_t>(pos)];
    if (len < 0 || at + static_cast<size_t>(len) > out.size())
      throw std::runtime_error(cache_dir_ + "/" + base_ + ": sample " + std::to_string(k) + " does not hold " +
                               std::to_string(sample_tokens()) + " tokens in its documents: the token files changed since "
                               "the indices were built (or --megatron-no-extra-token is wrong)");
    data_->read(doc, offset, out.subspan(at, static_cast<size_t>(len)));
    at += static_cast<size_t>(len);
  };
  for (int64_t i = beg; i <= end; ++i) {
    const int64_t doc = doc_index_[static_cast<size_t>(i)];
    const int64_t offset = i > beg ? 0 : beg_off;
    const int64_t len = i < end ? data_->sequence_length(doc) - offset : end_off + extra - offset;
    take(i, offset, len);
  }
  if (static_cast<int64_t>(at) != sample_tokens())
    throw std::runtime_error(cache_dir_ + "/" + base_ + ": sample " + std::to_string(k) + " holds " + std::to_string(at) +
                             " tokens, not " + std::to_string(sample_tokens()) + ": the token files changed since the "
                             "indices were built (a training sample is never padded)");
}

int64_t megatron_checkpoint_iteration(const std::string& checkpoint_dir) {
  const std::string path = (fs::path(checkpoint_dir) / "latest_checkpointed_iteration.txt").string();
  std::string s = slurp(path, "the Megatron checkpoint tracker (is --megatron-checkpoint the directory holding it?)");
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  char* end = nullptr;
  const long long it = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0' || it < 0)
    throw std::runtime_error(path + ": '" + s + "' is not an iteration number" +
                             (s == "release" ? " ('release' checkpoints record no iteration: give --steps)" : ""));
  return it;
}

}  // namespace olmoref::interop
