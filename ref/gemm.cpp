// Placeholder canonical GEMM: correct order, no speed. Replaced by the register-tiled kernels.
#include "ref/gemm.h"

#include <cmath>

#include "ref/parallel.h"

namespace olmoref {

static GemmIsa g_isa = GemmIsa::best;

void gemm_reference(int64_t M, int64_t N, int64_t K, MatView A, MatView B, float* C, int64_t ldc,
                    bool accumulate) {
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      float acc = accumulate ? C[i * ldc + j] : 0.0f;
      for (int64_t p = 0; p < K; ++p)
        acc = std::fma(A.data[i * A.row_stride + p * A.col_stride], B.data[p * B.row_stride + j * B.col_stride], acc);
      C[i * ldc + j] = acc;
    }
}

void gemm(int64_t M, int64_t N, int64_t K, MatView A, MatView B, float* C, int64_t ldc, bool accumulate,
          ThreadPool* pool) {
  auto rows = [&](int64_t b, int64_t e) {
    MatView a{A.data + b * A.row_stride, A.row_stride, A.col_stride};
    gemm_reference(e - b, N, K, a, B, C + b * ldc, ldc, accumulate);
  };
  if (pool) pool->parallel_for(M, 4, rows); else rows(0, M);
}

void matmul_forward(const float* X, const float* W, float* Y, int64_t M, int64_t N, int64_t K, ThreadPool* pool) {
  gemm(M, N, K, {X, K, 1}, {W, 1, K}, Y, N, false, pool);
}
void matmul_backward_input(const float* dY, const float* W, float* dX, int64_t M, int64_t N, int64_t K,
                           bool accumulate, ThreadPool* pool) {
  gemm(M, K, N, {dY, N, 1}, {W, K, 1}, dX, K, accumulate, pool);
}
void matmul_backward_weight(const float* dY, const float* X, float* dW, int64_t M, int64_t N, int64_t K,
                            bool accumulate, ThreadPool* pool) {
  gemm(N, K, M, {dY, 1, N}, {X, K, 1}, dW, K, accumulate, pool);
}

void set_gemm_isa(GemmIsa isa) { g_isa = isa; }
GemmIsa active_gemm_isa() { return g_isa == GemmIsa::best ? GemmIsa::scalar : g_isa; }
bool gemm_isa_supported(GemmIsa isa) { return isa == GemmIsa::scalar || isa == GemmIsa::best; }
std::string gemm_isa_name(GemmIsa isa) {
  switch (isa) {
    case GemmIsa::best: return "best";
    case GemmIsa::scalar: return "scalar";
    case GemmIsa::avx2: return "avx2";
    case GemmIsa::avx512: return "avx512";
  }
  return "?";
}

}  // namespace olmoref
