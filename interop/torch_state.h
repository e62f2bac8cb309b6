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

// SHA-256 (OpenSSL's), fed in pieces; hex() gives the 64 lowercase hex digits. OLMo-core fingerprints datasets with it.
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void update(const std::string& data);
  void update(const void* data, size_t n);
  std::string hex();

 private:
  void* ctx_;  // EVP_MD_CTX
};

}  // namespace olmoref::interop
