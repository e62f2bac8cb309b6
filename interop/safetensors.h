// interop/safetensors.h — a small safetensors writer and reader (the Hugging Face weight format).
//
// File layout: u64 little-endian N, then N bytes of JSON header, then the data region.
//   header: {"<name>": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
//            "__metadata__": {"<key>": "<string>"}}
//   offsets are relative to the start of the data region, tensors are row-major little-endian.
// We pad the header with spaces to a multiple of 8 so that every tensor starts 8-byte aligned, and we lay the
// tensors out back to back in the order given. The reader enforces what the reference Rust implementation
// (and therefore `safetensors.safe_open` / `from_pretrained`) enforces: tensors tile the data region exactly, with
// no overlap, gap or trailing bytes. A file we accept is a file PyTorch users can load.
//
// The reader is lazy: it parses the header once and reads tensor bytes on demand, so importing a multi-GB
// checkpoint never holds two copies of it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace olmoref {

// Bytes per element of a safetensors dtype ("F32", "BF16", "F16", "F64", "I8".."I64", "U8".."U64", "BOOL").
// Throws std::runtime_error for a dtype the format does not define.
size_t safetensors_dtype_size(const std::string& dtype);

// One tensor held in memory (what tests and small tools pass around).
struct SafeTensor {
  std::string name;
  std::string dtype;            // safetensors spelling: "F32", "BF16", "I32", "U32", "I64", ...
  std::vector<int64_t> shape;   // empty = scalar
  std::vector<uint8_t> bytes;   // little-endian, row-major; size must be numel * dtype size

  int64_t numel() const;
};

// A tensor whose bytes live elsewhere (for writing large parameter buffers without a copy), or are produced piece by
// piece as the file is written: with data null, fill(at, n, dst) writes bytes [at, at + n) of the tensor into dst
// (n at most 16 MiB), so a writer never holds more than that of a tensor.
struct SafeTensorView {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  size_t nbytes = 0;
  std::function<void(uint64_t at, uint64_t n, void* dst)> fill = nullptr;
};

SafeTensor make_f32_tensor(const std::string& name, const std::vector<int64_t>& shape, const float* data);

// Writes PATH.tmp, fsyncs it, renames it to PATH and fsyncs the directory, so PATH is either the old file or the
// complete new one. Tensor data follows the order of `tensors`. Throws std::runtime_error naming the path on any
// I/O error, and std::invalid_argument for an empty or duplicate name, a size that does not match shape x dtype,
// or a name "__metadata__". sha256_hex (optional): the file's SHA-256, hashed as it is written (no read back).
void write_safetensors(const std::string& path, const std::vector<SafeTensorView>& tensors,
                       const std::map<std::string, std::string>& metadata = {}, std::string* sha256_hex = nullptr);
void write_safetensors(const std::string& path, const std::vector<SafeTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// Header entry of one tensor in an opened file.
struct SafeTensorInfo {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte range inside the data region
  int64_t numel() const;
};

class SafetensorsFile {
 public:
  std::string path;
  std::vector<SafeTensorInfo> tensors;  // sorted by data offset (= order written)
  std::map<std::string, std::string> metadata;

  const SafeTensorInfo* find(const std::string& name) const;
  // Throws std::runtime_error naming the file and the tensor when absent.
  const SafeTensorInfo& info(const std::string& name) const;
  // Reads the raw bytes of one tensor.
  SafeTensor read(const std::string& name) const;
  // Reads a floating-point tensor (F32, BF16 or F16) converted to fp32; throws for other dtypes.
  std::vector<float> as_f32(const std::string& name) const;
  // Same, into caller memory of exactly info(name).numel() floats.
  void read_f32_into(const std::string& name, float* dst, int64_t count) const;
  // Elements [first, first + count) of the tensor (row-major), converted to fp32: only their bytes are read.
  void read_f32_range(const std::string& name, int64_t first, int64_t count, float* dst) const;

 private:
  friend SafetensorsFile read_safetensors(const std::string& path);
  uint64_t data_start_ = 0;  // absolute file offset of the data region
  std::map<std::string, size_t> index_;
  void read_bytes(const SafeTensorInfo& t, void* dst) const;
  void read_bytes(const SafeTensorInfo& t, uint64_t at, uint64_t n, void* dst) const;
};

// Parses and validates the header (header length vs file size, JSON shape, dtypes, shapes vs byte ranges, the
// data region tiled exactly). Throws std::runtime_error whose message starts with the path and says what is
// wrong. Tensor bytes are read later, on demand.
SafetensorsFile read_safetensors(const std::string& path);

// bf16 <-> fp32 helpers (bf16 is the upper half of an fp32; we round to nearest even when narrowing).
float bf16_to_f32(uint16_t v);
uint16_t f32_to_bf16(float f);

}  // namespace olmoref
