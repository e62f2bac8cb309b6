// bench/gemm_bench.cu — the exact GEMM (kernels::gemm_exact_device) against cuBLAS fp32 (cublasSgemm) on the GEMM
// shapes of a training step, on the device (run by tools/gpu_check.sh's bench step, after bench/gpu_bench.sh).
//
//   gemm_bench [--dry-run] [--out BENCH_JSON] [CONFIG.toml...]   (default configs/olmo3-100m.toml configs/olmo3-1b.toml)
//
// Shapes: for each linear layer of the config (q/k/v/out, ffn up (w1, w3) and down (w2), the LM head) its three
// products at R = micro_batch_instances x seq_len rows — forward Y[R, out] = X·Wᵀ, input gradient dX[R, in] = dY·W,
// weight gradient dW[out, in] = dYᵀ·X — with ref/gemm.h's layouts (tests/kernels/gemm_cases.h). Each shape prints
// and appends to BENCH_JSON (a JSON array, the format of bench/gpu_bench.sh's rows; rewritten after every shape so a
// run cut short keeps the rows before it) the TFLOP/s of both, their ratio and each one's share of the fp32 peak;
// also the tiling the device picks for the shape (kernels::gemm_pick_tiling) and the other tiling's time on it, so a
// row says whether the pick was right; the picked kernel's registers and blocks an SM on this device, and its time held
// to one block an SM (dynamic shared memory it never touches: the same grid and bits), so a row says what the second
// block buys. Held so, the SM also gives more of its L1 to shared memory; the GEMM reads each operand element once per
// block into shared memory, so little should ride on it, but the ratio is an upper bound on occupancy's share.
// --dry-run builds and prints the shape list, with each shape's tiling at 132 SMs, without touching a device (the dry
// run of tools/gpu_check.sh).
//
// cuBLAS is loaded at run time (dlopen): libcublasLt alone is 541 MB, far past the 64 MiB a device call carries
// (tools/gpu_carry.sh), so the binary must start without it; where the device has no libcublas.so.13 (GEMM_BENCH_CUBLAS
// names one), the rows carry the exact GEMM alone and say why. Math mode CUBLAS_DEFAULT_MATH with
// NVIDIA_TF32_OVERRIDE=0: plain fp32 FFMA, no TF32 tensor cores, the peer an exact fp32 product can be held to.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench/device_bench.cuh"
#include "kernels/device_memory.h"
#include "kernels/gemm_exact.h"
#include "tests/kernels/gemm_cases.h"
#include "train/config.h"

namespace {

using namespace olmoref;

using bench::append_row;
using bench::check_cuda;
using bench::fill;
using bench::json_number;
using bench::kFp32PeakTflops;
using bench::seconds_per_call;

struct Shape {
  std::string config, product;
  testing::GemmCase gemm;  // layout 0 forward, 1 input gradient, 2 weight gradient
  double flops() const { return 2.0 * double(gemm.M) * double(gemm.N) * double(gemm.K); }
};

// The step's GEMM shapes of one config: each distinct linear layer (in -> out) once, its three products.
std::vector<Shape> step_shapes(const std::string& path) {
  const TrainConfig cfg = load_config(path);
  const ModelConfig& m = cfg.model;
  const int64_t R = cfg.train.micro_batch_instances * cfg.train.seq_len;
  const int64_t hd = m.head_dim ? m.head_dim : m.d_model / m.n_heads;
  const int64_t qd = m.n_heads * hd, kd = m.n_kv_heads * hd;
  std::string name = path.substr(path.find_last_of('/') + 1);
  name = name.substr(0, name.rfind(".toml"));
  // (in, out) -> layer names; layers of one shape are one entry (q/k/v/out are all d x d in MHA).
  std::vector<std::pair<std::pair<int64_t, int64_t>, std::string>> layers;
  auto add = [&](int64_t in, int64_t out, const std::string& layer) {
    for (auto& [io, names] : layers)
      if (io == std::make_pair(in, out)) { names += "/" + layer; return; }
    layers.push_back({{in, out}, layer});
  };
  add(m.d_model, qd, "q");
  add(m.d_model, kd, "k");
  add(m.d_model, kd, "v");
  add(qd, m.d_model, "out");
  add(m.d_model, m.ffn_hidden, "ffn_up");
  add(m.ffn_hidden, m.d_model, "ffn_down");
  add(m.d_model, m.vocab_size, "lm_head");
  std::vector<Shape> shapes;
  for (const auto& [io, layer] : layers) {
    const auto [in, out] = io;
    shapes.push_back({name, layer + " forward", {R, out, in, 0, false}});
    shapes.push_back({name, layer + " input-gradient", {R, in, out, 1, false}});
    shapes.push_back({name, layer + " weight-gradient", {out, in, R, 2, false}});
  }
  return shapes;
}

// cublasSgemm through dlopen: the few entry points used, or why they are not there.
struct Cublas {
  using Create = cublasStatus_t (*)(cublasHandle_t*);
  using Destroy = cublasStatus_t (*)(cublasHandle_t);
  using SetMath = cublasStatus_t (*)(cublasHandle_t, cublasMath_t);
  using Sgemm = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const float*,
                                   const float*, int, const float*, int, const float*, float*, int);
  cublasHandle_t handle = nullptr;
  Sgemm sgemm = nullptr;
  Destroy destroy = nullptr;
  std::string missing;  // why there is no cuBLAS column; empty when there is one

  Cublas() {
    setenv("NVIDIA_TF32_OVERRIDE", "0", 1);  // before the library reads it: no TF32 whatever the math mode
    const char* named = std::getenv("GEMM_BENCH_CUBLAS");
    void* lib = nullptr;
    for (const char* candidate : {named, "libcublas.so.13", "/usr/local/cuda/lib64/libcublas.so.13"})
      if (candidate && (lib = dlopen(candidate, RTLD_NOW | RTLD_LOCAL))) break;
    if (!lib) {
      // dlerror's text goes to the log only: the row's reason is a fixed string, with no quotes to escape in JSON.
      std::printf("gemm_bench: dlopen of cuBLAS failed: %s\n", dlerror());
      missing = "no libcublas.so.13 on this machine (set GEMM_BENCH_CUBLAS to one)";
      return;
    }
    auto create = reinterpret_cast<Create>(dlsym(lib, "cublasCreate_v2"));
    auto set_math = reinterpret_cast<SetMath>(dlsym(lib, "cublasSetMathMode"));
    sgemm = reinterpret_cast<Sgemm>(dlsym(lib, "cublasSgemm_v2"));
    destroy = reinterpret_cast<Destroy>(dlsym(lib, "cublasDestroy_v2"));
    if (!create || !set_math || !sgemm || !destroy) {
      missing = "libcublas.so.13 lacks cublasCreate_v2, cublasSetMathMode, cublasSgemm_v2 or cublasDestroy_v2";
    } else if (create(&handle) != CUBLAS_STATUS_SUCCESS || set_math(handle, CUBLAS_DEFAULT_MATH) != CUBLAS_STATUS_SUCCESS) {
      missing = "cublasCreate or cublasSetMathMode(CUBLAS_DEFAULT_MATH) failed";
      handle = nullptr;
    }
  }
  ~Cublas() {
    if (handle) destroy(handle);
  }

  // C[M, N] row-major = A·B of the layout, as column-major Cᵀ[N, M] = Bᵀ·Aᵀ over the same buffers.
  void run(const testing::GemmCase& c, const float* a, const float* b, float* out) const {
    const float one = 1.0f, zero = 0.0f;
    const int M = int(c.M), N = int(c.N), K = int(c.K);
    cublasStatus_t s;
    switch (c.layout) {
      case 0:  // a = X[M, K], b = W[N, K]: Bᵀ = W is b read transposed
        s = sgemm(handle, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &one, b, K, a, K, &zero, out, N);
        break;
      case 1:  // a = dY[M, K], b = W[K, N]
        s = sgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, N, M, K, &one, b, N, a, K, &zero, out, N);
        break;
      default:  // a = dY[K, M] read transposed, b = X[K, N]
        s = sgemm(handle, CUBLAS_OP_N, CUBLAS_OP_T, N, M, K, &one, b, N, a, M, &zero, out, N);
        break;
    }
    if (s != CUBLAS_STATUS_SUCCESS) throw std::runtime_error("gemm_bench: cublasSgemm failed, status " + std::to_string(int(s)));
  }
};

// Times shape s both ways on the operand buffers a, b, c; prints its line and returns its bench.json row.
std::string bench_shape(const Shape& s, int sms, const Cublas& cublas, float* a, float* b, float* c) {
  const kernels::GemmArgs args = testing::gemm_args(s.gemm, a, b, c);
  // As the executor launches it: the tiling this device's SMs pick for the shape (kernels::gemm_pick_tiling).
  const kernels::GemmTiling tiling = kernels::gemm_pick_tiling(s.gemm.M, s.gemm.N, sms);
  const kernels::GemmTiling other =
      tiling == kernels::GemmTiling::tile64 ? kernels::GemmTiling::tile128 : kernels::GemmTiling::tile64;
  const kernels::GemmDeviceFit fit = kernels::gemm_exact_device_fit(tiling);
  const double exact = seconds_per_call([&] { kernels::gemm_exact_device(args); });
  const double exact_tflops = s.flops() / exact / 1e12;
  // The other tile on the same shape: whether the pick was right here.
  const double other_seconds = seconds_per_call([&] { kernels::gemm_exact_device(args, other); });
  // The same kernel held to one block an SM: what the blocks past the first buy, where the kernel has several.
  const double one = fit.blocks_per_sm > 1
                         ? seconds_per_call([&] { kernels::gemm_exact_device_one_block_per_sm(args, tiling); })
                         : exact;
  std::ostringstream row;
  row << " {\"bench\": \"gemm\", \"config\": \"" << s.config << "\", \"product\": \"" << s.product
      << "\", \"M\": " << s.gemm.M << ", \"N\": " << s.gemm.N << ", \"K\": " << s.gemm.K
      << ", \"peak_tflops\": " << json_number(kFp32PeakTflops) << ", \"exact_seconds\": " << json_number(exact)
      << ", \"exact_tflops\": " << json_number(exact_tflops)
      << ", \"exact_share_of_fp32_peak\": " << json_number(exact_tflops / kFp32PeakTflops)
      << ", \"exact_tiling\": \"" << kernels::gemm_tiling_name(tiling) << "\", \"other_tiling\": \""
      << kernels::gemm_tiling_name(other) << "\", \"other_tiling_seconds\": " << json_number(other_seconds)
      << ", \"other_tiling_over_exact\": " << json_number(other_seconds / exact)
      << ", \"exact_registers\": " << fit.registers << ", \"exact_blocks_per_sm\": " << fit.blocks_per_sm
      << ", \"exact_one_block_per_sm_seconds\": " << json_number(one)
      << ", \"exact_over_one_block_per_sm\": " << json_number(one / exact);
  char line[320];
  std::snprintf(line, sizeof line,
                "%-11s %-28s %6lld x %6lld x %6lld  exact %s %6.2f TFLOP/s (%4.1f%%, %.2fx 1 block/SM, %s %.2fx)",
                s.config.c_str(), s.product.c_str(), (long long)s.gemm.M, (long long)s.gemm.N, (long long)s.gemm.K,
                kernels::gemm_tiling_name(tiling), exact_tflops, 100 * exact_tflops / kFp32PeakTflops, one / exact,
                kernels::gemm_tiling_name(other), other_seconds / exact);
  std::string text = line;
  if (cublas.missing.empty()) {
    const double peer = seconds_per_call([&] { cublas.run(s.gemm, a, b, c); });
    const double peer_tflops = s.flops() / peer / 1e12;
    row << ", \"cublas_seconds\": " << json_number(peer) << ", \"cublas_tflops\": " << json_number(peer_tflops)
        << ", \"cublas_share_of_fp32_peak\": " << json_number(peer_tflops / kFp32PeakTflops)
        << ", \"exact_over_cublas\": " << json_number(exact_tflops / peer_tflops);
    std::snprintf(line, sizeof line, "  cuBLAS %6.2f TFLOP/s (%4.1f%%)  exact/cuBLAS %.2f", peer_tflops,
                  100 * peer_tflops / kFp32PeakTflops, exact_tflops / peer_tflops);
    text += line;
  } else {
    row << ", \"cublas_tflops\": null, \"cublas_missing\": \"" << cublas.missing << "\"";
  }
  row << "}";
  std::printf("%s\n", text.c_str());
  return row.str();
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  bench::Args args;
  if (!bench::parse_args(argc, argv, "gemm_bench", {"configs/olmo3-100m.toml", "configs/olmo3-1b.toml"}, args))
    return 2;
  try {
    std::vector<Shape> shapes;
    for (const std::string& c : args.configs)
      for (Shape& s : step_shapes(c)) shapes.push_back(std::move(s));
    if (args.dry) {
      std::printf("gemm_bench --dry-run: %zu shapes, no device used\n", shapes.size());
      for (const Shape& s : shapes)
        std::printf("  %-11s %-28s M %6lld N %6lld K %6lld  %.1f GFLOP  %s at %d SMs\n", s.config.c_str(),
                    s.product.c_str(), (long long)s.gemm.M, (long long)s.gemm.N, (long long)s.gemm.K, s.flops() / 1e9,
                    kernels::gemm_tiling_name(kernels::gemm_pick_tiling(s.gemm.M, s.gemm.N, kernels::kGemmHostSms)),
                    kernels::kGemmHostSms);
      return 0;
    }
    int64_t a_max = 0, b_max = 0, c_max = 0;
    for (const Shape& s : shapes) {
      a_max = std::max(a_max, s.gemm.M * s.gemm.K), b_max = std::max(b_max, s.gemm.K * s.gemm.N);
      c_max = std::max(c_max, s.gemm.M * s.gemm.N);
    }
    float *a = nullptr, *b = nullptr, *c = nullptr;
    check_cuda(cudaMalloc(&a, a_max * sizeof(float)), "cudaMalloc A");
    check_cuda(cudaMalloc(&b, b_max * sizeof(float)), "cudaMalloc B");
    check_cuda(cudaMalloc(&c, c_max * sizeof(float)), "cudaMalloc C");
    fill<<<1024, 256>>>(a, a_max, 0.125f);
    fill<<<1024, 256>>>(b, b_max, 0.0625f);
    check_cuda(cudaDeviceSynchronize(), "fill");
    const Cublas cublas;
    if (!cublas.missing.empty()) std::printf("gemm_bench: cuBLAS column left out: %s\n", cublas.missing.c_str());
    const int sms = kernels::current_device_sms();
    for (const kernels::GemmTiling t : {kernels::GemmTiling::tile128, kernels::GemmTiling::tile64}) {
      const kernels::GemmDeviceFit fit = kernels::gemm_exact_device_fit(t);
      std::printf("gemm_bench: gemm_exact_kernel %s: %d registers, %d blocks an SM (256 threads a block; %d SMs)\n",
                  kernels::gemm_tiling_name(t), fit.registers, fit.blocks_per_sm, sms);
    }
    for (const Shape& s : shapes) {
      const std::string row = bench_shape(s, sms, cublas, a, b, c);
      if (!args.out.empty()) append_row(args.out, row);
    }
    cudaFree(a), cudaFree(b), cudaFree(c);
  } catch (const std::exception& e) {
    std::printf("gemm_bench: FAILED: %s\n", e.what());
    return 1;
  }
  return 0;
}
