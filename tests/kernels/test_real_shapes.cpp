// The exact kernels' decompositions at real-step shapes, executed on the host over a sample of each shape (GEMM
// tiles, attention rows and keys, every cross-entropy row: tests/kernels/real_shape_cases.h), bit for bit against
// ref/. The device runs the same cases whole (tests/gpu/test_gpu_kernels.cpp, family real_shapes).
#include <doctest.h>

#include "core/parallel.h"
#include "tests/kernels/real_shape_cases.h"

using namespace olmoref;

TEST_CASE("real shapes: GEMM 2048x8192x2048 and the LM head's dW at V 100352, sampled tiles") {
  ThreadPool pool(0);
  CHECK(testing::check_real_gemm(testing::host_real_shape_executor(), &pool) == 0);
}

TEST_CASE("real shapes: attention at T 2048 window 1024 and T 8192 full, hd 128, sampled rows and keys") {
  ThreadPool pool(0);
  CHECK(testing::check_real_attention(testing::host_real_shape_executor(), &pool) == 0);
}

TEST_CASE("real shapes: cross-entropy at V 100352, every row") {
  ThreadPool pool(0);
  CHECK(testing::check_real_cross_entropy(testing::host_real_shape_executor(), &pool) == 0);
}

TEST_CASE("real shapes negative control: split-K slabs added afterwards are caught at both GEMM shapes in both tilings") {
  ThreadPool pool(0);
  testing::RealShapeExecutor ex = testing::host_real_shape_executor();
  ex.gemm = [](const kernels::GemmArgs& g, const std::vector<std::pair<int64_t, int64_t>>& tiles,
               kernels::GemmTiling tiling) {
    kernels::GemmArgs split = g;
    split.debug_split_k = true;
    kernels::gemm_exact_host_tiles(split, tiles, tiling);
  };
  CHECK(testing::check_real_gemm(ex, &pool) == 4);  // both shapes, both tilings
}
