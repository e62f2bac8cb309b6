// data/ngram.h — token n-gram hashing and the holdout n-gram set the leakage detector probes
// (13-gram overlap, as lm-eval-harness measures contamination; an exact set,
// or a Bloom filter with exact re-verification of every hit as Dolma).
//
// Hash. Token ids are first spread to 64 random-looking bits, x = mix(t) (a bijection of uint32),
// then an n-gram t_0..t_{n-1} hashes to the polynomial
//     h = sum_j x_j * B^(n-1-j)   (mod 2^64),   B an odd 64-bit constant,
// which rolls in O(1) per token: h' = h*B + x_in - x_out*B^n. Because every x is uniform and B
// odd, h is uniform over 64 bits; distinct n-grams collide with probability ~2^-64 per pair, and
// the detector re-verifies every hit token by token anyway. The hash is a pure function of the
// token ids (no seed, no state): the same n-gram hashes the same in every process, on every rank.
//
// Sets (both answer contains(h) for a 64-bit n-gram hash):
//  - exact: open addressing over 64-byte buckets of 8 keys (one cache line per probe), load <= 1/2:
//    16 bytes per distinct n-gram. No false positives on the 64-bit hash.
//  - bloom: a blocked Bloom filter, 512-bit blocks, 16 bits per key (one bit in each 32-bit word
//    of the block), 32 bits per key by default: 4 bytes per n-gram, false-positive rate about 6e-6
//    (measured: tests/data). Positives are candidates that the detector verifies exactly.
// probe() looks up a whole array of hashes with software prefetching, so a scan keeps many
// cache misses in flight (the table of a large holdout does not fit in cache); the table asks for
// transparent huge pages, so the probes do not also miss the TLB.
#pragma once

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

namespace olmoref::data {

class NgramHasher {
 public:
  explicit NgramHasher(int n);
  int n() const { return n_; }

  static uint64_t mix(uint32_t t) {
    uint64_t z = (static_cast<uint64_t>(t) + 0x9E3779B97F4A7C15ull) * 0xBF58476D1CE4E5B9ull;
    z ^= z >> 31;
    return z * 0x94D049BB133111EBull;
  }
  // The hash of tokens[0..n).
  uint64_t hash(const uint32_t* tokens) const;
  // Hashes of every window: out[i] = hash(tokens + i) for i in [0, size - n]; returns the count
  // (0 when size < n). out must hold size - n + 1 values. Uses scratch of size tokens.size().
  size_t hash_all(std::span<const uint32_t> tokens, uint64_t* out, std::vector<uint64_t>& scratch) const;

  static constexpr uint64_t kBase = 0x9FB21C651E98DF25ull;

 private:
  int n_;
  uint64_t base_pow_n_;  // B^n
};

class NgramSet {
 public:
  enum class Kind { exact, bloom };
  // `capacity`: an upper bound on the keys that will be inserted (the n-gram positions).
  NgramSet(Kind kind, int64_t capacity, double bloom_bits_per_key = 32.0);
  NgramSet(const NgramSet&) = delete;
  NgramSet& operator=(const NgramSet&) = delete;
  NgramSet(NgramSet&&) = default;
  NgramSet& operator=(NgramSet&&) = default;

  Kind kind() const { return kind_; }
  void insert(uint64_t h);
  bool contains(uint64_t h) const;
  // Calls on_hit(i) for every i with contains(keys[i]), in increasing i, prefetching ahead.
  template <typename F>
  void probe(const uint64_t* keys, size_t n, F&& on_hit) const;

  int64_t bytes() const { return n_blocks_ * 64; }
  int64_t inserted() const { return inserted_; }  // distinct keys (exact) or insert calls (bloom)
  int64_t buckets() const { return n_blocks_; }
  double bloom_bits_per_key() const { return bits_per_key_; }
  // Bloom: the expected false-positive rate for `inserted()` keys (blocked-Bloom estimate).
  double expected_false_positive_rate() const;

 private:
  size_t block_of(uint64_t h) const {
    return static_cast<size_t>((static_cast<unsigned __int128>(h) * static_cast<uint64_t>(n_blocks_)) >> 64);
  }
  static uint64_t key_of(uint64_t h) { return h == 0 ? 1 : h; }  // 0 marks an empty slot
  bool exact_contains(uint64_t key, size_t b) const {
    for (;;) {
      const uint64_t* s = words_ + b * 8;
#if defined(__AVX512F__)
      const __m512i v = _mm512_load_si512(s);
      if (_mm512_cmpeq_epi64_mask(v, _mm512_set1_epi64(static_cast<long long>(key)))) return true;
      if (_mm512_cmpeq_epi64_mask(v, _mm512_setzero_si512())) return false;
#elif defined(__AVX2__)
      const __m256i k4 = _mm256_set1_epi64x(static_cast<long long>(key)), z = _mm256_setzero_si256();
      const __m256i a = _mm256_load_si256(reinterpret_cast<const __m256i*>(s));
      const __m256i c = _mm256_load_si256(reinterpret_cast<const __m256i*>(s + 4));
      if (_mm256_movemask_epi8(_mm256_or_si256(_mm256_cmpeq_epi64(a, k4), _mm256_cmpeq_epi64(c, k4)))) return true;
      if (_mm256_movemask_epi8(_mm256_or_si256(_mm256_cmpeq_epi64(a, z), _mm256_cmpeq_epi64(c, z)))) return false;
#else
      bool hit = false, empty = false;
      for (int k = 0; k < 8; ++k) {
        hit |= s[k] == key;
        empty |= s[k] == 0;
      }
      if (hit) return true;
      if (empty) return false;
#endif
      b = b + 1 == static_cast<size_t>(n_blocks_) ? 0 : b + 1;
    }
  }
  bool bloom_contains(uint64_t h, size_t b) const {
    const uint32_t* w = reinterpret_cast<const uint32_t*>(words_ + b * 8);
    const uint32_t lo = static_cast<uint32_t>(h);
#if defined(__AVX512F__)
    // Word k must have bit (lo * salt_k) >> 27 set, for all 16 words at once.
    const __m512i salt = _mm512_loadu_si512(kSalt);
    // (maskz forms: the plain ones pass GCC 12 an undefined vector it then warns about)
    const __m512i pos = _mm512_maskz_srli_epi32(0xFFFF, _mm512_mullo_epi32(_mm512_set1_epi32(static_cast<int>(lo)), salt), 27);
    const __m512i bit = _mm512_maskz_sllv_epi32(0xFFFF, _mm512_set1_epi32(1), pos);
    return _mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_load_si512(w), bit), bit) == 0xFFFF;
#elif defined(__AVX2__)
    const __m256i l = _mm256_set1_epi32(static_cast<int>(lo)), one = _mm256_set1_epi32(1);
    bool ok = true;
    for (int half = 0; half < 2; ++half) {
      const __m256i salt = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kSalt + 8 * half));
      const __m256i bit = _mm256_sllv_epi32(one, _mm256_srli_epi32(_mm256_mullo_epi32(l, salt), 27));
      const __m256i v = _mm256_load_si256(reinterpret_cast<const __m256i*>(w + 8 * half));
      ok &= _mm256_movemask_epi8(_mm256_cmpeq_epi32(_mm256_and_si256(v, bit), bit)) == -1;
    }
    return ok;
#else
    uint32_t miss = 0;
    for (int k = 0; k < 16; ++k) miss |= ~w[k] & (1u << ((lo * kSalt[k]) >> 27));
    return miss == 0;
#endif
  }

  static constexpr uint32_t kSalt[16] = {0x47b6137bu, 0x44974d91u, 0x8824ad5bu, 0xa2b7289du, 0x705495c7u, 0x2df1424bu,
                                         0x9efc4947u, 0x5c6bfb31u, 0x3c6ef372u | 1u, 0xbb67ae85u, 0x6a09e667u,
                                         0xa54ff53bu, 0x510e527fu, 0x9b05688cu | 1u, 0x1f83d9abu, 0x5be0cd19u};

  Kind kind_;
  int64_t n_blocks_ = 0;  // 64-byte buckets/blocks
  double bits_per_key_ = 0.0;
  int64_t inserted_ = 0;
  struct Free {
    void operator()(uint64_t* p) const;
  };
  std::unique_ptr<uint64_t[], Free> storage_;  // n_blocks_ * 8 words, 2 MiB aligned (huge pages where allowed)
  uint64_t* words_ = nullptr;                  // storage_.get()
};

template <typename F>
void NgramSet::probe(const uint64_t* keys, size_t n, F&& on_hit) const {
  constexpr size_t D = 64;  // prefetch distance, in keys: enough misses in flight to cover DRAM latency
  const char* base = reinterpret_cast<const char*>(words_);
  for (size_t i = 0; i < n && i < D; ++i) __builtin_prefetch(base + block_of(keys[i]) * 64);
  if (kind_ == Kind::exact) {
    for (size_t i = 0; i < n; ++i) {
      if (i + D < n) __builtin_prefetch(base + block_of(keys[i + D]) * 64);
      if (exact_contains(key_of(keys[i]), block_of(keys[i]))) on_hit(i);
    }
  } else {
    for (size_t i = 0; i < n; ++i) {
      if (i + D < n) __builtin_prefetch(base + block_of(keys[i + D]) * 64);
      if (bloom_contains(keys[i], block_of(keys[i]))) on_hit(i);
    }
  }
}

}  // namespace olmoref::data
