// ref/gemm.h — the canonical-order matrix product.
//
// Contract (docs/canonical/matmul.md): every output element C[i,j] is ONE fused-multiply-add chain
//     acc = init;  for p = 0, 1, ..., K-1 (in this order):  acc = fmaf(A(i,p), B(p,j), acc);  C[i,j] = acc
// with init = 0 (accumulate=false) or init = C[i,j] (accumulate=true). Implementations may tile, pack,
// vectorise and thread over i and j freely, and may block K as long as the chain is continued in order
// (an fp32 accumulator spilled to memory and reloaded keeps its bits). They may never split K across
// threads or lanes, reassociate, or use a non-fused multiply and add. Every ISA path (scalar, AVX2,
// AVX-512, CUDA exact) therefore returns identical bits.
#pragma once

#include <cstdint>
#include <string>

namespace olmoref {

class ThreadPool;

// A strided read-only matrix view: element (r, c) is data[r * row_stride + c * col_stride].
struct MatView {
  const float* data;
  int64_t row_stride;
  int64_t col_stride;
};

// An elementwise step fused after the product (docs/canonical/matmul.md, "Epilogues"): called once for every
// output element, after the last fma of its chain, on row segments C[i, j0 .. j0+n) while the tile that was just
// finished is still in cache. It may rewrite the segment in place and write other tensors at the same
// positions; it must be elementwise (its result for an element depends only on that element's position and
// value), which is what lets the threads and tiles of the product call it in any order without changing a bit.
struct GemmEpilogue {
  void (*apply)(const void* ctx, float* c_row, int64_t i, int64_t j0, int64_t n);
  const void* ctx;
};

// C[M,N] (row-major, leading dimension ldc) = or += A[M,K] · B[K,N], then the epilogue, if any, on every element.
void gemm(int64_t M, int64_t N, int64_t K, MatView A, MatView B, float* C, int64_t ldc, bool accumulate,
          ThreadPool* pool, const GemmEpilogue* epilogue = nullptr);

// The three products of a linear layer y = x·Wᵀ with PyTorch's weight layout W[out, in].
// Y[M,N] = X[M,K] · W[N,K]ᵀ                     (forward)
void matmul_forward(const float* X, const float* W, float* Y, int64_t M, int64_t N, int64_t K, ThreadPool* pool);
// dX[M,K] (+)= dY[M,N] · W[N,K]                   (input gradient; reduction over N)
void matmul_backward_input(const float* dY, const float* W, float* dX, int64_t M, int64_t N, int64_t K,
                           bool accumulate, ThreadPool* pool);
// dW[N,K] (+)= dY[M,N]ᵀ · X[M,K]                  (weight gradient; reduction over the M tokens)
void matmul_backward_weight(const float* dY, const float* X, float* dW, int64_t M, int64_t N, int64_t K,
                            bool accumulate, ThreadPool* pool);
// The forward and input-gradient products with an epilogue (ref/ops.h fuses SwiGLU into them this way).
void matmul_forward(const float* X, const float* W, float* Y, int64_t M, int64_t N, int64_t K, ThreadPool* pool,
                    const GemmEpilogue* epilogue);
void matmul_backward_input(const float* dY, const float* W, float* dX, int64_t M, int64_t N, int64_t K,
                           bool accumulate, ThreadPool* pool, const GemmEpilogue* epilogue);

// The normative definition: a plain triple loop, single-threaded. Tests compare every fast path
// against it bit for bit.
void gemm_reference(int64_t M, int64_t N, int64_t K, MatView A, MatView B, float* C, int64_t ldc,
                    bool accumulate);

// Which instruction-set path gemm() uses. `best` picks the widest the CPU supports at run time;
// tests force each path to prove they agree bit for bit.
enum class GemmIsa { best, scalar, avx2, avx512 };
void set_gemm_isa(GemmIsa isa);
GemmIsa active_gemm_isa();        // resolved (never `best`)
bool gemm_isa_supported(GemmIsa isa);
std::string gemm_isa_name(GemmIsa isa);

}  // namespace olmoref
