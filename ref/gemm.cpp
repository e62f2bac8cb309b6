// ref/gemm.cpp — the canonical-order GEMM: normative triple loop, run-time ISA dispatch, thread split, and the
// portable (scalar) micro-kernel. The AVX2 / AVX-512 micro-kernels live in gemm_avx2.cpp / gemm_avx512.cpp,
// compiled with their own -m flags so they exist (and are picked at run time) even in a baseline build.
#include "ref/gemm.h"

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>

#include "ref/gemm_kernels.h"
#include "core/parallel.h"

namespace olmoref {

using gemm_detail::GemmKernelInfo;
using gemm_detail::GemmTask;

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

namespace gemm_detail {
namespace {

// Portable micro-kernel: a 4 x 16 tile of plain floats. The j loop may be vectorised by the compiler (each
// lane is still its own fmaf chain); nothing else is reordered.
struct ScalarKernel {
  static constexpr int MR = 4, NR = 16;
  static constexpr int64_t MC = 64, KC = 256, NC = 1024;
  static constexpr int64_t B_DIRECT_MAX_ROWS = 32;
  static constexpr bool PACK_A_4K_COLS = true;
  static constexpr bool PACK_A_COLS = false;
  static constexpr bool PACK_A_ROWS = false;

  static void tile(int mm, int nn, int64_t kc, AMode amode, const float* a, int64_t lda, const float* b,
                   int64_t ldb, float* c, int64_t ldc, bool load_c, const float* /*c_next*/) {
    float acc[MR][NR];
    for (int r = 0; r < MR; ++r)
      for (int j = 0; j < NR; ++j) acc[r][j] = (load_c && r < mm && j < nn) ? c[r * ldc + j] : 0.0f;
    for (int64_t p = 0; p < kc; ++p) {
      const float* bp = b + p * ldb;
      for (int r = 0; r < mm; ++r) {
        const float av = amode == kARow ? a[r * lda + p] : a[p * lda + r];
        for (int j = 0; j < nn; ++j) acc[r][j] = std::fma(av, bp[j], acc[r][j]);
      }
    }
    for (int r = 0; r < mm; ++r)
      for (int j = 0; j < nn; ++j) c[r * ldc + j] = acc[r][j];
  }
};

}  // namespace

const GemmKernelInfo& gemm_kernel_scalar() { return gemm_kernel_info<ScalarKernel>(); }

}  // namespace gemm_detail

// ---- ISA selection -------------------------------------------------------------------------------------

static std::atomic<GemmIsa> g_isa{GemmIsa::best};

bool gemm_isa_supported(GemmIsa isa) {
  switch (isa) {
    case GemmIsa::best:
    case GemmIsa::scalar: return true;
#if defined(__x86_64__)
    // __builtin_cpu_supports also checks that the OS saves the wider registers (XCR0).
    case GemmIsa::avx2: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case GemmIsa::avx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("fma");
#else
    case GemmIsa::avx2:
    case GemmIsa::avx512: return false;
#endif
  }
  return false;
}

void set_gemm_isa(GemmIsa isa) {
  if (!gemm_isa_supported(isa))
    throw std::invalid_argument("set_gemm_isa: " + gemm_isa_name(isa) +
                                " is not supported by this CPU/build; ask gemm_isa_supported() first");
  g_isa.store(isa);
}

GemmIsa active_gemm_isa() {
  const GemmIsa isa = g_isa.load();
  if (isa != GemmIsa::best) return isa;
  if (gemm_isa_supported(GemmIsa::avx512)) return GemmIsa::avx512;
  if (gemm_isa_supported(GemmIsa::avx2)) return GemmIsa::avx2;
  return GemmIsa::scalar;
}

std::string gemm_isa_name(GemmIsa isa) {
  switch (isa) {
    case GemmIsa::best: return "best";
    case GemmIsa::scalar: return "scalar";
    case GemmIsa::avx2: return "avx2";
    case GemmIsa::avx512: return "avx512";
  }
  return "?";
}

static const GemmKernelInfo& active_kernel() {
  switch (active_gemm_isa()) {
#if defined(__x86_64__)
    case GemmIsa::avx512: return gemm_detail::gemm_kernel_avx512();
    case GemmIsa::avx2: return gemm_detail::gemm_kernel_avx2();
#endif
    default: return gemm_detail::gemm_kernel_scalar();
  }
}

// ---- pack buffers and thread split ---------------------------------------------------------------------

namespace {

// Per-thread pack buffers, grown on demand and kept for the thread's life (pool workers are long-lived), so a
// training step does not allocate in the inner loop.
struct PackBuffer {
  float* data = nullptr;
  size_t floats = 0;
  ~PackBuffer() { std::free(data); }
  float* get(size_t n) {
    if (n > floats) {
      std::free(data);
      const size_t bytes = (n * sizeof(float) + 63) / 64 * 64;
      data = static_cast<float*>(std::aligned_alloc(64, bytes));
      if (!data) throw std::bad_alloc();
      floats = n;
    }
    return data;
  }
};

struct Split {
  int tm = 1, tn = 1;      // thread grid over (rows, columns) of C
  int64_t rows_per = 0;    // rows per part, a multiple of MR except the last
  int64_t cols_per = 0;    // columns per part, a multiple of NR except the last
};

// Choose a tm x tn grid (tm*tn <= threads) of whole MR x NR tiles that minimises the largest part's cost:
// its padded FMAs (rows*cols per K step) plus the operands it must stream, rows + cols per K step, weighted
// as 32 FMAs per float (about what one 2-FMA-pipe AVX-512 core does while a float arrives from DRAM). The
// operand term matters when the padded work ties: e.g. dX[4096, 384] = dY[4096, 4096]·W has equal work
// split either way, but a column split would make both threads stream all of dY (64 MiB). Only output
// rows/columns are split, never K, so the choice cannot change any bit; it only balances.
Split choose_split(int64_t M, int64_t N, int64_t K, const GemmKernelInfo& k, int threads) {
  const int64_t um = (M + k.mr - 1) / k.mr, un = (N + k.nr - 1) / k.nr;
  Split best;
  best.rows_per = um * k.mr;
  best.cols_per = un * k.nr;
  // Below ~32^3 FMAs a pool hand-off costs more than it saves.
  if (threads <= 1 || M * N * K < 32 * 32 * 32) return best;
  auto cost = [](int64_t rows, int64_t cols) { return rows * cols + 32 * (rows + cols); };
  int64_t best_cost = cost(best.rows_per, best.cols_per);
  for (int tm = 1; tm <= threads; ++tm)
    for (int tn = 1; tm * tn <= threads; ++tn) {
      if (tm > um || tn > un) continue;
      const int64_t rows = (um + tm - 1) / tm * k.mr, cols = (un + tn - 1) / tn * k.nr;
      const int64_t c = cost(rows, cols);
      if (c < best_cost) {  // ties keep the first grid found (fewer row parts)
        best_cost = c;
        best.tm = tm;
        best.tn = tn;
        best.rows_per = rows;
        best.cols_per = cols;
      }
    }
  return best;
}

}  // namespace

void gemm(int64_t M, int64_t N, int64_t K, MatView A, MatView B, float* C, int64_t ldc, bool accumulate,
          ThreadPool* pool, const GemmEpilogue* epilogue) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {
    // The empty chain: C = 0, or C unchanged when accumulating; the epilogue still sees every element.
    for (int64_t i = 0; i < M; ++i) {
      if (!accumulate) std::memset(C + i * ldc, 0, static_cast<size_t>(N) * sizeof(float));
      if (epilogue) epilogue->apply(epilogue->ctx, C + i * ldc, i, 0, N);
    }
    return;
  }
  const GemmKernelInfo& k = active_kernel();
  const Split s = choose_split(M, N, K, k, pool ? pool->size() : 1);
  const int64_t kc = K < k.kc ? K : k.kc;
  auto run_part = [&](int64_t part) {
    thread_local PackBuffer buf_a, buf_b;
    const int64_t im = part / s.tn, in = part % s.tn;
    GemmTask t;
    t.m0 = im * s.rows_per;
    t.m1 = t.m0 + s.rows_per < M ? t.m0 + s.rows_per : M;
    t.n0 = in * s.cols_per;
    t.n1 = t.n0 + s.cols_per < N ? t.n0 + s.cols_per : N;
    if (t.m0 >= t.m1 || t.n0 >= t.n1) return;
    t.K = K;
    t.A = A;
    t.B = B;
    t.C = C;
    t.ldc = ldc;
    t.accumulate = accumulate;
    t.epilogue = epilogue;
    // Sized for this call's kc so small-K products do not touch a full KC-deep buffer.
    t.pack_a = buf_a.get(static_cast<size_t>((k.mc + k.mr) * (kc + 16)));
    t.pack_b = buf_b.get(static_cast<size_t>((k.nc + k.nr) * kc));
    k.drive(t);
  };
  const int parts = s.tm * s.tn;
  if (parts == 1 || !pool) {
    for (int p = 0; p < parts; ++p) run_part(p);
  } else {
    pool->parallel_for(parts, 1, [&](int64_t b, int64_t e) {
      for (int64_t p = b; p < e; ++p) run_part(p);
    });
  }
}

// Y[M,N] = X[M,K]·W[N,K]ᵀ: A = X (row-major), B(p,j) = W[j,p].
void matmul_forward(const float* X, const float* W, float* Y, int64_t M, int64_t N, int64_t K, ThreadPool* pool) {
  gemm(M, N, K, {X, K, 1}, {W, 1, K}, Y, N, false, pool);
}
void matmul_forward(const float* X, const float* W, float* Y, int64_t M, int64_t N, int64_t K, ThreadPool* pool,
                    const GemmEpilogue* epilogue) {
  gemm(M, N, K, {X, K, 1}, {W, 1, K}, Y, N, false, pool, epilogue);
}
// dX[M,K] (+)= dY[M,N]·W[N,K]: A = dY (row-major), B = W (row-major); the chain runs over n = 0..N-1.
void matmul_backward_input(const float* dY, const float* W, float* dX, int64_t M, int64_t N, int64_t K,
                           bool accumulate, ThreadPool* pool) {
  gemm(M, K, N, {dY, N, 1}, {W, K, 1}, dX, K, accumulate, pool);
}
void matmul_backward_input(const float* dY, const float* W, float* dX, int64_t M, int64_t N, int64_t K,
                           bool accumulate, ThreadPool* pool, const GemmEpilogue* epilogue) {
  gemm(M, K, N, {dY, N, 1}, {W, K, 1}, dX, K, accumulate, pool, epilogue);
}
// dW[N,K] (+)= dY[M,N]ᵀ·X[M,K]: A(i,p) = dY[p,i], B = X (row-major); the chain runs over tokens m = 0..M-1.
void matmul_backward_weight(const float* dY, const float* X, float* dW, int64_t M, int64_t N, int64_t K,
                            bool accumulate, ThreadPool* pool) {
  gemm(N, K, M, {dY, 1, N}, {X, K, 1}, dW, K, accumulate, pool);
}

}  // namespace olmoref
