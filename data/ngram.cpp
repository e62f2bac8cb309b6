#include "data/ngram.h"

#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>

namespace olmoref::data {

NgramHasher::NgramHasher(int n) : n_(n) {
  if (n < 1 || n > 1024) throw std::invalid_argument("n-gram length must be in [1, 1024], got " + std::to_string(n));
  base_pow_n_ = 1;
  for (int i = 0; i < n; ++i) base_pow_n_ *= kBase;
}

uint64_t NgramHasher::hash(const uint32_t* t) const {
  uint64_t h = 0;
  for (int j = 0; j < n_; ++j) h = h * kBase + mix(t[j]);
  return h;
}

size_t NgramHasher::hash_all(std::span<const uint32_t> tokens, uint64_t* out, std::vector<uint64_t>& scratch) const {
  const size_t size = tokens.size(), n = static_cast<size_t>(n_);
  if (size < n) return 0;
  const size_t count = size - n + 1;
  // x_i = mix(t_i), then d_i = x_i - x_{i-n} * B^n for i >= n (independent per i: vectorizes).
  scratch.resize(size);
  uint64_t* x = scratch.data();
  const uint32_t* t = tokens.data();
  for (size_t i = 0; i < size; ++i) x[i] = mix(t[i]);
  // The rolling chain h_{i+1} = h_i * B + d_{i+n} is serial (a multiply and an add per token); run
  // four independent chains over four quarters of the windows so the core overlaps their latency.
  constexpr size_t kChains = 4;
  const size_t per = (count + kChains - 1) / kChains;
  size_t begin[kChains], end[kChains];
  uint64_t h[kChains];
  for (size_t c = 0; c < kChains; ++c) {
    begin[c] = std::min(count, c * per);
    end[c] = std::min(count, begin[c] + per);
    h[c] = 0;
    if (begin[c] < end[c]) {
      for (size_t j = 0; j < n; ++j) h[c] = h[c] * kBase + x[begin[c] + j];
      out[begin[c]] = h[c];
    }
  }
  const uint64_t bn = base_pow_n_;
  // Step k advances every chain by one window (chains that are done stop).
  for (size_t k = 1; k < per; ++k) {
    for (size_t c = 0; c < kChains; ++c) {
      const size_t i = begin[c] + k;  // window i = tokens [i, i + n)
      if (i >= end[c]) continue;
      h[c] = h[c] * kBase + (x[i + n - 1] - x[i - 1] * bn);
      out[i] = h[c];
    }
  }
  return count;
}

NgramSet::NgramSet(Kind kind, int64_t capacity, double bloom_bits_per_key) : kind_(kind) {
  capacity = std::max<int64_t>(capacity, 1);
  if (kind == Kind::exact) {
    n_blocks_ = std::max<int64_t>(2, (capacity + 3) / 4);  // 8 slots per bucket, load <= 1/2
  } else {
    if (!(bloom_bits_per_key >= 4.0 && bloom_bits_per_key <= 1024.0))
      throw std::invalid_argument("Bloom filter bits per key must be in [4, 1024]");
    bits_per_key_ = bloom_bits_per_key;
    n_blocks_ = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(static_cast<double>(capacity) * bloom_bits_per_key / 512.0)));
  }
  // 2 MiB aligned and rounded, so the kernel can back it with huge pages: random probes into a
  // table of tens of MiB otherwise miss the TLB as well as the cache.
  constexpr size_t kHuge = size_t{2} << 20;
  const size_t bytes = (static_cast<size_t>(n_blocks_) * 64 + kHuge - 1) / kHuge * kHuge;
  void* p = std::aligned_alloc(kHuge, bytes);
  if (p == nullptr) throw std::bad_alloc();
  ::madvise(p, bytes, MADV_HUGEPAGE);  // advice only; fine if refused
  std::memset(p, 0, bytes);
  storage_.reset(static_cast<uint64_t*>(p));
  words_ = storage_.get();
}

void NgramSet::Free::operator()(uint64_t* p) const { std::free(p); }

void NgramSet::insert(uint64_t h) {
  size_t b = block_of(h);
  if (kind_ == Kind::bloom) {
    uint32_t* w = reinterpret_cast<uint32_t*>(words_ + b * 8);
    const uint32_t lo = static_cast<uint32_t>(h);
    for (int k = 0; k < 16; ++k) w[k] |= 1u << ((lo * kSalt[k]) >> 27);
    ++inserted_;
    return;
  }
  const uint64_t key = key_of(h);
  for (int64_t probes = 0; probes < n_blocks_; ++probes) {
    uint64_t* s = words_ + b * 8;
    for (int k = 0; k < 8; ++k) {
      if (s[k] == key) return;
      if (s[k] == 0) {
        s[k] = key;
        ++inserted_;
        return;
      }
    }
    b = b + 1 == static_cast<size_t>(n_blocks_) ? 0 : b + 1;
  }
  throw std::logic_error("NgramSet: more keys inserted than its capacity");
}

bool NgramSet::contains(uint64_t h) const {
  return kind_ == Kind::exact ? exact_contains(key_of(h), block_of(h)) : bloom_contains(h, block_of(h));
}

double NgramSet::expected_false_positive_rate() const {
  if (kind_ == Kind::exact) return 0.0;
  // Keys per block ~ Poisson(lambda); a block holding c keys has each bit of a word set with
  // probability 1 - (31/32)^c, and a miss needs all 16 probed bits set.
  const double lambda = static_cast<double>(inserted_) / static_cast<double>(n_blocks_);
  double fpr = 0.0, p = std::exp(-lambda);  // P(c = 0)
  const int cmax = static_cast<int>(lambda + 12.0 * std::sqrt(lambda + 1.0) + 30.0);
  for (int c = 0; c <= cmax; ++c) {
    if (c > 0) p *= lambda / c;
    fpr += p * std::pow(1.0 - std::pow(31.0 / 32.0, c), 16);
  }
  return fpr;
}

}  // namespace olmoref::data
