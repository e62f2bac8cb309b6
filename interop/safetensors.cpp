#include "interop/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <stdexcept>

#include "interop/torch_state.h"

namespace olmoref {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; this code copies bytes as-is and needs a little-endian host");

namespace {

// The reference implementation refuses larger headers; staying under it keeps our files loadable there.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw std::runtime_error(path + ": " + what);
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// numel * elem_size with overflow detection; returns false on overflow.
bool checked_nbytes(const std::vector<int64_t>& shape, size_t elem, uint64_t& out) {
  uint64_t n = elem;
  for (int64_t d : shape) {
    if (d < 0) return false;
    if (__builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) return false;
  }
  out = n;
  return true;
}

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ffu;
  float mag;
  if (exp == 0) {
    mag = std::ldexp(static_cast<float>(man), -24);  // subnormal (or zero)
  } else if (exp == 31) {
    const uint32_t bits = 0x7f800000u | (man << 13);
    mag = std::bit_cast<float>(bits);
  } else {
    const uint32_t bits = ((exp + 112) << 23) | (man << 13);
    mag = std::bit_cast<float>(bits);
  }
  return std::bit_cast<float>(std::bit_cast<uint32_t>(mag) | sign);
}

void write_all(int fd, const void* data, size_t n, const std::string& path) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    // Large single writes can be short on some filesystems; loop until everything is out.
    const ssize_t w = ::write(fd, p, std::min<size_t>(n, size_t{1} << 30));
    if (w < 0) {
      if (errno == EINTR) continue;
      fail(path, std::string("write failed: ") + std::strerror(errno) + " (disk full or read-only directory?)");
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
}

}  // namespace

size_t safetensors_dtype_size(const std::string& dtype) {
  static const std::map<std::string, size_t> sizes = {
      {"BOOL", 1}, {"U8", 1}, {"I8", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"I16", 2}, {"U16", 2}, {"F16", 2},
      {"BF16", 2}, {"I32", 4}, {"U32", 4}, {"F32", 4}, {"I64", 8}, {"U64", 8}, {"F64", 8}};
  const auto it = sizes.find(dtype);
  if (it == sizes.end())
    throw std::runtime_error("unknown safetensors dtype '" + dtype +
                             "' (expected one of F32, BF16, F16, F64, I8, I16, I32, I64, U8, U16, U32, U64, BOOL)");
  return it->second;
}

int64_t SafeTensor::numel() const { return numel_of(shape); }
int64_t SafeTensorInfo::numel() const { return numel_of(shape); }

float bf16_to_f32(uint16_t v) { return std::bit_cast<float>(static_cast<uint32_t>(v) << 16); }

uint16_t f32_to_bf16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);  // keep NaN a NaN
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

SafeTensor make_f32_tensor(const std::string& name, const std::vector<int64_t>& shape, const float* data) {
  SafeTensor t{name, "F32", shape, {}};
  t.bytes.resize(static_cast<size_t>(numel_of(shape)) * sizeof(float));
  if (!t.bytes.empty()) std::memcpy(t.bytes.data(), data, t.bytes.size());
  return t;
}

// ---------------------------------------------------------------------------------------------------------------
// Writer

void write_safetensors(const std::string& path, const std::vector<SafeTensorView>& tensors,
                       const std::map<std::string, std::string>& metadata, std::string* sha256_hex) {
  nlohmann::json header = nlohmann::json::object();
  std::set<std::string> seen;
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__")
      throw std::invalid_argument(path + ": tensor name '" + t.name + "' is not allowed (empty or reserved)");
    if (!seen.insert(t.name).second)
      throw std::invalid_argument(path + ": tensor '" + t.name + "' appears twice; names must be unique");
    uint64_t expect = 0;
    if (!checked_nbytes(t.shape, safetensors_dtype_size(t.dtype), expect))
      throw std::invalid_argument(path + ": tensor '" + t.name + "' has an invalid shape " + shape_str(t.shape));
    if (expect != t.nbytes)
      throw std::invalid_argument(path + ": tensor '" + t.name + "' " + t.dtype + shape_str(t.shape) + " needs " +
                                  std::to_string(expect) + " bytes but " + std::to_string(t.nbytes) + " were given");
    if (t.nbytes > 0 && t.data == nullptr && !t.fill)
      throw std::invalid_argument(path + ": tensor '" + t.name + "' has no data pointer and no fill");
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.nbytes}}};
    offset += t.nbytes;
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;

  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t n = text.size();
  uint8_t len_le[8];
  for (int i = 0; i < 8; ++i) len_le[i] = static_cast<uint8_t>(n >> (8 * i));

  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail(tmp, std::string("cannot create: ") + std::strerror(errno) + " (does the directory exist?)");
  std::optional<interop::Sha256> sha;
  if (sha256_hex) sha.emplace();
  auto out = [&](const void* data, uint64_t n) {
    write_all(fd, data, n, tmp);
    if (sha) sha->update(data, n);
  };
  try {
    out(len_le, 8);
    out(text.data(), text.size());
    std::vector<char> piece;
    for (const auto& t : tensors) {
      if (t.data) {
        out(t.data, t.nbytes);
        continue;
      }
      constexpr uint64_t kPiece = uint64_t{16} << 20;
      for (uint64_t at = 0; at < t.nbytes; at += kPiece) {
        const uint64_t n = std::min<uint64_t>(kPiece, t.nbytes - at);
        piece.resize(n);
        t.fill(at, n, piece.data());
        out(piece.data(), n);
      }
    }
    if (::fsync(fd) != 0) fail(tmp, std::string("fsync failed: ") + std::strerror(errno));
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  if (::close(fd) != 0) {
    ::unlink(tmp.c_str());
    fail(tmp, std::string("close failed: ") + std::strerror(errno));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    fail(path, std::string("cannot rename ") + tmp + " into place: " + std::strerror(e));
  }
  // The rename is only durable once the directory entry is on disk.
  std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (dir.empty()) dir = ".";
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  if (sha) *sha256_hex = sha->hex();
}

void write_safetensors(const std::string& path, const std::vector<SafeTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<SafeTensorView> views;
  views.reserve(tensors.size());
  for (const auto& t : tensors) views.push_back({t.name, t.dtype, t.shape, t.bytes.data(), t.bytes.size()});
  write_safetensors(path, views, metadata);
}

// ---------------------------------------------------------------------------------------------------------------
// Reader

SafetensorsFile read_safetensors(const std::string& path) {
  std::error_code ec;
  const uint64_t file_size = std::filesystem::file_size(path, ec);
  if (ec) fail(path, "cannot open safetensors file: " + ec.message());
  if (file_size < 8)
    fail(path, "truncated: " + std::to_string(file_size) +
                   " bytes, shorter than the 8-byte header length (not a safetensors file, or an interrupted write)");

  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, std::string("cannot open safetensors file: ") + std::strerror(errno));
  uint8_t len_le[8];
  in.read(reinterpret_cast<char*>(len_le), 8);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(len_le[i]) << (8 * i);
  if (n > kMaxHeaderBytes)
    fail(path, "header length " + std::to_string(n) + " exceeds the safetensors limit of " +
                   std::to_string(kMaxHeaderBytes) + " bytes (corrupt file or not a safetensors file)");
  if (n > file_size - 8)
    fail(path, "header length " + std::to_string(n) + " is larger than the rest of the file (" +
                   std::to_string(file_size - 8) + " bytes): truncated or corrupt file");
  std::string text(n, '\0');
  in.read(text.data(), static_cast<std::streamsize>(n));
  if (!in) fail(path, "could not read the " + std::to_string(n) + "-byte header");

  // Duplicate names would silently shadow each other in a JSON object; the format forbids them.
  std::set<std::string> keys;
  std::string duplicate;
  auto cb = [&](int depth, nlohmann::json::parse_event_t ev, nlohmann::json& parsed) {
    if (ev == nlohmann::json::parse_event_t::key && depth == 1 && !keys.insert(parsed.get<std::string>()).second)
      duplicate = parsed.get<std::string>();
    return true;
  };
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text, cb);
  } catch (const nlohmann::json::exception& e) {
    fail(path, std::string("header is not valid JSON: ") + e.what());
  }
  if (!duplicate.empty()) fail(path, "header names tensor '" + duplicate + "' more than once");
  if (!header.is_object()) fail(path, "header must be a JSON object of tensors");

  SafetensorsFile f;
  f.path = path;
  f.data_start_ = 8 + n;
  const uint64_t data_size = file_size - f.data_start_;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) fail(path, "__metadata__ must be an object of strings");
      for (const auto& [k, v] : entry.items()) {
        if (!v.is_string()) fail(path, "__metadata__ value of '" + k + "' must be a string");
        f.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    const std::string where = "tensor '" + name + "': ";
    if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") || !entry.contains("data_offsets"))
      fail(path, where + "entry must be an object with dtype, shape and data_offsets");
    SafeTensorInfo t;
    t.name = name;
    if (!entry["dtype"].is_string()) fail(path, where + "dtype must be a string");
    t.dtype = entry["dtype"].get<std::string>();
    size_t elem = 0;
    try {
      elem = safetensors_dtype_size(t.dtype);
    } catch (const std::exception& e) {
      fail(path, where + e.what());
    }
    if (!entry["shape"].is_array()) fail(path, where + "shape must be an array of non-negative integers");
    for (const auto& d : entry["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0)
        fail(path, where + "shape must be an array of non-negative integers, got " + entry["shape"].dump());
      t.shape.push_back(d.get<int64_t>());
    }
    const auto& off = entry["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      fail(path, where + "data_offsets must be [begin, end] with non-negative integers, got " + off.dump());
    t.begin = off[0].get<uint64_t>();
    t.end = off[1].get<uint64_t>();
    if (t.end < t.begin) fail(path, where + "data_offsets " + off.dump() + " end before they begin");
    if (t.end > data_size)
      fail(path, where + "data_offsets " + off.dump() + " run past the end of the data (" +
                     std::to_string(data_size) + " bytes): truncated file?");
    uint64_t expect = 0;
    if (!checked_nbytes(t.shape, elem, expect)) fail(path, where + "shape " + shape_str(t.shape) + " overflows");
    if (expect != t.end - t.begin)
      fail(path, where + t.dtype + shape_str(t.shape) + " needs " + std::to_string(expect) +
                     " bytes but data_offsets " + off.dump() + " span " + std::to_string(t.end - t.begin));
    f.tensors.push_back(std::move(t));
  }

  std::sort(f.tensors.begin(), f.tensors.end(), [](const SafeTensorInfo& a, const SafeTensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t cursor = 0;
  const SafeTensorInfo* prev = nullptr;
  for (const auto& t : f.tensors) {
    if (t.begin < cursor)
      fail(path, "tensors '" + prev->name + "' and '" + t.name + "' overlap (data_offsets [" +
                     std::to_string(prev->begin) + ", " + std::to_string(prev->end) + "] and [" +
                     std::to_string(t.begin) + ", " + std::to_string(t.end) + "])");
    if (t.begin > cursor)
      fail(path, "gap of " + std::to_string(t.begin - cursor) + " unused bytes before tensor '" + t.name +
                     "'; safetensors requires tensors to be stored back to back");
    cursor = t.end;
    prev = &t;
  }
  if (cursor != data_size)
    fail(path, std::to_string(data_size - cursor) +
                   " trailing bytes after the last tensor; the file is corrupt or was appended to");
  for (size_t i = 0; i < f.tensors.size(); ++i) f.index_[f.tensors[i].name] = i;
  return f;
}

const SafeTensorInfo* SafetensorsFile::find(const std::string& name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors[it->second];
}

const SafeTensorInfo& SafetensorsFile::info(const std::string& name) const {
  if (const auto* t = find(name)) return *t;
  throw std::runtime_error(path + ": no tensor named '" + name + "'");
}

void SafetensorsFile::read_bytes(const SafeTensorInfo& t, void* dst) const { read_bytes(t, 0, t.end - t.begin, dst); }

void SafetensorsFile::read_bytes(const SafeTensorInfo& t, uint64_t at, uint64_t n, void* dst) const {
  if (n == 0) return;
  if (at > t.end - t.begin || n > t.end - t.begin - at)
    throw std::logic_error(path + ": bytes [" + std::to_string(at) + ", +" + std::to_string(n) + ") outside tensor '" +
                           t.name + "'");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path + ": cannot reopen to read tensor '" + t.name + "'");
  in.seekg(static_cast<std::streamoff>(data_start_ + t.begin + at));
  in.read(static_cast<char*>(dst), static_cast<std::streamsize>(n));
  if (!in || static_cast<uint64_t>(in.gcount()) != n)
    throw std::runtime_error(path + ": short read of tensor '" + t.name + "' (was the file changed after opening?)");
}

SafeTensor SafetensorsFile::read(const std::string& name) const {
  const auto& t = info(name);
  SafeTensor out{t.name, t.dtype, t.shape, std::vector<uint8_t>(t.end - t.begin)};
  read_bytes(t, out.bytes.data());
  return out;
}

void SafetensorsFile::read_f32_into(const std::string& name, float* dst, int64_t count) const {
  const auto& t = info(name);
  if (count != t.numel())
    throw std::runtime_error(path + ": tensor '" + name + "' has " + std::to_string(t.numel()) +
                             " elements, caller expected " + std::to_string(count));
  if (t.dtype == "F32") {
    read_bytes(t, dst);
    return;
  }
  if (t.dtype != "BF16" && t.dtype != "F16")
    throw std::runtime_error(path + ": tensor '" + name + "' has dtype " + t.dtype +
                             "; only F32, BF16 and F16 convert to fp32");
  std::vector<uint16_t> half(static_cast<size_t>(count));
  read_bytes(t, half.data());
  const bool bf = t.dtype == "BF16";
  for (int64_t i = 0; i < count; ++i) dst[i] = bf ? bf16_to_f32(half[i]) : f16_to_f32(half[i]);
}

void SafetensorsFile::read_f32_range(const std::string& name, int64_t first, int64_t count, float* dst) const {
  const auto& t = info(name);
  if (first < 0 || count < 0 || first > t.numel() || count > t.numel() - first)
    throw std::logic_error(path + ": elements [" + std::to_string(first) + ", +" + std::to_string(count) +
                           ") outside tensor '" + name + "' of " + std::to_string(t.numel()));
  if (t.dtype == "F32") {
    read_bytes(t, static_cast<uint64_t>(first) * 4, static_cast<uint64_t>(count) * 4, dst);
    return;
  }
  if (t.dtype != "BF16" && t.dtype != "F16")
    throw std::runtime_error(path + ": tensor '" + name + "' has dtype " + t.dtype +
                             "; only F32, BF16 and F16 convert to fp32");
  std::vector<uint16_t> half(static_cast<size_t>(count));
  read_bytes(t, static_cast<uint64_t>(first) * 2, static_cast<uint64_t>(count) * 2, half.data());
  const bool bf = t.dtype == "BF16";
  for (int64_t i = 0; i < count; ++i) dst[i] = bf ? bf16_to_f32(half[static_cast<size_t>(i)]) : f16_to_f32(half[static_cast<size_t>(i)]);
}

std::vector<float> SafetensorsFile::as_f32(const std::string& name) const {
  std::vector<float> out(static_cast<size_t>(info(name).numel()));
  read_f32_into(name, out.data(), static_cast<int64_t>(out.size()));
  return out;
}

}  // namespace olmoref
