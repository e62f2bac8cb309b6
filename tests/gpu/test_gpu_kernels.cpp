// GPU kernels against the CPU reference, bit for bit: the exact GEMM and RMSNorm on the awkward shapes of
// tests/kernels/*_cases.h (the same cases the host execution checks in CI) and the project's math
// functions over a dense sample of the fp32 range plus every special value. Without a device: SKIPPED, 77.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "kernels/device_info.h"
#include "kernels/gemm_exact.h"
#include "kernels/mathfn_device.h"
#include "kernels/rmsnorm_exact.h"
#include "ref/gemm.h"
#include "ref/mathfn.h"
#include "ref/ops.h"
#include "tests/kernels/gemm_cases.h"
#include "tests/kernels/norm_cases.h"

using namespace olmoref;

namespace {

template <typename T>
T* to_device(const std::vector<T>& v) {
  T* d = nullptr;
  cudaMalloc(&d, v.size() * sizeof(T));
  cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice);
  return d;
}

int check_gemm() {
  int failed = 0, n = 0;
  for (const testing::GemmCase& c : testing::gemm_cases()) {
    const testing::GemmOperands o = testing::gemm_operands(c, static_cast<uint32_t>(17 + n++));
    std::vector<float> want = o.c;
    const kernels::GemmArgs h = testing::gemm_args(c, o.a.data(), o.b.data(), want.data());
    gemm_reference(h.M, h.N, h.K, MatView{h.A, h.a_row, h.a_col}, MatView{h.B, h.b_row, h.b_col}, want.data(), h.ldc,
                   h.accumulate);
    float *da = to_device(o.a), *db = to_device(o.b), *dc = to_device(o.c);
    kernels::gemm_exact_device(testing::gemm_args(c, da, db, dc));
    std::vector<float> got(o.c.size());
    const cudaError_t err = cudaDeviceSynchronize();
    cudaMemcpy(got.data(), dc, got.size() * sizeof(float), cudaMemcpyDeviceToHost);
    cudaFree(da);
    cudaFree(db);
    cudaFree(dc);
    if (err != cudaSuccess || std::memcmp(got.data(), want.data(), want.size() * sizeof(float)) != 0) {
      std::printf("FAILED gemm M=%lld N=%lld K=%lld layout %d accumulate %d (%s)\n", (long long)c.M, (long long)c.N,
                  (long long)c.K, c.layout, c.accumulate, cudaGetErrorString(err));
      ++failed;
    }
  }
  std::printf("gemm exact: %d of %d cases bitwise equal\n", n - failed, n);
  return failed;
}

template <typename T>
std::vector<T> from_device(const T* d, size_t n) {
  std::vector<T> v(n);
  cudaMemcpy(v.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost);
  return v;
}

bool bits_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

int check_rmsnorm() {
  int failed = 0, n_cases = 0;
  for (const testing::NormCase& c : testing::norm_cases()) {
    ++n_cases;
    const testing::NormOperands o = testing::norm_operands(c, static_cast<uint32_t>(c.R * 1000 + c.n));
    const size_t rn = static_cast<size_t>(c.R * c.n), R = static_cast<size_t>(c.R), n = static_cast<size_t>(c.n);
    std::vector<float> y_ref(rn), ir_ref(R), dx_ref(rn), dw_ref(n);
    rmsnorm_forward(o.x.data(), o.w.data(), y_ref.data(), ir_ref.data(), c.R, c.n, 1e-6f, nullptr);
    rmsnorm_backward(o.x.data(), o.w.data(), ir_ref.data(), o.dy.data(), dx_ref.data(), dw_ref.data(), c.R, c.n, nullptr);
    kernels::RmsNormArgs a;
    a.R = c.R;
    a.n = c.n;
    a.eps = 1e-6f;
    float *dx_in = to_device(o.x), *dw_in = to_device(o.w), *ddy = to_device(o.dy);
    float *dy_out = to_device(std::vector<float>(rn)), *dir = to_device(std::vector<float>(R));
    float *ddx = to_device(std::vector<float>(rn)), *ddw = to_device(std::vector<float>(n));
    a.x = dx_in, a.w = dw_in, a.dy = ddy, a.y = dy_out, a.inv_rms = dir, a.dx = ddx, a.dw = ddw;
    kernels::rmsnorm_forward_device(a);
    kernels::rmsnorm_backward_device(a);
    const cudaError_t err = cudaDeviceSynchronize();
    const bool same = err == cudaSuccess && bits_equal(from_device(dy_out, rn), y_ref) &&
                      bits_equal(from_device(dir, R), ir_ref) && bits_equal(from_device(ddx, rn), dx_ref) &&
                      bits_equal(from_device(ddw, n), dw_ref);
    for (float* p : {dx_in, dw_in, ddy, dy_out, dir, ddx, ddw}) cudaFree(p);
    if (!same) {
      std::printf("FAILED rmsnorm R=%lld n=%lld (%s)\n", (long long)c.R, (long long)c.n, cudaGetErrorString(err));
      ++failed;
    }
  }
  std::printf("rmsnorm exact: %d of %d cases bitwise equal (forward, inverse RMS, dx, dw)\n", n_cases - failed, n_cases);
  return failed;
}

int check_math() {
  // Every 97th fp32 bit pattern (44 million inputs) plus the special values.
  std::vector<float> in;
  for (uint64_t u = 0; u <= 0xffffffffull; u += 97) in.push_back(det::from_bits(static_cast<uint32_t>(u)));
  for (uint32_t u : {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0x00000001u, 0x007fffffu,
                     0x3f800000u, 0xbf800000u})
    in.push_back(det::from_bits(u));
  std::vector<float> out(in.size());
  int failed = 0;
  const struct { kernels::MathFn fn; const char* name; float (*host)(float); } fns[] = {
      {kernels::MathFn::expf, "expf", det::expf},
      {kernels::MathFn::logf, "logf", det::logf},
      {kernels::MathFn::sigmoidf, "sigmoidf", det::sigmoidf},
      {kernels::MathFn::siluf, "siluf", det::siluf}};
  for (const auto& f : fns) {
    kernels::mathfn_on_device(f.fn, in.data(), out.data(), static_cast<int64_t>(in.size()));
    int64_t bad = 0;
    for (size_t i = 0; i < in.size(); ++i) {
      const float h = f.host(in[i]);
      const bool both_nan = h != h && out[i] != out[i];
      if (!both_nan && det::bits(h) != det::bits(out[i])) {
        if (bad < 3) std::printf("  %s(%08x): cpu %08x gpu %08x\n", f.name, det::bits(in[i]), det::bits(h), det::bits(out[i]));
        ++bad;
      }
    }
    std::printf("%s: %lld of %zu inputs differ\n", f.name, (long long)bad, in.size());
    failed += bad != 0;
  }
  return failed;
}

}  // namespace

int main(int argc, char** argv) {
  const bool gemm_only = argc > 1 && std::strcmp(argv[1], "--gemm-only") == 0;  // for the sanitizers
  const cuda::DeviceInfo dev = cuda::query_device();
  if (!dev.available) {
    std::printf("SKIPPED: no CUDA device (%s)\n", dev.reason.c_str());
    return 77;
  }
  std::printf("device: %s, sm_%d%d\n", dev.name.c_str(), dev.compute_major, dev.compute_minor);
  const int failed = check_gemm() + check_rmsnorm() + (gemm_only ? 0 : check_math());
  std::printf(failed ? "FAILED\n" : "OK: every kernel bitwise equal to the CPU\n");
  return failed ? 1 : 0;
}
