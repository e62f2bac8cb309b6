// data/shuffle.h — OLMo-core's global data order, bit for bit.
//
// OLMo-core (NumpyFSLDataLoader._build_global_indices) does
//     idx = np.arange(N, dtype=np.uint32)
//     np.random.Generator(np.random.PCG64(seed + epoch)).shuffle(idx)
//     idx = idx[: G * (N // G)]          # crop to whole global batches of G instances
//     batch b = idx[b*G : (b+1)*G]
// This file re-implements the three numpy pieces it relies on (SeedSequence, PCG64 with its
// 32-bit buffering, Generator.shuffle's Fisher-Yates with masked rejection sampling), so the
// permutation matches numpy exactly; tests/data checks it against spec vectors and numpy itself.
// Defaults: seed 34521, epochs 1-based, so epoch 1 uses PCG64(34522).
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <vector>

namespace olmoref::data {

inline constexpr uint64_t kOlmoCoreDefaultSeed = 34521;

__extension__ typedef unsigned __int128 u128;  // GCC/Clang; PCG64's state is 128 bits

// numpy.random.SeedSequence(seed).generate_state(4, np.uint64): the words PCG64 is seeded with.
std::array<uint64_t, 4> numpy_seed_sequence_state(uint64_t seed);

// numpy's PCG64 (PCG XSL-RR 128/64) including Generator's 32-bit draw buffering.
class Pcg64 {
 public:
  explicit Pcg64(uint64_t seed);  // np.random.PCG64(seed): seeded through SeedSequence
  Pcg64(u128 initstate, u128 initseq);

  uint64_t next64();
  // Low half of a 64-bit draw; the high half is buffered and returned by the next call.
  uint32_t next32();
  // numpy's random_interval(max): uniform in [0, max] by masked rejection.
  uint64_t random_interval(uint64_t max);

 private:
  u128 state_ = 0;
  u128 inc_ = 0;
  bool has_uint32_ = false;
  uint32_t uinteger_ = 0;
};

// Generator.shuffle on a 1-D array: for i = n-1 .. 1, swap a[i] with a[random_interval(i)].
void numpy_shuffle(std::span<uint32_t> a, Pcg64& rng);

// np.arange(n, dtype=uint32) shuffled by Generator(PCG64(rng_seed)). n must be < 2^32 - 1
// (OLMo-core asserts the same: ids are stored as uint32).
std::vector<uint32_t> numpy_permutation(uint64_t rng_seed, int64_t n);

// The shuffled, cropped instance order of one epoch.
class GlobalOrder {
 public:
  // Seeds PCG64 with seed + epoch, as OLMo-core. Throws if fewer than one global batch.
  // chunk > 1 (OLMo-core's chunk_size, max_target_sequence_length / sequence_length): the permutation is of the
  // n / chunk chunk ids, each expanded to its chunk consecutive instances (a tail short of a chunk is left out).
  GlobalOrder(uint64_t seed, int64_t epoch, int64_t n_instances, int64_t global_batch_instances, int64_t chunk = 1);

  uint64_t seed() const { return seed_; }
  int64_t epoch() const { return epoch_; }
  int64_t n_batches() const { return n_batches_; }
  int64_t global_batch_instances() const { return gbi_; }
  int64_t chunk() const { return chunk_; }
  std::span<const uint32_t> indices() const { return indices_; }  // cropped: n_batches * G entries
  std::span<const uint32_t> batch(int64_t b) const;                // row b

 private:
  uint64_t seed_;
  int64_t epoch_;
  int64_t gbi_;
  int64_t chunk_;
  int64_t n_batches_;
  std::vector<uint32_t> indices_;
};

}  // namespace olmoref::data
