// interop/torch_state.h — the plain part of a file written by torch.save (a zip archive holding `<name>/data.pkl`,
// a pickle), as JSON: dicts, lists, tuples (as arrays), ints, floats, strings, bools and None. Anything else the
// pickle builds (tensors, numpy arrays, other classes) is kept as {"__object__": "module.name"} without being read:
// OLMo-core's trainer state (its data loader's position beside RNG tensors) needs only the plain part.
//
// Read: zip archives whose entries are stored uncompressed (as torch.save writes them), pickle protocols 2-5
// opcodes that such states use. Anything else is refused naming the file and what was found.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace olmoref::interop {

nlohmann::json read_torch_state(const std::string& path);

// SHA-256 of `data`, as 64 lowercase hex digits (FIPS 180-4); OLMo-core fingerprints datasets with it.
class Sha256 {
 public:
  Sha256();
  void update(const std::string& data);
  std::string hex();

 private:
  void block(const unsigned char* p);
  uint32_t h_[8];
  unsigned char buf_[64];
  size_t fill_ = 0;
  uint64_t bytes_ = 0;
};

}  // namespace olmoref::interop
