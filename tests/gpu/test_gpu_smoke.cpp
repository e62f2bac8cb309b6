// GPU smoke test: the CUDA target runs one canonical fma chain on the device and must return the CPU
// reference's bits. Without a device (this project's CI machines) it prints SKIPPED and exits 77,
// which meson counts as skipped, never as passed.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "kernels/device_info.h"
#include "core/reduce.h"

int main() {
  const olmoref::cuda::DeviceInfo dev = olmoref::cuda::query_device();
  if (!dev.available) {
    std::printf("SKIPPED: no CUDA device (%s)\n", dev.reason.c_str());
    return 77;
  }
  std::printf("device: %s, %d SMs, sm_%d%d\n", dev.name.c_str(), dev.sm_count, dev.compute_major, dev.compute_minor);
  std::vector<float> a(4099), b(4099);
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = std::sin(0.37f * static_cast<float>(i)) * (i % 3 ? 1.0f : 1e-3f);
    b[i] = std::cos(0.11f * static_cast<float>(i)) * (i % 5 ? 1.0f : 1e3f);
  }
  const float cpu = olmoref::chain_dot(a.data(), b.data(), static_cast<int64_t>(a.size()));
  const float gpu = olmoref::cuda::smoke_fma_chain(a.data(), b.data(), static_cast<int>(a.size()));
  uint32_t cb, gb;
  std::memcpy(&cb, &cpu, 4);
  std::memcpy(&gb, &gpu, 4);
  std::printf("cpu %08x gpu %08x\n", cb, gb);
  if (cb != gb) {
    std::printf("FAILED: the device's fma chain differs from the CPU reference\n");
    return 1;
  }
  std::printf("OK: bitwise equal\n");
  // The contraction probe: a = 1 + 2^-12, a * a = 1 + 2^-11 + 2^-24 rounds to 1 + 2^-11, so a * a + c with
  // c = -(1 + 2^-11) is 0 when the product is rounded first and 2^-24 when fused into one fma.
  const float pa = 1.0f + std::ldexp(1.0f, -12), pc = -(1.0f + std::ldexp(1.0f, -11));
  const float fused = std::fma(pa, pa, pc);
  volatile float product = pa * pa;
  const float unfused = product + pc;
  const float device = olmoref::cuda::smoke_contraction(pa, pa, pc);
  std::printf("contraction probe: a*b+c on the device %a (unfused %a, fused %a)\n", static_cast<double>(device),
              static_cast<double>(unfused), static_cast<double>(fused));
  if (unfused == fused || device != unfused) {
    std::printf("FAILED: %s\n", unfused == fused ? "the probe cannot tell fused from unfused"
                                                 : "the device fused a*b+c into one fma: the kernels' build must keep "
                                                   "-fmad=false (kernels/meson.build)");
    return 1;
  }
  std::printf("OK: a*b+c is not contracted\n");
  return 0;
}
