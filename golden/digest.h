// golden/digest.h — step fingerprints.
//
// param_digest: an XXH3-128 Merkle root over fixed chunks of the canonical flat parameter vector
// (kDigestChunk floats per leaf, the last leaf short). Leaves hash the raw fp32 bits (so -0.0, +0.0
// and NaN payloads differ); the root hashes the leaves' canonical big-endian bytes in chunk order.
// Chunks are defined on the logical flat vector, so shards aligned to chunks (the HSDP issue) give
// the same root. Never XOR or sum digests: permutations would collide.
// data_digest: XXH3-64 over the batch's token ids as little-endian uint32, in global batch order.
// Every leaf is one chunk's hash in its own slot, so hashing them on any number of threads gives the same root.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/hex.h"  // hex32: the 32-bit form beside hex64

namespace olmoref {

class ThreadPool;  // core/parallel.h

inline constexpr int64_t kDigestChunk = 1 << 16;

struct Digest128 {
  uint64_t hi = 0, lo = 0;
  std::string hex() const;  // 32 lowercase hex digits, high half first
  bool operator==(const Digest128&) const = default;
};

Digest128 merkle_digest(const float* data, int64_t n);
// Leaf digests of chunks [c0, c1) of a vector of n floats into out [c1 - c0] (for sharded callers); `data` points at
// element 0 of the whole vector. A pool splits the chunks over its threads (nullptr: the calling thread alone).
void merkle_leaves(const float* data, int64_t n, int64_t c0, int64_t c1, Digest128* out, ThreadPool* pool = nullptr);
Digest128 merkle_root(const std::vector<Digest128>& leaves);

// merkle_digest of a vector fed in order, piece by piece (a checkpoint read frame by frame): the same root, holding
// one chunk's hash state and the leaves (16 bytes per 65,536 floats) instead of the vector.
class MerkleStream {
 public:
  MerkleStream();
  ~MerkleStream();
  MerkleStream(const MerkleStream&) = delete;
  MerkleStream& operator=(const MerkleStream&) = delete;
  void add(const float* data, int64_t n);
  int64_t fed() const { return fed_; }
  Digest128 finish();  // the root of everything added

 private:
  void* state_;  // XXH3_state_t of the chunk being fed
  int64_t fed_ = 0, in_chunk_ = 0;
  std::vector<Digest128> leaves_;
};
uint64_t data_digest(const uint32_t* tokens, int64_t n);
std::string hex64(uint64_t x);

}  // namespace olmoref
