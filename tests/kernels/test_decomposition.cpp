// The CUDA kernels' decompositions (kernels/*.h), executed on the host exactly as the device runs them (the
// same OLMOREF_HD code, thread by thread between barriers), equal ref/ bit for bit on awkward shapes; a
// negative control shows the comparison can fail.
#include <doctest.h>

#include <cstring>
#include <random>

#include "kernels/gemm_exact.h"
#include "ref/gemm.h"
#include "tests/kernels/gemm_cases.h"

using namespace olmoref;
using olmoref::testing::GemmCase;

namespace {

std::vector<float> reference(const GemmCase& c, const testing::GemmOperands& o) {
  std::vector<float> out = o.c;
  const kernels::GemmArgs g = testing::gemm_args(c, o.a.data(), o.b.data(), out.data());
  gemm_reference(g.M, g.N, g.K, MatView{g.A, g.a_row, g.a_col}, MatView{g.B, g.b_row, g.b_col}, out.data(), g.ldc,
                 g.accumulate);
  return out;
}

}  // namespace

TEST_CASE("gemm exact: the kernel's tiles, slabs and per-thread chains equal the reference bit for bit") {
  int cases = 0;
  for (const GemmCase& c : testing::gemm_cases()) {
    CAPTURE(c.M);
    CAPTURE(c.N);
    CAPTURE(c.K);
    CAPTURE(c.layout);
    CAPTURE(c.accumulate);
    const testing::GemmOperands o = testing::gemm_operands(c, static_cast<uint32_t>(17 + cases));
    const std::vector<float> want = reference(c, o);
    std::vector<float> got = o.c;
    kernels::gemm_exact_host(testing::gemm_args(c, o.a.data(), o.b.data(), got.data()));
    CHECK(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)) == 0);
    ++cases;
  }
  CHECK(cases == 54);
}

TEST_CASE("gemm exact negative control: split-K slabs added afterwards give other bits") {
  const GemmCase c{65, 63, 100, 0, false};
  const testing::GemmOperands o = testing::gemm_operands(c, 5);
  const std::vector<float> want = reference(c, o);
  std::vector<float> got = o.c;
  kernels::GemmArgs g = testing::gemm_args(c, o.a.data(), o.b.data(), got.data());
  g.debug_split_k = true;
  kernels::gemm_exact_host(g);
  CHECK(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)) != 0);
}
