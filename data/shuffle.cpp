#include "data/shuffle.h"

#include <stdexcept>
#include <string>

namespace olmoref::data {

// --- SeedSequence (numpy/random/bit_generator.pyx) ----------------------------------------------
// All arithmetic is uint32 with wrap-around, exactly as the Cython code.
namespace {
constexpr uint32_t kInitA = 0x43b0d7e5, kMultA = 0x931e8875;
constexpr uint32_t kInitB = 0x8b51f9dd, kMultB = 0x58f38ded;
constexpr uint32_t kMixMultL = 0xca01f9dd, kMixMultR = 0x4973f715;
constexpr int kXShift = 16;
constexpr int kPoolSize = 4;

uint32_t hashmix(uint32_t value, uint32_t& hash_const) {
  value ^= hash_const;
  hash_const *= kMultA;
  value *= hash_const;
  value ^= value >> kXShift;
  return value;
}

uint32_t mix(uint32_t x, uint32_t y) {
  uint32_t r = kMixMultL * x - kMixMultR * y;
  r ^= r >> kXShift;
  return r;
}
}  // namespace

std::array<uint64_t, 4> numpy_seed_sequence_state(uint64_t seed) {
  // _int_to_uint32_array: the integer in 32-bit words, least significant first; 0 is [0].
  std::vector<uint32_t> entropy;
  if (seed == 0) entropy.push_back(0);
  for (uint64_t s = seed; s > 0; s >>= 32) entropy.push_back(static_cast<uint32_t>(s & 0xffffffffu));

  // mix_entropy
  uint32_t pool[kPoolSize];
  uint32_t hash_const = kInitA;
  for (int i = 0; i < kPoolSize; ++i) {
    pool[i] = hashmix(i < static_cast<int>(entropy.size()) ? entropy[static_cast<size_t>(i)] : 0u, hash_const);
  }
  for (int src = 0; src < kPoolSize; ++src) {
    for (int dst = 0; dst < kPoolSize; ++dst) {
      if (src != dst) pool[dst] = mix(pool[dst], hashmix(pool[src], hash_const));
    }
  }
  for (size_t src = kPoolSize; src < entropy.size(); ++src) {  // never taken for a 64-bit seed
    for (int dst = 0; dst < kPoolSize; ++dst) pool[dst] = mix(pool[dst], hashmix(entropy[src], hash_const));
  }

  // generate_state(4, uint64): 8 uint32 words cycling over the pool, paired (lo, hi).
  uint32_t words[8];
  uint32_t hc = kInitB;
  for (int i = 0; i < 8; ++i) {
    uint32_t v = pool[i % kPoolSize];
    v ^= hc;
    hc *= kMultB;
    v *= hc;
    v ^= v >> kXShift;
    words[i] = v;
  }
  std::array<uint64_t, 4> out{};
  for (int i = 0; i < 4; ++i) out[static_cast<size_t>(i)] = uint64_t{words[2 * i]} | (uint64_t{words[2 * i + 1]} << 32);
  return out;
}

// --- PCG64 (numpy/random/src/pcg64) -----------------------------------------------------------------
static constexpr u128 kPcgMult = (u128{2549297995355413924ULL} << 64) | u128{4865540595714422341ULL};

Pcg64::Pcg64(u128 initstate, u128 initseq) {
  // pcg_setseq_128_srandom_r
  state_ = 0;
  inc_ = (initseq << 1) | 1u;
  state_ = state_ * kPcgMult + inc_;
  state_ += initstate;
  state_ = state_ * kPcgMult + inc_;
}

static u128 pcg_initstate(const std::array<uint64_t, 4>& s) { return (u128{s[0]} << 64) | s[1]; }
static u128 pcg_initseq(const std::array<uint64_t, 4>& s) { return (u128{s[2]} << 64) | s[3]; }

Pcg64::Pcg64(uint64_t seed)
    : Pcg64(pcg_initstate(numpy_seed_sequence_state(seed)), pcg_initseq(numpy_seed_sequence_state(seed))) {}

uint64_t Pcg64::next64() {
  state_ = state_ * kPcgMult + inc_;  // step first, then output (XSL-RR)
  const uint64_t hi = static_cast<uint64_t>(state_ >> 64);
  const uint64_t lo = static_cast<uint64_t>(state_);
  const unsigned rot = static_cast<unsigned>(state_ >> 122);
  const uint64_t x = hi ^ lo;
  return (x >> rot) | (x << ((64u - rot) & 63u));
}

uint32_t Pcg64::next32() {
  if (has_uint32_) {
    has_uint32_ = false;
    return uinteger_;
  }
  const uint64_t v = next64();
  has_uint32_ = true;
  uinteger_ = static_cast<uint32_t>(v >> 32);
  return static_cast<uint32_t>(v & 0xffffffffu);
}

uint64_t Pcg64::random_interval(uint64_t max) {
  if (max == 0) return 0;
  uint64_t mask = max;
  mask |= mask >> 1;
  mask |= mask >> 2;
  mask |= mask >> 4;
  mask |= mask >> 8;
  mask |= mask >> 16;
  mask |= mask >> 32;
  uint64_t v;
  if (max <= 0xffffffffULL) {
    while ((v = (next32() & mask)) > max) {
    }
  } else {
    while ((v = (next64() & mask)) > max) {
    }
  }
  return v;
}

void numpy_shuffle(std::span<uint32_t> a, Pcg64& rng) {
  for (size_t i = a.size(); i-- > 1;) {
    const size_t j = static_cast<size_t>(rng.random_interval(i));
    const uint32_t t = a[i];
    a[i] = a[j];
    a[j] = t;
  }
}

std::vector<uint32_t> numpy_permutation(uint64_t rng_seed, int64_t n) {
  if (n < 0 || n >= 0xffffffffLL) {
    throw std::runtime_error("cannot shuffle " + std::to_string(n) +
                             " instances: OLMo-core's global order holds ids as uint32 and needs fewer than 2^32-1");
  }
  std::vector<uint32_t> idx(static_cast<size_t>(n));
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = static_cast<uint32_t>(i);
  Pcg64 rng(rng_seed);
  numpy_shuffle(idx, rng);
  return idx;
}

GlobalOrder::GlobalOrder(uint64_t seed, int64_t epoch, int64_t n_instances, int64_t global_batch_instances,
                         int64_t chunk)
    : seed_(seed), epoch_(epoch), gbi_(global_batch_instances), chunk_(chunk) {
  if (chunk_ < 1) throw std::invalid_argument("chunk must be >= 1 (got " + std::to_string(chunk_) + ")");
  if (epoch < 1) throw std::invalid_argument("epochs are 1-based (OLMo-core); got epoch " + std::to_string(epoch));
  if (gbi_ <= 0) throw std::invalid_argument("global batch must hold at least one instance");
  if (seed + static_cast<uint64_t>(epoch) < seed) {
    throw std::invalid_argument("seed + epoch overflows 64 bits; use a smaller seed");
  }
  const int64_t ordered = n_instances / chunk_ * chunk_;
  n_batches_ = ordered / gbi_;
  if (n_batches_ == 0) {
    throw std::runtime_error("the dataset has " + std::to_string(n_instances) +
                             " instances, fewer than one global batch of " + std::to_string(gbi_) +
                             "; add data, shorten the sequence length, or shrink the global batch");
  }
  if (chunk_ == 1) {
    indices_ = numpy_permutation(seed + static_cast<uint64_t>(epoch), n_instances);
  } else {
    const std::vector<uint32_t> chunks = numpy_permutation(seed + static_cast<uint64_t>(epoch), n_instances / chunk_);
    indices_.resize(static_cast<size_t>(ordered));
    for (size_t c = 0; c < chunks.size(); ++c)
      for (int64_t k = 0; k < chunk_; ++k)
        indices_[c * static_cast<size_t>(chunk_) + static_cast<size_t>(k)] =
            static_cast<uint32_t>(static_cast<int64_t>(chunks[c]) * chunk_ + k);
  }
  indices_.resize(static_cast<size_t>(n_batches_ * gbi_));  // crop the tail to whole global batches
  indices_.shrink_to_fit();
}

std::span<const uint32_t> GlobalOrder::batch(int64_t b) const {
  if (b < 0 || b >= n_batches_) {
    throw std::out_of_range("batch " + std::to_string(b) + " is out of range: the epoch has " +
                            std::to_string(n_batches_) + " global batches");
  }
  return std::span<const uint32_t>(indices_).subspan(static_cast<size_t>(b * gbi_), static_cast<size_t>(gbi_));
}

}  // namespace olmoref::data
