// GPU kernels against the CPU reference, bit for bit: the exact GEMM on the awkward shapes of
// tests/kernels/gemm_cases.h (the same cases the host execution checks in CI) and the project's math
// functions over a dense sample of the fp32 range plus every special value. Without a device: SKIPPED, 77.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "kernels/device_info.h"
#include "kernels/gemm_exact.h"
#include "kernels/mathfn_device.h"
#include "ref/gemm.h"
#include "ref/mathfn.h"
#include "tests/kernels/gemm_cases.h"

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
  const int failed = check_gemm() + (gemm_only ? 0 : check_math());
  std::printf(failed ? "FAILED\n" : "OK: every kernel bitwise equal to the CPU\n");
  return failed ? 1 : 0;
}
