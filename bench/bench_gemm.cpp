// bench/bench_gemm.cpp — the canonical-order GEMM (ref/gemm.h) against OpenBLAS sgemm, side by side, on the
// training shapes, at 1 and 2 threads. OpenBLAS is only a yardstick here and never linked into olmoref.
//
// Products of a linear layer with M = 4096 tokens, W[N,K] (PyTorch layout), and their cblas equivalents:
//   fwd    Y[M,N]  = X[M,K] · W[N,K]ᵀ    sgemm(NoTrans, Trans,   M, N, K)
//   bwd_in dX[M,K] = dY[M,N] · W[N,K]    sgemm(NoTrans, NoTrans, M, K, N)
//   bwd_w  dW[N,K] = dY[M,N]ᵀ · X[M,K]   sgemm(Trans,   NoTrans, N, K, M)
// Each reports GFLOPS (2·M·N·K per call, wall-clock). Names are
//   gemm/<product>/<impl>/M:<M>/N:<N>/K:<K>/threads:<t>
// so bench/run_gemm_bench.sh can pair olmoref with openblas per shape/product/threads.
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "ref/gemm.h"
#include "core/parallel.h"

namespace {

using olmoref::ThreadPool;

enum class Product { fwd, bwd_in, bwd_w };
enum class Impl { olmoref, openblas };

const char* product_name(Product p) {
  switch (p) {
    case Product::fwd: return "fwd";
    case Product::bwd_in: return "bwd_in";
    case Product::bwd_w: return "bwd_w";
  }
  return "?";
}

ThreadPool* pool_for(int threads) {
  static std::unique_ptr<ThreadPool> pools[3];
  if (!pools[threads]) pools[threads] = std::make_unique<ThreadPool>(threads);
  return pools[threads].get();
}

std::vector<float> filled(size_t n, uint32_t seed) {
  std::vector<float> v(n);
  uint32_t s = seed;
  for (auto& x : v) {
    s = s * 1664525u + 1013904223u;
    x = static_cast<float>(static_cast<int32_t>(s >> 8) - (1 << 23)) / static_cast<float>(1 << 23);
  }
  return v;
}

void run(benchmark::State& state, Product prod, Impl impl, int64_t M, int64_t N, int64_t K, int threads) {
  // Operand sizes follow the layer: X[M,K], W[N,K], dY / Y[M,N].
  const auto x = filled(static_cast<size_t>(M * K), 1), w = filled(static_cast<size_t>(N * K), 2),
             dy = filled(static_cast<size_t>(M * N), 3);
  std::vector<float> out(static_cast<size_t>(prod == Product::fwd ? M * N : prod == Product::bwd_in ? M * K : N * K));
  ThreadPool* pool = pool_for(threads);
  openblas_set_num_threads(threads);
  const int m = static_cast<int>(M), n = static_cast<int>(N), k = static_cast<int>(K);
  for (auto _ : state) {
    if (impl == Impl::olmoref) {
      switch (prod) {
        case Product::fwd: olmoref::matmul_forward(x.data(), w.data(), out.data(), M, N, K, pool); break;
        case Product::bwd_in:
          olmoref::matmul_backward_input(dy.data(), w.data(), out.data(), M, N, K, false, pool);
          break;
        case Product::bwd_w:
          olmoref::matmul_backward_weight(dy.data(), x.data(), out.data(), M, N, K, false, pool);
          break;
      }
    } else {
      switch (prod) {
        case Product::fwd:
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, x.data(), k, w.data(), k, 0.0f,
                      out.data(), n);
          break;
        case Product::bwd_in:
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, k, n, 1.0f, dy.data(), n, w.data(), k, 0.0f,
                      out.data(), k);
          break;
        case Product::bwd_w:
          cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, k, m, 1.0f, dy.data(), n, x.data(), k, 0.0f,
                      out.data(), k);
          break;
      }
    }
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.counters["GFLOPS"] =
      benchmark::Counter(2.0 * static_cast<double>(M) * N * K * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(impl == Impl::olmoref ? olmoref::gemm_isa_name(olmoref::active_gemm_isa()) : openblas_get_corename());
}

// (N, K) of the training shapes at M = 4096 tokens: attention-like, MLP-like and a vocab-like LM head
// (N = 4096 outputs over K = 384). The last entry is the 1024^3 square.
struct Shape {
  int64_t M, N, K;
};
const Shape kShapes[] = {
    {4096, 128, 128}, {4096, 512, 128},  {4096, 128, 512},  {4096, 384, 384},
    {4096, 1536, 384}, {4096, 384, 1536}, {4096, 4096, 384}, {1024, 1024, 1024},
};

void register_all() {
  for (int threads : {1, 2})
    for (const Shape& s : kShapes)
      for (Product p : {Product::fwd, Product::bwd_in, Product::bwd_w})
        for (Impl impl : {Impl::olmoref, Impl::openblas}) {
          const std::string name = std::string("gemm/") + product_name(p) + "/" +
                                   (impl == Impl::olmoref ? "olmoref" : "openblas") + "/M:" + std::to_string(s.M) +
                                   "/N:" + std::to_string(s.N) + "/K:" + std::to_string(s.K) +
                                   "/threads:" + std::to_string(threads);
          benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& st) { run(st, p, impl, s.M, s.N, s.K, threads); })
              ->UseRealTime()
              ->Unit(benchmark::kMillisecond);
        }
}

}  // namespace

int main(int argc, char** argv) {
  // OLMOREF_GEMM_ISA=scalar|avx2|avx512 benchmarks a narrower path than the widest the CPU has (e.g. AVX2
  // against OpenBLAS's Haswell kernel, same instruction set on both sides).
  if (const char* isa = std::getenv("OLMOREF_GEMM_ISA")) {
    const std::string v = isa;
    olmoref::set_gemm_isa(v == "scalar" ? olmoref::GemmIsa::scalar
                          : v == "avx2" ? olmoref::GemmIsa::avx2
                          : v == "avx512" ? olmoref::GemmIsa::avx512
                                          : olmoref::GemmIsa::best);
  }
  register_all();
  benchmark::AddCustomContext("openblas_core", openblas_get_corename());
  benchmark::AddCustomContext("olmoref_gemm_isa", olmoref::gemm_isa_name(olmoref::active_gemm_isa()));
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
