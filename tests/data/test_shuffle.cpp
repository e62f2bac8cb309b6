// tests/data/test_shuffle.cpp — OLMo-core's global order (numpy's SeedSequence, PCG64 and permutation) against
// values numpy gives for the same seeds; numpy itself is run against ours in numpy_shuffle_check.py (test data-numpy).
#include <doctest.h>

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <vector>

#include "data/shuffle.h"

using namespace olmoref::data;

TEST_CASE("SeedSequence(34522).generate_state(4, uint64) matches numpy") {
  const auto s = numpy_seed_sequence_state(34522);
  CHECK(s[0] == 0x3885fa2b0f7cdc0cULL);
  CHECK(s[1] == 0x35939b7abce1747bULL);
  CHECK(s[2] == 0x51ebfab57a63dbe3ULL);
  CHECK(s[3] == 0x858410cd59b161dbULL);
}

TEST_CASE("PCG64(34522): first two 64-bit outputs match numpy") {
  Pcg64 rng(34522);
  CHECK(rng.next64() == 17652951892437861139ULL);
  CHECK(rng.next64() == 4887286688521401786ULL);
}

TEST_CASE("PCG64 32-bit draws split a 64-bit draw low half first") {
  Pcg64 a(34522), b(34522);
  const uint64_t v = a.next64();
  CHECK(b.next32() == static_cast<uint32_t>(v));
  CHECK(b.next32() == static_cast<uint32_t>(v >> 32));
  CHECK(b.next64() == a.next64());  // a 64-bit draw does not consume the buffered half
}

TEST_CASE("shuffle test vectors: n=10 and n=2048 with seed 34521, epoch 1") {
  const std::vector<uint32_t> p10 = numpy_permutation(34521 + 1, 10);
  CHECK(p10 == std::vector<uint32_t>{5, 9, 8, 4, 0, 6, 1, 2, 7, 3});

  const std::vector<uint32_t> p2048 = numpy_permutation(34522, 2048);
  const std::vector<uint32_t> head(p2048.begin(), p2048.begin() + 8);
  CHECK(head == std::vector<uint32_t>{808, 2001, 1683, 1798, 654, 2034, 369, 1696});

  // GlobalOrder adds seed + epoch itself.
  const GlobalOrder order(34521, 1, 10, 1);
  CHECK(std::vector<uint32_t>(order.indices().begin(), order.indices().end()) == p10);
}

TEST_CASE("permutations are permutations, for edge sizes and large seeds") {
  for (int64_t n : {0, 1, 2, 3, 1000, 65537}) {
    for (uint64_t seed : {uint64_t{0}, uint64_t{1}, uint64_t{34522}, (uint64_t{1} << 32) + 5, ~uint64_t{0}}) {
      std::vector<uint32_t> p = numpy_permutation(seed, n);
      REQUIRE(p.size() == static_cast<size_t>(n));
      std::sort(p.begin(), p.end());
      std::vector<uint32_t> iota(static_cast<size_t>(n));
      std::iota(iota.begin(), iota.end(), 0u);
      CHECK(p == iota);
    }
  }
  CHECK(numpy_permutation(0, 1) == std::vector<uint32_t>{0});
}

TEST_CASE("GlobalOrder crops the permutation tail to whole global batches") {
  const std::vector<uint32_t> full = numpy_permutation(34521 + 3, 103);
  const GlobalOrder order(34521, 3, 103, 10);
  CHECK(order.n_batches() == 10);
  REQUIRE(order.indices().size() == 100);
  CHECK(std::equal(order.indices().begin(), order.indices().end(), full.begin()));
  for (int64_t b = 0; b < 10; ++b) {
    const auto row = order.batch(b);
    CHECK(std::equal(row.begin(), row.end(), full.begin() + b * 10));
  }
  CHECK_THROWS_AS(order.batch(10), std::out_of_range);
}

TEST_CASE("GlobalOrder rejects datasets smaller than one batch and 0-based epochs") {
  CHECK_THROWS_WITH_AS(GlobalOrder(1, 1, 5, 8), doctest::Contains("fewer than one global batch"), std::runtime_error);
  CHECK_THROWS_AS(GlobalOrder(1, 0, 100, 8), std::invalid_argument);
}

TEST_CASE("GlobalOrder with chunks: numpy's permutation of the chunk ids, each expanded in place (OLMo-core chunk_size)") {
  // 42 instances in chunks of 4: 10 chunks (2 instances left out), batches of 8.
  const std::vector<uint32_t> chunks = numpy_permutation(34521 + 2, 10);
  const GlobalOrder order(34521, 2, 42, 8, 4);
  CHECK(order.chunk() == 4);
  CHECK(order.n_batches() == 5);
  REQUIRE(order.indices().size() == 40);
  for (size_t i = 0; i < 40; ++i) CHECK(order.indices()[i] == chunks[i / 4] * 4 + i % 4);
  CHECK_THROWS_AS(GlobalOrder(1, 1, 40, 8, 0), std::invalid_argument);
}
